//! TCP Vegas on packets, capped at the configured rate.

use std::time::{Duration, Instant};

use super::{AckedPacket, CapacityStats, CongestionController};
use crate::config::VegasParams;
use crate::rtt::RttEstimator;

/// TCP Vegas on packets: once per round trip, `diff = cwnd·(1 − baseRTT/RTT)` packets are
/// taken to sit in the bottleneck queue; grow by one packet below α, shrink by half the
/// excess above β; slow start grows per ACK and ends when diff exceeds γ.
#[derive(Debug)]
pub struct Vegas {
    cap: u64,
    packet: u64,
    params: VegasParams,
    cwnd: f64,
    slow_start: bool,
    round_end: u64,
    round_min_rtt: Duration,
}

const VEGAS_MIN_PACKETS: f64 = 4.0;
const VEGAS_INITIAL_PACKETS: f64 = 10.0;

impl Vegas {
    pub fn new(cap: u64, packet: u64, params: VegasParams) -> Self {
        Vegas {
            cap,
            packet,
            params,
            cwnd: VEGAS_INITIAL_PACKETS * packet as f64,
            slow_start: true,
            round_end: 0,
            round_min_rtt: Duration::MAX,
        }
    }

    /// Beyond twice what the cap can fill in a round trip, a larger window only builds queue.
    fn max_window(&self, rtt: &RttEstimator) -> f64 {
        (self.cap as f64 / 8.0 * rtt.smoothed().as_secs_f64() * 2.0)
            .max(VEGAS_MIN_PACKETS * self.packet as f64)
    }

    fn end_round(&mut self, rtt: &RttEstimator) {
        let sample = self.round_min_rtt;
        self.round_min_rtt = Duration::MAX;
        if sample == Duration::MAX {
            return;
        }
        let base = rtt.min().as_secs_f64();
        let current = sample.as_secs_f64().max(base);
        let packets = self.cwnd / self.packet as f64;
        let diff = packets * (current - base) / current;
        let p = self.packet as f64;
        if self.slow_start {
            if diff > self.params.gamma {
                self.slow_start = false;
                // Drop what slow start queued beyond gamma.
                self.cwnd = (self.cwnd - (diff - self.params.gamma) * p).max(self.cwnd * 0.5);
            }
        } else if diff < self.params.alpha {
            self.cwnd += p;
        } else if diff > self.params.beta {
            self.cwnd -= (diff - self.params.beta) / 2.0 * p;
        }
        self.cwnd = self.cwnd.clamp(VEGAS_MIN_PACKETS * p, self.max_window(rtt));
    }
}

impl CongestionController for Vegas {
    fn name(&self) -> &'static str {
        "vegas"
    }

    fn window(&self, _rtt: &RttEstimator) -> u64 {
        self.cwnd as u64
    }

    fn pacing_rate(&self, rtt: &RttEstimator) -> u64 {
        let gain = if self.slow_start { 2.0 } else { 1.25 };
        let rate = self.cwnd * 8.0 / rtt.smoothed().as_secs_f64().max(1e-4) * gain;
        (rate as u64).min(self.cap).max(8 * self.packet)
    }

    fn on_ack(&mut self, _now: Instant, acked: AckedPacket, rtt: &RttEstimator) {
        if let Some(s) = acked.rtt_sample {
            self.round_min_rtt = self.round_min_rtt.min(s);
        }
        if self.slow_start {
            self.cwnd = (self.cwnd + acked.bytes as f64).min(self.max_window(rtt));
        }
        if acked.pn >= self.round_end {
            self.end_round(rtt);
            self.round_end = acked.next_pn;
        }
    }

    fn on_congestion(&mut self, _now: Instant, _lost_pn: u64, _rtt: &RttEstimator) {
        self.slow_start = false;
        self.cwnd = (self.cwnd * 0.75).max(VEGAS_MIN_PACKETS * self.packet as f64);
    }

    fn set_rate(&mut self, rate_bps: u64) {
        self.cap = rate_bps;
    }

    fn capacity(&self, rtt: &RttEstimator) -> CapacityStats {
        // Vegas keeps no rate estimate of its own; what it paces at is the nearest thing.
        CapacityStats {
            estimate_bps: self.pacing_rate(rtt),
            ..CapacityStats::default()
        }
    }
}
