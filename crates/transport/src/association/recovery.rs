//! Acknowledgements, loss detection and repair, and every timer.

use super::*;

impl Association {
    pub(super) fn on_ack(&mut self, now: Instant, ack: &AckFrame) {
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
        // Packets declared lost that the peer received after all: their repairs were
        // needless, and the path reorders at least that far.
        let ranges = ack.ranges.iter().map(|r| r.start..r.end.min(largest + 1));
        self.reordering
            .on_ack_ranges(now, ranges, self.rtt.smoothed());
        if newly.is_empty() {
            return;
        }
        self.largest_acked = Some(self.largest_acked.map_or(largest, |l| l.max(largest)));
        let mut rtt_sample = None;
        // The peer's own hold, bounded so a lying peer cannot make RTTs vanish.
        let ack_delay = Duration::from_micros(ack.delay_us).min(self.cfg.ack.max_delay * 4);
        // The ACK's time as the controller measures the forward path by: had it crossed the
        // return path at the least delay seen (never earlier than the ACK before it).
        let arrived = match ack.received_us {
            Some(received) => {
                let sent = received.saturating_add(ack_delay.as_micros() as u64);
                // Two round trips: the whole round trip may be jitter on a short path.
                let bound = self.rtt.smoothed() * 2;
                let excess = self.return_path.excess(now, sent, bound);
                now.checked_sub(excess).unwrap_or(now)
            }
            None => now,
        };
        let arrived = self.arrived_at.map_or(arrived, |a| a.max(arrived));
        self.arrived_at = Some(arrived);
        if let Some(p) = self.sent.get(largest) {
            let sample = path_rtt(now.saturating_duration_since(p.time), ack_delay, &self.rtt);
            self.rtt.on_sample(now, sample);
            let raw = arrived.saturating_duration_since(p.time);
            let sample = path_rtt(raw, ack_delay, &self.cc_rtt);
            self.cc_rtt.on_sample(now, sample);
            rtt_sample = Some(sample);
        }
        self.last_ack_at = Some(now);
        self.pto_count = 0;
        self.silent_probe_at = None;
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
            self.reordering.on_acked(now, p.time);
            self.loss_rate.on_delivered();
            if p.has_data {
                let link = p.wire_bytes as usize + self.cfg.frame_overhead;
                self.sizer.on_resolved(now, link, false);
            }
            for fr in &p.frames {
                self.on_frame_acked(*fr);
            }
            self.sent.recycle(p.frames);
            let acked = AckedPacket {
                pn,
                bytes: p.wire_bytes,
                rtt_sample: if pn == largest { rtt_sample } else { None },
                next_pn: self.next_pn,
                sent_at: p.time,
                app_limited: p.app_limited,
            };
            self.cc.on_ack(now, acked, &self.cc_rtt);
        }
        self.detect_lost(now);
        let summary = AckSummary {
            largest_acked: self.largest_acked.unwrap_or(largest),
            ack_delay,
            arrived,
        };
        self.cc.on_ack_done(now, summary, &self.cc_rtt);
        self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
    }

    pub(super) fn on_frame_acked(&mut self, fr: SentFrame) {
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
                    let freed = f.send.acked_base() - before;
                    self.stats.stream_bytes_acked += freed;
                    let share_freed = f.quota_blocked && freed > 0;
                    if share_freed {
                        f.quota_blocked = false;
                    }
                    if f.write_blocked && f.send.has_room() && f.reset.is_none() {
                        f.write_blocked = false;
                        self.events.push_back(Event::FlowWritable { flow });
                    } else if share_freed && f.reset.is_none() {
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

    /// Declares lost what trails a later acknowledged packet too long (docs/PROTOCOL.md
    /// §5.3): on a path that does not reorder, three packets or 9/8 of the RTT; on one that
    /// does, the reordering window after the time the latest acknowledged packet took.
    pub(super) fn detect_lost(&mut self, now: Instant) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let window = self.reordering.window(now, self.rtt.smoothed());
        self.stats.reorder_window = window.unwrap_or_default();
        let reference = self.reordering.latest();
        let delay = self
            .rtt
            .smoothed()
            .max(self.rtt.latest())
            .mul_f64(9.0 / 8.0);
        for pn in self.sent.outstanding_in(0, largest) {
            let Some(p) = self.sent.get(pn) else {
                continue;
            };
            let deadline = match (window, reference) {
                (Some(w), Some((latest_sent, latest_rtt))) => {
                    if p.time >= latest_sent {
                        continue;
                    }
                    p.time + latest_rtt + w
                }
                _ if largest - pn >= self.cfg.reorder_threshold => now,
                _ => p.time + delay,
            };
            if deadline <= now {
                self.declare_lost(now, pn, None);
            } else {
                self.loss_time = Some(self.loss_time.map_or(deadline, |l| l.min(deadline)));
            }
        }
    }

    pub(super) fn declare_lost(&mut self, now: Instant, pn: u64, cause: Option<LossCause>) {
        let Some(p) = self.sent.remove(pn) else {
            return;
        };
        let by_outage = cause == Some(LossCause::Outage);
        self.reordering.on_declared_lost(now, pn, p.time, by_outage);
        if !by_outage {
            self.loss_rate.on_lost();
        }
        let cause = cause.unwrap_or_else(|| {
            let evidence = self
                .rtt
                .has_samples()
                .then(|| self.rtt.recent_min().saturating_sub(self.rtt.min()));
            let packet_time = self.pacer.transmission_time(self.cfg.mtu as u64);
            self.classifier.classify(evidence, packet_time)
        });
        self.stats.lost.add(cause);
        if cause == LossCause::Corruption {
            self.cc.on_corruption_loss(p.wire_bytes);
            if p.has_data {
                let link = p.wire_bytes as usize + self.cfg.frame_overhead;
                self.sizer.on_resolved(now, link, true);
            }
        }
        if cause == LossCause::Congestion && pn >= self.recovery_start_pn {
            self.cc.on_congestion(now, pn, &self.rtt);
            self.pacer.set_rate(self.cc.pacing_rate(&self.rtt));
            self.recovery_start_pn = self.next_pn;
            self.stats.congestion_events += 1;
        }
        // Redundant copies carry only DATA: while another member of the group is outstanding
        // its data may still arrive, but everything else needs repair now.
        let data_covered = p.group.is_some_and(|g| self.sent.group_outstanding(g));
        for &fr in &p.frames {
            if !(data_covered && matches!(fr, SentFrame::Data { .. })) {
                self.requeue(fr);
            }
        }
        self.sent.recycle(p.frames);
    }

    pub(super) fn requeue(&mut self, fr: SentFrame) {
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

    pub(super) fn pto_interval(&self) -> Duration {
        let base = self.rtt.pto(self.cfg.ack.max_delay);
        let backed_off = base.saturating_mul(1u32 << self.pto_count.min(16));
        backed_off.min(self.cfg.max_probe_interval.max(base))
    }

    /// Probe timer: runs from the last ACK (data may keep flowing in rate mode while nothing
    /// comes back, and that silence is what reveals an outage), then backs off from each firing.
    pub(super) fn pto_deadline(&self) -> Option<Instant> {
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
    pub(super) fn stall_timeout(&self) -> Duration {
        (self.rtt.smoothed() * 4).max(Duration::from_secs(1))
    }

    pub(super) fn sweep_stalled_gaps(&mut self, now: Instant) {
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

    pub(super) fn keepalive_deadline(&self) -> Option<Instant> {
        if !self.established || !self.sent.is_empty() {
            return None;
        }
        let last = self
            .last_eliciting_sent
            .or(self.last_ack_at)
            .or(self.established_at)?;
        Some(last + self.cfg.keepalive_interval)
    }

    pub(super) fn outage_deadline(&self) -> Option<Instant> {
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
        let always = self.cfg.initiate == Initiate::Always;
        // A side that only rekeys has nothing to start while not established (with
        // security: the plaintext HELLO exchange is not a handshake of its own).
        let starts = always || self.security.is_none();
        if (!self.established && starts) || self.hello_reply_needed {
            consider(if self.hello_reply_needed {
                Some(self.last_input)
            } else {
                self.hello_due
            });
        }
        if let Some(sec) = &self.security {
            let up = self.established && self.outage_since.is_none();
            if always || up {
                consider(sec.deadline(self.established));
            }
            if always && self.established && self.outage_since.is_some() && !sec.initiating() {
                consider(Some(self.last_input));
            }
            if sec.has_outbox() {
                consider(Some(self.last_input));
            }
        }
        consider(self.loss_time);
        consider(self.pto_deadline());
        if self.probes_pending == 0 {
            consider(self.keepalive_deadline());
        }
        consider(self.outage_deadline());
        consider(self.silent_probe_at);
        consider(self.gap_sweep_at);
        consider(self.handover_deadline());
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
            } else if let Some(held) = self.data_held_until() {
                consider(later_of(held));
            }
        }
        t
    }

    pub(super) fn has_paced_work(&self) -> bool {
        self.established && (self.has_paced_work_besides_data() || self.data_ready())
    }

    fn has_paced_work_besides_data(&self) -> bool {
        self.probes_pending > 0
            || !self.control_queue.is_empty()
            || !self.orphan_resets.is_empty()
            || self.assoc_credit_pending
            || (self.outage_since.is_none() && self.cc.wants_padding())
    }

    /// Stream data (or a redundant copy) may go now, as far as the window and the traffic
    /// classes' caps say.
    fn data_ready(&self) -> bool {
        self.outage_since.is_none()
            && self.window_allows()
            && (self.sched.ready(self.last_input) || self.redundancy_available())
    }

    /// When queued data that only the traffic classes' caps hold back may go.
    fn data_held_until(&self) -> Option<Instant> {
        if self.outage_since.is_some() || !self.window_allows() {
            return None;
        }
        self.sched.held_until(self.last_input)
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
            self.silent_probe_at = Some(now + SILENT_PROBE_INTERVAL);
            let heard = std::mem::take(&mut self.heard_since_pto);
            if self.pto_count >= OUTAGE_PTO_COUNT && self.outage_since.is_none() {
                self.outage_since = Some(self.last_ack_at.unwrap_or(now).min(now));
                self.stats.outages += 1;
                self.events.push_back(Event::OutageStarted);
            }
            // A hub heard since the last expiry is there: its ACK is on its way.
            if self.outage_since.is_some() && !heard {
                self.current_hub_silent();
            }
        }
        if self.keepalive_deadline().is_some_and(|t| t <= now) {
            self.probes_pending = 1;
        }
        if self.silent_probe_at.is_some_and(|t| t <= now) {
            self.probes_pending = 1;
            self.silent_probe_at = Some(now + SILENT_PROBE_INTERVAL);
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
        self.handover_timeout(now);
    }
}

/// The path's part of a round trip of `raw` that the peer held for `ack_delay`: the hold is
/// taken off only where what is left is no shorter than the least RTT seen, so a peer that
/// overstates it cannot make the path look shorter than it is.
fn path_rtt(raw: Duration, ack_delay: Duration, rtt: &RttEstimator) -> Duration {
    if raw >= rtt.min() + ack_delay {
        raw - ack_delay
    } else {
        raw
    }
}
