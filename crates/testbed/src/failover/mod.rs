//! `pep-testbed failover`: terminals probing a server through pepd while a hub fails, and
//! how long each terminal takes to be answered again ([`report`]).
//!
//! - `restart`: the hub topology of [`crate::hub`]; the hub's pepd gets SIGKILL and is
//!   started again on the same address after a pause (what systemd's `RestartSec` does).
//! - `standby-pepd`: an active/standby pair with keepalived ([`standby`]); the active hub's
//!   pepd gets SIGKILL, its health check must move both addresses to the standby, and it
//!   is started again after the pause without taking them back.
//! - `standby-hub`: the same pair; the active hub is gone at once (its interfaces down,
//!   then pepd and keepalived killed).
//! - `handover`: the same two hubs at their own addresses, no keepalived, every terminal
//!   listing both in `[peer] address` ([`standby::HubAddressing::Listed`]); the first hub's
//!   pepd gets SIGKILL for good, and the terminals move to the second by themselves.
//! - `active-set`: several hubs serve at once ([`active`]), each terminal homed on one and
//!   listing the others as backups; hub 1 is gone at once as in `standby-hub`, its
//!   terminals move to their next hub, and the router learns their LANs from there. The
//!   other hubs' terminals are the unaffected ones.
//!
//! Every terminal's client runs a [`probe::Prober`] from the start to the end of the run.
//! With a control run, the same topology and traffic run once more without the failure,
//! and each terminal's request p99 around the failure is reported beside the control's.

pub mod active;
pub mod frr;
pub mod gateways;
pub mod keepalived;
pub mod probe;
pub mod report;
pub mod standby;
pub mod topology;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hub::{self, HubLinks, HubTestbed, TerminalRates};
use crate::pepd::PepdOptions;
use crate::runner::XFER_PORT;
use crate::xfer::server::Server;
use crate::{in_netns, Error};

use active::{ActiveSet, ActiveSetTestbed};
use probe::{ProbeSpec, Prober};
use report::{Request, Summary, TerminalReport, Timeline};
use standby::StandbyTestbed;

/// What fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The hub's pepd is killed with SIGKILL and started again on the same address.
    Restart,
    /// The active hub's pepd is killed with SIGKILL; keepalived moves the addresses.
    StandbyPepd,
    /// The active hub is gone: interfaces down, pepd and keepalived killed.
    StandbyHub,
    /// Two hubs at their own addresses, listed by every terminal; the first one's pepd is
    /// killed with SIGKILL for good.
    Handover,
    /// One of several active hubs is gone: interfaces down, pepd and FRR killed.
    ActiveSet,
}

#[derive(Clone, Debug)]
pub struct FailoverSpec {
    pub scenario: Scenario,
    /// The profile's name, for the report.
    pub profile: String,
    pub links: HubLinks,
    pub pepd: PepdOptions,
    /// When the failure is injected, from the start of the probes.
    pub fail_at: Duration,
    /// How long the probes go on after the failure.
    pub after: Duration,
    /// `restart` and `standby-pepd`: how long the killed pepd stays down.
    pub restart_after: Duration,
    /// The standby scenarios: keepalived's advertisement interval.
    pub advert_int: Duration,
    pub every: Duration,
    /// Request and response sizes.
    pub sizes: (usize, usize),
    /// Run the same without the failure first, for the p99 beside it.
    pub control: bool,
    /// `active-set`: the hubs and their shares of the carrier.
    pub active_set: ActiveSet,
}

impl FailoverSpec {
    fn hubs(&self) -> usize {
        match self.scenario {
            Scenario::Restart => 1,
            Scenario::StandbyPepd | Scenario::StandbyHub | Scenario::Handover => topology::HUBS,
            Scenario::ActiveSet => self.active_set.hubs,
        }
    }

    fn timeline(&self) -> Timeline {
        let failure_at_s = self.fail_at.as_secs_f64();
        Timeline {
            failure_at_s,
            end_s: failure_at_s + self.after.as_secs_f64(),
            tail_s: self.links.rtt().as_secs_f64() + 1.0,
            p99_before_s: 5.0,
            p99_after_s: 20.0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FailoverResult {
    pub scenario: Scenario,
    pub profile: String,
    pub rtt_ms: f64,
    pub hubs: usize,
    pub terminals: usize,
    pub interval_ms: f64,
    /// When the failure was injected, in seconds from the start of the probes.
    pub failure_at_s: f64,
    /// `restart` and `standby-pepd`: from the failure until the killed hub's new pepd
    /// reported ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_ready_after_s: Option<f64>,
    #[serde(flatten)]
    pub standby: Option<StandbyFigures>,
    #[serde(flatten)]
    pub active_set: Option<ActiveSetFigures>,
    pub control: bool,
    pub per_terminal: Vec<TerminalReport>,
    #[serde(flatten)]
    pub summary: Summary,
    /// When something was not exact, a flow hung or a terminal never recovered: the end of
    /// every gateway's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pepd_log_tail: Option<BTreeMap<String, String>>,
}

/// What the two-hub scenarios observe of the hubs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StandbyFigures {
    /// keepalived's advertisement interval; `None` without keepalived (`handover`).
    pub advert_int_s: Option<f64>,
    /// From the failure until hub 2 held both virtual addresses; `None` if it never did.
    pub address_moved_after_s: Option<f64>,
    /// Address moves other than the injected one: hub 1 not active or hub 2 holding an
    /// address just before the failure, or hub 1 holding one again at the end (it must
    /// not take them back).
    pub spurious_transitions: usize,
    /// Associations established at each hub at the end (`None`: its metrics did not
    /// answer).
    pub associations_after: Vec<Option<usize>>,
}

/// What the active-set scenario observes of the hubs and the router.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ActiveSetFigures {
    /// Each hub's `link.tx_rate` as a part of the carrier's.
    pub hub_tx_share: f64,
    /// Each terminal's home hub (from 1).
    pub homes: Vec<usize>,
    /// The hub each terminal's pepd was associated with at the end (`None`: unknown).
    pub served_after: Vec<Option<usize>>,
    /// The hub the router sent each terminal's LAN to at the end (`None`: no route).
    pub routed_after: Vec<Option<usize>>,
    /// From the failure until the router sent every affected terminal's LAN to another
    /// hub; `None` if it never did.
    pub routes_moved_after_s: Option<f64>,
    /// Associations established at each hub at the end (`None`: its metrics did not
    /// answer).
    pub associations_after: Vec<Option<usize>>,
}

/// What one run measured.
struct Probed {
    logs: Vec<Vec<Request>>,
    /// The failure's instant, in seconds from the start of the probes.
    failure_at_s: f64,
    hub_ready_after_s: Option<f64>,
    standby: Option<StandbyFigures>,
    active_set: Option<ActiveSetFigures>,
    /// Which terminals the failure concerns (all of them but in `active-set`).
    affected: Vec<bool>,
    log_tails: Vec<(String, String)>,
}

/// Runs the scenario (and the control run first, when asked for) and reports.
pub fn run(spec: &FailoverSpec) -> Result<FailoverResult, Error> {
    let once = |fail| match spec.scenario {
        Scenario::Restart => run_hub(spec, fail),
        Scenario::StandbyPepd | Scenario::StandbyHub => run_standby(spec, fail),
        Scenario::Handover => run_handover(spec, fail),
        Scenario::ActiveSet => run_active_set(spec, fail),
    };
    let control = match spec.control {
        true => Some(once(false)?),
        false => None,
    };
    let failed = once(true)?;
    let mut timeline = spec.timeline();
    timeline.failure_at_s = failed.failure_at_s;
    let per_terminal: Vec<TerminalReport> = failed
        .logs
        .iter()
        .enumerate()
        .map(|(k, log)| {
            let c = control.as_ref().map(|c| c.logs[k].as_slice());
            report::terminal_report(k + 1, failed.affected[k], log, c, &timeline)
        })
        .collect();
    let summary = report::summarise(&per_terminal);
    let troubled =
        !summary.all_exact || summary.hung_flows > 0 || summary.recovery_s.unrecovered > 0;
    Ok(FailoverResult {
        scenario: spec.scenario,
        profile: spec.profile.clone(),
        rtt_ms: spec.links.rtt().as_secs_f64() * 1e3,
        hubs: spec.hubs(),
        terminals: spec.links.terminals,
        interval_ms: spec.every.as_secs_f64() * 1e3,
        failure_at_s: failed.failure_at_s,
        hub_ready_after_s: failed.hub_ready_after_s,
        standby: failed.standby,
        active_set: failed.active_set,
        control: spec.control,
        per_terminal,
        summary,
        pepd_log_tail: troubled.then(|| failed.log_tails.into_iter().collect()),
    })
}

/// Sleeps until `at`.
fn sleep_until(at: Instant) {
    if let Some(d) = at.checked_duration_since(Instant::now()) {
        thread::sleep(d);
    }
}

/// The hub topology with probes on every terminal; with `fail`, the hub's pepd is killed
/// at `fail_at` and started again `restart_after` later.
fn run_hub(spec: &FailoverSpec, fail: bool) -> Result<Probed, Error> {
    let rates = vec![
        TerminalRates {
            mir_bps: spec.links.carrier.rate_bps,
            cir_bps: 0.0,
            weight: 1,
        };
        spec.links.terminals
    ];
    let mut tb = HubTestbed::up(&spec.links, &rates, &spec.pepd)?;
    let _server = tb.xfer_server(XFER_PORT)?;
    let server = SocketAddr::from((hub::topology::SERVER, XFER_PORT));
    let (epoch, probes) = start_probes(spec, &tb.topology().names.clients, server);
    sleep_until(epoch + spec.fail_at);
    let mut failure_at_s = spec.fail_at.as_secs_f64();
    let mut hub_ready_after_s = None;
    if fail {
        let killed = Instant::now();
        failure_at_s = killed.duration_since(epoch).as_secs_f64();
        let outcome = (|| {
            tb.gateways_mut().kill_hub()?;
            sleep_until(killed + spec.restart_after);
            tb.gateways_mut().restart_hub(Duration::from_secs(10))
        })();
        match outcome {
            Ok((_, ready)) => {
                hub_ready_after_s = Some(ready.duration_since(killed).as_secs_f64());
            }
            Err(e) => {
                // The probes still end at `until`: let them, then report the failure.
                for p in probes {
                    let _ = p.finish();
                }
                return Err(e);
            }
        }
    }
    let logs = finish_probes(probes)?;
    Ok(Probed {
        affected: vec![true; logs.len()],
        logs,
        failure_at_s,
        hub_ready_after_s,
        standby: None,
        active_set: None,
        log_tails: tb.gateways().log_tails(30),
    })
}

/// A prober on every client, all from one epoch, until the end of the run.
fn start_probes(
    spec: &FailoverSpec,
    clients: &[String],
    server: SocketAddr,
) -> (Instant, Vec<Prober>) {
    let epoch = Instant::now();
    let until = epoch + spec.fail_at + spec.after;
    let probes = clients
        .iter()
        .enumerate()
        .map(|(k, ns)| {
            Prober::start(
                ns,
                k as u64 + 1,
                ProbeSpec {
                    server,
                    every: spec.every,
                    sizes: spec.sizes,
                    epoch,
                    until,
                },
            )
        })
        .collect();
    (epoch, probes)
}

fn finish_probes(probes: Vec<Prober>) -> Result<Vec<Vec<Request>>, Error> {
    probes.into_iter().map(Prober::finish).collect()
}

/// The active/standby pair with probes on every terminal; with `fail`, hub 1 fails at
/// `fail_at` as the scenario says, and hub 2 is watched for the addresses.
fn run_standby(spec: &FailoverSpec, fail: bool) -> Result<Probed, Error> {
    let mut tb = StandbyTestbed::up(&spec.links, &spec.pepd, Some(spec.advert_int))?;
    let server_at = SocketAddr::from((topology::SERVER, XFER_PORT));
    let _server = in_netns(&tb.topology().names.server, move || {
        Server::bind(server_at, None)
    })??;
    let (epoch, probes) = start_probes(spec, &tb.topology().names.clients, server_at);
    let until = epoch + spec.fail_at + spec.after;
    sleep_until(epoch + spec.fail_at);
    let mut figures = StandbyFigures {
        advert_int_s: Some(spec.advert_int.as_secs_f64()),
        ..Default::default()
    };
    let ready_before = tb.is_active(1)? && !tb.holds_any(2)?;
    figures.spurious_transitions += usize::from(!ready_before);
    let mut failure_at_s = spec.fail_at.as_secs_f64();
    let mut hub_ready_after_s = None;
    if fail {
        let failed = Instant::now();
        failure_at_s = failed.duration_since(epoch).as_secs_f64();
        let injected = match spec.scenario {
            Scenario::StandbyHub => tb.cut_hub(1),
            _ => tb.kill_pepd(1),
        };
        if let Err(e) = injected {
            let _ = finish_probes(probes);
            return Err(e);
        }
        // Started again as systemd would: only the killed pepd, not a cut hub.
        let mut restart_at =
            (spec.scenario == Scenario::StandbyPepd).then_some(failed + spec.restart_after);
        while Instant::now() < until {
            if figures.address_moved_after_s.is_none() && tb.is_active(2)? {
                figures.address_moved_after_s = Some(failed.elapsed().as_secs_f64());
            }
            if restart_at.is_some_and(|at| Instant::now() >= at) {
                restart_at = None;
                tb.restart_pepd(1, Duration::from_secs(10))?;
                hub_ready_after_s = Some(failed.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if spec.scenario == Scenario::StandbyPepd && tb.holds_any(1)? {
            figures.spurious_transitions += 1;
        }
    }
    let logs = finish_probes(probes)?;
    figures.associations_after = (1..=topology::HUBS).map(|k| tb.associations(k)).collect();
    Ok(Probed {
        affected: vec![true; logs.len()],
        logs,
        failure_at_s,
        hub_ready_after_s,
        standby: Some(figures),
        active_set: None,
        log_tails: tb.log_tails(30),
    })
}

/// Several active hubs with probes on every terminal; with `fail`, hub 1 is gone at
/// `fail_at`, and the router is watched until it sends hub 1's terminals elsewhere.
fn run_active_set(spec: &FailoverSpec, fail: bool) -> Result<Probed, Error> {
    const FAILED: usize = 1;
    let mut tb = ActiveSetTestbed::up(&spec.links, &spec.pepd, spec.active_set)?;
    let server_at = SocketAddr::from((tb.topology().server(), XFER_PORT));
    let _server = in_netns(&tb.topology().names.server, move || {
        Server::bind(server_at, None)
    })??;
    let (epoch, probes) = start_probes(spec, &tb.topology().names.clients, server_at);
    let until = epoch + spec.fail_at + spec.after;
    let terminals = spec.links.terminals;
    let homes: Vec<usize> = (1..=terminals).map(|i| tb.home(i)).collect();
    let affected: Vec<bool> = homes.iter().map(|&h| h == FAILED).collect();
    sleep_until(epoch + spec.fail_at);
    let mut figures = ActiveSetFigures {
        hub_tx_share: spec.active_set.hub_tx_share,
        homes: homes.clone(),
        ..Default::default()
    };
    let mut failure_at_s = spec.fail_at.as_secs_f64();
    if fail {
        let failed = Instant::now();
        failure_at_s = failed.duration_since(epoch).as_secs_f64();
        if let Err(e) = tb.cut_hub(FAILED) {
            let _ = finish_probes(probes);
            return Err(e);
        }
        while Instant::now() < until {
            if figures.routes_moved_after_s.is_none() {
                let moved = (1..=terminals).filter(|&i| affected[i - 1]).try_fold(
                    true,
                    |all, i| -> Result<bool, Error> {
                        let to = tb.routed_to(i)?;
                        Ok(all && to.is_some_and(|k| k != FAILED))
                    },
                )?;
                if moved {
                    figures.routes_moved_after_s = Some(failed.elapsed().as_secs_f64());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let logs = finish_probes(probes)?;
    figures.served_after = (1..=terminals).map(|i| tb.served_by(i)).collect();
    figures.routed_after = (1..=terminals)
        .map(|i| tb.routed_to(i).ok().flatten())
        .collect();
    figures.associations_after = (1..=spec.active_set.hubs)
        .map(|k| tb.associations(k))
        .collect();
    Ok(Probed {
        logs,
        failure_at_s,
        hub_ready_after_s: None,
        standby: None,
        active_set: Some(figures),
        affected,
        log_tails: tb.log_tails(30),
    })
}

/// Two hubs at their own addresses and terminals listing both, with probes on every
/// terminal; with `fail`, hub 1's pepd is killed at `fail_at` and stays down.
fn run_handover(spec: &FailoverSpec, fail: bool) -> Result<Probed, Error> {
    let mut tb = StandbyTestbed::up_listed(&spec.links, &spec.pepd)?;
    let server_at = SocketAddr::from((topology::SERVER, XFER_PORT));
    let _server = in_netns(&tb.topology().names.server, move || {
        Server::bind(server_at, None)
    })??;
    let (epoch, probes) = start_probes(spec, &tb.topology().names.clients, server_at);
    sleep_until(epoch + spec.fail_at);
    let mut failure_at_s = spec.fail_at.as_secs_f64();
    if fail {
        failure_at_s = epoch.elapsed().as_secs_f64();
        if let Err(e) = tb.kill_pepd(1) {
            let _ = finish_probes(probes);
            return Err(e);
        }
    }
    let logs = finish_probes(probes)?;
    let figures = StandbyFigures {
        associations_after: (1..=topology::HUBS).map(|k| tb.associations(k)).collect(),
        ..Default::default()
    };
    Ok(Probed {
        affected: vec![true; logs.len()],
        logs,
        failure_at_s,
        hub_ready_after_s: None,
        standby: Some(figures),
        active_set: None,
        log_tails: tb.log_tails(30),
    })
}
