//! The running count the gateway admits flows and bytes against, by the formula of
//! `limits.memory_budget` (`config::budget`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::budget::{send_cap, PER_FLOW};
use crate::tunnel::flowcount::OpenFlow;

/// The least a flow's quota of a contended send pool comes to: a few datagrams, so that a
/// flow that moves does not go out in slivers however many flows are open.
pub const QUOTA_FLOOR: u64 = 4 * 1024;

/// The running count, one per gateway: the budget is the process's, whatever the number
/// of peers. Flows and relay-held bytes are tracked here; the transport's send buffers are
/// counted by each association, and each peer reports its own into `send_buffered` so that
/// a peer admits against what every peer buffers.
#[derive(Debug)]
pub struct MemoryAccount {
    budget: AtomicU64,
    /// Follows the associations: a reload may add and remove peers.
    receive_reserve: AtomicU64,
    fixed: u64,
    flows: AtomicU64,
    /// Payload taken out of the transport and not yet written to TCP.
    held: AtomicU64,
    /// Every peer's send buffers, as each last reported them.
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

    /// Every peer's send buffers, as last reported with [`MemoryAccount::report_send`].
    pub fn send_buffered(&self) -> u64 {
        self.send_buffered.load(Ordering::Relaxed)
    }

    /// A peer's send buffers went from `was` to `now` bytes.
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
    /// the receive reserve, within the send side's quota.
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
    /// [`QUOTA_FLOOR`]. Flows over it wait, so that flows whose clients stopped reading
    /// cannot take what the pool has left from flows that move or are still to come.
    pub fn flow_quota(&self, send_buffered: u64) -> Option<u64> {
        let pool = self.send_pool();
        (send_buffered > pool / 2).then(|| (pool / 4 / self.flows().max(1)).max(QUOTA_FLOOR))
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

/// One flow's part of [`PER_FLOW`], returned when the flow's task ends, and with it the
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

/// A peer's quota of the send side of `budget` when `peers` divide it.
pub fn peer_send_quota(budget: u64, peers: usize) -> u64 {
    send_cap(budget) / peers.max(1) as u64
}

/// What the receive side holds of `budget` for the associations of `configs`: each window
/// is sized within the receive half of the budget (config.rs), and their sum is held to
/// that half too, so that the send side keeps its half however many peers there are.
pub fn receive_reserve<'a>(
    budget: u64,
    configs: impl Iterator<Item = &'a pep_transport::Config>,
) -> u64 {
    let windows: u64 = configs.map(|c| c.assoc_window).sum();
    windows.min(budget - send_cap(budget))
}

#[cfg(test)]
mod tests;
