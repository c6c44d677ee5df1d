//! Traffic classes in the simulator: a stream paced at 4 Mbit/s (the client marks it AF41)
//! beside 8 bulk downloads (marked CS1) over a 10 Mbit/s GEO link. In a priority class
//! capped at 5 Mbit/s the stream keeps its rate and the bulk flows fill the rest of the
//! link; in one class with them it gets a ninth of the link.

use std::time::Duration;

use pep_sim::channel::Impairments;
use pep_sim::link::LinkConfig;
use pep_sim::sim::{Interactive, Outcome, Scenario, Simulation, Workload};
use pep_sim::timeline::BUCKET;
use pep_transport::{Config, TrafficClass};

const RATE: u64 = 10_000_000;
const ONE_WAY: Duration = Duration::from_millis(250);
/// 5000 bytes every 10 ms: 4 Mbit/s of stream bytes.
const MESSAGE: usize = 5000;
const EVERY: Duration = Duration::from_millis(10);
const RUN: Duration = Duration::from_secs(30);
/// Measured from here to the end: the association and the flows are past their start.
const FROM: Duration = Duration::from_secs(10);

fn scenario(classes: Vec<TrafficClass>, stream_class: u8) -> Scenario {
    let link = |rate| LinkConfig::fixed(rate, ONE_WAY, 1 << 20, Impairments::default());
    let mut a = Config::for_rate(RATE);
    a.classes = classes;
    Scenario {
        forward: link(RATE),
        ret: link(1_000_000),
        a_config: a,
        b_config: Config::for_rate(1_000_000),
        associations: 1,
        flows_per_association: 8,
        workload: Workload::Seconds(RUN),
        seed: 11,
        time_limit: RUN + Duration::from_secs(5),
        cross_traffic: None,
        competing_flow: None,
        interactive: Some(Interactive {
            every: EVERY,
            bytes: MESSAGE,
            class: stream_class,
        }),
        start_after: Duration::ZERO,
    }
}

/// The stream's delivered rate (bit/s) and the forward link's use (share of its rate) from
/// `FROM` after the transfer started to the end of the run.
fn measure(out: &Outcome) -> (f64, f64) {
    let start = out.transfer_start;
    let (from, to) = (start + FROM, start + RUN);
    // Message k was written at start + k × EVERY and read whole after its latency; messages
    // arrive in order.
    let delivered = out
        .interactive_latencies
        .iter()
        .enumerate()
        .map(|(k, lat)| start + EVERY * k as u32 + *lat)
        .filter(|at| *at >= from && *at < to)
        .count();
    let span = (to - from).as_secs_f64();
    let stream = (delivered * MESSAGE * 8) as f64 / span;
    let buckets = out.forward_timeline.buckets();
    let wire: u64 = buckets
        .iter()
        .filter(|b| {
            let t = Duration::from_secs_f64(b.t);
            t >= from && t + BUCKET <= to
        })
        .map(|b| b.delivered_bytes)
        .sum();
    let counted = buckets
        .iter()
        .filter(|b| {
            let t = Duration::from_secs_f64(b.t);
            t >= from && t + BUCKET <= to
        })
        .count();
    let used = wire as f64 * 8.0 / (counted as f64 * BUCKET.as_secs_f64()) / RATE as f64;
    (stream, used)
}

#[test]
fn a_priority_class_keeps_a_4_mbit_stream_beside_8_bulk_flows() {
    let sc = scenario(
        vec![
            TrafficClass::default(),
            TrafficClass {
                weight: 1,
                priority: true,
                max_rate_bps: Some(5_000_000),
            },
        ],
        1,
    );
    let out = Simulation::new(sc).expect("scenario").run();
    let (stream, used) = measure(&out);
    let bulk: Vec<u64> = out.flows.iter().map(|f| f.bytes_delivered).collect();
    eprintln!("priority class: stream {stream:.0} bit/s, link used {used:.4}, bulk {bulk:?}");
    assert!(out.flows.iter().all(|f| f.intact));
    assert!(stream >= 3_900_000.0, "stream {stream}");
    assert!(used >= 0.95, "link used {used}");
    // Its messages wait for nothing but the link: each arrives within 20 ms of the one-way
    // delay (serialising 5000 bytes at 10 Mbit/s takes 4 ms).
    let slowest = out
        .interactive_latencies
        .iter()
        .skip(100)
        .max()
        .expect("messages");
    assert!(
        *slowest < ONE_WAY + Duration::from_millis(20),
        "{slowest:?}"
    );
    // The bulk flows had the rest, alike.
    let mean = bulk.iter().sum::<u64>() as f64 / bulk.len() as f64;
    assert!(
        bulk.iter().all(|b| (*b as f64 / mean - 1.0).abs() < 0.05),
        "{bulk:?}"
    );

    // Without classes the stream takes turns with the 8 bulk flows, and falls far behind.
    let out = Simulation::new(scenario(Vec::new(), 0))
        .expect("scenario")
        .run();
    let (alone, used) = measure(&out);
    eprintln!("no classes: stream {alone:.0} bit/s, link used {used:.4}");
    assert!(alone < 2_000_000.0, "without classes {alone}");
}
