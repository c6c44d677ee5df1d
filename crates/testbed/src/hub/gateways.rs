//! pepd on a hub and its terminals: the hub with a `[[peer]]` entry per terminal (its key,
//! LAN prefix, MIR, CIR and weight; no address, the hub learns it from the initiation),
//! each terminal in the pair form pointing at the hub, every gateway with a key of its own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, Launch};
use crate::pepd::{
    fetch_metrics, finish_config, fresh_dir, gateway_tables, log_level, rate_value, remove_dir,
    sample_value, table, write_key, KeyFile, PepdOptions, TunnelSecurity, ASSOCIATION_ESTABLISHED,
    KEEP_ENV, READY, TUNNEL_PORT,
};
use crate::Error;

use super::topology::{lan_prefix, terminal_sat, HubLinks, HubNames, HUB_SAT_V4};

/// What the hub gives terminal `i` of the carrier.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TerminalRates {
    /// Its MIR: the most the hub sends it (`tx_rate` of its entry).
    pub mir_bps: f64,
    /// Its CIR (`min_rate`); 0 for none.
    pub cir_bps: f64,
    pub weight: u32,
}

/// Lines of each log printed when a test panics with the gateways up.
const TAIL_ON_PANIC: usize = 40;

pub struct HubGateways {
    dir: PathBuf,
    keep: bool,
    launch: Launch,
    /// The hub first, then terminal 1, 2, …
    daemons: Vec<Daemon>,
}

/// The hub's config: the carrier as its `link.tx_rate`, a `[[peer]]` per terminal.
pub(crate) fn hub_config(
    links: &HubLinks,
    rates: &[TerminalRates],
    hub_key: &KeyFile,
    terminal_keys: &[KeyFile],
    overrides: &[&str],
) -> Result<String, Error> {
    let mut t = toml::Table::new();
    t.insert(
        "tunnel".into(),
        table(vec![
            ("side", "hub".into()),
            ("bind", format!("{HUB_SAT_V4}:{TUNNEL_PORT}").into()),
        ]),
    );
    gateway_tables(
        &mut t,
        (links.carrier.rate_bps, links.ret.rate_bps),
        links.carrier.frame_overhead,
        &log_level(),
    )?;
    t.insert(
        "security".into(),
        table(vec![(
            "private_key_file",
            hub_key.file.display().to_string().into(),
        )]),
    );
    let mut peers = Vec::new();
    for (i, (r, key)) in rates.iter().zip(terminal_keys).enumerate() {
        let i = i + 1;
        let mut entry = vec![
            ("name", format!("t{i}").into()),
            ("public_key", key.public.clone().into()),
            ("subnets", toml::Value::Array(vec![lan_prefix(i).into()])),
            ("tx_rate", rate_value(r.mir_bps, "terminal's MIR")?),
            ("rx_rate", rate_value(links.ret.rate_bps, "return")?),
            ("weight", i64::from(r.weight).into()),
        ];
        if r.cir_bps > 0.0 {
            entry.push(("min_rate", rate_value(r.cir_bps, "terminal's CIR")?));
        }
        peers.push(table(entry));
    }
    t.insert("peer".into(), toml::Value::Array(peers));
    finish_config(t, overrides)
}

/// Terminal `i`'s config: the pair form, its receive rate its MIR (within the carrier).
pub(crate) fn terminal_config(
    i: usize,
    links: &HubLinks,
    rates: &TerminalRates,
    own_key: &KeyFile,
    hub_key: &KeyFile,
    overrides: &[&str],
) -> Result<String, Error> {
    let mut t = toml::Table::new();
    t.insert(
        "peer".into(),
        table(vec![
            ("address", format!("{HUB_SAT_V4}:{TUNNEL_PORT}").into()),
            ("bind", format!("{}:{TUNNEL_PORT}", terminal_sat(i)).into()),
            ("side", "terminal".into()),
        ]),
    );
    let rx = rates.mir_bps.min(links.carrier.rate_bps);
    gateway_tables(
        &mut t,
        (links.ret.rate_bps, rx),
        links.carrier.frame_overhead,
        &log_level(),
    )?;
    t.insert(
        "security".into(),
        table(vec![
            (
                "private_key_file",
                own_key.file.display().to_string().into(),
            ),
            ("peer_public_key", hub_key.public.clone().into()),
        ]),
    );
    finish_config(t, overrides)
}

impl HubGateways {
    /// Writes keys and configs, installs interception on every gateway, starts pepd on all
    /// of them and returns once the hub has every terminal's association established.
    pub fn start(
        names: &HubNames,
        links: &HubLinks,
        rates: &[TerminalRates],
        opts: &PepdOptions,
    ) -> Result<HubGateways, Error> {
        if opts.security.effective()? != TunnelSecurity::Noise {
            return Err(Error::Invalid(
                "a hub tells its terminals apart by their keys: it needs noise".into(),
            ));
        }
        if rates.len() != links.terminals {
            return Err(Error::Invalid(format!(
                "{} terminals but rates for {}",
                links.terminals,
                rates.len()
            )));
        }
        let launch = opts.launch()?;
        let dir = fresh_dir(&names.base)?;
        let keep = std::env::var_os(KEEP_ENV).is_some();
        // Until the daemons are owned by a `HubGateways`, an error removes the dir here.
        let prepared = prepare(&dir, names, links, rates, opts, &launch);
        let daemons = match prepared {
            Ok(d) => d,
            Err(e) => {
                remove_dir(&dir, keep);
                return Err(e);
            }
        };
        let mut g = HubGateways {
            dir,
            keep,
            launch: launch.clone(),
            daemons,
        };
        let allowed = opts
            .ready_timeout
            .unwrap_or(Duration::from_secs(10) + 4 * links.rtt());
        let mut since = Vec::new();
        for d in &mut g.daemons {
            since.push(d.spawn(&launch)?);
        }
        let deadline = Instant::now() + allowed;
        for (k, (d, at)) in g.daemons.iter_mut().zip(since).enumerate() {
            d.wait_for(READY, at, deadline, allowed)?;
            // The hub's associations are counted below: one notification says too little.
            if k > 0 {
                d.wait_for(ASSOCIATION_ESTABLISHED, at, deadline, allowed)?;
            }
        }
        g.wait_for_hub_associations(links.terminals, deadline)?;
        Ok(g)
    }

    /// Polls the hub's metrics until it counts `count` associations established.
    fn wait_for_hub_associations(&self, count: usize, deadline: Instant) -> Result<(), Error> {
        loop {
            let established = fetch_metrics(self.hub().namespace())
                .ok()
                .map(|text| established_associations(&text));
            if established == Some(count) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.hub().failure(&format!(
                    "has {established:?} of {count} associations established"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn hub(&self) -> &Daemon {
        &self.daemons[0]
    }

    /// The hub's pepd, to signal it or wait for its exit.
    pub fn hub_mut(&mut self) -> &mut Daemon {
        &mut self.daemons[0]
    }

    pub fn terminals(&self) -> &[Daemon] {
        &self.daemons[1..]
    }

    /// Kills the hub's pepd with SIGKILL.
    pub fn kill_hub(&mut self) -> Result<std::process::ExitStatus, Error> {
        self.daemons[0].kill()
    }

    /// Starts the hub's pepd again with the same config (after [`HubGateways::kill_hub`])
    /// and waits up to `allowed` for its readiness; returns when it was started and when it
    /// was ready.
    pub fn restart_hub(&mut self, allowed: Duration) -> Result<(Instant, Instant), Error> {
        let hub = &mut self.daemons[0];
        let since = hub.spawn(&self.launch)?;
        let ready = hub.wait_for(READY, since, since + allowed, allowed)?;
        Ok((since, ready.at))
    }

    /// The temporary directory with configs, keys, logs and notify sockets.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The end of every log, hub first.
    pub fn log_tails(&self, lines: usize) -> Vec<(String, String)> {
        self.daemons
            .iter()
            .map(|d| (d.label().to_owned(), d.log_tail(lines)))
            .collect()
    }
}

/// Every daemon prepared (config written, interception installed), none started yet: the
/// hub first, then the terminals in order.
fn prepare(
    dir: &Path,
    names: &HubNames,
    links: &HubLinks,
    rates: &[TerminalRates],
    opts: &PepdOptions,
    launch: &Launch,
) -> Result<Vec<Daemon>, Error> {
    let hub_key = write_key(dir, "hub")?;
    let terminal_keys = (1..=links.terminals)
        .map(|i| write_key(dir, &format!("t{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let hub_text = hub_config(
        links,
        rates,
        &hub_key,
        &terminal_keys,
        &[opts.rules_base(), &opts.extra_toml, &opts.hub_toml],
    )?;
    let hub = Daemon::prepare(dir, "hub", "the hub", &names.hub, &hub_text)?;
    opts.install_rules(&names.hub, &launch.program, hub.config_path())?;
    let mut daemons = vec![hub];
    for (i, (r, key)) in rates.iter().zip(&terminal_keys).enumerate() {
        let i = i + 1;
        let text = terminal_config(
            i,
            links,
            r,
            key,
            &hub_key,
            &[opts.rules_base(), &opts.extra_toml, &opts.terminal_toml],
        )?;
        let ns = &names.terminals[i - 1];
        let d = Daemon::prepare(dir, &format!("t{i}"), &format!("terminal {i}"), ns, &text)?;
        opts.install_rules(ns, &launch.program, d.config_path())?;
        daemons.push(d);
    }
    Ok(daemons)
}

/// How many associations a gateway's metrics show established (summed over peers).
pub fn established_associations(metrics: &str) -> usize {
    let lines = metrics.lines().map(|l| Ok(l.to_owned()));
    let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else {
        return 0;
    };
    scrape
        .samples
        .iter()
        .filter(|s| {
            s.metric == "pepd_association_state" && s.labels.get("state") == Some("established")
        })
        .filter_map(|s| sample_value(&s.value))
        .sum::<f64>()
        .round() as usize
}

impl Drop for HubGateways {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for d in &self.daemons {
                d.dump_tail(TAIL_ON_PANIC);
            }
        }
        // The daemons stop before their directory goes.
        self.daemons.clear();
        remove_dir(&self.dir, self.keep);
    }
}
