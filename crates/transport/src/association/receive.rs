//! Input: datagrams, the handshake, and the frames they carry.

use super::*;
use crate::security::{AcceptedInitiation, DropReason, InitiationRead};

impl Association {
    /// Processes one received datagram. Anything malformed, unauthenticated or replayed is
    /// dropped and counted, never answered.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.receive(now, None, datagram);
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram from `from`: what the peer
    /// proves with it (a reply, a confirming packet) tells where it is now.
    pub fn handle_datagram_from(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) {
        self.receive(now, Some(from), datagram);
    }

    /// An initiation the endpoint read and authenticated for this association, from `from`:
    /// answered unless our own initiation takes precedence. The reply goes to `from`.
    pub fn accept_initiation(&mut self, now: Instant, from: SocketAddr, a: AcceptedInitiation) {
        let now = self.received_at(now);
        let Some(sec) = self.security.as_mut() else {
            self.stats.security.wrong_mode += 1;
            return;
        };
        // Our initiation went to the address we know for the peer, if any (one is learned
        // only from what it proves). It can cross the peer's only if the peer's came from
        // that address: without one ours never left, and from another (a peer that came
        // back behind NAT on a new port) ours went where the peer no longer is. Either way
        // it must not win over the peer's.
        let ours_sent = self.remote == Some(from);
        let read = sec.accept_initiation(a, ours_sent);
        self.on_initiation_read(now, Some(from), read);
    }

    /// When a datagram counts as received: the time it arrived, which the caller may know
    /// from the socket and which can precede what the association was last given (it
    /// arrived while the previous pass was processed), but never earlier than that, so RTT
    /// and delivery samples, timers and the pacer never see time go back.
    fn received_at(&mut self, arrived: Instant) -> Instant {
        self.last_input = self.last_input.max(arrived);
        self.last_input
    }

    fn receive(&mut self, now: Instant, from: Option<SocketAddr>, datagram: &[u8]) {
        let now = self.received_at(now);
        let mut r = Reader::new(datagram);
        let header = match decode_header_with_cid(&mut r, self.local_cid.len()) {
            Ok(h) => h,
            Err(_) => {
                self.stats.malformed_dropped += 1;
                return;
            }
        };
        let secure = self.security.is_some();
        let short = match header {
            Header::Short(s) => s,
            Header::Hello(h) if !secure => {
                // Without security nothing proves who sent a packet: the address is the
                // peer's identity, learned once and never moved.
                if self.remote.is_none() {
                    self.remote = from;
                }
                return self.on_hello(h);
            }
            Header::HandshakeInit if secure => return self.on_handshake_init(now, from, datagram),
            Header::HandshakeReply if secure => {
                return self.on_handshake_reply(now, from, datagram)
            }
            Header::Cookie if secure => return self.on_cookie(now, datagram),
            Header::Hint if secure => return self.on_hint(now, from, datagram),
            Header::Hello(_)
            | Header::HandshakeInit
            | Header::HandshakeReply
            | Header::Cookie
            | Header::Hint => {
                self.stats.security.wrong_mode += 1;
                return;
            }
        };
        let mut rx = std::mem::take(&mut self.rx_buf);
        rx.clear();
        rx.extend_from_slice(datagram);
        let opened = if secure {
            self.open_secure(now, from, &short, &mut rx)
        } else {
            self.open_plain(&short, &rx)
        };
        if let Some((pn, payload_len)) = opened {
            let header_len = short.encoded_len();
            self.on_packet(
                now,
                pn,
                short,
                &rx[header_len..header_len + payload_len],
                datagram.len(),
            );
        }
        self.rx_buf = rx;
    }

    /// The packet number of a short packet without protection, if it is to be processed.
    fn open_plain(&mut self, short: &ShortHeader, rx: &[u8]) -> Option<(u64, usize)> {
        if self.peer_epoch.is_none() {
            self.stats.unassociated_dropped += 1;
            // A peer that still thinks we are associated needs our HELLO to notice.
            self.hello_reply_needed = true;
            return None;
        }
        let expected = self.acks.largest().map_or(0, |l| l + 1);
        let pn = expand_truncated(short.pn_truncated, short.pn_len, expected);
        if self.acks.is_duplicate(pn) {
            self.stats.duplicates_dropped += 1;
            return None;
        }
        Some((pn, rx.len() - short.encoded_len()))
    }

    /// Authenticates and decrypts a short packet in place; a packet under the keys of our
    /// pending reply confirms the handshake and puts them in use first.
    fn open_secure(
        &mut self,
        now: Instant,
        from: Option<SocketAddr>,
        short: &ShortHeader,
        rx: &mut [u8],
    ) -> Option<(u64, usize)> {
        let expected = self.acks.largest().map_or(0, |l| l + 1);
        let sec = self.security.as_mut()?;
        let opened = match sec.open(short, expected, rx) {
            Ok(o) => o,
            Err(drop) => {
                drop.count(&mut self.stats.security);
                return None;
            }
        };
        // Roaming as WireGuard does it, with QUIC's guard against replays: only a packet
        // that authenticates and is the newest yet moves the peer. A copy of an older one
        // sent from elsewhere (the replay window lets some of them through once) moves
        // nothing, so an attacker cannot redirect us with what it captured before.
        let newest = self.acks.largest().is_none_or(|l| opened.pn > l);
        if let (Some(from), true, None) = (from, newest, &opened.confirmed) {
            self.set_remote(now, from);
        }
        if let Some(reply) = opened.confirmed {
            // The packet's own phase is the one the initiator chose for these keys.
            let h = reply.peer_hello;
            self.start_session(now, h, reply.into_keys(), |_, _| short.key_phase);
            if let Some(sec) = self.security.as_mut() {
                sec.record(opened.pn);
            }
            // The initiator proved it holds the new keys from there.
            if let Some(from) = from {
                self.set_remote(now, from);
            }
        }
        Some((opened.pn, opened.payload_len))
    }

    /// Frames of a packet that passed protection and duplicate checks.
    fn on_packet(
        &mut self,
        now: Instant,
        pn: u64,
        short: ShortHeader,
        payload: &[u8],
        datagram_len: usize,
    ) {
        match parse_frames(payload, short) {
            Ok(frames) => {
                self.stats.packets_received += 1;
                self.last_received = Some(now);
                self.current_hub_answered();
                self.stats.wire_bytes_received +=
                    (datagram_len + self.cfg.wire_overhead - self.tag_len()) as u64;
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
                    self.heard_since_pto = true;
                }
            }
            Err(_) => self.stats.malformed_dropped += 1,
        }
    }

    /// A peer's Noise initiation: answered if it authenticates, whatever our state.
    fn on_handshake_init(&mut self, now: Instant, from: Option<SocketAddr>, datagram: &[u8]) {
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let read = sec.read_initiation(now, datagram);
        self.on_initiation_read(now, from, read);
    }

    /// Answers an initiation that authenticated (a repeat is answered with the same reply);
    /// the reply goes back where the initiation came from.
    fn on_initiation_read(&mut self, now: Instant, from: Option<SocketAddr>, read: InitiationRead) {
        let (responder, ephemeral, h) = match read {
            InitiationRead::Answer {
                responder,
                ephemeral,
                hello,
            } => (responder, ephemeral, hello),
            InitiationRead::Repeated => {
                self.reply_to = from;
                return;
            }
            InitiationRead::Collision => {
                self.stats.security.handshake_collision += 1;
                return;
            }
            InitiationRead::Dropped(d) => {
                d.count(&mut self.stats.security);
                return;
            }
        };
        if self.retired_peer_epochs.contains(&h.epoch) {
            self.stats.security.handshake_replayed += 1;
            return;
        }
        // Epochs grow with every start (the daemon takes them from the clock), so an
        // authenticated initiation with a greater epoch than the one we hold is the peer
        // having restarted, not a replay: drop the old association now rather than a round
        // trip later at confirmation, so no new flow starts in it. A smaller new epoch
        // (a clock stepped back) waits for the confirmation instead.
        if self.established && self.peer_epoch.is_some_and(|p| h.epoch > p) {
            self.apply_peer_hello(h);
        }
        let rekey = self.is_rekey(&h);
        let mut ours = self.local_hello();
        ours.echo = h.epoch;
        let mut encoded = Vec::new();
        ours.encode(&mut encoded);
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        match sec.answer(now, responder, ephemeral, &encoded, h, !rekey) {
            Ok(()) => self.reply_to = from,
            Err(d) => {
                // Without an AEAD in common the reply still goes, so the initiator learns why.
                if d == DropReason::AeadMismatch {
                    self.reply_to = from;
                }
                d.count(&mut self.stats.security);
            }
        }
    }

    /// A busy responder's answer to our initiation: the initiation goes again at once,
    /// carrying the cookie.
    fn on_cookie(&mut self, now: Instant, datagram: &[u8]) {
        let cid_len = self.local_cid.len();
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        match sec.on_cookie(now, datagram, cid_len) {
            Ok(()) if !self.established => self.hello_due = Some(now),
            Ok(()) => {}
            Err(d) => d.count(&mut self.stats.security),
        }
    }

    /// A hub's "I do not know you" (docs/PROTOCOL.md §7.7). Unauthenticated, so it never
    /// changes the association: if it echoes a packet of ours outstanding at the hub we
    /// send to, an initiation goes to that hub at once (at most one a second). A hub that
    /// lost us answers it with a new epoch, and only that authenticated reply restarts the
    /// association; a hub that still holds us answers it as a rekey.
    fn on_hint(&mut self, now: Instant, from: Option<SocketAddr>, datagram: &[u8]) {
        let hint = match crate::packet::parse_hint(datagram, self.peer_cid.len()) {
            Ok(h) if !self.peer_cid.is_empty() => h,
            _ => {
                self.stats.malformed_dropped += 1;
                return;
            }
        };
        if from.is_none() || from != self.remote {
            self.stats.hints.elsewhere += 1;
            return;
        }
        if !self.established {
            // Initiating already.
            self.stats.hints.ignored += 1;
            return;
        }
        let (truncated, pn_len) = hint.packet_number();
        let pn = expand_truncated(truncated, pn_len, self.next_pn.saturating_sub(1));
        let ours = hint.cid == self.peer_cid.as_slice()
            && pn < self.next_pn
            && self
                .sent
                .get(pn)
                .is_some_and(|p| p.tag_tail == hint.tag_tail);
        if !ours {
            self.stats.hints.unmatched += 1;
            return;
        }
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        if sec.on_matched_hint(now) {
            self.stats.hints.acted += 1;
        } else {
            self.stats.hints.rate_limited += 1;
        }
    }

    /// The reply to our initiation: the peer is authenticated and the keys are ready.
    fn on_handshake_reply(&mut self, now: Instant, from: Option<SocketAddr>, datagram: &[u8]) {
        match self.reply_from(from) {
            handover::ReplyFrom::Current => {}
            handover::ReplyFrom::Trial(from) => return self.on_trial_reply(now, from, datagram),
            handover::ReplyFrom::Elsewhere => {
                self.stats.security.handshake_invalid += 1;
                return;
            }
        }
        let cid_len = self.local_cid.len();
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let (hello, split) = match sec.read_reply(now, datagram, cid_len) {
            Ok(r) => r,
            Err(d) => {
                d.count(&mut self.stats.security);
                return;
            }
        };
        let Some(h) = self.reply_hello(&hello) else {
            return;
        };
        // A reply is bound to our own fresh initiation, so it is never a replay, whatever
        // its epoch: a peer we left (a hub we return to) may answer with the epoch we
        // retired, and it is the live peer now.
        self.retired_peer_epochs.retain(|&e| e != h.epoch);
        let Some(sec) = self.security.as_ref() else {
            return;
        };
        let keys = match sec.session_keys(split, &h) {
            Ok(k) => k,
            Err(d) => {
                d.count(&mut self.stats.security);
                return;
            }
        };
        // The responder answered from there with the keys of our initiation.
        if let Some(from) = from {
            self.set_remote(now, from);
        }
        // A new association starts in phase 0; a rekey flips the phase.
        self.start_session(now, h, keys, |sec, rekey| rekey && sec.next_phase());
        // The responder uses the keys once it sees them in use: confirm at once.
        self.probes_pending = self.probes_pending.max(1);
        self.current_hub_answered();
    }

    /// Whether a handshake carrying `h` replaces the keys of the running association
    /// rather than starting a new one: the peer is the one we hold (its epoch), and, at a
    /// hub that shares its key with other hubs (`Initiate::RekeyOnly`), it is associated
    /// with us (it echoes ours). There a peer that echoes another epoch is associated
    /// elsewhere (a terminal back from another hub with the same key), and its packet
    /// numbers began again there. Elsewhere the echo is not required: a gateway that
    /// initiates after its restart meets the peer's initiation from the outage, which
    /// still echoes the epoch before the restart, and must take it as the rekey it is.
    fn is_rekey(&self, h: &Hello) -> bool {
        let echo_required = self.cfg.initiate == Initiate::RekeyOnly;
        self.established
            && self.peer_epoch == Some(h.epoch)
            && (h.echo == self.local_epoch || !echo_required)
    }

    /// Puts the keys of a completed handshake in use: for a new association the peer's
    /// HELLO is applied first (a new epoch resets the old one), for a rekey the association
    /// goes on. `phase(security, rekey)` picks the key phase.
    /// The responder's HELLO (encoded) in a reply that authenticated; `None`, counted as
    /// an invalid handshake, when it is not a HELLO of our version.
    pub(super) fn reply_hello(&mut self, encoded: &[u8]) -> Option<Hello> {
        match decode_header(&mut Reader::new(encoded)) {
            Ok(Header::Hello(h)) if h.version == PROTOCOL_VERSION => Some(h),
            _ => {
                self.stats.security.handshake_invalid += 1;
                None
            }
        }
    }

    pub(super) fn start_session(
        &mut self,
        now: Instant,
        h: Hello,
        keys: crate::security::SessionKeys,
        phase: impl FnOnce(&Security, bool) -> bool,
    ) {
        let rekey = self.is_rekey(&h);
        if !rekey && self.established && self.peer_epoch == Some(h.epoch) {
            // The same peer epoch starting a new association over an established one:
            // applying the HELLO alone would keep the old one. Not yet established, the
            // association is the one this handshake completes (the peer's epoch was
            // applied when its initiation crossed ours), and its flows are already new.
            self.restart_association(ResetReason::PeerRestart);
            self.stats.peer_restarts += 1;
            self.events.push_back(Event::PeerRestarted);
        }
        if !rekey && h.echo != 0 && h.echo != self.local_epoch {
            self.stats.associations_taken_over += 1;
        }
        if !rekey {
            self.apply_peer_hello(h);
        }
        self.peer_cid = h.cid;
        let next_pn = self.next_pn;
        if let Some(sec) = self.security.as_mut() {
            let phase = phase(sec, rekey);
            sec.install(keys, phase, rekey, now, next_pn);
        }
        self.stats.handshakes_completed += 1;
        self.last_handshake = Some(now);
        // Each handshake message that completes one is the peer's, authenticated.
        self.last_received = Some(now);
        if rekey {
            self.stats.rekeys += 1;
        }
        self.set_established();
    }

    pub(super) fn on_hello(&mut self, h: Hello) {
        if h.version != PROTOCOL_VERSION {
            self.stats.malformed_dropped += 1;
            return;
        }
        if self.retired_peer_epochs.contains(&h.epoch) {
            // A delayed or duplicated HELLO of an association already replaced.
            self.stats.malformed_dropped += 1;
            return;
        }
        self.apply_peer_hello(h);
        if h.echo == self.local_epoch {
            self.set_established();
        }
        // A peer that is not established is waiting for our echo; answer every such HELLO
        // (ours may have been lost). Established peers' HELLOs need no answer unless they
        // lack our epoch, so replies never ping-pong.
        if !h.established || h.echo != self.local_epoch || self.hello_echo_sent != h.epoch {
            self.hello_reply_needed = true;
        }
    }

    /// Takes the peer's epoch and parameters; a new epoch means the peer restarted and
    /// every flow of the old association is reset.
    pub(super) fn apply_peer_hello(&mut self, h: Hello) {
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
        self.peer_cid = h.cid;
        self.peer_compression = h.compression;
        // Truncated offsets are unambiguous only for windows up to 1 GiB.
        self.peer_params = Some(HelloParams {
            initial_flow_window: h.params.initial_flow_window.min(MAX_WINDOW),
            initial_assoc_window: h.params.initial_assoc_window,
            max_ack_delay_us: h.params.max_ack_delay_us,
            reads_ack_times: h.params.reads_ack_times,
        });
    }

    pub(super) fn set_established(&mut self) {
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
        self.cc.on_established(self.last_input);
        self.events.push_back(Event::Established);
    }

    /// Drops all flows and packet-number state, as after a peer restart or a lost link.
    pub(super) fn restart_association(&mut self, reason: ResetReason) {
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
        self.reordering.on_restart();
        self.pto_count = 0;
        self.silent_probe_at = None;
        self.heard_since_pto = false;
        self.probes_pending = 0;
        self.outage_since = None;
        self.redundancy_cursor = 0;
        self.redundancy_round = 1;
        self.recovery_start_pn = 0;
        self.acks = AckTracker::new(self.cfg.ack);
        // The peer's ACK clock starts again from its restart.
        self.return_path = Default::default();
        self.sched.clear();
        self.control_queue.clear();
        self.next_local_flow = self.role.parity();
        self.peer_closed = RangeSet::new();
        self.cc.on_restart();
        self.assoc_send_limit = 0;
        self.assoc_sent = 0;
        self.assoc_charged = 0;
        self.assoc_consumed = 0;
        self.assoc_limit_advertised = self.cfg.assoc_window;
        self.assoc_credit_pending = false;
        self.orphan_resets.clear();
        if let Some(sec) = self.security.as_mut() {
            sec.reset_session();
        }
    }

    pub(super) fn on_frame(&mut self, now: Instant, f: Frame<'_>) {
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
                        // One over `max_flows` is reset already: the application has its
                        // FlowReset and must not open a connection for it.
                        if f.reset.is_none() {
                            self.events.push_back(Event::FlowOpened { flow: id, meta });
                        }
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
    pub(super) fn peer_flow(&mut self, flow: FlowId) -> Option<FlowId> {
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
        self.sched.count_flow(0, true);
        self.stats.flows_opened_total += 1;
        if self.flows.len() > self.cfg.max_flows {
            self.stats.flows_over_limit += 1;
            self.abort_flow(flow, ResetReason::ResourceLimit);
        }
        Some(flow)
    }

    pub(super) fn peer_or_local_flow(&mut self, flow: FlowId) -> Option<FlowId> {
        if flow % 2 == self.role.parity() {
            self.flows.contains_key(&flow).then_some(flow)
        } else {
            self.peer_flow(flow)
        }
    }

    pub(super) fn on_stream_data(&mut self, id: FlowId, offset: u64, data: &[u8], fin: bool) {
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
    pub(super) fn on_reset_without_state(
        &mut self,
        flow: FlowId,
        reason: ResetReason,
        final_offset: u64,
    ) {
        let peer_id = flow % 2 != self.role.parity();
        if peer_id && !self.peer_closed.contains(flow / 2) {
            if final_offset > self.cfg.flow_window {
                // A flow we never saw cannot have sent beyond the initial credit we grant;
                // a larger final offset would only corrupt association-wide accounting.
                self.stats.protocol_violations += 1;
                return;
            }
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

    pub(super) fn on_peer_reset(&mut self, id: FlowId, reason: ResetReason, final_offset: u64) {
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        // The peer cannot have sent beyond the credit we advertised: a larger final offset
        // is a protocol violation and is not charged.
        let final_offset = if final_offset > f.recv.limit_advertised() {
            self.stats.protocol_violations += 1;
            f.recv.highest()
        } else {
            final_offset
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
}

/// Parses a short packet's payload completely before anything is applied, so a malformed
/// packet changes no state.
pub(super) fn parse_frames<'a>(
    payload: &'a [u8],
    header: ShortHeader,
) -> Result<Vec<Frame<'a>>, crate::codec::DecodeError> {
    // One decoder for the receive path and the fuzz targets.
    frame::decode_payload(payload, header.implicit_data)
}
