//! Endpoints in front of associations: routing by connection ID, the responder half of the
//! handshake (replays, unknown keys, the clear source connection ID), and many terminals on
//! one hub endpoint carrying flows both ways.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::codec::Reader;
use pep_transport::frame::Frame;
use pep_transport::packet::{decode_header_with_cid, encode_hint, Header};
use pep_transport::security::{public_key, stamp_initiation_macs, HintCounts};
use pep_transport::{
    AssocHandle, Association, DatagramEvent, Endpoint, EndpointStats, Event, Initiate, LostReason,
    PeerId, PeerIdentity, ResetReason, Role,
};
use support::endpoints::{
    hub_addr, hub_endpoint, terminal_addr, terminal_key, Hubnet, Layout, Node, HUB,
};
use support::{
    establish_within_20s, geo_secure, pattern, security_pair, test_config, Faults, Net, INIT, REPLY,
};

const MS: Duration = Duration::from_millis(1);

fn established(n: &mut Hubnet, nodes: &[usize]) {
    let nodes = nodes.to_vec();
    assert!(
        n.run_until(Duration::from_secs(20), |n| n
            .established(nodes.iter().copied())),
        "no association"
    );
}

/// A copy of an initiation `node` answered reaches association `h` and is answered again,
/// to where it came from: the reply it sends.
fn answer_to_copy(
    node: &mut Node,
    h: AssocHandle,
    now: Instant,
    from: SocketAddr,
    init: &[u8],
) -> Vec<u8> {
    let Some(DatagramEvent::Routed(r)) = node.endpoint.handle(now, from, init) else {
        panic!("a copy of an answered initiation goes to its association");
    };
    assert_eq!(r, h);
    let assoc = &mut node.assocs.get_mut(&h).unwrap().0;
    assoc.handle_datagram_from(now, from, init);
    let mut reply = Vec::new();
    assert_eq!(assoc.poll_transmit_to(now, &mut reply), Some(from));
    reply
}

fn hub_public_key(n: &Hubnet) -> [u8; 32] {
    public_key(&n.nodes[HUB].key.expect("a secure hub"))
}

/// The first INIT terminal `i` sent.
fn first_init(n: &Hubnet, i: usize) -> Vec<u8> {
    n.nodes[i]
        .sent
        .iter()
        .find(|(_, d)| d[0] == INIT)
        .map(|(_, d)| d.clone())
        .expect("an initiation")
}

/// A flow each way between terminal `i` and the hub, both byte-exact.
fn flows_both_ways(n: &mut Hubnet, terminals: &[usize], bytes: usize) {
    let flows = n.open_both_ways(terminals, bytes);
    n.complete_both_ways(&flows, Duration::from_secs(60));
}

#[test]
fn endpoint_pair_associates_and_carries_flows_byte_exact() {
    for hub_cid_len in [0u8, 2] {
        let mut n = Hubnet::new(&Layout {
            hub_cid_len,
            ..Layout::default()
        });
        established(&mut n, &[HUB, 1]);
        flows_both_ways(&mut n, &[1], 1_000_000);
        let h = n.hub_handle(1).unwrap();
        let cid = n.nodes[HUB].assocs[&h].0.local_cid();
        assert_eq!(cid.len(), usize::from(hub_cid_len));
        // Every short packet to the hub names the hub's association.
        let mut short = 0;
        for (to, d) in &n.nodes[1].sent {
            assert_eq!(*to, hub_addr());
            let Ok(Header::Short(s)) =
                decode_header_with_cid(&mut Reader::new(d), usize::from(hub_cid_len))
            else {
                continue;
            };
            assert_eq!(s.dcid, cid);
            short += 1;
        }
        assert!(short > 500, "{short}");
        // The terminal's endpoint chose no connection ID: nothing to carry.
        assert!(n.nodes[1].assocs[&n.nodes[1].only()]
            .0
            .local_cid()
            .is_empty());
        for node in [HUB, 1] {
            assert_eq!(n.nodes[node].endpoint.stats(), EndpointStats::default());
            assert_eq!(
                n.nodes[node]
                    .sent
                    .iter()
                    .filter(|(_, d)| d[0] == INIT)
                    .count(),
                if node == HUB { 0 } else { 1 }
            );
        }
        assert!(n.nodes[HUB]
            .sent
            .iter()
            .all(|(to, _)| *to == terminal_addr(1)));
    }
}

#[test]
fn unknown_cid_is_dropped_and_counted() {
    let mut n = Hubnet::new(&Layout::default());
    established(&mut n, &[HUB, 1]);
    flows_both_ways(&mut n, &[1], 10_000);
    let h = n.hub_handle(1).unwrap();
    let (_, genuine) = n.nodes[1]
        .sent
        .iter()
        .rev()
        .find(|(_, d)| d[0] & 0x80 == 0)
        .cloned()
        .unwrap();
    let before = n.nodes[HUB].assocs[&h].0.stats();
    let now = n.now;
    let mut stray = genuine.clone();
    stray[1..3].copy_from_slice(&[0x12, 0x34]);
    let hub = &mut n.nodes[HUB].endpoint;
    assert!(hub.handle(now, terminal_addr(1), &stray).is_none());
    // Too short to hold a connection ID at all.
    assert!(hub.handle(now, terminal_addr(1), &[0x20, 0x00]).is_none());
    assert!(matches!(
        hub.handle(now, terminal_addr(1), &genuine),
        Some(DatagramEvent::Routed(r)) if r == h
    ));
    assert_eq!(
        hub.stats(),
        EndpointStats {
            unknown_cid: 1,
            malformed: 1,
            ..EndpointStats::default()
        }
    );
    assert_eq!(
        n.nodes[HUB].assocs[&h].0.stats().packets_received,
        before.packets_received
    );
}

#[test]
fn init_scid_must_match_hello_cid() {
    let mut n = Hubnet::new(&Layout::default());
    // The INIT leaves at once: one step sends it, before it arrives anywhere.
    assert!(n.step());
    let genuine = first_init(&n, 1);
    // The terminal chose no connection ID: scid_len 0 in clear, and an empty one in its HELLO.
    assert_eq!(genuine[5], 0);
    let mut forged = genuine.clone();
    forged[5] = 2;
    forged.splice(6..6, [0xab, 0xcd]);
    // Anyone who knows the hub's public key can make mac1 fit again: the HELLO inside is
    // what refuses it.
    stamp_initiation_macs(&mut forged, &hub_public_key(&n), None);
    let now = n.now;
    let hub = &mut n.nodes[HUB].endpoint;
    assert!(hub.handle(now, terminal_addr(1), &forged).is_none());
    let mut want = EndpointStats::default();
    want.security.handshake_invalid = 1;
    assert_eq!(hub.stats(), want);
    assert_eq!(hub.association_of(PeerId(1)), None);
}

/// A forgery that copies a genuine INIT's ephemeral key and reaches the hub first (any
/// sender who knows the hub's public key can fit mac1) must not shut the genuine INIT out:
/// the ephemeral key is remembered only once an INIT authenticates.
#[test]
fn a_forged_copy_arriving_first_does_not_shut_the_genuine_initiation_out() {
    let mut n = Hubnet::new(&Layout::default());
    assert!(n.step());
    let genuine = first_init(&n, 1);
    assert_eq!(
        genuine[5], 0,
        "no source connection ID: the Noise message starts at 6"
    );
    // Byte 6 + 32 is the first of the encrypted static key, right after the ephemeral.
    let mut tampered = genuine.clone();
    tampered[6 + 32] ^= 0x01;
    stamp_initiation_macs(&mut tampered, &hub_public_key(&n), None);
    // The clear source connection ID is outside the Noise message: this one reads, but
    // its HELLO names another connection ID.
    let mut other_scid = genuine.clone();
    other_scid[5] = 2;
    other_scid.splice(6..6, [0xab, 0xcd]);
    stamp_initiation_macs(&mut other_scid, &hub_public_key(&n), None);
    let now = n.now;
    let hub = &mut n.nodes[HUB].endpoint;
    for forged in [&tampered, &other_scid, &tampered] {
        assert!(hub.handle(now, terminal_addr(1), forged).is_none());
    }
    let mut want = EndpointStats::default();
    want.security.handshake_invalid = 3;
    assert_eq!(hub.stats(), want);
    let Some(DatagramEvent::Initiation { peer, .. }) = hub.handle(now, terminal_addr(1), &genuine)
    else {
        panic!("the genuine initiation is answered");
    };
    assert_eq!(peer, PeerId(1));
    // Once it authenticated, its copies are what the replay memory refuses.
    assert!(hub.handle(now, terminal_addr(1), &tampered).is_none());
    want.security.handshake_replayed = 1;
    assert_eq!(hub.stats(), want);
}

#[test]
fn version_1_initiation_is_refused_and_counted() {
    let mut n = Hubnet::new(&Layout::default());
    assert!(n.step());
    let mut v1 = first_init(&n, 1);
    v1[1..5].copy_from_slice(&1u32.to_be_bytes());
    let now = n.now;
    let hub = &mut n.nodes[HUB].endpoint;
    assert!(hub.handle(now, terminal_addr(1), &v1).is_none());
    let mut want = EndpointStats::default();
    want.security.handshake_invalid = 1;
    assert_eq!(hub.stats(), want);

    // A standalone association refuses it alike, without a word back.
    let mut pair = geo_secure(Default::default(), 3, Duration::from_secs(120));
    pair.record_a = Some(Vec::new());
    pair.run_until(MS * 10, |_| false);
    let mut v1 = pair.record_a.as_ref().unwrap()[0].clone();
    assert_eq!(v1[0], INIT);
    v1[1..5].copy_from_slice(&1u32.to_be_bytes());
    let mut fresh = geo_secure(Default::default(), 4, Duration::from_secs(120));
    fresh.record_b = Some(Vec::new());
    let before = fresh.ends[1].stats().security.handshake_invalid;
    let now = fresh.now;
    fresh.ends[1].handle_datagram(now, &v1);
    assert_eq!(fresh.ends[1].stats().security.handshake_invalid, before + 1);
    let mut out = Vec::new();
    while fresh.ends[1].poll_transmit(now, &mut out) {
        assert_ne!(out[0] & 0x7f, 0x03, "no REPLY to a v1 initiation");
    }
}

#[test]
fn three_terminals_associate_with_one_hub_endpoint() {
    let mut n = Hubnet::new(&Layout {
        terminals: 3,
        ..Layout::default()
    });
    established(&mut n, &[1, 2, 3]);
    assert!(n.run_until(Duration::from_secs(5), |n| n.established([HUB])));
    assert_eq!(n.nodes[HUB].assocs.len(), 3);
    flows_both_ways(&mut n, &[1, 2, 3], 300_000);
    let cids: std::collections::HashSet<_> = (1..=3)
        .map(|i| n.nodes[HUB].assocs[&n.hub_handle(i).unwrap()].0.local_cid())
        .collect();
    assert_eq!(cids.len(), 3);
    for (a, _) in n.nodes[HUB].assocs.values() {
        assert_eq!(a.local_cid().len(), 2);
        let peer = a.peer().unwrap();
        assert_eq!(a.remote(), Some(terminal_addr(peer.0 as usize)));
    }
    assert_eq!(n.nodes[HUB].endpoint.stats(), EndpointStats::default());
}

#[test]
fn unknown_key_gets_no_association_and_no_reply() {
    let mut n = Hubnet::new(&Layout {
        strangers: 1,
        ..Layout::default()
    });
    let stranger = terminal_addr(2);
    // Its INIT is sent three times, a second apart, before a fresh one would replace it.
    n.run_until(MS * 2500, |_| false);
    assert!(n.established([HUB, 1]));
    let s = n.nodes[HUB].endpoint.stats();
    assert_eq!(s.security.handshake_unknown_peer, 1);
    // The copies cost no Diffie-Hellman: the replay memory refuses them.
    assert_eq!(s.security.handshake_replayed, 2);
    assert_eq!(n.nodes[HUB].assocs.len(), 1);
    assert_eq!(
        n.nodes[HUB]
            .sent
            .iter()
            .filter(|(to, _)| *to == stranger)
            .count(),
        0
    );
    assert!(!n.nodes[2].established());
}

#[test]
fn repeated_init_gets_the_same_reply() {
    let mut n = Hubnet::new(&Layout::default());
    assert!(n.step());
    let init = first_init(&n, 1);
    let now = n.now;
    let from = terminal_addr(1);
    let hub = &mut n.nodes[HUB];
    let Some(DatagramEvent::Initiation {
        peer,
        handle: None,
        accepted,
    }) = hub.endpoint.handle(now, from, &init)
    else {
        panic!("an initiation from a known key");
    };
    assert_eq!(peer, PeerId(1));
    let h = hub.associate(now, peer);
    let assoc = &mut hub.assocs.get_mut(&h).unwrap().0;
    assoc.accept_initiation(now, from, accepted);
    let mut first = Vec::new();
    assert_eq!(assoc.poll_transmit_to(now, &mut first), Some(from));
    let mut replies = Vec::new();
    for _ in 0..2 {
        replies.push(answer_to_copy(hub, h, now, from, &init));
    }
    assert_eq!(replies, vec![first.clone(), first]);
    assert_eq!(hub.endpoint.stats(), EndpointStats::default());
    assert_eq!(hub.assocs[&h].0.stats().security, Default::default());
}

/// A hub whose key is greater than its terminals' loses its first replies (2.5 s): each
/// terminal sends its initiation three times, then a fresh one, which reaches the hub a
/// little after the hub stopped waiting for its first reply's confirmation (3 x
/// `hello_interval`) and started an initiation of its own. The hub knows no address for a
/// terminal before the terminal proves one, so that initiation never leaves and cannot
/// cross the terminal's: the hub answers the fresh initiation, and every terminal
/// associates.
#[test]
fn a_hub_that_leads_answers_a_fresh_initiation_after_its_replies_were_lost() {
    let layout = Layout {
        terminals: 4,
        ..Layout::default()
    };
    let mut n = Hubnet::new(&layout);
    let led = led_by_the_hub(&n, &layout);
    assert!(!led.is_empty(), "the hub leads no terminal");
    let delay = layout.delay;
    n.path = Some(Box::new(move |sent, from, d| {
        let from_hub = from == hub_addr();
        if from_hub && d[0] == REPLY && sent < 2500 * MS {
            return None;
        }
        // The terminals' timers fire a little late, as a busy host's do.
        if !from_hub && d[0] == INIT && sent > 2500 * MS {
            return Some(delay + MS);
        }
        Some(delay)
    }));
    assert!(
        n.run_until(Duration::from_secs(20), |n| n
            .established(0..=layout.terminals)),
        "terminals {led:?} are led by the hub; established: {:?}",
        (0..=layout.terminals)
            .map(|i| n.nodes[i].established())
            .collect::<Vec<_>>()
    );
}

/// A terminal the hub leads goes silent long enough for the hub to start initiations of its
/// own, to the address it last knew, then restarts behind NAT on a new port. The hub's
/// initiations cannot reach it there, so they must not win over the terminal's fresh
/// initiations from the new address.
#[test]
fn a_hub_that_leads_answers_a_terminal_that_came_back_from_a_new_address() {
    let layout = Layout {
        terminals: 4,
        ..Layout::default()
    };
    let mut n = Hubnet::new(&layout);
    let led = *led_by_the_hub(&n, &layout)
        .first()
        .expect("the hub leads a terminal");
    established(&mut n, &(0..=layout.terminals).collect::<Vec<_>>());
    let old = terminal_addr(led);
    // Silence: the terminal's node moves to an address whose datagrams the path loses, and
    // nobody is at the old one.
    let away: std::net::SocketAddr = "198.18.200.1:9".parse().unwrap();
    let delay = layout.delay;
    n.path = Some(Box::new(move |_, from, _| (from != away).then_some(delay)));
    n.nodes[led].addr = away;
    let silent_for = Duration::from_secs(60);
    let hub_initiated_before = count_sent(&n, HUB, INIT, old);
    n.run_until(silent_for, |_| false);
    let hub_initiations = count_sent(&n, HUB, INIT, old) - hub_initiated_before;
    assert!(
        hub_initiations > 0,
        "the hub never initiated to the silent terminal's old address"
    );
    let new_addr: std::net::SocketAddr = "198.18.201.7:40001".parse().unwrap();
    n.restart_terminal(&layout, led, new_addr);
    assert!(
        n.run_until(Duration::from_secs(20), |n| n
            .established(0..=layout.terminals)),
        "terminal {led} restarted at {new_addr}; established: {:?}",
        (0..=layout.terminals)
            .map(|i| n.nodes[i].established())
            .collect::<Vec<_>>()
    );
    // The hub answered: no initiation of the terminal's was lost to a collision.
    let collisions: u64 = n.nodes[HUB]
        .assocs
        .values()
        .map(|(a, _)| a.stats().security.handshake_collision)
        .sum();
    assert_eq!(collisions, 0);
}

/// The terminals whose initiations lose to the hub's (the hub's public key is the greater).
fn led_by_the_hub(n: &Hubnet, layout: &Layout) -> Vec<usize> {
    let hub = hub_public_key(n);
    (1..=layout.terminals)
        .filter(|&i| public_key(&terminal_key(i)) < hub)
        .collect()
}

/// Datagrams of `kind` (the first byte) that node `node` sent to `to`.
fn count_sent(n: &Hubnet, node: usize, kind: u8, to: std::net::SocketAddr) -> usize {
    n.nodes[node]
        .sent
        .iter()
        .filter(|(dst, d)| *dst == to && d.first() == Some(&kind))
        .count()
}

/// A hub's workers, an endpoint each, share one replay memory. Worker 1 reads and
/// authenticates an initiation of a peer worker 0 owns, and hands it over: a replay of it
/// to worker 2's socket is refused before any Diffie-Hellman, and a copy reaching the
/// owner goes to the association, which answers it with the same reply.
#[test]
fn a_replay_to_another_worker_s_endpoint_is_refused() {
    let layout = Layout::default();
    let mut n = Hubnet::new(&layout);
    assert!(n.step());
    let init = first_init(&n, 1);
    let now = n.now;
    let from = terminal_addr(1);
    let owner = &mut n.nodes[HUB];
    let mut workers: Vec<Endpoint> = [[0x5b; 32], [0x5c; 32]]
        .into_iter()
        .map(|seed| hub_endpoint(&layout, seed))
        .collect();
    for w in &mut workers {
        w.use_initiation_memory(owner.endpoint.initiations());
    }
    let Some(DatagramEvent::Initiation {
        peer,
        handle: None,
        accepted,
    }) = workers[0].handle(now, from, &init)
    else {
        panic!("an initiation from a known key");
    };
    owner.endpoint.adopt_initiation(peer, &accepted);
    let h = owner.associate(now, peer);
    let assoc = &mut owner.assocs.get_mut(&h).unwrap().0;
    assoc.accept_initiation(now, from, accepted);
    let mut first = Vec::new();
    assert_eq!(assoc.poll_transmit_to(now, &mut first), Some(from));

    let elsewhere: std::net::SocketAddr = "198.18.9.9:40000".parse().unwrap();
    assert!(workers[1].handle(now, elsewhere, &init).is_none());
    let mut want = EndpointStats::default();
    want.security.handshake_replayed = 1;
    assert_eq!(workers[1].stats(), want);

    assert_eq!(answer_to_copy(owner, h, now, from, &init), first);
    assert_eq!(owner.endpoint.stats(), EndpointStats::default());
}

/// Like `steady_state_data_packets_carry_at_most_8_bytes_of_overhead` (association.rs),
/// into a hub that chose 2-byte connection IDs.
#[test]
fn steady_state_data_with_2_byte_cid_at_most_10_bytes() {
    for rate in [1_544_000u64, 100_000_000] {
        let mut n = Hubnet::new(&Layout {
            secure: false,
            delay: MS * 250,
            rate_bps: rate,
            ..Layout::default()
        });
        established(&mut n, &[HUB, 1]);
        let t = n.nodes[1].only();
        n.open(1, t, 1010, pattern(11, 30_000_000), true);
        n.run_until(Duration::from_secs(2), |_| false);
        let from = n.nodes[1].sent.len();
        n.run_until(Duration::from_secs(1), |_| false);
        let mut checked = 0;
        let mut worst = 0;
        let mut by_overhead = std::collections::BTreeMap::<usize, usize>::new();
        for (_, d) in &n.nodes[1].sent[from..] {
            let mut r = Reader::new(d);
            let Ok(Header::Short(h)) = decode_header_with_cid(&mut r, 2) else {
                continue;
            };
            assert_eq!(h.dcid.len(), 2);
            if let Some(imp) = h.implicit_data {
                let data = match Frame::decode_implicit_data(&mut r, imp.fin, imp.offset_len) {
                    Ok(Frame::Data { data, .. }) => data,
                    other => panic!("{other:?}"),
                };
                let overhead = d.len() - data.len();
                assert!(overhead <= 10, "{overhead} bytes of overhead");
                worst = worst.max(overhead);
                *by_overhead.entry(overhead).or_default() += 1;
                checked += 1;
            }
        }
        assert!(checked > 50, "only {checked} data packets seen at {rate}");
        println!("{rate} b/s: {checked} data packets, worst overhead {worst} bytes, by overhead {by_overhead:?}");
    }
}

/// A hub that restarts has lost every key and cannot reach terminals behind NAT itself: the
/// terminal's unanswered keepalive starts an outage, and in an outage it initiates, instead
/// of waiting out `outage_limit` (120 s) first.
#[test]
fn terminal_reassociates_soon_after_a_hub_restart() {
    let layout = Layout::default();
    let mut n = Hubnet::new(&layout);
    established(&mut n, &[HUB, 1]);
    n.run_until(Duration::from_secs(2), |_| false);
    let mut restarted = Hubnet::new(&layout).nodes.swap_remove(HUB);
    restarted.epoch += 1;
    n.nodes[HUB] = restarted;
    let restart = n.now;
    let t = n.nodes[1].only();
    assert!(n.run_until(Duration::from_secs(10), |n| {
        n.established([HUB, 1]) && n.nodes[1].assocs[&t].0.stats().peer_restarts == 1
    }));
    let took = n.now - restart;
    eprintln!("re-associated {took:?} after the hub restart");
    assert_eq!(n.nodes[1].assocs[&t].0.stats().outages, 1);
    // 1.05 s here: the terminal's last packets went unacknowledged, two probe timeouts
    // made it an outage, and the INIT took one round trip.
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// The hub's endpoint learns a terminal and forgets another while running: the new one
/// associates and carries flows at once; the removed one's connection ID names nothing and
/// its fresh initiations are an unknown peer's; terminal 1's flows opened before go on to
/// the last byte.
#[test]
fn a_peer_added_and_a_peer_removed_while_the_hub_runs() {
    let mut n = Hubnet::new(&Layout {
        terminals: 2,
        strangers: 1,
        ..Layout::default()
    });
    n.run_until(MS * 2500, |_| false);
    assert!(n.established([HUB, 1, 2]));
    assert!(!n.nodes[3].established(), "terminal 3 is not a peer yet");
    assert_eq!(
        n.nodes[HUB]
            .endpoint
            .stats()
            .security
            .handshake_unknown_peer,
        1
    );
    let ongoing = n.open_both_ways(&[1], 2_000_000);

    let key = public_key(&terminal_key(3));
    let identity = PeerIdentity {
        public_key: Some(key),
        address: None,
    };
    n.nodes[HUB].endpoint.add_peer(PeerId(3), identity).unwrap();
    n.nodes[HUB].peer_keys.insert(PeerId(3), key);
    established(&mut n, &[HUB, 3]);
    flows_both_ways(&mut n, &[3], 300_000);

    let removed = n.nodes[HUB].endpoint.remove_peer(PeerId(2)).unwrap();
    let gone = removed.association.expect("terminal 2's association");
    n.nodes[HUB].assocs.remove(&gone);
    assert_eq!(n.hub_handle(2), None);
    n.complete_both_ways(&ongoing, Duration::from_secs(60));
    // Terminal 2 gives up on its silent association and initiates again, in vain.
    assert!(
        n.run_until(Duration::from_secs(120), |n| n.nodes[HUB]
            .endpoint
            .stats()
            .security
            .handshake_unknown_peer
            > 1),
        "terminal 2 never initiated again: {:?}",
        n.nodes[HUB].endpoint.stats()
    );
    let s = n.nodes[HUB].endpoint.stats();
    assert!(s.unknown_cid > 0, "{s:?}");
    assert_eq!(n.nodes[HUB].assocs.len(), 2);
    assert!(n.hub_handle(2).is_none());
    assert!(n.established([1, 3]));
}

/// Terminal 1 was on hub A, moved to a standby B with the same key (A's address taken
/// over), and comes back to A while A, cut off rather than dead, still holds the old
/// association. The terminal's initiation echoes B's epoch, not A's: A answers it as a new
/// association, keeps the old one (and its flows) until the terminal's first packet under
/// the new keys confirms it, and then the terminal's flows are byte-exact. A copy of the
/// initiation before that changes nothing.
#[test]
fn an_initiation_echoing_another_epoch_is_a_new_association_at_confirmation() {
    let layout = Layout::default();
    let mut n = Hubnet::new(&layout);
    n.nodes[HUB].cfg.initiate = Initiate::RekeyOnly;
    established(&mut n, &[HUB, 1]);
    let at_a = n.hub_handle(1).unwrap();
    // A flow from A that stays open: the old association's, to be reset only at the end.
    let held = n.open(HUB, at_a, 4999, pattern(9, 10_000), false);
    n.run_until(Duration::from_secs(2), |_| false);
    assert_eq!(n.nodes[HUB].assocs[&at_a].0.stats().flows_open, 1);
    let mut standby = Hubnet::new(&layout).nodes.swap_remove(HUB);
    standby.epoch += 1;
    standby.cfg.initiate = Initiate::RekeyOnly;
    let a = std::mem::replace(&mut n.nodes[HUB], standby);
    let t = n.nodes[1].only();
    assert!(n.run_until(Duration::from_secs(10), |n| {
        n.established([HUB, 1]) && n.nodes[1].assocs[&t].0.stats().peer_restarts == 1
    }));
    // A is back on the address; the standby is gone.
    n.nodes[HUB] = a;
    let replies_before = count_sent(&n, HUB, REPLY, terminal_addr(1));
    let replied = |n: &Hubnet| count_sent(n, HUB, REPLY, terminal_addr(1)) > replies_before;
    assert!(n.run_until(Duration::from_secs(10), replied));
    let init = n.nodes[1]
        .sent
        .iter()
        .rev()
        .find(|(_, d)| d[0] == INIT)
        .map(|(_, d)| d.clone())
        .unwrap();
    let old = |n: &Hubnet| {
        let s = n.nodes[HUB].assocs[&at_a].0.stats();
        (s.flows_open, s.peer_restarts, s.associations_taken_over)
    };
    assert_eq!(old(&n), (1, 0, 0), "answered, not yet confirmed");
    // A copy of the initiation before the confirmation gets the same reply, nothing more.
    let now = n.now;
    answer_to_copy(&mut n.nodes[HUB], at_a, now, terminal_addr(1), &init);
    assert_eq!(old(&n), (1, 0, 0));
    assert!(n.nodes[HUB].assocs[&at_a].0.is_established());
    assert!(
        n.run_until(Duration::from_secs(10), |n| n.established([HUB, 1])
            && old(n) == (0, 1, 1))
    );
    let reset = n.app(HUB, at_a).flows[&held].reset;
    assert_eq!(reset, Some(ResetReason::PeerRestart));
    assert_eq!(n.nodes[1].assocs[&t].0.stats().peer_restarts, 2);
    flows_both_ways(&mut n, &[1], 300_000);
}

/// A hub among several with one key only rekeys what is up: fresh, it sends nothing even
/// to a configured address, and it never arms a timer for it; established and leading, it
/// rekeys; cut off, it starts no initiation through the outage, the outage limit and the
/// restart after it, while its peer finds it again by initiating itself.
#[test]
fn a_redundant_hub_never_starts_a_handshake() {
    let [sec_a, sec_b] = security_pair(Duration::from_secs(10));
    let mut cfg = test_config(20_000_000);
    cfg.initiate = Initiate::RekeyOnly;
    let start = Instant::now();
    let mut fresh = Association::new_secure(
        cfg.clone(),
        Role::Responder,
        7,
        start,
        sec_b.clone(),
        [7; 32],
    )
    .unwrap();
    let mut out = Vec::new();
    for s in 0..60 {
        let now = start + Duration::from_secs(s);
        fresh.handle_timeout(now);
        assert!(!fresh.poll_transmit(now, &mut out));
        assert_eq!(fresh.poll_timeout(), None);
    }

    // The side whose key leads does the rekeying: that one only rekeys.
    let leads_a = public_key(&sec_a.local_private_key) > sec_a.peer_public_key;
    let redundant = if leads_a { 0 } else { 1 };
    let mut cfgs = [test_config(20_000_000), test_config(20_000_000)];
    for c in &mut cfgs {
        c.outage_limit = Duration::from_secs(20);
    }
    cfgs[redundant].initiate = Initiate::RekeyOnly;
    let [c0, c1] = cfgs;
    let mut n = Net::new_secure(c0, c1, MS * 300, Faults::default(), 5, [sec_a, sec_b]);
    n.record_a = Some(Vec::new());
    n.record_b = Some(Vec::new());
    establish_within_20s(&mut n);
    let inits = |n: &Net| {
        let rec = if redundant == 0 {
            &n.record_a
        } else {
            &n.record_b
        };
        rec.as_ref()
            .unwrap()
            .iter()
            .filter(|d| d[0] == INIT)
            .count()
    };
    assert_eq!(inits(&n), 0, "the other side started the association");
    n.run_until(Duration::from_secs(35), |_| false);
    assert!(
        n.ends[redundant].stats().rekeys >= 3,
        "an up association is rekeyed"
    );
    let rekey_inits = inits(&n);
    assert!(rekey_inits >= 3);
    // Cut off for longer than the outage limit: no initiation, and its timers do not spin.
    n.down_until = Some(n.now + Duration::from_secs(60));
    let down_until = n.now + Duration::from_secs(60);
    let mut steps = 0;
    while n.now < down_until {
        assert!(n.step());
        steps += 1;
        assert!(steps < 100_000, "timers spin at {:?}", n.elapsed());
    }
    let s = n.ends[redundant].stats();
    assert_eq!((s.outages, inits(&n)), (1, rekey_inits));
    assert!(n.apps[redundant].events.iter().any(|e| matches!(
        e,
        Event::AssociationLost {
            reason: LostReason::OutageLimit
        }
    )));
    assert!(n.run_until(Duration::from_secs(20), |n| n.established()));
    assert_eq!(
        inits(&n),
        rekey_inits,
        "the peer initiated again, not the hub"
    );
}

/// A hub restarts (a fresh endpoint with a new epoch) with hints on. The terminal's next
/// packet that asks for an answer gets a HINT, and the terminal is associated with the new
/// epoch within four one-way delays of that packet (the packet out, the hint back, the INIT
/// out, the REPLY back), before its probes could start an outage.
#[test]
fn a_hub_restart_is_found_by_the_first_hinted_packet() {
    let layout = Layout {
        hints: true,
        ..Layout::default()
    };
    let mut n = Hubnet::new(&layout);
    established(&mut n, &[HUB, 1]);
    n.run_until(Duration::from_secs(2), |_| false);
    let mut restarted = Hubnet::new(&layout).nodes.swap_remove(HUB);
    restarted.epoch += 1;
    n.nodes[HUB] = restarted;
    let t = n.nodes[1].only();
    let sent_before = n.nodes[1].sent.len();
    n.open(1, t, 3001, pattern(1, 1000), true);
    assert!(
        n.nodes[1].sent.len() > sent_before,
        "the FLOW_OPEN left at once"
    );
    let first = n.now;
    let stats = |n: &Hubnet| n.nodes[1].assocs[&t].0.stats();
    assert!(
        n.run_until(Duration::from_secs(5), |n| n.nodes[1].assocs[&t]
            .0
            .is_established()
            && stats(n).peer_restarts == 1)
    );
    let took = n.now - first;
    eprintln!("re-associated {took:?} after the first packet to the restarted hub");
    assert!(took <= layout.delay * 4, "{took:?}");
    let s = stats(&n);
    assert_eq!((s.hints.acted, s.outages), (1, 0));
    assert!(n.nodes[HUB].endpoint.stats().hints_sent >= 1);
    flows_both_ways(&mut n, &[1], 100_000);
}

/// Hints that do not echo a packet the terminal has outstanding at its hub, byte for byte
/// where it counts, or that come from elsewhere, are counted and change nothing: no
/// initiation leaves, and the terminal keeps sending where it did. The genuine hint they
/// were made from is acted on at once.
#[test]
fn a_hint_that_echoes_no_packet_of_ours_is_ignored() {
    let layout = Layout::default();
    let mut n = Hubnet::new(&layout);
    established(&mut n, &[HUB, 1]);
    n.run_until(Duration::from_secs(1), |_| false);
    // The hub hears nothing from now on: what the terminal sends stays outstanding.
    let delay = layout.delay;
    n.path = Some(Box::new(move |_, from, _| {
        (from == hub_addr()).then_some(delay)
    }));
    let t = n.nodes[1].only();
    let before = n.nodes[1].sent.len();
    n.open(1, t, 3001, pattern(1, 1000), true);
    let packet = n.nodes[1].sent[before..]
        .iter()
        .find(|(_, d)| d[0] & 0x80 == 0)
        .map(|(_, d)| d.clone())
        .expect("a short packet");
    let mut genuine = Vec::new();
    assert!(encode_hint(&packet, 2, 16, &mut genuine));
    let inits = |n: &Hubnet| n.nodes[1].sent.iter().filter(|(_, d)| d[0] == INIT).count();
    let inits_before = inits(&n);
    let altered = |at: usize, bits: u8| {
        let mut h = genuine.clone();
        h[at] ^= bits;
        h
    };
    let elsewhere: SocketAddr = "198.18.0.2:7400".parse().unwrap();
    let forged = [
        (altered(genuine.len() - 1, 0x01), hub_addr()),
        (altered(8, 0x40), hub_addr()),
        (altered(6, 0x01), hub_addr()),
        (genuine.clone(), elsewhere),
    ];
    for (hint, from) in &forged {
        n.deliver(1, *from, hint);
    }
    let s = n.nodes[1].assocs[&t].0.stats();
    assert_eq!(
        s.hints,
        HintCounts {
            unmatched: 3,
            elsewhere: 1,
            ..HintCounts::default()
        }
    );
    assert_eq!(inits(&n), inits_before);
    assert_eq!(n.nodes[1].assocs[&t].0.remote(), Some(hub_addr()));
    assert_eq!(s.remote_moves, 0);
    n.deliver(1, hub_addr(), &genuine);
    assert_eq!(n.nodes[1].assocs[&t].0.stats().hints.acted, 1);
    assert_eq!(inits(&n), inits_before + 1, "an initiation left at once");
}
