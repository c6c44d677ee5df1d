//! An active/standby pair of hubs up on [`FailoverTopology`]: pepd on both hubs with the same
//! config (`[tunnel] redundant = true`, the same key and `[[peer]]` list), keepalived on
//! both, pepd on every terminal; and the failures the scenarios inject.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, Launch};
use crate::hub::gateways::{established_associations, hub_config, terminal_config};
use crate::hub::{HubLinks, TerminalRates};
use crate::pepd::{
    fetch_metrics, fresh_dir, remove_dir, write_key, PepdOptions, TunnelSecurity,
    ASSOCIATION_ESTABLISHED, KEEP_ENV, READY,
};
use crate::topology::{HostTuning, LAN_DEV, SAT_DEV};
use crate::Error;

use super::keepalived::{self, Keepalived, VrrpSettings};
use super::topology::{FailoverTopology, Layout, HUBS, LAN_VIP, TUNNEL_VIP};

/// What the hubs' configs get over the hub topology's.
const REDUNDANT_TOML: &str = "[tunnel]\nredundant = true";

/// Hub 1 starts as the active one: its priority is the higher.
const PRIORITIES: [u8; HUBS] = [150, 100];

pub struct StandbyTestbed {
    // Declared first so they drop first: keepalived and the daemons stop before their
    // namespaces go.
    keepalived: Vec<Keepalived>,
    /// Hub 1, hub 2, then terminal 1, 2, …
    daemons: Vec<Daemon>,
    topo: FailoverTopology,
    launch: Launch,
    dir: PathBuf,
    keep: bool,
}

impl StandbyTestbed {
    /// Everything up. With keepalived (`advert_int` given): hub 1 holding both addresses
    /// and every terminal associated with it. Without: no hub holds an address
    /// ([`StandbyTestbed::take_addresses`]), and every terminal has started.
    pub fn up(
        links: &HubLinks,
        opts: &PepdOptions,
        advert_int: Option<Duration>,
    ) -> Result<StandbyTestbed, Error> {
        if advert_int.is_some() {
            keepalived::require()?;
        }
        if opts.security.effective()? != TunnelSecurity::Noise {
            return Err(Error::Invalid(
                "redundant hubs share one static key: they need noise".into(),
            ));
        }
        let topo = FailoverTopology::up(
            links,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
            Layout::STANDBY,
        )?;
        let launch = opts.launch()?;
        let dir = fresh_dir(&topo.names.base)?;
        let keep = std::env::var_os(KEEP_ENV).is_some();
        let mut tb = StandbyTestbed {
            keepalived: Vec::new(),
            daemons: Vec::new(),
            topo,
            launch,
            dir,
            keep,
        };
        tb.daemons = prepare(&tb.dir, &tb.topo, links, opts, &tb.launch)?;
        let allowed = opts
            .ready_timeout
            .unwrap_or(Duration::from_secs(15) + 4 * links.rtt());
        // The hubs first: both must start without holding the addresses.
        let mut since = Vec::new();
        for d in tb.daemons.iter_mut().take(HUBS) {
            since.push(d.spawn(&tb.launch)?);
        }
        let deadline = Instant::now() + allowed;
        for (d, at) in tb.daemons.iter_mut().zip(since) {
            d.wait_for(READY, at, deadline, allowed)?;
        }
        let Some(advert_int) = advert_int else {
            for d in tb.daemons.iter_mut().skip(HUBS) {
                let at = d.spawn(&tb.launch)?;
                d.wait_for(READY, at, deadline, allowed)?;
            }
            return Ok(tb);
        };
        for k in 1..=HUBS {
            let settings = VrrpSettings {
                hub: k,
                other: HUBS + 1 - k,
                priority: PRIORITIES[k - 1],
                advert_int,
                pepd: tb.launch.program.clone(),
            };
            let ns = tb.topo.names.hubs[k - 1].clone();
            tb.keepalived
                .push(Keepalived::start(&tb.dir, &ns, &settings)?);
        }
        tb.wait_until_active(1, deadline)?;
        let mut since = Vec::new();
        for d in tb.daemons.iter_mut().skip(HUBS) {
            since.push(d.spawn(&tb.launch)?);
        }
        for (d, at) in tb.daemons.iter_mut().skip(HUBS).zip(since) {
            d.wait_for(READY, at, deadline, allowed)?;
            d.wait_for(ASSOCIATION_ESTABLISHED, at, deadline, allowed)?;
        }
        tb.wait_for_associations(1, links.terminals, deadline)?;
        Ok(tb)
    }

    pub fn topology(&self) -> &FailoverTopology {
        &self.topo
    }

    /// Whether hub `k` (from 1) holds both virtual addresses.
    pub fn is_active(&self, k: usize) -> Result<bool, Error> {
        Ok(self.topo.holds(k, SAT_DEV, TUNNEL_VIP)? && self.topo.holds(k, LAN_DEV, LAN_VIP)?)
    }

    /// Puts both virtual addresses on hub `k` (what keepalived does when it takes over).
    pub fn take_addresses(&self, k: usize) -> Result<(), Error> {
        let ns = &self.topo.names.hubs[k - 1];
        crate::cmd::ip_in(
            ns,
            &["addr", "add", &format!("{TUNNEL_VIP}/24"), "dev", SAT_DEV],
        )?;
        crate::cmd::ip_in(
            ns,
            &["addr", "add", &format!("{LAN_VIP}/24"), "dev", LAN_DEV],
        )
        .map(drop)
    }

    /// The namespace hub `k`'s pepd runs in.
    pub fn hub_namespace(&self, k: usize) -> &str {
        &self.topo.names.hubs[k - 1]
    }

    /// Whether hub `k` holds either virtual address.
    pub fn holds_any(&self, k: usize) -> Result<bool, Error> {
        Ok(self.topo.holds(k, SAT_DEV, TUNNEL_VIP)? || self.topo.holds(k, LAN_DEV, LAN_VIP)?)
    }

    fn wait_until_active(&self, k: usize, deadline: Instant) -> Result<(), Error> {
        loop {
            if self.is_active(k)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Invalid(format!(
                    "hub {k} never held both virtual addresses; its keepalived log:\n{}",
                    self.keepalived[k - 1].log_tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls hub `k`'s metrics until it counts `count` associations established.
    pub fn wait_for_associations(
        &self,
        k: usize,
        count: usize,
        deadline: Instant,
    ) -> Result<(), Error> {
        let hub = &self.daemons[k - 1];
        loop {
            let established = self.associations(k);
            if established == Some(count) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(hub.failure(&format!(
                    "has {established:?} of {count} associations established"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Hub `k`'s associations established now (None: its metrics do not answer).
    pub fn associations(&self, k: usize) -> Option<usize> {
        fetch_metrics(self.daemons[k - 1].namespace())
            .ok()
            .map(|text| established_associations(&text))
    }

    /// SIGKILL to hub `k`'s pepd.
    pub fn kill_pepd(&mut self, k: usize) -> Result<(), Error> {
        self.daemons[k - 1].kill().map(drop)
    }

    /// Starts hub `k`'s pepd again and waits for its readiness.
    pub fn restart_pepd(&mut self, k: usize, allowed: Duration) -> Result<(), Error> {
        let d = &mut self.daemons[k - 1];
        let since = d.spawn(&self.launch)?;
        d.wait_for(READY, since, since + allowed, allowed).map(drop)
    }

    /// Hub `k` gone at once: its interfaces down, then pepd and keepalived killed.
    pub fn cut_hub(&mut self, k: usize) -> Result<(), Error> {
        self.topo.cut_hub(k)?;
        self.keepalived[k - 1].kill();
        self.daemons[k - 1].kill().map(drop)
    }

    /// The end of every pepd log and both keepalived logs.
    pub fn log_tails(&self, lines: usize) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .daemons
            .iter()
            .map(|d| (d.label().to_owned(), d.log_tail(lines)))
            .collect();
        for (k, ka) in self.keepalived.iter().enumerate() {
            v.push((format!("keepalived h{}", k + 1), ka.log_tail(lines)));
        }
        v
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for StandbyTestbed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for d in &self.daemons {
                d.dump_tail(40);
            }
        }
        self.keepalived.clear();
        self.daemons.clear();
        remove_dir(&self.dir, self.keep);
    }
}

/// Both hubs (one key, one config) and every terminal prepared, none started.
fn prepare(
    dir: &Path,
    topo: &FailoverTopology,
    links: &HubLinks,
    opts: &PepdOptions,
    launch: &Launch,
) -> Result<Vec<Daemon>, Error> {
    let rates = vec![
        TerminalRates {
            mir_bps: links.carrier.rate_bps,
            cir_bps: 0.0,
            weight: 1,
        };
        links.terminals
    ];
    let hub_key = write_key(dir, "hub")?;
    let terminal_keys = (1..=links.terminals)
        .map(|i| write_key(dir, &format!("t{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let hub_text = hub_config(
        links,
        &rates,
        &hub_key,
        &terminal_keys,
        &[
            opts.rules_base(),
            &opts.extra_toml,
            REDUNDANT_TOML,
            &opts.hub_toml,
        ],
    )?;
    let mut daemons = Vec::new();
    for (k, ns) in topo.names.hubs.iter().enumerate() {
        let k = k + 1;
        let d = Daemon::prepare(dir, &format!("h{k}"), &format!("hub {k}"), ns, &hub_text)?;
        opts.install_rules(ns, &launch.program, d.config_path())?;
        daemons.push(d);
    }
    for (i, key) in terminal_keys.iter().enumerate() {
        let i = i + 1;
        let text = terminal_config(
            i,
            links,
            &rates[i - 1],
            key,
            &hub_key,
            &[opts.rules_base(), &opts.extra_toml, &opts.terminal_toml],
        )?;
        let ns = &topo.names.terminals[i - 1];
        let d = Daemon::prepare(dir, &format!("t{i}"), &format!("terminal {i}"), ns, &text)?;
        opts.install_rules(ns, &launch.program, d.config_path())?;
        daemons.push(d);
    }
    Ok(daemons)
}
