//! Traffic classes over the in-memory path, deterministically: a priority class keeps its
//! rate up to its cap beside bulk flows, weights split what is left, flows in one class
//! share it alike, and a configured class that changes nothing sends the same datagrams as
//! no classes at all.

mod support;

use std::time::Duration;

use pep_transport::{CcMode, Config, FlowId, FlowMeta, TrafficClass};
use support::*;

const RATE: u64 = 10_000_000;
const ONE_WAY: Duration = Duration::from_millis(20);
/// Measured from here, once the association and the flows run.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURED: Duration = Duration::from_secs(5);
/// More than any flow sends in the run.
const BULK_BYTES: usize = 8 << 20;

fn config(classes: &[TrafficClass]) -> Config {
    let mut c = test_config(RATE);
    // Paced at exactly RATE on the wire, so the shares are of a known whole.
    c.cc = CcMode::Rate;
    c.classes = classes.to_vec();
    c
}

fn net(classes: &[TrafficClass]) -> Net {
    let mut n = Net::new(
        config(classes),
        config(classes),
        ONE_WAY,
        Faults::default(),
        7,
    );
    establish_within_20s(&mut n);
    n
}

fn class(weight: u32, priority: bool, max_rate_bps: Option<u64>) -> TrafficClass {
    TrafficClass {
        weight,
        priority,
        max_rate_bps,
    }
}

fn flow_meta(port: u16, dscp: u8) -> FlowMeta {
    FlowMeta { dscp, ..meta(port) }
}

/// Opens a flow from side 0 in `class` that sends `data`.
fn open_in(n: &mut Net, class: u8, port: u16, data: Vec<u8>) -> FlowId {
    let m = flow_meta(port, 0);
    let id = n.ends[0].open_flow_in_class(m, class).expect("open");
    n.apps[0].flows.insert(
        id,
        FlowApp {
            to_send: data,
            meta: Some(m),
            ..Default::default()
        },
    );
    n.service(0);
    id
}

fn received(n: &Net, flow: FlowId) -> usize {
    n.apps[1].flows.get(&flow).map_or(0, |f| f.received.len())
}

/// A flow its application writes to at a steady rate, from `since`.
#[derive(Clone, Copy)]
struct Paced {
    flow: FlowId,
    bps: u64,
    since: std::time::Instant,
}

/// Runs for `total`, writing every 10 ms what `stream` owes by then.
fn run_with_stream(n: &mut Net, stream: Option<Paced>, total: Duration) {
    let tick = Duration::from_millis(10);
    let end = n.now + total;
    while n.now < end {
        if let Some(p) = stream {
            let owed = (p.bps as f64 / 8.0 * (n.now - p.since).as_secs_f64()) as usize;
            let app = n.apps[0].flows.get_mut(&p.flow).expect("stream app");
            let from = app.to_send.len();
            if owed > from {
                app.to_send.extend(pattern(from as u64 + 1, owed - from));
                n.service(0);
            }
        }
        let next = n.now + tick;
        n.run_until(next - n.now, |_| false);
    }
}

/// Bytes each of `flows` received in the measured window, as bit/s.
fn rates_in_window(n: &mut Net, flows: &[FlowId], stream: Option<Paced>) -> Vec<f64> {
    run_with_stream(n, stream, WARM_UP);
    let before: Vec<usize> = flows.iter().map(|f| received(n, *f)).collect();
    run_with_stream(n, stream, MEASURED);
    flows
        .iter()
        .zip(before)
        .map(|(f, b)| (received(n, *f) - b) as f64 * 8.0 / MEASURED.as_secs_f64())
        .collect()
}

/// A 4 Mbit/s stream in `stream_class` beside 8 bulk flows in class 0; the stream's rate
/// and the bulk flows' rates, in bit/s.
fn stream_beside_bulk(
    classes: &[TrafficClass],
    stream_class: u8,
    stream_bps: u64,
) -> (f64, Vec<f64>) {
    let mut n = net(classes);
    let stream = open_in(&mut n, stream_class, 5000, Vec::new());
    let bulk: Vec<FlowId> = (0..8)
        .map(|i| open_in(&mut n, 0, 6000 + i, pattern(u64::from(i) + 100, BULK_BYTES)))
        .collect();
    let mut flows = vec![stream];
    flows.extend(&bulk);
    let paced = Paced {
        flow: stream,
        bps: stream_bps,
        since: n.now,
    };
    let rates = rates_in_window(&mut n, &flows, Some(paced));
    // Whatever arrived is what was sent, in order.
    for f in &flows {
        let got = &n.apps[1].flows[f].received;
        assert_eq!(got[..], n.apps[0].flows[f].to_send[..got.len()]);
    }
    (rates[0], rates[1..].to_vec())
}

#[test]
fn a_priority_class_keeps_its_stream_beside_bulk_flows_and_the_rest_is_used() {
    let classes = [class(1, false, None), class(1, true, Some(5_000_000))];
    let (stream, bulk) = stream_beside_bulk(&classes, 1, 4_000_000);
    let bulk_sum: f64 = bulk.iter().sum();
    assert!(stream >= 3_900_000.0, "stream {stream}");
    // Stream bytes are what the link carries less the headers (about 4 % at 1500 bytes).
    assert!(
        stream + bulk_sum >= 0.95 * RATE as f64,
        "{stream} + {bulk_sum}"
    );
    // The bulk flows share the rest alike.
    let mean = bulk_sum / bulk.len() as f64;
    assert!(
        bulk.iter().all(|r| (r / mean - 1.0).abs() < 0.05),
        "{bulk:?}"
    );

    // Without classes the stream is one of nine flows, and gets its ninth.
    let (alone, _) = stream_beside_bulk(&[], 0, 4_000_000);
    assert!(alone < 1_300_000.0, "without classes {alone}");
}

#[test]
fn a_priority_class_is_held_to_its_cap() {
    let classes = [class(1, false, None), class(1, true, Some(5_000_000))];
    let (stream, bulk) = stream_beside_bulk(&classes, 1, 8_000_000);
    // The cap counts stream bytes, first sends and repairs.
    assert!(
        (stream / 5_000_000.0 - 1.0).abs() < 0.02,
        "capped stream {stream}"
    );
    let bulk_sum: f64 = bulk.iter().sum();
    assert!(stream + bulk_sum >= 0.95 * RATE as f64, "{bulk_sum}");
}

#[test]
fn weights_split_the_capacity_between_classes() {
    let classes = [class(1, false, None), class(3, false, None)];
    let mut n = net(&classes);
    let flows: Vec<FlowId> = (0..4)
        .map(|i| {
            open_in(
                &mut n,
                (i % 2) as u8,
                6000 + i,
                pattern(u64::from(i) + 1, BULK_BYTES),
            )
        })
        .collect();
    let rates = rates_in_window(&mut n, &flows, None);
    let (light, heavy) = (rates[0] + rates[2], rates[1] + rates[3]);
    assert!((heavy / light - 3.0).abs() < 0.1, "{heavy} / {light}");
    // Inside each class, its two flows alike.
    assert!((rates[0] / rates[2] - 1.0).abs() < 0.05, "{rates:?}");
    assert!((rates[1] / rates[3] - 1.0).abs() < 0.05, "{rates:?}");
}

#[test]
fn flows_in_one_class_share_it_alike_and_the_class_counts_them() {
    let classes = [class(1, false, None), class(2, false, None)];
    let mut n = net(&classes);
    let flows: Vec<FlowId> = (0..5)
        .map(|i| open_in(&mut n, 1, 6000 + i, pattern(u64::from(i) + 1, BULK_BYTES)))
        .collect();
    let rates = rates_in_window(&mut n, &flows, None);
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    assert!(
        rates.iter().all(|r| (r / mean - 1.0).abs() < 0.03),
        "{rates:?}"
    );
    // A class alone takes the whole capacity, whatever its weight.
    assert!(mean * 5.0 >= 0.95 * RATE as f64, "{mean}");
    let stats = n.ends[0].stats().traffic_classes;
    assert_eq!(stats.len(), 2);
    assert_eq!((stats[0].flows_open, stats[0].flows_total), (0, 0));
    assert_eq!((stats[1].flows_open, stats[1].flows_total), (5, 5));
    assert_eq!(stats[0].bytes_sent, 0);
    let sent: u64 = flows
        .iter()
        .map(|f| n.ends[0].flow_info(*f).expect("flow").bytes_written)
        .sum();
    assert!(stats[1].bytes_sent > 0 && stats[1].bytes_sent <= sent);
    assert!(stats[1].queue_delay_byte_seconds > 0.0);
}

#[test]
fn the_receiving_side_classes_a_peer_s_flow_by_its_dscp() {
    // Side 1 sends on flows side 0 opened (a hub's downloads): it puts each in the class its
    // meta says, as the daemon does, and the priority class's flow goes first.
    let classes = [class(1, false, None), class(1, true, Some(5_000_000))];
    let mut n = net(&classes);
    let bulk_meta = flow_meta(6000, 8);
    let stream_meta = flow_meta(5000, 34);
    let bulk = n.ends[0].open_flow(bulk_meta).expect("open");
    let stream = n.ends[0].open_flow(stream_meta).expect("open");
    for (id, m) in [(bulk, bulk_meta), (stream, stream_meta)] {
        n.apps[0].flows.insert(
            id,
            FlowApp {
                meta: Some(m),
                ..Default::default()
            },
        );
    }
    n.service(0);
    // Until side 1 has seen both opens, and classed them before it writes.
    let mut classed = Vec::new();
    n.run_until(Duration::from_secs(5), |n| n.apps[1].flows.len() == 2);
    for (&id, app) in &n.apps[1].flows {
        let class = if app.meta.expect("meta").dscp == 34 {
            1
        } else {
            0
        };
        classed.push((id, class));
    }
    for (id, class) in &classed {
        n.ends[1].set_flow_class(*id, *class);
        assert_eq!(n.ends[1].flow_class(*id), Some(*class));
        let app = n.apps[1].flows.get_mut(id).expect("opened");
        app.to_send = pattern(9, 300_000);
        app.finish = true;
    }
    n.service(1);
    n.run_until(Duration::from_secs(10), |n| {
        fin_at(n, 0, stream) && fin_at(n, 0, bulk)
    });
    assert!(fin_at(&n, 0, stream) && fin_at(&n, 0, bulk));
    let stats = n.ends[1].stats().traffic_classes;
    assert_eq!(
        stats.iter().map(|s| s.flows_total).collect::<Vec<_>>(),
        [1, 1]
    );
    assert_eq!(stats[1].bytes_sent, 300_000);
    // The stream was under its cap all along and went first: it finished first.
    let done = |f: FlowId| n.apps[0].flows[&f].received.len();
    assert_eq!((done(stream), done(bulk)), (300_000, 300_000));
    let stream_delay = stats[1].queue_delay_byte_seconds / stats[1].bytes_sent as f64;
    let bulk_delay = stats[0].queue_delay_byte_seconds / stats[0].bytes_sent as f64;
    assert!(stream_delay < bulk_delay, "{stream_delay} vs {bulk_delay}");
}

#[test]
fn one_plain_class_sends_the_datagrams_no_classes_send() {
    let run = |classes: &[TrafficClass]| {
        let mut n = net(classes);
        n.record_a = Some(Vec::new());
        let flows: Vec<FlowId> = (0..3)
            .map(|i| open_in(&mut n, 0, 6000 + i, pattern(u64::from(i) + 1, 400_000)))
            .collect();
        n.run_until(Duration::from_secs(3), |_| false);
        for f in flows {
            assert_eq!(received(&n, f), 400_000);
        }
        n.record_a.take().expect("recorded")
    };
    let without = run(&[]);
    let with = run(&[class(1, false, None)]);
    assert!(without.len() > 800);
    assert_eq!(without, with);
}
