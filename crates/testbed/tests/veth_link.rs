//! The testbed's direct veth link between the gateways (no emulator) and the modes measured
//! over it for issue 15: every transfer checked byte-exact against the pattern's digests.
//! Kept short for CI. Root only.

use std::time::Duration;

use pep_testbed::runner::{self, Mode, RunResult, RunSpec};
use pep_testbed::split::SplitOptions;
use pep_testbed::topology::LinkKind;
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::{Amount, Workload};
use pep_testbed::Profile;

const SEED: u64 = 11;

fn over_veth(mode: Mode, workload: Workload, ipv6: bool) -> RunResult {
    over_veth_with(mode, workload, ipv6, "cubic")
}

fn over_veth_with(mode: Mode, workload: Workload, ipv6: bool, relay_cc: &str) -> RunResult {
    let spec = RunSpec {
        profile: Profile::Nasa,
        link: Profile::Nasa.link(),
        link_kind: LinkKind::Veth,
        mode,
        workload,
        max_duration: Duration::from_secs(60),
        seed: SEED,
        ipv6,
        pepd: Default::default(),
        split: SplitOptions {
            // The test executable has no `split-relay` command.
            binary: Some(env!("CARGO_BIN_EXE_pep-testbed").into()),
            congestion_control: relay_cc.into(),
        },
        cross: Default::default(),
        timeline: false,
        settle: Duration::ZERO,
    };
    let r = runner::run(&spec).expect("run");
    eprintln!("{}", serde_json::to_string(&r).expect("json"));
    assert_eq!(r.outcome.error, None);
    assert_eq!(r.outcome.intact, Some(true));
    assert!(!r.outcome.capped);
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
            Some(expected_digest(SEED, 1, 5_000_000).hex())
        );
        assert_eq!(
            r.outcome.up_digest,
            Some(expected_digest(SEED, 0, 3_000_000).hex())
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
        Some(expected_digest(SEED, 1, 20_000_000).hex())
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
        Some(expected_digest(SEED, 1, 20_000_000).hex())
    );
    // Both relays' CPU over the transfer is reported, and per GB of what arrived.
    let cpu = r.gateway_cpu.expect("split-tcp reports the relays' CPU");
    let names: Vec<&str> = cpu.processes.keys().map(String::as_str).collect();
    assert_eq!(names, ["gw-a", "gw-b"]);
    let sum: f64 = cpu.processes.values().map(|p| p.total_s).sum();
    assert_eq!(cpu.total_s, sum);
    assert_eq!(cpu.cpu_s_per_gb, cpu.total_s / 0.02);
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
        Some(expected_digest(SEED, 1, 3_000_000).hex())
    );
    assert_eq!(
        r.outcome.up_digest,
        Some(expected_digest(SEED, 0, 2_000_000).hex())
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
