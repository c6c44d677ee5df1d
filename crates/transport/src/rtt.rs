//! Round-trip time estimation: smoothed RTT and variance (RFC 6298) and an ageing minimum
//! that serves as Vegas's base RTT and the zero point of queueing-delay evidence.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::windowed_min::WindowedMin;

/// The minimum is kept over two alternating windows of this length, so a path change that
/// raises the true minimum is adopted within 2 windows instead of never.
const MIN_RTT_WINDOW: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct RttEstimator {
    latest: Duration,
    smoothed: Option<Duration>,
    var: Duration,
    initial: Duration,
    min: WindowedMin<Duration>,
    /// Samples of the last quarter round trip, increasing in RTT (sliding-window minimum).
    recent: VecDeque<(Instant, Duration)>,
}

/// Shortest span of the recent minimum: a standing queue outlasts it, a scheduling hiccup
/// of the endpoints does not.
const RECENT_MIN_SPAN: Duration = Duration::from_millis(20);

impl RttEstimator {
    pub fn new(initial: Duration) -> Self {
        RttEstimator {
            latest: initial,
            smoothed: None,
            var: initial / 2,
            initial,
            min: WindowedMin::new(MIN_RTT_WINDOW),
            recent: VecDeque::new(),
        }
    }

    pub fn has_samples(&self) -> bool {
        self.smoothed.is_some()
    }

    /// Records a path RTT sample (ACK delay already subtracted).
    pub fn on_sample(&mut self, now: Instant, rtt: Duration) {
        let rtt = rtt.max(Duration::from_micros(1));
        self.latest = rtt;
        self.min.add(now, rtt);
        while self.recent.back().is_some_and(|&(_, r)| r >= rtt) {
            self.recent.pop_back();
        }
        self.recent.push_back((now, rtt));
        let span = (self.smoothed() / 4).max(RECENT_MIN_SPAN);
        while self
            .recent
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > span)
        {
            self.recent.pop_front();
        }
        match self.smoothed {
            None => {
                self.smoothed = Some(rtt);
                self.var = rtt / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(rtt);
                self.var = (self.var * 3 + diff) / 4;
                self.smoothed = Some((s * 7 + rtt) / 8);
            }
        }
    }

    pub fn latest(&self) -> Duration {
        self.latest
    }

    /// Lowest sample of the last quarter round trip (at least 20 ms): queueing delay shows
    /// in every sample of such a span, a delayed ACK or a late timer only in some.
    pub fn recent_min(&self) -> Duration {
        self.recent.front().map_or(self.latest, |&(_, r)| r)
    }

    pub fn smoothed(&self) -> Duration {
        self.smoothed.unwrap_or(self.initial)
    }

    pub fn var(&self) -> Duration {
        self.var
    }

    /// Lowest RTT seen recently; the initial RTT before any sample.
    pub fn min(&self) -> Duration {
        self.min.get().unwrap_or(self.initial)
    }

    /// Probe timeout before back-off (RFC 9002 PTO).
    pub fn pto(&self, max_ack_delay: Duration) -> Duration {
        self.smoothed() + (self.var * 4).max(Duration::from_millis(1)) + max_ack_delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_min_ignores_a_lone_spike_but_follows_a_standing_queue() {
        let mut r = RttEstimator::new(Duration::from_millis(600));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        for i in 0..100u64 {
            r.on_sample(t0 + ms(i), ms(500));
        }
        r.on_sample(t0 + ms(100), ms(530));
        assert_eq!(r.latest(), ms(530));
        assert_eq!(r.recent_min(), ms(500));
        // A queue that holds for a quarter round trip raises every sample.
        for i in 101..400u64 {
            r.on_sample(t0 + ms(i), ms(520));
        }
        assert_eq!(r.recent_min(), ms(520));
    }

    #[test]
    fn min_ages_out_after_two_windows() {
        let t0 = Instant::now();
        let mut r = RttEstimator::new(Duration::from_millis(600));
        r.on_sample(t0, Duration::from_millis(500));
        assert_eq!(r.min(), Duration::from_millis(500));
        // Path gets longer.
        for i in 1..200u64 {
            r.on_sample(t0 + Duration::from_secs(i), Duration::from_millis(700));
        }
        assert_eq!(r.min(), Duration::from_millis(700));
        assert!(r.smoothed() > Duration::from_millis(690));
    }
}
