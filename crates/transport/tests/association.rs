//! Two associations end to end over an in-memory path: byte-exact delivery both ways,
//! half-close, reset, flow control, restart, outage, hostile input, and faults.

mod support;

use std::time::Duration;

use pep_transport::codec::Reader;
use pep_transport::frame::Frame;
use pep_transport::packet::{decode_header, Header};
use pep_transport::{Event, FlowId, FlowState, LostReason, ResetReason};
use proptest::prelude::*;
use support::{fin_at, pattern, security_pair, test_config, Faults, Net};

const MS: Duration = Duration::from_millis(1);

/// Where two byte streams first differ (or their lengths, if one is a prefix of the other).
fn first_difference(got: &[u8], want: &[u8]) -> Option<(usize, usize, usize)> {
    let at = got.iter().zip(want).position(|(a, b)| a != b);
    match at {
        Some(i) => Some((i, got.len(), want.len())),
        None if got.len() != want.len() => Some((got.len().min(want.len()), got.len(), want.len())),
        None => None,
    }
}

/// Hands every datagram to both ends at once, as if each had just arrived from the peer.
fn feed(n: &mut Net, junk: &[Vec<u8>]) {
    for d in junk {
        let now = n.now;
        n.ends[0].handle_datagram(now, d);
        n.ends[1].handle_datagram(now, d);
    }
}

fn net(faults: Faults, seed: u64) -> Net {
    let mut n = Net::new(
        test_config(20_000_000),
        test_config(20_000_000),
        MS * 100,
        faults,
        seed,
    );
    assert!(n.run_until(Duration::from_secs(10), |n| n.established()));
    n
}

#[test]
fn flows_both_ways_deliver_exact_bytes_with_independent_half_close() {
    let mut n = net(Faults::default(), 1);
    // Side 1 replies 300 KB only after side 0's FIN: the half-close probe.
    let reply = pattern(99, 300_000);
    n.apps[1].on_open = Some((Vec::new(), false, Some(reply.clone())));
    let up = pattern(1, 1_000_000);
    let f = n.open(0, 1000, up.clone(), true);
    // And a flow the other way round, opened by side 1.
    let down = pattern(2, 2_000_000);
    let g = n.open(1, 2000, down.clone(), true);
    n.apps[0].on_open = Some((Vec::new(), true, None));
    let done = n.run_until(Duration::from_secs(60), |n| {
        n.apps[0].flows[&f].fin_received && n.apps[0].flows.get(&g).is_some_and(|x| x.fin_received)
    });
    assert!(done, "transfers did not complete");
    assert_eq!(n.apps[1].flows[&f].received, up);
    assert_eq!(n.apps[0].flows[&f].received, reply);
    assert_eq!(n.apps[0].flows[&g].received, down);
    assert_eq!(n.apps[1].flows[&f].meta, Some(support::meta(1000)));
    // Both ends release all state once every byte and FIN is acknowledged.
    assert!(n.run_until(Duration::from_secs(10), |n| {
        n.ends[0].stats().flows_open == 0 && n.ends[1].stats().flows_open == 0
    }));
}

#[test]
fn flow_info_follows_a_flow_s_bytes_and_half_closes_at_both_ends() {
    let mut n = net(Faults::default(), 21);
    let up = pattern(21, 50_000);
    let f = n.open(0, 1021, up.clone(), false);
    let opened = n.ends[0].flow_info(f).expect("flow 0");
    assert!(opened.opened_here);
    assert_eq!(opened.state, FlowState::Opening);
    assert_eq!(opened.meta, Some(support::meta(1021)));
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.received.len() == up.len())));
    assert!(n.run_until(Duration::from_secs(5), |n| n.ends[0]
        .flow_info(f)
        .is_some_and(|i| i.state == FlowState::Open)));
    assert_eq!(
        n.ends[0].flow_info(f).map(|i| i.bytes_written),
        Some(50_000)
    );
    let theirs = n.ends[1].flow_info(f).expect("flow 1");
    assert!(!theirs.opened_here);
    assert_eq!((theirs.bytes_read, theirs.bytes_written), (50_000, 0));
    assert_eq!(theirs.meta, Some(support::meta(1021)));
    n.ends[0].finish(f).expect("finish");
    assert_eq!(
        n.ends[0].flow_info(f).map(|i| i.state),
        Some(FlowState::HalfClosedLocal)
    );
    assert!(n.run_until(Duration::from_secs(5), |n| fin_at(n, 1, f)));
    assert_eq!(
        n.ends[1].flow_info(f).map(|i| i.state),
        Some(FlowState::HalfClosedRemote)
    );
    n.ends[1].reset(f, ResetReason::Refused).expect("reset");
    assert_eq!(
        n.ends[1].flow_info(f).map(|i| i.state),
        Some(FlowState::Reset(ResetReason::Refused))
    );
}

#[test]
fn times_say_when_the_last_packet_and_handshake_came_and_when_an_outage_began() {
    let mut n = Net::new_secure(
        test_config(20_000_000),
        test_config(20_000_000),
        MS * 100,
        Faults::default(),
        22,
        security_pair(Duration::from_secs(120)),
    );
    assert!(n.run_until(Duration::from_secs(10), |n| n.established()));
    let t = n.ends[0].times();
    let handshake = t.last_handshake.expect("a handshake completed");
    assert!(handshake <= n.now);
    assert!(t
        .last_received
        .is_some_and(|r| r >= handshake && r <= n.now));
    assert_eq!((t.outage_since, t.remote_moved_at), (None, None));
    // Nothing gets through: the packets stop, and the peer stops answering.
    let cut = n.now;
    n.down_until = Some(n.now + Duration::from_secs(60));
    n.open(0, 1022, pattern(22, 10_000), false);
    assert!(n.run_until(Duration::from_secs(30), |n| n.ends[0]
        .times()
        .outage_since
        .is_some()));
    // What was on its way when the path went down still arrives, one delay later.
    let t = n.ends[0].times();
    assert!(t.last_received.is_some_and(|r| r <= cut + MS * 100));
    assert!(t.outage_since.is_some_and(|o| o <= cut + MS * 100));
    assert_eq!(t.last_handshake, Some(handshake));
    let plain = net(Faults::default(), 23);
    assert_eq!(
        plain.ends[0].times().last_handshake,
        None,
        "no security, no handshake"
    );
}

#[test]
fn first_bytes_ride_in_the_open() {
    let mut n = net(Faults::default(), 2);
    // Let the establishment's measurement train leave, so the pacer is idle when the
    // flow opens.
    n.run_until(Duration::from_millis(500), |_| false);
    n.record_a = Some(Vec::new());
    let req = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n".to_vec();
    let opened_at = n.elapsed();
    let f = n.open(0, 1001, req.clone(), false);
    let first = n.record_a.as_ref().unwrap()[0].clone();
    let mut r = Reader::new(&first);
    let Header::Short(_) = decode_header(&mut r).unwrap() else {
        panic!("expected a short header")
    };
    let mut saw = false;
    while !r.is_empty() {
        if let Frame::FlowOpen { data, .. } = Frame::decode(&mut r).unwrap() {
            assert_eq!(data, &req[..]);
            saw = true;
        }
    }
    assert!(saw, "the first datagram carries FLOW_OPEN with the request");
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.received == req)));
    // One one-way delay (100 ms) after opening, the server side has the request.
    assert!(
        n.elapsed() - opened_at < MS * 150,
        "{:?}",
        n.elapsed() - opened_at
    );
}

#[test]
fn reset_propagates_to_the_peer_with_its_reason_and_frees_both_ends() {
    let mut n = net(Faults::default(), 3);
    let f = n.open(0, 1002, pattern(3, 100_000), false);
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.received.len() == 100_000)));
    n.ends[1].reset(f, ResetReason::Refused).unwrap();
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[0].flows[&f]
        .reset
        .is_some()));
    assert_eq!(n.apps[0].flows[&f].reset, Some(ResetReason::Refused));
    assert!(n.run_until(Duration::from_secs(10), |n| {
        n.ends[0].stats().flows_open == 0 && n.ends[1].stats().flows_open == 0
    }));
    assert!(n.ends[0].write(f, b"x").is_err());
}

#[test]
fn slow_consumer_blocks_only_its_own_flow_and_memory_stays_bounded() {
    let mut cfg = test_config(20_000_000);
    cfg.flow_window = 256 * 1024;
    cfg.send_buffer = 256 * 1024;
    cfg.assoc_window = 4 << 20;
    let mut n = Net::new(cfg.clone(), cfg.clone(), MS * 50, Faults::default(), 4);
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    let slow = n.open(0, 1003, pattern(4, 5_000_000), true);
    let fast = n.open(0, 1004, pattern(5, 3_000_000), true);
    n.run_until(Duration::from_millis(300), |_| false);
    n.apps[1].flows.get_mut(&slow).unwrap().paused = true;
    let done = n.run_until(Duration::from_secs(30), |n| {
        n.apps[1].flows.get(&fast).is_some_and(|x| x.fin_received)
    });
    assert!(
        done,
        "the fast flow must finish while the slow one is stalled"
    );
    assert_eq!(n.apps[1].flows[&fast].received, pattern(5, 3_000_000));
    // The stalled flow's unread bytes never exceed its window.
    let stalled = n.apps[1].flows[&slow].received.len() as u64;
    assert!(stalled < 5_000_000);
    let sent = n.ends[0].stats().stream_bytes_sent;
    assert!(
        sent - 3_000_000 - stalled <= cfg.flow_window,
        "slow flow sent {} beyond what was read",
        sent - 3_000_000 - stalled
    );
    n.apps[1].flows.get_mut(&slow).unwrap().paused = false;
    assert!(
        n.run_until(Duration::from_secs(30), |n| n.apps[1].flows[&slow]
            .fin_received)
    );
    assert_eq!(n.apps[1].flows[&slow].received, pattern(4, 5_000_000));
}

/// What consumers that stopped reading hold shows as the association receive window in use;
/// past half the window it is contended, and a reset gives the flow's part back at once.
/// Flow windows of this size in a 1 MiB association window, in the receive window tests.
const STALL_FLOW: u64 = 256 * 1024;

/// A pair where every flow side 0 opens gets a download of `download` bytes (pattern
/// `seed`), and three opened at once whose consumers never read, in flows of
/// [`STALL_FLOW`] sharing a 1 MiB association window.
fn three_stalled_downloads(seed: u64, download: usize) -> (Net, Vec<FlowId>) {
    let mut cfg = test_config(20_000_000);
    cfg.flow_window = STALL_FLOW;
    cfg.send_buffer = STALL_FLOW;
    cfg.assoc_window = 1 << 20;
    let mut n = Net::new(cfg.clone(), cfg, MS * 50, Faults::default(), seed);
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    n.apps[1].on_open = Some((pattern(seed, download), true, None));
    let stalled = (0..3)
        .map(|i| {
            let f = n.open(0, 1100 + i, Vec::new(), false);
            n.apps[0].flows.get_mut(&f).unwrap().paused = true;
            f
        })
        .collect();
    (n, stalled)
}

#[test]
fn stalled_consumers_fill_the_receive_window_in_use() {
    const FLOW: u64 = STALL_FLOW;
    let (mut n, stalled) = three_stalled_downloads(41, 1 << 20);
    assert_eq!(n.ends[0].recv_window_used(), 0);
    assert!(!n.ends[0].recv_window_contended());
    n.run_until(Duration::from_secs(3), |_| false);
    assert_eq!(n.ends[0].recv_window_used(), 3 * FLOW);
    assert_eq!(n.ends[0].recv_buffered(), 3 * FLOW);
    assert!(n.ends[0].recv_window_contended());
    n.ends[0]
        .reset(stalled[0], ResetReason::ResourceLimit)
        .unwrap();
    // Half the window is not more than half.
    assert_eq!(n.ends[0].recv_window_used(), 2 * FLOW);
    assert!(!n.ends[0].recv_window_contended());
    n.run_until(Duration::from_secs(3), |_| false);
    assert_eq!(
        n.apps[1].flows[&stalled[0]].reset,
        Some(ResetReason::ResourceLimit)
    );
    assert_eq!(n.ends[0].recv_window_used(), 2 * FLOW);
}

/// While the association receive window is contended, a flow whose consumer reads is granted
/// new credit only up to its share (a quarter of the window over the open flows); once the
/// contention ends, its whole flow window again. Its bytes arrive intact either way.
#[test]
fn credit_is_shared_while_the_receive_window_is_contended() {
    const FLOW: u64 = STALL_FLOW;
    const DOWNLOAD: usize = 4 << 20;
    let (mut n, stalled) = three_stalled_downloads(42, DOWNLOAD);
    n.run_until(Duration::from_secs(3), |_| false);
    assert!(n.ends[0].recv_window_contended());
    let reader = n.open(0, 1210, Vec::new(), false);
    assert_eq!(n.ends[0].flow_recv_credit(reader), FLOW);
    assert!(
        n.run_until(Duration::from_secs(30), |n| n.apps[0].flows[&reader]
            .received
            .len()
            >= 1 << 20)
    );
    // 1 MiB / 4 / 4 flows.
    assert!(n.ends[0].recv_window_contended());
    assert!(n.ends[0].flow_recv_credit(reader) <= 64 * 1024);
    for &f in &stalled[..2] {
        n.ends[0].reset(f, ResetReason::ResourceLimit).unwrap();
    }
    assert!(!n.ends[0].recv_window_contended());
    assert!(n.run_until(Duration::from_secs(2), |n| n.ends[0]
        .flow_recv_credit(reader)
        > 64 * 1024));
    assert!(
        n.run_until(Duration::from_secs(30), |n| n.apps[0].flows[&reader]
            .fin_received)
    );
    assert_eq!(n.apps[0].flows[&reader].received, pattern(42, DOWNLOAD));
}

#[test]
fn peer_restart_resets_old_flows_and_new_flows_work_at_once() {
    let mut n = net(Faults::default(), 5);
    let old = n.open(0, 1005, pattern(6, 10_000_000), true);
    assert!(n.run_until(Duration::from_secs(2), |n| n.apps[1]
        .flows
        .get(&old)
        .is_some_and(|x| !x.received.is_empty())));
    let t0 = n.now;
    n.restart(1, test_config(20_000_000), 0xdead_beef);
    assert!(
        n.run_until(Duration::from_secs(5), |n| n.apps[0].flows[&old]
            .reset
            .is_some())
    );
    assert_eq!(n.apps[0].flows[&old].reset, Some(ResetReason::PeerRestart));
    assert!(n.now - t0 < Duration::from_secs(2), "reset within 2 s");
    assert!(n.apps[0].events.contains(&Event::PeerRestarted));
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    let new = n.open(0, 1006, pattern(7, 50_000), true);
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&new)
        .is_some_and(|x| x.fin_received)));
    assert_eq!(n.apps[1].flows[&new].received, pattern(7, 50_000));
}

/// 20 MB from side 0 to side 1 on a fresh association (`seed`), 2 s under way.
fn bulk_under_way(seed: u64, port: u16) -> (Net, FlowId, Vec<u8>) {
    let mut n = net(Faults::default(), seed);
    let data = pattern(seed + 2, 20_000_000);
    let f = n.open(0, port, data.clone(), true);
    n.run_until(Duration::from_secs(2), |_| false);
    (n, f, data)
}

#[test]
fn flows_survive_an_outage_shorter_than_the_limit() {
    let (mut n, f, data) = bulk_under_way(6, 1007);
    n.down_until = Some(n.now + Duration::from_secs(30));
    let done = n.run_until(Duration::from_secs(120), |n| {
        n.apps[1].flows.get(&f).is_some_and(|x| x.fin_received)
    });
    assert!(done);
    assert_eq!(n.apps[1].flows[&f].received, data);
    assert!(n.apps[0].events.contains(&Event::OutageStarted));
    assert!(n.apps[0]
        .events
        .iter()
        .any(|e| matches!(e, Event::OutageEnded { .. })));
    assert_eq!(n.ends[0].stats().flows_reset, 0);
}

/// A sender whose window went into an outage has nothing to send but probes, and its probe
/// timer has backed off to about a second by the outage's end. Its PINGs every 50 ms while
/// nothing answers find the path back: it sends again one round trip after the first of
/// them that gets through, not at its timer's next expiry.
#[test]
fn a_sender_notices_the_end_of_an_outage_within_one_silent_probe_interval() {
    let (mut n, f, data) = bulk_under_way(8, 1010);
    let outage = Duration::from_secs(1);
    let down_end = n.now + outage;
    let probes = n.ends[0].stats().probes_sent;
    n.down_until = Some(down_end);
    n.run_to(down_end);
    let before = n.apps[1].flows[&f].received.len();
    // The first PING goes at the timer's expiry, about 0.4 s in (the ACKs on their way come
    // in for 0.1 s, then the timer runs about 0.3 s), the rest 50 ms apart: a dozen more.
    let in_outage = n.ends[0].stats().probes_sent - probes;
    assert!((12..=15).contains(&in_outage), "{in_outage} probes");
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1].flows[&f]
        .received
        .len()
        > before));
    let resumed = n.now.saturating_duration_since(down_end);
    // A PING within 50 ms of the outage's end, its ACK back 200 ms later, new bytes 100 ms
    // after that; the timer's own probe would leave about 0.9 s after the outage's end.
    assert!(
        resumed <= MS * 360,
        "resumed {resumed:?} after the outage's end"
    );
    assert!(n.run_until(Duration::from_secs(60), |n| fin_at(n, 1, f)));
    assert_eq!(n.apps[1].flows[&f].received, data);
}

#[test]
fn an_outage_beyond_the_limit_resets_flows_on_both_sides() {
    let mut cfg = test_config(20_000_000);
    cfg.outage_limit = Duration::from_secs(10);
    let mut n = Net::new(cfg.clone(), cfg.clone(), MS * 100, Faults::default(), 7);
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    let f = n.open(0, 1008, pattern(9, 50_000_000), true);
    n.run_until(Duration::from_secs(1), |_| false);
    n.down_until = Some(n.now + Duration::from_secs(20));
    assert!(n.run_until(Duration::from_secs(20), |n| n.apps[0].flows[&f]
        .reset
        .is_some()));
    assert_eq!(n.apps[0].flows[&f].reset, Some(ResetReason::OutageLimit));
    assert!(n.apps[0].events.contains(&Event::AssociationLost {
        reason: LostReason::OutageLimit
    }));
    // When the link returns, the association comes back and the peer drops its side too.
    assert!(n.run_until(Duration::from_secs(30), |n| n.established()
        && n.apps[1].flows.get(&f).is_some_and(|x| x.reset.is_some())));
    let g = n.open(0, 1009, pattern(10, 10_000), true);
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&g)
        .is_some_and(|x| x.fin_received)));
}

#[test]
fn steady_state_data_packets_carry_at_most_8_bytes_of_overhead() {
    for rate in [1_544_000u64, 100_000_000] {
        let mut n = Net::new(
            test_config(rate),
            test_config(rate),
            MS * 250,
            Faults::default(),
            8,
        );
        assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
        n.open(0, 1010, pattern(11, 30_000_000), true);
        n.run_until(Duration::from_secs(2), |_| false);
        n.record_a = Some(Vec::new());
        n.run_until(Duration::from_secs(1), |_| false);
        let mut checked = 0;
        for d in n.record_a.take().unwrap() {
            let mut r = Reader::new(&d);
            let Ok(Header::Short(h)) = decode_header(&mut r) else {
                continue;
            };
            if let Some(imp) = h.implicit_data {
                let data = match Frame::decode_implicit_data(&mut r, imp.fin, imp.offset_len) {
                    Ok(Frame::Data { data, .. }) => data,
                    other => panic!("{other:?}"),
                };
                assert!(
                    d.len() - data.len() <= 8,
                    "{} bytes of overhead",
                    d.len() - data.len()
                );
                checked += 1;
            }
        }
        assert!(checked > 50, "only {checked} data packets seen at {rate}");
    }
}

/// Without packet protection (the AEAD layer of the security work), an injected datagram
/// that happens to parse is indistinguishable from the peer's; what the core guarantees is
/// that malformed input is dropped, counted and changes nothing.
#[test]
fn malformed_datagrams_are_dropped_and_counted_without_disturbing_flows() {
    let mut n = net(Faults::default(), 9);
    let data = pattern(12, 500_000);
    let f = n.open(0, 1011, data.clone(), true);
    n.run_until(Duration::from_millis(300), |_| false);
    let junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x80],
        vec![0x81, 0, 0, 0, 1],
        vec![0x8f; 40],
        // Short header announcing implicit data with flag bits but nothing after it.
        vec![0x2f, 0x00],
        // Short header, 2-byte packet number, an ACK frame cut short.
        vec![0x20, 0x00, 0x05, 0x02, 0x40],
        // Unknown frame type.
        vec![0x20, 0x00, 0x06, 0x7f],
        // ACK whose range reaches below zero.
        vec![0x20, 0x00, 0x07, 0x02, 0x05, 0x00, 0x00, 0x09],
    ];
    let dropped = |n: &Net| {
        let s = n.ends[1].stats();
        s.malformed_dropped + s.duplicates_dropped
    };
    let before = dropped(&n);
    for d in &junk {
        let now = n.now;
        n.ends[1].handle_datagram(now, d);
    }
    assert_eq!(dropped(&n) - before, junk.len() as u64);
    assert!(n.run_until(Duration::from_secs(20), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.fin_received)));
    assert_eq!(n.apps[1].flows[&f].received, data);
}

#[test]
fn a_thousand_concurrent_flows_arrive_byte_exact() {
    let mut n = net(Faults::default(), 10);
    let ids: Vec<_> = (0..1000u16)
        .map(|i| {
            n.open(
                0,
                3000 + i,
                pattern(u64::from(i), 2000 + usize::from(i)),
                true,
            )
        })
        .collect();
    assert!(n.run_until(Duration::from_secs(30), |n| ids
        .iter()
        .all(|f| n.apps[1].flows.get(f).is_some_and(|x| x.fin_received))));
    for (i, f) in ids.iter().enumerate() {
        assert_eq!(n.apps[1].flows[f].received, pattern(i as u64, 2000 + i));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the path does, every flow ends with exactly the bytes sent, or with a clean
    /// reset; never a panic, never a silent stall.
    #[test]
    fn faults_end_in_exact_bytes_or_a_clean_reset(
        loss in 0.0f64..0.3,
        duplicate in 0.0f64..0.2,
        reorder in 0.0f64..0.3,
        truncate in 0.0f64..0.05,
        seed in 1u64..1_000_000,
        sizes in proptest::collection::vec(0usize..200_000, 1..5),
    ) {
        let faults = Faults { loss, duplicate, reorder, reorder_by: MS * 80, truncate };
        let mut n = Net::new(test_config(20_000_000), test_config(20_000_000), MS * 100, faults, seed);
        prop_assert!(n.run_until(Duration::from_secs(60), |n| n.established()));
        n.apps[1].on_open = Some((pattern(seed ^ 7, 50_000), true, None));
        let flows: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (n.open(0, 4000 + i as u16, pattern(seed + i as u64, s), true), s, i))
            .collect();
        let settled = |n: &Net| flows.iter().all(|(f, _, _)| {
            let a = &n.apps[0].flows[f];
            let b = n.apps[1].flows.get(f);
            a.reset.is_some()
                || b.is_some_and(|b| b.reset.is_some())
                || (a.fin_received && b.is_some_and(|b| b.fin_received))
        });
        prop_assert!(n.run_until(Duration::from_secs(600), settled), "stalled");
        for (f, s, i) in &flows {
            let a = &n.apps[0].flows[f];
            // A flow reset before its OPEN got through never reached the peer's application.
            match n.apps[1].flows.get(f) {
                Some(b) if a.reset.is_none() && b.reset.is_none() => {
                    prop_assert_eq!(first_difference(&b.received, &pattern(seed + *i as u64, *s)), None);
                    prop_assert_eq!(first_difference(&a.received, &pattern(seed ^ 7, 50_000)), None);
                }
                b => prop_assert_eq!(a.reset.or(b.and_then(|b| b.reset)), Some(ResetReason::Protocol)),
            }
        }
    }

    #[test]
    fn arbitrary_datagrams_never_panic_and_leave_a_secure_pair_usable(junk in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..1500), 1..50)) {
        let mut n = net(Faults::default(), 11);
        feed(&mut n, &junk);
        n.run_until(Duration::from_secs(1), |_| false);
        // Without packet protection junk can pass for the peer's packets (and its bytes end
        // up in a later flow), but it never stops the pair associating.
        prop_assert!(n.run_until(Duration::from_secs(10), |n| n.established()), "not established after the junk");
        // With it, junk is only ever dropped: the pair carries a flow each way byte-exact.
        let mut s = Net::new_secure(
            test_config(20_000_000),
            test_config(20_000_000),
            MS * 100,
            Faults::default(),
            11,
            security_pair(Duration::from_secs(120)),
        );
        prop_assert!(s.run_until(Duration::from_secs(10), |s| s.established()));
        feed(&mut s, &junk);
        s.run_until(Duration::from_secs(1), |_| false);
        prop_assert!(s.established(), "the junk broke the secure association");
        let up = pattern(12, 100_000);
        let down = pattern(13, 100_000);
        let f = s.open(0, 1012, up.clone(), true);
        let g = s.open(1, 2012, down.clone(), true);
        prop_assert!(s.run_until(Duration::from_secs(20), |s| fin_at(s, 1, f) && fin_at(s, 0, g)), "stalled after the junk");
        prop_assert_eq!(first_difference(&s.apps[1].flows[&f].received, &up), None);
        prop_assert_eq!(first_difference(&s.apps[0].flows[&g].received, &down), None);
    }
}

/// Found by fuzzing: FLOW_RESETs for never-seen flows with huge final offsets once
/// overflowed the association-wide accounting. They are protocol violations now, and the
/// association keeps working.
#[test]
fn reset_with_an_impossible_final_offset_is_a_violation_not_an_overflow() {
    let mut n = net(Faults::default(), 21);
    let mut d = vec![0x20, 0x7f, 0xff];
    for flow in [3u8, 5, 7, 9, 11] {
        d.extend_from_slice(&[0x04, flow, 0x00]);
        d.extend_from_slice(&[0xff; 8]);
    }
    let before = n.ends[0].stats().protocol_violations;
    let now = n.now;
    n.ends[0].handle_datagram(now, &d);
    assert_eq!(n.ends[0].stats().protocol_violations - before, 5);
    let data = pattern(21, 200_000);
    let f = n.open(0, 1021, data.clone(), true);
    assert!(n.run_until(Duration::from_secs(20), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.fin_received)));
    assert_eq!(n.apps[1].flows[&f].received, data);
}

#[test]
fn a_flow_waiting_for_its_share_is_told_when_its_data_is_acknowledged() {
    let mut n = net(Faults::default(), 9);
    let f = n.open(0, 1009, pattern(9, 50_000), false);
    let g = n.open(0, 1010, pattern(10, 50_000), false);
    n.ends[0].wait_for_quota(f);
    n.ends[0].wait_for_quota(g);
    assert_eq!(n.ends[0].stats().flows_waiting_for_quota, 2);
    let writable = |n: &Net, flow: FlowId| {
        n.apps[0]
            .events
            .iter()
            .filter(|e| matches!(e, Event::FlowWritable { flow: w } if *w == flow))
            .count()
    };
    // The first acknowledgement of `f`'s bytes ends its wait (and `g`'s, whose bytes are
    // acknowledged as well), once each.
    assert!(n.run_until(Duration::from_secs(5), |n| n.ends[0]
        .stats()
        .flows_waiting_for_quota
        == 0));
    assert_eq!((writable(&n, f), writable(&n, g)), (1, 1));
    // Lifted together: one event for each flow still waiting, none for the others.
    n.ends[0].wait_for_quota(f);
    n.ends[0].release_quota_waits();
    n.apps[0].drain_events(&mut n.ends[0]);
    assert_eq!((writable(&n, f), writable(&n, g)), (2, 1));
    assert_eq!(n.ends[0].stats().flows_waiting_for_quota, 0);
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&g)
        .is_some_and(|x| x.received.len() == 50_000)));
}

/// Side 1 serves at most 3 flows, both directions together: the peer's 4th open is reset
/// with `ResourceLimit` and its own 4th refused, each counted; lowering the limit leaves
/// the open flows alone; a flow that ends makes room for the next.
#[test]
fn flows_over_max_flows_are_refused_in_both_directions_and_counted() {
    let mut limited = test_config(20_000_000);
    limited.max_flows = 3;
    let mut n = Net::new(
        test_config(20_000_000),
        limited,
        MS * 100,
        Faults::default(),
        10,
    );
    assert!(n.run_until(Duration::from_secs(10), |n| n.established()));
    let opened: Vec<FlowId> = (0..3)
        .map(|i| n.open(0, 1100 + i, pattern(u64::from(i), 1000), false))
        .collect();
    assert!(
        n.run_until(Duration::from_secs(5), |n| opened.iter().all(|f| n.apps[1]
            .flows
            .get(f)
            .is_some_and(|x| x.received.len() == 1000)))
    );
    let fourth = n.open(0, 1103, pattern(3, 1000), false);
    assert!(
        n.run_until(Duration::from_secs(5), |n| n.apps[0].flows[&fourth]
            .reset
            .is_some())
    );
    assert_eq!(
        n.apps[0].flows[&fourth].reset,
        Some(ResetReason::ResourceLimit)
    );
    let opened_at_1 = |n: &Net, flow: FlowId| {
        n.apps[1]
            .events
            .iter()
            .any(|e| matches!(e, Event::FlowOpened { flow: f, .. } if *f == flow))
    };
    assert!(opened_at_1(&n, opened[2]));
    assert!(!opened_at_1(&n, fourth), "a refused flow is not opened");
    assert_eq!(
        n.ends[1].open_flow(support::meta(2000)).err(),
        Some(pep_transport::OpenError::TooManyFlows)
    );
    assert_eq!(n.ends[1].stats().flows_over_limit, 2);
    assert_eq!(n.ends[0].stats().flows_over_limit, 0);
    // Below the open flows now: none of them is reset.
    n.ends[1].set_max_flows(2);
    n.run_until(Duration::from_millis(500), |_| false);
    assert_eq!(n.ends[1].stats().flows_open, 3);
    assert!(opened.iter().all(|f| n.apps[0].flows[f].reset.is_none()));
    // Two of them end; with one open, the next fits under the limit of 2.
    for &f in &opened[..2] {
        n.ends[0].reset(f, ResetReason::Aborted).unwrap();
    }
    assert!(
        n.run_until(Duration::from_secs(5), |n| n.ends[1].stats().flows_open
            == 1)
    );
    let next = n.open(0, 1104, pattern(4, 1000), false);
    assert!(n.run_until(Duration::from_secs(5), |n| n.apps[1]
        .flows
        .get(&next)
        .is_some_and(|x| x.received.len() == 1000)));
    assert_eq!(n.apps[0].flows[&next].reset, None);
    assert_eq!(n.ends[1].stats().flows_over_limit, 2);
}

/// Side 0's smoothed RTT once it is handed, at `arrived(net)`, the acknowledgements side 1
/// sent for a flow's first data, held back until 300 ms after the flow opened.
fn rtt_after_acks_received_at(arrived: impl Fn(&Net) -> std::time::Instant) -> Duration {
    let mut n = net(Faults::default(), 7);
    n.run_until(Duration::from_secs(1), |_| false);
    n.record_b = Some(Vec::new());
    n.drop_filter = Some(Box::new(|from, _| from == 1));
    n.open(0, 1000, pattern(3, 20_000), false);
    n.run_until(MS * 300, |_| false);
    let at = arrived(&n);
    for d in n.record_b.take().unwrap_or_default() {
        n.ends[0].handle_datagram(at, &d);
    }
    n.ends[0].stats().rtt_smoothed
}

#[test]
fn a_receipt_time_before_the_latest_input_counts_as_the_latest_input() {
    // Acknowledgements that arrived while the caller was busy with an earlier pass: they
    // are placed at that pass, not before it, so no sample sees time go back.
    let at_latest = rtt_after_acks_received_at(|n| n.now);
    let before = rtt_after_acks_received_at(|n| n.now - MS * 150);
    assert_eq!(before, at_latest);
    // A later receipt time is used as given: the samples grow with it.
    let later = rtt_after_acks_received_at(|n| n.now + MS * 50);
    assert!(later > at_latest, "{later:?} vs {at_latest:?}");
}
