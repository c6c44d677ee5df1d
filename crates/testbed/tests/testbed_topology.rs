//! The testbed itself: every workload of the traffic tool verifies its data through the
//! emulated link, instances do not collide, and everything is removed even on panic; the
//! direct veth link and the split-TCP relay carry data byte-exact. Root only.

use std::panic;
use std::sync::Mutex;
use std::time::Duration;

use pep_linkemu::cli::LinkArgs;
use pep_testbed::runner::{self, Mode, RunResult, RunSpec};
use pep_testbed::split::SplitOptions;
use pep_testbed::topology::{self, HostTuning, LinkKind, Topology};
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::{Amount, Workload};
use pep_testbed::{addr, in_netns, PepdOptions, Profile};

/// Runs `spec` and checks the transfer completed, every byte verified.
fn checked(spec: &RunSpec) -> RunResult {
    let r = runner::run(spec).expect("run");
    eprintln!("{}", serde_json::to_string(&r).expect("json"));
    assert_eq!(r.outcome.error, None);
    assert_eq!(r.outcome.intact, Some(true));
    assert!(!r.outcome.capped);
    r
}

/// A quick link (geo rates, 10 ms one-way) so each scenario takes about a second.
fn quick(mode: Mode, workload: Workload, ipv6: bool) -> RunResult {
    let link = LinkArgs {
        delay_ms: Some(10.0),
        ..Default::default()
    }
    .apply(Profile::Geo.link())
    .expect("link");
    checked(&RunSpec {
        max_duration: Duration::from_secs(30),
        seed: 7,
        ipv6,
        ..RunSpec::new(Profile::Geo, link, mode, workload)
    })
}

#[test]
fn download_verifies_every_byte_cubic_ipv4() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::Download(Amount::Bytes(2_000_000)),
        false,
    );
    assert_eq!(r.outcome.bytes, 2_000_000);
    assert_eq!(
        r.outcome.down_digest,
        Some(expected_digest(7, 1, 2_000_000).hex())
    );
    assert!(
        r.outcome.goodput_bps > 1e6 && r.outcome.goodput_bps < r.ref_bps * 1.01,
        "{}",
        r.outcome.goodput_bps
    );
}

#[test]
fn upload_over_ipv6_with_bbr() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainBbr,
        Workload::Upload(Amount::Bytes(500_000)),
        true,
    );
    assert_eq!(r.outcome.bytes, 500_000);
    // Uploads use the 2 Mb/s return direction.
    assert!(r.ref_bps < 2e6);
}

#[test]
fn timed_download_runs_for_its_duration() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::Download(Amount::Seconds(1.0)),
        false,
    );
    assert!(
        r.outcome.completion_s > 1.0 && r.outcome.completion_s < 2.0,
        "{}",
        r.outcome.completion_s
    );
}

#[test]
fn request_response_reports_each_latency() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::Rr {
            request: 200,
            response: 50_000,
            repeat: 3,
        },
        false,
    );
    assert_eq!(r.outcome.latencies_s.len(), 3);
    // At least one round trip (20 ms) each.
    assert!(
        r.outcome.latencies_s.iter().all(|l| *l > 0.02),
        "{:?}",
        r.outcome.latencies_s
    );
}

#[test]
fn page_fetches_all_sixteen_objects() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(Mode::PlainBbr, Workload::Page, false);
    assert_eq!(r.outcome.latencies_s.len(), 16);
    assert_eq!(r.outcome.bytes, 10_710 + 15 * 7_758);
}

#[test]
fn flows_report_jain_fairness() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::Flows {
            count: 3,
            amount: Amount::Seconds(1.5),
        },
        false,
    );
    assert_eq!(r.outcome.flows_bps.len(), 3);
    let j = r.outcome.jain_fairness.expect("fairness");
    assert!(j > 0.0 && j <= 1.0);
}

#[test]
fn bidir_carries_both_directions_at_once_with_matching_digests() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::Bidir {
            up: 300_000,
            down: 1_000_000,
        },
        false,
    );
    assert_eq!(r.outcome.bytes, 1_300_000);
    // The digests are recomputed here from the pattern, independently of the receivers.
    assert_eq!(
        r.outcome.down_digest,
        Some(expected_digest(7, 1, 1_000_000).hex())
    );
    assert_eq!(
        r.outcome.up_digest,
        Some(expected_digest(7, 0, 300_000).hex())
    );
}

#[test]
fn half_close_delivers_the_reply_after_eof() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = quick(
        Mode::PlainCubic,
        Workload::HalfClose {
            up: 100_000,
            down: 60_000,
        },
        false,
    );
    assert_eq!(r.outcome.bytes, 60_000);
}

#[test]
fn pepd_mode_without_the_daemon_says_where_it_looked() {
    if !pep_testbed::require_root() {
        return;
    }
    let spec = RunSpec {
        max_duration: Duration::from_secs(1),
        pepd: PepdOptions {
            binary: Some("/nonexistent/pepd".into()),
            ..Default::default()
        },
        ..RunSpec::new(
            Profile::Lawson,
            Profile::Lawson.link(),
            Mode::Pepd,
            Workload::Page,
        )
    };
    let e = runner::run(&spec)
        .expect_err("there is no daemon at that path")
        .to_string();
    assert!(e.contains("/nonexistent/pepd"), "{e}");
}

fn cubic() -> HostTuning {
    HostTuning {
        congestion_control: "cubic".into(),
    }
}

#[test]
fn two_instances_coexist_and_ping_through() {
    if !pep_testbed::require_root() {
        return;
    }
    let link = LinkArgs {
        delay_ms: Some(5.0),
        ..Default::default()
    }
    .apply(Profile::Nasa.link())
    .expect("link");
    let a = Topology::up(&link, &cubic()).expect("first");
    let b = Topology::up(&link, &cubic()).expect("second");
    assert_ne!(a.names.client, b.names.client);
    for t in [&a, &b] {
        let rtts = in_netns(&t.names.client, || {
            pep_testbed::ping::ping(
                addr::SERVER_V4,
                3,
                Duration::from_millis(20),
                Duration::from_secs(1),
            )
        })
        .expect("netns")
        .expect("ping");
        assert!(rtts.iter().all(Option::is_some), "{rtts:?}");
    }
}

#[test]
fn namespaces_and_processes_go_away_even_on_panic() {
    if !pep_testbed::require_root() {
        return;
    }
    let names = Mutex::new(Vec::new());
    let result = panic::catch_unwind(|| {
        let link = Profile::Lawson.link();
        let mut t = Topology::up(&link, &cubic()).expect("up");
        t.spawn_in(&t.names.gw_a.clone(), "sleep", &["300"])
            .expect("spawn");
        names
            .lock()
            .expect("lock")
            .extend(t.names.all().map(str::to_owned));
        panic!("test failure inside a testbed");
    });
    assert!(result.is_err());
    let names = names.into_inner().expect("lock");
    assert_eq!(names.len(), 4);
    let left = topology::existing().expect("list");
    for n in &names {
        assert!(!left.contains(n), "{n} survived");
    }
}

/// The direct veth link between the gateways and the modes measured over it for issue 15.
const VETH_SEED: u64 = 11;

fn over_veth(mode: Mode, workload: Workload, ipv6: bool) -> RunResult {
    over_veth_with(mode, workload, ipv6, "cubic")
}

fn over_veth_with(mode: Mode, workload: Workload, ipv6: bool, relay_cc: &str) -> RunResult {
    let r = checked(&RunSpec {
        link_kind: LinkKind::Veth,
        max_duration: Duration::from_secs(60),
        seed: VETH_SEED,
        ipv6,
        split: SplitOptions {
            // The test executable has no `split-relay` command.
            binary: Some(env!("CARGO_BIN_EXE_pep-testbed").into()),
            congestion_control: relay_cc.into(),
        },
        ..RunSpec::new(Profile::Nasa, Profile::Nasa.link(), mode, workload)
    });
    assert_eq!(r.link, LinkKind::Veth);
    assert!(r.emulator.is_none());
    r
}

#[test]
fn plain_tcp_crosses_the_veth_link_both_ways_over_ipv4_and_ipv6() {
    if !pep_testbed::require_root() {
        return;
    }
    for ipv6 in [false, true] {
        let w = Workload::Bidir {
            up: 3_000_000,
            down: 5_000_000,
        };
        let r = over_veth(Mode::PlainCubic, w, ipv6);
        assert_eq!(r.outcome.bytes, 8_000_000);
        assert_eq!(
            r.outcome.down_digest,
            Some(expected_digest(VETH_SEED, 1, 5_000_000).hex())
        );
        assert_eq!(
            r.outcome.up_digest,
            Some(expected_digest(VETH_SEED, 0, 3_000_000).hex())
        );
    }
}

#[test]
fn a_download_over_veth_is_not_held_to_the_profiles_rate() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = over_veth(
        Mode::PlainCubic,
        Workload::Download(Amount::Bytes(20_000_000)),
        false,
    );
    assert_eq!(
        r.outcome.down_digest,
        Some(expected_digest(VETH_SEED, 1, 20_000_000).hex())
    );
    // The gateways only route: no process of theirs to account.
    assert!(r.gateway_cpu.is_none());
    // The nasa profile's 100 Mb/s would apply on the emulated link; a veth pair has no
    // serialisation rate (even a loaded two-core machine moves well over this).
    assert!(
        r.outcome.goodput_bps > 150e6,
        "{} bit/s",
        r.outcome.goodput_bps
    );
}

#[test]
fn split_tcp_relays_a_download_byte_exact_over_the_veth_link() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = over_veth(
        Mode::SplitTcp,
        Workload::Download(Amount::Bytes(20_000_000)),
        false,
    );
    assert_eq!(r.outcome.bytes, 20_000_000);
    assert_eq!(
        r.outcome.down_digest,
        Some(expected_digest(VETH_SEED, 1, 20_000_000).hex())
    );
    // Both relays' CPU over the transfer is reported, and per GB of what arrived.
    let cpu = r.gateway_cpu.expect("split-tcp reports the relays' CPU");
    let names: Vec<&str> = cpu.processes.keys().map(String::as_str).collect();
    assert_eq!(names, ["gw-a", "gw-b"]);
    let sum: f64 = cpu.processes.values().map(|p| p.total_s).sum();
    assert_eq!(cpu.total_s, sum);
    assert_eq!(cpu.cpu_s_per_gb, cpu.total_s / 0.02);
    // The whole machine moved 20 MB through two relays, two end hosts and the kernel: it
    // was busy at least as long as the relays. (Softirq time is counted by clock tick and
    // may miss so short a run.)
    let m = &cpu.machine;
    assert!(m.busy_s >= cpu.total_s && m.busy_s > 0.0, "{m:?}");
    assert!((0.0..=m.busy_s).contains(&m.softirq_s), "{m:?}");
    assert_eq!(m.busy_s_per_gb, m.busy_s / 0.02);
}

#[test]
fn split_tcp_on_bbr_carries_both_directions_and_half_closes_over_ipv6() {
    if !pep_testbed::require_root() {
        return;
    }
    let r = over_veth_with(
        Mode::SplitTcp,
        Workload::Bidir {
            up: 2_000_000,
            down: 3_000_000,
        },
        true,
        "bbr",
    );
    assert_eq!(
        r.outcome.down_digest,
        Some(expected_digest(VETH_SEED, 1, 3_000_000).hex())
    );
    assert_eq!(
        r.outcome.up_digest,
        Some(expected_digest(VETH_SEED, 0, 2_000_000).hex())
    );
    let r = over_veth(
        Mode::SplitTcp,
        Workload::HalfClose {
            up: 100_000,
            down: 300_000,
        },
        true,
    );
    // The server replies only after the client's FIN came through both relays.
    assert_eq!(r.outcome.bytes, 300_000);
}
