//! The delivery rates measured while one overload's queue stood: each over a span of only a
//! few ACKs, so each is noisy (at 5 Mb/s a span holds three ACKs, and one bunched or late
//! ACK moves it by 10–15 %), but the bottleneck was busy for all of them, so they measure
//! the same capacity. Their median is what the overload takes: one bunch or one stall of a
//! host moves a few of them, not the median.

/// Measurements kept: the latest this many. At 100 Mb/s, where an ACK comes every
/// millisecond, they cover the last 30 ms of ACKs plus a span; at 5 Mb/s, more than half a
/// second.
const KEEP: usize = 31;

/// Held inline: a drain measures on every ACK, and the median must not allocate there.
#[derive(Debug)]
pub struct BusyRates {
    rates: [f64; KEEP],
    len: usize,
    /// Where the next measurement goes once `rates` is full.
    next: usize,
}

impl Default for BusyRates {
    fn default() -> Self {
        BusyRates {
            rates: [0.0; KEEP],
            len: 0,
            next: 0,
        }
    }
}

impl BusyRates {
    /// Starts a new overload: earlier measurements were of another busy period.
    pub fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }

    pub fn add(&mut self, bps: f64) {
        if self.len < KEEP {
            self.rates[self.len] = bps;
            self.len += 1;
        } else {
            self.rates[self.next] = bps;
            self.next = (self.next + 1) % KEEP;
        }
    }

    /// The median of the kept measurements (the lower middle of an even count: erring low
    /// leaves a gap that the probes find, erring high a queue); `None` before the first.
    pub fn median(&self) -> Option<f64> {
        let mut sorted = self.rates;
        let kept = &mut sorted[..self.len];
        let mid = kept.len().checked_sub(1)? / 2;
        let (_, m, _) = kept.select_nth_unstable_by(mid, f64::total_cmp);
        Some(*m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_ignores_a_few_outliers_and_forgets_the_oldest() {
        let mut b = BusyRates::default();
        assert_eq!(b.median(), None);
        for r in [5.0e6, 4.0e6, 5.7e6, 5.0e6, 5.1e6, 4.9e6] {
            b.add(r);
        }
        // Sorted: 4.0 4.9 5.0 5.0 5.1 5.7: the lower middle.
        assert_eq!(b.median(), Some(5.0e6));
        b.clear();
        b.add(9.0e6);
        assert_eq!(b.median(), Some(9.0e6));
        for _ in 0..KEEP {
            b.add(3.0e6);
        }
        // The first measurement was replaced by the newest.
        assert_eq!(b.len, KEEP);
        assert_eq!(b.median(), Some(3.0e6));
        assert!(!b.rates.contains(&9.0e6));
    }
}
