//! A HINT carries no authority: anyone on the path can forge a perfect one, and a
//! captured initiation can be replayed to a standby hub. Neither may change a terminal's
//! association with the hub that serves it.

mod support;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use pep_transport::packet::encode_hint;
use pep_transport::security::{HINTS_PER_SECOND, HINT_BURST};
use pep_transport::{DatagramEvent, Initiate};
use support::endpoints::{hub_addr, terminal_addr, Hubnet, Layout, HUB};
use support::{pattern, INIT, REPLY};

const MS: Duration = Duration::from_millis(1);

/// A GEO path and a hub with hints on; the terminal associated.
fn geo() -> (Hubnet, Layout) {
    let layout = Layout {
        delay: MS * 300,
        hints: true,
        ..Layout::default()
    };
    let mut n = Hubnet::new(&layout);
    assert!(n.run_until(Duration::from_secs(20), |n| n.established([HUB, 1])));
    (n, layout)
}

/// Initiations terminal 1 sent so far.
fn inits(n: &Hubnet) -> usize {
    n.nodes[1].sent.iter().filter(|(_, d)| d[0] == INIT).count()
}

/// An attacker forges a hint from every packet the terminal sends while it uploads 10 MB,
/// 1,000 a second for 10 s, from the hub's address: `forge` turns the hint it made into
/// what it sends. Returns the terminal's initiations during the attack, the hints it
/// received, and checks that the transfer was byte-exact with nothing reset or restarted.
fn attack(forge: impl Fn(&mut Vec<u8>, u64)) -> (usize, u64) {
    let (mut n, layout) = geo();
    let latest: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let seen = latest.clone();
    let delay = layout.delay;
    n.path = Some(Box::new(move |_, from, d| {
        if from == terminal_addr(1) && d[0] & 0x80 == 0 {
            *seen.borrow_mut() = Some(d.to_vec());
        }
        Some(delay)
    }));
    let t = n.nodes[1].only();
    let data = pattern(7, 10_000_000);
    let up = n.open(1, t, 3001, data.clone(), true);
    n.run_until(Duration::from_secs(1), |_| false);
    let before = inits(&n);
    let mut hints = 0u64;
    for i in 0..10_000u64 {
        n.advance(MS);
        let Some(packet) = latest.borrow().clone() else {
            continue;
        };
        let mut hint = Vec::new();
        assert!(encode_hint(&packet, 2, 16, &mut hint));
        forge(&mut hint, i);
        n.deliver(1, hub_addr(), &hint);
        hints += 1;
    }
    let during = inits(&n) - before;
    let h = n.hub_handle(1).unwrap();
    assert!(
        n.run_until(Duration::from_secs(60), |n| n
            .received(HUB, h, up)
            .is_some_and(|f| f.fin_received)),
        "the upload did not finish"
    );
    assert_eq!(n.received(HUB, h, up).unwrap().received, data);
    let (ts, hs) = (
        n.nodes[1].assocs[&t].0.stats(),
        n.nodes[HUB].assocs[&h].0.stats(),
    );
    assert_eq!((ts.peer_restarts, hs.peer_restarts), (0, 0));
    assert_eq!((ts.flows_reset, hs.flows_reset), (0, 0));
    assert_eq!(hs.associations_taken_over, 0);
    assert_eq!(n.nodes[1].assocs[&t].0.remote(), Some(hub_addr()));
    eprintln!(
        "{hints} hints: {:?}; {during} initiations, hub rekeys {}",
        ts.hints, hs.rekeys
    );
    assert_eq!(
        ts.hints.acted + ts.hints.rate_limited + ts.hints.unmatched,
        hints
    );
    if during > 0 {
        // The live hub answered each as a rekey: the association went on.
        assert!(hs.rekeys >= 1);
    }
    (during, ts.hints.acted)
}

#[test]
fn a_forged_hint_costs_one_rate_limited_rekey_and_nothing_else() {
    // On the path: perfect copies of each packet's flags, CID, number and tag tail.
    let (inits, acted) = attack(|_, _| {});
    assert!(acted >= 5, "the forgeries matched: {acted}");
    assert!(inits <= 11, "{inits} initiations in 10 s");
    // Off the path: the tag tail guessed.
    let (inits, acted) = attack(|h, i| {
        let n = h.len();
        let guess = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32;
        h[n - 4..].copy_from_slice(&guess.to_be_bytes());
    });
    assert_eq!((inits, acted), (0, 0));
}

/// Terminal 1 is associated with hub A. Its initiation, captured, is replayed from its
/// address to a standby S with the same key and peers (its own replay memory), which
/// answers it. S's reply reaches the terminal and is dropped: no initiation of the
/// terminal's matches. The terminal stays with A, and S, which only rekeys, sends nothing
/// more in 30 s.
#[test]
fn a_replayed_initiation_at_a_standby_leaves_the_active_association_alone() {
    let (mut n, layout) = geo();
    let init = n.nodes[1]
        .sent
        .iter()
        .find(|(_, d)| d[0] == INIT)
        .map(|(_, d)| d.clone())
        .unwrap();
    let mut standby = Hubnet::new(&layout).nodes.swap_remove(HUB);
    standby.epoch += 7;
    standby.cfg.initiate = Initiate::RekeyOnly;
    let now = n.now;
    let Some(DatagramEvent::Initiation {
        peer,
        handle: None,
        accepted,
    }) = standby.endpoint.handle(now, terminal_addr(1), &init)
    else {
        panic!("the standby answers an initiation it never saw");
    };
    let h = standby.associate(now, peer);
    let assoc = &mut standby.assocs.get_mut(&h).unwrap().0;
    assoc.accept_initiation(now, terminal_addr(1), accepted);
    let mut reply = Vec::new();
    assert_eq!(
        assoc.poll_transmit_to(now, &mut reply),
        Some(terminal_addr(1))
    );
    assert_eq!(reply[0], REPLY);
    let t = n.nodes[1].only();
    let before = n.nodes[1].assocs[&t].0.stats();
    n.deliver(1, hub_addr(), &reply);
    let after = n.nodes[1].assocs[&t].0.stats();
    assert_eq!(
        after.security.handshake_invalid,
        before.security.handshake_invalid + 1
    );
    assert_eq!(after.peer_restarts, 0);
    assert!(n.nodes[1].assocs[&t].0.is_established());
    assert_eq!(n.nodes[1].assocs[&t].0.remote(), Some(hub_addr()));
    // The standby, driven alone for 30 s, sends nothing.
    let assoc = &mut standby.assocs.get_mut(&h).unwrap().0;
    let mut sent = 0;
    let mut at = now;
    while at < now + Duration::from_secs(30) {
        at += MS * 10;
        assoc.handle_timeout(at);
        while assoc.poll_transmit_to(at, &mut reply).is_some() {
            sent += 1;
        }
    }
    assert_eq!(sent, 0);
    // And the terminal's flows with A go on.
    let flows = n.open_both_ways(&[1], 200_000);
    n.complete_both_ways(&flows, Duration::from_secs(60));
    assert_eq!(n.nodes[1].assocs[&t].0.stats().peer_restarts, 0);
}

/// A flood at a hub with hints on, during a transfer: junk short packets for connection
/// IDs known and unknown (22 to 1,400 bytes, from random sources), and hints. The hub sends
/// fewer bytes to the flood's sources than it received from them, no more hints than its
/// budget allows, and nothing at all in answer to a hint. The transfer is byte-exact.
#[test]
fn hints_and_unknown_ids_never_make_the_hub_send_more_than_it_receives() {
    let (mut n, _) = geo();
    let t = n.nodes[1].only();
    let data = pattern(3, 2_000_000);
    let up = n.open(1, t, 3001, data.clone(), true);
    let mut rng = 0x0123_4567_89ab_cdefu64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let hostile = |a: &std::net::SocketAddr| a.ip().to_string().starts_with("198.19.");
    let seconds = 10;
    let mut received = 0u64;
    let start = n.now;
    let sent_before = n.nodes[HUB].sent.len();
    for round in 0..seconds * 100 {
        n.advance(MS * 10);
        for i in 0..1000u64 {
            let r = next();
            let from = std::net::SocketAddr::from((
                [198, 19, (r >> 8) as u8, r as u8],
                1024 + (r >> 16) as u16 % 1000,
            ));
            let len = 22 + (next() % 1379) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            d[0] &= 0x7f;
            if i % 3 == 0 {
                // A hint, well formed, echoing anything.
                d.truncate(16);
                d[0] = 0x85;
                d[1..5].copy_from_slice(&pep_transport::PROTOCOL_VERSION.to_be_bytes());
                d[5] = 0x70;
            }
            received += d.len() as u64;
            n.deliver(HUB, from, &d);
        }
        if round == 0 {
            // Hints alone get nothing back.
            let before = n.nodes[HUB].sent.len();
            let mut hint = vec![0x85, 0, 0, 0, 2, 0x30, 0, 0, 1, 2, 3, 4, 5, 6];
            for k in 0..100u8 {
                hint[6] = k;
                n.deliver(HUB, "198.19.200.1:9".parse().unwrap(), &hint);
            }
            assert_eq!(n.nodes[HUB].sent.len(), before, "a hint was answered");
        }
    }
    let sent: u64 = n.nodes[HUB].sent[sent_before..]
        .iter()
        .filter(|(to, _)| hostile(to))
        .map(|(_, d)| d.len() as u64)
        .sum();
    let s = n.nodes[HUB].endpoint.stats();
    let elapsed = (n.now - start).as_secs_f64();
    eprintln!(
        "flood: {received} bytes in, {sent} bytes out, {} hints sent, {} rate limited over {elapsed:.1} s",
        s.hints_sent, s.hints_rate_limited
    );
    assert!(sent < received);
    let budget = HINTS_PER_SECOND as f64 * elapsed + f64::from(HINT_BURST);
    assert!((s.hints_sent as f64) <= budget, "{} hints", s.hints_sent);
    assert!(s.hints_sent > 0 && s.hints_rate_limited > 0);
    let h = n.hub_handle(1).unwrap();
    assert!(n.run_until(Duration::from_secs(60), |n| n
        .received(HUB, h, up)
        .is_some_and(|f| f.fin_received)));
    assert_eq!(n.received(HUB, h, up).unwrap().received, data);
}
