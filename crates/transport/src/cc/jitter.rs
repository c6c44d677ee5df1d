//! The path's own delay jitter as the sender sees it in RTT samples, measured so that a queue
//! does not count: how far the least RTT of one span stands above the least RTTs of the spans
//! on *both* sides of it. A queue that stands, grows or drains moves the span minimums
//! together (or one way), so one of the two sides is at least as high and it adds nothing;
//! jitter lifts single spans above their neighbours on both sides. A delay that wanders
//! smoothly (a LEO path getting longer) adds little either. docs/PROTOCOL.md §5.5.1 ("Jitter")
//! gives the rules and why each constant has its value.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Spans on each side (the span itself included) that a span's minimum is compared with:
/// three spans of 20–50 ms hold a low one of a uniform jitter's often enough (with this and
/// twice the measure allowed for, no span of the simulator's uniform or slotted jitter of up
/// to 30 ms read as an overload), a smooth wander or a queue that rises slowly (another
/// sender's) moves little over them, and a reading is ready five spans after a pause.
const SIDE: usize = 3;
/// The measure falls back by this much of itself per second without a larger reading: a path
/// whose jitter shows in one span of a hundred (a slotted 60 ms frame against 20 ms spans)
/// keeps it between readings, and a path that calms down loses it within tens of seconds.
const DECAY_PER_SECOND: f64 = 0.1;
/// A pause in the samples longer than this many spans (an outage, an idle sender) starts the
/// comparison afresh: the spans on either side of it were different paths or loads.
const GAP_SPANS: u32 = 4;

#[derive(Debug, Default)]
pub struct JitterMeter {
    /// The span being filled: when it began and its least sample.
    open: Option<(Instant, Duration)>,
    /// Least RTT of each of the latest closed spans, oldest first (at most `2 × SIDE − 1`).
    minimums: VecDeque<Duration>,
    /// The measure: how far a span's minimum stood above both sides' lately.
    jitter: Duration,
    last_sample: Option<Instant>,
    /// The first packet sent after the sender emptied its own queue: its sample starts the
    /// comparison afresh.
    restart_pn: Option<u64>,
}

impl JitterMeter {
    /// From packet `pn` on the sender no longer keeps the queue it kept before (a drain
    /// emptied it, or the train ended): the fall from the samples before to those after
    /// would read as jitter, so the comparison starts afresh with that packet's sample.
    pub fn restart_at(&mut self, pn: u64) {
        self.restart_pn = Some(pn);
    }

    /// The RTT sample of packet `pn`; `span` is the evidence span in use (without the
    /// jitter's extension); `base` and `quiet`: spans are compared only where those on both
    /// sides stand within `quiet` of `base`, so the rise and fall of a queue that stands
    /// (another sender's that fills the buffer) is not taken for jitter.
    pub fn on_sample(
        &mut self,
        now: Instant,
        pn: u64,
        rtt: Duration,
        span: Duration,
        base: Duration,
        quiet: Duration,
    ) {
        if self.restart_pn.is_some_and(|r| pn >= r) {
            self.restart_pn = None;
            self.minimums.clear();
            self.open = None;
        }
        if self
            .last_sample
            .is_some_and(|t| now.saturating_duration_since(t) > span * GAP_SPANS)
        {
            self.minimums.clear();
            self.open = None;
        }
        self.last_sample = Some(now);
        match self.open {
            Some((start, least)) if now.saturating_duration_since(start) < span => {
                self.open = Some((start, least.min(rtt)));
            }
            Some((start, least)) => {
                self.close(least, now.saturating_duration_since(start), base + quiet);
                self.open = Some((now, rtt));
            }
            None => self.open = Some((now, rtt)),
        }
    }

    fn close(&mut self, least: Duration, lasted: Duration, quiet_below: Duration) {
        let keep = 2 * SIDE - 1;
        if self.minimums.len() == keep {
            self.minimums.pop_front();
        }
        self.minimums.push_back(least);
        let decay = (DECAY_PER_SECOND * lasted.as_secs_f64()).min(1.0);
        self.jitter = self.jitter.mul_f64(1.0 - decay);
        if self.minimums.len() < keep {
            return;
        }
        let centre = self.minimums[SIDE - 1];
        let floor = |range: std::ops::Range<usize>| {
            self.minimums.range(range).copied().min().unwrap_or(centre)
        };
        let before = floor(0..SIDE);
        let after = floor(SIDE - 1..keep);
        let floor = before.max(after);
        if floor <= quiet_below {
            self.jitter = self.jitter.max(centre.saturating_sub(floor));
        }
    }

    /// How far jitter alone lifts one span's least RTT above the path's: zero on a path
    /// that does not jitter.
    pub fn jitter(&self) -> Duration {
        self.jitter
    }

    /// Jitter seen elsewhere (the falls of the RTT within a train): the measure is at least
    /// that, and decays from it as from a reading of its own.
    pub fn at_least(&mut self, jitter: Duration) {
        self.jitter = self.jitter.max(jitter);
    }

    /// The association restarted: packet numbers start again. What was measured is the
    /// path's and stays.
    pub fn restart(&mut self) {
        self.minimums.clear();
        self.open = None;
        self.last_sample = None;
        self.restart_pn = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Feeds one sample per millisecond for `n` ms from `t`, the RTT given by `f(ms)`.
    fn feed(m: &mut JitterMeter, t: Instant, n: u64, f: impl Fn(u64) -> Duration) {
        for i in 0..n {
            m.on_sample(t + ms(i), i, f(i), ms(20), ms(600), ms(10));
        }
    }

    #[test]
    fn a_queue_that_grows_stands_or_drains_is_not_jitter() {
        let t0 = Instant::now();
        let mut m = JitterMeter::default();
        // Grows 1 ms per ms for a second, stands, then drains.
        feed(&mut m, t0, 1000, |i| ms(600 + i));
        feed(&mut m, t0 + ms(1000), 1000, |_| ms(1600));
        feed(&mut m, t0 + ms(2000), 800, |i| ms(1600 - i));
        assert_eq!(m.jitter(), Duration::ZERO);
    }

    #[test]
    fn the_rise_and_fall_of_a_queue_that_stands_is_not_jitter() {
        let t0 = Instant::now();
        let mut m = JitterMeter::default();
        // Another sender's queue of about 400 ms over a path of 600: every third span 12 ms
        // higher, but never within 10 ms of the path's own RTT.
        feed(&mut m, t0, 2000, |i| {
            if (i / 20) % 3 == 1 {
                ms(1012)
            } else {
                ms(1000)
            }
        });
        assert_eq!(m.jitter(), Duration::ZERO);
    }

    #[test]
    fn spans_lifted_above_both_sides_are() {
        let t0 = Instant::now();
        let mut m = JitterMeter::default();
        // Every third span of 20 ms stands 12 ms higher: a jitter that lifts whole spans.
        feed(&mut m, t0, 2000, |i| {
            if (i / 20) % 3 == 1 {
                ms(612)
            } else {
                ms(600)
            }
        });
        assert!(
            m.jitter() >= ms(11) && m.jitter() <= ms(12),
            "{:?}",
            m.jitter()
        );
        // It fades without new readings, and a pause starts the comparison afresh.
        feed(&mut m, t0 + ms(10_000), 10_000, |_| ms(600));
        assert!(m.jitter() < ms(5), "{:?}", m.jitter());
    }
}
