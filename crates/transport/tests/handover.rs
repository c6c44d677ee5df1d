//! A terminal that knows three hubs sharing one key (docs/PROTOCOL.md §10), over GEO
//! delays: it moves only to a hub that answered while its own was silent, the hub it is
//! on gets the last word, and nothing pulls it back unless it returns by itself.

mod support;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use pep_transport::{
    AssocHandle, Association, Event, FlowId, Hubs, Initiate, LostReason, PeerId, ResetReason,
    CLOSE_HANDOVER,
};
use support::endpoints::{hub_node, Hubnet, Layout};
use support::{pattern, INIT, REPLY};

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

/// Node indexes: hub A (the preferred), the terminal, hubs B and C.
const A: usize = 0;
const T: usize = 1;
const B: usize = 2;
const C: usize = 3;

/// Where no gateway is.
const NOWHERE: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(198, 18, 9, 9),
    7400,
));

/// A CLOSE to a hub as the terminal seals it: flags, the hub's 2-byte connection ID, a
/// 4-byte packet number; the frame (type, code, reason length, "handover"); the tag.
const HANDOVER_CLOSE_LEN: usize = 1 + 2 + 4 + (1 + 1 + 1 + 8) + 16;

fn hub_at(node: usize) -> SocketAddr {
    let last = match node {
        A => 1,
        B => 2,
        C => 3,
        _ => unreachable!("not a hub"),
    };
    SocketAddr::from(([198, 18, 0, last], 7400))
}

fn layout() -> Layout {
    Layout {
        delay: MS * 300,
        hints: true,
        ..Layout::default()
    }
}

/// Hubs A, B and C (redundant: they only rekey) and a terminal that lists them in that
/// order; nothing sent yet.
fn net(return_after: Option<Duration>) -> (Hubnet, AssocHandle) {
    let layout = layout();
    let mut n = Hubnet::new(&layout);
    n.nodes[A].cfg.initiate = Initiate::RekeyOnly;
    for (hub, epoch) in [(B, 5000), (C, 6000)] {
        let mut node = hub_node(&layout, hub_at(hub), epoch, [hub as u8 * 17; 32]);
        node.cfg.initiate = Initiate::RekeyOnly;
        n.nodes.push(node);
    }
    let t = n.nodes[T].only();
    let hubs = Hubs {
        addresses: vec![hub_at(A), hub_at(B), hub_at(C)],
        return_after,
    };
    terminal_mut(&mut n, t).set_hubs(hubs).unwrap();
    (n, t)
}

fn terminal(n: &Hubnet, t: AssocHandle) -> &Association {
    &n.nodes[T].assocs[&t].0
}

fn terminal_mut(n: &mut Hubnet, t: AssocHandle) -> &mut Association {
    &mut n.nodes[T].assocs.get_mut(&t).unwrap().0
}

/// The association hub `hub` holds for the terminal.
fn at(n: &Hubnet, hub: usize) -> Option<AssocHandle> {
    n.nodes[hub].endpoint.association_of(PeerId(1))
}

/// The hub stops for good: nothing reaches it and it sends nothing.
fn kill(n: &mut Hubnet, hub: usize) {
    n.nodes[hub].assocs.clear();
    n.nodes[hub].addr = NOWHERE;
}

/// The hub starts afresh at its address: a new epoch, no association.
fn restart_hub(n: &mut Hubnet, hub: usize, epoch: u64) {
    let mut node = hub_node(&layout(), hub_at(hub), epoch, [epoch as u8; 32]);
    node.cfg.initiate = Initiate::RekeyOnly;
    n.nodes[hub] = node;
}

/// Datagrams the terminal sent to `hub`'s address, and of those the initiations.
fn sent_to(n: &Hubnet, hub: usize) -> (usize, usize) {
    let to: Vec<_> = n.nodes[T]
        .sent
        .iter()
        .filter(|(a, _)| *a == hub_at(hub))
        .collect();
    (to.len(), to.iter().filter(|(_, d)| d[0] == INIT).count())
}

fn handovers(n: &Hubnet, t: AssocHandle) -> Vec<(SocketAddr, SocketAddr)> {
    n.app(T, t)
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Handover { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

/// A flow each way between the terminal and `hub`, finished, and what each must deliver.
struct Pair {
    hub: usize,
    at_hub: AssocHandle,
    up: FlowId,
    up_bytes: Vec<u8>,
    down: FlowId,
    down_bytes: Vec<u8>,
}

fn open_pair(n: &mut Hubnet, t: AssocHandle, hub: usize, seed: u64, bytes: usize) -> Pair {
    let at_hub = at(n, hub).expect("the hub's association");
    let up_bytes = pattern(seed, bytes);
    let down_bytes = pattern(seed + 100, bytes + 7);
    let up = n.open(T, t, 3000 + seed as u16, up_bytes.clone(), true);
    let down = n.open(hub, at_hub, 4000 + seed as u16, down_bytes.clone(), true);
    Pair {
        hub,
        at_hub,
        up,
        up_bytes,
        down,
        down_bytes,
    }
}

/// Runs until both flows of `p` delivered their end, then requires them byte-exact.
fn complete(n: &mut Hubnet, t: AssocHandle, p: &Pair, limit: Duration) {
    let done = n.run_until(limit, |n| {
        n.received(p.hub, p.at_hub, p.up)
            .is_some_and(|f| f.fin_received)
            && n.received(T, t, p.down).is_some_and(|f| f.fin_received)
    });
    assert!(done, "the transfers with hub {} did not complete", p.hub);
    assert_eq!(
        n.received(p.hub, p.at_hub, p.up).unwrap().received,
        p.up_bytes
    );
    assert_eq!(n.received(T, t, p.down).unwrap().received, p.down_bytes);
}

/// The terminal associated with A, a first exchange done, and an upload under way.
fn on_a_and_busy(n: &mut Hubnet, t: AssocHandle) -> FlowId {
    assert!(n.run_until(SECOND * 20, |n| n.established([T, A])));
    let first = open_pair(n, t, A, 1, 100_000);
    complete(n, t, &first, SECOND * 30);
    let up = n.open(T, t, 3100, pattern(9, 20_000_000), true);
    n.advance(SECOND);
    up
}

/// Steps until the terminal is on `hub` (its rank), for at most `limit`; returns how many
/// datagrams it had sent to its previous hub `left` just before the move.
fn run_until_on(
    n: &mut Hubnet,
    t: AssocHandle,
    rank: usize,
    left: usize,
    limit: Duration,
) -> usize {
    let end = n.now + limit;
    loop {
        let before = sent_to(n, left).0;
        assert!(n.now < end && n.step(), "not on hub rank {rank} in time");
        if terminal(n, t).hub_rank() == Some(rank) {
            return before;
        }
    }
}

#[test]
fn a_dead_hub_is_left_for_the_next_that_answers() {
    let (mut n, t) = net(None);
    let up = on_a_and_busy(&mut n, t);
    let killed = n.now;
    kill(&mut n, A);
    let before = run_until_on(&mut n, t, 1, A, SECOND * 5);
    eprintln!("on B {:?} after A stopped", n.now - killed);
    assert_eq!(n.app(T, t).flows[&up].reset, Some(ResetReason::Handover));
    // The CLOSE to A went with the move (A is dead: nobody reads it).
    let to_a: Vec<_> = n.nodes[T]
        .sent
        .iter()
        .filter(|(a, _)| *a == hub_at(A))
        .collect();
    assert_eq!(to_a.len(), before + 1);
    let close = &to_a.last().unwrap().1;
    assert_eq!((close[0] & 0x80, close.len()), (0, HANDOVER_CLOSE_LEN));
    assert!(n.run_until(SECOND * 5, |n| n.established([T, B])));
    let pair = open_pair(&mut n, t, B, 2, 300_000);
    complete(&mut n, t, &pair, SECOND * 30);
    n.advance(SECOND * 30);
    assert_eq!(handovers(&n, t), vec![(hub_at(A), hub_at(B))]);
    let s = terminal(&n, t).stats();
    assert_eq!((s.handovers, s.handover_trials.moved), (1, 1));
    assert_eq!(sent_to(&n, A).0, before + 1, "nothing more went to A");
    assert!(at(&n, C).is_none(), "C was never tried");
}

#[test]
fn a_rain_fade_silencing_every_hub_moves_nothing_and_flows_survive() {
    let (mut n, t) = net(None);
    assert!(n.run_until(SECOND * 20, |n| n.established([T, A])));
    let pair = open_pair(&mut n, t, A, 3, 3_000_000);
    n.advance(SECOND);
    let start = n.now - n.base;
    n.cut = Some(Box::new(move |at, _, _, _| {
        at >= start && at < start + SECOND * 30
    }));
    complete(&mut n, t, &pair, SECOND * 120);
    let s = terminal(&n, t).stats();
    assert!(s.outages >= 1);
    assert!(s.handover_trials.unanswered >= 2, "{:?}", s.handover_trials);
    assert_eq!((s.handovers, s.handover_trials.moved), (0, 0));
    assert_eq!(s.flows_reset, 0);
    assert_eq!(terminal(&n, t).hub_rank(), Some(0));
    assert_eq!(terminal(&n, t).remote(), Some(hub_at(A)));
}

/// Every link is down for 20 s. When it returns, the first candidate to answer gets its
/// reply through, and A's link comes back just as that reply arrives: the terminal's probe
/// then reaches A, whose answer comes one round trip later, within the settle.
#[test]
fn when_both_answer_after_a_fade_the_current_hub_wins() {
    let (mut n, t) = net(None);
    assert!(n.run_until(SECOND * 20, |n| n.established([T, A])));
    let pair = open_pair(&mut n, t, A, 4, 3_000_000);
    n.advance(SECOND);
    let fade_end = n.now - n.base + SECOND * 20;
    let a_back: Rc<Cell<Option<Duration>>> = Rc::default();
    let a_back_seen = a_back.clone();
    let (a, term) = (hub_at(A), support::endpoints::terminal_addr(1));
    n.cut = Some(Box::new(move |at, from, to, d| {
        if at < fade_end {
            return true;
        }
        let with_a = (from == a && to == term) || (from == term && to == a);
        if from != a && from != term && d[0] == REPLY && a_back.get().is_none() {
            // Arrives one way later: A's link is back from that instant.
            a_back.set(Some(at + MS * 300));
        }
        with_a && a_back.get().is_none_or(|back| at < back)
    }));
    complete(&mut n, t, &pair, SECOND * 120);
    assert!(a_back_seen.get().is_some(), "no candidate answered");
    let s = terminal(&n, t).stats();
    assert_eq!(s.handover_trials.stayed, 1, "{:?}", s.handover_trials);
    assert_eq!((s.handovers, s.flows_reset), (0, 0));
    assert_eq!(terminal(&n, t).hub_rank(), Some(0));
}

#[test]
fn a_hub_that_comes_back_does_not_pull_the_terminal_back() {
    let (mut n, t) = net(None);
    on_a_and_busy(&mut n, t);
    kill(&mut n, A);
    run_until_on(&mut n, t, 1, A, SECOND * 5);
    // What the terminal sent A before the move has arrived nowhere by then.
    n.advance(SECOND);
    restart_hub(&mut n, A, 1001);
    let to_a = sent_to(&n, A).0;
    n.advance(Duration::from_secs(600));
    assert_eq!(terminal(&n, t).hub_rank(), Some(1));
    assert_eq!(terminal(&n, t).stats().handovers, 1);
    assert!(
        n.nodes[A].sent.is_empty(),
        "the restarted hub sent something"
    );
    assert_eq!(sent_to(&n, A).0, to_a);
    assert!(n.established([T, B]));
}

#[test]
fn return_to_preferred_moves_back_only_when_idle() {
    let (mut n, t) = net(Some(SECOND * 60));
    on_a_and_busy(&mut n, t);
    kill(&mut n, A);
    run_until_on(&mut n, t, 1, A, SECOND * 5);
    restart_hub(&mut n, A, 1001);
    assert!(n.run_until(SECOND * 5, |n| n.established([T, B])));
    // A flow stays open past the return time: no try of A while it is.
    let held = n.open(T, t, 3200, pattern(5, 1000), false);
    let inits_to_a = sent_to(&n, A).1;
    n.advance(SECOND * 90);
    assert_eq!(sent_to(&n, A).1, inits_to_a);
    assert_eq!(terminal(&n, t).hub_rank(), Some(1));
    terminal_mut(&mut n, t)
        .reset(held, ResetReason::Aborted)
        .unwrap();
    let on_b = at(&n, B).unwrap();
    run_until_on(&mut n, t, 0, B, SECOND * 10);
    assert_eq!(
        handovers(&n, t),
        vec![(hub_at(A), hub_at(B)), (hub_at(B), hub_at(A))]
    );
    assert!(n.run_until(SECOND * 5, |n| n.established([T, A])));
    // B read the CLOSE the move back sent it.
    let closed = n.app(B, on_b).events.iter().any(|e| {
        matches!(e, Event::AssociationLost { reason: LostReason::PeerClosed { code, .. } } if *code == CLOSE_HANDOVER)
    });
    assert!(closed, "B did not get the CLOSE");
    let pair = open_pair(&mut n, t, A, 6, 300_000);
    complete(&mut n, t, &pair, SECOND * 30);
    assert_eq!(terminal(&n, t).stats().handover_trials.moved, 2);
}

/// A is only cut off, so its CLOSE never arrives and A keeps the association (in an
/// outage) with its flows. When the terminal returns to it, A starts a new association at
/// the terminal's first packet, and the new transfer is byte-exact.
#[test]
fn a_stale_association_at_the_old_hub_restarts_when_the_terminal_returns() {
    let (mut n, t) = net(Some(SECOND * 20));
    assert!(n.run_until(SECOND * 20, |n| n.established([T, A])));
    let at_a = at(&n, A).unwrap();
    let down = n.open(A, at_a, 4100, pattern(8, 20_000_000), true);
    let up = n.open(T, t, 3100, pattern(9, 20_000_000), true);
    n.advance(SECOND * 2);
    let cut_off: Rc<Cell<bool>> = Rc::new(Cell::new(true));
    let cut = cut_off.clone();
    let a = hub_at(A);
    n.cut = Some(Box::new(move |_, from, to, _| {
        cut.get() && (from == a || to == a)
    }));
    run_until_on(&mut n, t, 1, A, SECOND * 5);
    assert_eq!(n.app(T, t).flows[&up].reset, Some(ResetReason::Handover));
    n.advance(SECOND * 5);
    let hub_a = n.nodes[A].assocs[&at_a].0.stats();
    assert!(n.nodes[A].assocs[&at_a].0.is_established());
    assert_eq!((hub_a.flows_reset, hub_a.peer_restarts), (0, 0));
    assert!(n.app(A, at_a).flows[&down].reset.is_none());
    cut_off.set(false);
    run_until_on(&mut n, t, 0, B, SECOND * 30);
    // A's association looks established throughout: the terminal's first packet under the
    // new keys is what restarts it.
    assert!(n.run_until(SECOND * 5, |n| n.nodes[A].assocs[&at_a]
        .0
        .stats()
        .peer_restarts
        == 1));
    let hub_a = n.nodes[A].assocs[&at_a].0.stats();
    assert_eq!(hub_a.associations_taken_over, 1);
    assert_eq!(
        n.app(A, at_a).flows[&down].reset,
        Some(ResetReason::PeerRestart)
    );
    let pair = open_pair(&mut n, t, A, 10, 500_000);
    complete(&mut n, t, &pair, SECOND * 30);
}

/// The flow opened before any hub answered waits for the one that does.
#[test]
fn a_terminal_starting_while_its_home_hub_is_dead_associates_with_the_next() {
    let (mut n, t) = net(None);
    kill(&mut n, A);
    let early = pattern(11, 200_000);
    let up = n.open(T, t, 3300, early.clone(), true);
    assert!(n.run_until(SECOND * 10, |n| n.established([T, B])));
    eprintln!("associated with B after {:?}", n.now - n.base);
    assert_eq!(terminal(&n, t).hub_rank(), Some(1));
    assert_eq!(handovers(&n, t), vec![(hub_at(A), hub_at(B))]);
    let at_b = at(&n, B).unwrap();
    assert!(n.run_until(SECOND * 30, |n| n
        .received(B, at_b, up)
        .is_some_and(|f| f.fin_received)));
    assert_eq!(n.received(B, at_b, up).unwrap().received, early);
    assert!(n.app(T, t).flows[&up].reset.is_none());
    let pair = open_pair(&mut n, t, B, 12, 300_000);
    complete(&mut n, t, &pair, SECOND * 30);
}

/// The hub list is checked: the first address is the one sent to, no address twice, at
/// most eight, and only with security.
#[test]
fn a_hub_list_is_checked() {
    let (mut n, t) = net(None);
    let a = terminal_mut(&mut n, t);
    let list = |v: Vec<SocketAddr>| Hubs {
        addresses: v,
        return_after: None,
    };
    assert!(a.set_hubs(list(vec![hub_at(B), hub_at(A)])).is_err());
    assert!(a.set_hubs(list(vec![hub_at(A), hub_at(A)])).is_err());
    assert!(a.set_hubs(list(vec![])).is_err());
    let many = (1..=9)
        .map(|i| SocketAddr::from(([198, 18, 0, i], 7400)))
        .collect();
    assert!(a.set_hubs(list(many)).is_err());
    assert!(a.set_hubs(list(vec![hub_at(A), hub_at(C)])).is_ok());
    assert_eq!(a.hub_rank(), Some(0));
}
