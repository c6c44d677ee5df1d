//! What `limits.memory_budget` counts, and the running count the hub admits flows and bytes
//! against: bytes = fixed + per_flow × flows + buffered payload.
//!
//! The payload is the transport's send buffers (counted as they fill), the receive side
//! (reserved whole: it is bounded by the association window already granted to the peer)
//! and what relays hold between the transport and their TCP socket. Flows cost their
//! structures whether they move data or not; the fixed part is the buffers the daemon
//! allocates once. The process's own baseline (executable, runtime, allocator) is not in
//! the budget: docs/CONFIG.md gives the measured figure beside the formula.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::flowcount::OpenFlow;

/// A flow's structures while it lives, both gateways' kinds (intercepted or opened by the
/// peer): the relay task and its future, the transport's flow state, the hub's slot and
/// signal, tokio's registration of the TCP socket. Measured by `per_flow_cost_is_covered`
/// (about 2.5 KiB); the rest is headroom for allocator rounding and map growth.
pub const PER_FLOW: u64 = 4 * 1024;

/// The least a flow's share of a contended send pool comes to: a few datagrams, so that a
/// flow that moves does not go out in slivers however many flows are open.
pub const SHARE_FLOOR: u64 = 4 * 1024;

/// Read buffer each runtime worker thread lends to the relays it runs (relay::CHUNK).
pub const SCRATCH_PER_WORKER: u64 = crate::relay::CHUNK as u64;

/// The driver's receive batch (64 datagrams of up to 64 KiB each; with GRO fewer, larger
/// buffers in no more memory, each holding a coalesced batch).
pub const DRIVER_RECEIVE: u64 = (crate::driver::BATCH * crate::driver::RECV_BUF) as u64;

/// The association and hub themselves, the driver's other state, the metrics endpoint.
pub const DAEMON_STATE: u64 = 256 * 1024;

/// The part of the budget that does not depend on the traffic: the driver's batches
/// (receive, and up to twice a batch of `mtu`-sized datagrams to send), one scratch buffer
/// per worker thread and the daemon's state.
pub fn fixed(mtu: usize, workers: usize) -> u64 {
    driver_buffers(mtu) + SCRATCH_PER_WORKER * workers as u64 + DAEMON_STATE
}

/// The daemon's fixed memory with `drivers` drivers (a hub's `tunnel.workers`, 1 otherwise),
/// on this host's runtime threads.
pub fn daemon_fixed(mtu: usize, drivers: usize) -> u64 {
    fixed(mtu, worker_threads()) + (drivers as u64).saturating_sub(1) * driver_buffers(mtu)
}

/// One driver's batches: receive, and up to twice a batch of `mtu`-sized datagrams to send.
/// A hub has one driver per `tunnel.workers`.
pub fn driver_buffers(mtu: usize) -> u64 {
    DRIVER_RECEIVE + 2 * crate::driver::BATCH as u64 * mtu as u64
}

/// The runtime's worker threads, as tokio sizes them by default: one per CPU.
pub fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The send buffers' share of the budget: half, the other half bounding the receive
/// window (config.rs sizes the association window within it).
pub fn send_cap(budget: u64) -> u64 {
    budget / 2
}

/// What a configuration's limits imply, for `check-config` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Implied {
    pub fixed: u64,
    /// The association receive window: reserved whole, the peer may fill it at any time.
    pub receive_reserve: u64,
    /// Flows the budget carries when none of them has anything buffered to send.
    pub max_idle_flows: u64,
    /// Memory with `max_flows` flows and every buffer full: the budget, or less when the
    /// flows, the send share and the receive reserve together cannot reach it.
    pub worst_case: u64,
}

pub fn implied(budget: u64, receive_reserve: u64, fixed: u64, max_flows: u64) -> Implied {
    let for_flows = budget.saturating_sub(receive_reserve).saturating_sub(fixed);
    let flows = max_flows.min(for_flows / PER_FLOW);
    Implied {
        fixed,
        receive_reserve,
        max_idle_flows: for_flows / PER_FLOW,
        worst_case: budget.min(fixed + receive_reserve + send_cap(budget) + PER_FLOW * flows),
    }
}

/// The running count, one per gateway: the budget is the process's, whatever the number
/// of peers. Flows and relay-held bytes are tracked here; the transport's send buffers are
/// counted by each association, and each link reports its own into `send_buffered` so that
/// a link admits against what every link buffers.
#[derive(Debug)]
pub struct MemoryAccount {
    budget: AtomicU64,
    /// Follows the associations: a reload may add and remove peers.
    receive_reserve: AtomicU64,
    fixed: u64,
    flows: AtomicU64,
    /// Payload taken out of the transport and not yet written to TCP.
    held: AtomicU64,
    /// Every link's send buffers, as each last reported them.
    send_buffered: AtomicU64,
}

impl MemoryAccount {
    pub fn new(budget: u64, receive_reserve: u64, fixed: u64) -> MemoryAccount {
        MemoryAccount {
            budget: AtomicU64::new(budget),
            receive_reserve: AtomicU64::new(receive_reserve),
            fixed,
            flows: AtomicU64::new(0),
            held: AtomicU64::new(0),
            send_buffered: AtomicU64::new(0),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    pub fn set_budget(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::Relaxed);
    }

    pub fn set_receive_reserve(&self, bytes: u64) {
        self.receive_reserve.store(bytes, Ordering::Relaxed);
    }

    pub fn flows(&self) -> u64 {
        self.flows.load(Ordering::Relaxed)
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Every link's send buffers, as last reported with [`MemoryAccount::report_send`].
    pub fn send_buffered(&self) -> u64 {
        self.send_buffered.load(Ordering::Relaxed)
    }

    /// A link's send buffers went from `was` to `now` bytes.
    pub fn report_send(&self, was: u64, now: u64) {
        if now >= was {
            self.send_buffered.fetch_add(now - was, Ordering::Relaxed);
        } else {
            self.send_buffered.fetch_sub(was - now, Ordering::Relaxed);
        }
    }

    /// Everything but the send buffers and the receive side.
    fn overhead(&self) -> u64 {
        self.fixed + PER_FLOW * self.flows() + self.held()
    }

    /// What is counted now, with `send_buffered` and `recv_buffered` from the association.
    pub fn accounted(&self, send_buffered: u64, recv_buffered: u64) -> u64 {
        self.overhead() + send_buffered + recv_buffered
    }

    /// What the send buffers may hold in all: what the budget leaves after the overhead and
    /// the receive reserve, within the send side's share.
    pub fn send_pool(&self) -> u64 {
        let budget = self.budget();
        budget
            .saturating_sub(self.receive_reserve.load(Ordering::Relaxed))
            .saturating_sub(self.overhead())
            .min(send_cap(budget))
    }

    /// Bytes the send buffers may still take: the pool less `send_buffered`.
    pub fn send_room(&self, send_buffered: u64) -> u64 {
        self.send_pool().saturating_sub(send_buffered)
    }

    /// The most one flow may buffer to send while the send buffers hold `send_buffered`:
    /// `None` while they fill less than half the pool (a flow takes what is free), then
    /// a quarter of the pool split over the open flows, and never less than
    /// [`SHARE_FLOOR`]. Flows over it wait, so that flows whose clients stopped reading
    /// cannot take what the pool has left from flows that move or are still to come.
    pub fn flow_share(&self, send_buffered: u64) -> Option<u64> {
        let pool = self.send_pool();
        (send_buffered > pool / 2).then(|| (pool / 4 / self.flows().max(1)).max(SHARE_FLOOR))
    }

    /// Whether one more flow, bringing `first` bytes to send, fits.
    pub fn admits_flow(&self, send_buffered: u64, first: u64) -> bool {
        self.send_room(send_buffered) >= PER_FLOW + first
    }

    /// Counts a flow until the charge is dropped.
    pub fn charge_flow(self: &Arc<Self>) -> FlowCharge {
        self.flows.fetch_add(1, Ordering::Relaxed);
        FlowCharge {
            memory: self.clone(),
            slot: None,
        }
    }

    pub fn hold(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn release(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// One flow's share of [`PER_FLOW`], returned when the flow's task ends, and with it the
/// flow's place among the gateway's open flows.
#[derive(Debug)]
pub struct FlowCharge {
    memory: Arc<MemoryAccount>,
    slot: Option<OpenFlow>,
}

impl FlowCharge {
    /// Keeps `slot` for as long as the charge: the flow's task holds one thing to its end.
    pub fn with_slot(mut self, slot: OpenFlow) -> FlowCharge {
        self.slot = Some(slot);
        self
    }
}

impl Drop for FlowCharge {
    fn drop(&mut self) {
        self.memory.flows.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
