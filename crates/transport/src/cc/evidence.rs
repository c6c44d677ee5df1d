//! Queueing-delay evidence: how far the RTT stands above the path's base, as the minimum
//! over a span. A queue that stands raises every sample of the span; a delayed ACK, a late
//! timer or link jitter raises only some, so the minimum ignores them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct QueueEvidence {
    /// (when, queueing delay) of recent samples, increasing in delay (sliding minimum).
    samples: VecDeque<(Instant, Duration)>,
    /// Only packets numbered from here speak for the current sending rate.
    from_pn: u64,
    /// First sample since the last reset.
    since: Option<Instant>,
    count: u32,
}

impl QueueEvidence {
    /// Forgets everything: samples of packets before `from_pn` were sent under another rate.
    pub fn reset(&mut self, from_pn: u64) {
        self.samples.clear();
        self.from_pn = from_pn;
        self.since = None;
        self.count = 0;
    }

    pub fn add(&mut self, now: Instant, pn: u64, queue_delay: Duration, span: Duration) {
        if pn < self.from_pn {
            return;
        }
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
        self.since.get_or_insert(now);
        self.count = self.count.saturating_add(1);
    }

    /// The least queueing delay of the last `span`, once samples have covered a whole span
    /// (and there were at least three of them); `None` before.
    pub fn standing(&self, now: Instant, span: Duration) -> Option<Duration> {
        let since = self.since?;
        if now.saturating_duration_since(since) < span || self.count < 3 {
            return None;
        }
        self.latest_min()
    }

    /// The least queueing delay of the samples still held, whatever their span.
    pub fn latest_min(&self) -> Option<Duration> {
        self.samples.front().map(|&(_, q)| q)
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
    fn evidence_from_before_a_reset_does_not_count() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let span = ms(20);
        let mut e = QueueEvidence::default();
        for i in 0..30u64 {
            e.add(t0 + ms(i), i, ms(50), span);
        }
        e.reset(100);
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
    }
}
