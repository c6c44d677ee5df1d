//! One peer's association shared between the driver and the flow relays: one lock around
//! the sans-IO core, a slot per live flow with the signal its relay waits on, this peer's
//! quota of the send buffers, and the gateway's memory account every peer charges.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pep_transport::{
    Association, AssociationTimes, FlowError, FlowId, FlowInfo, FlowMeta, OpenError, PeerId,
    ReadOutcome, ResetReason, TrafficClassId,
};
use tokio::sync::Notify;

use crate::tunnel::memory::{FlowCharge, MemoryAccount};
use crate::tunnel::stamp::Stamp;

/// Where the association stands, as the `pepd_association_state` gauge shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AssociationState {
    /// Handshaking, or re-establishing after the association was lost.
    #[default]
    Connecting,
    Established,
    /// Established, but the peer has stopped answering (satellite link outage).
    Outage,
    /// Shut down for good (the daemon is stopping).
    Closed,
}

impl AssociationState {
    /// Every state, in the order the gauge lists them: a query can rely on each label value
    /// being present in every scrape.
    pub const ALL: [AssociationState; 4] = [
        AssociationState::Connecting,
        AssociationState::Established,
        AssociationState::Outage,
        AssociationState::Closed,
    ];

    /// The `state` label value.
    pub fn label(self) -> &'static str {
        match self {
            AssociationState::Connecting => "connecting",
            AssociationState::Established => "established",
            AssociationState::Outage => "outage",
            AssociationState::Closed => "closed",
        }
    }
}

/// Bytes the association buffers to send beyond what the link carries in a round trip and
/// this long mean its flows wait on the link, not on their applications or the CPU.
const LINK_WAIT: Duration = Duration::from_millis(100);

/// What a relay compressing a flow sees of the link and the budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendConditions {
    /// The association buffers more than the link carries in a round trip and 100 ms.
    pub link_bound: bool,
    /// The association's pacing rate, bit/s.
    pub link_bps: u64,
    /// The memory budget has room for one more block held by the relay.
    pub memory_room: bool,
}

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
    /// When the relay side of the flow began.
    opened: Instant,
}

/// One open flow as a report shows it.
#[derive(Debug, Clone, Copy)]
pub struct FlowView {
    pub id: FlowId,
    pub opened: Instant,
    pub info: FlowInfo,
}

/// What a report reads of a peer's association besides its stats, under the same lock.
#[derive(Debug, Clone, Copy)]
pub struct AssociationView {
    /// When it was taken, which the times are read against.
    pub taken: Instant,
    pub times: AssociationTimes,
    /// Its configured rate: the peer's `tx_rate` (its MIR) as a reload last set it.
    pub tx_bps: u64,
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
    /// `limits.max_flows` are open across the peers.
    GatewayFlowLimit,
    MemoryBudget,
    /// The peer has not associated yet (its address is learned from its initiation).
    NotAssociated,
}

pub struct PeerState {
    /// `None` until the peer's first authenticated initiation for a peer whose address
    /// is not configured (it is learned from that initiation).
    pub assoc: Option<Association>,
    flows: HashMap<FlowId, FlowSlot>,
    next_token: u64,
    /// Relays waiting for the global send budget.
    budget_waiters: Vec<Arc<FlowSignal>>,
    /// Some flow waits for its quota of the contended send budget (the association wakes
    /// each as its data is acknowledged, [`PeerState::lift_quotas`] all once it is over).
    quota_waiting: bool,
    /// The association's send buffers as last reported to the memory account.
    send_reported: u64,
    /// Relays whose client has taken nothing for `limits.stalled_flow_timeout`, waiting
    /// for contention to reset their flow (see [`Peer::reset_if_stalled`]).
    stalled: HashMap<FlowId, Arc<FlowSignal>>,
    /// Flows reset by a move to another hub since the last move was reported (the resets
    /// come first, then the move).
    handover_resets: u64,
}

/// One peer of the gateway: its association behind a lock of its own, so relays of
/// different peers never contend, and the flows relayed over it.
pub struct Peer {
    pub id: PeerId,
    /// The peer's name, for logs.
    pub name: Arc<str>,
    state: Mutex<PeerState>,
    /// Wakes the driver (shared by every peer of the gateway).
    wake: Arc<Notify>,
    /// Set by [`Peer::wake`] until the driver services the peer.
    queued: AtomicBool,
    /// Relays of this peer wait for budget (which another peer's acknowledgements may free).
    budget_waiting: AtomicBool,
    /// This peer's quota of the send side of the budget, so that one peer cannot take all
    /// of it (the receive side is bounded by the windows we advertise); changes on reload.
    send_budget: AtomicU64,
    /// A reload's new `min_rate` and `weight` for the carrier scheduler, which the driver
    /// owns: it takes them at its next refresh of the ceilings.
    pending_share: Mutex<Option<ShareRates>>,
    /// The `tx_rate` a reload set, 0 if none: an association made after the reload (a peer
    /// whose address is learned) starts from it rather than from the config at start.
    reloaded_tx_bps: AtomicU64,
    /// The keepalive a reload set, likewise.
    reloaded_keepalive: Mutex<Option<Duration>>,
    /// The `max_flows` a reload set, 0 if none, likewise.
    reloaded_max_flows: AtomicUsize,
    /// The gateway's memory account, shared by every peer: the budget is process-wide.
    pub memory: Arc<MemoryAccount>,
    pub counters: PeerCounters,
    /// Its place on a hub's shared carrier, as the driver last capped it.
    pub carrier: CarrierPlace,
}

/// A peer's place on a hub's shared carrier as the driver last set its ceiling (at each
/// refresh of the allocations): what it is allocated, with the CIR and weight that got it
/// that. Never recorded for a pair's peer, which has the carrier to itself.
#[derive(Default)]
pub struct CarrierPlace {
    allocated_bps: AtomicU64,
    cir_bps: AtomicU64,
    /// 0 until recorded (the scheduler counts every weight as at least 1).
    weight: AtomicU32,
}

/// What [`CarrierPlace`] last recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub allocated_bps: u64,
    pub cir_bps: u64,
    pub weight: u32,
}

impl CarrierPlace {
    pub fn record(&self, a: Allocation) {
        self.allocated_bps.store(a.allocated_bps, Ordering::Relaxed);
        self.cir_bps.store(a.cir_bps, Ordering::Relaxed);
        self.weight.store(a.weight.max(1), Ordering::Relaxed);
    }

    /// `None` until the driver has given the peer a share of a shared carrier.
    pub fn get(&self) -> Option<Allocation> {
        let weight = self.weight.load(Ordering::Relaxed);
        (weight > 0).then(|| Allocation {
            allocated_bps: self.allocated_bps.load(Ordering::Relaxed),
            cir_bps: self.cir_bps.load(Ordering::Relaxed),
            weight,
        })
    }
}

/// What a peer is guaranteed and how it shares the spare carrier; its MIR is its
/// association's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRates {
    pub min_bps: u64,
    pub weight: u32,
}

/// Relay-side counters of one peer the metrics read.
#[derive(Default)]
pub struct PeerCounters {
    pub flows_from_peer: AtomicU64,
    /// Read from local TCP connections into flows.
    pub bytes_to_peer: AtomicU64,
    /// Written from flows to local TCP connections.
    pub bytes_from_peer: AtomicU64,
    /// Upstream connects that failed, by the reset they became.
    pub connect_errors: ByReason,
    /// Flows reset, by reason (either side's).
    pub flow_resets: ByReason,
    /// New flows either side opened that the memory budget had no room for.
    pub flows_over_budget: AtomicU64,
    /// New flows either side opened while `limits.max_flows` were open across the peers.
    pub flows_over_gateway: AtomicU64,
    /// Flows reset because their local TCP side took nothing for
    /// `limits.stalled_flow_timeout` under contention (also in `flow_resets`).
    pub flows_reset_stalled: AtomicU64,
    /// Relays running (their TCP connection still open).
    pub relays_active: AtomicU64,
    /// What the relays of compressed flows did.
    pub compression: CompressionCounters,
    /// Handshakes completed; every one after the first is a re-establishment.
    pub associations_established: AtomicU64,
    association_state: std::sync::atomic::AtomicU8,
    /// When the association entered its state.
    state_since: Stamp,
}

impl PeerCounters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Adds `from`'s counters to these (not the gauges: relays running, state). Every field
    /// is named, so one added to the struct fails to compile here until it is decided
    /// whether it adds up.
    pub fn add_totals(&self, from: &PeerCounters) {
        let PeerCounters {
            flows_from_peer,
            bytes_to_peer,
            bytes_from_peer,
            connect_errors,
            flow_resets,
            flows_over_budget,
            flows_over_gateway,
            flows_reset_stalled,
            relays_active: _,
            compression,
            associations_established,
            association_state: _,
            state_since: _,
        } = from;
        let add = |to: &AtomicU64, from: &AtomicU64| Self::add(to, Self::get(from));
        add(&self.flows_from_peer, flows_from_peer);
        add(&self.bytes_to_peer, bytes_to_peer);
        add(&self.bytes_from_peer, bytes_from_peer);
        add(&self.flows_over_budget, flows_over_budget);
        add(&self.flows_over_gateway, flows_over_gateway);
        add(&self.flows_reset_stalled, flows_reset_stalled);
        add(&self.associations_established, associations_established);
        self.connect_errors.add_counts(connect_errors);
        self.flow_resets.add_counts(flow_resets);
        self.compression.add_totals(compression);
    }

    pub fn set_state(&self, s: AssociationState) {
        let was = self.association_state.swap(s as u8, Ordering::Relaxed);
        if was != s as u8 || self.state_since.get().is_none() {
            self.state_since.set(Instant::now());
        }
    }

    /// When the association entered the state it is in; `None` before a state was first
    /// set.
    pub fn state_since(&self) -> Option<Instant> {
        self.state_since.get()
    }

    pub fn state(&self) -> AssociationState {
        let i = usize::from(self.association_state.load(Ordering::Relaxed));
        AssociationState::ALL.get(i).copied().unwrap_or_default()
    }
}

/// The relays' compression of one peer's flows (those whose streams are blocks): bytes
/// before and after, blocks by treatment, CPU time, refused blocks by reason.
#[derive(Default)]
pub struct CompressionCounters {
    /// Application bytes read from TCP into blocks.
    pub plain_sent: AtomicU64,
    /// Bytes of those blocks, headers included: what the flows carried.
    pub blocks_sent: AtomicU64,
    /// Bytes of blocks taken from the flows.
    pub blocks_received: AtomicU64,
    /// Application bytes they decoded to, written towards TCP.
    pub plain_received: AtomicU64,
    /// Blocks sent raw, compressed at the fast and at the hard level.
    pub sent_raw: AtomicU64,
    pub sent_fast: AtomicU64,
    pub sent_hard: AtomicU64,
    /// Blocks sent raw because the memory budget had no room for a compressed one.
    pub over_budget: AtomicU64,
    pub compress_ns: AtomicU64,
    pub decompress_ns: AtomicU64,
    /// Flows reset for blocks the peer sent that were refused, by
    /// `pep_compress::BlockError::REASONS`.
    pub refused: [AtomicU64; pep_compress::BlockError::REASONS.len()],
}

impl CompressionCounters {
    /// Counts a flow reset for a refused block.
    pub fn refuse(&self, reason: &str) {
        if let Some(i) = pep_compress::BlockError::REASONS
            .iter()
            .position(|r| *r == reason)
        {
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn add_totals(&self, from: &CompressionCounters) {
        let CompressionCounters {
            plain_sent,
            blocks_sent,
            blocks_received,
            plain_received,
            sent_raw,
            sent_fast,
            sent_hard,
            over_budget,
            compress_ns,
            decompress_ns,
            refused,
        } = from;
        let add = |to: &AtomicU64, from: &AtomicU64| PeerCounters::add(to, PeerCounters::get(from));
        add(&self.plain_sent, plain_sent);
        add(&self.blocks_sent, blocks_sent);
        add(&self.blocks_received, blocks_received);
        add(&self.plain_received, plain_received);
        add(&self.sent_raw, sent_raw);
        add(&self.sent_fast, sent_fast);
        add(&self.sent_hard, sent_hard);
        add(&self.over_budget, over_budget);
        add(&self.compress_ns, compress_ns);
        add(&self.decompress_ns, decompress_ns);
        for (to, from) in self.refused.iter().zip(refused) {
            add(to, from);
        }
    }
}

/// Each reset reason's name in metrics and reports, by its code; the last for codes this
/// version does not know.
const RESET_LABELS: [&str; 11] = [
    "aborted",
    "refused",
    "unreachable",
    "timeout",
    "peer_restart",
    "outage_limit",
    "resource_limit",
    "protocol",
    "closed",
    "handover",
    "other",
];

/// `reason`'s name, as the `reason` label of the reset counters has it.
pub fn reset_label(reason: ResetReason) -> &'static str {
    let i = usize::from(reason.code()).min(RESET_LABELS.len() - 1);
    RESET_LABELS[i]
}

/// One counter per reset reason code the transport defines.
#[derive(Default)]
pub struct ByReason([AtomicU64; 11]);

impl ByReason {
    pub fn add(&self, reason: ResetReason) {
        let i = usize::from(reason.code()).min(self.0.len() - 1);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_counts(&self, from: &ByReason) {
        for (to, from) in self.0.iter().zip(&from.0) {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// (label, count) for every known reason; unknown codes count as "other".
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        RESET_LABELS
            .iter()
            .zip(&self.0)
            .map(|(l, c)| (*l, c.load(Ordering::Relaxed)))
            .collect()
    }
}

impl Peer {
    /// `assoc`: made at start for a peer whose address is configured, else later by the
    /// driver. `memory`: the gateway's. `wake`: the driver's.
    pub fn new(
        id: PeerId,
        name: &str,
        assoc: Option<Association>,
        send_budget: u64,
        memory: Arc<MemoryAccount>,
        wake: Arc<Notify>,
    ) -> Peer {
        let counters = PeerCounters::default();
        // Connecting from now: a peer a reload adds has not been since the daemon started.
        counters.set_state(AssociationState::Connecting);
        Peer {
            id,
            name: name.into(),
            state: Mutex::new(PeerState {
                assoc,
                flows: HashMap::new(),
                next_token: 0,
                budget_waiters: Vec::new(),
                quota_waiting: false,
                send_reported: 0,
                stalled: HashMap::new(),
                handover_resets: 0,
            }),
            wake,
            queued: AtomicBool::new(false),
            budget_waiting: AtomicBool::new(false),
            send_budget: AtomicU64::new(send_budget),
            pending_share: Mutex::new(None),
            reloaded_tx_bps: AtomicU64::new(0),
            reloaded_keepalive: Mutex::new(None),
            reloaded_max_flows: AtomicUsize::new(0),
            memory,
            counters,
            carrier: CarrierPlace::default(),
        }
    }

    /// Has the driver give the carrier scheduler this peer's new CIR and weight.
    pub fn set_share_rates(&self, rates: ShareRates) {
        *self.pending_share.lock().unwrap_or_else(|p| p.into_inner()) = Some(rates);
        self.wake();
    }

    /// The CIR and weight a reload set since the driver last looked, if any.
    pub fn take_share_rates(&self) -> Option<ShareRates> {
        self.pending_share
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Sets this peer's `tx_rate` as a reload changed it, on its association if it has one
    /// and on the one made later if not.
    pub fn set_tx_rate(&self, bps: u64) {
        self.reloaded_tx_bps.store(bps, Ordering::Relaxed);
        if let Some(a) = self.lock().assoc.as_mut() {
            a.set_rate(bps);
        }
        self.wake();
    }

    /// The `tx_rate` a reload set, if any.
    fn reloaded_tx_rate(&self) -> Option<u64> {
        Some(self.reloaded_tx_bps.load(Ordering::Relaxed)).filter(|&bps| bps > 0)
    }

    /// Sets this peer's keepalive as a reload changed it, as [`set_tx_rate`](Self::set_tx_rate).
    pub fn set_keepalive(&self, interval: Duration) {
        *self
            .reloaded_keepalive
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(interval);
        if let Some(a) = self.lock().assoc.as_mut() {
            a.set_keepalive(interval);
        }
        self.wake();
    }

    /// Sets how many flows this peer may have open, as [`set_tx_rate`](Self::set_tx_rate):
    /// flows open above it stay, new ones are refused until fewer are open.
    pub fn set_max_flows(&self, max_flows: usize) {
        self.reloaded_max_flows.store(max_flows, Ordering::Relaxed);
        if let Some(a) = self.lock().assoc.as_mut() {
            a.set_max_flows(max_flows);
        }
        self.wake();
    }

    /// What a reload set, on an association made since.
    pub fn apply_reloaded(&self, assoc: &mut Association) {
        match self.reloaded_max_flows.load(Ordering::Relaxed) {
            0 => {}
            max_flows => assoc.set_max_flows(max_flows),
        }
        if let Some(bps) = self.reloaded_tx_rate() {
            assoc.set_rate(bps);
        }
        let keepalive = *self
            .reloaded_keepalive
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(interval) = keepalive {
            assoc.set_keepalive(interval);
        }
    }

    /// Asks the driver to service this peer: something was queued or freed.
    pub fn wake(&self) {
        self.queued.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Whether relays of this peer wait for budget to free.
    pub fn waits_for_budget(&self) -> bool {
        self.budget_waiting.load(Ordering::Relaxed)
    }

    /// Whether the peer asked to be serviced since the last call.
    pub fn take_queued(&self) -> bool {
        self.queued.swap(false, Ordering::AcqRel)
    }

    /// (transport stats, bytes buffered to send, bytes buffered received) of the
    /// association, once there is one.
    pub fn stats(&self) -> Option<(pep_transport::Stats, u64, u64)> {
        let st = self.lock();
        let a = st.assoc.as_ref()?;
        Some((a.stats(), a.send_buffered(), a.recv_buffered()))
    }

    /// When things last happened to the association and its configured rate, once there is
    /// one.
    pub fn association_view(&self) -> Option<AssociationView> {
        let st = self.lock();
        let a = st.assoc.as_ref()?;
        Some(AssociationView {
            taken: Instant::now(),
            times: a.times(),
            tx_bps: a.config().rate_bps,
        })
    }

    /// The flows open with this peer (the relays' side of them), in no order.
    pub fn flows(&self) -> Vec<FlowView> {
        let st = self.lock();
        let Some(a) = st.assoc.as_ref() else {
            return Vec::new();
        };
        st.flows
            .iter()
            .filter_map(|(&id, slot)| {
                Some(FlowView {
                    id,
                    opened: slot.opened,
                    info: a.flow_info(id)?,
                })
            })
            .collect()
    }

    /// Where the association sends now, if it knows.
    pub fn remote(&self) -> Option<std::net::SocketAddr> {
        self.lock().assoc.as_ref().and_then(Association::remote)
    }

    /// Which hub of a terminal's address list serves it (0: the preferred); `None` without
    /// a list.
    pub fn hub_rank(&self) -> Option<u64> {
        self.lock()
            .assoc
            .as_ref()
            .and_then(Association::hub_rank)
            .map(|r| r as u64)
    }

    pub fn send_budget(&self) -> u64 {
        self.send_budget.load(Ordering::Relaxed)
    }

    pub fn set_send_budget(&self, bytes: u64) {
        self.send_budget.store(bytes, Ordering::Relaxed);
        self.wake();
    }

    /// Counts a flow against the gateway's budget for as long as the charge lives.
    pub fn charge_flow(&self) -> FlowCharge {
        self.memory.charge_flow()
    }

    pub fn lock(&self) -> MutexGuard<'_, PeerState> {
        // A relay that panicked while holding the lock leaves a consistent association (its
        // calls are all-or-nothing), so the poison is not worth taking the daemon down.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a flow for an intercepted connection; `first` rides with the open (the caller
    /// counts the application bytes it carries). The flow counts against the budget until
    /// the returned charge is dropped.
    pub fn open(&self, meta: FlowMeta, first: &[u8]) -> Result<(FlowRef, FlowCharge), OpenRefused> {
        self.open_in_class(meta, 0, first)
    }

    /// [`open`](Self::open) in traffic class `class`.
    pub fn open_in_class(
        &self,
        meta: FlowMeta,
        class: TrafficClassId,
        first: &[u8],
    ) -> Result<(FlowRef, FlowCharge), OpenRefused> {
        let mut st = self.lock();
        if st.assoc.is_none() {
            return Err(OpenRefused::NotAssociated);
        }
        if !st.admits_flow(self, first.len() as u64) {
            PeerCounters::add(&self.counters.flows_over_budget, 1);
            return Err(OpenRefused::MemoryBudget);
        }
        let Some(assoc) = st.assoc.as_mut() else {
            return Err(OpenRefused::NotAssociated);
        };
        let id = assoc.open_flow_in_class(meta, class).map_err(|e| match e {
            OpenError::TooManyFlows => OpenRefused::FlowLimit,
        })?;
        // A new flow's send buffer holds far more than one read (or one block of it).
        if !first.is_empty() {
            let _ = assoc.write_at(id, first, Instant::now());
        }
        let flow = st.insert_slot(id);
        st.report_send(&self.memory);
        // Charged under the lock, so concurrent opens cannot all pass the check above.
        let charge = self.charge_flow();
        drop(st);
        self.wake();
        Ok((flow, charge))
    }

    /// What the association's flows may carry compressed, once the peer's HELLO came.
    pub fn compression(&self) -> Option<pep_transport::Compression> {
        self.lock().assoc.as_ref()?.compression()
    }

    /// What a relay compressing `flow` needs to know before its next block of up to
    /// `block` bytes (pep_compress::policy).
    pub fn send_conditions(&self, flow: &FlowRef, block: u64) -> Result<SendConditions, FlowGone> {
        let mut st = self.lock();
        let buffered = st.report_send(&self.memory);
        let assoc = st.flow_assoc(flow)?;
        let link_bps = assoc.pacing_rate_bps();
        // What the link carries in a round trip and 100 ms: beyond that, bytes wait for it.
        let carried = (link_bps / 8) as f64 * (assoc.smoothed_rtt() + LINK_WAIT).as_secs_f64();
        Ok(SendConditions {
            link_bound: buffered as f64 > carried,
            link_bps,
            memory_room: self.memory.send_room(self.memory.send_buffered()) >= block,
        })
    }

    /// Bytes a relay may hand to the flow now: its own room, within the global budget and,
    /// while that is contended, within the flow's quota of it.
    pub fn write_room(&self, flow: &FlowRef) -> Result<usize, FlowGone> {
        let mut st = self.lock();
        let room = st.flow_assoc(flow)?.send_capacity(flow.id) as u64;
        let left = st.send_room(self);
        if left == 0 && room > 0 {
            // Woken by the driver when acknowledgements free budget.
            st.budget_waiters.push(flow.signal.clone());
            self.budget_waiting.store(true, Ordering::Relaxed);
            return Ok(0);
        }
        let quota_left = st.quota_left(self, flow);
        if quota_left == 0 && room > 0 {
            if let Some(a) = st.assoc.as_mut() {
                a.wait_for_quota(flow.id);
            }
            st.quota_waiting = true;
            // Acknowledgements from another peer may end the contention.
            self.budget_waiting.store(true, Ordering::Relaxed);
        }
        Ok(room.min(left).min(quota_left) as usize)
    }

    pub fn write(&self, flow: &FlowRef, data: &[u8]) -> Result<usize, FlowGone> {
        let mut st = self.lock();
        let n = st
            .flow_assoc(flow)?
            .write_at(flow.id, data, Instant::now())
            .map_err(|e| gone(e, flow))?;
        st.report_send(&self.memory);
        drop(st);
        self.wake();
        Ok(n)
    }

    pub fn finish(&self, flow: &FlowRef) -> Result<(), FlowGone> {
        let mut st = self.lock();
        st.flow_assoc(flow)?
            .finish(flow.id)
            .map_err(|e| gone(e, flow))?;
        drop(st);
        self.wake();
        Ok(())
    }

    pub fn read(&self, flow: &FlowRef, max: usize) -> Result<ReadOutcome, FlowGone> {
        let mut st = self.lock();
        let r = st
            .flow_assoc(flow)?
            .read(flow.id, max)
            .map_err(|e| gone(e, flow))?;
        drop(st);
        if matches!(r, ReadOutcome::Data(_) | ReadOutcome::Finished) {
            // Reading may have opened credit the peer is waiting for.
            self.wake();
        }
        Ok(r)
    }

    /// Resets `flow`, whose TCP side has taken none of the bytes waiting for it for
    /// `limits.stalled_flow_timeout`, with `resource_limit` if it holds what other flows
    /// need now (see [`PeerState::contended`]), and says whether it did (the local TCP side
    /// is the caller's to reset). If not, the relay is woken when that changes, and asks
    /// again.
    pub fn reset_if_stalled(&self, flow: &FlowRef) -> Result<bool, FlowGone> {
        let mut st = self.lock();
        st.check(flow)?;
        if !st.contended(self) {
            st.stalled.insert(flow.id, flow.signal.clone());
            return Ok(false);
        }
        st.stalled.remove(&flow.id);
        // Under the lock that saw the flow live: the peer's own reset cannot come between.
        self.reset_locked(&mut st, flow, ResetReason::ResourceLimit);
        PeerCounters::add(&self.counters.flows_reset_stalled, 1);
        drop(st);
        self.wake();
        Ok(true)
    }

    /// Aborts the flow towards the peer (the local TCP side is the caller's to reset).
    pub fn reset(&self, flow: &FlowRef, reason: ResetReason) {
        let mut st = self.lock();
        self.reset_locked(&mut st, flow, reason);
        drop(st);
        self.wake();
    }

    fn reset_locked(&self, st: &mut PeerState, flow: &FlowRef, reason: ResetReason) {
        if st
            .flow_assoc(flow)
            .is_ok_and(|a| a.reset(flow.id, reason).is_ok())
        {
            self.counters.flow_resets.add(reason);
        }
        flow.signal.set_reset(reason);
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

impl PeerState {
    /// The association, for a flow that is still in it.
    fn flow_assoc(&mut self, flow: &FlowRef) -> Result<&mut Association, FlowGone> {
        self.check(flow)?;
        self.assoc.as_mut().ok_or(FlowGone::Closed)
    }

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
                opened: Instant::now(),
            },
        );
        FlowRef { id, token, signal }
    }

    pub fn signal_flow(&self, id: FlowId) {
        if let Some(slot) = self.flows.get(&id) {
            slot.signal.notify.notify_one();
        }
    }

    pub fn flow_reset(&mut self, id: FlowId, reason: ResetReason) {
        if reason == ResetReason::Handover {
            self.handover_resets += 1;
        }
        if let Some(slot) = self.flows.get(&id) {
            slot.signal.set_reset(reason);
            slot.signal.notify.notify_one();
        }
    }

    /// Ends every flow's relay with `reason`: the association that carried them is gone.
    pub fn reset_all_flows(&mut self, reason: ResetReason) {
        for (_, slot) in self.flows.drain() {
            slot.signal.set_reset(reason);
            slot.signal.notify.notify_one();
        }
        self.stalled.clear();
        for s in self.budget_waiters.drain(..) {
            s.notify.notify_one();
        }
    }

    /// The flows a move to another hub reset, since the last call.
    pub fn flows_reset_by_handover(&mut self) -> u64 {
        std::mem::take(&mut self.handover_resets)
    }

    pub fn flow_closed(&mut self, id: FlowId) {
        self.stalled.remove(&id);
        if let Some(slot) = self.flows.remove(&id) {
            slot.signal.notify.notify_one();
        }
    }

    /// Whether flows whose client stopped reading hold what others need: more than half of
    /// this peer's receive window is in use (every flow from the peer shares it), or the
    /// gateway's budget has no room left for a new flow.
    pub fn contended(&mut self, peer: &Peer) -> bool {
        let window = self
            .assoc
            .as_ref()
            .is_some_and(Association::recv_window_contended);
        self.report_send(&peer.memory);
        window || !peer.memory.admits_flow(peer.memory.send_buffered(), 0)
    }

    /// Wakes the relays waiting in [`Peer::reset_if_stalled`] once there is
    /// contention (acknowledgements from another peer change the budget too; this peer's next
    /// service, at the latest its keepalive, sees it).
    pub fn wake_stalled(&mut self, peer: &Peer) {
        if self.stalled.is_empty() || !self.contended(peer) {
            return;
        }
        for (_, s) in self.stalled.drain() {
            s.notify.notify_one();
        }
    }

    /// Tells the memory account what the association buffers to send now (acknowledgements
    /// free it, writes add to it, a new association starts empty); returns it.
    pub fn report_send(&mut self, memory: &MemoryAccount) -> u64 {
        let now = self.assoc.as_ref().map_or(0, Association::send_buffered);
        memory.report_send(self.send_reported, now);
        self.send_reported = now;
        now
    }

    /// Bytes this peer's send buffers may still take: within its send quota, and what
    /// the gateway's budget leaves with every peer's buffers counted.
    fn send_room(&mut self, peer: &Peer) -> u64 {
        let buffered = self.report_send(&peer.memory);
        let quota = peer.send_budget().saturating_sub(buffered);
        quota.min(peer.memory.send_room(peer.memory.send_buffered()))
    }

    /// What `flow` may still buffer to send within its quota of the contended budget
    /// (everything, while the budget is not contended).
    fn quota_left(&self, peer: &Peer, flow: &FlowRef) -> u64 {
        let Some(quota) = peer.memory.flow_quota(peer.memory.send_buffered()) else {
            return u64::MAX;
        };
        let held = self
            .assoc
            .as_ref()
            .map_or(0, |a| a.flow_send_buffered(flow.id));
        quota.saturating_sub(held)
    }

    /// Wakes every flow that waits for its quota once the budget is no longer contended
    /// (before the association's events are polled: the wake-ups are among them).
    pub fn lift_quotas(&mut self, peer: &Peer) {
        if !self.quota_waiting {
            return;
        }
        self.report_send(&peer.memory);
        if peer
            .memory
            .flow_quota(peer.memory.send_buffered())
            .is_some()
        {
            return;
        }
        if let Some(a) = self.assoc.as_mut() {
            a.release_quota_waits();
        }
        self.quota_waiting = false;
        if self.budget_waiters.is_empty() {
            peer.budget_waiting.store(false, Ordering::Relaxed);
        }
    }

    /// Whether one more flow, bringing `first` bytes to send, fits the peer's quota and
    /// the gateway's budget.
    fn admits_flow(&mut self, peer: &Peer, first: u64) -> bool {
        let buffered = self.report_send(&peer.memory);
        peer.memory.admits_flow(peer.memory.send_buffered(), first)
            && buffered + first <= peer.send_budget()
    }

    /// Whether a flow the peer opened fits the budget (it is reset when not).
    pub fn admits_peer_flow(&mut self, peer: &Peer) -> bool {
        self.admits_flow(peer, 0)
    }

    /// Wakes relays that waited for budget, once a read's worth is free again.
    pub fn wake_budget_waiters(&mut self, peer: &Peer, chunk: u64) {
        if self.budget_waiters.is_empty() {
            self.report_send(&peer.memory);
            return;
        }
        let room = self.send_room(peer);
        let buffered = self.send_reported;
        // With nothing left to acknowledge, no more will free up here: hand out what there is.
        if room == 0 || (room < chunk && buffered > 0) {
            return;
        }
        for s in self.budget_waiters.drain(..) {
            s.notify.notify_one();
        }
        peer.budget_waiting
            .store(self.quota_waiting, Ordering::Relaxed);
    }
}
