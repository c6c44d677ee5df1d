//! The datagram size that follows the error rate, in the simulator: it shrinks where bit
//! errors make long datagrams die, stays full where losses do not depend on size, counts
//! the link layer's per-packet overhead, and never costs a byte.

use std::time::Duration;

use pep_sim::channel::{GilbertElliott, Impairments};
use pep_sim::link::LinkConfig;
use pep_sim::report::{self, Report};
use pep_sim::sim::{Scenario, Simulation, Workload};
use pep_transport::{Config, SizeMode};

const LAWSON_BPS: u64 = 1_544_000;
const LAWSON_DELAY: Duration = Duration::from_millis(285);
/// The largest payload-carrying datagram at a 1500-byte MTU over IPv4 (1500 − 20 − 8 −
/// 16 bytes of AEAD tag).
const FULL: u64 = 1456;

fn lawson(imp: Impairments, size: SizeMode, frame_overhead: u64, workload: Workload) -> Scenario {
    let config = || {
        let mut c = Config::for_rate(LAWSON_BPS);
        c.initial_rtt = LAWSON_DELAY * 2;
        c.datagram_size = size;
        c.frame_overhead = frame_overhead as usize;
        c
    };
    let mut forward = LinkConfig::fixed(LAWSON_BPS, LAWSON_DELAY, 1 << 20, imp.clone());
    forward.frame_overhead = frame_overhead;
    let mut ret = LinkConfig::fixed(LAWSON_BPS, LAWSON_DELAY, 1 << 20, imp);
    ret.frame_overhead = frame_overhead;
    Scenario {
        forward,
        ret,
        a_config: config(),
        b_config: config(),
        associations: 1,
        flows_per_association: 1,
        workload,
        seed: 11,
        time_limit: Duration::from_secs(900),
        cross_traffic: None,
        competing_flow: None,
        interactive: None,
        start_after: Duration::ZERO,
    }
}

fn ber(ber: f64) -> Impairments {
    Impairments {
        ber,
        ..Impairments::default()
    }
}

fn run(sc: &Scenario) -> Report {
    let out = Simulation::new(sc.clone()).expect("scenario").run();
    report::build(sc, &out, 0.0)
}

#[test]
fn bit_errors_shrink_the_datagram_and_every_byte_arrives() {
    let bytes = Workload::Bytes(4_000_000);
    let adaptive = run(&lawson(ber(1e-4), SizeMode::Adaptive, 0, bytes));
    let full = run(&lawson(ber(1e-4), SizeMode::Fixed(usize::MAX), 0, bytes));
    assert!(adaptive.intact && full.intact);
    // Repairs of data first sent at full size were re-cut to the smaller size, and the
    // receiver reassembled the same bytes.
    assert!(adaptive.datagram_size_changes >= 1);
    assert!(
        (160..=400).contains(&adaptive.datagram_size),
        "{}",
        adaptive.datagram_size
    );
    assert_eq!(full.datagram_size, FULL);
    assert_eq!(full.datagram_size_changes, 0);
    // At BER 1e-4 a full-size datagram survives with probability 0.30, a 250-byte one with
    // 0.76 (payload share 0.77 against 0.96): well over 1.5× the goodput, even counting
    // the seconds the size takes to settle.
    assert!(
        adaptive.goodput_bps > 1.5 * full.goodput_bps,
        "{} vs {}",
        adaptive.goodput_bps,
        full.goodput_bps
    );
}

#[test]
fn size_independent_bursts_keep_the_full_size() {
    // About 9 % of packets lost in bursts, whatever their size: whole link-layer frames.
    let bursts = Impairments {
        burst: Some(GilbertElliott {
            p: 0.01,
            r: 0.1,
            h: 0.0,
            k: 1.0,
        }),
        ..Impairments::default()
    };
    let r = run(&lawson(
        bursts,
        SizeMode::Adaptive,
        0,
        Workload::Seconds(Duration::from_secs(120)),
    ));
    assert!(r.intact);
    assert_eq!(r.datagram_size, FULL);
    assert_eq!(r.datagram_size_changes, 0);
}

#[test]
fn a_clean_link_keeps_the_full_size() {
    let r = run(&lawson(
        ber(0.0),
        SizeMode::Adaptive,
        0,
        Workload::Seconds(Duration::from_secs(60)),
    ));
    assert!(r.intact);
    assert_eq!(r.datagram_size, FULL);
    assert_eq!(r.datagram_size_changes, 0);
}

#[test]
fn link_layer_overhead_makes_small_datagrams_dearer() {
    let seconds = || Workload::Seconds(Duration::from_secs(120));
    let bare = run(&lawson(ber(1e-4), SizeMode::Adaptive, 0, seconds()));
    let framed = run(&lawson(ber(1e-4), SizeMode::Adaptive, 200, seconds()));
    assert!(bare.intact && framed.intact);
    // Each packet now costs 200 more bytes of link time (and of exposure to bit errors):
    // fewer, larger datagrams pay.
    assert!(
        framed.datagram_size > bare.datagram_size,
        "{} vs {}",
        framed.datagram_size,
        bare.datagram_size
    );
}
