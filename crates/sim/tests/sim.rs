//! The simulator end to end: determinism, intact delivery over impaired links, and the CLI's
//! report and errors.

use std::process::Command;
use std::time::Duration;

use pep_sim::channel::Impairments;
use pep_sim::jitter::{JitterConfig, JitterKind};
use pep_sim::link::LinkConfig;
use pep_sim::report;
use pep_sim::sim::{Scenario, Simulation, Workload};
use pep_transport::{CcMode, Config};

fn scenario(ber: f64, cc: CcMode, workload: Workload, seed: u64) -> Scenario {
    let link = |rate| {
        LinkConfig::fixed(
            rate,
            Duration::from_millis(250),
            1 << 20,
            Impairments {
                ber,
                ..Default::default()
            },
        )
    };
    let mut a = Config::for_rate(10_000_000);
    a.cc = cc;
    let mut b = Config::for_rate(1_000_000);
    b.cc = cc;
    Scenario {
        forward: link(10_000_000),
        ret: link(1_000_000),
        a_config: a,
        b_config: b,
        associations: 1,
        flows_per_association: 3,
        workload,
        seed,
        time_limit: Duration::from_secs(600),
        cross_traffic: None,
        competing_flow: None,
        interactive: None,
        start_after: Duration::ZERO,
    }
}

fn run(sc: &Scenario) -> report::Report {
    let out = Simulation::new(sc.clone()).unwrap().run();
    report::build(sc, &out, 0.0)
}

#[test]
fn same_seed_same_run_and_different_seed_different_losses() {
    let sc = scenario(1e-5, CcMode::Rate, Workload::Bytes(5_000_000), 42);
    let a = serde_json::to_value(run(&sc)).unwrap();
    let b = serde_json::to_value(run(&sc)).unwrap();
    assert_eq!(a, b);
    let c = serde_json::to_value(run(&scenario(
        1e-5,
        CcMode::Rate,
        Workload::Bytes(5_000_000),
        43,
    )))
    .unwrap();
    assert_ne!(a["losses_true"], c["losses_true"]);
}

#[test]
fn a_slotted_frame_is_read_as_one_batch_and_acknowledged_once() {
    // The forward link releases packets at slot boundaries 40 ms apart (±20 ms), about 33
    // packets a frame at 10 Mb/s: the receiver reads each frame as one batch, as the daemon
    // reads its socket, so it acknowledges each frame at most once where one ACK every 8
    // packets would send four.
    let mut sc = scenario(0.0, CcMode::Rate, Workload::Bytes(5_000_000), 7);
    sc.forward.jitter = JitterConfig {
        kind: JitterKind::Slotted,
        bound: Duration::from_millis(20),
        reorder: false,
    };
    let r = run(&sc);
    assert!(r.intact);
    let frames = (r.sim_seconds / 0.040).ceil() as u64;
    assert!(
        r.acks_sent <= frames,
        "{} ACKs in {frames} frames",
        r.acks_sent
    );
    assert!(r.packets_sent >= 5_000_000 / 1500);
}

#[test]
fn lossy_transfers_arrive_intact_in_both_modes() {
    for cc in [CcMode::Rate, CcMode::Vegas] {
        let r = run(&scenario(1e-5, cc, Workload::Bytes(5_000_000), 7));
        assert!(r.intact, "{cc:?}");
        assert_eq!(r.bytes_delivered, 5_000_000);
        assert!(
            r.losses_true.corruption > 0,
            "the channel did corrupt packets"
        );
        assert!(r.retransmitted_bytes > 0);
    }
}

#[test]
fn cli_prints_the_documented_fields() {
    let out = Command::new(env!("CARGO_BIN_EXE_pep-sim"))
        .args([
            "bulk",
            "--rate-bps",
            "2000000",
            "--delay-ms",
            "100",
            "--ber",
            "1e-6",
            "--seconds",
            "5",
            "--flows",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "goodput_bps",
        "ref_bps",
        "efficiency",
        "completion_s",
        "intact",
        "forward_wire_bytes",
        "return_wire_bytes",
        "retransmitted_bytes",
        "losses_by_cause",
        "losses_true",
        "jain_fairness",
        "sim_seconds",
        "cpu_seconds",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["intact"], true);
    let ref_bps = v["ref_bps"].as_f64().unwrap();
    let expected = 2e6 * (1.0f64 - 1e-6).powi(12000) * 1460.0 / 1500.0;
    assert!((ref_bps - expected).abs() < 1.0, "{ref_bps} vs {expected}");
}

#[test]
fn cli_rejects_bad_arguments_with_the_option_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_pep-sim"))
        .args([
            "bulk",
            "--rate-bps",
            "1000000",
            "--delay-ms",
            "100",
            "--seconds",
            "1",
            "--outage",
            "ten+5",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--outage"));
}
