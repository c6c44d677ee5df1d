//! The association shared between its driver and the flow relays: one lock around the
//! sans-IO core, a slot per live flow with the signal its relay waits on, and the memory
//! budget that bounds what all relays together may buffer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pep_transport::{
    Association, FlowError, FlowId, FlowMeta, OpenError, ReadOutcome, ResetReason,
};
use tokio::sync::Notify;

use crate::memory::{FlowCharge, MemoryAccount};
use crate::metrics::AssociationState;

/// What a relay waits on: the driver pokes it when its flow becomes readable or writable,
/// is reset, or is released.
#[derive(Default)]
pub struct FlowSignal {
    pub notify: Notify,
    reset: Mutex<Option<ResetReason>>,
}

impl FlowSignal {
    pub fn reset_reason(&self) -> Option<ResetReason> {
        *self.reset.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_reset(&self, reason: ResetReason) {
        let mut r = self.reset.lock().unwrap_or_else(|p| p.into_inner());
        r.get_or_insert(reason);
    }
}

struct FlowSlot {
    token: u64,
    signal: Arc<FlowSignal>,
}

/// A relay's handle on its flow. The token tells this flow from a later one that reuses
/// the id after the association restarted.
pub struct FlowRef {
    pub id: FlowId,
    token: u64,
    pub signal: Arc<FlowSignal>,
}

/// The flow is no longer in the association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowGone {
    Reset(ResetReason),
    /// Released after a clean close in both directions.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenRefused {
    FlowLimit,
    MemoryBudget,
}

pub struct State {
    pub assoc: Association,
    flows: HashMap<FlowId, FlowSlot>,
    next_token: u64,
    /// Relays waiting for the global send budget.
    budget_waiters: Vec<Arc<FlowSignal>>,
}

pub struct Hub {
    state: Mutex<State>,
    /// Wakes the driver: something was queued for sending.
    pub driver_wake: Notify,
    /// The memory budget and what counts against it; the budget changes on reload.
    pub memory: Arc<MemoryAccount>,
    pub counters: Counters,
}

/// Relay-side counters the metrics read.
#[derive(Default)]
pub struct Counters {
    pub flows_intercepted: AtomicU64,
    pub flows_from_peer: AtomicU64,
    pub flows_refused: AtomicU64,
    pub flows_bypassed: AtomicU64,
    /// Read from local TCP connections into flows.
    pub bytes_to_peer: AtomicU64,
    /// Written from flows to local TCP connections.
    pub bytes_from_peer: AtomicU64,
    /// Upstream connects that failed, by the reset they became.
    pub connect_errors: ByReason,
    /// Flows reset, by reason (either side's).
    pub flow_resets: ByReason,
    /// Relays running (their TCP connection still open).
    pub relays_active: AtomicU64,
    pub accept_errors: AtomicU64,
    pub inspect_errors: AtomicU64,
    /// Datagrams on the tunnel socket from anyone but the peer.
    pub foreign_datagrams: AtomicU64,
    /// Handshakes completed; every one after the first is a re-establishment.
    pub associations_established: AtomicU64,
    association_state: std::sync::atomic::AtomicU8,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn set_state(&self, s: AssociationState) {
        self.association_state.store(s as u8, Ordering::Relaxed);
    }

    pub fn state(&self) -> AssociationState {
        let i = usize::from(self.association_state.load(Ordering::Relaxed));
        AssociationState::ALL.get(i).copied().unwrap_or_default()
    }
}

/// One counter per reset reason code the transport defines.
#[derive(Default)]
pub struct ByReason([AtomicU64; 10]);

impl ByReason {
    pub fn add(&self, reason: ResetReason) {
        let i = usize::from(reason.code()).min(self.0.len() - 1);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// (label, count) for every known reason; unknown codes count as "other".
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        const LABELS: [&str; 10] = [
            "aborted",
            "refused",
            "unreachable",
            "timeout",
            "peer_restart",
            "outage_limit",
            "resource_limit",
            "protocol",
            "closed",
            "other",
        ];
        LABELS
            .iter()
            .zip(&self.0)
            .map(|(l, c)| (*l, c.load(Ordering::Relaxed)))
            .collect()
    }
}

impl Hub {
    /// What the metrics endpoint serves at this instant.
    pub fn snapshot(&self) -> crate::metrics::Snapshot {
        use crate::metrics::{RelaySnapshot, Snapshot};
        let (stats, send, recv) = {
            let st = self.lock();
            (
                st.assoc.stats(),
                st.assoc.send_buffered(),
                st.assoc.recv_buffered(),
            )
        };
        let c = &self.counters;
        let get = Counters::get;
        Snapshot {
            stats,
            association: c.state(),
            association_restarts: get(&c.associations_established).saturating_sub(1),
            relay: RelaySnapshot {
                flows_active: get(&c.relays_active),
                flows_intercepted_total: get(&c.flows_intercepted),
                flows_from_peer_total: get(&c.flows_from_peer),
                flows_refused_total: get(&c.flows_refused),
                flows_bypassed_total: get(&c.flows_bypassed),
                bytes_to_peer_total: get(&c.bytes_to_peer),
                bytes_from_peer_total: get(&c.bytes_from_peer),
                connect_errors: c.connect_errors.snapshot(),
                intercept_errors: vec![
                    ("accept", get(&c.accept_errors)),
                    ("inspect", get(&c.inspect_errors)),
                ],
                flow_resets: c.flow_resets.snapshot(),
            },
            memory_in_use_bytes: send + recv,
            memory_accounted_bytes: self.memory.accounted(send, recv),
            memory_budget_bytes: self.memory.budget(),
            tunnel_foreign_datagrams: get(&c.foreign_datagrams),
            build_info: (env!("CARGO_PKG_VERSION"), pep_transport::PROTOCOL_VERSION),
        }
    }

    pub fn new(assoc: Association, memory: Arc<MemoryAccount>) -> Hub {
        Hub {
            state: Mutex::new(State {
                assoc,
                flows: HashMap::new(),
                next_token: 0,
                budget_waiters: Vec::new(),
            }),
            driver_wake: Notify::new(),
            memory,
            counters: Counters::default(),
        }
    }

    pub fn set_memory_budget(&self, bytes: u64) {
        self.memory.set_budget(bytes);
        self.driver_wake.notify_one();
    }

    /// Counts a flow against the budget for as long as the charge lives.
    pub fn charge_flow(&self) -> FlowCharge {
        self.memory.charge_flow()
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A relay that panicked while holding the lock leaves a consistent association (its
        // calls are all-or-nothing), so the poison is not worth taking the daemon down.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a flow for an intercepted connection; `first` rides with the open. The flow
    /// counts against the budget until the returned charge is dropped.
    pub fn open(&self, meta: FlowMeta, first: &[u8]) -> Result<(FlowRef, FlowCharge), OpenRefused> {
        let mut st = self.lock();
        if !self
            .memory
            .admits_flow(st.assoc.send_buffered(), first.len() as u64)
        {
            return Err(OpenRefused::MemoryBudget);
        }
        let id = st.assoc.open_flow(meta).map_err(|e| match e {
            OpenError::TooManyFlows => OpenRefused::FlowLimit,
        })?;
        let flow = st.insert_slot(id);
        if !first.is_empty() {
            // A new flow's send buffer holds far more than one read.
            if let Ok(n) = st.assoc.write(id, first) {
                Counters::add(&self.counters.bytes_to_peer, n as u64);
            }
        }
        // Charged under the lock, so concurrent opens cannot all pass the check above.
        let charge = self.charge_flow();
        drop(st);
        self.driver_wake.notify_one();
        Ok((flow, charge))
    }

    /// Bytes a relay may hand to the flow now: its own room, within the global budget.
    pub fn write_room(&self, flow: &FlowRef) -> Result<usize, FlowGone> {
        let mut st = self.lock();
        st.check(flow)?;
        let room = st.assoc.send_capacity(flow.id) as u64;
        let left = self.memory.send_room(st.assoc.send_buffered());
        if left == 0 && room > 0 {
            // Woken by the driver when acknowledgements free budget.
            st.budget_waiters.push(flow.signal.clone());
        }
        Ok(room.min(left) as usize)
    }

    pub fn write(&self, flow: &FlowRef, data: &[u8]) -> Result<usize, FlowGone> {
        let mut st = self.lock();
        st.check(flow)?;
        let n = st.assoc.write(flow.id, data).map_err(|e| gone(e, flow))?;
        drop(st);
        self.driver_wake.notify_one();
        Ok(n)
    }

    pub fn finish(&self, flow: &FlowRef) -> Result<(), FlowGone> {
        let mut st = self.lock();
        st.check(flow)?;
        st.assoc.finish(flow.id).map_err(|e| gone(e, flow))?;
        drop(st);
        self.driver_wake.notify_one();
        Ok(())
    }

    pub fn read(&self, flow: &FlowRef, max: usize) -> Result<ReadOutcome, FlowGone> {
        let mut st = self.lock();
        st.check(flow)?;
        let r = st.assoc.read(flow.id, max).map_err(|e| gone(e, flow))?;
        drop(st);
        if matches!(r, ReadOutcome::Data(_) | ReadOutcome::Finished) {
            // Reading may have opened credit the peer is waiting for.
            self.driver_wake.notify_one();
        }
        Ok(r)
    }

    /// Aborts the flow towards the peer (the local TCP side is the caller's to reset).
    pub fn reset(&self, flow: &FlowRef, reason: ResetReason) {
        let mut st = self.lock();
        if st.check(flow).is_ok() && st.assoc.reset(flow.id, reason).is_ok() {
            self.counters.flow_resets.add(reason);
        }
        flow.signal.set_reset(reason);
        drop(st);
        self.driver_wake.notify_one();
    }
}

fn gone(e: FlowError, flow: &FlowRef) -> FlowGone {
    match e {
        FlowError::Reset(r) => FlowGone::Reset(r),
        FlowError::UnknownFlow | FlowError::Finished => flow
            .signal
            .reset_reason()
            .map_or(FlowGone::Closed, FlowGone::Reset),
    }
}

impl State {
    fn check(&self, flow: &FlowRef) -> Result<(), FlowGone> {
        if let Some(r) = flow.signal.reset_reason() {
            return Err(FlowGone::Reset(r));
        }
        match self.flows.get(&flow.id) {
            Some(slot) if slot.token == flow.token => Ok(()),
            _ => Err(FlowGone::Closed),
        }
    }

    /// Registers the relay side of a flow the association knows.
    pub fn insert_slot(&mut self, id: FlowId) -> FlowRef {
        let token = self.next_token;
        self.next_token += 1;
        let signal = Arc::new(FlowSignal::default());
        self.flows.insert(
            id,
            FlowSlot {
                token,
                signal: signal.clone(),
            },
        );
        FlowRef { id, token, signal }
    }

    /// Whether a flow the peer opened fits the budget (it is reset when not).
    pub fn admits_peer_flow(&self, memory: &MemoryAccount) -> bool {
        memory.admits_flow(self.assoc.send_buffered(), 0)
    }

    pub fn signal_flow(&self, id: FlowId) {
        if let Some(slot) = self.flows.get(&id) {
            slot.signal.notify.notify_one();
        }
    }

    pub fn flow_reset(&self, id: FlowId, reason: ResetReason) {
        if let Some(slot) = self.flows.get(&id) {
            slot.signal.set_reset(reason);
            slot.signal.notify.notify_one();
        }
    }

    pub fn flow_closed(&mut self, id: FlowId) {
        if let Some(slot) = self.flows.remove(&id) {
            slot.signal.notify.notify_one();
        }
    }

    /// Wakes relays that waited for budget, once a read's worth is free again.
    pub fn wake_budget_waiters(&mut self, memory: &MemoryAccount, chunk: u64) {
        if self.budget_waiters.is_empty() {
            return;
        }
        let buffered = self.assoc.send_buffered();
        let room = memory.send_room(buffered);
        // With nothing left to acknowledge, no more will free up here: hand out what there is.
        if room == 0 || (room < chunk && buffered > 0) {
            return;
        }
        for s in self.budget_waiters.drain(..) {
            s.notify.notify_one();
        }
    }
}
