//! The association: one per gateway pair, carrying many flows over one datagram path.
//!
//! Sans-IO: `handle_datagram`, `handle_timeout` and the flow calls take input;
//! `poll_transmit`, `poll_timeout` and `poll_event` give output. Time only ever comes in as
//! an argument.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;

use crate::ack::AckTracker;
use crate::cc::{new_controller, AckedPacket, CongestionController};
use crate::codec::{expand_truncated, truncation_len, Reader};
use crate::config::{Config, ConfigError, LossCause};
use crate::flow::{Flow, FlowId, OpenState, ResetState};
use crate::frame::{self, AckFrame, FlowMeta, Frame, ResetReason};
use crate::loss::LossClassifier;
use crate::pacer::Pacer;
use crate::packet::{decode_header, Header, Hello, HelloParams, ImplicitData, ShortHeader};
use crate::protection::{NullProtection, PacketProtection};
use crate::range_set::RangeSet;
use crate::rtt::RttEstimator;
use crate::sent::{SentFrame, SentPacket, SentPackets};
use crate::stats::Stats;
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

pub struct Association {
    cfg: Config,
    role: Role,
    local_epoch: u64,
    peer_epoch: Option<u64>,
    peer_params: Option<HelloParams>,
    established: bool,
    established_at: Option<Instant>,
    /// Peer epochs of earlier associations: a late HELLO from one is not a new restart.
    retired_peer_epochs: VecDeque<u64>,
    /// Bumped whenever the association restarts, so work begun before can tell.
    generation: u64,
    hello_due: Option<Instant>,
    hello_echo_sent: u64,
    hello_reply_needed: bool,
    /// A CLOSE to send, numbered in the packet-number space of the association it ends.
    close_pending: Option<(u64, u8, String)>,
    protection: Box<dyn PacketProtection>,

    // Sending.
    next_pn: u64,
    sent: SentPackets,
    largest_acked: Option<u64>,
    last_ack_at: Option<Instant>,
    last_eliciting_sent: Option<Instant>,
    rtt: RttEstimator,
    cc: Box<dyn CongestionController>,
    pacer: Pacer,
    classifier: LossClassifier,
    /// Losses of packets numbered below this belong to the current congestion epoch.
    recovery_start_pn: u64,
    loss_time: Option<Instant>,
    pto_count: u32,
    probes_pending: u32,
    outage_since: Option<Instant>,
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
    send_queue: VecDeque<FlowId>,
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

/// A frame picked for the packet being built.
enum Planned {
    Data {
        flow: FlowId,
        offset: u64,
        len: usize,
        fin: bool,
        offset_len: usize,
    },
}

impl Association {
    /// `epoch`: a random non-zero number chosen by the caller for this start of the gateway.
    pub fn new(cfg: Config, role: Role, epoch: u64, now: Instant) -> Result<Self, ConfigError> {
        Self::with_protection(cfg, role, epoch, now, Box::new(NullProtection))
    }

    pub fn with_protection(
        cfg: Config,
        role: Role,
        epoch: u64,
        now: Instant,
        protection: Box<dyn PacketProtection>,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let epoch = epoch.max(1);
        let classifier = LossClassifier {
            default: cfg.loss_default,
            vegas: cfg.vegas,
        };
        Ok(Association {
            role,
            local_epoch: epoch,
            peer_epoch: None,
            peer_params: None,
            established: false,
            established_at: None,
            retired_peer_epochs: VecDeque::new(),
            generation: 0,
            hello_due: Some(now),
            hello_echo_sent: 0,
            hello_reply_needed: false,
            close_pending: None,
            protection,
            next_pn: 0,
            sent: SentPackets::default(),
            largest_acked: None,
            last_ack_at: None,
            last_eliciting_sent: None,
            rtt: RttEstimator::new(cfg.initial_rtt),
            cc: new_controller(&cfg),
            pacer: Pacer::new(cfg.rate_bps, cfg.mtu),
            classifier,
            recovery_start_pn: 0,
            loss_time: None,
            pto_count: 0,
            probes_pending: 0,
            outage_since: None,
            redundancy_cursor: 0,
            redundancy_round: 1,
            pto_fired_at: None,
            gap_sweep_at: None,
            sent_since: None,
            acks: AckTracker::new(cfg.ack),
            flows: BTreeMap::new(),
            send_queue: VecDeque::new(),
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

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Changes the sending rate (pacer rate or Vegas cap) live.
    pub fn set_rate(&mut self, rate_bps: u64) {
        self.cfg.rate_bps = rate_bps.max(8_000);
        self.cc.set_rate(self.cfg.rate_bps);
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
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
        s.cwnd_bytes = self.cc.window();
        s.bytes_in_flight = self.sent.bytes_in_flight();
        s.flows_open = self.flows.len() as u64;
        s
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- flows: application side -------------------------------------------------------

    /// Opens a flow for an intercepted connection. Data written before the packet leaves
    /// rides in the FLOW_OPEN.
    pub fn open_flow(&mut self, meta: FlowMeta) -> Result<FlowId, OpenError> {
        if self.flows.len() >= self.cfg.max_flows {
            return Err(OpenError::TooManyFlows);
        }
        let id = self.next_local_flow;
        self.next_local_flow += 2;
        let credit = self.peer_params.map_or(0, |p| p.initial_flow_window);
        let flow = Flow::new(
            Some(meta),
            OpenState::Pending,
            credit,
            self.cfg.send_buffer,
            self.cfg.flow_window,
        );
        self.flows.insert(id, flow);
        self.stats.flows_opened_total += 1;
        self.queue_control(id);
        Ok(id)
    }

    pub fn flow_meta(&self, flow: FlowId) -> Option<FlowMeta> {
        self.flows.get(&flow).and_then(|f| f.meta)
    }

    /// Queues bytes for sending; returns how many fit in the flow's send buffer.
    pub fn write(&mut self, flow: FlowId, data: &[u8]) -> Result<usize, FlowError> {
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
        if n > 0 {
            self.queue_send(flow);
        }
        Ok(n)
    }

    /// Bytes `write` would accept now.
    pub fn send_capacity(&self, flow: FlowId) -> usize {
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
        let f = self.flows.get_mut(&flow).ok_or(FlowError::UnknownFlow)?;
        if let Some(r) = f.reset {
            return Err(FlowError::Reset(r.reason));
        }
        if let Some(chunk) = f.recv.read(max) {
            let n = chunk.len() as u64;
            self.assoc_consumed += n;
            if f.recv.credit_update().is_some() && !f.credit_dirty {
                f.credit_dirty = true;
                self.queue_control(flow);
            }
            self.maybe_assoc_credit();
            return Ok(ReadOutcome::Data(chunk));
        }
        if f.recv.take_fin() {
            f.fin_reported = true;
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
        let old_pn = self.next_pn;
        let was_established = self.established;
        self.restart_association(ResetReason::Aborted);
        self.local_epoch = self.local_epoch.wrapping_add(1).max(1);
        if was_established {
            self.close_pending = Some((old_pn, code, reason.to_owned()));
        }
    }

    // ---- input ----------------------------------------------------------------------------

    /// Processes one received datagram. Anything malformed is dropped and counted.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.last_input = self.last_input.max(now);
        let mut r = Reader::new(datagram);
        let header = match decode_header(&mut r) {
            Ok(h) => h,
            Err(_) => {
                self.stats.malformed_dropped += 1;
                return;
            }
        };
        let short = match header {
            Header::Hello(h) => return self.on_hello(now, h),
            Header::Short(s) => s,
        };
        if self.peer_epoch.is_none() {
            self.stats.unassociated_dropped += 1;
            // A peer that still thinks we are associated needs our HELLO to notice.
            self.hello_reply_needed = true;
            return;
        }
        let expected = self.acks.largest().map_or(0, |l| l + 1);
        let pn = expand_truncated(short.pn_truncated, short.pn_len, expected);
        if self.acks.is_duplicate(pn) {
            self.stats.duplicates_dropped += 1;
            return;
        }
        let header_len = short.encoded_len();
        let mut rx = std::mem::take(&mut self.rx_buf);
        rx.clear();
        rx.extend_from_slice(datagram);
        let payload_len = match self.protection.open(pn, header_len, &mut rx) {
            Ok(n) => n,
            Err(_) => {
                self.stats.malformed_dropped += 1;
                self.rx_buf = rx;
                return;
            }
        };
        let parsed = parse_frames(&rx[header_len..header_len + payload_len], short);
        match parsed {
            Ok(frames) => {
                self.stats.packets_received += 1;
                self.stats.wire_bytes_received +=
                    (datagram.len() + self.cfg.wire_overhead - self.protection.tag_len()) as u64;
                if !self.established {
                    // Only a peer that knows our epoch sends short packets.
                    self.set_established();
                }
                let mut eliciting = false;
                let mut urgent = false;
                let generation = self.generation;
                for f in frames {
                    eliciting |= f.is_ack_eliciting();
                    urgent |= matches!(f, Frame::Ping);
                    self.on_frame(now, f);
                    if self.generation != generation {
                        // The packet ended the association (CLOSE): it belongs to no
                        // packet-number space any more.
                        break;
                    }
                }
                if self.generation == generation {
                    self.acks.on_packet(now, pn, eliciting, urgent);
                }
            }
            Err(_) => self.stats.malformed_dropped += 1,
        }
        self.rx_buf = rx;
    }

    fn on_hello(&mut self, now: Instant, h: Hello) {
        if h.version != PROTOCOL_VERSION {
            self.stats.malformed_dropped += 1;
            return;
        }
        if self.retired_peer_epochs.contains(&h.epoch) {
            // A delayed or duplicated HELLO of an association already replaced.
            self.stats.malformed_dropped += 1;
            return;
        }
        match self.peer_epoch {
            Some(p) if p != h.epoch => {
                self.restart_association(ResetReason::PeerRestart);
                self.retired_peer_epochs.push_back(p);
                if self.retired_peer_epochs.len() > RETIRED_EPOCHS_KEPT {
                    self.retired_peer_epochs.pop_front();
                }
                self.stats.peer_restarts += 1;
                self.events.push_back(Event::PeerRestarted);
                self.peer_epoch = Some(h.epoch);
            }
            None => self.peer_epoch = Some(h.epoch),
            _ => {}
        }
        // Truncated offsets are unambiguous only for windows up to 1 GiB.
        self.peer_params = Some(HelloParams {
            initial_flow_window: h.params.initial_flow_window.min(MAX_WINDOW),
            initial_assoc_window: h.params.initial_assoc_window,
            max_ack_delay_us: h.params.max_ack_delay_us,
        });
        if h.echo == self.local_epoch {
            self.set_established();
        }
        // A peer that is not established is waiting for our echo; answer every such HELLO
        // (ours may have been lost). Established peers' HELLOs need no answer unless they
        // lack our epoch, so replies never ping-pong.
        if !h.established || h.echo != self.local_epoch || self.hello_echo_sent != h.epoch {
            self.hello_reply_needed = true;
        }
        let _ = now;
    }

    fn set_established(&mut self) {
        if self.established {
            return;
        }
        self.established = true;
        self.established_at = Some(self.last_input);
        self.hello_due = None;
        if let Some(p) = self.peer_params {
            self.assoc_send_limit = self.assoc_send_limit.max(p.initial_assoc_window);
            let ids: Vec<FlowId> = self.flows.keys().copied().collect();
            for id in ids {
                if let Some(f) = self.flows.get_mut(&id) {
                    f.send.raise_credit(p.initial_flow_window);
                }
                self.queue_send(id);
            }
        }
        self.events.push_back(Event::Established);
    }

    /// Drops all flows and packet-number state, as after a peer restart or a lost link.
    fn restart_association(&mut self, reason: ResetReason) {
        let ids: Vec<FlowId> = self.flows.keys().copied().collect();
        for id in ids {
            self.flows.remove(&id);
            self.stats.flows_reset += 1;
            self.events.push_back(Event::FlowReset { flow: id, reason });
            self.events.push_back(Event::FlowClosed { flow: id });
        }
        self.established = false;
        self.established_at = None;
        self.hello_due = Some(self.last_input);
        self.hello_echo_sent = 0;
        // Short packets are accepted only from a peer epoch learned afresh by HELLO, so
        // nothing from the old association is taken for the new one.
        self.peer_epoch = None;
        self.last_ack_at = None;
        self.last_eliciting_sent = None;
        self.pto_fired_at = None;
        self.sent_since = None;
        self.generation += 1;
        self.next_pn = 0;
        self.sent = SentPackets::default();
        self.largest_acked = None;
        self.loss_time = None;
        self.pto_count = 0;
        self.probes_pending = 0;
        self.outage_since = None;
        self.redundancy_cursor = 0;
        self.redundancy_round = 1;
        self.recovery_start_pn = 0;
        self.acks = AckTracker::new(self.cfg.ack);
        self.send_queue.clear();
        self.control_queue.clear();
        self.next_local_flow = self.role.parity();
        self.peer_closed = RangeSet::new();
        self.assoc_send_limit = 0;
        self.assoc_sent = 0;
        self.assoc_charged = 0;
        self.assoc_consumed = 0;
        self.assoc_limit_advertised = self.cfg.assoc_window;
        self.assoc_credit_pending = false;
        self.orphan_resets.clear();
    }

    fn on_frame(&mut self, now: Instant, f: Frame<'_>) {
        match f {
            Frame::Padding | Frame::Ping => {}
            Frame::Ack(ack) => self.on_ack(now, &ack),
            Frame::FlowOpen {
                flow,
                meta,
                data,
                fin,
            } => {
                if let Some(id) = self.peer_flow(flow) {
                    let f = self
                        .flows
                        .get_mut(&id)
                        .expect("peer_flow returned a live id");
                    if f.meta.is_none() {
                        f.meta = Some(meta);
                        self.events.push_back(Event::FlowOpened { flow: id, meta });
                    }
                    if !data.is_empty() || fin {
                        self.on_stream_data(id, 0, data, fin);
                    }
                }
            }
            Frame::Data {
                flow,
                offset,
                fin,
                data,
            } => {
                let Some(id) = self.peer_or_local_flow(flow) else {
                    return;
                };
                let reference = self.flows.get(&id).map_or(0, |f| f.recv.contiguous());
                self.on_stream_data(id, offset.expand(reference), data, fin);
            }
            Frame::FlowReset {
                flow,
                reason,
                final_offset,
            } => {
                if self.flows.contains_key(&flow) {
                    self.on_peer_reset(flow, reason, final_offset);
                } else {
                    self.on_reset_without_state(flow, reason, final_offset);
                }
            }
            Frame::FlowCredit { flow, max_offset } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    let cap = f.send.acked_base().saturating_add(MAX_WINDOW);
                    f.send.raise_credit(max_offset.min(cap));
                    self.queue_send(flow);
                }
            }
            Frame::AssocCredit { max_bytes } => {
                if max_bytes > self.assoc_send_limit {
                    self.assoc_send_limit = max_bytes;
                    let ids: Vec<FlowId> = self
                        .flows
                        .iter()
                        .filter(|(_, f)| !f.in_send_queue)
                        .map(|(&id, _)| id)
                        .collect();
                    for id in ids {
                        self.queue_send(id);
                    }
                }
            }
            Frame::StreamSnack { flow, ranges } => {
                let Some(f) = self.flows.get_mut(&flow) else {
                    // We finished with this flow, so the bytes the peer lacks are gone: tell
                    // it to give up. Stateless: a lost RESET is answered again on its next
                    // SNACK.
                    if self.orphan_resets.len() < MAX_ORPHAN_RESETS {
                        self.orphan_resets.push((flow, ResetReason::Protocol));
                    }
                    return;
                };
                if f.reset.is_some() {
                    return;
                }
                let repairable = ranges.into_iter().all(|r| f.send.on_stream_snack(r));
                if repairable {
                    self.queue_send(flow);
                } else {
                    // Bytes the peer lacks were released as acknowledged: the stream cannot
                    // be completed, so end it cleanly instead of stalling.
                    self.abort_flow(flow, ResetReason::Protocol);
                }
            }
            Frame::Close { code, reason } => {
                self.restart_association(ResetReason::PeerRestart);
                self.events.push_back(Event::AssociationLost {
                    reason: LostReason::PeerClosed { code, reason },
                });
            }
        }
    }

    /// Resolves a flow id named by the peer for a frame that may create a peer flow.
    fn peer_flow(&mut self, flow: FlowId) -> Option<FlowId> {
        if self.flows.contains_key(&flow) {
            return Some(flow);
        }
        if flow % 2 == self.role.parity() || self.peer_closed.contains(flow / 2) {
            // Ours and gone, or theirs and closed: a late frame.
            return None;
        }
        let credit = self.peer_params.map_or(0, |p| p.initial_flow_window);
        let f = Flow::new(
            None,
            OpenState::Remote,
            credit,
            self.cfg.send_buffer,
            self.cfg.flow_window,
        );
        self.flows.insert(flow, f);
        self.stats.flows_opened_total += 1;
        if self.flows.len() > self.cfg.max_flows {
            self.abort_flow(flow, ResetReason::ResourceLimit);
        }
        Some(flow)
    }

    fn peer_or_local_flow(&mut self, flow: FlowId) -> Option<FlowId> {
        if flow % 2 == self.role.parity() {
            self.flows.contains_key(&flow).then_some(flow)
        } else {
            self.peer_flow(flow)
        }
    }

    fn on_stream_data(&mut self, id: FlowId, offset: u64, data: &[u8], fin: bool) {
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        if f.reset.is_some() {
            // Discarding: charge and free at once so the peer's credit stays in step.
            let extra = f
                .recv
                .raise_highest(offset.saturating_add(data.len() as u64));
            self.assoc_charged += extra;
            self.assoc_consumed += extra;
            return;
        }
        match f.recv.on_data(offset, data, fin) {
            Ok(charged) if self.assoc_charged + charged > self.assoc_limit_advertised => {
                // Beyond the association-wide credit we granted.
                self.assoc_charged += charged;
                self.abort_flow(id, ResetReason::Protocol);
            }
            Ok(charged) => {
                self.assoc_charged += charged;
                let contiguous = f.recv.contiguous();
                f.gap_since = match f.gap_since {
                    _ if !f.recv.has_gap() => None,
                    Some((c, t)) if c == contiguous => Some((c, t)),
                    _ => Some((contiguous, self.last_input)),
                };
                let arm_sweep = f.gap_since.is_some() && self.gap_sweep_at.is_none();
                if f.recv.has_readable() && !f.readable_signaled {
                    f.readable_signaled = true;
                    self.events.push_back(Event::FlowReadable { flow: id });
                }
                if arm_sweep {
                    self.gap_sweep_at = Some(self.last_input + self.stall_timeout() / 2);
                }
            }
            Err(_) => self.abort_flow(id, ResetReason::Protocol),
        }
    }

    /// A RESET for a flow we have no state for: closed here already, or never seen (its
    /// FLOW_OPEN lost or still on the way). The peer waits for our RESET to release its
    /// side, so answer, unless this is itself such an answer.
    fn on_reset_without_state(&mut self, flow: FlowId, reason: ResetReason, final_offset: u64) {
        let peer_id = flow % 2 != self.role.parity();
        if peer_id && !self.peer_closed.contains(flow / 2) {
            // Never seen: none of its bytes were charged here, and none will be now.
            self.peer_closed.insert(flow / 2..flow / 2 + 1);
            self.assoc_charged += final_offset;
            self.assoc_consumed += final_offset;
            self.maybe_assoc_credit();
        }
        if reason != ResetReason::Closed && self.orphan_resets.len() < MAX_ORPHAN_RESETS {
            self.orphan_resets.push((flow, ResetReason::Closed));
        }
    }

    fn on_peer_reset(&mut self, id: FlowId, reason: ResetReason, final_offset: u64) {
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        let first = f.reset.is_none();
        if first {
            self.assoc_consumed += f.recv.highest() - f.recv.read_offset();
            f.reset = Some(ResetState {
                reason,
                needs_send: true,
                acked: false,
                peer_final: None,
            });
            self.stats.flows_reset += 1;
            self.events.push_back(Event::FlowReset { flow: id, reason });
        }
        let state = f.reset.as_mut().expect("set above");
        if state.peer_final.is_none() {
            state.peer_final = Some(final_offset);
            let extra = f.recv.raise_highest(final_offset);
            self.assoc_charged += extra;
            self.assoc_consumed += extra;
        }
        if first {
            self.queue_control(id);
        }
        self.maybe_assoc_credit();
        self.maybe_close_flow(id);
    }

    // ---- acknowledgements and loss --------------------------------------------------------

    fn on_ack(&mut self, now: Instant, ack: &AckFrame) {
        self.stats.acks_received += 1;
        if ack.has_holes() {
            self.stats.snacks_received += 1;
        }
        let Some(mut largest) = ack.largest() else {
            return;
        };
        if largest >= self.next_pn {
            // Names packets never sent (a misread packet number at the peer, or forgery):
            // use only the part that can be true.
            self.stats.protocol_violations += 1;
            largest = match self.next_pn.checked_sub(1) {
                Some(l) => l,
                None => return,
            };
        }
        let mut newly: Vec<u64> = Vec::new();
        for r in ack.ranges.iter().rev() {
            newly.extend(self.sent.outstanding_in(r.start, r.end.min(largest + 1)));
        }
        if newly.is_empty() {
            return;
        }
        self.largest_acked = Some(self.largest_acked.map_or(largest, |l| l.max(largest)));
        let mut rtt_sample = None;
        if let Some(p) = self.sent.get(largest) {
            let ack_delay = Duration::from_micros(ack.delay_us).min(self.cfg.ack.max_delay * 4);
            let raw = now.saturating_duration_since(p.time);
            let sample = if raw >= self.rtt.min() + ack_delay {
                raw - ack_delay
            } else {
                raw
            };
            self.rtt.on_sample(now, sample);
            rtt_sample = Some(sample);
        }
        self.last_ack_at = Some(now);
        self.pto_count = 0;
        if let Some(since) = self.outage_since.take() {
            // Everything still unacknowledged went into the outage.
            self.events.push_back(Event::OutageEnded {
                duration: now.saturating_duration_since(since),
            });
            let lost: Vec<u64> = self
                .sent
                .outstanding_in(0, self.next_pn)
                .into_iter()
                .filter(|pn| !newly.contains(pn))
                .collect();
            for pn in lost {
                self.declare_lost(now, pn, Some(LossCause::Outage));
            }
        }
        for &pn in &newly {
            let Some(p) = self.sent.remove(pn) else {
                continue;
            };
            for fr in &p.frames {
                self.on_frame_acked(*fr);
            }
            let acked = AckedPacket {
                pn,
                bytes: p.wire_bytes,
                rtt_sample: if pn == largest { rtt_sample } else { None },
                next_pn: self.next_pn,
            };
            self.cc.on_ack(now, acked, &self.rtt);
        }
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
        self.detect_lost(now);
    }

    fn on_frame_acked(&mut self, fr: SentFrame) {
        match fr {
            SentFrame::Data {
                flow,
                offset,
                len,
                fin,
            } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    let before = f.send.acked_base();
                    f.send.on_acked(offset, len as usize, fin);
                    self.stats.stream_bytes_acked += f.send.acked_base() - before;
                    if f.write_blocked && f.send.has_room() && f.reset.is_none() {
                        f.write_blocked = false;
                        self.events.push_back(Event::FlowWritable { flow });
                    }
                    self.maybe_close_flow(flow);
                }
            }
            SentFrame::Open { flow } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    f.open = OpenState::Acked;
                    self.maybe_close_flow(flow);
                }
            }
            SentFrame::Reset { flow, .. } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    if let Some(r) = f.reset.as_mut() {
                        r.acked = true;
                    }
                    self.maybe_close_flow(flow);
                }
            }
            SentFrame::FlowCredit { .. }
            | SentFrame::AssocCredit
            | SentFrame::StreamSnack
            | SentFrame::Ping => {}
        }
    }

    fn detect_lost(&mut self, now: Instant) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let delay = self
            .rtt
            .smoothed()
            .max(self.rtt.latest())
            .mul_f64(9.0 / 8.0);
        for pn in self.sent.outstanding_in(0, largest) {
            let Some(p) = self.sent.get(pn) else {
                continue;
            };
            if largest - pn >= self.cfg.reorder_threshold || p.time + delay <= now {
                self.declare_lost(now, pn, None);
            } else {
                let t = p.time + delay;
                self.loss_time = Some(self.loss_time.map_or(t, |l| l.min(t)));
            }
        }
    }

    fn declare_lost(&mut self, now: Instant, pn: u64, cause: Option<LossCause>) {
        let Some(p) = self.sent.remove(pn) else {
            return;
        };
        let cause = cause.unwrap_or_else(|| {
            let evidence = self
                .rtt
                .has_samples()
                .then(|| self.rtt.latest().saturating_sub(self.rtt.min()));
            let packet_time = self.pacer.transmission_time(self.cfg.mtu as u64);
            self.classifier.classify(evidence, packet_time)
        });
        self.stats.lost.add(cause);
        if cause == LossCause::Congestion && pn >= self.recovery_start_pn {
            self.cc.on_congestion(now);
            self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
            self.recovery_start_pn = self.next_pn;
            self.stats.congestion_events += 1;
        }
        // Redundant copies carry only DATA: while another member of the group is outstanding
        // its data may still arrive, but everything else needs repair now.
        let data_covered = p.group.is_some_and(|g| self.sent.group_outstanding(g));
        for fr in p.frames {
            if !(data_covered && matches!(fr, SentFrame::Data { .. })) {
                self.requeue(fr);
            }
        }
    }

    fn requeue(&mut self, fr: SentFrame) {
        match fr {
            SentFrame::Data {
                flow,
                offset,
                len,
                fin,
            } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    if f.reset.is_none() {
                        f.send.on_lost(offset, len as usize, fin);
                        self.queue_send(flow);
                    }
                }
            }
            SentFrame::Open { flow } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    if f.open == OpenState::Sent {
                        f.open = OpenState::Lost;
                        self.queue_control(flow);
                    }
                }
            }
            SentFrame::Reset { flow, .. } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    if let Some(r) = f.reset.as_mut() {
                        if !r.acked {
                            r.needs_send = true;
                            self.queue_control(flow);
                        }
                    }
                }
            }
            SentFrame::FlowCredit { flow } => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    f.credit_dirty = true;
                    self.queue_control(flow);
                }
            }
            SentFrame::AssocCredit => self.assoc_credit_pending = true,
            SentFrame::StreamSnack => {}
            SentFrame::Ping => {}
        }
    }

    // ---- timers ---------------------------------------------------------------------------

    fn pto_interval(&self) -> Duration {
        let base = self.rtt.pto(self.cfg.ack.max_delay);
        let backed_off = base.saturating_mul(1u32 << self.pto_count.min(16));
        backed_off.min(self.cfg.max_probe_interval.max(base))
    }

    /// Probe timer: runs from the last ACK (data may keep flowing in rate mode while nothing
    /// comes back, and that silence is what reveals an outage), then backs off from each firing.
    fn pto_deadline(&self) -> Option<Instant> {
        if self.sent.is_empty() || !self.established {
            return None;
        }
        let from = match (self.pto_fired_at, self.last_ack_at) {
            (Some(fired), _) if self.pto_count > 0 => fired,
            (_, Some(ack)) => ack.max(self.sent_since?),
            (_, None) => self.sent_since?,
        };
        Some(from + self.pto_interval())
    }

    /// How long a flow's cumulative point may sit behind a gap before the receiver names the
    /// missing bytes itself. Packet-level SNACK normally repairs holes within a round trip or
    /// two; this is the safety net.
    fn stall_timeout(&self) -> Duration {
        (self.rtt.smoothed() * 4).max(Duration::from_secs(1))
    }

    fn sweep_stalled_gaps(&mut self, now: Instant) {
        let timeout = self.stall_timeout();
        let mut any = false;
        let mut due = Vec::new();
        for (&id, f) in self.flows.iter_mut() {
            if let Some((c, since)) = f.gap_since {
                any = true;
                if now.saturating_duration_since(since) >= timeout {
                    f.gap_since = Some((c, now));
                    f.stream_snack_due = true;
                    due.push(id);
                }
            }
        }
        for id in due {
            self.queue_control(id);
        }
        self.gap_sweep_at = any.then(|| now + timeout / 2);
    }

    fn keepalive_deadline(&self) -> Option<Instant> {
        if !self.established || !self.sent.is_empty() {
            return None;
        }
        let last = self
            .last_eliciting_sent
            .or(self.last_ack_at)
            .or(self.established_at)?;
        Some(last + self.cfg.keepalive_interval)
    }

    fn outage_deadline(&self) -> Option<Instant> {
        self.outage_since.map(|s| s + self.cfg.outage_limit)
    }

    /// The earliest time `handle_timeout` or `poll_transmit` has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |c| c.min(x)));
            }
        };
        if !self.established || self.hello_reply_needed {
            consider(if self.hello_reply_needed {
                Some(self.last_input)
            } else {
                self.hello_due
            });
        }
        consider(self.loss_time);
        consider(self.pto_deadline());
        if self.probes_pending == 0 {
            consider(self.keepalive_deadline());
        }
        consider(self.outage_deadline());
        consider(self.gap_sweep_at);
        if self.close_pending.is_some() {
            consider(Some(self.last_input));
        }
        // Sending waits for the pacer, whatever made it due.
        let pacer = self.pacer.delay_until_or_now();
        let later_of = |d: Instant| Some(pacer.map_or(d, |p| p.max(d)));
        if self.established {
            if let Some(d) = self.acks.deadline() {
                consider(later_of(d));
            }
            if self.has_paced_work() {
                consider(pacer.or(self.last_eliciting_sent));
            }
        }
        t
    }

    fn has_paced_work(&self) -> bool {
        self.established
            && (self.probes_pending > 0
                || !self.control_queue.is_empty()
                || !self.orphan_resets.is_empty()
                || self.assoc_credit_pending
                || (self.outage_since.is_none()
                    && self.window_allows()
                    && (!self.send_queue.is_empty() || self.redundancy_available())))
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_input = self.last_input.max(now);
        if self.loss_time.is_some_and(|t| t <= now) {
            self.detect_lost(now);
        }
        if self.pto_deadline().is_some_and(|t| t <= now) {
            self.pto_fired_at = Some(now);
            self.pto_count += 1;
            self.probes_pending = 1;
            if self.pto_count >= OUTAGE_PTO_COUNT && self.outage_since.is_none() {
                self.outage_since = Some(self.last_ack_at.unwrap_or(now).min(now));
                self.stats.outages += 1;
                self.events.push_back(Event::OutageStarted);
            }
        }
        if self.keepalive_deadline().is_some_and(|t| t <= now) {
            self.probes_pending = 1;
        }
        if self.gap_sweep_at.is_some_and(|t| t <= now) {
            self.sweep_stalled_gaps(now);
        }
        if self.outage_deadline().is_some_and(|t| t <= now) {
            self.restart_association(ResetReason::OutageLimit);
            // A fresh epoch makes the peer drop its side of the flows too.
            self.local_epoch = self.local_epoch.wrapping_add(1).max(1);
            self.hello_due = Some(now);
            self.events.push_back(Event::AssociationLost {
                reason: LostReason::OutageLimit,
            });
        }
    }

    // ---- output ---------------------------------------------------------------------------

    fn window_allows(&self) -> bool {
        self.sent.bytes_in_flight() + self.cfg.mtu as u64 <= self.cc.window()
    }

    fn redundancy_available(&self) -> bool {
        self.cfg.idle_redundancy && self.send_queue.is_empty() && self.next_to_copy().is_some()
    }

    /// The original to copy next: newest first, one copy each per pass, at most
    /// `MAX_REDUNDANT_COPIES` passes while the link stays idle.
    fn next_to_copy(&self) -> Option<(u64, u8)> {
        let round = self.redundancy_round;
        if let Some(pn) = self
            .sent
            .newest_to_copy_below(self.redundancy_cursor, round)
        {
            return Some((pn, round));
        }
        (round < MAX_REDUNDANT_COPIES)
            .then(|| self.sent.newest_to_copy_below(self.next_pn, round + 1))
            .flatten()
            .map(|pn| (pn, round + 1))
    }

    fn queue_send(&mut self, id: FlowId) {
        if let Some(f) = self.flows.get_mut(&id) {
            if !f.in_send_queue && f.reset.is_none() {
                f.in_send_queue = true;
                self.send_queue.push_back(id);
            }
        }
    }

    fn queue_control(&mut self, id: FlowId) {
        if let Some(f) = self.flows.get_mut(&id) {
            if !f.in_control_queue {
                f.in_control_queue = true;
                self.control_queue.push_back(id);
            }
        }
    }

    fn maybe_assoc_credit(&mut self) {
        let target = self.assoc_consumed + self.cfg.assoc_window;
        if target >= self.assoc_limit_advertised + self.cfg.assoc_window / 8 {
            self.assoc_credit_pending = true;
        }
    }

    fn maybe_close_flow(&mut self, id: FlowId) {
        let Some(f) = self.flows.get(&id) else {
            return;
        };
        if !f.is_closed() {
            return;
        }
        self.flows.remove(&id);
        if id % 2 != self.role.parity() {
            self.peer_closed.insert(id / 2..id / 2 + 1);
        }
        self.events.push_back(Event::FlowClosed { flow: id });
    }

    fn assoc_allowance(&self) -> u64 {
        self.assoc_send_limit.saturating_sub(self.assoc_sent)
    }

    /// Writes the next datagram into `out` if one may leave now. Call until it returns false.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        self.last_input = self.last_input.max(now);
        out.clear();
        if let Some((pn, code, reason)) = self.close_pending.take() {
            let header = ShortHeader {
                pn_truncated: pn & mask(4),
                pn_len: 4,
                key_phase: false,
                implicit_data: None,
            };
            header.encode(out);
            frame::encode_close(out, code, &reason);
            self.protection.seal(pn, header.encoded_len(), out);
            self.stats.packets_sent += 1;
            self.stats.wire_bytes_sent += (out.len() + self.cfg.wire_overhead) as u64;
            return true;
        }
        if self.hello_reply_needed
            || (!self.established && self.hello_due.is_some_and(|t| t <= now))
        {
            let hello = Hello {
                version: PROTOCOL_VERSION,
                established: self.established,
                epoch: self.local_epoch,
                echo: self.peer_epoch.unwrap_or(0),
                params: HelloParams {
                    initial_flow_window: self.cfg.flow_window,
                    initial_assoc_window: self.cfg.assoc_window,
                    max_ack_delay_us: self.cfg.ack.max_delay.as_micros() as u64,
                },
            };
            hello.encode(out);
            self.hello_echo_sent = hello.echo;
            self.hello_reply_needed = false;
            if !self.established {
                self.hello_due = Some(now + self.cfg.hello_interval);
            }
            self.stats.packets_sent += 1;
            self.stats.wire_bytes_sent += (out.len() + self.cfg.wire_overhead) as u64;
            return true;
        }
        if !self.established || self.pacer.delay_until(now).is_some() {
            return false;
        }
        let ack_due = self.acks.is_due(now);
        if !(ack_due || self.has_paced_work()) {
            return false;
        }
        self.build_packet(now, out)
    }

    fn build_packet(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        let pn = self.next_pn;
        let unacked = pn - self.largest_acked.map_or(0, |l| l + 1) + 1;
        // Never fewer than 2 bytes: a 1-byte number is misread after reordering by more than
        // 128 packets (an ACK-only sender is never acknowledged, so the span rule alone
        // would allow it).
        let pn_len = truncation_len(unacked, 4).max(MIN_PN_LEN);
        let budget = self.cfg.max_datagram() - 1 - pn_len - self.protection.tag_len();
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        let mut frames: Vec<SentFrame> = Vec::new();

        if self.acks.has_pending() {
            if let Some(mut ack) = self.acks.build(now) {
                // Keep the newest ranges if they would crowd out everything else.
                while ack.ranges.len() > 2 && frame::ack_len(&ack) > budget / 2 {
                    ack.ranges.pop();
                }
                frame::encode_ack(&mut payload, &ack);
                self.stats.acks_sent += 1;
                if ack.has_holes() {
                    self.stats.snacks_sent += 1;
                }
            }
        }
        self.write_control(&mut payload, budget, &mut frames);

        let data_ok = self.outage_since.is_none() && self.window_allows();
        let mut planned: Vec<Planned> = Vec::new();
        let mut used = payload.len();
        if data_ok {
            self.plan_data(budget, &mut used, &mut planned, payload.is_empty());
        }
        let mut copy_of = None;
        if data_ok && planned.is_empty() && frames.is_empty() && self.redundancy_available() {
            copy_of = self.plan_copy(budget, &mut used, &mut planned, payload.is_empty());
        }
        if frames.is_empty() && planned.is_empty() && self.probes_pending > 0 {
            frame::encode_ping(&mut payload);
            frames.push(SentFrame::Ping);
            self.stats.probes_sent += 1;
        }
        self.probes_pending = 0;

        // A FIN always travels with an explicit length, so a truncated datagram can never
        // pass for a shorter stream.
        let implicit = payload.is_empty()
            && planned.len() == 1
            && planned
                .first()
                .is_some_and(|p| matches!(p, Planned::Data { fin: false, .. }));
        let count = planned.len();
        let mut implicit_data = None;
        for (i, p) in planned.into_iter().enumerate() {
            let Planned::Data {
                flow,
                offset,
                len,
                fin,
                offset_len,
            } = p;
            let Some(f) = self.flows.get(&flow) else {
                continue;
            };
            let masked = offset & mask(offset_len);
            if implicit {
                implicit_data = Some(ImplicitData { fin, offset_len });
                crate::codec::put_varint(&mut payload, flow);
                crate::codec::put_uint(&mut payload, masked, offset_len);
            } else {
                let mut ty = frame::TYPE_DATA_BASE | ((offset_len as u8 - 1) << 2);
                if fin {
                    ty |= 0x01;
                }
                let explicit_len = i + 1 < count || fin;
                if explicit_len {
                    ty |= 0x02;
                }
                payload.push(ty);
                crate::codec::put_varint(&mut payload, flow);
                crate::codec::put_uint(&mut payload, masked, offset_len);
                if explicit_len {
                    crate::codec::put_varint(&mut payload, len as u64);
                }
            }
            f.send.copy_to(offset, len, &mut payload);
            frames.push(SentFrame::Data {
                flow,
                offset,
                len: len as u32,
                fin,
            });
        }

        if payload.is_empty() {
            self.payload = payload;
            return false;
        }
        let header = ShortHeader {
            pn_truncated: pn & mask(pn_len),
            pn_len,
            key_phase: false,
            implicit_data,
        };
        header.encode(out);
        out.extend_from_slice(&payload);
        self.payload = payload;
        self.protection.seal(pn, header.encoded_len(), out);
        self.next_pn += 1;

        let wire = (out.len() + self.cfg.wire_overhead - self.protection.tag_len()) as u64;
        self.stats.packets_sent += 1;
        self.stats.wire_bytes_sent += wire;
        self.pacer.on_sent(now, wire);
        if !frames.is_empty() {
            let has_data = frames.iter().any(|f| matches!(f, SentFrame::Data { .. }));
            if self.sent.is_empty() {
                self.sent_since = Some(now);
            }
            let group = copy_of.and_then(|(orig, complete)| self.sent.note_copy(orig, complete));
            self.sent.insert(
                pn,
                SentPacket {
                    time: now,
                    wire_bytes: wire,
                    frames,
                    group,
                    is_copy: copy_of.is_some(),
                    copies: 0,
                    has_data,
                },
            );
            if copy_of.is_none() && has_data {
                // Copies go newest first: restart the search above the new original.
                self.redundancy_cursor = self.next_pn;
                self.redundancy_round = 1;
            }
            self.last_eliciting_sent = Some(now);
        }
        true
    }

    fn write_control(&mut self, payload: &mut Vec<u8>, budget: usize, frames: &mut Vec<SentFrame>) {
        if self.assoc_credit_pending && budget - payload.len() > 12 {
            let limit = self.assoc_consumed + self.cfg.assoc_window;
            frame::encode_assoc_credit(payload, limit);
            self.assoc_limit_advertised = self.assoc_limit_advertised.max(limit);
            self.assoc_credit_pending = false;
            frames.push(SentFrame::AssocCredit);
        }
        while budget.saturating_sub(payload.len()) > 24 {
            let Some((flow, reason)) = self.orphan_resets.pop() else {
                break;
            };
            frame::encode_reset(payload, flow, reason, 0);
            frames.push(SentFrame::Ping);
        }
        while let Some(id) = self.control_queue.pop_front() {
            let room = budget.saturating_sub(payload.len());
            let allowance = self.assoc_allowance();
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            let meta = f.meta;
            let needed = match (f.open, meta) {
                (OpenState::Pending | OpenState::Lost, Some(m)) => {
                    frame::open_header_len(id, &m, 0)
                }
                _ => 0,
            } + 24;
            if room < needed + 8 {
                self.control_queue.push_front(id);
                break;
            }
            f.in_control_queue = false;
            if let (OpenState::Pending | OpenState::Lost, Some(m)) = (f.open, meta) {
                let mut chunk = None;
                if f.open == OpenState::Pending && f.reset.is_none() {
                    let max = room - frame::open_header_len(id, &m, room) - 24;
                    chunk = f.send.next_chunk(max, allowance).filter(|c| c.offset == 0);
                }
                let start = payload.len();
                let (len, fin) = chunk.map_or((0, false), |c| (c.len, c.fin));
                frame::encode_open(payload, id, &m, &[], fin);
                if len > 0 {
                    // Re-encode with the first bytes inline.
                    payload.truncate(start);
                    let mut data = Vec::with_capacity(len);
                    f.send.copy_to(0, len, &mut data);
                    frame::encode_open(payload, id, &m, &data, fin);
                }
                f.open = OpenState::Sent;
                frames.push(SentFrame::Open { flow: id });
                if let Some(c) = chunk {
                    self.assoc_sent += c.len as u64;
                    self.stats.stream_bytes_sent += c.len as u64;
                    frames.push(SentFrame::Data {
                        flow: id,
                        offset: 0,
                        len: c.len as u32,
                        fin: c.fin,
                    });
                }
            }
            if let Some(r) = f.reset.as_mut() {
                if r.needs_send {
                    frame::encode_reset(payload, id, r.reason, f.send.next_new());
                    r.needs_send = false;
                    frames.push(SentFrame::Reset {
                        flow: id,
                        reason: r.reason,
                    });
                }
            } else if f.stream_snack_due {
                let gaps = f.recv.gaps(frame::MAX_STREAM_SNACK_RANGES);
                f.stream_snack_due = false;
                if !gaps.is_empty() {
                    frame::encode_stream_snack(payload, id, &gaps);
                    frames.push(SentFrame::StreamSnack);
                }
                if f.credit_dirty {
                    f.in_control_queue = true;
                    self.control_queue.push_back(id);
                }
            } else if f.credit_dirty {
                let limit = f
                    .recv
                    .current_limit()
                    .max(f.recv.read_offset() + self.cfg.flow_window);
                frame::encode_flow_credit(payload, id, limit);
                f.recv.set_advertised(limit);
                f.credit_dirty = false;
                frames.push(SentFrame::FlowCredit { flow: id });
            }
            let more_data = f
                .send
                .has_sendable(self.assoc_send_limit.saturating_sub(self.assoc_sent));
            if more_data {
                self.queue_send(id);
            }
        }
    }

    /// Picks DATA frames round-robin across flows until the packet is full.
    fn plan_data(
        &mut self,
        budget: usize,
        used: &mut usize,
        planned: &mut Vec<Planned>,
        empty: bool,
    ) {
        let mut rounds = self.send_queue.len();
        while rounds > 0 {
            rounds -= 1;
            let Some(id) = self.send_queue.pop_front() else {
                break;
            };
            let allowance = self.assoc_allowance();
            let others = !self.send_queue.is_empty();
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            let room = budget.saturating_sub(*used);
            let span_max = (f.send.next_new() + room as u64) - f.send.acked_base();
            let offset_len = truncation_len(span_max, 4);
            // Room for a type byte and a length when the frame may carry the FIN.
            let may_fin = f.send.is_finished_by_app();
            let implicit = empty && planned.is_empty() && !others && !may_fin;
            let overhead = crate::codec::varint_len(id)
                + offset_len
                + if implicit { 0 } else { 1 }
                + if others || may_fin { 2 } else { 0 };
            if room <= overhead {
                self.send_queue.push_front(id);
                break;
            }
            let chunk = if f.reset.is_none() && f.open != OpenState::Pending {
                f.send.next_chunk(room - overhead, allowance)
            } else {
                None
            };
            let Some(c) = chunk else {
                f.in_send_queue = false;
                continue;
            };
            if c.retransmit {
                self.stats.stream_bytes_retransmitted += c.len as u64;
            } else {
                self.assoc_sent += c.len as u64;
                self.stats.stream_bytes_sent += c.len as u64;
            }
            *used += overhead + c.len;
            planned.push(Planned::Data {
                flow: id,
                offset: c.offset,
                len: c.len,
                fin: c.fin,
                offset_len,
            });
            if f.send
                .has_sendable(self.assoc_send_limit.saturating_sub(self.assoc_sent))
            {
                self.send_queue.push_back(id);
            } else {
                f.in_send_queue = false;
            }
            if budget.saturating_sub(*used) < 32 {
                break;
            }
        }
    }

    /// Plans a redundant copy of an outstanding packet's unacknowledged data (and FIN).
    /// Returns the original and whether the copy covers all of it: only a complete copy
    /// may stand in for the original's repair.
    fn plan_copy(
        &mut self,
        budget: usize,
        used: &mut usize,
        planned: &mut Vec<Planned>,
        empty: bool,
    ) -> Option<(u64, bool)> {
        let (orig, round) = self.next_to_copy()?;
        self.redundancy_cursor = orig;
        self.redundancy_round = round;
        let frames = self.sent.get(orig)?.frames.clone();
        // (flow, offset, len, fin)
        let mut pieces: Vec<(FlowId, u64, usize, bool)> = Vec::new();
        for fr in frames {
            let SentFrame::Data {
                flow,
                offset,
                len,
                fin,
            } = fr
            else {
                continue;
            };
            let Some(f) = self.flows.get(&flow).filter(|f| f.reset.is_none()) else {
                continue;
            };
            let end = offset + u64::from(len);
            let ranges = f.send.unacked_within(offset, len as usize);
            let fin_pending = fin && !f.send.fin_acked();
            for r in &ranges {
                let piece_fin = fin_pending && r.end == end;
                pieces.push((flow, r.start, (r.end - r.start) as usize, piece_fin));
            }
            if fin_pending && ranges.last().is_none_or(|r| r.end != end) {
                pieces.push((flow, end, 0, true));
            }
        }
        let count = pieces.len();
        let mut complete = true;
        for (flow, offset, len, fin) in pieces {
            let Some(f) = self.flows.get(&flow) else {
                continue;
            };
            let span = (offset + len as u64).max(f.send.next_new()) - f.send.acked_base();
            let offset_len = truncation_len(span, 4);
            let implicit = empty && count == 1 && !fin;
            let overhead =
                crate::codec::varint_len(flow) + offset_len + if implicit { 0 } else { 3 };
            let room = budget.saturating_sub(*used);
            if room <= overhead {
                complete = false;
                break;
            }
            let take = len.min(room - overhead);
            complete &= take == len;
            self.stats.stream_bytes_redundant += take as u64;
            *used += overhead + take;
            planned.push(Planned::Data {
                flow,
                offset,
                len: take,
                fin: fin && take == len,
                offset_len,
            });
        }
        (!planned.is_empty()).then_some((orig, complete))
    }
}

fn mask(bytes: usize) -> u64 {
    if bytes >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * bytes)) - 1
    }
}

/// Parses a short packet's payload completely before anything is applied, so a malformed
/// packet changes no state.
fn parse_frames<'a>(
    payload: &'a [u8],
    header: ShortHeader,
) -> Result<Vec<Frame<'a>>, crate::codec::DecodeError> {
    let mut r = Reader::new(payload);
    let mut frames = Vec::new();
    if let Some(d) = header.implicit_data {
        frames.push(Frame::decode_implicit_data(&mut r, d.fin, d.offset_len)?);
        return Ok(frames);
    }
    while !r.is_empty() {
        frames.push(Frame::decode(&mut r)?);
    }
    if frames.is_empty() {
        return Err(crate::codec::DecodeError::Invalid("empty packet"));
    }
    Ok(frames)
}
