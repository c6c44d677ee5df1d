//! The testbed's pepd plumbing — configs, TPROXY rules, policy routing, transparent
//! upstream sources, readiness over the notify socket, kill and restart, the live outage —
//! checked with `pep-testbed fake-pepd`, a stand-in that relays intercepted TCP over the
//! routed path. The daemon itself is tested in the workspace's tests/relay.rs. Root only.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use pep_linkemu::cli::LinkArgs;
use pep_linkemu::LinkConfig;
use pep_testbed::addr::{self, GW_A_SAT_V4, GW_A_SAT_V6};
use pep_testbed::pepd::{self, PepdOptions, PepdTestbed, Side};
use pep_testbed::xfer::client::ClientOpts;
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::server::Server;
use pep_testbed::xfer::{Outcome, Workload};
use pep_testbed::{cmd, ping, Profile};

fn link() -> LinkConfig {
    LinkArgs {
        rate_bps: Some(20e6),
        delay_ms: Some(20.0),
        ..Default::default()
    }
    .apply(Profile::Geo.link())
    .expect("link")
}

fn fake(extra: &str, terminal: &str) -> PepdOptions {
    PepdOptions {
        binary: Some(env!("CARGO_BIN_EXE_pep-testbed").into()),
        binary_args: vec!["fake-pepd".into()],
        extra_toml: extra.into(),
        terminal_toml: terminal.into(),
        ..Default::default()
    }
}

fn bidir(tb: &PepdTestbed, server: &Server, ipv6: bool, seed: u64) -> Outcome {
    let w = Workload::Bidir {
        up: 400_000,
        down: 700_000,
    };
    let o = ClientOpts {
        server: SocketAddr::new(addr::server(ipv6), 5001),
        cc: None,
        seed,
        max_duration: Duration::from_secs(20),
    };
    let out = tb.xfer(&w, &o).expect("netns");
    assert_eq!(
        out.error,
        None,
        "server side: {:?}; sockets on gw-a:\n{}",
        server.failures(),
        cmd::run("ip", &["netns", "exec", &tb.names().gw_a, "ss", "-tanoe"]).unwrap_or_default()
    );
    assert_eq!(out.intact, Some(true));
    assert_eq!(out.bytes, 1_100_000);
    assert_eq!(
        out.down_digest,
        Some(expected_digest(seed, 1, 700_000).hex())
    );
    assert_eq!(out.up_digest, Some(expected_digest(seed, 0, 400_000).hex()));
    out
}

#[test]
fn generated_config_has_the_contract_keys_and_overrides_merge() {
    let l = Profile::Geo.link();
    let text = pepd::config_toml(
        Side::Terminal,
        &l,
        "info",
        &["[upstream]\ntransparent_source = true\n[log]\nlevel = \"debug\""],
    )
    .expect("config");
    let t: toml::Table = text.parse().expect("valid TOML");
    let get = |sec: &str, key: &str| t[sec][key].clone();
    assert_eq!(get("peer", "address").as_str(), Some("198.18.2.2:7400"));
    assert_eq!(get("peer", "bind").as_str(), Some("198.18.2.1:7400"));
    assert_eq!(get("peer", "side").as_str(), Some("terminal"));
    // gw-a transmits on the return direction (2 Mb/s) and receives the forward (20 Mb/s).
    assert_eq!(get("link", "tx_rate").as_integer(), Some(2_000_000));
    assert_eq!(get("link", "rx_rate").as_integer(), Some(20_000_000));
    assert_eq!(get("intercept", "own_mark").as_integer(), Some(2));
    assert_eq!(get("intercept", "listen").as_array().map(Vec::len), Some(2));
    assert_eq!(get("upstream", "transparent_source").as_bool(), Some(true));
    assert_eq!(get("log", "level").as_str(), Some("debug"));
    let hub: toml::Table = pepd::config_toml(Side::Hub, &l, "info", &[])
        .expect("config")
        .parse()
        .expect("toml");
    assert_eq!(hub["peer"]["side"].as_str(), Some("hub"));
    assert_eq!(hub["link"]["tx_rate"].as_integer(), Some(20_000_000));
    assert!(pepd::config_toml(Side::Hub, &l, "info", &["[peer"]).is_err());
}

#[test]
fn intercepted_flows_reach_the_relay_over_ipv4_and_ipv6() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = PepdTestbed::up(&link(), &fake("", "")).expect("up");
    let rules = cmd::run(
        "ip",
        &[
            "netns",
            "exec",
            &tb.names().gw_a,
            "nft",
            "list",
            "table",
            "inet",
            "pepd",
        ],
    )
    .expect("nft");
    assert!(rules.contains("tproxy to :7000"), "{rules}");
    let routes =
        cmd::ip_in(&tb.names().gw_b, &["-6", "route", "show", "table", "100"]).expect("ip");
    assert!(routes.contains("local default dev lo"), "{routes}");
    let v4 = tb.xfer_server(false, 5001).expect("server");
    let v6 = tb.xfer_server(true, 5001).expect("server");
    bidir(&tb, &v4, false, 3);
    bidir(&tb, &v6, true, 4);
    // The stand-in on gw-a opened the upstream connections, from its own address: had the
    // flows been routed past it, the server would see the client.
    assert_eq!(
        v4.accepted().iter().map(SocketAddr::ip).collect::<Vec<_>>(),
        [IpAddr::from(GW_A_SAT_V4)]
    );
    assert_eq!(
        v6.accepted().iter().map(SocketAddr::ip).collect::<Vec<_>>(),
        [IpAddr::from(GW_A_SAT_V6)]
    );
    let notes = tb.gateways().notifications(Side::Hub);
    assert!(notes.iter().any(|n| n.has(pepd::READY)), "{notes:?}");
}

#[test]
fn transparent_upstream_replies_come_back_under_strict_rp_filter() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb =
        PepdTestbed::up(&link(), &fake("", "[upstream]\ntransparent_source = true")).expect("up");
    // The strictest reverse-path filter a hardened gateway could have.
    for ns in [&tb.names().gw_a, &tb.names().gw_b] {
        cmd::sysctl_in(
            ns,
            &[
                "net.ipv4.conf.all.rp_filter=1",
                "net.ipv4.conf.lan0.rp_filter=1",
                "net.ipv4.conf.sat0.rp_filter=1",
            ],
        )
        .expect("sysctl");
    }
    let v4 = tb.xfer_server(false, 5001).expect("server");
    let v6 = tb.xfer_server(true, 5001).expect("server");
    bidir(&tb, &v4, false, 5);
    bidir(&tb, &v6, true, 6);
    // The relay connected from the client's own address; the server's replies to it were
    // steered back to the relay by the `socket transparent` rule.
    assert_eq!(
        v4.accepted().iter().map(SocketAddr::ip).collect::<Vec<_>>(),
        [IpAddr::from(addr::CLIENT_V4)]
    );
    assert_eq!(
        v6.accepted().iter().map(SocketAddr::ip).collect::<Vec<_>>(),
        [IpAddr::from(addr::CLIENT_V6)]
    );
}

#[test]
fn a_killed_gateway_restarts_and_reports_readiness_again() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut tb = PepdTestbed::up(&link(), &fake("", "")).expect("up");
    let server = tb.xfer_server(false, 5001).expect("server");
    let first = tb.gateways().pid(Side::Hub).expect("running");
    let status = tb.kill_gateway(Side::Hub).expect("kill");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(tb.kill_gateway(Side::Hub).is_err(), "nothing left to kill");
    let t = tb.restart_gateway(Side::Hub).expect("restart");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_ne!(tb.gateways().pid(Side::Hub), Some(first));
    let ready = tb
        .gateways()
        .notifications(Side::Hub)
        .iter()
        .filter(|n| n.has(pepd::READY))
        .count();
    assert_eq!(ready, 2);
    bidir(&tb, &server, false, 7);
    let log = tb.log_tail(Side::Hub, 100);
    assert!(log.contains("=== pep-testbed: SIGKILL"), "{log}");
}

#[test]
fn a_daemon_that_dies_at_start_is_reported_with_its_log() {
    if !pep_testbed::require_root() {
        return;
    }
    let opts = PepdOptions {
        binary: Some("/bin/sh".into()),
        binary_args: vec!["-c".into(), "echo no such luck >&2; exit 3".into()],
        ..Default::default()
    };
    let e = PepdTestbed::up(&link(), &opts)
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("exited") && e.contains("no such luck"), "{e}");
}

#[test]
fn link_down_blackholes_the_hop_until_it_comes_back() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = PepdTestbed::up(&link(), &fake("", "")).expect("up");
    let probe = |n: u16| {
        tb.in_client(move || {
            ping::ping(
                addr::SERVER_V4,
                n,
                Duration::from_millis(50),
                Duration::from_millis(500),
            )
        })
        .expect("netns")
        .expect("ping")
    };
    assert!(probe(2).iter().all(Option::is_some));
    tb.set_link_down(true).expect("down");
    tb.set_link_down(true).expect("down twice is fine");
    let t = Instant::now();
    assert!(probe(3).iter().all(Option::is_none));
    assert!(t.elapsed() >= Duration::from_millis(500));
    tb.set_link_down(false).expect("up");
    tb.set_link_down(false).expect("up twice is fine");
    assert!(probe(2).iter().all(Option::is_some));
}
