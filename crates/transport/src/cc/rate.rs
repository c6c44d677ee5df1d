//! Pure rate control (SCPS "open loop"): the configured rate is trusted.

use std::time::Instant;

use super::{AckedPacket, CapacityStats, CongestionController};
use crate::rtt::RttEstimator;

/// Pure rate (SCPS "open loop"): sends at the configured rate with no window. A loss
/// attributed to congestion (a misconfigured rate above the real link) backs the rate off by
/// 1/8; it climbs back by 1/32 of the cap per round trip of acknowledgements.
#[derive(Debug)]
pub struct RateControl {
    cap: u64,
    current: f64,
}

impl RateControl {
    pub fn new(cap: u64) -> Self {
        RateControl {
            cap,
            current: cap as f64,
        }
    }
}

impl CongestionController for RateControl {
    fn name(&self) -> &'static str {
        "rate"
    }

    fn window(&self, _rtt: &RttEstimator) -> u64 {
        u64::MAX
    }

    fn pacing_rate(&self, _rtt: &RttEstimator) -> u64 {
        self.current as u64
    }

    fn on_ack(&mut self, _now: Instant, acked: AckedPacket, rtt: &RttEstimator) {
        if self.current < self.cap as f64 {
            // A round trip's worth of acknowledged bytes raises the rate by cap/32.
            let rtt_bytes = (self.current / 8.0 * rtt.smoothed().as_secs_f64()).max(1.0);
            self.current += self.cap as f64 / 32.0 * acked.bytes as f64 / rtt_bytes;
            self.current = self.current.min(self.cap as f64);
        }
    }

    fn on_congestion(&mut self, _now: Instant, _lost_pn: u64, _rtt: &RttEstimator) {
        self.current = (self.current * 7.0 / 8.0).max(self.cap as f64 / 16.0);
    }

    fn set_rate(&mut self, rate_bps: u64) {
        // The operator changed the link's rate: keep whatever fraction of the old one a
        // congestion response left us at, rather than climbing to a raised rate slowly.
        let fraction = self.current / self.cap.max(1) as f64;
        self.cap = rate_bps;
        self.current = (rate_bps as f64 * fraction).min(rate_bps as f64);
    }

    fn capacity(&self, _rtt: &RttEstimator) -> CapacityStats {
        // This mode trusts its configured rate: that is its whole estimate.
        CapacityStats {
            estimate_bps: self.current as u64,
            ..CapacityStats::default()
        }
    }
}
