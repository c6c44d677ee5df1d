//! `pepd run`: sockets, the association driver, the interception listeners and the relays,
//! wired together on a tokio runtime; SIGHUP reloads, SIGTERM drains.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use pep_transport::{Association, FlowMeta, ResetReason};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::{OverLimit, PeerSpec, Peers, PepdConfig};
use crate::driver::{Driver, FlowAcceptor};
use crate::hub::{Counters, FlowRef, Hub, OpenRefused};
use crate::memory::{FlowCharge, MemoryAccount};
use crate::metrics::AssociationState;
use crate::notify::Notifier;
use crate::relay::{abort_tcp, Relay, RelayEnd};
use crate::tproxy::{self, Intercepted};
use crate::upstream::{self, UpstreamOptions};
use crate::{bypass, reload, sockopt};

/// How long an accepted connection may take to send its first bytes and still have them
/// ride with the flow's open (clients that speak first do so within a LAN round trip).
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(2);

/// Largest first read carried in the open.
const FIRST_BYTES_MAX: usize = 16 * 1024;
const _: () = assert!(FIRST_BYTES_MAX <= crate::scratch::SIZE);

/// Socket buffer of the tunnel socket: bursts at the link rate must not overflow it.
const TUNNEL_SOCKET_BUFFER: usize = 8 << 20;

/// Changes the log filter of the running daemon (from the binary's tracing setup).
pub type LogReload = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Settings relays and acceptors read per connection; SIGHUP replaces them.
#[derive(Debug, Clone)]
pub struct Live {
    pub over_limit: OverLimit,
    pub upstream: UpstreamOptions,
    pub idle: Option<Duration>,
    /// SIGTERM received: new connections are refused while open ones finish.
    pub draining: bool,
}

impl Live {
    pub fn from_config(cfg: &PepdConfig) -> Live {
        Live {
            over_limit: cfg.limits.over_limit,
            upstream: UpstreamOptions {
                mark: cfg.intercept.own_mark,
                transparent_source: cfg.upstream.transparent_source,
                connect_timeout: cfg.timeouts.connect,
            },
            idle: (!cfg.timeouts.idle.is_zero()).then_some(cfg.timeouts.idle),
            draining: false,
        }
    }
}

pub type LiveRef = Arc<RwLock<Live>>;

/// The most names a refusal lists; a hub may have thousands of entries.
const NAMES_SHOWN: usize = 5;

/// The one peer `pepd run` serves, and its address. Several `[[peer]]` entries, or one
/// without an address, need the multi-peer endpoint that a later step of issue 14 brings;
/// until then pepd refuses them at start rather than serve part of its config.
pub fn served_peer(cfg: &PepdConfig) -> anyhow::Result<(PeerSpec, SocketAddr)> {
    let mut specs = cfg.peer_specs();
    if specs.len() > 1 {
        let mut names: Vec<&str> = specs
            .iter()
            .take(NAMES_SHOWN)
            .map(|p| p.name.as_str())
            .collect();
        let more = specs.len().saturating_sub(NAMES_SHOWN);
        let more = format!("{more} more");
        if specs.len() > NAMES_SHOWN {
            names.push(&more);
        }
        anyhow::bail!(
            "the config has {} `[[peer]]` entries ({}), but serving several peers is not \
             implemented yet: it lands with the multi-peer endpoint in a later step. `pepd \
             check-config` accepts the config; `pepd run` needs a single peer for now",
            specs.len(),
            names.join(", ")
        );
    }
    let Some(peer) = specs.pop() else {
        anyhow::bail!("the config has no peer");
    };
    let Some(address) = peer.address else {
        let key = match cfg.peer {
            Peers::Pair(_) => "peer.address",
            Peers::List(_) => "peer[0].address",
        };
        anyhow::bail!(
            "`{key}` of peer {} is not set, but learning a peer's address from its packets is \
             not implemented yet: it lands with the multi-peer endpoint in a later step. Set \
             it to the peer's tunnel address for now",
            peer.name
        );
    };
    Ok((peer, address))
}

fn read_live(live: &LiveRef) -> Live {
    live.read().unwrap_or_else(|p| p.into_inner()).clone()
}

pub struct Daemon {
    pub path: PathBuf,
    pub cfg: PepdConfig,
    /// The keys, read (and their warnings logged) with the config at start; `None` with
    /// `security.mode = "none"`.
    pub security: Option<pep_transport::security::SecurityConfig>,
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
        let notifier = Notifier;
        let (peer, peer_address) = served_peer(&cfg)?;
        let tcfg = cfg.transport_for(&peer);
        let assoc = match security {
            Some(sec) => {
                let seed = crate::keys::random_bytes().context("seeding ephemeral keys")?;
                Association::new_secure(
                    tcfg.clone(),
                    cfg.role(),
                    fresh_epoch(),
                    Instant::now(),
                    sec,
                    seed,
                )
            }
            // Warned about with the other config warnings at start.
            None => Association::new(tcfg.clone(), cfg.role(), fresh_epoch(), Instant::now()),
        }
        .map_err(|e| anyhow::anyhow!("transport setting {}: {}", e.key, e.why))?;
        let memory = Arc::new(MemoryAccount::new(
            cfg.limits.memory_budget.bytes(),
            tcfg.assoc_window,
            crate::memory::fixed(tcfg.mtu, crate::memory::worker_threads()),
        ));
        let hub = Arc::new(Hub::new(assoc, memory));
        let live: LiveRef = Arc::new(RwLock::new(Live::from_config(&cfg)));

        let bind = cfg.tunnel_bind();
        let socket = tunnel_socket(bind, cfg.intercept.own_mark)
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

        let (stop_driver, driver_stop_rx) = watch::channel(false);
        let (stop_accepting, accept_stop_rx) = watch::channel(false);
        let driver = Driver {
            hub: hub.clone(),
            socket,
            peer: peer_address,
            acceptor: Arc::new(UpstreamAcceptor { live: live.clone() }),
            notifier,
        };
        let driver_task = tokio::spawn(driver.run(driver_stop_rx.clone()));
        let ctx = Arc::new(InterceptCtx {
            hub: hub.clone(),
            live: live.clone(),
        });
        for l in listeners {
            tokio::spawn(accept_loop(l, ctx.clone(), accept_stop_rx.clone()));
        }
        let mut signals = Signals::install().context("installing signal handlers")?;
        let usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .context("installing signal handlers")?;
        tokio::spawn(log_stats_on_sigusr1(hub.clone(), usr1));
        let metrics_hub = hub.clone();
        tokio::spawn(crate::metrics::serve(
            metrics_listener,
            Arc::new(move || metrics_hub.snapshot()),
            driver_stop_rx.clone(),
        ));
        if let Some(period) = notifier.watchdog_period() {
            tokio::spawn(watchdog(hub.clone(), notifier, period));
        }
        info!(
            side = ?cfg.side(),
            peer = %peer_address,
            tunnel = %bind,
            listen = ?cfg.intercept.listen,
            metrics = %cfg.metrics.listen,
            tx_rate_bps = tcfg.rate_bps,
            "pepd running"
        );
        notifier.ready(&format!(
            "listening; association with {peer_address} connecting"
        ));

        let signal = loop {
            match signals.next().await {
                Signal::Hangup => {
                    reload::apply(&path, &mut cfg, &hub, &live, &log_reload);
                }
                other => break other,
            }
        };
        info!(?signal, grace = ?cfg.shutdown.grace, "stopping: no new connections, draining open flows");
        notifier.stopping();
        let _ = stop_accepting.send(true);
        live.write().unwrap_or_else(|p| p.into_inner()).draining = true;
        drain(&hub, cfg.shutdown.grace, &notifier).await;
        let _ = stop_driver.send(true);
        let result = match driver_task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e).context("tunnel socket failed"),
            Err(e) => Err(anyhow::anyhow!("association driver panicked: {e}")),
        };
        // Closing the association reset what was left; let those relays send their RSTs.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while Counters::get(&hub.counters.relays_active) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        hub.counters.set_state(AssociationState::Closed);
        result
    }
}

/// Waits until every relay has finished or the grace period is over.
async fn drain(hub: &Hub, grace: Duration, notifier: &Notifier) {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let open = Counters::get(&hub.counters.relays_active);
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Terminate,
    Interrupt,
    Hangup,
}

/// The signals pepd acts on, installed once before it reports ready so none is missed
/// (the default action of each would kill the process).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::Terminate,
            _ = self.int.recv() => Signal::Interrupt,
            _ = self.hup.recv() => Signal::Hangup,
        }
    }
}

/// Pings systemd's watchdog at half its period while the association lock is obtainable,
/// so a deadlocked or wedged daemon gets restarted.
async fn watchdog(hub: Arc<Hub>, notifier: Notifier, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tick.tick().await;
        let hub = hub.clone();
        let alive = tokio::task::spawn_blocking(move || drop(hub.lock())).await;
        if alive.is_ok() {
            notifier.watchdog();
        }
    }
}

/// SIGUSR1 logs the association's counters.
async fn log_stats_on_sigusr1(hub: Arc<Hub>, mut usr1: tokio::signal::unix::Signal) {
    while usr1.recv().await.is_some() {
        let stats = hub.lock().assoc.stats();
        info!(?stats, "association statistics");
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

fn tunnel_socket(bind: SocketAddr, mark: u32) -> anyhow::Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    if bind.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    if mark != 0 {
        sock.set_mark(mark)
            .context("SO_MARK (needs CAP_NET_ADMIN)")?;
    }
    // Forcing past rmem_max needs CAP_NET_ADMIN, which pepd has; the plain call is the
    // fallback when it runs without.
    if sockopt::force_buffers(&sock, TUNNEL_SOCKET_BUFFER).is_err() {
        let _ = sock.set_recv_buffer_size(TUNNEL_SOCKET_BUFFER);
        let _ = sock.set_send_buffer_size(TUNNEL_SOCKET_BUFFER);
    }
    sock.set_nonblocking(true)?;
    sock.bind(&bind.into())?;
    Ok(UdpSocket::from_std(sock.into())?)
}

struct InterceptCtx {
    hub: Arc<Hub>,
    live: LiveRef,
}

async fn accept_loop(l: TcpListener, ctx: Arc<InterceptCtx>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = l.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((tcp, client)) => match tproxy::inspect(tcp, client) {
                Ok(conn) => {
                    tokio::spawn(intercepted(ctx.clone(), conn));
                }
                Err(e) => {
                    Counters::add(&ctx.hub.counters.inspect_errors, 1);
                    debug!(error = %e, "accepted connection vanished");
                }
            },
            Err(e) => {
                Counters::add(&ctx.hub.counters.accept_errors, 1);
                // Out of descriptors or memory: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn intercepted(ctx: Arc<InterceptCtx>, conn: Intercepted) {
    let Intercepted {
        tcp,
        client,
        server,
        dscp,
    } = conn;
    Counters::add(&ctx.hub.counters.flows_intercepted, 1);
    let _ = tcp.set_nodelay(true);
    let readable = tokio::time::timeout(FIRST_BYTES_WAIT, tcp.readable())
        .await
        .is_ok();
    let meta = FlowMeta {
        client,
        server,
        dscp,
    };
    let live = read_live(&ctx.live);
    // The first bytes are read into this thread's scratch buffer and, from there, into the
    // flow's open, with no await between: nothing of them stays with the connection. Only
    // a connection over the limit keeps a copy, for the bypass to send.
    let (opened, client_done) = crate::scratch::with(|buf| {
        let buf = &mut buf[..FIRST_BYTES_MAX];
        let (first_len, client_done) = match readable.then(|| tcp.try_read(buf)) {
            Some(Ok(0)) => (0, true),
            Some(Ok(n)) => (n, false),
            Some(Err(_)) | None => (0, false),
        };
        let first = &buf[..first_len];
        let opened = ctx
            .hub
            .open(meta, first)
            .map_err(|why| (why, first.to_vec()));
        (opened, client_done)
    });
    let (flow, charge) = match opened {
        Ok(opened) => opened,
        Err((why, first)) => {
            over_limit(&ctx.hub, &live, tcp, meta, first, why).await;
            return;
        }
    };
    debug!(flow = flow.id, %client, %server, dscp, "intercepted; flow opened");
    if client_done {
        let _ = ctx.hub.finish(&flow);
    }
    let relay = Relay {
        hub: ctx.hub.clone(),
        flow,
        tcp,
        idle_timeout: live.idle,
        tcp_read_done: client_done,
        charge,
    };
    let id = relay.flow.id;
    let end = relay.run().await;
    log_end(id, client, server, end);
}

async fn over_limit(
    hub: &Hub,
    live: &Live,
    tcp: tokio::net::TcpStream,
    meta: FlowMeta,
    first: Vec<u8>,
    why: OpenRefused,
) {
    match live.over_limit {
        OverLimit::Refuse => {
            Counters::add(&hub.counters.flows_refused, 1);
            warn!(client = %meta.client, server = %meta.server, ?why, "connection refused");
            abort_tcp(tcp);
        }
        OverLimit::Bypass => {
            Counters::add(&hub.counters.flows_bypassed, 1);
            debug!(client = %meta.client, server = %meta.server, ?why, "relayed unproxied");
            bypass::run(tcp, meta, first, &live.upstream).await;
        }
    }
}

fn log_end(flow: pep_transport::FlowId, client: SocketAddr, server: SocketAddr, end: RelayEnd) {
    debug!(flow, %client, %server, ?end, "flow ended");
}

/// Connects flows the peer opened to their destination.
struct UpstreamAcceptor {
    live: LiveRef,
}

impl FlowAcceptor for UpstreamAcceptor {
    fn accept(&self, hub: Arc<Hub>, flow: FlowRef, meta: FlowMeta, charge: FlowCharge) {
        let live = read_live(&self.live);
        if live.draining {
            // `accept` runs under the hub lock (from the driver's dispatch); resetting
            // needs that lock, so it happens right after, on its own task.
            tokio::spawn(async move { hub.reset(&flow, ResetReason::ResourceLimit) });
            return;
        }
        tokio::spawn(from_peer(hub, flow, meta, live, charge));
    }
}

/// A flow the peer opened: the connect to its destination, then the relay.
async fn from_peer(hub: Arc<Hub>, flow: FlowRef, meta: FlowMeta, live: Live, charge: FlowCharge) {
    let connected = tokio::select! {
        r = upstream::connect(&meta, &live.upstream) => r,
        // The client may give up (reset) while the connect is still pending.
        () = wait_reset(&flow) => return,
    };
    match connected {
        Ok(tcp) => {
            let relay = Relay {
                hub,
                flow,
                tcp,
                idle_timeout: live.idle,
                tcp_read_done: false,
                charge,
            };
            let id = relay.flow.id;
            let end = relay.run().await;
            log_end(id, meta.client, meta.server, end);
        }
        Err(f) => {
            hub.counters.connect_errors.add(f.reason);
            debug!(server = %meta.server, error = %f.error, reason = ?f.reason,
                "upstream connect failed");
            hub.reset(&flow, f.reason);
        }
    }
}

async fn wait_reset(flow: &FlowRef) {
    loop {
        if flow.signal.reset_reason().is_some() {
            return;
        }
        flow.signal.notify.notified().await;
    }
}

/// Each kind of flow task, not started, to weigh for the per-flow cost (memory.rs).
#[cfg(test)]
pub(crate) fn flow_tasks(
    hub: Arc<Hub>,
    flow: FlowRef,
    tcp: tokio::net::TcpStream,
) -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ()>,
) {
    let live = Live {
        over_limit: OverLimit::Refuse,
        upstream: UpstreamOptions {
            mark: 0,
            transparent_source: false,
            connect_timeout: Duration::from_secs(1),
        },
        idle: None,
        draining: false,
    };
    let meta = FlowMeta {
        client: "198.18.0.2:1000".parse().expect("addr"),
        server: "198.18.1.2:80".parse().expect("addr"),
        dscp: 0,
    };
    let ctx = Arc::new(InterceptCtx {
        hub: hub.clone(),
        live: Arc::new(RwLock::new(live.clone())),
    });
    let conn = Intercepted {
        tcp,
        client: meta.client,
        server: meta.server,
        dscp: 0,
    };
    let peer = from_peer(hub.clone(), flow, meta, live, hub.charge_flow());
    (intercepted(ctx, conn), peer)
}
