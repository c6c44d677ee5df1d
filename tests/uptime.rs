//! Days of uptime, compressed for CI (root only, issue 16): 10,000 concurrent connections
//! through the pair on the geo profile with the default config, connection churn after
//! which descriptors and resident size come back, 2,000 slow readers that a small
//! memory budget holds, and clients that stop reading, started together, beside which a
//! new download still completes.
//!
//! The traffic is asynchronous (one thread per side would need 10,000 threads): each
//! connection sends `REQUEST` bytes (its seed, then its pattern) and the server answers
//! with `RESPONSE` bytes of the pattern, every byte checked.

mod support;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pep_testbed::cmd::sysctl_in;
use pep_testbed::pepd::{PepdTestbed, Side};
use pep_testbed::topology::command_in;
use pep_testbed::xfer::pattern::Pattern;
use pep_testbed::{addr, Profile};
use pepd::config::PepdConfig;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const REQUEST: usize = 200;
const RESPONSE: usize = 2_000;
/// How long one exchange may take before it counts as failed.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(120);

fn server_at(port: u16) -> SocketAddr {
    SocketAddr::new(addr::server(false), port)
}

/// The test's own limits, so that they are not what fails: the client's ephemeral ports
/// (one per connection, and its closes leave them in TIME_WAIT for a minute) and the
/// server's accept queue. The open files of 10,000 connections' two ends are more than
/// one process may hold here (the hard limit is 20,000, and root cannot raise it in this
/// container), so the server runs in a process of its own.
fn lift_traffic_limits(tb: &PepdTestbed) {
    sysctl_in(
        &tb.names().client,
        &[
            "net.ipv4.ip_local_port_range=1024 65535",
            "net.ipv4.tcp_tw_reuse=1",
        ],
    )
    .expect("client sysctls");
    sysctl_in(&tb.names().server, &["net.core.somaxconn=16384"]).expect("server sysctls");
}

/// What the server sends after the response: `RESPONSE` bytes and wait for the client's
/// close, or a download that does not end.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reply {
    Exchange,
    /// The response, then, once told to with [`Server::start_bulk`], filler (never read,
    /// so never checked) until the connection fails.
    Endless,
}

/// Tells this test executable, run again, to be the server: `ADDRESS exchange` or
/// `ADDRESS endless` (see [`Reply`]).
const SERVE_ENV: &str = "PEPD_UPTIME_SERVE";
const SERVER_READY: &str = "uptime server ready";
const SERVER_FAILED: &str = "uptime server failed:";

/// The server side: this executable again, in the server's namespace, running
/// [`server_process`]; killed when dropped.
struct Server {
    failures: Arc<AtomicU64>,
    child: std::process::Child,
}

impl Server {
    fn start(tb: &PepdTestbed, at: SocketAddr, reply: Reply) -> Server {
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("test executable");
        let reply = match reply {
            Reply::Exchange => "exchange",
            Reply::Endless => "endless",
        };
        let mut child = command_in(&tb.names().server, exe)
            .args(["--exact", "server_process", "--nocapture"])
            .env(SERVE_ENV, format!("{at} {reply}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("server process");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        for line in lines.by_ref() {
            if line.expect("server output") == SERVER_READY {
                break;
            }
        }
        let failures = Arc::new(AtomicU64::new(0));
        let f = failures.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if line.starts_with(SERVER_FAILED) {
                    eprintln!("{line}");
                    f.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Server { failures, child }
    }

    /// Lets every [`Reply::Endless`] connection, open or to come, start its bulk.
    fn start_bulk(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("server process");
        stdin.flush().expect("server process");
    }

    /// Connections whose request was not intact or that failed before the response was
    /// sent (a slow reader's reset at the end does not count).
    fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test of its own: the server side of the tests here, when [`Server::start`] runs
/// this executable again with [`SERVE_ENV`] set. Serves until killed.
#[test]
fn server_process() {
    let Ok(spec) = std::env::var(SERVE_ENV) else {
        return;
    };
    let (at, reply) = spec.split_once(' ').expect("ADDRESS REPLY");
    let at: SocketAddr = at.parse().expect("address");
    let gate = (reply == "endless").then(|| {
        let (go, gate) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_ok() {
                let _ = go.send(true);
            }
            // Keeps the gate open for connections to come.
            std::thread::park();
        });
        gate
    });
    let listener = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        s.set_reuse_address(true).expect("SO_REUSEADDR");
        s.set_nonblocking(true).expect("non-blocking");
        s.bind(&at.into()).expect("bind");
        s.listen(16_384).expect("listen");
        std::net::TcpListener::from(s)
    };
    pep_testbed::raise_nofile_limit().expect("RLIMIT_NOFILE");
    runtime().block_on(async move {
        let listener = TcpListener::from_std(listener).expect("listener");
        println!("{SERVER_READY}");
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let gate = gate.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(s, gate).await {
                    println!("{SERVER_FAILED} {e}");
                }
            });
        }
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn serve(
    mut s: TcpStream,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
) -> io::Result<()> {
    let mut req = [0u8; REQUEST];
    s.read_exact(&mut req).await?;
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&req[..8]);
    let seed = u64::from_be_bytes(seed);
    if !Pattern::new(seed, 0).verify(&req[8..]) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request corrupted",
        ));
    }
    let mut resp = vec![0u8; RESPONSE];
    Pattern::new(seed, 1).fill(&mut resp);
    match gate {
        None => {
            s.write_all(&resp).await?;
            // The client closes first; then this side does.
            let mut rest = [0u8; 1];
            let _ = s.read(&mut rest).await;
        }
        Some(mut gate) => {
            // Every reader gets its first bytes before the bulk starts: started together,
            // the first downloads fill the budget and the others wait for memory that
            // stalled readers never free.
            s.write_all(&resp).await?;
            gate.wait_for(|go| *go)
                .await
                .map_err(|_| io::Error::other("gate closed"))?;
            static FILLER: [u8; 16 * 1024] = [0x5a; 16 * 1024];
            while s.write_all(&FILLER).await.is_ok() {}
        }
    }
    Ok(())
}

/// Connects, sends the request for `seed` and checks the first `check` bytes of the
/// response; the connection stays open.
async fn exchange(
    to: SocketAddr,
    seed: u64,
    check: usize,
    recv_buffer: Option<u32>,
) -> io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    if let Some(b) = recv_buffer {
        sock.set_recv_buffer_size(b)?;
    }
    let mut s = sock.connect(to).await?;
    let mut req = [0u8; REQUEST];
    req[..8].copy_from_slice(&seed.to_be_bytes());
    Pattern::new(seed, 0).fill(&mut req[8..]);
    s.write_all(&req).await?;
    let mut resp = vec![0u8; check];
    s.read_exact(&mut resp).await?;
    if !Pattern::new(seed, 1).verify(&resp) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "response corrupted",
        ));
    }
    Ok(s)
}

async fn timed_exchange(
    to: SocketAddr,
    seed: u64,
    check: usize,
    recv_buffer: Option<u32>,
) -> Result<TcpStream, String> {
    match tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(to, seed, check, recv_buffer)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("connection {seed}: {e}")),
        Err(_) => Err(format!(
            "connection {seed}: no response in {EXCHANGE_TIMEOUT:?}"
        )),
    }
}

/// Opens `n` connections at once from the client, each with a checked exchange, and hands
/// them back open (sockets stay in the namespace they were made in).
fn open_together(
    tb: &PepdTestbed,
    to: SocketAddr,
    n: u64,
    first_seed: u64,
    check: usize,
    recv_buffer: Option<u32>,
) -> Vec<std::net::TcpStream> {
    let results: Vec<Result<std::net::TcpStream, String>> = tb
        .in_client(move || {
            runtime().block_on(async move {
                let tasks: Vec<_> = (first_seed..first_seed + n)
                    .map(|seed| tokio::spawn(timed_exchange(to, seed, check, recv_buffer)))
                    .collect();
                let mut out = Vec::with_capacity(tasks.len());
                for t in tasks {
                    let r = match t.await {
                        Ok(r) => r.and_then(|s| s.into_std().map_err(|e| e.to_string())),
                        Err(e) => Err(e.to_string()),
                    };
                    out.push(r);
                }
                out
            })
        })
        .expect("client namespace");
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {n} connections failed, e.g. {}",
        failed.len(),
        failed[0]
    );
    results.into_iter().flatten().collect()
}

/// `cycles` connect/exchange/close cycles, `parallel` at a time; returns the failures.
fn churn(
    tb: &PepdTestbed,
    to: SocketAddr,
    cycles: u64,
    parallel: usize,
    first_seed: u64,
) -> Vec<String> {
    tb.in_client(move || {
        runtime().block_on(async move {
            let next = Arc::new(AtomicU64::new(0));
            let workers: Vec<_> = (0..parallel)
                .map(|_| {
                    let next = next.clone();
                    tokio::spawn(async move {
                        let mut failed = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= cycles {
                                return failed;
                            }
                            if let Err(e) = timed_exchange(to, first_seed + i, RESPONSE, None).await
                            {
                                failed.push(e);
                            }
                        }
                    })
                })
                .collect();
            let mut failed = Vec::new();
            for w in workers {
                failed.extend(w.await.unwrap_or_else(|e| vec![e.to_string()]));
            }
            failed
        })
    })
    .expect("client namespace")
}

/// From a gateway's /proc status: resident size now and its peak, in bytes.
fn rss_and_peak(tb: &PepdTestbed, side: Side) -> (u64, u64) {
    let pid = tb.gateways().pid(side).expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key}"))
    };
    (kib("VmRSS:") * 1024, kib("VmHWM:") * 1024)
}

fn fds(tb: &PepdTestbed, side: Side) -> usize {
    let pid = tb.gateways().pid(side).expect("running");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd")
        .count()
}

fn gateway_metric(tb: &PepdTestbed, side: Side, name: &str, label: Option<(&str, &str)>) -> f64 {
    let s = scrape_metrics(side.namespace(tb.names()));
    metric_value(&s, name, label).unwrap_or_else(|| panic!("{side:?}: no {name}"))
}

/// Both gateways relay `n` flows: every connection the clients hold is open at once.
fn assert_all_open(tb: &PepdTestbed, n: u64) {
    for side in Side::BOTH {
        assert_eq!(
            gateway_metric(tb, side, "pepd_flows_active", None),
            n as f64,
            "{side:?}: flows active"
        );
    }
}

/// Waits until both gateways relay no flow and hold `fds` descriptors (closed flows linger
/// until their closes are acknowledged across the link).
fn wait_quiet(tb: &PepdTestbed, fds_before: [usize; 2], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let active = Side::BOTH.map(|s| gateway_metric(tb, s, "pepd_flows_active", None));
        let now = Side::BOTH.map(|s| fds(tb, s));
        if active == [0.0, 0.0] && now == fds_before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "flows active {active:?}, descriptors {now:?} (before {fds_before:?})"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Looks at `value` every `every` until it has not changed for `still`, within `within`;
/// returns the value it settled at.
fn until_still<T: PartialEq + std::fmt::Debug>(
    what: &str,
    still: Duration,
    within: Duration,
    every: Duration,
    mut value: impl FnMut() -> T,
) -> T {
    let deadline = Instant::now() + within;
    let (mut last, mut still_since) = (value(), Instant::now());
    while still_since.elapsed() < still {
        assert!(Instant::now() < deadline, "{what}: {last:?}");
        std::thread::sleep(every);
        let now = value();
        if now != last {
            (last, still_since) = (now, Instant::now());
        }
    }
    last
}

/// What the formula of docs/CONFIG.md allows `side` at most with its configured limits:
/// the budget, or less when fixed + receive reserve + send share + per-flow × max_flows is.
fn formula_bound(tb: &PepdTestbed, side: Side) -> u64 {
    let cfg = PepdConfig::load(tb.gateways().config_path(side)).expect("gateway config");
    cfg.memory_implied().worst_case
}

fn mib(b: u64) -> f64 {
    b as f64 / 1_048_576.0
}

/// The acceptance of issue 16 on the geo profile with the default config: 10,000
/// connections open together, each with a 2 kB exchange, then connection churn.
#[test]
fn ten_thousand_flows_then_churn_leave_nothing_behind() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const CONCURRENT: u64 = 10_000;
    const WARM_UP: u64 = 2_000;
    const PARALLEL: usize = 200;
    // More cycles for a longer run by hand (docs/BENCHMARKS.md).
    let cycles: u64 = std::env::var("PEPD_UPTIME_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let t_start = Instant::now();
    let tb = up(&Profile::Geo.link(), &options());
    lift_traffic_limits(&tb);
    let to = server_at(5201);
    let server = Server::start(&tb, to, Reply::Exchange);
    let sides = Side::BOTH;
    let fds_before = sides.map(|s| fds(&tb, s));
    let rss_start = sides.map(|s| rss_and_peak(&tb, s).0);

    let t = Instant::now();
    let open = open_together(&tb, to, CONCURRENT, 0, RESPONSE, None);
    let opened_s = t.elapsed().as_secs_f64();
    assert_all_open(&tb, CONCURRENT);
    let fds_open = sides.map(|s| fds(&tb, s));
    drop(open);
    wait_quiet(&tb, fds_before, Duration::from_secs(60));
    let peak = sides.map(|s| rss_and_peak(&tb, s).1);
    for (i, side) in sides.iter().enumerate() {
        let bound = formula_bound(&tb, *side);
        eprintln!(
            "{side:?}: {CONCURRENT} connections exchanged 2 kB each in {opened_s:.1} s; \
             descriptors {} → {} with them open; RSS {:.1} MiB at start, peak {:.1} MiB \
             (formula bound {:.1} MiB over the start)",
            fds_before[i],
            fds_open[i],
            mib(rss_start[i]),
            mib(peak[i]),
            mib(bound)
        );
        assert!(
            peak[i] <= rss_start[i] + bound,
            "{side:?}: peak RSS over the formula's bound"
        );
    }

    let t = Instant::now();
    let failed = churn(&tb, to, WARM_UP, PARALLEL, CONCURRENT);
    assert_eq!(failed.len(), 0, "warm-up: {:?}", failed.first());
    wait_quiet(&tb, fds_before, Duration::from_secs(60));
    let warm_s = t.elapsed().as_secs_f64();
    let rss_warm = sides.map(|s| rss_and_peak(&tb, s).0);

    let t = Instant::now();
    let failed = churn(&tb, to, cycles, PARALLEL, CONCURRENT + WARM_UP);
    let churn_s = t.elapsed().as_secs_f64();
    assert_eq!(
        failed.len(),
        0,
        "{} cycles failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    wait_quiet(&tb, fds_before, Duration::from_secs(60));
    let rss_after = sides.map(|s| rss_and_peak(&tb, s).0);
    let made = CONCURRENT + WARM_UP + cycles;
    for (i, side) in sides.iter().enumerate() {
        let change = (rss_after[i] as f64 / rss_warm[i] as f64 - 1.0) * 100.0;
        eprintln!(
            "{side:?}: warm-up of {WARM_UP} cycles in {warm_s:.1} s, {cycles} cycles \
             {PARALLEL} at a time in {churn_s:.1} s; descriptors back to {}; RSS {:.2} MiB \
             after the warm-up, {:.2} MiB after the cycles ({change:+.1} %)",
            fds_before[i],
            mib(rss_warm[i]),
            mib(rss_after[i])
        );
        assert!(change.abs() <= 10.0, "{side:?}: RSS moved {change:+.1} %");
        let origin = match side {
            Side::Terminal => "intercepted",
            Side::Hub => "peer",
        };
        assert_eq!(
            gateway_metric(&tb, *side, "pepd_flows_total", Some(("origin", origin))),
            made as f64,
            "{side:?}: flows"
        );
        // Every byte the clients sent crossed the terminal to its peer and the hub from
        // its peer, and every response the other way.
        let (to_peer, from_peer) = match side {
            Side::Terminal => (REQUEST, RESPONSE),
            Side::Hub => (RESPONSE, REQUEST),
        };
        for (direction, per) in [("to_peer", to_peer), ("from_peer", from_peer)] {
            assert_eq!(
                gateway_metric(
                    &tb,
                    *side,
                    "pepd_relay_bytes_total",
                    Some(("direction", direction))
                ),
                (made * per as u64) as f64,
                "{side:?}: bytes {direction}"
            );
        }
    }
    // The allocator keeps what the 10,000 flows freed, so a leak smaller than that would
    // not show in the resident size; the count of what flows hold must be back exactly.
    let fixed = pepd::config::budget::fixed(1500, pepd::config::budget::runtime_threads());
    for side in sides {
        assert_eq!(
            gateway_metric(&tb, side, "pepd_memory_accounted_bytes", None),
            fixed as f64,
            "{side:?}: accounted memory back to the fixed part"
        );
    }
    assert_eq!(server.failures(), 0, "server side failures");
    eprintln!("whole test: {:.1} s", t_start.elapsed().as_secs_f64());
}

/// 2,000 clients that stop reading after the first bytes of a download that does not end
/// hold each gateway within the formula's bound for a 32 MiB budget: the hub stops
/// reading from the server once its send share is full, the terminal's receive side is
/// bounded by the window it granted.
#[test]
fn slow_readers_stay_within_the_memory_budget() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const READERS: usize = 2_000;
    const BUDGET: &str = "32MiB";
    let mut o = options();
    o.extra_toml = format!("[limits]\nmemory_budget = \"{BUDGET}\"\n");
    let tb = up(&link(100e6, 20), &o);
    lift_traffic_limits(&tb);
    let to = server_at(5202);
    let mut server = Server::start(&tb, to, Reply::Endless);
    let sides = Side::BOTH;
    let rss_start = sides.map(|s| rss_and_peak(&tb, s).0);
    let bound = sides.map(|s| formula_bound(&tb, s));

    // A small receive buffer: the client's kernel takes a few kB, the rest waits in pepd.
    let t0 = Instant::now();
    let readers = open_together(&tb, to, READERS as u64, 0, 1_000, Some(4096));
    server.start_bulk();
    let relayed = || {
        (
            gateway_metric(
                &tb,
                Side::Hub,
                "pepd_relay_bytes_total",
                Some(("direction", "to_peer")),
            ),
            gateway_metric(
                &tb,
                Side::Terminal,
                "pepd_relay_bytes_total",
                Some(("direction", "from_peer")),
            ),
        )
    };
    // Until nothing moves for 3 s: the clients' and the gateways' buffers are full.
    let last = until_still(
        "the downloads never stalled",
        Duration::from_secs(3),
        Duration::from_secs(120),
        Duration::from_millis(500),
        relayed,
    );
    let stalled_s = t0.elapsed().as_secs_f64();
    assert_all_open(&tb, READERS as u64);
    let at_stall = sides.map(|s| rss_and_peak(&tb, s));
    let accounted = sides.map(|s| gateway_metric(&tb, s, "pepd_memory_accounted_bytes", None));
    let budget = sides.map(|s| gateway_metric(&tb, s, "pepd_memory_budget_bytes", None));
    for (i, side) in sides.iter().enumerate() {
        eprintln!(
            "{side:?}: {READERS} slow readers, stalled after {stalled_s:.1} s with the hub \
             relaying {:.1} MiB to its peer and the terminal {:.1} MiB to its clients; \
             accounted {:.1} MiB of the {:.0} MiB budget; RSS {:.1} MiB at start, {:.1} MiB \
             now, peak {:.1} MiB; bound start + {:.1} MiB = {:.1} MiB",
            last.0 / 1_048_576.0,
            last.1 / 1_048_576.0,
            accounted[i] / 1_048_576.0,
            budget[i] / 1_048_576.0,
            mib(rss_start[i]),
            mib(at_stall[i].0),
            mib(at_stall[i].1),
            mib(bound[i]),
            mib(rss_start[i] + bound[i])
        );
        assert!(
            accounted[i] <= budget[i],
            "{side:?}: accounted over the budget"
        );
        assert!(
            at_stall[i].1 <= rss_start[i] + bound[i],
            "{side:?}: peak RSS over the formula's bound"
        );
    }
    drop(readers);
    drop(server);
    let fds_after = Duration::from_secs(60);
    let deadline = Instant::now() + fds_after;
    while sides.map(|s| gateway_metric(&tb, s, "pepd_flows_active", None)) != [0.0, 0.0] {
        assert!(Instant::now() < deadline, "slow readers' flows never ended");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// How long the terminal lets a client take nothing before it may reset its flow, in
/// [`stalled_readers_started_together_leave_room_for_a_new_download`].
const STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A client with a 4 kB receive buffer that asks [`serve_patterns`] for `seed`'s pattern
/// and never reads it.
fn stalled_reader(to: SocketAddr, seed: u64) -> std::net::TcpStream {
    use std::io::Write;
    let s =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    s.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    s.connect_timeout(&to.into(), Duration::from_secs(10))
        .expect("connect");
    let mut s = std::net::TcpStream::from(s);
    s.write_all(&seed.to_be_bytes()).expect("seed");
    s
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Clients that stop reading, started together, fill the terminal's receive window, which
/// every flow from the hub shares. The terminal resets the flows whose clients took nothing
/// for `limits.stalled_flow_timeout` while the window is more than half full, so a download
/// started beside them completes byte-exact; one such client alone, with the window mostly
/// free, is left alone however long it waits.
#[test]
fn stalled_readers_started_together_leave_room_for_a_new_download() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const STALLED: u64 = 32;
    const FLOW_WINDOW: u64 = 2 << 20;
    const WINDOW: u64 = 16 << 20;
    const FRESH_BYTES: usize = 4 << 20;
    const FRESH_WITHIN: Duration = Duration::from_secs(20);
    let mut o = options();
    // The terminal's receive window is half its budget, 16 MiB, and each flow may fill
    // 2 MiB of it: 8 stalled downloads fill it, the 33 here four times over. The hub's
    // budget leaves its send side room for every one of them.
    o.terminal_toml = format!(
        "[limits]\nmemory_budget = \"32MiB\"\nflow_buffer = \"2MiB\"\n\
         stalled_flow_timeout = \"{}s\"\n",
        STALL_TIMEOUT.as_secs()
    );
    o.hub_toml = "[limits]\nmemory_budget = \"64MiB\"\n".into();
    let tb = up(&link(100e6, 20), &o);
    let to = server_at(5203);
    serve_patterns(listen_in_server(&tb, to));
    let terminal =
        |name: &str, label: Option<(&str, &str)>| gateway_metric(&tb, Side::Terminal, name, label);
    let in_use = || terminal("pepd_memory_in_use_bytes", None) as u64;
    let stalled_resets = || terminal("pepd_flows_reset_stalled_total", None) as u64;

    // Alone, a client that stopped reading holds an eighth of the window: its flow stays.
    let first = tb
        .in_client(move || stalled_reader(to, 0))
        .expect("client namespace");
    wait_for("the first download never arrived", FRESH_WITHIN, || {
        in_use() >= FLOW_WINDOW / 2
    });
    std::thread::sleep(3 * STALL_TIMEOUT);
    assert_eq!(stalled_resets(), 0, "a lone stalled reader was reset");
    assert_eq!(terminal("pepd_flows_active", None), 1.0);
    assert!(first.take_error().expect("SO_ERROR").is_none());

    let mut readers = vec![first];
    readers.extend(
        tb.in_client(move || {
            (1..=STALLED)
                .map(|seed| stalled_reader(to, seed))
                .collect::<Vec<_>>()
        })
        .expect("client namespace"),
    );
    // Resets may bring it back under half before a look sees it over.
    wait_for(
        "the stalled downloads never filled half the window",
        FRESH_WITHIN,
        || in_use() > WINDOW / 2 || stalled_resets() > 0,
    );
    let at_contention = in_use();

    let t = Instant::now();
    let deadline = t + FRESH_WITHIN;
    let fresh_seed = STALLED + 1;
    let (fresh, failed) = tb
        .in_client(move || download_pattern(to, fresh_seed, FRESH_BYTES, deadline))
        .expect("client namespace");
    let fresh_s = t.elapsed().as_secs_f64();

    // The resets end once the readers left hold no more than half the window.
    let resets = until_still(
        "stalled flows still reset",
        2 * STALL_TIMEOUT + Duration::from_secs(1),
        Duration::from_secs(30),
        Duration::from_millis(250),
        stalled_resets,
    );
    let readers_reset = readers
        .iter()
        .filter(|r| {
            r.take_error()
                .expect("SO_ERROR")
                .is_some_and(|e| e.kind() == io::ErrorKind::ConnectionReset)
        })
        .count() as u64;
    let left = STALLED + 1 - readers_reset;
    wait_for("the new download's flow never ended", FRESH_WITHIN, || {
        terminal("pepd_flows_active", None) == left as f64
    });
    let settled = in_use();
    let accounted = terminal("pepd_memory_accounted_bytes", None);
    let budget = terminal("pepd_memory_budget_bytes", None);
    eprintln!(
        "{} stalled readers started together: the terminal held {:.1} MiB of its {:.0} MiB \
         window when a new download started, which read {fresh} B of {FRESH_BYTES} in \
         {fresh_s:.1} s ({failed:?}); {resets} stalled flows reset ({readers_reset} clients \
         saw it), {left} left holding {:.1} MiB; accounted {:.1} of {:.0} MiB",
        STALLED + 1,
        mib(at_contention),
        mib(WINDOW),
        mib(settled),
        accounted / 1_048_576.0,
        budget / 1_048_576.0
    );
    assert_eq!((fresh, failed), (FRESH_BYTES, None), "the new download");
    assert!(fresh_s < FRESH_WITHIN.as_secs_f64());
    assert_eq!(
        resets, readers_reset,
        "the resets counted are the clients reset"
    );
    for side in Side::BOTH {
        assert_eq!(
            gateway_metric(
                &tb,
                side,
                "pepd_flow_resets_total",
                Some(("reason", "resource_limit"))
            ),
            resets as f64,
            "{side:?}: resets with resource_limit"
        );
    }
    // What stays holds no more than half the window, and a flow left holds most of its
    // 2 MiB: at most 8 of them.
    assert!(settled <= WINDOW / 2, "{settled} B held after the resets");
    assert!(left <= WINDOW / FLOW_WINDOW, "{left} stalled flows left");
    assert!(accounted <= budget, "terminal over its budget");
    drop(readers);
}
