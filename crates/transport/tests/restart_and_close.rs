//! Association lifetimes: RESET after the peer already closed, close(), and restarts at the
//! outage limit on one side only (regressions from an independent review).

mod support;

use std::time::Duration;

use pep_transport::{Event, LostReason, ResetReason};
use support::{pattern, test_config, Faults, Net};

const MS: Duration = Duration::from_millis(1);

fn net(seed: u64) -> Net {
    let mut n = Net::new(
        test_config(20_000_000),
        test_config(20_000_000),
        MS * 100,
        Faults::default(),
        seed,
    );
    assert!(n.run_until(Duration::from_secs(10), |n| n.established()));
    n
}

#[test]
fn reset_after_the_peer_closed_still_releases_both_sides() {
    let mut n = net(21);
    n.apps[1].on_open = Some((pattern(2, 10_000), true, None));
    let f = n.open(0, 1000, pattern(1, 10_000), true);
    // Side 0 never reads the peer's FIN, so it keeps the flow while side 1 releases it.
    n.apps[0].flows.get_mut(&f).unwrap().paused = true;
    assert!(n.run_until(Duration::from_secs(10), |n| n.apps[1]
        .flows
        .get(&f)
        .is_some_and(|x| x.closed)));
    assert_eq!(n.ends[0].stats().flows_open, 1);
    n.ends[0].reset(f, ResetReason::Aborted).unwrap();
    assert!(
        n.run_until(Duration::from_secs(10), |n| n.ends[0].stats().flows_open
            == 0),
        "flow state leaked at side 0"
    );
}

#[test]
fn close_resets_both_sides_and_a_new_association_works_at_once() {
    let mut n = net(23);
    let f = n.open(0, 1000, pattern(1, 3_000_000), true);
    n.run_until(Duration::from_secs(1), |_| false);
    n.ends[0].close(0, "bye");
    assert!(!n.ends[0].is_established(), "close takes effect at once");
    assert!(n.apps[0].flows.contains_key(&f));
    n.service(0);
    assert_eq!(n.apps[0].flows[&f].reset, Some(ResetReason::Aborted));
    assert!(n.run_until(Duration::from_secs(10), |n| n.established()));
    assert!(n.apps[1].events.iter().any(|e| matches!(
        e,
        Event::AssociationLost {
            reason: LostReason::PeerClosed { .. }
        }
    )));
    assert_eq!(n.apps[1].flows[&f].reset, Some(ResetReason::PeerRestart));
    let g = n.open(0, 1001, pattern(2, 200_000), true);
    assert!(n.run_until(Duration::from_secs(30), |n| n.apps[1]
        .flows
        .get(&g)
        .is_some_and(|x| x.fin_received)));
    assert_eq!(n.apps[1].flows[&g].received, pattern(2, 200_000));
}

/// Only side 0 reaches its outage limit; whatever crosses the repaired link first, side 1
/// must learn of the restart and a new flow must arrive intact under its own metadata.
#[test]
fn one_sided_outage_restart_recovers_for_any_timing() {
    for down_s in [15u64, 18, 22] {
        for extra_ms in [0u32, 500] {
            let mut a = test_config(20_000_000);
            a.outage_limit = Duration::from_secs(10);
            let mut b = test_config(20_000_000);
            b.outage_limit = Duration::from_secs(600);
            let mut n = Net::new(a, b, MS * 100, Faults::default(), 7);
            assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
            let f = n.open(0, 1008, pattern(9, 50_000_000), true);
            let g = n.open(1, 1010, pattern(19, 50_000_000), true);
            n.run_until(Duration::from_secs(1), |_| false);
            let down = Duration::from_secs(down_s) + MS * extra_ms;
            n.down_until = Some(n.now + down);
            n.run_until(down, |_| false);
            let old_reset = n.run_until(Duration::from_secs(40), |n| {
                n.established()
                    && n.apps[1].flows.get(&f).is_some_and(|x| x.reset.is_some())
                    && n.apps[1].flows.get(&g).is_some_and(|x| x.reset.is_some())
            });
            assert!(old_reset, "down {down:?}: old flows not reset at side 1");
            let h = n.open(0, 1011, pattern(10, 10_000), true);
            assert!(
                n.run_until(Duration::from_secs(20), |n| n.apps[1]
                    .flows
                    .get(&h)
                    .is_some_and(|x| x.fin_received)),
                "down {down:?}: new flow not delivered"
            );
            assert_eq!(n.apps[1].flows[&h].received, pattern(10, 10_000));
            assert_eq!(n.apps[1].flows[&h].meta, Some(support::meta(1011)));
        }
    }
}

/// After side 0's outage-limit restart, the first datagram over the repaired link is side
/// 1's probe from the old association: side 0 must not take it as a handshake.
#[test]
fn a_stale_short_packet_does_not_establish_a_restarted_side() {
    let mut a = test_config(20_000_000);
    a.outage_limit = Duration::from_secs(10);
    let mut b = test_config(20_000_000);
    b.outage_limit = Duration::from_secs(600);
    let mut n = Net::new(a, b, MS * 100, Faults::default(), 7);
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    n.open(0, 1008, pattern(9, 50_000_000), true);
    n.open(1, 1009, pattern(19, 50_000_000), true);
    n.run_until(Duration::from_secs(1), |_| false);
    n.down_until = Some(n.now + Duration::from_secs(3600));
    assert!(
        n.run_until(Duration::from_secs(30), |n| n.apps[0].events.contains(
            &Event::AssociationLost {
                reason: LostReason::OutageLimit
            }
        ))
    );
    let mut probe = None;
    for _ in 0..50 {
        let t = n.ends[1].poll_timeout().unwrap();
        n.now = n.now.max(t);
        n.ends[1].handle_timeout(n.now);
        let mut buf = Vec::new();
        if n.ends[1].poll_transmit(n.now, &mut buf) && buf[0] & 0x80 == 0 {
            probe = Some(buf);
            break;
        }
    }
    let probe = probe.expect("side 1 sent a short packet");
    let now = n.now;
    n.ends[0].handle_datagram(now, &probe);
    assert!(!n.ends[0].is_established());
    n.down_until = None;
    assert!(n.run_until(Duration::from_secs(60), |n| n.apps[1]
        .events
        .contains(&Event::PeerRestarted)));
    let h = n.open(0, 1011, pattern(10, 10_000), true);
    assert!(n.run_until(Duration::from_secs(30), |n| n.apps[1]
        .flows
        .get(&h)
        .is_some_and(|x| x.fin_received && x.meta == Some(support::meta(1011)))));
    assert_eq!(n.apps[1].flows[&h].received, pattern(10, 10_000));
}
