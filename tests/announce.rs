//! Announcements end to end (root, namespaces): a hub with `[announce]` serving three
//! terminals (pep_testbed::hub) keeps exactly one blackhole route per subnet of each
//! terminal it serves in its table, moves a terminal's route to the outage table while the
//! terminal is silent and back when it answers, removes it when the terminal closes its
//! association or a reload removes its entry, empties both tables when it starts (stale
//! routes of a killed run) and when it stops; `pepd announce --flush` empties them after a
//! SIGKILL.

mod support;

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pep_linkemu::DirectionConfig;
use pep_testbed::hub::topology::lan_prefix;
use pep_testbed::hub::{HubLinks, HubTestbed, TerminalRates};
use pep_testbed::topology::command_in;
use serde_json::{json, Value};
use support::{heavy, metric_value, options, pepd_bin, scrape_metrics};

const TABLE: u32 = 200;
const OUTAGE_TABLE: u32 = 201;
/// Long enough for a batch (50 ms after a change), the outage detection of a silent
/// terminal on these links and a restarted terminal's new association.
const WAIT: Duration = Duration::from_secs(20);

fn links() -> HubLinks {
    let d = |rate_bps: f64| DirectionConfig {
        rate_bps,
        queue_bytes: 128_000,
        delay: Duration::from_millis(10),
        ..Default::default()
    };
    HubLinks {
        terminals: 3,
        carrier: d(20e6),
        ret: d(2e6),
        seed: 1,
    }
}

/// `ip -json route show table T` in `ns`, both families, as `ip` prints them.
fn routes(ns: &str, table: u32) -> Value {
    let mut all = Vec::new();
    for family in ["-4", "-6"] {
        let out = command_in(ns, "ip")
            .args([
                "-json",
                family,
                "route",
                "show",
                "table",
                &table.to_string(),
            ])
            .output()
            .expect("ip runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("FIB table does not exist") {
            continue;
        }
        assert!(
            out.status.success(),
            "ip route show table {table}: {stderr}"
        );
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).expect("ip's JSON");
        all.extend(list);
    }
    Value::Array(all)
}

/// What `ip -json -4 route show` prints for pepd's marker route to `net`.
fn blackhole(net: &str) -> Value {
    json!({"type": "blackhole", "dst": net, "flags": []})
}

/// Waits until `ns`'s tables are `serving` and `outage`, exactly; panics with what they
/// held when they do not get there within [`WAIT`].
#[track_caller]
fn wait_for_tables(ns: &str, serving: &[&str], outage: &[&str], when: &str) {
    let want = (
        Value::Array(serving.iter().map(|n| blackhole(n)).collect()),
        Value::Array(outage.iter().map(|n| blackhole(n)).collect()),
    );
    let deadline = Instant::now() + WAIT;
    let start = Instant::now();
    loop {
        let got = (routes(ns, TABLE), routes(ns, OUTAGE_TABLE));
        if got == want {
            eprintln!(
                "{when}: {} and {} after {:?}",
                got.0,
                got.1,
                start.elapsed()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: tables {TABLE} and {OUTAGE_TABLE} hold {} and {}, not {} and {}",
            got.0,
            got.1,
            want.0,
            want.1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gauge(ns: &str, table: &str) -> Option<f64> {
    metric_value(
        &scrape_metrics(ns),
        "pepd_announced_prefixes",
        Some(("table", table)),
    )
}

fn signal(pid: Option<u32>, s: Signal) {
    let pid = pid.expect("running");
    kill(Pid::from_raw(pid as i32), s).expect("signal");
}

/// Rewrites the config at `path` without the `[[peer]]` entry named `name`.
fn remove_peer(path: &std::path::Path, name: &str) {
    let text = std::fs::read_to_string(path).expect("hub config");
    let mut t: toml::Table = text.parse().expect("hub config TOML");
    let peers = t
        .get_mut("peer")
        .and_then(toml::Value::as_array_mut)
        .expect("[[peer]] entries");
    let before = peers.len();
    peers.retain(|p| p.get("name").and_then(toml::Value::as_str) != Some(name));
    assert_eq!(peers.len() + 1, before, "one entry named {name}");
    std::fs::write(path, toml::to_string(&t).expect("TOML")).expect("hub config written");
}

fn ip_in(ns: &str, args: &[&str]) {
    let out = command_in(ns, "ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn announcements_follow_the_association() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    let mut opts = options();
    // Probes every 500 ms: a silent terminal is in an outage within a few seconds.
    opts.extra_toml = "[transport]\nkeepalive = \"500ms\"\n".into();
    opts.hub_toml = format!("[announce]\ntable = {TABLE}\noutage_table = {OUTAGE_TABLE}\n");
    let rates = vec![
        TerminalRates {
            mir_bps: 20e6,
            cir_bps: 0.0,
            weight: 1,
        };
        3
    ];
    let mut tb = HubTestbed::up(&links(), &rates, &opts)
        .unwrap_or_else(|e| panic!("starting the hub testbed: {e}"));
    let hub = tb.gateways().hub().namespace().to_owned();
    let (t1, t2, t3) = (lan_prefix(1), lan_prefix(2), lan_prefix(3));

    // Every terminal served: one route each in the serving table.
    wait_for_tables(&hub, &[&t1, &t2, &t3], &[], "all established");
    assert_eq!(gauge(&hub, "serving"), Some(3.0));
    assert_eq!(gauge(&hub, "outage"), Some(0.0));

    // A reload that removes terminal 3's entry closes its association: its route goes.
    let config = tb.gateways().hub().config_path().to_owned();
    remove_peer(&config, "t3");
    signal(tb.gateways().hub().pid(), Signal::SIGHUP);
    wait_for_tables(&hub, &[&t1, &t2], &[], "terminal 3 removed by a reload");

    // Terminal 2 silent: its route moves to the outage table, and back when it answers.
    let t2_pid = tb.gateways().terminals()[1].pid();
    signal(t2_pid, Signal::SIGSTOP);
    wait_for_tables(&hub, &[&t1], &[&t2], "terminal 2 silent");
    assert_eq!(gauge(&hub, "outage"), Some(1.0));
    signal(t2_pid, Signal::SIGCONT);
    wait_for_tables(&hub, &[&t1, &t2], &[], "terminal 2 answering again");

    // Terminal 1 stops: its CLOSE ends the association, and its route goes.
    signal(tb.gateways().terminals()[0].pid(), Signal::SIGTERM);
    wait_for_tables(&hub, &[&t2], &[], "terminal 1 closed");
    assert_eq!(gauge(&hub, "serving"), Some(1.0));

    // Killed, the hub withdraws nothing; `pepd announce --flush` does.
    tb.gateways_mut().kill_hub().expect("SIGKILL");
    wait_for_tables(&hub, &[&t2], &[], "hub killed");
    let out = command_in(&hub, pepd_bin())
        .args(["announce", "--flush", "-c"])
        .arg(&config)
        .output()
        .expect("pepd announce runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("emptied announcement table {TABLE} and {OUTAGE_TABLE}\n")
    );
    wait_for_tables(&hub, &[], &[], "after pepd announce --flush");

    // Stale routes, as a killed run without the drop-in leaves them: gone at start, and
    // terminal 2 announced again once it associates with the new run.
    let (table, outage_table) = (TABLE.to_string(), OUTAGE_TABLE.to_string());
    ip_in(&hub, &["route", "add", "blackhole", &t1, "table", &table]);
    let stale = [
        "route",
        "add",
        "blackhole",
        "198.18.250.0/24",
        "table",
        &outage_table,
    ];
    ip_in(&hub, &stale);
    let stale6 = [
        "-6",
        "route",
        "add",
        "blackhole",
        "fd00:198:18:250::/64",
        "table",
        &table,
    ];
    ip_in(&hub, &stale6);
    tb.gateways_mut()
        .restart_hub(WAIT)
        .unwrap_or_else(|e| panic!("restarting the hub: {e}"));
    wait_for_tables(&hub, &[&t2], &[], "hub restarted");

    // SIGTERM: the hub drains, stops and empties its tables before it exits.
    let hub_daemon = tb.gateways_mut().hub_mut();
    signal(hub_daemon.pid(), Signal::SIGTERM);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = hub_daemon.exit_status() {
            break status;
        }
        assert!(Instant::now() < deadline, "the hub did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert_eq!(routes(&hub, TABLE), json!([]));
    assert_eq!(routes(&hub, OUTAGE_TABLE), json!([]));
}
