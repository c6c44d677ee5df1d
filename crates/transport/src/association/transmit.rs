//! Output: what the next datagram carries, built under the pacer and the window.

use super::*;
use crate::packet::HINT_TAG_TAIL_LEN;
use crate::traffic_class::SCHEDULING_QUANTUM;

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

/// Offset bytes of a repair or a redundant copy: its original may have arrived after all, and
/// data sent after it may have arrived first, so the receiver may have moved on by any amount
/// before it comes; only the longest form stays unambiguous (docs/PROTOCOL.md §2.2).
const REPAIR_OFFSET_LEN: usize = 4;

impl Association {
    pub(super) fn window_allows(&self) -> bool {
        self.sent.bytes_in_flight() + self.cfg.mtu as u64 <= self.cc.window(&self.rtt)
    }

    pub(super) fn redundancy_available(&self) -> bool {
        self.cfg.idle_redundancy
            && self.loss_rate.worth_redundancy()
            && self.sched.is_empty()
            && self.next_to_copy().is_some()
    }

    /// The original to copy next: newest first, one copy each per pass, at most
    /// `MAX_REDUNDANT_COPIES` passes while the link stays idle.
    pub(super) fn next_to_copy(&self) -> Option<(u64, u8)> {
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

    pub(super) fn queue_send(&mut self, id: FlowId) {
        if let Some(f) = self.flows.get_mut(&id) {
            if !f.in_send_queue && f.reset.is_none() {
                f.in_send_queue = true;
                self.sched.push_back(f.class, id);
            }
        }
    }

    pub(super) fn queue_control(&mut self, id: FlowId) {
        if let Some(f) = self.flows.get_mut(&id) {
            if !f.in_control_queue {
                f.in_control_queue = true;
                self.control_queue.push_back(id);
            }
        }
    }

    pub(super) fn maybe_assoc_credit(&mut self) {
        let target = self.assoc_consumed + self.cfg.assoc_window;
        if target >= self.assoc_limit_advertised + self.cfg.assoc_window / 8 {
            self.assoc_credit_pending = true;
        }
    }

    pub(super) fn maybe_close_flow(&mut self, id: FlowId) {
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

    pub(super) fn assoc_allowance(&self) -> u64 {
        self.assoc_send_limit.saturating_sub(self.assoc_sent)
    }

    /// [`poll_transmit`](Self::poll_transmit) with the datagram's destination: a handshake
    /// reply goes where its initiation came from, everything else to [`remote`](Self::remote).
    /// `None` when nothing may leave now, or when the destination is not known yet (the
    /// datagram is then dropped: a peer without a configured address is learned from the
    /// first packet it authenticates).
    pub fn poll_transmit_to(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let is_reply =
            self.close_pending.is_none() && self.security.as_ref().is_some_and(|s| s.has_outbox());
        if !self.poll_transmit(now, out) {
            return None;
        }
        if let Some(to) = self.sent_elsewhere.take() {
            return Some(to);
        }
        if is_reply {
            if let Some(to) = self.reply_to.take() {
                return Some(to);
            }
        }
        self.remote
    }

    /// Writes the next datagram into `out` if one may leave now. Call until it returns false.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        self.last_input = self.last_input.max(now);
        out.clear();
        self.sent_elsewhere = None;
        if let Some(datagram) = self.close_pending.take() {
            out.extend_from_slice(&datagram);
            self.sent_elsewhere = self.close_to.take();
            self.count_sent_unpaced(out.len());
            return true;
        }
        if self.security.is_some() {
            if self.poll_handshake(now, out) {
                self.count_sent_unpaced(out.len());
                return true;
            }
            if let Some(to) = self.poll_trial(now, out) {
                self.sent_elsewhere = Some(to);
                self.count_sent_unpaced(out.len());
                return true;
            }
        } else if self.hello_reply_needed
            || (!self.established && self.hello_due.is_some_and(|t| t <= now))
        {
            let hello = self.local_hello();
            hello.encode(out);
            self.hello_echo_sent = hello.echo;
            self.hello_reply_needed = false;
            if !self.established {
                self.hello_due = Some(now + self.cfg.hello_interval);
            }
            self.count_sent_unpaced(out.len());
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

    fn count_sent_unpaced(&mut self, len: usize) {
        self.stats.packets_sent += 1;
        self.stats.wire_bytes_sent += (len + self.cfg.wire_overhead) as u64;
    }

    /// Our HELLO as it stands: our epoch, the peer epoch we know, our parameters.
    pub(super) fn local_hello(&self) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            established: self.established,
            epoch: self.local_epoch,
            echo: self.peer_epoch.unwrap_or(0),
            params: HelloParams {
                initial_flow_window: self.cfg.flow_window,
                initial_assoc_window: self.cfg.assoc_window,
                max_ack_delay_us: self.cfg.ack.max_delay.as_micros() as u64,
                reads_ack_times: true,
            },
            cid: self.local_cid,
            aeads: self.security.as_ref().map(|sec| sec.offer()),
            compression: self.cfg.compression,
        }
    }

    /// A Noise handshake datagram, if one is due: a queued reply first, then our
    /// initiation (at start, while not established; later, to rekey).
    fn poll_handshake(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        let next_pn = self.next_pn;
        let established = self.established;
        let always = self.cfg.initiate == Initiate::Always;
        let start_due = always && !established && self.hello_due.is_some_and(|t| t <= now);
        // A lost rekey initiation is repeated once a reply could have come back.
        let retransmit_after = if established {
            self.cfg.hello_interval.max(self.rtt.smoothed() * 2)
        } else {
            self.cfg.hello_interval
        };
        let hello = self.local_hello();
        let scid = self.local_cid;
        let Some(sec) = self.security.as_mut() else {
            return false;
        };
        if let Some(d) = sec.take_outbox() {
            out.extend_from_slice(&d);
            return true;
        }
        // In an outage the peer may have restarted and lost our keys (a hub cannot reach a
        // terminal behind NAT itself): a new handshake finds out, and is a rekey if not.
        let outage = self.outage_since.is_some();
        let due = if established && !always {
            // Only a path that answers is rekeyed: a hub cut off from a terminal that moved
            // on to another hub must not reach it later with its newer epoch.
            !outage && sec.rekey_due(now, next_pn)
        } else if established {
            sec.rekey_due(now, next_pn) || (outage && !sec.initiating())
        } else if start_due && sec.awaiting_confirmation(now, self.cfg.hello_interval * 3) {
            // Our initiation would only cross the one we answered; look again later.
            self.hello_due = Some(now + self.cfg.hello_interval);
            false
        } else {
            start_due
        };
        if !due {
            return false;
        }
        let encode = || {
            let mut h = Vec::new();
            hello.encode(&mut h);
            h
        };
        let Some(d) = sec.initiation(now, retransmit_after, encode, scid) else {
            return false;
        };
        out.extend_from_slice(&d);
        if !established {
            self.hello_due = Some(now + self.cfg.hello_interval);
            self.start_initiation_sent();
        }
        true
    }

    /// The CLOSE of the current association, sealed under its keys.
    pub(super) fn sealed_close(&mut self, code: u8, reason: &str) -> Option<Vec<u8>> {
        let pn = self.next_pn;
        if !self.may_seal(pn) {
            return None;
        }
        let header = ShortHeader {
            dcid: self.peer_cid,
            pn_truncated: pn & mask(4),
            pn_len: 4,
            key_phase: self.key_phase(),
            implicit_data: None,
        };
        let mut out = Vec::new();
        header.encode(&mut out);
        frame::encode_close(&mut out, code, reason);
        self.seal(pn, header.encoded_len(), &mut out);
        Some(out)
    }

    /// Builds the next short packet: an ACK, control frames, stream data (or a redundant
    /// copy, a probe or padding) under the packet's budget; seals it and records it for loss
    /// detection and the controller. False when there was nothing to send.
    pub(super) fn build_packet(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        let pn = self.next_pn;
        if !self.may_seal(pn) {
            return false;
        }
        let (pn_len, budget) = self.packet_layout(pn);
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        let mut frames = self.sent.frame_list();

        self.write_ack(now, &mut payload, budget);
        self.write_control(now, &mut payload, budget, &mut frames);
        let (planned, copy_of) = self.plan_payload(now, budget, &mut payload, &mut frames);

        let implicit_data = implicit_data_of(&planned, &payload);
        let header = ShortHeader {
            dcid: self.peer_cid,
            pn_truncated: pn & mask(pn_len),
            pn_len,
            key_phase: self.key_phase(),
            implicit_data,
        };
        header.encode(out);
        out.extend_from_slice(&payload);
        self.payload = payload;
        self.write_stream_data(out, planned, implicit_data.is_some(), &mut frames);

        if out.len() == header.encoded_len() {
            out.clear();
            return false;
        }
        self.seal(pn, header.encoded_len(), out);
        self.next_pn += 1;
        self.record_sent(now, pn, out, frames, copy_of);
        true
    }

    /// The packet number's length and the bytes left for frames in packet `pn`.
    fn packet_layout(&self, pn: u64) -> (usize, usize) {
        let unacked = pn - self.largest_acked.map_or(0, |l| l + 1) + 1;
        // Never fewer than 2 bytes: a 1-byte number is misread after reordering by more than
        // 128 packets (an ACK-only sender is never acknowledged, so the span rule alone
        // would allow it).
        let pn_len = truncation_len(unacked, 4).max(MIN_PN_LEN);
        // Data packets are cut to the size the error rate calls for (§5.8); every packet is
        // built to it, so one that ends up without data is only smaller.
        let (size, _probe) = self.sizer.next_data_size();
        let header_len = 1 + self.peer_cid.len() + pn_len;
        let budget = size.min(self.cfg.max_datagram()) - header_len - self.tag_len();
        (pn_len, budget)
    }

    /// The pending ACK (with SNACK ranges), if any, within half the budget.
    fn write_ack(&mut self, now: Instant, payload: &mut Vec<u8>, budget: usize) {
        if !self.acks.has_pending() {
            return;
        }
        let Some(mut ack) = self.acks.build(now) else {
            return;
        };
        if self.peer_params.is_none_or(|p| !p.reads_ack_times) {
            ack.received_us = None;
        }
        // Keep the newest ranges if they would crowd out everything else.
        while ack.ranges.len() > 2 && frame::ack_len(&ack) > budget / 2 {
            ack.ranges.pop();
        }
        frame::encode_ack(payload, &ack);
        self.stats.acks_sent += 1;
        if ack.has_holes() {
            self.stats.snacks_sent += 1;
        }
    }

    /// Fills the rest of the packet: stream data the window allows, else a redundant copy,
    /// else a probe or the controller's padding. Returns the planned stream frames and, for
    /// a copy, its original and whether the copy is complete.
    fn plan_payload(
        &mut self,
        now: Instant,
        budget: usize,
        payload: &mut Vec<u8>,
        frames: &mut Vec<SentFrame>,
    ) -> (Vec<Planned>, Option<(u64, bool)>) {
        let data_ok = self.outage_since.is_none() && self.window_allows();
        let mut planned: Vec<Planned> = Vec::new();
        let mut used = payload.len();
        if data_ok {
            self.plan_data(now, budget, &mut used, &mut planned, payload.is_empty());
        }
        let mut copy_of = None;
        if data_ok && planned.is_empty() && frames.is_empty() && self.redundancy_available() {
            copy_of = self.plan_copy(budget, &mut used, &mut planned, payload.is_empty());
        }
        if frames.is_empty() && planned.is_empty() && self.probes_pending > 0 {
            frame::encode_ping(payload);
            frames.push(SentFrame::Ping);
            self.stats.probes_sent += 1;
        } else if frames.is_empty() && planned.is_empty() && self.cc.wants_padding() {
            // A full-size packet for the controller's measurement; PADDING is zeros.
            frame::encode_ping(payload);
            payload.resize(budget, 0);
            frames.push(SentFrame::Ping);
        }
        self.probes_pending = 0;
        (planned, copy_of)
    }

    /// Writes the planned DATA frames after the header and the other frames. Stream bytes go
    /// from the send buffer straight into the datagram, the one copy they need before the
    /// AEAD seals them in place.
    fn write_stream_data(
        &self,
        out: &mut Vec<u8>,
        planned: Vec<Planned>,
        implicit: bool,
        frames: &mut Vec<SentFrame>,
    ) {
        let count = planned.len();
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
            if implicit {
                frame::encode_implicit_data_header(out, flow, offset, offset_len);
            } else {
                // FIN always travels with an explicit length; so does every frame but the last.
                let len_field = (i + 1 < count || fin).then_some(len);
                frame::encode_data_header(out, flow, offset, offset_len, fin, len_field);
            }
            f.send.copy_to(offset, len, out);
            frames.push(SentFrame::Data {
                flow,
                offset,
                len: len as u32,
                fin,
            });
        }
    }

    /// Accounts for a `sealed` packet: statistics, pacer and controller, and, when it
    /// elicits an ACK, its record for loss detection, redundancy and hints.
    fn record_sent(
        &mut self,
        now: Instant,
        pn: u64,
        sealed: &[u8],
        frames: Vec<SentFrame>,
        copy_of: Option<(u64, bool)>,
    ) {
        let wire = (sealed.len() + self.cfg.wire_overhead - self.tag_len()) as u64;
        self.stats.packets_sent += 1;
        self.stats.wire_bytes_sent += wire;
        let behind = self.pacer.behind(now);
        let app_limited = self.pacer.on_sent(now, wire);
        let sent = SentInfo {
            pn,
            wire_bytes: wire,
            ack_eliciting: !frames.is_empty(),
            app_limited,
            gap: if app_limited { behind } else { Duration::ZERO },
        };
        self.cc.on_sent(now, sent, &self.rtt);
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
        if let Some(pause) = self.cc.take_pause() {
            self.pacer.pause(pause);
        }
        if frames.is_empty() {
            // An ACK-only packet is not recorded; its list goes back for the next one.
            self.sent.recycle(frames);
            return;
        }
        let has_data = frames.iter().any(|f| matches!(f, SentFrame::Data { .. }));
        if has_data {
            self.sizer.on_data_sent();
        }
        let mut tag_tail = [0u8; HINT_TAG_TAIL_LEN];
        if self.security.is_some() && sealed.len() >= HINT_TAG_TAIL_LEN {
            tag_tail.copy_from_slice(&sealed[sealed.len() - HINT_TAG_TAIL_LEN..]);
        }
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
                app_limited,
                tag_tail,
            },
        );
        if copy_of.is_none() && has_data {
            // Copies go newest first: restart the search above the new original.
            self.redundancy_cursor = self.next_pn;
            self.redundancy_round = 1;
        }
        self.last_eliciting_sent = Some(now);
    }

    pub(super) fn write_control(
        &mut self,
        now: Instant,
        payload: &mut Vec<u8>,
        budget: usize,
        frames: &mut Vec<SentFrame>,
    ) {
        let credit_window = self.credit_window();
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
                    let queued_for = f
                        .write_times
                        .sent_from(0)
                        .map(|t| now.saturating_duration_since(t));
                    self.sched.on_sent(f.class, now, c.len, true, queued_for);
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
                    .max(f.recv.read_offset() + credit_window);
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

    /// Picks DATA frames across flows until the packet is full: the traffic classes' turns
    /// (priority within caps, then weights), and inside a class deficit round robin with a
    /// quantum of [`SCHEDULING_QUANTUM`] stream bytes per turn.
    fn plan_data(
        &mut self,
        now: Instant,
        budget: usize,
        used: &mut usize,
        planned: &mut Vec<Planned>,
        empty: bool,
    ) {
        let mut rounds = self.sched.len();
        while rounds > 0 {
            rounds -= 1;
            let Some((class, id)) = self.sched.pop_next(now) else {
                break;
            };
            let allowance = self.assoc_allowance();
            let others = !self.sched.is_empty();
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            let room = budget.saturating_sub(*used);
            let offset_len = if f.send.repair_pending() {
                REPAIR_OFFSET_LEN
            } else {
                let span_max = (f.send.next_new() + room as u64) - f.send.acked_base();
                truncation_len(span_max, 4)
            };
            // Room for a type byte and a length when the frame may carry the FIN.
            let may_fin = f.send.is_finished_by_app();
            let implicit = empty && planned.is_empty() && !others && !may_fin;
            let header = crate::codec::varint_len(id)
                + if implicit { 0 } else { 1 }
                + if others || may_fin { 2 } else { 0 };
            let overhead = header + offset_len;
            // Bytes sent for the first time leave room for the longer offset their repair will
            // carry: a repair of a whole packet's bytes then fits one packet, as they did.
            let reserved = header + REPAIR_OFFSET_LEN;
            if room <= reserved {
                self.sched.push_front(class, id);
                break;
            }
            let chunk = if f.reset.is_none() && f.open != OpenState::Pending {
                f.send.next_chunk(room - reserved, allowance)
            } else {
                None
            };
            let Some(c) = chunk else {
                f.in_send_queue = false;
                continue;
            };
            let queued_for = if c.retransmit {
                self.stats.stream_bytes_retransmitted += c.len as u64;
                None
            } else {
                self.assoc_sent += c.len as u64;
                self.stats.stream_bytes_sent += c.len as u64;
                f.write_times
                    .sent_from(c.offset)
                    .map(|t| now.saturating_duration_since(t))
            };
            *used += overhead + c.len;
            planned.push(Planned::Data {
                flow: id,
                offset: c.offset,
                len: c.len,
                fin: c.fin,
                offset_len,
            });
            f.turn_bytes += c.len;
            if !f
                .send
                .has_sendable(self.assoc_send_limit.saturating_sub(self.assoc_sent))
            {
                f.in_send_queue = false;
                f.turn_bytes = 0;
            } else if f.turn_bytes < SCHEDULING_QUANTUM {
                // A short response goes out whole before the next flow's turn, so its
                // connection can ask again a little sooner than under per-packet turns.
                self.sched.push_front(class, id);
            } else {
                f.turn_bytes = 0;
                self.sched.push_back(class, id);
            }
            self.sched
                .on_sent(class, now, c.len, !c.retransmit, queued_for);
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
            // A copy, like a repair, may arrive after its original.
            let offset_len = REPAIR_OFFSET_LEN;
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

/// The implicit-length form of the packet's one DATA frame, when that is all it carries.
/// A FIN always travels with an explicit length, so a truncated datagram can never pass for
/// a shorter stream.
fn implicit_data_of(planned: &[Planned], payload: &[u8]) -> Option<ImplicitData> {
    match planned {
        [Planned::Data {
            fin: false,
            offset_len,
            ..
        }] if payload.is_empty() => Some(ImplicitData {
            fin: false,
            offset_len: *offset_len,
        }),
        _ => None,
    }
}

pub(super) fn mask(bytes: usize) -> u64 {
    if bytes >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * bytes)) - 1
    }
}
