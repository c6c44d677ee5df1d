//! pepd at its limits (root only): a connection past `limits.memory_budget` or
//! `limits.max_flows` gets the `over_limit` treatment, `refuse` and `bypass`, while the
//! flows already open stay; downloads whose clients stopped reading leave a new download
//! its share of the send budget.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use pep_testbed::addr;
use pep_testbed::pepd::{PepdTestbed, Side};
use support::*;

fn server_at(port: u16) -> SocketAddr {
    SocketAddr::new(addr::server(false), port)
}

/// Reads fail rather than hang when a test goes wrong.
fn timed(s: TcpStream) -> TcpStream {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

fn terminal_metric(tb: &PepdTestbed, name: &str) -> f64 {
    let s = scrape_metrics(Side::Terminal.namespace(tb.names()));
    metric_value(&s, name, None).unwrap_or_else(|| panic!("no {name}"))
}

/// Waits until the terminal relays `n` flows.
fn wait_active(tb: &PepdTestbed, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let active = terminal_metric(tb, "pepd_flows_active");
        if active == n {
            return;
        }
        assert!(Instant::now() < deadline, "{active} flows active, not {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_flow_past_the_memory_budget_is_refused() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    // The budget carries three idle flows and half of a fourth: with `flow_buffer` set this
    // small, the receive reserve is half the budget, so the other half is
    // fixed + 3 × 4 KiB + 2 KiB.
    let fixed = pepd::config::budget::fixed(1500, pepd::config::budget::runtime_threads());
    let budget = 2 * (fixed + 3 * pepd::config::budget::PER_FLOW + 2048);
    let mut o = options();
    o.terminal_toml = format!(
        "[limits]\nflow_buffer = \"64KiB\"\nmemory_budget = \"{budget}B\"\nover_limit = \"refuse\"\n"
    );
    let tb = up(&link(20e6, 20), &o);
    let listener = listen_in_server(&tb, server_at(5101));
    let held: Vec<TcpStream> = (0..3)
        .map(|_| timed(connect_from_client(&tb, server_at(5101)).expect("connect")))
        .collect();
    wait_active(&tb, 3.0);
    assert_eq!(terminal_metric(&tb, "pepd_flows_refused_total"), 0.0);

    // The reset may come before `connect` returns (it is sent 2 ms after the handshake).
    let err = match connect_from_client(&tb, server_at(5101)) {
        Ok(fourth) => {
            let mut buf = [0u8; 1];
            timed(fourth).read(&mut buf).expect_err("reset")
        }
        Err(e) => e,
    };
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(terminal_metric(&tb, "pepd_flows_refused_total"), 1.0);
    assert_eq!(terminal_metric(&tb, "pepd_flows_active"), 3.0);
    let accounted = terminal_metric(&tb, "pepd_memory_accounted_bytes");
    assert_eq!(
        accounted,
        (fixed + 3 * pepd::config::budget::PER_FLOW) as f64
    );

    // The flows already open still carry bytes, both ways. Which server socket is which
    // client's is not known (the hub connects in its own order): each echoes what it got.
    listener.set_nonblocking(false).expect("blocking");
    let mut upstream: Vec<TcpStream> = (0..3)
        .map(|_| timed(listener.accept().expect("upstream").0))
        .collect();
    let msgs: Vec<String> = (0..3).map(|i| format!("flow {i}")).collect();
    for (c, m) in held.iter().zip(&msgs) {
        (&*c).write_all(m.as_bytes()).expect("write");
    }
    let mut got: Vec<String> = upstream
        .iter_mut()
        .map(|s| {
            let mut b = [0u8; 6];
            s.read_exact(&mut b).expect("read at the server");
            s.write_all(&b).expect("echo");
            String::from_utf8_lossy(&b).into_owned()
        })
        .collect();
    got.sort();
    assert_eq!(got, msgs);
    for (c, m) in held.iter().zip(&msgs) {
        let mut back = [0u8; 6];
        (&*c).read_exact(&mut back).expect("read at the client");
        assert_eq!(&back, m.as_bytes());
    }
}

#[test]
fn a_flow_past_max_flows_is_bypassed() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    let mut o = options();
    // The bypass is the routed path.
    o.forbid_routed_tcp = false;
    o.terminal_toml = "[limits]\nmax_flows = 2\nover_limit = \"bypass\"\n".into();
    let tb = up(&link(20e6, 20), &o);
    let listener = listen_in_server(&tb, server_at(5102));
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| timed(connect_from_client(&tb, server_at(5102)).expect("connect")))
        .collect();
    wait_active(&tb, 2.0);
    let mut proxied: Vec<TcpStream> = (0..2)
        .map(|_| timed(listener.accept().expect("proxied").0))
        .collect();

    let mut third = timed(connect_from_client(&tb, server_at(5102)).expect("connect"));
    third.write_all(b"over the limit").expect("write");
    let (s, from) = listener.accept().expect("bypassed");
    let mut s = timed(s);
    let mut got = [0u8; 14];
    s.read_exact(&mut got).expect("read at the server");
    assert_eq!(&got, b"over the limit");
    s.write_all(b"ok").expect("reply");
    let mut back = [0u8; 2];
    third.read_exact(&mut back).expect("read at the client");
    assert_eq!(&back, b"ok");
    eprintln!("bypassed connection came from {from}");
    assert_eq!(terminal_metric(&tb, "pepd_flows_bypassed_total"), 1.0);
    assert_eq!(terminal_metric(&tb, "pepd_flows_refused_total"), 0.0);
    // Bypassed connections are not flows.
    assert_eq!(terminal_metric(&tb, "pepd_flows_active"), 2.0);

    // The proxied flows still carry bytes (which server socket is which client's is not
    // known: all are written before any is read).
    for c in &mut held {
        c.write_all(b"ping").expect("write");
    }
    for s in &mut proxied {
        let mut got = [0u8; 4];
        s.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ping");
    }
}

/// Resident set and open descriptors of `side`'s pepd.
fn rss_and_fds(tb: &PepdTestbed, side: Side) -> (u64, usize) {
    let pid = tb.gateways().pid(side).expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd")
        .count();
    (kib * 1024, fds)
}

/// Like [`rss_and_fds`], with the fewest descriptors seen over a second: a connection the
/// testbed's readiness checks made may still be closing.
fn rss_and_least_fds(tb: &PepdTestbed, side: Side) -> (u64, usize) {
    let mut least = rss_and_fds(tb, side);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_and_fds(tb, side);
        if now.1 < least.1 {
            least = now;
        }
    }
    least
}

/// Like [`rss_and_fds`], once the descriptors are `want` (for at most 5 s): the scrape
/// that saw the flows open may leave its connection to the metrics server open a moment
/// longer.
fn rss_and_settled_fds(tb: &PepdTestbed, side: Side, want: usize) -> (u64, usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = rss_and_fds(tb, side);
        if now.1 == want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Idle flows hold one descriptor each on both gateways and about the per-flow cost of
/// memory; when they close, both come back and the accounted memory is the fixed part.
#[test]
fn idle_flows_cost_a_descriptor_and_their_share_each() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const FLOWS: usize = 2_000;
    let tb = up(&link(20e6, 20), &options());
    // The default backlog of 128 would drop the final ACKs of a 2,000-connection burst.
    let listener = tb
        .in_server(|| -> std::io::Result<std::net::TcpListener> {
            let at = server_at(5103);
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            s.bind(&at.into())?;
            s.listen(4096)?;
            Ok(s.into())
        })
        .expect("server namespace")
        .expect("listener");
    let server = std::thread::spawn(move || {
        (0..FLOWS)
            .map(|_| listener.accept().expect("accept").0)
            .collect::<Vec<TcpStream>>()
    });
    let sides = [Side::Terminal, Side::Hub];
    let before = sides.map(|s| rss_and_least_fds(&tb, s));
    let to = server_at(5103);
    let clients: Vec<TcpStream> = tb
        .in_client(move || {
            (0..FLOWS)
                .map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(20)).expect("connect"))
                .collect()
        })
        .expect("client namespace");
    let accepted = server.join().expect("server thread");
    wait_active(&tb, FLOWS as f64);
    let during: Vec<_> = sides
        .iter()
        .zip(&before)
        .map(|(&s, b)| rss_and_settled_fds(&tb, s, b.1 + FLOWS))
        .collect();
    for (i, side) in sides.iter().enumerate() {
        let rss = during[i].0.saturating_sub(before[i].0) / FLOWS as u64;
        eprintln!(
            "{side:?}: {} descriptors before, {} with {FLOWS} flows; RSS {} kB before, {} kB \
             with them: {rss} B per flow",
            before[i].1,
            during[i].1,
            before[i].0 / 1024,
            during[i].0 / 1024
        );
        assert_eq!(
            during[i].1 - before[i].1,
            FLOWS,
            "{side:?}: one descriptor per flow"
        );
    }
    let accounted = terminal_metric(&tb, "pepd_memory_accounted_bytes");
    let fixed = pepd::config::budget::fixed(1500, pepd::config::budget::runtime_threads());
    assert_eq!(
        accounted,
        (fixed + FLOWS as u64 * pepd::config::budget::PER_FLOW) as f64
    );

    drop(clients);
    drop(accepted);
    wait_active(&tb, 0.0);
    // Closed flows linger in the association until their FINs are acknowledged.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let after = sides.map(|s| rss_and_fds(&tb, s).1);
        if after == before.map(|b| b.1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors {after:?}, before {before:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        terminal_metric(&tb, "pepd_memory_accounted_bytes"),
        fixed as f64
    );
}

fn hub_metric(tb: &PepdTestbed, name: &str, label: Option<(&str, &str)>) -> f64 {
    let s = scrape_metrics(Side::Hub.namespace(tb.names()));
    metric_value(&s, name, label).unwrap_or_else(|| panic!("no {name}"))
}

/// Downloads started together whose clients never read fill the hub's send budget; a
/// download started after them still gets its share and completes byte-exact, and the
/// budget holds.
#[test]
fn a_new_download_gets_its_share_beside_stalled_readers() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const STALLED: u64 = 8;
    const FRESH_BYTES: usize = 4 << 20;
    const FRESH_WITHIN: Duration = Duration::from_secs(20);
    let mut o = options();
    // The hub's send side is what the stalled downloads fill: about 3.5 MiB with a 16 MiB
    // budget, where one flow alone may buffer 4 MiB. The terminal takes at most 1 MiB of
    // each flow, far within its receive window, so it is not what they fill.
    o.hub_toml = "[limits]\nmemory_budget = \"16MiB\"\n".into();
    o.terminal_toml = "[limits]\nflow_buffer = \"1MiB\"\n".into();
    let tb = up(&link(100e6, 20), &o);
    let to = server_at(5104);
    serve_patterns(listen_in_server(&tb, to));

    let stalled: Vec<TcpStream> = tb
        .in_client(move || {
            let conns: Vec<TcpStream> = (0..STALLED)
                .map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(10)).expect("connect"))
                .collect();
            for (seed, mut c) in conns.iter().enumerate() {
                c.write_all(&(seed as u64).to_be_bytes()).expect("seed");
            }
            conns
        })
        .expect("client namespace");
    // Until the hub has read nothing more for 2 s: every buffer on the way is full.
    let relayed = || {
        hub_metric(
            &tb,
            "pepd_relay_bytes_total",
            Some(("direction", "to_peer")),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut last, mut still_since) = (relayed(), Instant::now());
    while still_since.elapsed() < Duration::from_secs(2) {
        assert!(Instant::now() < deadline, "the downloads never stalled");
        std::thread::sleep(Duration::from_millis(200));
        let now = relayed();
        if now != last {
            (last, still_since) = (now, Instant::now());
        }
    }
    let budget = hub_metric(&tb, "pepd_memory_budget_bytes", None);
    let at_stall = hub_metric(&tb, "pepd_memory_accounted_bytes", None);
    let at_share = hub_metric(&tb, "pepd_flows_at_share", None);

    let t = Instant::now();
    let deadline = t + FRESH_WITHIN;
    // The bytes read and checked, and what ended the download short.
    let (fresh, failed) = tb
        .in_client(move || download_pattern(to, STALLED, FRESH_BYTES, deadline))
        .expect("client namespace");
    let fresh_s = t.elapsed().as_secs_f64();
    let after = hub_metric(&tb, "pepd_memory_accounted_bytes", None);
    eprintln!(
        "{STALLED} stalled downloads: hub accounted {at_stall} B of {budget} B, {at_share} \
         flows at their share; a new download read {fresh} B of {FRESH_BYTES} in {fresh_s:.1} s \
         ({failed:?}), the hub then accounting {after} B"
    );
    assert_eq!((fresh, failed), (FRESH_BYTES, None), "the new download");
    assert!(fresh_s < FRESH_WITHIN.as_secs_f64());
    assert!(at_stall <= budget && after <= budget, "hub over its budget");
    assert_eq!(
        at_share, STALLED as f64,
        "every stalled flow is held at its share"
    );
    drop(stalled);
}
