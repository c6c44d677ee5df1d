use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use pep_transport::{Association, FlowMeta, Role};

use super::*;
use crate::tunnel::peer::{OpenRefused, Peer};

/// Counts what the current thread has allocated and not freed, so a test can weigh the
/// structures it builds while others run in parallel.
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to the system allocator unchanged; the counter is a plain
// thread-local cell that itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + layout.size() as i64));
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|c| c.set(c.get() - layout.size() as i64));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + new_size as i64 - layout.size() as i64));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

const MIB: u64 = 1 << 20;

#[test]
fn the_account_adds_flows_held_bytes_and_payload() {
    let m = Arc::new(MemoryAccount::new(10 * MIB, 4 * MIB, MIB));
    assert_eq!(m.accounted(0, 0), MIB);
    // The send quota is half the budget, 5 MiB, and 10 − 4 − 1 MiB leaves 5 MiB too.
    assert_eq!(m.send_room(0), 5 * MIB);
    let charges: Vec<FlowCharge> = (0..3).map(|_| m.charge_flow()).collect();
    assert_eq!(m.flows(), 3);
    assert_eq!(m.accounted(0, 0), MIB + 3 * 4096);
    assert_eq!(m.send_room(0), 5 * MIB - 3 * 4096);
    m.hold(1000);
    assert_eq!(m.accounted(200, 300), MIB + 3 * 4096 + 1000 + 200 + 300);
    assert_eq!(m.send_room(200), 5 * MIB - 3 * 4096 - 1000 - 200);
    // Admission needs a flow's cost plus its first bytes.
    let room = m.send_room(0);
    assert!(m.admits_flow(room - 4096 - 10, 10));
    assert!(!m.admits_flow(room - 4096 - 9, 10));
    m.release(1000);
    drop(charges);
    assert_eq!((m.flows(), m.held()), (0, 0));
    assert_eq!(m.accounted(0, 0), MIB);
    // A budget lowered on reload below what is in use leaves no room, not a wrap-around.
    m.set_budget(MIB);
    assert_eq!(m.send_room(0), 0);
}

/// A gateway's one peer, with the whole send side of the budget as its quota.
fn hub(budget: u64, receive_reserve: u64, fixed: u64) -> Peer {
    let memory = Arc::new(MemoryAccount::new(budget, receive_reserve, fixed));
    peer_on(&memory, send_cap(budget))
}

/// A peer of a gateway whose account is `memory`, with `quota` of the send side.
fn peer_on(memory: &Arc<MemoryAccount>, quota: u64) -> Peer {
    let cfg = pep_transport::Config::for_rate(10_000_000);
    let assoc = Association::new(cfg, Role::Initiator, 1, Instant::now()).expect("association");
    Peer::new(
        pep_transport::PeerId(0),
        "peer",
        Some(assoc),
        quota,
        memory.clone(),
        Arc::new(tokio::sync::Notify::new()),
    )
}

fn meta(port: u16) -> FlowMeta {
    FlowMeta {
        client: format!("198.18.0.2:{port}").parse().expect("addr"),
        server: "198.18.1.2:80".parse().expect("addr"),
        dscp: 0,
        compression: false,
    }
}

#[test]
fn flows_past_the_budget_are_refused_until_one_ends() {
    // Room for exactly three flows after a 1 MiB reserve and 64 KiB of fixed costs.
    let budget = MIB + 64 * 1024 + 3 * PER_FLOW;
    let hub = hub(budget, MIB, 64 * 1024);
    let mut open: Vec<_> = (0..3)
        .map(|i| hub.open(meta(1000 + i), &[]).expect("fits"))
        .collect();
    assert_eq!(hub.memory.flows(), 3);
    assert_eq!(
        hub.open(meta(2000), &[]).err(),
        Some(OpenRefused::MemoryBudget)
    );
    assert_eq!(hub.memory.accounted(0, 0), budget - MIB);
    // The flow's end returns its quota.
    drop(open.pop());
    assert_eq!(hub.memory.flows(), 2);
    // First bytes count too: one byte more than the room left is refused.
    assert_eq!(
        hub.open(meta(2001), &[0u8; 1]).err(),
        Some(OpenRefused::MemoryBudget)
    );
    let (_flow, _charge) = hub.open(meta(2002), &[]).expect("room again");
    assert_eq!(hub.memory.flows(), 3);
}

#[test]
fn relays_stop_reading_once_buffered_payload_fills_the_budget() {
    // Room for the flows and 10,000 bytes of payload.
    let budget = MIB + 2 * PER_FLOW + 10_000;
    let hub = hub(budget, MIB, 0);
    let (a, _ca) = hub.open(meta(1), &[7u8; 6000]).expect("fits");
    let (b, _cb) = hub.open(meta(2), &[]).expect("fits");
    assert_eq!(hub.write_room(&b).expect("room"), 4000);
    assert_eq!(hub.write(&b, &[1u8; 4000]).expect("write"), 4000);
    assert_eq!(hub.write_room(&a).expect("room"), 0);
    assert_eq!(hub.write_room(&b).expect("room"), 0);
    assert_eq!(
        hub.open(meta(3), &[]).err(),
        Some(OpenRefused::MemoryBudget)
    );
}

#[test]
fn the_peers_of_a_gateway_divide_its_one_budget() {
    // Room for exactly three flows, whichever peers they go to.
    let budget = MIB + 3 * PER_FLOW;
    let memory = Arc::new(MemoryAccount::new(budget, MIB, 0));
    let quota = crate::tunnel::memory::peer_send_quota(budget, 2);
    let (a, b) = (peer_on(&memory, quota), peer_on(&memory, quota));
    let mut open = vec![
        a.open(meta(1), &[]).expect("fits"),
        a.open(meta(2), &[]).expect("fits"),
        b.open(meta(3), &[]).expect("fits"),
    ];
    assert_eq!(memory.flows(), 3);
    assert_eq!(b.open(meta(4), &[]).err(), Some(OpenRefused::MemoryBudget));
    assert_eq!(a.open(meta(5), &[]).err(), Some(OpenRefused::MemoryBudget));
    // A flow of one peer ending makes room for the other's.
    drop(open.remove(0));
    open.push(b.open(meta(6), &[]).expect("room again"));
    assert_eq!(memory.flows(), 3);

    // Bytes one peer buffers to send leave less for the other.
    let budget = MIB + 2 * PER_FLOW + 10_000;
    let memory = Arc::new(MemoryAccount::new(budget, MIB, 0));
    let quota = crate::tunnel::memory::peer_send_quota(budget, 2);
    let (a, b) = (peer_on(&memory, quota), peer_on(&memory, quota));
    let (fa, _ca) = a.open(meta(1), &[7u8; 6000]).expect("fits");
    let (fb, _cb) = b.open(meta(2), &[]).expect("fits");
    assert_eq!(memory.send_buffered(), 6000);
    assert_eq!(b.write_room(&fb).expect("room"), 4000);
    assert_eq!(b.write(&fb, &[1u8; 4000]).expect("write"), 4000);
    assert_eq!(memory.send_buffered(), 10_000);
    assert_eq!(a.write_room(&fa).expect("room"), 0);
    assert_eq!(b.write_room(&fb).expect("room"), 0);
}

#[test]
fn a_peer_buffers_no_more_than_its_quota() {
    let budget = 64 * MIB;
    let memory = Arc::new(MemoryAccount::new(budget, 0, 0));
    // A quota below what the flow itself could take.
    let peer = peer_on(&memory, 5000);
    let (flow, _charge) = peer.open(meta(1), &[7u8; 3000]).expect("fits");
    assert_eq!(peer.write_room(&flow).expect("room"), 2000);
    assert_eq!(
        peer.open(meta(2), &[0u8; 2001]).err(),
        Some(OpenRefused::MemoryBudget)
    );
    assert!(memory.send_room(memory.send_buffered()) > 2000);
}

#[test]
fn per_flow_cost_is_covered() {
    // The heap a flow takes in the association and the hub, opened here (a peer's flow
    // takes the same: a transport flow and a slot).
    let hub = hub(64 * MIB, MIB, 0);
    const N: usize = 2000;
    let before = live_bytes();
    let open: Vec<_> = (0..N)
        .map(|i| hub.open(meta(i as u16 + 1), &[]).expect("fits"))
        .collect();
    let state = (live_bytes() - before) as u64 / N as u64;
    // The task: tokio's allocation for the larger of the two futures (header and trailer
    // included) and the registration of its TCP socket.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (futures, task) = rt.block_on(async {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.set_nonblocking(true).expect("nonblocking");
        let before = live_bytes();
        let tcp = tokio::net::TcpStream::from_std(sock.into()).expect("tcp");
        let registration = live_bytes() - before;
        let peer = Arc::new(self::hub(64 * MIB, MIB, 0));
        let (flow, _charge) = peer.open(meta(1), &[]).expect("fits");
        let (intercepted, peer) = crate::proxy::acceptor::flow_tasks(peer.clone(), flow, tcp);
        let sizes = [size_of_val(&intercepted), size_of_val(&peer)];
        // Spawned, weighed and aborted before they run (this runtime runs them only when
        // the test yields).
        let before = live_bytes();
        let a = tokio::spawn(intercepted);
        let spawned_a = live_bytes() - before;
        let before = live_bytes();
        let b = tokio::spawn(peer);
        let spawned_b = live_bytes() - before;
        a.abort();
        b.abort();
        (sizes, (spawned_a.max(spawned_b) + registration) as u64)
    });
    eprintln!(
        "per flow: {state} B of flow state, {task} B of task (futures {futures:?} B) and \
         socket registration, {} B in all",
        state + task
    );
    assert!(
        state + task <= PER_FLOW,
        "a flow costs {} B, more than PER_FLOW ({PER_FLOW}): raise it and the docs",
        state + task
    );
    drop(open);
}

#[test]
fn past_half_the_send_pool_each_flow_gets_a_quota() {
    // The pool is what 10 MiB leaves after a 4 MiB reserve, 1 MiB of fixed costs and the
    // flows: under the send cap of 5 MiB.
    let m = Arc::new(MemoryAccount::new(10 * MIB, 4 * MIB, MIB));
    let charges: Vec<FlowCharge> = (0..4).map(|_| m.charge_flow()).collect();
    let pool = 5 * MIB - 4 * PER_FLOW;
    assert_eq!(m.send_pool(), pool);
    assert_eq!(m.send_room(1000), pool - 1000);
    // Up to half the pool, a flow takes what is free.
    assert_eq!(m.flow_quota(0), None);
    assert_eq!(m.flow_quota(pool / 2), None);
    // Past it, a quarter of the pool split over the four flows.
    assert_eq!(m.flow_quota(pool / 2 + 1), Some(pool / 16));
    assert_eq!(pool / 16, 326_656);
    // Never less than the floor, however many flows.
    let many: Vec<FlowCharge> = (0..1000).map(|_| m.charge_flow()).collect();
    assert_eq!(m.flow_quota(m.send_pool()), Some(QUOTA_FLOOR));
    drop((charges, many));
}

#[test]
fn a_flow_over_its_quota_waits_until_the_contention_ends() {
    // A 1 MiB pool (the reserve and fixed costs take the rest, the flows' own cost too).
    let budget = 4 * MIB + 2 * PER_FLOW;
    let hub = hub(budget, 3 * MIB, 0);
    let (a, _ca) = hub.open(meta(1), &[]).expect("fits");
    let (b, _cb) = hub.open(meta(2), &[]).expect("fits");
    assert_eq!(hub.memory.send_pool(), MIB);
    // Alone past half the pool, `a` may write what is free, then holds more than its quota.
    let big = vec![7u8; (MIB / 2 + 1) as usize];
    assert_eq!(hub.write_room(&a).expect("room"), MIB as usize);
    assert_eq!(hub.write(&a, &big).expect("write"), big.len());
    let quota = MIB / 4 / 2;
    assert_eq!(
        hub.memory.flow_quota(hub.memory.send_buffered()),
        Some(quota)
    );
    assert_eq!(hub.write_room(&a).expect("room"), 0);
    assert_eq!(
        hub.stats().expect("association").0.flows_waiting_for_quota,
        1
    );
    // `b` still gets its quota of what is left, not all of it.
    assert_eq!(hub.write_room(&b).expect("room"), quota as usize);
    assert_eq!(
        hub.write(&b, &vec![1u8; quota as usize]).expect("write"),
        quota as usize
    );
    assert_eq!(hub.write_room(&b).expect("room"), 0);
    assert_eq!(
        hub.stats().expect("association").0.flows_waiting_for_quota,
        2
    );
    assert!(hub.waits_for_budget());
    // A larger budget ends the contention: both are woken and write again.
    hub.memory.set_budget(64 * MIB);
    let mut st = hub.lock();
    st.lift_quotas(&hub);
    let mut woken = Vec::new();
    while let Some(ev) = st.assoc.as_mut().and_then(Association::poll_event) {
        if let pep_transport::Event::FlowWritable { flow } = ev {
            woken.push(flow);
        }
    }
    drop(st);
    assert_eq!(woken, vec![a.id, b.id]);
    assert_eq!(
        hub.stats().expect("association").0.flows_waiting_for_quota,
        0
    );
    assert!(!hub.waits_for_budget());
    assert!(hub.write_room(&a).expect("room") > 0);
    assert!(hub.write_room(&b).expect("room") > 0);
}

/// Whether `flow`'s relay has a wake-up waiting.
fn woken(flow: &crate::tunnel::peer::FlowRef) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    // Polled once: a permit left by `notify_one` completes it at once.
    let notified = flow.signal.notify.notified();
    rt.block_on(async { tokio::time::timeout(std::time::Duration::ZERO, notified).await })
        .is_ok()
}

#[test]
fn a_stalled_flow_is_reset_only_while_the_budget_is_contended() {
    use crate::tunnel::peer::{FlowGone, PeerCounters};
    use pep_transport::ResetReason;
    let fixed = 64 * 1024;
    let hub = hub(MIB + fixed + 4 * PER_FLOW, MIB, fixed);
    let (a, _ca) = hub.open(meta(1), &[]).expect("fits");
    let (b, _cb) = hub.open(meta(2), &[]).expect("fits");
    let stalled_resets = || PeerCounters::get(&hub.counters.flows_reset_stalled);
    // With room for another flow, a flow whose client stopped reading stays, and its relay
    // waits for contention.
    assert_eq!(hub.reset_if_stalled(&a), Ok(false));
    hub.lock().wake_stalled(&hub);
    assert!(!woken(&a));
    assert_eq!(stalled_resets(), 0);
    // No room for another flow: the relay is woken, and its flow reset with
    // `resource_limit`, once.
    hub.memory.set_budget(MIB + fixed + 2 * PER_FLOW);
    hub.lock().wake_stalled(&hub);
    assert!(woken(&a));
    assert!(!woken(&b));
    assert_eq!(hub.reset_if_stalled(&a), Ok(true));
    assert_eq!(stalled_resets(), 1);
    let resource_limit = hub
        .counters
        .flow_resets
        .snapshot()
        .into_iter()
        .find(|&(label, _)| label == "resource_limit");
    assert_eq!(resource_limit, Some(("resource_limit", 1)));
    assert_eq!(
        hub.reset_if_stalled(&a),
        Err(FlowGone::Reset(ResetReason::ResourceLimit))
    );
    assert_eq!(stalled_resets(), 1);
}
