//! pepd on every hub and terminal of a [`FailoverTopology`]: the hubs share one key and
//! one `[[peer]]` list (they are one peer to each terminal), every terminal has a key of
//! its own. Each gateway's config is the hub topology's with what the scenario adds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, Launch};
use crate::hub::gateways::{established_associations, hub_config, terminal_config};
use crate::hub::{HubLinks, TerminalRates};
use crate::pepd::{
    fetch_metrics, fresh_dir, remove_dir, write_key, PepdOptions, TunnelSecurity,
    ASSOCIATION_ESTABLISHED, KEEP_ENV, READY,
};
use crate::Error;

use super::topology::FailoverTopology;

/// What the scenario adds to each gateway's config.
pub struct Additions<'a> {
    /// Hub `k`'s (from 1), merged over the hub topology's config.
    pub hub: &'a dyn Fn(usize) -> String,
    /// Terminal `i`'s (from 1).
    pub terminal: &'a dyn Fn(usize) -> String,
    /// Each hub's `link.tx_rate` as a part of the carrier's.
    pub hub_tx_share: f64,
}

pub struct FailoverGateways {
    /// Hub 1, …, hub N, then terminal 1, 2, …
    daemons: Vec<Daemon>,
    hubs: usize,
    launch: Launch,
    dir: PathBuf,
    keep: bool,
}

impl FailoverGateways {
    /// Writes every key and config and installs interception on every gateway; starts
    /// none.
    pub fn prepare(
        topo: &FailoverTopology,
        links: &HubLinks,
        opts: &PepdOptions,
        additions: &Additions,
    ) -> Result<FailoverGateways, Error> {
        if opts.security.effective()? != TunnelSecurity::Noise {
            return Err(Error::Invalid(
                "hubs that serve each other's terminals share one static key: they need noise"
                    .into(),
            ));
        }
        let launch = opts.launch()?;
        let mut gw = FailoverGateways {
            daemons: Vec::new(),
            hubs: topo.names.hubs.len(),
            launch,
            dir: fresh_dir(&topo.names.base)?,
            keep: std::env::var_os(KEEP_ENV).is_some(),
        };
        let mut hub_links = links.clone();
        hub_links.carrier.rate_bps = links.carrier.rate_bps * additions.hub_tx_share;
        let rates = vec![
            TerminalRates {
                mir_bps: hub_links.carrier.rate_bps,
                cir_bps: 0.0,
                weight: 1,
            };
            links.terminals
        ];
        let hub_key = write_key(&gw.dir, "hub")?;
        let terminal_keys = (1..=links.terminals)
            .map(|i| write_key(&gw.dir, &format!("t{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        for (k, ns) in topo.names.hubs.iter().enumerate() {
            let k = k + 1;
            let text = hub_config(
                &hub_links,
                &rates,
                &hub_key,
                &terminal_keys,
                &[
                    opts.rules_base(),
                    &opts.extra_toml,
                    &(additions.hub)(k),
                    &opts.hub_toml,
                ],
            )?;
            gw.add(k, ns, "h", "hub", &text, opts)?;
        }
        for (i, key) in terminal_keys.iter().enumerate() {
            let i = i + 1;
            let text = terminal_config(
                i,
                links,
                &rates[i - 1],
                key,
                &hub_key,
                &[
                    opts.rules_base(),
                    &opts.extra_toml,
                    &(additions.terminal)(i),
                    &opts.terminal_toml,
                ],
            )?;
            let ns = &topo.names.terminals[i - 1];
            gw.add(i, ns, "t", "terminal", &text, opts)?;
        }
        Ok(gw)
    }

    fn add(
        &mut self,
        n: usize,
        ns: &str,
        short: &str,
        role: &str,
        config: &str,
        opts: &PepdOptions,
    ) -> Result<(), Error> {
        let d = Daemon::prepare(
            &self.dir,
            &format!("{short}{n}"),
            &format!("{role} {n}"),
            ns,
            config,
        )?;
        opts.install_rules(ns, &self.launch.program, d.config_path())?;
        self.daemons.push(d);
        Ok(())
    }

    /// Starts every hub and waits until each reports ready.
    pub fn start_hubs(&mut self, deadline: Instant, allowed: Duration) -> Result<(), Error> {
        let hubs = self.hubs;
        self.start(0..hubs, deadline, allowed, false)
    }

    /// Starts every terminal and waits until each reports ready, and with `associated`
    /// its association established.
    pub fn start_terminals(
        &mut self,
        deadline: Instant,
        allowed: Duration,
        associated: bool,
    ) -> Result<(), Error> {
        let range = self.hubs..self.daemons.len();
        self.start(range, deadline, allowed, associated)
    }

    fn start(
        &mut self,
        which: std::ops::Range<usize>,
        deadline: Instant,
        allowed: Duration,
        associated: bool,
    ) -> Result<(), Error> {
        let mut since = Vec::new();
        for d in &mut self.daemons[which.clone()] {
            since.push(d.spawn(&self.launch)?);
        }
        for (d, at) in self.daemons[which].iter_mut().zip(since) {
            d.wait_for(READY, at, deadline, allowed)?;
            if associated {
                d.wait_for(ASSOCIATION_ESTABLISHED, at, deadline, allowed)?;
            }
        }
        Ok(())
    }

    /// Polls hub `k`'s metrics until it counts `count` associations established.
    pub fn wait_for_associations(
        &self,
        k: usize,
        count: usize,
        deadline: Instant,
    ) -> Result<(), Error> {
        loop {
            let established = self.associations(k);
            if established == Some(count) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.daemons[k - 1].failure(&format!(
                    "has {established:?} of {count} associations established"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Hub `k`'s associations established now (None: its metrics do not answer).
    pub fn associations(&self, k: usize) -> Option<usize> {
        fetch_metrics(self.hub(k).namespace())
            .ok()
            .map(|text| established_associations(&text))
    }

    /// Hub `k`'s (from 1) pepd.
    pub fn hub(&self, k: usize) -> &Daemon {
        &self.daemons[k - 1]
    }

    /// Terminal `i`'s (from 1) pepd.
    pub fn terminal(&self, i: usize) -> &Daemon {
        &self.daemons[self.hubs + i - 1]
    }

    /// SIGKILL to hub `k`'s pepd.
    pub fn kill_hub(&mut self, k: usize) -> Result<(), Error> {
        self.daemons[k - 1].kill().map(drop)
    }

    /// Starts hub `k`'s pepd again and waits for its readiness.
    pub fn restart_hub(&mut self, k: usize, allowed: Duration) -> Result<(), Error> {
        let d = &mut self.daemons[k - 1];
        let since = d.spawn(&self.launch)?;
        d.wait_for(READY, since, since + allowed, allowed).map(drop)
    }

    /// The executable the gateways run.
    pub fn program(&self) -> &Path {
        &self.launch.program
    }

    /// The end of every pepd log.
    pub fn log_tails(&self, lines: usize) -> Vec<(String, String)> {
        self.daemons
            .iter()
            .map(|d| (d.label().to_owned(), d.log_tail(lines)))
            .collect()
    }

    /// Where the keys, configs and logs are (and what else the scenario runs keeps its
    /// files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for FailoverGateways {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for d in &self.daemons {
                d.dump_tail(40);
            }
        }
        self.daemons.clear();
        remove_dir(&self.dir, self.keep);
    }
}
