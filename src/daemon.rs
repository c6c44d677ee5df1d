//! `pepd run`: sockets, the association driver, the interception listeners and the relays,
//! wired together on a tokio runtime; SIGHUP reloads, SIGTERM drains.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use pep_transport::{FlowMeta, ResetReason};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::config::{FailMode, LoadedSecurity, OverLimit, PeerSpec, PepdConfig, Side};
use crate::driver::{Driver, FlowAcceptor, TunnelSocket};
use crate::gateway::{Gateway, GatewayCounters};
use crate::link::{FlowRef, LinkCounters, OpenRefused, PeerLink};
use crate::memory::FlowCharge;
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
    /// What a connection that no peer's subnets hold gets (`[rules] fail`).
    pub fail: FailMode,
    pub upstream: UpstreamOptions,
    pub idle: Option<Duration>,
    /// `limits.stalled_flow_timeout`, `None` when disabled.
    pub stalled_flow_timeout: Option<Duration>,
    /// SIGTERM received: new connections are refused while open ones finish.
    pub draining: bool,
}

impl Live {
    pub fn from_config(cfg: &PepdConfig) -> Live {
        Live {
            over_limit: cfg.limits.over_limit,
            fail: cfg.rules.fail,
            upstream: UpstreamOptions {
                mark: cfg.intercept.own_mark,
                transparent_source: cfg.upstream.transparent_source,
                connect_timeout: cfg.timeouts.connect,
            },
            idle: (!cfg.timeouts.idle.is_zero()).then_some(cfg.timeouts.idle),
            stalled_flow_timeout: Some(cfg.limits.stalled_flow_timeout).filter(|t| !t.is_zero()),
            draining: false,
        }
    }
}

pub type LiveRef = Arc<RwLock<Live>>;

/// The most peers the start-up line lists; a hub may have thousands of entries.
const NAMES_SHOWN: usize = 5;

/// What `pepd run` cannot serve although `check-config` accepts it, refused at start
/// rather than served in part: a terminal sends first, so it needs its hub's address (a
/// hub learns a terminal's from its authenticated initiation).
pub fn check_servable(cfg: &PepdConfig) -> anyhow::Result<()> {
    if cfg.side() != Side::Terminal {
        return Ok(());
    }
    for (i, peer) in cfg.peer_specs().iter().enumerate() {
        if peer.address.is_none() {
            anyhow::bail!(
                "`{}` of peer {} is not set: a terminal starts the association, so it needs \
                 its hub's tunnel address (only a hub learns its peers' addresses)",
                cfg.peer.address_key(i),
                peer.name
            );
        }
    }
    Ok(())
}

fn read_live(live: &LiveRef) -> Live {
    live.read().unwrap_or_else(|p| p.into_inner()).clone()
}

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
        let notifier = Notifier;
        check_servable(&cfg)?;
        let workers = cfg.workers();
        let seeds = (0..workers)
            .map(|_| crate::keys::random_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("seeding ephemeral keys")?;
        let tunnel = crate::tunnel::build(&cfg, &security, fresh_epoch(), &seeds)?;
        let gateway = tunnel.gateway.clone();
        let live: LiveRef = Arc::new(RwLock::new(Live::from_config(&cfg)));

        let bind = cfg.tunnel_bind();
        let sockets = tunnel_sockets(bind, cfg.intercept.own_mark, workers)
            .with_context(|| format!("tunnel socket on {bind}"))?;
        let _claimed = crate::workers::steering::claim(bind)
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
        let acceptor: Arc<dyn FlowAcceptor> = Arc::new(UpstreamAcceptor {
            live: live.clone(),
            gateway: gateway.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        let driver_tasks =
            start_drivers(tunnel, sockets, acceptor, notifier, driver_stop_rx.clone())?;
        let mut running = driver_tasks.len();
        let mut ended = watch_drivers(driver_tasks);
        let ctx = Arc::new(InterceptCtx {
            gateway: gateway.clone(),
            live: live.clone(),
        });
        for l in listeners {
            tokio::spawn(accept_loop(l, ctx.clone(), accept_stop_rx.clone()));
        }
        let mut signals = Signals::install().context("installing signal handlers")?;
        let usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .context("installing signal handlers")?;
        tokio::spawn(log_stats_on_sigusr1(gateway.clone(), usr1));
        let metrics_gateway = gateway.clone();
        tokio::spawn(crate::metrics::serve(
            metrics_listener,
            Arc::new(move || metrics_gateway.snapshot()),
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
        for link in &gateway.links() {
            link.counters.set_state(AssociationState::Closed);
        }
        result
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
async fn watchdog(gateway: Arc<Gateway>, notifier: Notifier, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tick.tick().await;
        let gateway = gateway.clone();
        let alive = tokio::task::spawn_blocking(move || {
            for link in &gateway.links() {
                drop(link.lock());
            }
        })
        .await;
        if alive.is_ok() {
            notifier.watchdog();
        }
    }
}

/// SIGUSR1 logs the association's counters.
async fn log_stats_on_sigusr1(gateway: Arc<Gateway>, mut usr1: tokio::signal::unix::Signal) {
    while usr1.recv().await.is_some() {
        for link in &gateway.links() {
            if let Some((stats, _, _)) = link.stats() {
                info!(peer = %link.name, ?stats, "association statistics");
            }
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

/// Starts a driver per worker, each on its socket (one per worker, see `tunnel_sockets`),
/// from the daemon's runtime: tasks that end with them.
pub(crate) fn start_drivers(
    tunnel: crate::tunnel::Tunnel,
    sockets: Vec<std::net::UdpSocket>,
    acceptor: Arc<dyn FlowAcceptor>,
    notifier: Notifier,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<std::io::Result<()>>>> {
    let workers = sockets.len();
    let mut tasks = Vec::with_capacity(workers);
    for (worker, (socket, shard)) in sockets.into_iter().zip(tunnel.shards).enumerate() {
        let parts = DriverParts {
            gateway: tunnel.gateway.clone(),
            worker,
            shard,
            factory: tunnel.factory.clone(),
            allowed: tunnel.allowed.clone(),
            acceptor: acceptor.clone(),
            notifier,
        };
        let task = if workers == 1 {
            // The pair (and a single worker) runs on the daemon's runtime as always.
            let socket = TunnelSocket::new(UdpSocket::from_std(socket)?)?;
            tokio::spawn(parts.driver(socket).run(stop.clone()))
        } else {
            spawn_worker(parts, socket, stop.clone())
                .with_context(|| format!("starting tunnel worker {worker}"))?
        };
        tasks.push(task);
    }
    Ok(tasks)
}

/// What one worker's driver is made of, but its socket.
struct DriverParts {
    gateway: Arc<Gateway>,
    worker: usize,
    shard: crate::tunnel::Shard,
    factory: crate::driver::AssocFactory,
    allowed: Option<std::collections::HashSet<SocketAddr>>,
    acceptor: Arc<dyn FlowAcceptor>,
    notifier: Notifier,
}

impl DriverParts {
    fn driver(self, socket: TunnelSocket) -> Driver {
        Driver::new(
            self.gateway,
            self.worker,
            socket,
            self.shard.endpoint,
            self.factory,
            self.allowed,
            self.acceptor,
            self.notifier,
        )
        .with_share(self.shard.share)
    }
}

/// Runs a worker's driver on a thread of its own, on a current-thread runtime: its socket,
/// endpoint and associations are that thread's alone, and it shares nothing with the
/// relays' runtime but the links' locks and wake-ups. The task returned ends with it.
fn spawn_worker(
    parts: DriverParts,
    socket: std::net::UdpSocket,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let worker = parts.worker;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let driver = {
        // The socket registers with the reactor of the runtime it is made in.
        let _in_worker = rt.enter();
        parts.driver(TunnelSocket::new(UdpSocket::from_std(socket)?)?)
    };
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("pepd-worker-{worker}"))
        .spawn(move || {
            let _ = done.send(rt.block_on(driver.run(stop)));
        })?;
    Ok(tokio::spawn(async move {
        result.await.unwrap_or_else(|_| {
            Err(std::io::Error::other(format!(
                "tunnel worker {worker} panicked"
            )))
        })
    }))
}

/// The tunnel sockets, one per worker on the same address (see `workers::steering`).
pub(crate) fn tunnel_sockets(
    bind: SocketAddr,
    mark: u32,
    workers: usize,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    let shard_bits = crate::workers::shard_bits(workers);
    let (sockets, steered) =
        crate::workers::steering::bind_group(bind, workers, shard_bits, || {
            tunnel_socket(bind, mark).map_err(std::io::Error::other)
        })?;
    if let Err(e) = steered {
        warn!(error = %e, workers, "the kernel did not take the tunnel sockets' steering program: datagrams reach the workers by the kernel's hash and are handed on to their association's worker");
    }
    Ok(sockets.into_iter().map(Into::into).collect())
}

/// One tunnel socket, not bound yet.
fn tunnel_socket(bind: SocketAddr, mark: u32) -> anyhow::Result<Socket> {
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
    Ok(sock)
}

struct InterceptCtx {
    gateway: Arc<Gateway>,
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
                    LinkCounters::add(&ctx.gateway.counters.inspect_errors, 1);
                    debug!(error = %e, "accepted connection vanished");
                }
            },
            Err(e) => {
                LinkCounters::add(&ctx.gateway.counters.accept_errors, 1);
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
    let counters = &ctx.gateway.counters;
    LinkCounters::add(&counters.flows_intercepted, 1);
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
    let link = ctx.gateway.route(server.ip());
    // The first bytes are read into this thread's scratch buffer and, from there, into the
    // flow's open, with no await between: nothing of them stays with the connection. Only
    // a connection the peers do not take keeps a copy, for the bypass to send.
    let (opened, client_done) = crate::scratch::with(|buf| {
        let buf = &mut buf[..FIRST_BYTES_MAX];
        let (first_len, client_done) = match readable.then(|| tcp.try_read(buf)) {
            Some(Ok(0)) => (0, true),
            Some(Ok(n)) => (n, false),
            Some(Err(_)) | None => (0, false),
        };
        let first = &buf[..first_len];
        let opened = match link {
            Some(link) => match ctx.gateway.take_flow_slot() {
                Some(slot) => match link.open(meta, first) {
                    Ok((flow, charge)) => Ok((link, flow, charge.with_slot(slot))),
                    Err(why) => Err((Some(why), first.to_vec())),
                },
                None => {
                    LinkCounters::add(&link.counters.flows_over_gateway, 1);
                    Err((Some(OpenRefused::GatewayFlowLimit), first.to_vec()))
                }
            },
            None => Err((None, first.to_vec())),
        };
        (opened, client_done)
    });
    let (link, flow, charge) = match opened {
        Ok(opened) => opened,
        Err((None, first)) => {
            LinkCounters::add(&counters.flows_unrouted, 1);
            fail(
                counters,
                &live,
                tcp,
                meta,
                first,
                "no peer's subnets hold the destination",
            )
            .await;
            return;
        }
        Err((Some(why), first)) => {
            over_limit(counters, &live, tcp, meta, first, why).await;
            return;
        }
    };
    debug!(flow = flow.id, %client, %server, dscp, peer = %link.name, "intercepted; flow opened");
    if client_done {
        let _ = link.finish(&flow);
    }
    let relay = Relay {
        link,
        flow,
        tcp,
        idle_timeout: live.idle,
        stalled_timeout: live.stalled_flow_timeout,
        tcp_read_done: client_done,
        charge,
    };
    let id = relay.flow.id;
    let end = relay.run().await;
    log_end(id, client, server, end);
}

async fn over_limit(
    counters: &GatewayCounters,
    live: &Live,
    tcp: tokio::net::TcpStream,
    meta: FlowMeta,
    first: Vec<u8>,
    why: OpenRefused,
) {
    match live.over_limit {
        OverLimit::Refuse => {
            LinkCounters::add(&counters.flows_refused, 1);
            warn!(client = %meta.client, server = %meta.server, ?why, "connection refused");
            abort_tcp(tcp);
        }
        OverLimit::Bypass => {
            LinkCounters::add(&counters.flows_bypassed, 1);
            debug!(client = %meta.client, server = %meta.server, ?why, "relayed unproxied");
            bypass::run(tcp, meta, first, &live.upstream).await;
        }
    }
}

/// A connection no peer takes follows `[rules] fail`, as if pepd were not there: routed
/// unproxied when open, refused when closed.
async fn fail(
    counters: &GatewayCounters,
    live: &Live,
    tcp: tokio::net::TcpStream,
    meta: FlowMeta,
    first: Vec<u8>,
    why: &'static str,
) {
    match live.fail {
        FailMode::Closed => {
            LinkCounters::add(&counters.flows_refused, 1);
            debug!(client = %meta.client, server = %meta.server, why, "connection refused");
            abort_tcp(tcp);
        }
        FailMode::Open => {
            LinkCounters::add(&counters.flows_bypassed, 1);
            debug!(client = %meta.client, server = %meta.server, why, "relayed unproxied");
            bypass::run(tcp, meta, first, &live.upstream).await;
        }
    }
}

fn log_end(flow: pep_transport::FlowId, client: SocketAddr, server: SocketAddr, end: RelayEnd) {
    debug!(flow, %client, %server, ?end, "flow ended");
}

/// Connects flows the peer opened to their destination.
pub(crate) struct UpstreamAcceptor {
    pub(crate) live: LiveRef,
    pub(crate) gateway: Arc<Gateway>,
    /// The daemon's runtime: the relays run there whichever worker thread accepts their
    /// flow.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl UpstreamAcceptor {
    /// Whether the peer may open this flow: from an address of its own subnets (WireGuard's
    /// inbound check), to a destination no other peer is reached through, so one terminal
    /// cannot use the hub as a relay into another's LAN. The pair's one peer holds every
    /// address, so this never refuses there.
    fn may_open(&self, link: &PeerLink, meta: &FlowMeta) -> bool {
        let table = self.gateway.peers.table();
        let routes = &table.routes;
        let peer = link.peer;
        routes.admits(peer, meta.client.ip())
            && routes.lookup(meta.server.ip()).is_none_or(|p| p == peer)
    }
}

impl FlowAcceptor for UpstreamAcceptor {
    fn accept(&self, link: Arc<PeerLink>, flow: FlowRef, meta: FlowMeta, charge: FlowCharge) {
        let live = read_live(&self.live);
        if live.draining {
            link.reset(&flow, ResetReason::ResourceLimit);
            return;
        }
        if !self.may_open(&link, &meta) {
            let c = &self.gateway.counters;
            LinkCounters::add(&c.flows_refused, 1);
            LinkCounters::add(&c.flows_isolated, 1);
            warn!(peer = %link.name, client = %meta.client, server = %meta.server,
                "flow refused: the peer may not open it (isolation)");
            link.reset(&flow, ResetReason::Refused);
            return;
        }
        self.runtime
            .spawn(from_peer(link, flow, meta, live, charge));
    }
}

/// A flow the peer opened: the connect to its destination, then the relay.
async fn from_peer(
    link: Arc<PeerLink>,
    flow: FlowRef,
    meta: FlowMeta,
    live: Live,
    charge: FlowCharge,
) {
    let connected = tokio::select! {
        r = upstream::connect(&meta, &live.upstream) => r,
        // The client may give up (reset) while the connect is still pending.
        () = wait_reset(&flow) => return,
    };
    match connected {
        Ok(tcp) => {
            let relay = Relay {
                link,
                flow,
                tcp,
                idle_timeout: live.idle,
                stalled_timeout: live.stalled_flow_timeout,
                tcp_read_done: false,
                charge,
            };
            let id = relay.flow.id;
            let end = relay.run().await;
            log_end(id, meta.client, meta.server, end);
        }
        Err(f) => {
            link.counters.connect_errors.add(f.reason);
            debug!(server = %meta.server, error = %f.error, reason = ?f.reason,
                "upstream connect failed");
            link.reset(&flow, f.reason);
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
    link: Arc<PeerLink>,
    flow: FlowRef,
    tcp: tokio::net::TcpStream,
) -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ()>,
) {
    let live = Live {
        over_limit: OverLimit::Refuse,
        fail: FailMode::Closed,
        upstream: UpstreamOptions {
            mark: 0,
            transparent_source: false,
            connect_timeout: Duration::from_secs(1),
        },
        idle: None,
        stalled_flow_timeout: None,
        draining: false,
    };
    let meta = FlowMeta {
        client: "198.18.0.2:1000".parse().expect("addr"),
        server: "198.18.1.2:80".parse().expect("addr"),
        dscp: 0,
    };
    let gateway = Gateway::new(
        crate::peers::PeerTable::new(vec![link.clone()], Vec::new()),
        0,
        Arc::new(tokio::sync::Notify::new()),
        link.memory.clone(),
        1,
    );
    let ctx = Arc::new(InterceptCtx {
        gateway: Arc::new(gateway),
        live: Arc::new(RwLock::new(live.clone())),
    });
    let conn = Intercepted {
        tcp,
        client: meta.client,
        server: meta.server,
        dscp: 0,
    };
    let charge = link.charge_flow();
    let peer = from_peer(link, flow, meta, live, charge);
    (intercepted(ctx, conn), peer)
}
