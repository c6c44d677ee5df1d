//! Redundant hubs end to end (root, namespaces): two hubs with the same key and peer list
//! (`[tunnel] redundant = true`) on a switched teleport segment, the terminals behind an
//! emulated carrier (pep_testbed::failover::topology). A hub binds the shared address
//! before it holds it and serves once it does; with keepalived on both, killing pepd on
//! the active hub moves the addresses, and the terminals are served by the other. Two hubs
//! at their own addresses, listed by the terminal: when the first is gone, the terminal
//! moves to the second by itself. Three active hubs with FRR announcing the terminals they serve: when one is gone, its
//! terminals move to their next hub and the router follows them there.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use pep_linkemu::DirectionConfig;
use pep_testbed::failover::active::{ActiveSet, ActiveSetTestbed};
use pep_testbed::failover::standby::StandbyTestbed;
use pep_testbed::failover::topology::SERVER;
use pep_testbed::hub::HubLinks;
use pep_testbed::in_netns;
use pep_testbed::topology::command_in;
use pep_testbed::xfer::client::{exchange, rr_open, ClientOpts};
use pep_testbed::xfer::pattern::Pattern;
use pep_testbed::xfer::server::Server;
use support::{heavy, options, pepd_bin};

const PORT: u16 = 5001;

/// `terminals` terminals on a 20 Mbit/s carrier and 2 Mbit/s returns, `one_way_ms` each way.
fn links(terminals: usize, one_way_ms: u64) -> HubLinks {
    let d = |rate_bps: f64| DirectionConfig {
        rate_bps,
        queue_bytes: 256_000,
        delay: Duration::from_millis(one_way_ms),
        ..Default::default()
    };
    HubLinks {
        terminals,
        carrier: d(20e6),
        ret: d(2e6),
        seed: 1,
    }
}

/// `pepd health` in hub `k`'s namespace: its exit status and the line it printed.
fn health(tb: &StandbyTestbed, k: usize) -> (Option<i32>, String) {
    let out = command_in(tb.hub_namespace(k), pepd_bin())
        .args(["health", "--at", "127.0.0.1:9464"])
        .output()
        .expect("pepd health runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// One request of 1,000 bytes and its response from client `i` (from 1) to the server:
/// whether the response was exact.
fn request(tb: &StandbyTestbed, i: usize, seed: u64) -> Result<bool, String> {
    let ns = &tb.topology().names.clients[i - 1];
    request_from(ns, SocketAddr::from((SERVER, PORT)), seed)
}

/// One request of 1,000 bytes and its response from a client in namespace `ns`.
fn request_from(ns: &str, server: SocketAddr, seed: u64) -> Result<bool, String> {
    in_netns(ns, move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let o = ClientOpts {
            server,
            cc: None,
            seed,
            max_duration: Duration::from_secs(20),
        };
        let mut s = rr_open(&o, seed, deadline).map_err(|e| e.to_string())?;
        let (mut up, mut down) = (Pattern::new(seed, 0), Pattern::new(seed, 1));
        exchange(&mut s, &mut up, &mut down, 1000, 1000, deadline)
            .map(|(_, exact)| exact)
            .map_err(|e| e.to_string())
    })
    .map_err(|e| e.to_string())?
}

fn server(tb: &StandbyTestbed) -> Server {
    serve(
        &tb.topology().names.server,
        SocketAddr::from((SERVER, PORT)),
    )
}

fn serve(ns: &str, at: SocketAddr) -> Server {
    in_netns(ns, move || Server::bind(at, None))
        .expect("server namespace")
        .expect("server binds")
}

/// Whether `program` can be run; when not, CI (which installs it) fails instead of
/// passing a test that ran nothing.
fn installed(program: &str, args: &[&str], installer: &str) -> bool {
    if Command::new(program).args(args).output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("PEPD_REQUIRE_ROOT_TESTS").is_none(),
        "{program} is not installed: run {installer}"
    );
    eprintln!("skipped: {program} is not installed ({installer})");
    false
}

#[test]
fn a_redundant_hub_binds_its_address_before_holding_it_and_serves_once_it_does() {
    if !pep_testbed::require_root() {
        return;
    }
    let _heavy = heavy();
    let tb = StandbyTestbed::up(&links(2, 20), &options(), None)
        .unwrap_or_else(|e| panic!("starting the hubs without their address: {e}"));
    let _server = server(&tb);
    // Both hubs started and serve (their workers answer), holding no address.
    for k in 1..=2 {
        assert!(!tb.holds_any(k).expect("ip addr"), "hub {k}");
        assert_eq!(health(&tb, k), (Some(0), "serving".to_owned()), "hub {k}");
    }
    // The terminals initiate every second towards an address nobody holds.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(tb.associations(1), Some(0));
    assert_eq!(tb.associations(2), Some(0));
    tb.take_addresses(1).expect("address added");
    let deadline = Instant::now() + Duration::from_secs(20);
    tb.wait_for_associations(1, 2, deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tb.associations(2), Some(0));
    for i in 1..=2 {
        assert_eq!(request(&tb, i, 100 + i as u64), Ok(true), "terminal {i}");
    }
}

#[test]
fn pepd_health_fails_once_the_daemon_is_gone() {
    if !pep_testbed::require_root() {
        return;
    }
    let _heavy = heavy();
    let mut tb = StandbyTestbed::up(&links(1, 5), &options(), None)
        .unwrap_or_else(|e| panic!("starting the hubs: {e}"));
    assert_eq!(health(&tb, 2), (Some(0), "serving".to_owned()));
    tb.kill_pepd(2).expect("killed");
    let (code, line) = health(&tb, 2);
    assert_eq!(code, Some(1), "{line}");
    assert!(line.starts_with("no answer from 127.0.0.1:9464"), "{line}");
    // Asked through the config instead of an address: the same endpoint.
    let out = Command::new("ip")
        .args(["netns", "exec", tb.hub_namespace(1)])
        .arg(pepd_bin())
        .args(["health", "-c"])
        .arg(tb.dir().join("h1.toml"))
        .output()
        .expect("pepd health runs");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "serving\n");
}

#[test]
fn a_standby_takes_over_when_pepd_on_the_active_is_killed() {
    if !pep_testbed::require_root() {
        return;
    }
    if !installed(
        "keepalived",
        &["--version"],
        "scripts/install-keepalived.sh",
    ) {
        return;
    }
    let _heavy = heavy();
    let mut tb = StandbyTestbed::up(&links(2, 20), &options(), Some(Duration::from_millis(500)))
        .unwrap_or_else(|e| panic!("starting the active/standby pair: {e}"));
    let _server = server(&tb);
    assert!(tb.is_active(1).expect("ip addr"));
    assert!(!tb.holds_any(2).expect("ip addr"));
    for i in 1..=2 {
        assert_eq!(
            request(&tb, i, 200 + i as u64),
            Ok(true),
            "terminal {i} before"
        );
    }
    tb.kill_pepd(1).expect("killed");
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    while !tb.is_active(2).expect("ip addr") {
        assert!(
            Instant::now() < deadline,
            "hub 2 never took both addresses:\n{:#?}",
            tb.log_tails(20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !tb.holds_any(1).expect("ip addr"),
        "both hubs hold an address"
    );
    tb.wait_for_associations(2, 2, deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 1..=2 {
        assert_eq!(
            request(&tb, i, 300 + i as u64),
            Ok(true),
            "terminal {i} after"
        );
    }
    eprintln!(
        "hub 2 served both terminals {:.1} s after pepd on hub 1 was killed",
        killed.elapsed().as_secs_f64()
    );
}

/// The value of the sample `name` (without labels) in a metrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Two hubs at their own tunnel addresses (no virtual address, no keepalived), the
/// terminal listing both; pepd on the first is killed for good. The terminal moves to the
/// second, and a request through pepd is answered exactly within 30 s.
#[test]
fn a_terminal_listing_two_hubs_is_served_by_the_second_once_the_first_is_gone() {
    if !pep_testbed::require_root() {
        return;
    }
    let _heavy = heavy();
    let mut tb = StandbyTestbed::up_listed(&links(1, 20), &options())
        .unwrap_or_else(|e| panic!("starting two hubs and a terminal listing both: {e}"));
    let _server = server(&tb);
    assert_eq!(tb.associations(2), Some(0));
    assert_eq!(request(&tb, 1, 400), Ok(true), "before");
    let text = tb.terminal_metrics(1).expect("terminal metrics");
    assert_eq!(
        metric(&text, "pepd_peer_hub_rank{peer=\"peer\"}"),
        Some(0.0)
    );
    tb.kill_pepd(1).expect("killed");
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    tb.wait_for_associations(2, 1, deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut seed = 500;
    loop {
        match request(&tb, 1, seed) {
            Ok(exact) => {
                assert!(exact, "the answer through hub 2 was not exact");
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "no answer through hub 2 within 30 s: {e}\n{:#?}",
                tb.log_tails(20)
            ),
        }
        seed += 1;
    }
    eprintln!(
        "answered through hub 2 {:.1} s after pepd on hub 1 was killed",
        killed.elapsed().as_secs_f64()
    );
    let text = tb.terminal_metrics(1).expect("terminal metrics");
    assert_eq!(metric(&text, "pepd_handovers_total"), Some(1.0));
    let logged = tb.log_tails(200).into_iter().any(|(who, log)| {
        who == "terminal 1"
            && log.contains("handover: now served by hub 198.19.0.12:7400 (was 198.19.0.11:7400)")
    });
    assert!(logged, "{:#?}", tb.log_tails(20));
    assert_eq!(
        metric(&text, "pepd_peer_hub_rank{peer=\"peer\"}"),
        Some(1.0)
    );
}

#[test]
fn a_gone_hubs_terminals_are_served_by_their_next_hub_and_routed_there() {
    if !pep_testbed::require_root() {
        return;
    }
    if !installed("vtysh", &["--version"], "scripts/install-frr.sh") {
        return;
    }
    let _heavy = heavy();
    let set = ActiveSet {
        hubs: 3,
        hub_tx_share: 1.0 / 3.0,
    };
    let mut tb = ActiveSetTestbed::up(&links(3, 20), &options(), set)
        .unwrap_or_else(|e| panic!("starting three active hubs: {e}"));
    let at = SocketAddr::from((tb.topology().server(), PORT));
    let _server = serve(&tb.topology().names.server, at);
    let clients = tb.topology().names.clients.clone();
    // Terminal `i` served by its home hub `i`, routed there, and answered (request `id`).
    let at_home = |tb: &ActiveSetTestbed, i: usize, id: u64, when: &str| {
        assert_eq!(tb.served_by(i), Some(i), "terminal {i}");
        assert_eq!(tb.routed_to(i).expect("ip route"), Some(i), "terminal {i}");
        assert_eq!(
            request_from(&clients[i - 1], at, id),
            Ok(true),
            "terminal {i} {when}"
        );
    };
    // One terminal homed on each hub, each announced by its home.
    for i in 1..=3 {
        assert_eq!(tb.home(i), i);
        at_home(&tb, i, 400 + i as u64, "before");
    }
    tb.cut_hub(1).expect("hub 1 cut");
    let cut = Instant::now();
    let deadline = cut + Duration::from_secs(30);
    // Terminal 1's next hub is hub 2: it moves there, and the router follows.
    while tb.served_by(1) != Some(2) || tb.routed_to(1).expect("ip route") != Some(2) {
        assert!(
            Instant::now() < deadline,
            "terminal 1 served by {:?}, routed to {:?}:\n{:#?}",
            tb.served_by(1),
            tb.routed_to(1),
            tb.log_tails(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let moved = cut.elapsed();
    assert_eq!(
        request_from(&clients[0], at, 501),
        Ok(true),
        "terminal 1 after"
    );
    // The others stayed where they were.
    for i in 2..=3 {
        at_home(&tb, i, 500 + i as u64, "after");
    }
    eprintln!(
        "terminal 1 served by hub 2 and routed there {:.1} s after hub 1 was cut",
        moved.as_secs_f64()
    );
}
