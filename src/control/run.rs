//! `pepd run`: the tunnel and its workers, the interception listeners and the metrics
//! endpoint started from the config on a tokio runtime; SIGHUP reloads, SIGTERM drains, and
//! a worker that stops unasked stops the daemon.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::{LoadedSecurity, PeerSpec, Peers, PepdConfig};
use crate::control::reload::{self, LogReload};
use crate::control::screen::{status_text, SortKey};
use crate::control::signals::{Signal, Signals};
use crate::control::status::StatusSource;
use crate::proxy::acceptor::UpstreamAcceptor;
use crate::proxy::intercept::{accept_loop, Interception};
use crate::proxy::live::{Live, LiveRef};
use crate::proxy::tproxy;
use crate::sys::notify::Notifier;
use crate::tunnel::driver::FlowAcceptor;
use crate::tunnel::gateway::Gateway;
use crate::tunnel::peer::AssociationState;
use crate::tunnel::sockets::tunnel_sockets;
use crate::tunnel::spawn::start_drivers;

/// The most peers the start-up line lists; a hub may have thousands of entries.
const NAMES_SHOWN: usize = 5;

pub struct Daemon {
    pub path: PathBuf,
    pub cfg: PepdConfig,
    /// The keys, read (and their warnings logged) with the config at start; no local keys
    /// with `security.mode = "none"`.
    pub security: LoadedSecurity,
    pub log_reload: LogReload,
}

impl Daemon {
    pub async fn run(self) -> anyhow::Result<()> {
        let Daemon {
            path,
            mut cfg,
            security,
            log_reload,
        } = self;
        let started = Instant::now();
        let notifier = Notifier;
        cfg.check_servable()?;
        let workers = cfg.workers();
        let seeds = (0..workers)
            .map(|_| crate::config::keys::random_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("seeding ephemeral keys")?;
        let tunnel = crate::tunnel::setup::build(&cfg, &security, fresh_epoch(), &seeds)?;
        let gateway = tunnel.gateway.clone();
        let live: LiveRef = Arc::new(RwLock::new(Live::from_config(&cfg)));

        let bind = cfg.tunnel_bind();
        let sockets = tunnel_sockets(bind, cfg.intercept.own_mark, workers, cfg.redundant())
            .with_context(|| format!("tunnel socket on {bind}"))?;
        let _claimed = crate::tunnel::steering::claim(bind)
            .with_context(|| format!("tunnel socket on {bind}"))?;
        let mut listeners = Vec::new();
        for addr in &cfg.intercept.listen {
            // A burst of `max_flows` new connections waits in the accept queue.
            let l = tproxy::listen(*addr, cfg.limits.max_flows).with_context(|| {
                format!(
                    "TPROXY listener on {addr} (needs CAP_NET_ADMIN for IP_TRANSPARENT, \
                     and the address family enabled)"
                )
            })?;
            listeners.push(l);
        }

        let metrics_listener = TcpListener::bind(cfg.metrics.listen)
            .await
            .with_context(|| format!("metrics endpoint on {}", cfg.metrics.listen))?;
        let control_path = cfg.control_socket();
        let control = crate::control::socket::bind(&control_path)
            .with_context(|| format!("control socket {}", control_path.display()))?;
        if let Some(note) = &control.note {
            warn!("control socket: {note}");
        }
        // Removes the socket file when the daemon ends.
        let _control_file = control.file;

        // Emptied before any association can be made: routes a killed run left behind, or
        // another box's state, must not be announced.
        if let Some(a) = &cfg.announce {
            crate::control::announce::flush(a)?;
        }
        let feed = cfg.announce.and_then(|_| {
            gateway
                .states
                .watch(crate::control::announce::FEED_CAPACITY)
        });

        let (stop_driver, driver_stop_rx) = watch::channel(false);
        let (stop_accepting, accept_stop_rx) = watch::channel(false);
        // Read once at start, as the offer in the HELLO is.
        let compression = crate::proxy::compression::Scope::from_config(&cfg);
        let acceptor: Arc<dyn FlowAcceptor> = Arc::new(UpstreamAcceptor {
            live: live.clone(),
            gateway: gateway.clone(),
            runtime: tokio::runtime::Handle::current(),
            compression: compression.clone(),
        });
        let driver_tasks =
            start_drivers(tunnel, sockets, acceptor, notifier, driver_stop_rx.clone())?;
        let mut running = driver_tasks.len();
        let mut ended = watch_drivers(driver_tasks);
        // Stops with the drivers, after the drain: a draining hub still serves its flows.
        let announce_counters = Arc::new(crate::control::announce::AnnounceCounters::default());
        let announcer = match (cfg.announce, feed) {
            (Some(a), Some(feed)) => {
                let task = crate::control::announce::Announcer {
                    cfg: a,
                    gateway: gateway.clone(),
                    counters: announce_counters.clone(),
                };
                Some(tokio::spawn(task.run(feed, driver_stop_rx.clone())))
            }
            _ => None,
        };
        let ctx = Arc::new(Interception {
            gateway: gateway.clone(),
            live: live.clone(),
            compression,
        });
        for l in listeners {
            tokio::spawn(accept_loop(l, ctx.clone(), accept_stop_rx.clone()));
        }
        let mut signals = Signals::install().context("installing signal handlers")?;
        let usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .context("installing signal handlers")?;
        let status = Arc::new(StatusSource {
            gateway: gateway.clone(),
            side: cfg.side(),
            shared_carrier: matches!(cfg.peer, Peers::List(_)),
            started,
        });
        tokio::spawn(log_status_on_sigusr1(status.clone(), usr1));
        tokio::spawn(crate::control::socket::serve(
            control.listener,
            status,
            driver_stop_rx.clone(),
        ));
        let metrics_gateway = gateway.clone();
        let announcing = announcer.is_some();
        let (health_gateway, health_live) = (gateway.clone(), live.clone());
        let health: crate::metrics::HealthSource = Arc::new(move || {
            let (gateway, live) = (health_gateway.clone(), health_live.clone());
            Box::pin(async move { crate::control::health::serving(&gateway, &live).await })
        });
        tokio::spawn(crate::metrics::serve(
            metrics_listener,
            Arc::new(move || {
                let mut s = crate::metrics::Snapshot::of(&metrics_gateway);
                if announcing {
                    s.announce = Some(announce_counters.snapshot());
                }
                s
            }),
            health,
            driver_stop_rx.clone(),
        ));
        if let Some(period) = notifier.watchdog_period() {
            tokio::spawn(watchdog(gateway.clone(), notifier, period));
        }
        let peers = peer_list(&gateway.peers.table().specs);
        info!(
            side = ?cfg.side(),
            peer = %peers,
            tunnel = %bind,
            workers,
            listen = ?cfg.intercept.listen,
            metrics = %cfg.metrics.listen,
            control = %control_path.display(),
            tx_rate_bps = cfg.link.tx_rate.bps(),
            "pepd running"
        );
        notifier.ready(&format!("listening; association with {peers} connecting"));

        let stop = loop {
            tokio::select! {
                signal = signals.next() => match signal {
                    Signal::Hangup => {
                        reload::apply(&path, &mut cfg, &security, &gateway, &live, &log_reload);
                    }
                    other => break Stop::Signal(other),
                },
                Some((worker, r)) = ended.recv() => break Stop::Worker(worker, r),
            }
        };
        let mut result = Ok(());
        match stop {
            Stop::Signal(signal) => {
                info!(?signal, grace = ?cfg.shutdown.grace, "stopping: no new connections, draining open flows");
                notifier.stopping();
                let _ = stop_accepting.send(true);
                live.write().unwrap_or_else(|p| p.into_inner()).draining = true;
                drain(&gateway, cfg.shutdown.grace, &notifier).await;
            }
            Stop::Worker(worker, r) => {
                // Its associations are gone: without it the daemon would serve on for the
                // other workers' peers alone, unnoticed, until the next restart.
                let why = r
                    .err()
                    .unwrap_or_else(|| anyhow::anyhow!("it stopped unasked"));
                let e = why.context(format!("tunnel worker {worker}"));
                error!("{e:#}; stopping, so that the service manager starts pepd again");
                notifier.stopping();
                let _ = stop_accepting.send(true);
                running -= 1;
                result = Err(e);
            }
        }
        let _ = stop_driver.send(true);
        while running > 0 {
            let Some((_, r)) = ended.recv().await else {
                break;
            };
            running -= 1;
            if result.is_ok() {
                result = r;
            }
        }
        // Closing the associations reset what was left; let those relays send their RSTs.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while gateway.relays_active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for peer in &gateway.peers() {
            peer.counters.set_state(AssociationState::Closed);
        }
        if let Some(task) = announcer {
            withdraw(task).await;
        }
        result
    }
}

/// Waits for the announcements to end, which empties their tables. A failure is logged
/// and leaves the daemon's result alone: the unit's `ExecStopPost` empties them again.
async fn withdraw(task: tokio::task::JoinHandle<anyhow::Result<()>>) {
    match tokio::time::timeout(Duration::from_secs(5), task).await {
        Ok(Ok(Ok(()))) => info!("announcements withdrawn"),
        Ok(Ok(Err(e))) => error!("withdrawing the announcements: {e:#}"),
        Ok(Err(e)) => error!("withdrawing the announcements: the task failed: {e}"),
        Err(_) => error!("withdrawing the announcements: no end within 5 s"),
    }
}

/// Why the daemon stops.
enum Stop {
    Signal(Signal),
    /// A tunnel worker's driver ended, with how.
    Worker(usize, anyhow::Result<()>),
}

/// Each driver's end as it happens, by worker, so that one that stops before it is told to
/// is noticed at once.
fn watch_drivers(
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
) -> tokio::sync::mpsc::UnboundedReceiver<(usize, anyhow::Result<()>)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (worker, task) in tasks.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e).context("tunnel socket failed"),
                Err(e) => Err(anyhow::anyhow!("association driver panicked: {e}")),
            };
            let _ = tx.send((worker, r));
        });
    }
    rx
}

/// The peers for the start-up line: the address of each (the name of one without), the
/// first few of a long list.
fn peer_list(specs: &[PeerSpec]) -> String {
    let mut shown: Vec<String> = specs
        .iter()
        .take(NAMES_SHOWN)
        .map(|p| p.address.map_or_else(|| p.name.clone(), |a| a.to_string()))
        .collect();
    if specs.len() > NAMES_SHOWN {
        shown.push(format!("{} more", specs.len() - NAMES_SHOWN));
    }
    shown.join(", ")
}

/// Waits until every relay has finished or the grace period is over.
async fn drain(gateway: &Gateway, grace: Duration, notifier: &Notifier) {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let open = gateway.relays_active();
        if open == 0 {
            info!("all flows finished");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            warn!(open, "grace period over; resetting the flows still open");
            return;
        }
        notifier.status(&format!("draining: {open} flows open"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pings systemd's watchdog at half its period while the association lock is obtainable,
/// so a deadlocked or wedged daemon gets restarted.
async fn watchdog(gateway: Arc<Gateway>, notifier: Notifier, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tick.tick().await;
        let gateway = gateway.clone();
        let alive = tokio::task::spawn_blocking(move || {
            for peer in &gateway.peers() {
                drop(peer.lock());
            }
        })
        .await;
        if alive.is_ok() {
            notifier.watchdog();
        }
    }
}

/// SIGUSR1 logs what `pepd status` prints, a log line per line of it.
async fn log_status_on_sigusr1(source: Arc<StatusSource>, mut usr1: tokio::signal::unix::Signal) {
    while usr1.recv().await.is_some() {
        let s = source.clone();
        let Ok(Ok(status)) = tokio::task::spawn_blocking(move || s.status(None)).await else {
            continue;
        };
        for line in status_text(&status, SortKey::Name).lines() {
            info!(target: "pepd::status", "{line}");
        }
    }
}

/// An epoch that differs on every start, so the peer tells a restart from a late packet.
/// It grows from one start to the next (nanoseconds of wall time), which lets the peer act
/// on an authenticated handshake of a newer start at once (see the transport).
fn fresh_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        .max(1)
}
