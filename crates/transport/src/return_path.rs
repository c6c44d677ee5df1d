//! How much later than its quickest an ACK crossed the return path, read from the
//! receiver's timestamps: the sender measures the forward path's delivery and delay as if
//! every ACK had come back at the return path's least delay, so jitter on the return link
//! (an MF-TDMA return channel's slots, a scheduler's bunching) is not taken for the forward
//! path's.

use std::time::{Duration, Instant};

use crate::windowed_min::WindowedMin;

/// The least return delay is kept over two alternating windows of this length: a longer
/// return path is adopted within two windows, and two hosts' clocks that run apart by
/// 100 ppm move the least delay by only 1 ms within one.
const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct ReturnPath {
    origin: Option<Instant>,
    /// The least of our clock minus the peer's (the return delay plus the clocks' offset).
    least: WindowedMin<i128>,
}

impl Default for ReturnPath {
    fn default() -> Self {
        ReturnPath {
            origin: None,
            least: WindowedMin::new(WINDOW),
        }
    }
}

impl ReturnPath {
    /// The ACK that arrived at `now` left the receiver `sent_us` µs into the receiver's
    /// clock: how much longer than the least this side has seen it took. Above `bound` the
    /// receiver's clock is taken to count from elsewhere, and the ACK starts the
    /// measurement afresh (zero).
    pub fn excess(&mut self, now: Instant, sent_us: u64, bound: Duration) -> Duration {
        let origin = *self.origin.get_or_insert(now);
        // Our clock minus the peer's: the return delay plus an unknown constant offset.
        let offset =
            now.saturating_duration_since(origin).as_micros() as i128 - i128::from(sent_us);
        self.least.add(now, offset);
        let least = self.least.get().unwrap_or(offset);
        let excess = u64::try_from(offset - least).unwrap_or(0);
        if excess > bound.as_micros() as u64 {
            // Longer than the path's round trips: not the return path's jitter but a clock
            // that starts from elsewhere (the peer restarted, or a hub took over): measure
            // from this ACK.
            self.least.restart(now, offset);
            return Duration::ZERO;
        }
        Duration::from_micros(excess)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_ack_is_late_by_its_delay_above_the_least() {
        let mut r = ReturnPath::default();
        let t0 = Instant::now();
        let bound = ms(600);
        // The peer's clock runs 5 s ahead of ours; return delays 300, 320, 300, 345 ms.
        let peer = |sent: Duration| (Duration::from_secs(5) + sent).as_micros() as u64;
        for (sent, delay, excess) in [(0, 300, 0), (40, 320, 20), (80, 300, 0), (120, 345, 45)] {
            let arrived = t0 + ms(sent + delay);
            assert_eq!(r.excess(arrived, peer(ms(sent)), bound), ms(excess));
        }
    }

    #[test]
    fn a_clock_from_elsewhere_is_measured_from_its_first_ack() {
        let mut r = ReturnPath::default();
        let t0 = Instant::now();
        let bound = ms(600);
        assert_eq!(r.excess(t0, 1_000_000, bound), ms(0));
        assert_eq!(r.excess(t0 + ms(10), 1_000_000, bound), ms(10));
        // The peer restarted: its clock is 70 s behind where it was.
        assert_eq!(r.excess(t0 + ms(20), 20_000, bound), ms(0));
        assert_eq!(r.excess(t0 + ms(40), 30_000, bound), ms(10));
    }

    #[test]
    fn the_least_delay_ages_out_within_two_windows() {
        let mut r = ReturnPath::default();
        let t0 = Instant::now();
        let bound = ms(600);
        assert_eq!(r.excess(t0, 0, bound), ms(0));
        // The return path is 50 ms longer from here on.
        let mut excess = Vec::new();
        for s in 1..=25u64 {
            let sent = Duration::from_secs(s);
            excess.push(r.excess(t0 + sent + ms(50), sent.as_micros() as u64, bound));
        }
        assert_eq!(excess[0], ms(50));
        assert_eq!(excess[24], ms(0));
    }
}
