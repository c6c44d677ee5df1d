//! Aggregate per-packet pacer: one schedule for the whole association, in 64-bit nanoseconds,
//! so no rate is capped by arithmetic and no 10-ms refills produce bursts.

use std::time::{Duration, Instant};

/// The pacer may always fall behind schedule by this many packets' worth and catch up back
/// to back; the configured burst time can allow more (a coarse timer in a real event loop).
const CATCH_UP_PACKETS: u64 = 2;

/// Time `bytes` take at `rate_bps`, in 64-bit nanoseconds (no rate is capped by the
/// arithmetic); a rate of 0 counts as 1 bit/s.
pub fn transmission_time(bytes: u64, rate_bps: u64) -> Duration {
    let nanos = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate_bps.max(1));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[derive(Debug, Clone)]
pub struct Pacer {
    next_send: Option<Instant>,
    rate_bps: u64,
    packet_bytes: u64,
    burst: Duration,
}

impl Pacer {
    pub fn new(rate_bps: u64, packet_bytes: usize) -> Self {
        Pacer {
            next_send: None,
            rate_bps: rate_bps.max(1),
            packet_bytes: packet_bytes as u64,
            burst: Duration::ZERO,
        }
    }

    /// Lets the schedule lag by up to `burst` (at least two packets) before it slips.
    pub fn with_burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    pub fn set_rate(&mut self, rate_bps: u64) {
        self.rate_bps = rate_bps.max(1);
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// Time one `bytes`-byte datagram occupies at the pacing rate.
    pub fn transmission_time(&self, bytes: u64) -> Duration {
        transmission_time(bytes, self.rate_bps)
    }

    /// When the next datagram may leave, or `None` if it may leave now.
    pub fn delay_until(&self, now: Instant) -> Option<Instant> {
        self.next_send.filter(|&t| t > now)
    }

    /// When the next datagram may leave (now, if it may leave at once).
    pub fn delay_until_or_now(&self) -> Option<Instant> {
        self.next_send
    }

    /// How far a datagram leaving at `now` is behind the schedule: the time its slot went
    /// unused.
    pub fn behind(&self, now: Instant) -> Duration {
        self.next_send
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// Keeps the next packet back for `d` beyond its slot.
    pub fn pause(&mut self, d: Duration) {
        if let Some(t) = self.next_send.as_mut() {
            *t += d;
        }
    }

    /// Books `wire_bytes` on the schedule. Returns whether the schedule had slipped: the
    /// sender left its slot unused for longer than the catch-up allowance (nothing to send,
    /// held by a window, or a timer that fired very late), so the path saw a gap before
    /// this packet.
    pub fn on_sent(&mut self, now: Instant, wire_bytes: u64) -> bool {
        let slack = self
            .transmission_time(self.packet_bytes * CATCH_UP_PACKETS)
            .max(self.burst);
        let earliest = now.checked_sub(slack).unwrap_or(now);
        let slipped = self.next_send.is_none_or(|t| t < earliest);
        let start = self.next_send.map_or(now, |t| t.max(earliest));
        self.next_send = Some(start + self.transmission_time(wire_bytes));
        slipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_at_the_configured_rate_without_overflow() {
        // 10 Gb/s and 1500-byte packets: 1.2 us each; 32-bit math would overflow here.
        let mut p = Pacer::new(10_000_000_000, 1500);
        let t0 = Instant::now();
        let mut now = t0;
        let mut sent = 0u64;
        while now < t0 + Duration::from_millis(10) {
            match p.delay_until(now) {
                Some(t) => now = t,
                None => {
                    p.on_sent(now, 1500);
                    sent += 1;
                }
            }
        }
        let rate = sent as f64 * 1500.0 * 8.0 / 0.010;
        assert!((rate / 1e10 - 1.0).abs() < 0.01, "{rate}");
    }

    #[test]
    fn a_burst_allowance_keeps_the_rate_under_a_millisecond_timer() {
        // 100 Mb/s is 8.3 packets per millisecond; a loop that can only wake on whole
        // milliseconds loses most of the rate with a two-packet catch-up.
        let rate_with = |burst: Duration| {
            let mut p = Pacer::new(100_000_000, 1500).with_burst(burst);
            let t0 = Instant::now();
            let mut now = t0;
            let mut sent = 0u64;
            while now < t0 + Duration::from_millis(100) {
                match p.delay_until(now) {
                    Some(t) => {
                        let ms = (t - t0).as_nanos().div_ceil(1_000_000) as u64;
                        now = t0 + Duration::from_millis(ms);
                    }
                    None => {
                        p.on_sent(now, 1500);
                        sent += 1;
                    }
                }
            }
            sent as f64 * 1500.0 * 8.0 / 0.1 / 1e8
        };
        assert!(rate_with(Duration::ZERO) < 0.5);
        let with_burst = rate_with(Duration::from_millis(2));
        assert!(with_burst > 0.99 && with_burst < 1.02, "{with_burst}");
    }

    #[test]
    fn idle_sender_gets_only_a_small_catch_up() {
        let mut p = Pacer::new(1_544_000, 1500);
        let t0 = Instant::now();
        p.on_sent(t0, 1500);
        let later = t0 + Duration::from_secs(10);
        let mut burst = 0;
        while p.delay_until(later).is_none() {
            p.on_sent(later, 1500);
            burst += 1;
        }
        assert!(burst <= CATCH_UP_PACKETS + 1, "{burst}");
    }
}
