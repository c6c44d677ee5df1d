//! Roaming: the hub follows a terminal to a new address (a new tunnel address, or a new port
//! after a NAT rebinding) once a packet from there authenticates and is the newest yet;
//! forged, replayed or older packets from elsewhere move nothing. Without security the
//! address is the identity and nothing moves. An idle terminal sends at its keepalive
//! interval, which keeps its NAT mapping open. What went to the old address after the
//! terminal left is resent the moment the hub hears from the new one.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::{AssocHandle, Event, Stats};
use support::endpoints::{hub_addr, terminal_addr, Hubnet, Layout, HUB};
use support::pattern;

const MS: Duration = Duration::from_millis(1);
/// `Layout::default()`'s path: 100 ms each way.
const RTT: Duration = Duration::from_millis(200);
const BYTES: usize = 2_000_000;
/// When the terminal moves, counted from the transfer's start: well within it.
const MOVE_AFTER: Duration = Duration::from_millis(400);

/// Terminal 1's new tunnel address.
fn new_address() -> SocketAddr {
    SocketAddr::from(([198, 18, 2, 1], 7400))
}

/// Terminal 1's address after its NAT gave it another port.
fn new_port() -> SocketAddr {
    SocketAddr::from(([198, 18, 1, 1], 40123))
}

/// An address no gateway has: an attacker's.
fn third_address() -> SocketAddr {
    SocketAddr::from(([198, 18, 3, 3], 7400))
}

fn established(layout: &Layout) -> Hubnet {
    let mut n = Hubnet::new(layout);
    assert!(
        n.run_until(Duration::from_secs(20), |n| n.established([HUB, 1])),
        "no association"
    );
    n
}

fn hub_assoc(n: &Hubnet) -> AssocHandle {
    n.hub_handle(1).expect("the hub's association")
}

fn hub_stats(n: &Hubnet) -> Stats {
    n.nodes[HUB].assocs[&hub_assoc(n)].0.stats()
}

fn hub_remote(n: &Hubnet) -> Option<SocketAddr> {
    n.nodes[HUB].assocs[&hub_assoc(n)].0.remote()
}

/// The moves the hub's association reported.
fn moves(n: &Hubnet) -> Vec<(SocketAddr, SocketAddr)> {
    n.app(HUB, hub_assoc(n))
        .events
        .iter()
        .filter_map(|e| match e {
            Event::RemoteMoved { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

/// Short packets terminal 1 sent to the hub, oldest first.
fn short_packets(n: &Hubnet) -> Vec<Vec<u8>> {
    n.nodes[1]
        .sent
        .iter()
        .filter(|(to, d)| *to == hub_addr() && d[0] & 0x80 == 0)
        .map(|(_, d)| d.clone())
        .collect()
}

/// A flow each way between terminal 1 and the hub, with terminal 1 moved to `to`
/// [`MOVE_AFTER`] into it; how long the transfer took, and when the hub followed.
fn transfer(move_to: Option<SocketAddr>) -> (Duration, Option<Duration>, Hubnet) {
    let mut n = established(&Layout::default());
    let start = n.now;
    let flows = n.open_both_ways(&[1], BYTES);
    let mut followed = None;
    if let Some(to) = move_to {
        n.run_until(MOVE_AFTER, |_| false);
        let moved_at = n.now;
        n.nodes[1].addr = to;
        assert!(n.run_until(RTT, |n| hub_remote(n) == Some(to)));
        followed = Some(n.now - moved_at);
    }
    n.complete_both_ways(&flows, Duration::from_secs(60));
    (n.now - start, followed, n)
}

#[test]
fn authenticated_packet_from_new_address_moves_the_remote_and_flows_stay_byte_exact() {
    let (baseline, _, n) = transfer(None);
    assert_eq!(hub_stats(&n).remote_moves, 0);
    assert_eq!(
        n.nodes[HUB].assocs[&hub_assoc(&n)]
            .0
            .times()
            .remote_moved_at,
        None
    );
    for to in [new_address(), new_port()] {
        let (took, followed, n) = transfer(Some(to));
        let extra = took.saturating_sub(baseline);
        let followed = followed.expect("moved");
        println!(
            "to {to}: transfer {took:?} against {baseline:?} unmoved, {extra:?} extra \
             ({:.2} RTT); the hub followed {followed:?} after the move",
            extra.as_secs_f64() / RTT.as_secs_f64()
        );
        // The first packet from there moves it: one one-way delay after the terminal's
        // next send (it sends a data packet every 0.6 ms at 20 Mbit/s).
        assert!(followed <= RTT / 2 + MS, "{followed:?}");
        assert!(extra <= 2 * RTT, "{extra:?} extra");
        assert_eq!(hub_remote(&n), Some(to));
        assert_eq!(moves(&n), [(terminal_addr(1), to)]);
        let stats = hub_stats(&n);
        assert_eq!(stats.remote_moves, 1);
        assert_eq!(stats.security.unauthenticated, 0);
        let moved_at = n.nodes[HUB].assocs[&hub_assoc(&n)]
            .0
            .times()
            .remote_moved_at;
        assert!(moved_at.is_some_and(|t| t <= n.now), "{moved_at:?}");
        // The terminal's side of the path did not move.
        let t = n.nodes[1].only();
        assert_eq!(n.nodes[1].assocs[&t].0.remote(), Some(hub_addr()));
        assert_eq!(n.nodes[1].assocs[&t].0.stats().remote_moves, 0);
    }
}

#[test]
fn forged_packets_with_a_valid_cid_from_a_third_address_move_nothing() {
    let mut n = established(&Layout::default());
    let flows = n.open_both_ways(&[1], BYTES);
    n.run_until(MOVE_AFTER, |_| false);
    let genuine = short_packets(&n).pop().expect("a short packet");
    let before = hub_stats(&n);
    const FORGED: u64 = 32;
    for seed in 0..FORGED {
        // A short header's first byte, the hub's connection ID, then anything.
        let mut forged = pattern(seed, 60 + seed as usize * 37);
        forged[0] &= 0x7f;
        forged[1..3].copy_from_slice(&genuine[1..3]);
        n.deliver(HUB, third_address(), &forged);
    }
    let after = hub_stats(&n);
    // Each is dropped for what it looks like: a header that does not parse, a packet
    // number the replay window has seen (or left behind), or a tag that does not verify.
    let dropped = (after.security.unauthenticated - before.security.unauthenticated)
        + (after.security.replayed - before.security.replayed)
        + (after.malformed_dropped - before.malformed_dropped);
    assert_eq!(dropped, FORGED);
    assert_eq!(after.packets_received, before.packets_received);
    assert_eq!(after.remote_moves, 0);
    assert_eq!(
        n.nodes[HUB].assocs[&hub_assoc(&n)]
            .0
            .times()
            .remote_moved_at,
        None
    );
    assert_eq!(hub_remote(&n), Some(terminal_addr(1)));
    n.complete_both_ways(&flows, Duration::from_secs(60));
    assert_eq!(hub_remote(&n), Some(terminal_addr(1)));
    assert_eq!(moves(&n), []);
    assert!(n.nodes[HUB]
        .sent
        .iter()
        .all(|(to, _)| *to == terminal_addr(1)));
}

#[test]
fn replayed_or_older_packets_from_a_new_address_move_nothing() {
    let mut n = established(&Layout::default());
    let flows = n.open_both_ways(&[1], BYTES);
    n.run_until(MOVE_AFTER, |_| false);
    // Delivered long ago: the replay window refuses a copy.
    let delivered = short_packets(&n)[0].clone();
    let before = hub_stats(&n);
    n.deliver(HUB, third_address(), &delivered);
    let after = hub_stats(&n);
    assert_eq!(after.security.replayed, before.security.replayed + 1);
    assert_eq!(after.packets_received, before.packets_received);
    assert_eq!(hub_remote(&n), Some(terminal_addr(1)));

    // Two still on their way: the newer arrives first from the terminal, then a copy of the
    // older from elsewhere. That copy authenticates (its number is unused) and its frames
    // count, but it is not the newest: nothing moves.
    let sent = short_packets(&n);
    let (older, newer) = (sent[sent.len() - 2].clone(), sent[sent.len() - 1].clone());
    n.deliver(HUB, terminal_addr(1), &newer);
    n.deliver(HUB, third_address(), &older);
    let after_older = hub_stats(&n);
    assert_eq!(after_older.packets_received, after.packets_received + 2);
    assert_eq!(after_older.remote_moves, 0);
    assert_eq!(hub_remote(&n), Some(terminal_addr(1)));

    // The limit WireGuard accepts too: a fresh packet relayed from elsewhere before the
    // original arrives moves the hub there, and the terminal's next packet moves it back.
    n.run_until(MS * 5, |_| false);
    let fresh = short_packets(&n).pop().expect("a short packet");
    n.deliver(HUB, third_address(), &fresh);
    assert_eq!(hub_remote(&n), Some(third_address()));
    assert!(n.run_until(RTT, |n| hub_remote(n) == Some(terminal_addr(1))));
    assert_eq!(
        moves(&n),
        [
            (terminal_addr(1), third_address()),
            (third_address(), terminal_addr(1))
        ]
    );
    n.complete_both_ways(&flows, Duration::from_secs(60));
    assert_eq!(hub_stats(&n).remote_moves, 2);
}

#[test]
fn without_security_the_address_is_the_identity_and_nothing_moves() {
    let mut n = established(&Layout {
        secure: false,
        ..Layout::default()
    });
    let flows = n.open_both_ways(&[1], BYTES);
    n.run_until(MOVE_AFTER, |_| false);
    // Still on its way: new to the hub, and plaintext from another address.
    let fresh = short_packets(&n).pop().expect("a short packet");
    let before = hub_stats(&n);
    n.deliver(HUB, new_address(), &fresh);
    let after = hub_stats(&n);
    assert_eq!(after.packets_received, before.packets_received + 1);
    assert_eq!(after.remote_moves, 0);
    assert_eq!(hub_remote(&n), Some(terminal_addr(1)));
    n.complete_both_ways(&flows, Duration::from_secs(60));
    assert_eq!(moves(&n), []);
}

/// The terminal's keepalive (2 s; the hub's 60 s, so its pings draw no acknowledgement
/// from the terminal in between) is exactly the gap between what an idle terminal sends:
/// its NAT mapping sees a packet every interval.
#[test]
fn idle_terminal_sends_at_its_keepalive_interval() {
    const KEEPALIVE: Duration = Duration::from_secs(2);
    let mut n = established(&Layout {
        terminal_keepalive: KEEPALIVE,
        hub_keepalive: Duration::from_secs(60),
        ..Layout::default()
    });
    // Let the handshake's last acknowledgements settle.
    n.run_until(Duration::from_secs(3), |_| false);
    let mut sent_at: Vec<Instant> = Vec::new();
    let mut seen = n.nodes[1].sent.len();
    let end = n.now + Duration::from_secs(20);
    while n.now < end && n.step() {
        let now = n.nodes[1].sent.len();
        if now > seen {
            sent_at.push(n.now);
            seen = now;
        }
    }
    let gaps: Vec<Duration> = sent_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 8, "{gaps:?}");
    assert!(gaps.iter().all(|&g| g == KEEPALIVE), "{gaps:?}");
}

/// A move that takes the terminal out of reach for a while (a new address that takes
/// time to come up): what the hub sent from one one-way delay before the move on, the
/// silence included, reached the old address after the terminal had left. The hub takes all
/// of it as lost the moment it hears from the new address, not a round trip later when the
/// terminal's ACKs show the holes, and not as congestion.
#[test]
fn a_move_after_a_silence_resends_all_that_went_to_the_old_address_at_once() {
    const SILENCE: Duration = Duration::from_millis(300);
    let (baseline, _, _) = transfer(None);
    let mut n = established(&Layout::default());
    let start = n.now;
    let flows = n.open_both_ways(&[1], BYTES);
    n.run_until(MOVE_AFTER - RTT / 2, |_| false);
    let arrives_after_the_move = n.nodes[HUB].sent.len();
    n.run_until(RTT / 2, |_| false);
    let moved_at = n.now;
    let heard_again = moved_at - n.base + SILENCE;
    n.nodes[1].addr = new_address();
    n.cut = Some(Box::new(move |since_start, from, _, _| {
        from == new_address() && since_start < heard_again
    }));
    assert_eq!(hub_stats(&n).lost.outage, 0);
    assert!(n.run_until(SILENCE + RTT, |n| hub_remote(n) == Some(new_address())));
    let followed = n.now - moved_at;
    let dropped = n.nodes[HUB].sent[arrives_after_the_move..]
        .iter()
        .filter(|(to, _)| *to == terminal_addr(1))
        .count();
    let lost = hub_stats(&n).lost;
    n.complete_both_ways(&flows, Duration::from_secs(60));
    let extra = (n.now - start).saturating_sub(baseline);
    println!(
        "followed {followed:?} after the move; {dropped} datagrams went to the old address \
         after it, {} taken as lost at once; {extra:?} ({:.2} RTT) beyond {baseline:?}",
        lost.outage,
        extra.as_secs_f64() / RTT.as_secs_f64()
    );
    // The terminal's first packet from there moves it (one comes every 0.6 ms).
    assert!(followed <= SILENCE + RTT / 2 + MS, "{followed:?}");
    assert!(lost.outage >= dropped as u64, "{lost:?} of {dropped}");
    assert_eq!(lost.congestion, 0);
    // The silence, and a round trip to repair what it lost: the resends leave at once.
    assert!(extra <= SILENCE + RTT + RTT / 8, "{extra:?} extra");
}
