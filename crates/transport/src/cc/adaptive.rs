//! Capacity tracking (`cc = "adaptive"`, the default): the configured rate is a ceiling, not
//! a promise. The sender paces at its estimate of the bottleneck and keeps the queue it
//! causes small; docs/PROTOCOL.md §5.5 gives the rules and why each constant has its value.
//!
//! - **Measure** when the association is established: a short train of full-size packets
//!   (padded PINGs when there is no data) at the ceiling; how fast the path delivered it is
//!   the first estimate when it is clearly below the ceiling. A gateway that starts during
//!   a rain fade does not open with a round trip's worth of queue.
//! - **Cruise** at the estimate (at first the ceiling, so short transfers lose nothing).
//! - **Overload**: the queueing delay stood above `q_high` for a whole evidence span. The
//!   bottleneck never idled during that span, so the rate at which ACKs reported deliveries
//!   is what it carries for us: that becomes the estimate. Then **drain**: nothing new is
//!   sent until what is in flight fits the pipe at the new estimate, which empties the queue
//!   in about the time it holds. Congestion-attributed losses count as an overload too.
//! - **Verify** after a drain: a delay that draining did not remove is not ours (a longer
//!   path after a LEO handover, or another sender's queue). If we still get delivered what we
//!   send, the base RTT moves up to it instead of the rate coming down again.
//! - **Probe** while the estimate is below the ceiling and no queue stands: a short send at
//!   twice the estimate, then a pause as long, so a probe the path cannot carry leaves no
//!   queue behind. How fast its packets were delivered is what the path can carry up to
//!   that rate. Success raises the estimate and probes again at once; failure spaces the
//!   probes out.
//!
//! Losses to corruption never lower anything: they count as delivered (`delivery`), since
//! they crossed the bottleneck. With no feedback at all (an outage) nothing changes: the
//! estimate is held.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::delivery::DeliveryMeter;
use super::evidence::QueueEvidence;
use super::{AckSummary, AckedPacket, CapacityStats, CongestionController};
use crate::config::Config;
use crate::rtt::RttEstimator;

/// Least standing queue taken for an overload: above the scheduling noise of an event loop
/// on a loaded host (1–2 ms) and an emulated LEO link's jitter, below what an interactive
/// user notices.
const Q_FLOOR: Duration = Duration::from_millis(10);
/// The overload threshold is also at least this many packets at the estimate: on a slow
/// link (1.5 Mb/s: 8 ms a packet) a couple of packets queue behind every ACK burst.
const Q_PACKETS: f64 = 4.0;
/// Evidence span: a quarter of the base RTT, within these bounds, and at least this many
/// ACK intervals, so a span always holds several samples.
const SPAN_MIN: Duration = Duration::from_millis(20);
const SPAN_MAX: Duration = Duration::from_millis(50);
const SPAN_ACKS: u32 = 3;
/// Probing sends at this multiple of the estimate: the estimate can double every round trip
/// while the path keeps up (an ACM step from 5 to 20 Mb/s is recovered in two probes).
const PROBE_GAIN: f64 = 2.0;
/// A probe lasts a quarter of the base RTT, within these bounds, and at least
/// `PROBE_PACKETS` packets. A probe the path cannot carry queues at most its length times
/// (gain − 1) for about as long: 25 ms on links above 2 Mb/s.
const PROBE_MIN: Duration = Duration::from_millis(10);
const PROBE_MAX: Duration = Duration::from_millis(25);
const PROBE_PACKETS: f64 = 16.0;
/// A probe or train spans at least this many ACK-every-N intervals, so at least two ACKs
/// fall inside it whatever the receiver's ACK policy.
const MEASURE_ACKS: u32 = 3;
/// A probe delivered at this fraction of its rate or better succeeded.
const PROBE_SUCCESS: f64 = 0.9;
/// A probe delivered above this multiple of the estimate found some capacity; less is the
/// estimate confirmed (and measurement noise).
const PROBE_PARTIAL: f64 = 1.05;
/// The establishment train: enough packets for a dozen ACKs even when the receiver
/// batches them, about 10 ms at the ceiling, never more than `TRAIN_MAX` (96 KB).
const TRAIN_MIN: u32 = 16;
const TRAIN_MAX: u32 = 64;
const TRAIN_TIME: Duration = Duration::from_millis(10);
/// The train lowers the estimate only below this fraction of the ceiling: timing noise of
/// real hosts must not cost a correctly provisioned link its first round trips.
const TRAIN_LOWERS_BELOW: f64 = 0.8;
/// Queue growth over the train below this is timer noise, whatever the rates say: a train
/// of about 10 ms at the ceiling into a path at 80 % of it grows a queue of 2.5 ms.
const TRAIN_QUEUE_GROWTH: Duration = Duration::from_millis(2);
/// A late timer's worth of extra time a train may take to leave and still count.
const TRAIN_SLACK: Duration = Duration::from_millis(2);
/// After a failed probe the next waits twice as long, up to the larger of these: a link
/// whose capacity came back is found within a few seconds.
const PROBE_INTERVAL_MAX: Duration = Duration::from_millis(500);
const PROBE_INTERVAL_MAX_RTTS: u32 = 1;
/// Delivered below this fraction of the estimate, with a queue showing, the path has
/// slowed: well below the ACK-timing noise of a real receiver (a few per cent over a span).
const DEFICIT: f64 = 0.75;
/// One overload cuts the estimate at most to a quarter (an ACM step is 2–4×); a deeper fall
/// takes two.
const MAX_CUT: f64 = 4.0;
/// The estimate never falls below this fraction of the ceiling.
const FLOOR_FRACTION: f64 = 1.0 / 64.0;
/// After a drain, a queue that stays while we are delivered at least this fraction of what
/// we send is not ours.
const OWN_QUEUE_DELIVERY: f64 = 0.97;
/// Added to the drain's bound: a queue may hold seconds when the RTT estimate has not seen
/// it yet.
const DRAIN_SLACK: Duration = Duration::from_secs(2);
/// Outside a drain, at most this many pipes may be in flight: a bound on the queue if every
/// delay signal failed.
const SAFETY_PIPES: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Cruise,
    /// Nothing new leaves until what was sent after the latest acknowledged packet fits
    /// the pipe, or until `until`.
    Drain {
        until: Instant,
    },
    /// Pacing at `rate` until `until`.
    Probe {
        rate: f64,
        until: Instant,
    },
    /// The establishment train: `left` more packets at the ceiling.
    Train {
        left: u32,
    },
}

/// Bytes sent, cumulatively, after each packet number still at or above the largest
/// acknowledged (numbers are consecutive, so a ring indexed from the oldest is enough).
#[derive(Debug, Default)]
struct SentLog {
    first_pn: u64,
    totals: VecDeque<u64>,
    total: u64,
}

impl SentLog {
    fn on_sent(&mut self, pn: u64, wire_bytes: u64) {
        self.total += wire_bytes;
        if self.totals.is_empty() {
            self.first_pn = pn;
        }
        // A gap (numbers never handed to the controller) repeats the last total.
        while self.first_pn + (self.totals.len() as u64) < pn {
            let last = self
                .totals
                .back()
                .copied()
                .unwrap_or(self.total - wire_bytes);
            self.totals.push_back(last);
        }
        if self.first_pn + self.totals.len() as u64 == pn {
            self.totals.push_back(self.total);
        }
    }

    fn forget_before(&mut self, pn: u64) {
        while self.first_pn < pn && self.totals.len() > 1 {
            self.totals.pop_front();
            self.first_pn += 1;
        }
    }

    /// Bytes sent after packet `pn`.
    fn bytes_after(&self, pn: u64) -> u64 {
        let at = pn
            .checked_sub(self.first_pn)
            .and_then(|i| self.totals.get(usize::try_from(i).ok()?));
        at.map_or(0, |&t| self.total - t)
    }
}

/// A probe whose outcome is still coming back.
#[derive(Debug, Clone, Copy)]
struct ProbeRecord {
    rate: f64,
    first_pn: u64,
    /// Set when the probe stops sending.
    last_pn: Option<u64>,
    /// When the first of its packets was acknowledged, and the delivered total then.
    start: Option<(Instant, u64)>,
    /// The same at the latest ACK that acknowledged nothing sent after it.
    end: Option<(Instant, u64)>,
    /// Some of it went out late: it can show more capacity, never less.
    app_limited: bool,
    /// The establishment train: its result may lower the estimate.
    train: bool,
    /// When its first and latest packets left.
    sent: Option<(Instant, Instant)>,
    /// RTT samples of its earliest and latest packets that had one: (sent at, RTT).
    first_sample: Option<(Instant, Duration)>,
    last_sample: Option<(Instant, Duration)>,
}

impl ProbeRecord {
    fn new(rate: f64, first_pn: u64, train: bool) -> Self {
        ProbeRecord {
            rate,
            first_pn,
            last_pn: None,
            start: None,
            end: None,
            app_limited: false,
            train,
            sent: None,
            first_sample: None,
            last_sample: None,
        }
    }

    fn covers(&self, pn: u64) -> bool {
        pn >= self.first_pn && self.last_pn.is_none_or(|l| pn <= l)
    }

    /// What the probe's delays say the path carries: a queue that grew by `g` while the
    /// probe sent for `t` at rate R means the path drained it at R / (1 + g/t). A delayed
    /// ACK only makes this lower, so it checks the ACK-rate measurement, which ACKs that
    /// bunch up on the way back make higher.
    /// How much longer the queue was for its latest packet than for its first.
    fn queue_growth(&self) -> Option<Duration> {
        let ((_, r0), (_, r1)) = self.first_sample.zip(self.last_sample)?;
        Some(r1.saturating_sub(r0))
    }

    fn rate_by_delay(&self) -> Option<f64> {
        let ((t0, r0), (t1, r1)) = self.first_sample.zip(self.last_sample)?;
        let span = t1.saturating_duration_since(t0).as_secs_f64();
        if span <= 0.0 {
            return None;
        }
        let growth = (r1.as_secs_f64() - r0.as_secs_f64()).max(0.0) / span;
        Some(self.rate / (1.0 + growth))
    }
}

#[derive(Debug)]
pub struct Adaptive {
    ceiling: f64,
    estimate: f64,
    mtu: u64,
    /// The receiver's ACK-every-N: measurements must span several ACKs.
    ack_every: u32,
    state: State,
    meter: DeliveryMeter,
    evidence: QueueEvidence,
    /// The path's RTT without queue, as this controller sees it: the least sample since the
    /// last rebase.
    base: Option<Duration>,
    /// A drain just ended: the next evidence says whether the queue was ours.
    verify: bool,
    /// The most queue the drain's packets showed (while draining, or when it began).
    drained_queue: Duration,
    probe: Option<ProbeRecord>,
    next_probe_at: Option<Instant>,
    probe_interval: Duration,
    next_pn: u64,
    /// A pause the pacer owes after a probe.
    pause: Option<Duration>,
    /// The ACK being processed acknowledged a packet sent late.
    event_app_limited: bool,
    last_sent: Option<Instant>,
    sent_log: SentLog,
    /// The largest packet number the peer acknowledged.
    largest_acked: u64,
    last_app_limited: Option<Instant>,
    stats: CapacityStats,
}

impl Adaptive {
    pub fn new(cfg: &Config) -> Self {
        let ceiling = cfg.rate_bps as f64;
        Adaptive {
            ceiling,
            estimate: ceiling,
            mtu: cfg.mtu as u64,
            ack_every: cfg.ack.every_packets.max(1),
            state: State::Cruise,
            meter: DeliveryMeter::default(),
            evidence: QueueEvidence::default(),
            base: None,
            verify: false,
            drained_queue: Duration::ZERO,
            probe: None,
            next_probe_at: None,
            probe_interval: Duration::ZERO,
            next_pn: 0,
            pause: None,
            event_app_limited: false,
            last_sent: None,
            sent_log: SentLog::default(),
            largest_acked: 0,
            last_app_limited: None,
            stats: CapacityStats::default(),
        }
    }

    fn packet_time(&self, rate: f64) -> Duration {
        Duration::from_secs_f64(self.mtu as f64 * 8.0 / rate.max(1.0))
    }

    fn base_or(&self, rtt: &RttEstimator) -> Duration {
        self.base.unwrap_or_else(|| rtt.min())
    }

    fn q_high(&self) -> Duration {
        Q_FLOOR.max(self.packet_time(self.estimate).mul_f64(Q_PACKETS))
    }

    fn span(&self, rtt: &RttEstimator) -> Duration {
        let by_rtt = (self.base_or(rtt) / 4).clamp(SPAN_MIN, SPAN_MAX);
        let by_acks = self.meter.ack_interval().unwrap_or_default() * SPAN_ACKS;
        by_rtt.max(by_acks)
    }

    /// Bytes in flight that fill the path at the estimate without a queue: the base RTT's
    /// worth plus two packets. Packets the receiver holds before acknowledging also count
    /// in flight, so a drain to this leaves a gap of up to an ACK interval rather than a
    /// queue.
    fn pipe_bytes(&self, rtt: &RttEstimator) -> u64 {
        (self.estimate / 8.0 * self.base_or(rtt).as_secs_f64()) as u64 + 2 * self.mtu
    }

    fn floor(&self) -> f64 {
        self.ceiling * FLOOR_FRACTION
    }

    fn probe_interval_max(&self, rtt: &RttEstimator) -> Duration {
        PROBE_INTERVAL_MAX.max(self.base_or(rtt) * PROBE_INTERVAL_MAX_RTTS)
    }

    /// Packets in the establishment train.
    fn train_packets(&self) -> u32 {
        let per_time = (self.ceiling / 8.0 * TRAIN_TIME.as_secs_f64() / self.mtu as f64) as u32;
        per_time
            .clamp(TRAIN_MIN, TRAIN_MAX)
            .max(self.measure_packets())
    }

    /// Packets a measurement needs at least.
    fn measure_packets(&self) -> u32 {
        MEASURE_ACKS * self.ack_every
    }

    fn probe_len(&self, rate: f64, rtt: &RttEstimator) -> Duration {
        let by_rtt = (self.base_or(rtt) / 4).clamp(PROBE_MIN, PROBE_MAX);
        let packets = PROBE_PACKETS.max(f64::from(self.measure_packets()));
        by_rtt.max(self.packet_time(rate).mul_f64(packets))
    }

    /// The queue stood: take the delivery rate the span saw and drain.
    fn overload(&mut self, now: Instant, rtt: &RttEstimator) {
        if matches!(self.state, State::Drain { .. }) {
            return;
        }
        self.measure_busy_path(now, rtt);
        self.drained_queue = self.evidence.latest_min().unwrap_or_default();
        self.stats.drains += 1;
        self.probe = None;
        self.verify = false;
        // With nothing new sent, what is ahead of the latest ACK only shrinks: the drain
        // ends within a round trip plus the queue. The bound is for ACKs that never come
        // (an outage, which has its own handling).
        let path = rtt.smoothed().max(rtt.latest()).max(self.base_or(rtt));
        self.state = State::Drain {
            until: now + path * 4 + DRAIN_SLACK,
        };
        self.probe_interval = self.base_or(rtt).max(PROBE_MIN);
        self.next_probe_at = Some(now + self.probe_interval);
    }

    /// Whether the drain is done. What was sent after the latest packet the peer
    /// acknowledged is in the pipe or the queue. Unlike bytes in flight, it does not shrink
    /// when packets are declared lost: after a queue overflows, an ACK reports fewer holes
    /// than there are and the sender takes delivered packets for lost while the queue is
    /// still full.
    fn drained(&self, rtt: &RttEstimator) -> bool {
        self.sent_log.bytes_after(self.largest_acked) <= self.pipe_bytes(rtt)
    }

    /// The path delivers clearly less than the estimate while a queue stands: it slowed
    /// down. This is known as soon as the ACKs of the first packets it served slower come
    /// back, before any packet sent at the current rate can show its queue (which takes a
    /// round trip plus that queue).
    fn deficit(&self, now: Instant, span: Duration) -> bool {
        self.state == State::Cruise
            && self
                .evidence
                .standing_any(now, span)
                .is_some_and(|q| q > self.q_high())
            && self
                .meter
                .rate(now, span)
                .is_some_and(|r| !r.app_limited && r.bps < self.estimate * DEFICIT)
    }

    /// Takes the delivery rate of the last span for the capacity: the bottleneck was busy
    /// throughout it (a queue stood, or was draining), so that is what it carries for us,
    /// lower or (after a partly failed probe) higher than we thought. When the path has
    /// just slowed, the span's older ACKs still report the old rate: the newer half of the
    /// span, if it holds enough ACKs, is the purer measure, and the lower of the two counts.
    fn measure_busy_path(&mut self, now: Instant, rtt: &RttEstimator) {
        let span = self.span(rtt);
        let valid = |r: Option<super::delivery::Rate>| r.filter(|r| !r.app_limited).map(|r| r.bps);
        let whole = valid(self.meter.rate(now, span));
        let recent = valid(self.meter.rate(now, span / 2));
        if let Some(bps) = whole.map(|w| recent.map_or(w, |r| r.min(w))) {
            let lowest = (self.estimate / MAX_CUT).max(self.floor());
            self.estimate = bps.clamp(lowest, self.ceiling);
        }
    }

    fn end_drain(&mut self, rtt: &RttEstimator) {
        self.state = State::Cruise;
        // The packets still on their way were the last sent before the drain: they waited
        // behind the whole queue, which grew for up to a base RTT after the latest the
        // drain saw. More than that is a path slowing down again.
        let floor = self.drained_queue + self.q_high().max(self.base_or(rtt));
        self.evidence.reset(self.next_pn, floor);
        self.verify = true;
    }

    fn maybe_probe(&mut self, now: Instant, rtt: &RttEstimator) {
        if self.estimate >= self.ceiling
            || self.probe.is_some()
            || self.state != State::Cruise
            || self.next_probe_at.is_some_and(|t| now < t)
            || self
                .last_app_limited
                .is_some_and(|t| now.saturating_duration_since(t) < rtt.smoothed())
            // Only while sending: a probe on an idle link would measure nothing.
            || self
                .last_sent
                .is_none_or(|t| now.saturating_duration_since(t) > self.span(rtt))
        {
            return;
        }
        let rate = (self.estimate * PROBE_GAIN).min(self.ceiling);
        self.state = State::Probe {
            rate,
            until: now + self.probe_len(rate, rtt),
        };
        self.probe = Some(ProbeRecord::new(rate, self.next_pn, false));
        self.stats.probes += 1;
    }

    fn end_probe_if_due(&mut self, now: Instant, rtt: &RttEstimator) {
        if let State::Probe { rate, until } = self.state {
            if now >= until {
                self.state = State::Cruise;
                // Give back what the probe sent above the estimate.
                let extra = (rate / self.estimate.max(1.0) - 1.0).max(0.0);
                self.pause = Some(self.probe_len(rate, rtt).mul_f64(extra));
                if let Some(p) = self.probe.as_mut() {
                    p.last_pn = Some(self.next_pn.saturating_sub(1).max(p.first_pn));
                }
            }
        }
    }

    /// Follows the probe's packets through the ACKs; judges it once its last is acknowledged.
    /// Only ACKs within the probe's packets count: the one that also acknowledges packets
    /// sent after it may have waited for them. Each ACK is dated by when its largest packet
    /// reached the peer (its arrival less the delay the peer reports holding it): the last
    /// packets of a probe are often acknowledged by the peer's ACK timer, which would
    /// otherwise read as a slow path.
    fn follow_probe(&mut self, now: Instant, summary: &AckSummary, rtt: &RttEstimator) {
        let largest_acked = summary.largest_acked;
        let at = now.checked_sub(summary.ack_delay).unwrap_or(now);
        let delivered = self.meter.delivered();
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        if largest_acked < p.first_pn {
            return;
        }
        if p.last_pn.is_none_or(|l| largest_acked <= l) {
            if p.start.is_none() {
                p.start = Some((at, delivered));
            } else {
                p.end = Some((at, delivered));
            }
        }
        if p.last_pn.is_none_or(|l| largest_acked < l) {
            return;
        }
        let p = *p;
        self.probe = None;
        let max_interval = self.probe_interval_max(rtt);
        let Some(((t0, d0), (t1, d1))) = p.start.zip(p.end) else {
            self.next_probe_at = Some(now + self.probe_interval);
            return;
        };
        let elapsed = t1.saturating_duration_since(t0).as_secs_f64();
        let bytes = d1 - d0;
        if elapsed <= 0.0 || bytes < 4 * self.mtu {
            // Too few ACKs to tell: try again later, longer.
            self.next_probe_at = Some(now + self.probe_interval);
            return;
        }
        let by_acks = bytes as f64 * 8.0 / elapsed;
        if p.train {
            // The train may only lower the estimate when both measures agree the path is
            // slower: on a correctly provisioned link a receiver's scheduling noise can make
            // either alone read low, and a wrong start costs a transfer its first round trips.
            let rate = p.rate_by_delay().map_or(by_acks, |d| d.max(by_acks));
            // And only when the train itself built a queue one can tell from timer noise.
            let queued = p.queue_growth().is_some_and(|g| g >= TRAIN_QUEUE_GROWTH);
            // A train that left slower than planned (a stalled sender, a late timer) measured
            // the sender: at most twice its planned time plus a timer tick still measures
            // the path, since the path is then still fed faster than it delivers.
            let planned = self
                .packet_time(p.rate)
                .mul_f64(f64::from(self.train_packets()));
            let took = p
                .sent
                .map_or(Duration::MAX, |(a, b)| b.saturating_duration_since(a));

            if rate < p.rate * TRAIN_LOWERS_BELOW && queued && took <= planned * 2 + TRAIN_SLACK {
                self.estimate = rate.max(self.floor());
                self.next_probe_at = Some(now + self.base_or(rtt));
            }
            return;
        }
        let rate = p.rate_by_delay().map_or(by_acks, |d| d.min(by_acks));
        if rate >= p.rate * PROBE_SUCCESS {
            self.estimate = self.estimate.max(p.rate.min(rate)).min(self.ceiling);
            self.probe_interval = Duration::ZERO;
            self.next_probe_at = None;
        } else if rate > self.estimate * PROBE_PARTIAL {
            // The path took more than the estimate but not all of the probe: its capacity.
            self.estimate = rate.min(self.ceiling);
            self.next_probe_at = Some(now + self.probe_interval);
        } else if !p.app_limited {
            self.probe_interval = (self.probe_interval * 2)
                .max(self.base_or(rtt))
                .min(max_interval);
            self.next_probe_at = Some(now + self.probe_interval);
        } else {
            self.next_probe_at = Some(now + self.probe_interval);
        }
    }

    /// What the pacer should run at now.
    fn current_rate(&self) -> f64 {
        match self.state {
            State::Probe { rate, .. } => rate,
            State::Train { .. } => self.ceiling,
            _ => self.estimate,
        }
    }

    fn rebase(&mut self, standing: Duration, rtt: &RttEstimator) {
        self.base = Some(self.base_or(rtt) + standing);
        self.stats.rebases += 1;
        self.evidence.reset(self.next_pn, standing + self.q_high());
    }
}

impl CongestionController for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn window(&self, rtt: &RttEstimator) -> u64 {
        match self.state {
            // Nothing new while draining: the window of what is in flight would count packets
            // declared lost that may still sit in the queue. The drain may end without another
            // ACK (the last one acknowledged everything): then the window is open again and
            // the next packet sent ends it.
            State::Drain { .. } if !self.drained(rtt) => 0,
            State::Drain { .. } => u64::MAX,
            _ => {
                let path = rtt.smoothed().max(self.base_or(rtt)).as_secs_f64();
                (self.estimate / 8.0 * path * SAFETY_PIPES) as u64 + 16 * self.mtu
            }
        }
    }

    fn pacing_rate(&self, _rtt: &RttEstimator) -> u64 {
        self.current_rate().max(8.0 * self.mtu as f64) as u64
    }

    fn on_established(&mut self, _now: Instant) {
        self.state = State::Train {
            left: self.train_packets(),
        };
        self.probe = Some(ProbeRecord::new(self.ceiling, self.next_pn, true));
    }

    fn wants_padding(&self) -> bool {
        matches!(self.state, State::Train { .. })
    }

    fn take_pause(&mut self) -> Option<Duration> {
        self.pause.take()
    }

    fn on_sent(
        &mut self,
        now: Instant,
        pn: u64,
        wire_bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        if matches!(self.state, State::Drain { .. }) && self.drained(rtt) {
            self.end_drain(rtt);
        }
        self.next_pn = self.next_pn.max(pn + 1);
        self.last_sent = Some(now);
        self.sent_log.on_sent(pn, wire_bytes);
        if let Some(p) = self.probe.as_mut().filter(|p| p.last_pn.is_none()) {
            let first = p.sent.map_or(now, |(a, _)| a);
            p.sent = Some((first, now));
        }
        if app_limited {
            self.last_app_limited = Some(now);
            // A gap before the first packet is outside what the probe measures (from its
            // first ACK on).
            if let Some(p) = self
                .probe
                .as_mut()
                .filter(|p| p.last_pn.is_none() && pn > p.first_pn)
            {
                p.app_limited = true;
            }
        } else {
            let rate = self.current_rate();
            let busy = Duration::from_secs_f64(wire_bytes as f64 * 8.0 / rate.max(1.0));
            if rate < self.ceiling {
                self.stats.limited_by_estimate += busy;
            } else {
                self.stats.limited_by_ceiling += busy;
            }
        }
        if let State::Train { left } = self.state {
            if left <= 1 {
                self.state = State::Cruise;
                if let Some(p) = self.probe.as_mut() {
                    p.last_pn = Some(pn);
                }
            } else {
                self.state = State::Train { left: left - 1 };
            }
        }
        self.end_probe_if_due(now, rtt);
    }

    fn on_ack(&mut self, now: Instant, acked: AckedPacket, rtt: &RttEstimator) {
        self.meter.add(acked.bytes);
        self.event_app_limited |= acked.app_limited;
        if let Some(sample) = acked.rtt_sample {
            if let Some(p) = self.probe.as_mut().filter(|p| p.covers(acked.pn)) {
                let s = (acked.sent_at, sample);
                p.first_sample.get_or_insert(s);
                p.last_sample = Some(s);
            }
            // The estimator ages its minimum; follow it up when it does.
            let base = match self.base {
                Some(b) if b >= rtt.min() => b.min(sample),
                _ => rtt.min().min(sample),
            };
            self.base = Some(base);
            let span = self.span(rtt);
            let q = sample.saturating_sub(base);
            if matches!(self.state, State::Drain { .. }) {
                self.drained_queue = self.drained_queue.max(q);
            }
            self.evidence.add(now, acked.pn, q, span);
        }
    }

    fn on_corruption_loss(&mut self, wire_bytes: u64) {
        self.meter.add(wire_bytes);
    }

    fn on_ack_done(&mut self, now: Instant, summary: AckSummary, rtt: &RttEstimator) {
        self.sent_log.forget_before(summary.largest_acked);
        self.meter
            .mark(now, std::mem::take(&mut self.event_app_limited));
        self.follow_probe(now, &summary, rtt);
        self.end_probe_if_due(now, rtt);
        self.largest_acked = summary.largest_acked;
        if let State::Drain { until } = self.state {
            // While the queue drains the bottleneck stays busy, and every ACK reports the
            // rate after whatever slowed the path: the estimate follows it, so the drain
            // ends at the pipe of the rate the path really has.
            self.measure_busy_path(now, rtt);
            if self.drained(rtt) || now >= until {
                self.end_drain(rtt);
            }
            return;
        }
        let span = self.span(rtt);
        if self.evidence.grown(now, span).is_some() || self.deficit(now, span) {
            self.overload(now, rtt);
            return;
        }
        let Some(q) = self.evidence.standing(now, span) else {
            return;
        };
        self.stats.queue_delay = q;
        if q > self.q_high() {
            let ours = !self.verify
                || self
                    .meter
                    .rate(now, span.max(rtt.smoothed() / 2))
                    .is_none_or(|r| {
                        r.app_limited || r.bps < self.pacing_rate(rtt) as f64 * OWN_QUEUE_DELIVERY
                    });
            if ours {
                self.overload(now, rtt);
            } else {
                self.verify = false;
                self.rebase(q, rtt);
            }
        } else {
            self.verify = false;
            self.maybe_probe(now, rtt);
        }
    }

    fn on_congestion(&mut self, now: Instant, rtt: &RttEstimator) {
        self.overload(now, rtt);
    }

    fn set_rate(&mut self, rate_bps: u64) {
        // The operator knows the link's rate (the modem's ACM step): start from it.
        self.ceiling = rate_bps as f64;
        self.estimate = self.ceiling;
        self.state = State::Cruise;
        self.probe = None;
        self.verify = false;
        self.evidence.reset(self.next_pn, Duration::MAX);
    }

    fn capacity(&self, _rtt: &RttEstimator) -> CapacityStats {
        CapacityStats {
            estimate_bps: self.estimate as u64,
            ..self.stats
        }
    }
}
