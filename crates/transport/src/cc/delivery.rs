//! How fast the path delivers: bytes that crossed the bottleneck, stamped with the time the
//! sender learned of them. While a queue stands at the bottleneck it never idles, so the
//! rate at which deliveries are reported is its capacity (our share of it, when others
//! send too).
//!
//! A packet lost to corruption counts as delivered: it used the bottleneck as much as one
//! that arrived. Without that, a link losing 70 % of full-size packets to bit errors (BER
//! 1e-4) would read as a link of 30 % of its capacity.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One ACK: when it arrived and the delivered total after it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    delivered: u64,
    /// It acknowledged a packet sent after the sender had fallen idle: the gap before it
    /// is the sender's, not the path's.
    app_limited: bool,
    /// When the latest packet it acknowledged was sent, and the bytes sent up to and
    /// including that packet: how fast what it acknowledged was sent.
    sent: Option<SentMark>,
}

/// When a packet was sent, and the bytes sent up to and including it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentMark {
    pub at: Instant,
    pub total: u64,
}

/// A delivery rate over a span of ACKs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub bps: f64,
    /// Some of it was measured across a gap of the sender's own: it may understate the
    /// path, never overstate it.
    pub app_limited: bool,
    /// How fast the packets it acknowledged were sent, where that is known: a delivery
    /// rate below it means the path carried less than it was given.
    pub sent_bps: Option<f64>,
}

impl Rate {
    /// What its packets were given: the rate they were sent at where that is known and
    /// below `pace`, else `pace`.
    pub fn sent_at_most(&self, pace: f64) -> f64 {
        self.sent_bps.map_or(pace, |sent| sent.min(pace))
    }
}

#[derive(Debug, Default)]
pub struct DeliveryMeter {
    delivered: u64,
    marks: VecDeque<Mark>,
    /// Smoothed time between ACKs (1/8 weight).
    ack_interval: Option<Duration>,
    /// Smoothed bytes newly acknowledged per ACK (1/8 weight).
    ack_bytes: Option<u64>,
    /// The mean time between ACKs over the last few dozen (1/32 weight): where ACKs come in
    /// clumps the 1/8-weighted interval swings between the gaps within a clump and the one
    /// between clumps.
    mean_gap: Option<Duration>,
    /// How regular the gaps between clumps are: the recent share, of the gaps of at least
    /// half the longest, of those within a tenth of the longest (a moving average).
    regular: f64,
    /// The longest recent gap between ACKs, falling back as time passes: on a path that
    /// delivers ACKs in clumps (a slotted return link), the time from one clump to the next.
    longest_gap: Duration,
    /// The recent share of ACKs that came hard on the heels of the one before (within an
    /// eighth of the smoothed interval), as a moving average.
    bunched: f64,
    /// How much earlier than it reached us the latest ACK would have come back at the
    /// return path's least delay: marks are dated by that earlier time.
    lag: Duration,
    /// The gap before the next mark is the sender's (`after_senders_gap`).
    senders_gap: bool,
}

/// Marks older than this are never asked for.
const KEEP: Duration = Duration::from_secs(1);
/// Fewest ACKs whose span makes a rate: two intervals are the least that says anything.
const MIN_MARKS: usize = 3;
/// Gaps between ACKs longer than this are an idle link or an outage, not the ACK pace:
/// they do not enter the smoothed ACK interval.
const ACK_INTERVAL_CAP: Duration = Duration::from_millis(200);
/// Bound on marks kept, whatever the ACK rate (at 10 Gb/s an ACK comes every 10 µs).
const KEEP_MARKS: usize = 4096;
/// Gaps between ACKs up to this long count as clumping (MF-TDMA frames are 25–100 ms); longer
/// ones are an outage or an idle sender.
const CLUMP_GAP_MAX: Duration = Duration::from_millis(100);
/// ACKs come in clumps when the longest recent gap between them is more than this many
/// smoothed intervals: a regular ACK pace varies by a factor of two at most (the timer
/// against every eighth packet).
const CLUMPED_GAPS: u32 = 4;
/// ... or, where the gaps between clumps are regular (a slotted link), at least this many
/// mean gaps: a slot frame that holds only two or three ACKs (7 Mb/s, 40 ms frames) leaves
/// a smoothed interval that swings between the gaps within a clump and the one between
/// clumps, never a quarter of the frame.
const SLOT_GAPS: u32 = 2;
/// The gaps between clumps are regular when at least this share of them come within a
/// tenth of the longest: slots come every frame, and a clump split by a slot's end leaves
/// the next gap short now and then; a jitter that holds packets behind each other releases
/// them after gaps of any length up to its range, within a tenth of the longest one in ten.
const REGULAR_SHARE: f64 = 0.5;
const REGULAR_TENTHS: u32 = 10;
/// Weight of one gap between clumps in how regular they are.
const REGULAR_WEIGHT: f64 = 1.0 / 8.0;
/// Weight (1/this) of one gap in the mean gap between ACKs.
const MEAN_GAP_WEIGHT: u32 = 32;
/// ... and at least this share of them came within an eighth of the smoothed interval of the
/// one before (`BUNCHED_FRACTION`): a link layer that releases what it held at once (a
/// slot, a scheduler) delivers ACKs together, while gaps that only vary (another sender's
/// packets served between ours at a bottleneck) leave each ACK its own serialisation time.
const BUNCHED_SHARE: f64 = 0.25;
const BUNCHED_FRACTION: u32 = 8;
/// Weight of one ACK in the share: it follows the last few dozen.
const BUNCHED_WEIGHT: f64 = 1.0 / 32.0;
/// The longest gap falls back by this share of itself per second: a clumping path renews
/// it every frame, a path that stopped clumping loses it within seconds.
const CLUMP_DECAY_PER_SECOND: f64 = 0.5;

impl DeliveryMeter {
    /// Bytes that crossed the bottleneck.
    pub fn add(&mut self, wire_bytes: u64) {
        self.delivered += wire_bytes;
    }

    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The time on the marks' clock that `now` is.
    pub fn clock(&self, now: Instant) -> Instant {
        now.checked_sub(self.lag).unwrap_or(now)
    }

    /// Closes one ACK's worth of deliveries: the ACK reached us at `received`, and would
    /// have at `arrived` at the return path's least delay (the time it is dated by).
    pub fn mark(
        &mut self,
        received: Instant,
        arrived: Instant,
        app_limited: bool,
        sent: Option<SentMark>,
    ) {
        self.lag = received.saturating_duration_since(arrived);
        let senders_gap = std::mem::take(&mut self.senders_gap);
        let since_last = self
            .marks
            .back()
            .map(|last| arrived.saturating_duration_since(last.at));
        // The ACK pace of a busy sender: gaps of the sender's own, and idle ones, are not it.
        let own_gap = app_limited || senders_gap;
        let pace_gap = since_last.filter(|&g| !own_gap && g <= ACK_INTERVAL_CAP);
        if let (Some(_), Some(last)) = (pace_gap, self.marks.back()) {
            let bytes = self.delivered.saturating_sub(last.delivered);
            self.ack_bytes = Some(match self.ack_bytes {
                Some(s) => (s * 7 + bytes) / 8,
                None => bytes,
            });
        }
        if let Some(gap) = pace_gap {
            self.ack_interval = Some(match self.ack_interval {
                Some(s) => (s * 7 + gap) / 8,
                None => gap,
            });
            self.mean_gap = Some(match self.mean_gap {
                Some(s) => (s * (MEAN_GAP_WEIGHT - 1) + gap) / MEAN_GAP_WEIGHT,
                None => gap,
            });
        }
        if let Some(gap) = since_last {
            let decay = (CLUMP_DECAY_PER_SECOND * gap.as_secs_f64()).min(1.0);
            self.longest_gap = self.longest_gap.mul_f64(1.0 - decay);
            if !own_gap && gap <= CLUMP_GAP_MAX {
                self.longest_gap = self.longest_gap.max(gap);
                if gap * 2 >= self.longest_gap {
                    let full = gap * REGULAR_TENTHS >= self.longest_gap * (REGULAR_TENTHS - 1);
                    self.regular += (f64::from(u8::from(full)) - self.regular) * REGULAR_WEIGHT;
                }
            }
            let close = self
                .ack_interval
                .is_some_and(|i| gap * BUNCHED_FRACTION < i);
            self.bunched += (f64::from(u8::from(close)) - self.bunched) * BUNCHED_WEIGHT;
        }
        self.marks.push_back(Mark {
            at: arrived,
            delivered: self.delivered,
            app_limited,
            sent,
        });
        let expired_before = arrived.checked_sub(KEEP);
        while self.marks.len() > KEEP_MARKS
            || self
                .marks
                .front()
                .zip(expired_before)
                .is_some_and(|(m, cut)| m.at < cut)
        {
            self.marks.pop_front();
        }
    }

    /// The gap before the next mark is one the sender left (a pause after a probe, a
    /// drain), not one of the path's: it does not enter the ACK pace, the longest gap or how
    /// regular the gaps are. Counted, a probe's pause on a slotted leo path (80 ms, frames
    /// of 20 ms) became the clump period the next probe was sized and measured by, whose
    /// pause was as long again: in the simulator 19 probes in a row found no frame end to
    /// measure from and went unjudged, with the link back at 100 Mb/s and the estimate at 59.
    /// Only those statistics leave it out: a rate across it stays valid.
    pub fn after_senders_gap(&mut self) {
        self.senders_gap = true;
    }

    /// Bytes one ACK of a busy sender newly acknowledges, smoothed as the ACK interval is.
    pub fn ack_bytes(&self) -> Option<u64> {
        self.ack_bytes
    }

    pub fn ack_interval(&self) -> Option<Duration> {
        self.ack_interval
    }

    /// The longest recent gap between ACKs (up to 100 ms): the period of ACK clumps where
    /// they come in clumps, about the ACK interval where they do not.
    pub fn longest_gap(&self) -> Duration {
        self.longest_gap
    }

    /// Whether ACKs come in clumps: many of them came hard on the heels of the one before,
    /// and the longest recent gap between them is several times their smoothed interval,
    /// or twice their mean gap where those gaps are regular.
    pub fn clumped(&self) -> bool {
        self.bunched >= BUNCHED_SHARE
            && (self
                .ack_interval
                .is_some_and(|i| self.longest_gap > i * CLUMPED_GAPS)
                || self.regular_gaps())
    }

    /// Whether ACKs come in clumps at regular gaps, as a slotted link delivers them: the
    /// clump period is then the frame's, and a measurement may start and end on its clumps.
    pub fn slotted(&self) -> bool {
        self.bunched >= BUNCHED_SHARE && self.regular_gaps()
    }

    fn regular_gaps(&self) -> bool {
        self.evenly_spaced()
            && self
                .mean_gap
                .is_some_and(|i| self.longest_gap >= i * SLOT_GAPS)
    }

    /// Whether the gaps between ACKs, or between their clumps, are regular: a slotted link's
    /// frames, each carrying one clump, or one ACK where the peer reads a frame at once.
    pub fn evenly_spaced(&self) -> bool {
        self.regular >= REGULAR_SHARE
    }

    /// Delivery rate over the ACKs of the last `span`, from the first of them to the last
    /// (so the span's edges do not cut an ACK in two). Where ACKs come in clumps, from the
    /// end of the first clump in the span to the end of the last whole one: a rate from the
    /// start of a clump counts the clump's bytes against no time, and one to the start of the
    /// clump still arriving counts its time without its bytes. `None` with fewer than three
    /// ACKs (two whole clumps).
    pub fn rate(&self, now: Instant, span: Duration) -> Option<Rate> {
        let since = self.clock(now).checked_sub(span)?;
        let start = self.marks.partition_point(|m| m.at < since);
        self.rate_over(start, self.marks.len(), self.clump_period())
    }

    /// Delivery rate over the ACKs that arrived from `from` to `to` (both included), cut at
    /// the ends of clumps `period` apart where one is given: the ACKs of one measurement (a
    /// probe's). [`clump_period`](Self::clump_period) cuts as [`rate`](Self::rate) does; on
    /// a slotted link whose frames each carry one ACK, or two where the peer read the frame
    /// in two batches, the frame's period cuts at the ACK that acknowledges all of it.
    pub fn rate_between(
        &self,
        from: Instant,
        to: Instant,
        period: Option<Duration>,
    ) -> Option<Rate> {
        let start = self.marks.partition_point(|m| m.at < from);
        let end = self.marks.partition_point(|m| m.at <= to);
        self.rate_over(start, end, period)
    }

    /// The period of the ACKs' clumps where they come in clumps.
    pub fn clump_period(&self) -> Option<Duration> {
        self.clumped().then_some(self.longest_gap)
    }

    /// The rate over marks `start..end`: from the first to the last, or from clump end to
    /// clump end where ACKs come in clumps `period` apart. A mark followed by a gap of half
    /// the period or more ends a clump; the last mark there is, with none after it yet, may
    /// not.
    fn rate_over(&self, start: usize, end: usize, period: Option<Duration>) -> Option<Rate> {
        if end.saturating_sub(start) < MIN_MARKS {
            return None;
        }
        let (first, last) = if let Some(period) = period {
            let gap = period / 2;
            let ends_clump = |&i: &usize| {
                self.marks
                    .get(i + 1)
                    .is_some_and(|next| next.at.saturating_duration_since(self.marks[i].at) >= gap)
            };
            let within = start..end;
            let first = within.clone().find(ends_clump)?;
            let last = within.rev().find(ends_clump)?;
            (first, last)
        } else {
            (start, end - 1)
        };
        let (a, b) = (self.marks[first], self.marks[last]);
        let bps = bits_per_second(
            b.delivered - a.delivered,
            b.at.saturating_duration_since(a.at),
        )?;
        // The first mark's own flag concerns the gap before it, which is outside the span.
        let app_limited = self.marks.range(first + 1..=last).any(|m| m.app_limited);
        let sent_bps = a.sent.zip(b.sent).and_then(|(x, y)| {
            bits_per_second(
                y.total.saturating_sub(x.total),
                y.at.saturating_duration_since(x.at),
            )
        });
        Some(Rate {
            bps,
            app_limited,
            sent_bps,
        })
    }
}

/// `bytes` over `elapsed` in bit/s; `None` over no time.
pub fn bits_per_second(bytes: u64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (secs > 0.0).then(|| bytes as f64 * 8.0 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_counts_from_the_first_ack_in_the_span_to_the_last() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = DeliveryMeter::default();
        // 1250 bytes every 1 ms: 10 Mb/s.
        for i in 0..100u64 {
            m.add(1250);
            m.mark(t0 + ms(i), t0 + ms(i), false, None);
        }
        let r = m.rate(t0 + ms(99), ms(20)).expect("rate");
        assert!((r.bps - 10e6).abs() < 1.0, "{r:?}");
        assert!(!r.app_limited);
        // Too few ACKs in a short span.
        assert_eq!(m.rate(t0 + ms(99), Duration::from_micros(1500)), None);
    }

    #[test]
    fn a_rate_cut_at_frame_ends_runs_from_frame_end_to_frame_end() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = DeliveryMeter::default();
        // One ACK a 40 ms frame of 50 KB (10 Mb/s); the peer read the fifth frame in two
        // batches, 20 KB and then 30 KB a millisecond later.
        for k in 0..5u32 {
            let at = t0 + ms(40) * k;
            if k == 4 {
                m.add(20_000);
                m.mark(at, at, false, None);
                m.add(30_000);
                m.mark(at + ms(1), at + ms(1), false, None);
            } else {
                m.add(50_000);
                m.mark(at, at, false, None);
            }
        }
        let (from, to) = (t0, t0 + ms(160));
        // Up to the first batch, the fifth frame's ACK counts a part of it for a whole frame.
        let r = m.rate_between(from, to, m.clump_period()).expect("rate");
        assert!((r.bps - 8.5e6).abs() < 1.0, "{r:?}");
        // Cut at frame ends: three whole frames.
        let r = m.rate_between(from, to, Some(ms(40))).expect("rate");
        assert!((r.bps - 10e6).abs() < 1.0, "{r:?}");
    }

    #[test]
    fn a_gap_of_the_senders_own_marks_the_rate() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = DeliveryMeter::default();
        for i in 0..10u64 {
            m.add(1000);
            m.mark(t0 + ms(i), t0 + ms(i), i == 5, None);
        }
        assert!(m.rate(t0 + ms(9), ms(6)).expect("rate").app_limited);
        // The flagged ACK opening the span does not count.
        assert!(!m.rate(t0 + ms(9), ms(4)).expect("rate").app_limited);
        assert_eq!(m.ack_interval(), Some(ms(1)));
        // An idle second is not the ACK pace.
        m.mark(t0 + ms(1009), t0 + ms(1009), false, None);
        assert_eq!(m.ack_interval(), Some(ms(1)));
    }

    #[test]
    fn three_acks_a_frame_are_slotted_clumps_and_rates_run_from_clump_end_to_clump_end() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut m = DeliveryMeter::default();
        // A 40 ms frame delivers three ACKs of 10,000 bytes each, 100 µs apart.
        for frame in 0..50u64 {
            for k in 0..3u64 {
                m.add(10_000);
                m.mark(
                    t0 + us(40_000 * frame + 100 * k),
                    t0 + us(40_000 * frame + 100 * k),
                    false,
                    None,
                );
            }
        }
        assert!(m.clumped());
        assert!(m.slotted());
        // The frame's gap, less what it fell back by since the last one (half per second).
        assert!(m.longest_gap() > us(39_700) && m.longest_gap() <= us(39_800));
        // From the end of frame 40's clump to the end of frame 45's: five frames' bytes in
        // five frames' time, 6 Mb/s; the span's edges inside clumps 40 and 46 do not count.
        let r = m
            .rate_between(
                t0 + us(40_000 * 40),
                t0 + us(40_000 * 46 + 100),
                m.clump_period(),
            )
            .expect("rate");
        assert!((r.bps - 6e6).abs() < 1.0, "{r:?}");
    }

    #[test]
    fn a_gap_the_sender_left_is_no_clump_period() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        // Frames of 20 ms with three ACKs each; after frame 30 the sender pauses, and the
        // next ACK comes 80 ms after the last.
        let after_a_pause = |senders: bool| {
            let mut m = DeliveryMeter::default();
            let mut at = t0;
            for frame in 0..60u64 {
                at = t0 + us(20_000 * frame + if frame > 30 { 60_000 } else { 0 });
                for k in 0..3u64 {
                    if frame == 31 && k == 0 && senders {
                        m.after_senders_gap();
                    }
                    m.add(10_000);
                    m.mark(at + us(100 * k), at + us(100 * k), false, None);
                }
            }
            let gap = m.longest_gap();
            let rate = m.rate_between(t0 + us(620_000), at + us(200), m.clump_period());
            (gap, rate.map(|r| r.bps))
        };
        // Left out, the frames' period stays the clump period: a rate over the frames after
        // the pause runs from clump end to clump end (27 frames' bytes in 27 frames' time).
        let (gap, rate) = after_a_pause(true);
        assert!(gap > us(19_000) && gap <= us(20_000), "{gap:?}");
        assert_eq!(rate, Some(12e6));
        // Counted, the pause is the period (falling back by half a second per second), and no
        // clump ends at half of it.
        let (gap, rate) = after_a_pause(false);
        assert!(gap > us(40_000), "{gap:?}");
        assert_eq!(rate, None);
    }

    #[test]
    fn bunches_after_gaps_of_any_length_are_clumps_but_not_slots() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut m = DeliveryMeter::default();
        // Bunches of eight ACKs 100 µs apart after gaps of 5 to 40 ms in turn: a jitter
        // that holds packets behind each other and releases them together.
        let mut at = Duration::ZERO;
        for bunch in 0..60u64 {
            at += us(5_000 + 7_000 * (bunch % 6));
            for _ in 0..8 {
                at += us(100);
                m.add(1_000);
                m.mark(t0 + at, t0 + at, false, None);
            }
        }
        assert!(m.clumped());
        assert!(!m.slotted());
    }

    #[test]
    fn a_steady_ack_pace_is_no_clumps() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        for i in 0..200u64 {
            m.add(1_000);
            m.mark(
                t0 + Duration::from_millis(i),
                t0 + Duration::from_millis(i),
                false,
                None,
            );
        }
        assert!(!m.clumped());
        assert!(!m.slotted());
    }
}
