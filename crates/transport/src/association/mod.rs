//! The association: one per gateway pair, carrying many flows over one datagram path.
//!
//! Sans-IO: `handle_datagram`, `handle_timeout` and the flow calls take input;
//! `poll_transmit`, `poll_timeout` and `poll_event` give output. Time only ever comes in as
//! an argument.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;

use crate::ack::AckTracker;
use crate::cc::{new_controller, AckSummary, AckedPacket, CongestionController, SentInfo};
use crate::codec::{expand_truncated, truncation_len, Reader};
use crate::config::{Config, Initiate, InvalidConfig, LossCause};
use crate::datagram_size::{DatagramSizer, HEADER};
use crate::flow::{Flow, OpenState, ResetState};
use crate::frame::{self, AckFrame, FlowMeta, Frame, ImplicitData, ResetReason};
use crate::ids::{ConnectionId, FlowId, PeerId};
use crate::loss::LossClassifier;
use crate::pacer::Pacer;
use crate::packet::{
    decode_header, decode_header_with_cid, Header, Hello, HelloParams, ShortHeader,
};
use crate::range_set::RangeSet;
use crate::reordering::Reordering;
use crate::return_path::ReturnPath;
use crate::rtt::RttEstimator;
use crate::security::{HandshakeGuard, Security, SecurityConfig};
use crate::sent::{SentFrame, SentPacket, SentPackets};
use crate::stats::Stats;
use crate::traffic_class::{FlowScheduler, TrafficClassId};
use crate::PROTOCOL_VERSION;

/// Which flow ids this side allocates: the initiator even, the responder odd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Responder,
}

impl Role {
    fn parity(self) -> u64 {
        match self {
            Role::Initiator => 0,
            Role::Responder => 1,
        }
    }
}

/// Why the association as a whole went down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// The link was down longer than the configured outage limit.
    OutageLimit,
    /// The peer sent CLOSE.
    PeerClosed { code: u8, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The handshake completed; flows can carry data.
    Established,
    /// The peer came back with a new epoch: every flow was reset.
    PeerRestarted,
    /// The peer opened a flow.
    FlowOpened {
        flow: FlowId,
        meta: FlowMeta,
    },
    /// Bytes or the end of stream can be read.
    FlowReadable {
        flow: FlowId,
    },
    /// Send buffer space freed after a short write.
    FlowWritable {
        flow: FlowId,
    },
    /// The flow was aborted; the reason came from the peer or from the association.
    FlowReset {
        flow: FlowId,
        reason: ResetReason,
    },
    /// All state of the flow is released.
    FlowClosed {
        flow: FlowId,
    },
    OutageStarted,
    OutageEnded {
        duration: Duration,
    },
    /// The association is down; all flows were reset. It re-handshakes by itself.
    AssociationLost {
        reason: LostReason,
    },
    /// The peer proved it is at a new address (a roaming terminal, a NAT rebinding):
    /// everything is sent to `to` from now on.
    RemoteMoved {
        from: SocketAddr,
        to: SocketAddr,
    },
    /// The terminal moved to another hub of its list (docs/PROTOCOL.md §10): every flow
    /// was reset, and everything is sent to `to` from now on.
    Handover {
        from: SocketAddr,
        to: SocketAddr,
    },
}

/// When things last happened to an association (instants its caller gave it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssociationTimes {
    /// A handshake last completed (the association's start or a rekey); `None` before the
    /// first and without security.
    pub last_handshake: Option<Instant>,
    /// An authenticated packet of the peer's last arrived.
    pub last_received: Option<Instant>,
    /// The peer stopped answering (its last acknowledgement), while it still has not.
    pub outage_since: Option<Instant>,
    /// The peer last proved it is at a new address.
    pub remote_moved_at: Option<Instant>,
}

/// One flow as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowInfo {
    /// `None` while data of a flow the peer opened came before its FLOW_OPEN.
    pub meta: Option<FlowMeta>,
    /// Opened by this side (an intercepted connection), not by the peer.
    pub opened_here: bool,
    /// Bytes the application wrote into the flow.
    pub bytes_written: u64,
    /// Bytes the application read from the flow.
    pub bytes_read: u64,
    pub state: FlowState,
}

/// Where a flow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowState {
    /// Opened here; the peer has not acknowledged the open yet.
    Opening,
    Open,
    /// This side has sent its end of stream; the peer sends on.
    HalfClosedLocal,
    /// The peer has sent its end of stream; this side sends on.
    HalfClosedRemote,
    /// Both ends have sent their end of stream; acknowledgements are outstanding.
    Closing,
    Reset(ResetReason),
}

impl FlowState {
    /// Its name in reports.
    pub fn label(self) -> &'static str {
        match self {
            FlowState::Opening => "opening",
            FlowState::Open => "open",
            FlowState::HalfClosedLocal => "half-closed-local",
            FlowState::HalfClosedRemote => "half-closed-remote",
            FlowState::Closing => "closing",
            FlowState::Reset(_) => "reset",
        }
    }
}

/// Result of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    Data(Bytes),
    /// Nothing available now; a `FlowReadable` event follows when there is.
    Blocked,
    /// The peer half-closed: no more bytes will come.
    Finished,
}

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum FlowError {
    #[error("no such flow")]
    UnknownFlow,
    #[error("flow was reset ({0:?})")]
    Reset(ResetReason),
    #[error("write after finish")]
    Finished,
}

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    #[error("flow limit reached")]
    TooManyFlows,
}

/// Largest flow window honoured (4-byte truncated offsets cover half of 2^32).
const MAX_WINDOW: u64 = 1 << 30;

/// The least credit a flow is granted beyond what its consumer read while the association
/// receive window is contended: a few datagrams, so a flow that moves is not carried in
/// slivers however many flows are open.
const RECV_SHARE_FLOOR: u64 = 4 * 1024;

/// Earlier peer epochs remembered to ignore their late HELLOs.
const RETIRED_EPOCHS_KEPT: usize = 4;

/// Bound on RESETs queued for unknown flows (each answers a peer's SNACK).
const MAX_ORPHAN_RESETS: usize = 64;

/// Shortest truncated packet number sent.
const MIN_PN_LEN: usize = 2;

/// Passes of redundant copies over the outstanding data while the link is idle: each pass
/// cuts the chance that a tail packet needs a round-trip repair by the loss rate.
const MAX_REDUNDANT_COPIES: u8 = 3;

/// Successive PTOs without an ACK after which the link is taken to be down.
const OUTAGE_PTO_COUNT: u32 = 2;

/// Once the probe timer has expired without an ACK, a PING also goes this often until one
/// comes: the link's return is noticed within this and a round trip, where the backed-off
/// timer alone notices it up to a whole interval late. A PING is about 50 bytes on the wire,
/// so twenty a second are 8 kb/s, sent only while nothing is answered.
const SILENT_PROBE_INTERVAL: Duration = Duration::from_millis(50);

/// How an endpoint finds an association and its peer.
pub(crate) struct EndpointRouting {
    pub(crate) local_cid: ConnectionId,
    pub(crate) peer: PeerId,
    /// The peer's configured address, if any.
    pub(crate) remote: Option<SocketAddr>,
}

pub struct Association {
    cfg: Config,
    role: Role,
    local_epoch: u64,
    peer_epoch: Option<u64>,
    peer_params: Option<HelloParams>,
    /// What the peer's HELLO said it can decompress.
    peer_compression: Option<crate::compression::CompressionOffer>,
    established: bool,
    established_at: Option<Instant>,
    /// Peer epochs of earlier associations: a late HELLO from one is not a new restart.
    retired_peer_epochs: VecDeque<u64>,
    /// Bumped whenever the association restarts, so work begun before can tell.
    generation: u64,
    hello_due: Option<Instant>,
    hello_echo_sent: u64,
    hello_reply_needed: bool,
    /// A CLOSE to send, sealed in the packet-number space and keys of the association it ends.
    close_pending: Option<Vec<u8>>,
    /// Where that CLOSE goes when not to `remote`: the hub a terminal left.
    close_to: Option<SocketAddr>,
    /// The destination of the datagram `poll_transmit` wrote last, when not `remote` or
    /// `reply_to`: a trial initiation, a CLOSE to the hub left.
    sent_elsewhere: Option<SocketAddr>,
    /// A terminal's hubs and the trial under way; `None` without a hub list.
    handover: Option<Box<handover::Handover>>,
    /// Noise authentication and packet keys; `None` when security is off.
    security: Option<Box<Security>>,
    /// The connection ID the peer puts in the packets it sends us (we chose it).
    local_cid: ConnectionId,
    /// The connection ID we put in the packets we send (the peer chose it).
    peer_cid: ConnectionId,
    /// Where the peer is, as far as it proved (known in advance, or learned).
    remote: Option<SocketAddr>,
    /// Where the handshake reply queued now goes: where its initiation came from.
    reply_to: Option<SocketAddr>,
    /// The peer an endpoint made this association for.
    peer: Option<PeerId>,

    // Sending.
    next_pn: u64,
    sent: SentPackets,
    largest_acked: Option<u64>,
    last_ack_at: Option<Instant>,
    last_eliciting_sent: Option<Instant>,
    rtt: RttEstimator,
    /// RTTs as if each ACK had crossed the return path at its least delay (where the peer
    /// timestamps its ACKs): what the congestion controller measures the forward path by,
    /// while `rtt`, the real round trip, sets the timers.
    cc_rtt: RttEstimator,
    return_path: ReturnPath,
    /// The latest time an ACK was taken to arrive at (see `cc_rtt`).
    arrived_at: Option<Instant>,
    cc: Box<dyn CongestionController>,
    pacer: Pacer,
    /// How big data datagrams are cut.
    sizer: DatagramSizer,
    classifier: LossClassifier,
    /// Losses of packets numbered below this belong to the current congestion epoch.
    recovery_start_pn: u64,
    loss_time: Option<Instant>,
    /// How far the path reorders, and which declared losses were received after all.
    reordering: Reordering,
    pto_count: u32,
    /// The next PING while the probe timer has expired without an ACK
    /// (`SILENT_PROBE_INTERVAL`).
    silent_probe_at: Option<Instant>,
    /// The peer was heard (an authenticated packet) since the probe timer last fired: a
    /// probe timeout in an outage then does not make its hub a silent one.
    heard_since_pto: bool,
    probes_pending: u32,
    outage_since: Option<Instant>,
    /// When a handshake last completed (the association's start or a rekey).
    last_handshake: Option<Instant>,
    /// When an authenticated packet last arrived.
    last_received: Option<Instant>,
    /// When the peer last proved it is at a new address.
    remote_moved_at: Option<Instant>,
    redundancy_cursor: u64,
    /// When the probe timer last fired.
    pto_fired_at: Option<Instant>,
    /// Next check for flows stalled behind a gap.
    gap_sweep_at: Option<Instant>,
    /// When the oldest packet still awaiting acknowledgement was sent, approximately: set when
    /// a packet is sent with nothing in flight.
    sent_since: Option<Instant>,
    /// Copies each outstanding original may have in the current pass over the idle link.
    redundancy_round: u8,

    // Receiving.
    acks: AckTracker,

    // Flows.
    flows: BTreeMap<FlowId, Flow>,
    /// The flows with data to send, queued by traffic class.
    sched: FlowScheduler,
    /// Recent packet loss rate; idle redundancy only pays when losses are common.
    loss_rate: crate::loss::LossRate,
    control_queue: VecDeque<FlowId>,
    next_local_flow: FlowId,
    /// Peer-opened flow ids (halved) that are closed, so late frames are not mistaken for
    /// new flows.
    peer_closed: RangeSet,

    // Association-wide flow control, in stream bytes.
    assoc_send_limit: u64,
    assoc_sent: u64,
    assoc_charged: u64,
    assoc_consumed: u64,
    assoc_limit_advertised: u64,
    assoc_credit_pending: bool,
    /// RESETs owed for flows we no longer hold state for.
    orphan_resets: Vec<(FlowId, ResetReason)>,

    events: VecDeque<Event>,
    stats: Stats,
    /// The latest time any entry point was given (the core never reads a clock).
    last_input: Instant,
    payload: Vec<u8>,
    rx_buf: Vec<u8>,
}

impl std::fmt::Debug for Association {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Association")
            .field("role", &self.role)
            .field("established", &self.established)
            .field("flows", &self.flows.len())
            .finish_non_exhaustive()
    }
}

impl Association {
    /// `epoch`: a random non-zero number chosen by the caller for this start of the gateway.
    /// An association without security: plaintext HELLO, no packet protection. Only for
    /// links already protected below us.
    pub fn new(cfg: Config, role: Role, epoch: u64, now: Instant) -> Result<Self, InvalidConfig> {
        Self::build(cfg, role, epoch, now, None)
    }

    /// An association that authenticates the peer with a Noise IK handshake and protects
    /// every packet. `rng_seed`: 32 random bytes from the caller, the source of every
    /// ephemeral key (the core reads no entropy of its own).
    pub fn new_secure(
        cfg: Config,
        role: Role,
        epoch: u64,
        now: Instant,
        security: SecurityConfig,
        rng_seed: [u8; 32],
    ) -> Result<Self, InvalidConfig> {
        check_rekey(&security)?;
        let guard = Box::new(HandshakeGuard::standalone());
        let sec = Security::new(security, rng_seed, Some(guard));
        Self::build(cfg, role, epoch, now, Some(Box::new(sec)))
    }

    /// An association an endpoint routes to: packets to us carry `local_cid`, and the
    /// endpoint screens initiations (replays, work budget) before they reach us.
    pub(crate) fn for_endpoint(
        cfg: Config,
        role: Role,
        epoch: u64,
        now: Instant,
        security: Option<(SecurityConfig, [u8; 32])>,
        routing: EndpointRouting,
    ) -> Result<Self, InvalidConfig> {
        let security = match security {
            Some((sec, seed)) => {
                check_rekey(&sec)?;
                Some(Box::new(Security::new(sec, seed, None)))
            }
            None => None,
        };
        let mut a = Self::build(cfg, role, epoch, now, security)?;
        a.local_cid = routing.local_cid;
        a.peer = Some(routing.peer);
        a.remote = routing.remote;
        Ok(a)
    }

    fn build(
        cfg: Config,
        role: Role,
        epoch: u64,
        now: Instant,
        security: Option<Box<Security>>,
    ) -> Result<Self, InvalidConfig> {
        cfg.validate()?;
        let epoch = epoch.max(1);
        // The AEAD tag is in every protected datagram and is not payload.
        let tag = if security.is_some() {
            crate::security::TAG_LEN
        } else {
            0
        };
        let classifier = LossClassifier {
            default: cfg.loss_default,
            vegas: cfg.vegas,
        };
        Ok(Association {
            role,
            local_epoch: epoch,
            peer_epoch: None,
            peer_params: None,
            peer_compression: None,
            established: false,
            established_at: None,
            retired_peer_epochs: VecDeque::new(),
            generation: 0,
            hello_due: Some(now),
            hello_echo_sent: 0,
            hello_reply_needed: false,
            close_pending: None,
            close_to: None,
            sent_elsewhere: None,
            handover: None,
            security,
            local_cid: ConnectionId::EMPTY,
            peer_cid: ConnectionId::EMPTY,
            remote: None,
            reply_to: None,
            peer: None,
            next_pn: 0,
            sent: SentPackets::default(),
            largest_acked: None,
            last_ack_at: None,
            last_eliciting_sent: None,
            rtt: RttEstimator::new(cfg.initial_rtt),
            cc_rtt: RttEstimator::new(cfg.initial_rtt),
            return_path: ReturnPath::default(),
            arrived_at: None,
            cc: new_controller(&cfg),
            pacer: Pacer::new(cfg.rate_bps, cfg.mtu).with_burst(cfg.pacing_burst),
            sizer: DatagramSizer::new(
                cfg.datagram_size,
                cfg.max_datagram(),
                HEADER + tag,
                cfg.wire_overhead - tag + cfg.frame_overhead,
            ),
            classifier,
            recovery_start_pn: 0,
            loss_time: None,
            reordering: Reordering::default(),
            pto_count: 0,
            silent_probe_at: None,
            heard_since_pto: false,
            probes_pending: 0,
            outage_since: None,
            last_handshake: None,
            last_received: None,
            remote_moved_at: None,
            redundancy_cursor: 0,
            redundancy_round: 1,
            pto_fired_at: None,
            gap_sweep_at: None,
            sent_since: None,
            acks: AckTracker::new(cfg.ack),
            flows: BTreeMap::new(),
            sched: FlowScheduler::new(&cfg.classes, cfg.mtu, cfg.pacing_burst),
            loss_rate: crate::loss::LossRate::default(),
            control_queue: VecDeque::new(),
            next_local_flow: role.parity(),
            peer_closed: RangeSet::new(),
            assoc_send_limit: 0,
            assoc_sent: 0,
            assoc_charged: 0,
            assoc_consumed: 0,
            assoc_limit_advertised: cfg.assoc_window,
            assoc_credit_pending: false,
            orphan_resets: Vec::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            last_input: now,
            payload: Vec::with_capacity(cfg.mtu),
            rx_buf: Vec::new(),
            cfg,
        })
    }

    pub fn is_established(&self) -> bool {
        self.established
    }

    /// Where the peer is, as far as it proved; `None` until learned when not configured.
    pub fn remote(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// The peer this association was made for by an endpoint.
    pub fn peer(&self) -> Option<PeerId> {
        self.peer
    }

    /// The connection ID the peer's packets carry to reach us.
    pub fn local_cid(&self) -> ConnectionId {
        self.local_cid
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Changes the sending rate (pacer rate or Vegas cap) live.
    pub fn set_rate(&mut self, rate_bps: u64) {
        self.cfg.rate_bps = rate_bps.max(8_000);
        self.cc.set_rate(self.cfg.rate_bps);
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
    }

    /// Caps the sending rate below the configured one (a hub's share of its carrier) without
    /// restarting the congestion controller's view of the path; `config().rate_bps` stays.
    pub fn set_rate_ceiling(&mut self, rate_bps: u64) {
        let ceiling = rate_bps.clamp(8_000, self.cfg.rate_bps);
        self.cc.set_ceiling(ceiling);
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
    }

    /// Changes how long an idle association waits before it proves it is alive (a NAT
    /// mapping's lifetime), from the next idle period.
    pub fn set_keepalive(&mut self, interval: std::time::Duration) {
        self.cfg.keepalive_interval = interval;
    }

    /// Changes the flow limit live; flows already open above it stay.
    pub fn set_max_flows(&mut self, max_flows: usize) {
        self.cfg.max_flows = max_flows.max(1);
    }

    pub fn set_ack_policy(&mut self, policy: crate::config::AckPolicy) {
        self.cfg.ack = policy;
        self.acks.set_policy(policy);
    }

    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.rtt_min = self.rtt.min();
        s.rtt_smoothed = self.rtt.smoothed();
        s.pacing_rate_bps = self.pacer.rate_bps();
        s.cwnd_bytes = self.cc.window(&self.rtt);
        s.capacity = self.cc.capacity(&self.rtt);
        s.datagram_size = self.sizer.current() as u64;
        s.datagram_size_changes = self.sizer.changes();
        s.corruption_by_size = self.sizer.class_losses();
        s.bytes_in_flight = self.sent.bytes_in_flight();
        s.spurious_losses = self.reordering.spurious();
        s.flows_open = self.flows.len() as u64;
        s.flows_waiting_for_quota = self.flows_waiting_for_quota();
        s.aead = self.security.as_ref().and_then(|sec| sec.protection());
        if self.sched.measures_delay() {
            s.traffic_classes = self.sched.stats(self.flows.values().map(|f| f.class));
        }
        s
    }

    /// The rate the pacer sends at now (the congestion control's), bit/s on the wire: what
    /// the link carries for this association. Cheaper than [`stats`](Self::stats).
    pub fn pacing_rate_bps(&self) -> u64 {
        self.pacer.rate_bps()
    }

    /// The smoothed round-trip time. Cheaper than [`stats`](Self::stats).
    pub fn smoothed_rtt(&self) -> std::time::Duration {
        self.rtt.smoothed()
    }

    /// What this association's flows may carry compressed (docs/PROTOCOL.md §9): the
    /// agreement of our offer (`Config::compression`) and the peer's, once its HELLO came.
    pub fn compression(&self) -> Option<crate::compression::Compression> {
        crate::compression::negotiate(
            self.cfg.compression.as_ref(),
            self.peer_compression.as_ref(),
        )
    }

    /// Bytes written by the application and not yet acknowledged, over all flows: what a
    /// memory budget on the sending side has to count.
    pub fn send_buffered(&self) -> u64 {
        self.flows
            .values()
            .map(|f| f.send.end() - f.send.acked_base())
            .sum()
    }

    /// Bytes received and not yet read by the application, over all flows (bounded by the
    /// association window this side advertises).
    pub fn recv_buffered(&self) -> u64 {
        self.flows
            .values()
            .map(|f| f.recv.highest() - f.recv.read_offset())
            .sum()
    }

    /// Bytes of the association-wide receive window in use: charged by what the peer sent
    /// (holes included) and not yet read or discarded. The peer may send at most
    /// `config().assoc_window` beyond what was read, so this is what stalled consumers take
    /// from every other flow of the association.
    pub fn recv_window_used(&self) -> u64 {
        self.assoc_charged.saturating_sub(self.assoc_consumed)
    }

    /// Whether more than half of the association-wide receive window is in use: past that,
    /// flows whose consumers do not read take room the others need.
    pub fn recv_window_contended(&self) -> bool {
        self.recv_window_used() > self.cfg.assoc_window / 2
    }

    /// Bytes the peer may still send on `flow` beyond what its consumer read: the credit
    /// advertised so far.
    pub fn flow_recv_credit(&self, flow: FlowId) -> u64 {
        self.flows.get(&flow).map_or(0, |f| {
            f.recv
                .limit_advertised()
                .saturating_sub(f.recv.read_offset())
        })
    }

    /// How far beyond what its consumer read a flow is granted credit now: its window; but
    /// while the association receive window is contended, at most a quarter of that window
    /// divided by the open flows (at least [`RECV_SHARE_FLOOR`]), so that consumers that read
    /// slowly do not keep taking a whole flow window each from the flows that move. Credit
    /// already granted stands.
    pub(super) fn credit_window(&self) -> u64 {
        if !self.recv_window_contended() {
            return self.cfg.flow_window;
        }
        let open = self.flows.len().max(1) as u64;
        (self.cfg.assoc_window / 4 / open)
            .max(RECV_SHARE_FLOOR)
            .min(self.cfg.flow_window)
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- flows: application side -------------------------------------------------------

    /// Opens a flow for an intercepted connection, in traffic class 0. Data written before
    /// the packet leaves rides in the FLOW_OPEN.
    pub fn open_flow(&mut self, meta: FlowMeta) -> Result<FlowId, OpenError> {
        self.open_flow_in_class(meta, 0)
    }

    /// [`open_flow`](Self::open_flow) in traffic class `class` (class 0 if no such class is
    /// configured).
    pub fn open_flow_in_class(
        &mut self,
        meta: FlowMeta,
        class: TrafficClassId,
    ) -> Result<FlowId, OpenError> {
        if self.flows.len() >= self.cfg.max_flows {
            self.stats.flows_over_limit += 1;
            return Err(OpenError::TooManyFlows);
        }
        let id = self.next_local_flow;
        self.next_local_flow += 2;
        let credit = self.peer_params.map_or(0, |p| p.initial_flow_window);
        let mut flow = Flow::new(
            Some(meta),
            OpenState::Pending,
            credit,
            self.cfg.send_buffer,
            self.cfg.flow_window,
        );
        flow.class = self.sched.known(class);
        self.sched.count_flow(flow.class, true);
        self.flows.insert(id, flow);
        self.stats.flows_opened_total += 1;
        self.queue_control(id);
        Ok(id)
    }

    /// Puts `flow` in traffic class `class` (class 0 if no such class is configured): for a
    /// flow the peer opened, as soon as its `FlowOpened` event is seen. Its queued data moves
    /// with it.
    pub fn set_flow_class(&mut self, flow: FlowId, class: TrafficClassId) {
        let class = self.sched.known(class);
        let Some(f) = self.flows.get_mut(&flow) else {
            return;
        };
        if f.class == class {
            return;
        }
        let old = std::mem::replace(&mut f.class, class);
        let queued = f.in_send_queue;
        self.sched.count_flow(old, false);
        self.sched.count_flow(class, true);
        if queued && self.sched.remove(old, flow) {
            self.sched.push_back(class, flow);
        }
    }

    /// The traffic class `flow` is in.
    pub fn flow_class(&self, flow: FlowId) -> Option<TrafficClassId> {
        self.flows.get(&flow).map(|f| f.class)
    }

    pub fn flow_meta(&self, flow: FlowId) -> Option<FlowMeta> {
        self.flows.get(&flow).and_then(|f| f.meta)
    }

    /// What an operator sees of `flow`: its addresses, who opened it, the bytes it carried
    /// each way and where it stands; `None` once its state is released.
    pub fn flow_info(&self, flow: FlowId) -> Option<FlowInfo> {
        let f = self.flows.get(&flow)?;
        let state = match (f.reset, f.open) {
            (Some(r), _) => FlowState::Reset(r.reason),
            (None, OpenState::Pending | OpenState::Sent | OpenState::Lost) => FlowState::Opening,
            (None, OpenState::Remote | OpenState::Acked) => {
                match (f.send.is_finished_by_app(), f.recv.is_finished_by_peer()) {
                    (false, false) => FlowState::Open,
                    (true, false) => FlowState::HalfClosedLocal,
                    (false, true) => FlowState::HalfClosedRemote,
                    (true, true) => FlowState::Closing,
                }
            }
        };
        Some(FlowInfo {
            meta: f.meta,
            opened_here: flow % 2 == self.role.parity(),
            bytes_written: f.send.end(),
            bytes_read: f.recv.read_offset(),
            state,
        })
    }

    /// When things last happened to the association, as the instants its caller gave.
    pub fn times(&self) -> AssociationTimes {
        AssociationTimes {
            last_handshake: self.last_handshake,
            last_received: self.last_received,
            outage_since: self.outage_since,
            remote_moved_at: self.remote_moved_at,
        }
    }

    /// Queues bytes for sending; returns how many fit in the flow's send buffer. Written at
    /// the latest time given to the association, for the queue delay of its traffic class.
    pub fn write(&mut self, flow: FlowId, data: &[u8]) -> Result<usize, FlowError> {
        self.write_at(flow, data, self.last_input)
    }

    /// [`write`](Self::write) at `now`, from which the bytes' queue delay counts.
    pub fn write_at(
        &mut self,
        flow: FlowId,
        data: &[u8],
        now: Instant,
    ) -> Result<usize, FlowError> {
        let measure = self.sched.measures_delay();
        let f = self.flows.get_mut(&flow).ok_or(FlowError::UnknownFlow)?;
        if let Some(r) = f.reset {
            return Err(FlowError::Reset(r.reason));
        }
        if f.send.is_finished_by_app() {
            return Err(FlowError::Finished);
        }
        let n = f.send.write(data);
        if n < data.len() {
            f.write_blocked = true;
        }
        if measure && n > 0 {
            f.write_times.written(f.send.end(), now);
        }
        if n > 0 {
            self.queue_send(flow);
        }
        Ok(n)
    }

    /// Bytes `write` would accept now. When that is nothing, a `FlowWritable` event follows
    /// once room frees, as after a short write.
    pub fn send_capacity(&mut self, flow: FlowId) -> usize {
        let room = self.peek_send_capacity(flow);
        if room == 0 {
            if let Some(f) = self.flows.get_mut(&flow) {
                f.write_blocked = true;
            }
        }
        room
    }

    /// Bytes of `flow` written and not yet acknowledged: its part of
    /// [`send_buffered`](Self::send_buffered).
    pub fn flow_send_buffered(&self, flow: FlowId) -> u64 {
        self.flows
            .get(&flow)
            .map_or(0, |f| f.send.end() - f.send.acked_base())
    }

    /// The application holds back writes to `flow` until what it buffers shrinks: a
    /// `FlowWritable` event follows the next acknowledgement of its data, or
    /// [`release_quota_waits`](Self::release_quota_waits).
    pub fn wait_for_quota(&mut self, flow: FlowId) {
        if let Some(f) = self.flows.get_mut(&flow) {
            f.quota_blocked = true;
        }
    }

    /// Ends every [`wait_for_quota`](Self::wait_for_quota) with a `FlowWritable` event (the
    /// quotas are lifted).
    pub fn release_quota_waits(&mut self) {
        for (&flow, f) in self.flows.iter_mut().filter(|(_, f)| f.quota_blocked) {
            f.quota_blocked = false;
            if f.reset.is_none() {
                self.events.push_back(Event::FlowWritable { flow });
            }
        }
    }

    /// Flows whose writes wait for their quota (see [`wait_for_quota`](Self::wait_for_quota)).
    pub fn flows_waiting_for_quota(&self) -> u64 {
        self.flows.values().filter(|f| f.quota_blocked).count() as u64
    }

    /// Bytes `write` would accept now, without asking for a `FlowWritable` event.
    pub fn peek_send_capacity(&self, flow: FlowId) -> usize {
        self.flows
            .get(&flow)
            .filter(|f| f.reset.is_none() && !f.send.is_finished_by_app())
            .map_or(0, |f| f.send.room())
    }

    /// Half-closes our sending direction after the bytes written so far.
    pub fn finish(&mut self, flow: FlowId) -> Result<(), FlowError> {
        let f = self.flows.get_mut(&flow).ok_or(FlowError::UnknownFlow)?;
        if let Some(r) = f.reset {
            return Err(FlowError::Reset(r.reason));
        }
        f.send.finish();
        self.queue_send(flow);
        Ok(())
    }

    /// Reads up to `max` in-order bytes.
    pub fn read(&mut self, flow: FlowId, max: usize) -> Result<ReadOutcome, FlowError> {
        let window = self.credit_window();
        let f = self.flows.get_mut(&flow).ok_or(FlowError::UnknownFlow)?;
        if let Some(r) = f.reset {
            return Err(FlowError::Reset(r.reason));
        }
        if let Some(chunk) = f.recv.read(max) {
            let n = chunk.len() as u64;
            self.assoc_consumed += n;
            if f.recv.credit_update(window).is_some() && !f.credit_dirty {
                f.credit_dirty = true;
                self.queue_control(flow);
            }
            self.maybe_assoc_credit();
            return Ok(ReadOutcome::Data(chunk));
        }
        if f.recv.take_fin() {
            self.maybe_close_flow(flow);
            return Ok(ReadOutcome::Finished);
        }
        if f.recv.fin_delivered() {
            return Ok(ReadOutcome::Finished);
        }
        f.readable_signaled = false;
        Ok(ReadOutcome::Blocked)
    }

    /// Aborts the flow in both directions (a TCP RST).
    pub fn reset(&mut self, flow: FlowId, reason: ResetReason) -> Result<(), FlowError> {
        let f = self.flows.get_mut(&flow).ok_or(FlowError::UnknownFlow)?;
        if f.reset.is_some() {
            return Ok(());
        }
        f.reset = Some(ResetState {
            reason,
            needs_send: true,
            acked: false,
            peer_final: None,
        });
        // Whatever we buffered for the consumer is freed now.
        self.assoc_consumed += f.recv.highest() - f.recv.read_offset();
        self.stats.flows_reset += 1;
        self.queue_control(flow);
        self.maybe_assoc_credit();
        Ok(())
    }

    /// Resets a flow for a reason of the transport's own and tells the application.
    fn abort_flow(&mut self, flow: FlowId, reason: ResetReason) {
        if reason == ResetReason::Protocol {
            self.stats.protocol_violations += 1;
        }
        if self.reset(flow, reason).is_ok() {
            self.events.push_back(Event::FlowReset { flow, reason });
        }
    }

    /// Ends the association now: every flow is reset, a new epoch is taken and the peer is
    /// told with one best-effort CLOSE (if it is lost, our next HELLO's new epoch tells it).
    pub fn close(&mut self, code: u8, reason: &str) {
        // Sealed now: the restart below forgets the keys and packet numbers it needs.
        let datagram = if self.established {
            self.sealed_close(code, reason)
        } else {
            None
        };
        self.restart_association(ResetReason::Aborted);
        self.local_epoch = self.local_epoch.wrapping_add(1).max(1);
        self.close_pending = datagram;
    }

    /// Sends to `to` from now on; a change of a known address is a move, reported and
    /// counted (learning the first address is not).
    pub(super) fn set_remote(&mut self, now: Instant, to: SocketAddr) {
        match self.remote.replace(to) {
            Some(from) if from != to => {
                self.stats.remote_moves += 1;
                self.remote_moved_at = Some(now);
                self.events.push_back(Event::RemoteMoved { from, to });
                self.resend_after_move(now);
            }
            _ => {}
        }
    }

    /// The peer left its old address after the last packet we heard from there and before
    /// the first from the new one, so what we sent in the round trip before that last
    /// packet, and everything since, may have arrived after it had gone: resent now, rather
    /// than a probe timeout or two later (the netns test's move cost 3.2 round trips
    /// without this, 1.1 with it). The window starts at the last packet from the old
    /// address, not at the first from the new: the move can take the peer out of reach for
    /// a while, and what we sent then is as lost. Not a sign of congestion. If the old
    /// address still reached the peer (a NAT that kept the old mapping) the copies are
    /// duplicates it drops: at most a round trip and the gap of sending, once per move.
    fn resend_after_move(&mut self, now: Instant) {
        // `last_received` is still the old address's packet: the new one is counted after.
        let left = self.last_received.map_or(now, |heard| heard.min(now));
        let since = left.checked_sub(self.rtt.smoothed() + self.cfg.ack.max_delay);
        let gone: Vec<u64> = self
            .sent
            .outstanding_in(0, self.next_pn)
            .into_iter()
            .filter(|&pn| {
                self.sent
                    .get(pn)
                    .is_some_and(|p| since.is_none_or(|s| p.time >= s))
            })
            .collect();
        for pn in gone {
            self.declare_lost(now, pn, Some(LossCause::Outage));
        }
    }

    /// Whether this association authenticates its peer and protects its packets.
    pub fn is_secure(&self) -> bool {
        self.security.is_some()
    }

    /// Bytes protection adds to each short packet.
    pub(super) fn tag_len(&self) -> usize {
        if self.security.is_some() {
            crate::security::TAG_LEN
        } else {
            0
        }
    }

    /// Whether packet number `pn` may go out now (under security: never twice per key).
    pub(super) fn may_seal(&mut self, pn: u64) -> bool {
        match &self.security {
            None => true,
            Some(s) if s.may_seal(pn) => true,
            Some(_) => {
                self.stats.security.nonce_refused += 1;
                false
            }
        }
    }

    pub(super) fn key_phase(&self) -> bool {
        self.security.as_ref().is_some_and(|s| s.key_phase())
    }

    pub(super) fn seal(&mut self, pn: u64, header_len: usize, out: &mut Vec<u8>) {
        if let Some(s) = self.security.as_mut() {
            s.seal(pn, header_len, out);
        }
    }
}

fn check_rekey(security: &SecurityConfig) -> Result<(), InvalidConfig> {
    if security.rekey_after_packets == 0 || security.rekey_interval.is_zero() {
        return Err(InvalidConfig::new(
            "security.rekey",
            "rekey interval and packet count must be positive",
        ));
    }
    Ok(())
}

mod handover;
mod receive;
mod recovery;
mod transmit;

pub use handover::{Hubs, CLOSE_HANDOVER, MAX_HUBS};
