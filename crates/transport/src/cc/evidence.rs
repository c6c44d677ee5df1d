//! Queueing-delay evidence: how far the RTT stands above the path's base, as the minimum
//! over a span. A queue that stands raises every sample of the span; a delayed ACK, a late
//! timer or link jitter raises only some, so the minimum ignores them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The sliding minimum of queueing-delay samples over a span.
#[derive(Debug, Default)]
struct SlidingMin {
    /// (when, queueing delay), increasing in delay.
    samples: VecDeque<(Instant, Duration)>,
    /// When each sample of the span came: a minimum of too few samples is no evidence.
    times: VecDeque<Instant>,
    /// First sample since the last clear.
    since: Option<Instant>,
}

/// Fewest samples a span must hold for its minimum to count.
const MIN_SAMPLES: usize = 3;

impl SlidingMin {
    fn clear(&mut self) {
        self.samples.clear();
        self.times.clear();
        self.since = None;
    }

    fn add(&mut self, now: Instant, queue_delay: Duration, span: Duration) {
        while self.samples.back().is_some_and(|&(_, q)| q >= queue_delay) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, queue_delay));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > span)
        {
            self.samples.pop_front();
        }
        self.times.push_back(now);
        while self
            .times
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > span)
        {
            self.times.pop_front();
        }
        self.since.get_or_insert(now);
    }

    /// The minimum of the samples of the last `span` before `now`, if samples have covered
    /// a whole span and at least three fall in it. Samples are pruned only when one is
    /// added: without new ones, the old must not speak for the present.
    fn standing(&self, now: Instant, span: Duration) -> Option<Duration> {
        let since = self.since?;
        let from = now.checked_sub(span)?;
        // Asked for every packet sent: counting only as far as the threshold keeps that
        // from walking the whole span of samples each time.
        let recent = self
            .times
            .iter()
            .rev()
            .filter(|&&t| t >= from)
            .take(MIN_SAMPLES)
            .count();
        if now.saturating_duration_since(since) < span || recent < MIN_SAMPLES {
            return None;
        }
        // Increasing in delay, and in time: the first inside the span is its minimum.
        self.samples
            .iter()
            .find(|&&(t, _)| t >= from)
            .map(|&(_, q)| q)
    }
}

#[derive(Debug, Default)]
pub struct QueueEvidence {
    /// Samples of packets sent under the current rate.
    current: SlidingMin,
    /// Samples of packets sent before the last reset: still on their way when the rate
    /// changed, they show the queue as it was then.
    earlier: SlidingMin,
    /// Only packets numbered from here speak for the current sending rate.
    from_pn: u64,
    /// The most queue the earlier packets may show without news.
    earlier_floor: Duration,
    /// The last two samples of packets sent at the current rate's steady pace (as the
    /// caller judges it: not app-limited, not a probe's nor of the span after its pause),
    /// older first: how the queue moved between them.
    paced: [Option<(Instant, Duration)>; 2],
}

impl QueueEvidence {
    /// Starts over from packet `from_pn`: earlier packets were sent under another rate, and
    /// a queue of `earlier_floor` (the one just drained) is what they are expected to show.
    pub fn reset(&mut self, from_pn: u64, earlier_floor: Duration) {
        self.current.clear();
        self.earlier.clear();
        self.from_pn = from_pn;
        self.earlier_floor = earlier_floor;
        self.paced = [None, None];
    }

    pub fn add(&mut self, now: Instant, pn: u64, queue_delay: Duration, span: Duration) {
        if pn < self.from_pn {
            self.earlier.add(now, queue_delay, span);
        } else {
            self.current.add(now, queue_delay, span);
        }
    }

    /// A sample of a packet sent at the steady pace: the sender's own gaps (a probe's pause,
    /// nothing to send) lift the next packet's delay on a path that releases packets in
    /// frames, as a queue would.
    pub fn add_paced(&mut self, now: Instant, pn: u64, queue_delay: Duration) {
        if pn >= self.from_pn {
            self.paced = [self.paced[1], Some((now, queue_delay))];
        }
    }

    /// The older of the last two paced samples, where it came within `span` and the newer
    /// stood more than `by` above it: a queue that grew between them.
    pub fn rising(&self, now: Instant, span: Duration, by: Duration) -> Option<Duration> {
        let [Some((at, older)), Some((_, newer))] = self.paced else {
            return None;
        };
        (now.saturating_duration_since(at) <= span && newer.saturating_sub(older) > by)
            .then_some(older)
    }

    /// The least queueing delay of the last `span` of packets sent under the current rate,
    /// once samples have covered a whole span, and the span holds at least three of them;
    /// `None` otherwise.
    pub fn standing(&self, now: Instant, span: Duration) -> Option<Duration> {
        self.current.standing(now, span)
    }

    /// A queue that stood over `span` in packets sent before the reset and is longer than
    /// what they were expected to show: the path slowed down again while the packets sent
    /// since are still on their way (their evidence takes a round trip plus the queue).
    pub fn grown(&self, now: Instant, span: Duration) -> Option<Duration> {
        self.earlier
            .standing(now, span)
            .filter(|&q| q > self.earlier_floor)
    }

    /// The standing queue of the last `span` whichever packets showed it: those sent under
    /// the current rate, or earlier ones.
    pub fn standing_any(&self, now: Instant, span: Duration) -> Option<Duration> {
        match (
            self.current.standing(now, span),
            self.earlier.standing(now, span),
        ) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standing_queue_shows_a_spike_does_not() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let span = ms(20);
        let mut e = QueueEvidence::default();
        for i in 0..30u64 {
            let q = if i == 25 { ms(80) } else { ms(1) };
            e.add(t0 + ms(i), i, q, span);
        }
        assert_eq!(e.standing(t0 + ms(29), span), Some(ms(1)));
        for i in 30..60u64 {
            e.add(t0 + ms(i), i, ms(15), span);
        }
        assert_eq!(e.standing(t0 + ms(59), span), Some(ms(15)));
    }

    #[test]
    fn a_queue_that_grows_between_two_paced_samples_is_rising() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let span = ms(180);
        let mut e = QueueEvidence::default();
        e.reset(10, Duration::ZERO);
        // A sample from before the reset, and one that only moved within the bound.
        e.add_paced(t0, 9, ms(1));
        assert_eq!(e.rising(t0, span, ms(10)), None);
        e.add_paced(t0, 10, ms(20));
        e.add_paced(t0 + ms(60), 11, ms(25));
        assert_eq!(e.rising(t0 + ms(60), span, ms(10)), None);
        e.add_paced(t0 + ms(120), 12, ms(64));
        assert_eq!(e.rising(t0 + ms(120), span, ms(10)), Some(ms(25)));
        // Too old to speak for the present.
        assert_eq!(e.rising(t0 + ms(300), span, ms(10)), None);
        // A fall is no rise.
        e.add_paced(t0 + ms(180), 13, ms(30));
        assert_eq!(e.rising(t0 + ms(180), span, ms(10)), None);
        e.reset(20, Duration::ZERO);
        e.add_paced(t0 + ms(240), 20, ms(90));
        assert_eq!(e.rising(t0 + ms(240), span, ms(10)), None);
    }

    #[test]
    fn evidence_from_before_a_reset_does_not_count() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let span = ms(20);
        let mut e = QueueEvidence::default();
        for i in 0..30u64 {
            e.add(t0 + ms(i), i, ms(50), span);
        }
        e.reset(100, ms(60));
        // Late ACKs of packets sent before the reset.
        for i in 30..60u64 {
            e.add(t0 + ms(i), i, ms(50), span);
        }
        assert_eq!(e.standing(t0 + ms(59), span), None);
        for i in 60..70u64 {
            e.add(t0 + ms(i), 100 + i, ms(2), span);
        }
        // Not a whole span yet.
        assert_eq!(e.standing(t0 + ms(69), span), None);
        for i in 70..85u64 {
            e.add(t0 + ms(i), 100 + i, ms(2), span);
        }
        assert_eq!(e.standing(t0 + ms(84), span), Some(ms(2)));
        // The earlier packets' 50 ms is below the 60 ms expected of them.
        assert_eq!(e.grown(t0 + ms(84), span), None);
    }

    #[test]
    fn earlier_packets_that_show_a_growing_queue_are_news() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let span = ms(20);
        let mut e = QueueEvidence::default();
        e.reset(1000, ms(30));
        for i in 0..40u64 {
            e.add(t0 + ms(i), i, ms(20 + 10 * i), span);
        }
        assert_eq!(e.standing(t0 + ms(39), span), None);
        // The least of the last 20 ms: the sample at 19 ms (210 ms of queue).
        assert_eq!(e.grown(t0 + ms(39), span), Some(ms(210)));
        // Once no packet speaks any more, old samples say nothing about the present.
        assert_eq!(e.grown(t0 + ms(100), span), None);
    }
}
