//! A loss-based TCP flow (CUBIC, RFC 9438) sharing the forward link's queue with the
//! simulated senders: the cross traffic that fills a bottleneck's buffer whatever a
//! delay-based sender does, and answers only drops. A window model, not a TCP: one packet
//! per ACK, ACKs return after the path's delay without queueing, a drop is noticed one RTT
//! after the packet left, and the window is cut once per round trip of drops.

use std::time::Duration;

/// CUBIC's multiplicative decrease and scaling constant (RFC 9438 §4.6, §5).
const BETA: f64 = 0.7;
const C: f64 = 0.4;
/// Initial window (packets) and least window after a cut.
const INITIAL_WINDOW: f64 = 10.0;
const MIN_WINDOW: f64 = 2.0;

#[derive(Debug, Clone)]
pub struct CubicFlow {
    /// Bytes of each packet on the wire.
    pub packet_bytes: u64,
    cwnd: f64,
    ssthresh: f64,
    in_flight: u32,
    /// Window before the last cut, and when the cut was (the start of the cubic epoch).
    w_max: f64,
    epoch: Option<Duration>,
    /// Drops of packets sent before this time belong to the cut already made.
    recovered_from: Duration,
    /// The latest RTT sample: when a drop is noticed, and the epoch's time scale.
    rtt: Duration,
}

impl CubicFlow {
    pub fn new(packet_bytes: u64, initial_rtt: Duration) -> CubicFlow {
        CubicFlow {
            packet_bytes,
            cwnd: INITIAL_WINDOW,
            ssthresh: f64::INFINITY,
            in_flight: 0,
            w_max: 0.0,
            epoch: None,
            recovered_from: Duration::ZERO,
            rtt: initial_rtt,
        }
    }

    pub fn can_send(&self) -> bool {
        f64::from(self.in_flight) < self.cwnd
    }

    pub fn on_sent(&mut self) {
        self.in_flight += 1;
    }

    /// When a drop of a packet sent now is noticed.
    pub fn loss_noticed_after(&self) -> Duration {
        self.rtt
    }

    /// The packet sent at `sent_at` was acknowledged at `now`.
    pub fn on_ack(&mut self, now: Duration, sent_at: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.rtt = now.saturating_sub(sent_at);
        if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
            return;
        }
        let epoch = *self.epoch.get_or_insert(now);
        let t = (now.saturating_sub(epoch) + self.rtt).as_secs_f64();
        let k = (self.w_max * (1.0 - BETA) / C).cbrt();
        let cubic = C * (t - k).powi(3) + self.w_max;
        // The Reno-friendly window (RFC 9438 §4.3) where CUBIC would be slower than Reno.
        let rtts = now.saturating_sub(epoch).as_secs_f64() / self.rtt.as_secs_f64().max(1e-6);
        let reno = self.w_max * BETA + 3.0 * (1.0 - BETA) / (1.0 + BETA) * rtts;
        let target = cubic.max(reno);
        if target > self.cwnd {
            self.cwnd += (target - self.cwnd) / self.cwnd;
        } else {
            self.cwnd += 0.01 / self.cwnd;
        }
    }

    /// The packet sent at `sent_at` was dropped; noticed at `now`.
    pub fn on_loss(&mut self, now: Duration, sent_at: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if sent_at < self.recovered_from {
            return;
        }
        self.w_max = self.cwnd;
        self.cwnd = (self.cwnd * BETA).max(MIN_WINDOW);
        self.ssthresh = self.cwnd;
        self.epoch = Some(now);
        self.recovered_from = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn slow_start_doubles_then_one_cut_per_round_of_drops() {
        let mut f = CubicFlow::new(1500, ms(600));
        assert_eq!(f.cwnd, 10.0);
        for _ in 0..10 {
            f.on_sent();
        }
        assert!(!f.can_send());
        for _ in 0..10 {
            f.on_ack(ms(600), ms(0));
        }
        assert_eq!(f.cwnd, 20.0);
        for _ in 0..4 {
            f.on_sent();
        }
        // Three drops of packets sent before the first was noticed: one cut.
        f.on_loss(ms(1300), ms(700));
        f.on_loss(ms(1301), ms(701));
        f.on_loss(ms(1302), ms(702));
        assert_eq!(f.cwnd, 14.0);
        // A packet sent after the cut and dropped is a new round: a second cut.
        f.on_loss(ms(2000), ms(1400));
        assert!((f.cwnd - 9.8).abs() < 1e-9, "{}", f.cwnd);
        assert_eq!(f.in_flight, 0);
    }

    #[test]
    fn after_a_cut_the_window_grows_back_to_where_it_was_in_about_k() {
        let mut f = CubicFlow::new(1500, ms(600));
        f.cwnd = 1000.0;
        f.on_loss(ms(0), ms(0));
        assert_eq!(f.cwnd, 700.0);
        // K = cbrt(1000 × 0.3 / 0.4) ≈ 9.09 s: by then the window is back near 1000.
        let mut now = ms(0);
        // ACKs at about the window's pace (700 packets in 600 ms).
        while now < ms(9_000) {
            now += ms(1);
            f.on_sent();
            f.on_ack(now, now.saturating_sub(ms(600)));
        }
        assert!(f.cwnd > 950.0 && f.cwnd < 1010.0, "{}", f.cwnd);
    }
}
