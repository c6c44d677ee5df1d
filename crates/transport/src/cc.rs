//! Congestion control: how much may be in flight and how fast to pace it. Behind a small
//! trait so modes can be added; the loss *cause* is decided elsewhere (`loss`), and only
//! losses attributed to congestion reach `on_congestion`, once per loss epoch.

use std::fmt;
use std::time::{Duration, Instant};

use crate::config::{CcMode, Config, VegasParams};
use crate::rtt::RttEstimator;

/// One newly acknowledged ack-eliciting packet.
#[derive(Debug, Clone, Copy)]
pub struct AckedPacket {
    pub pn: u64,
    pub bytes: u64,
    /// Path RTT sample if this packet was the largest acknowledged by the ACK.
    pub rtt_sample: Option<Duration>,
    /// Next packet number the sender will use (ends Vegas rounds).
    pub next_pn: u64,
}

pub trait CongestionController: Send + fmt::Debug {
    fn name(&self) -> &'static str;
    /// Bytes allowed in flight.
    fn window(&self) -> u64;
    /// Pacing rate in on-wire bits per second.
    fn pacing_rate(&self, rtt: &RttEstimator) -> u64;
    fn on_ack(&mut self, now: Instant, acked: AckedPacket, rtt: &RttEstimator);
    /// Losses attributed to congestion: the caller guarantees at most once per loss epoch.
    fn on_congestion(&mut self, now: Instant);
    /// Changes the configured rate (cap) live.
    fn set_rate(&mut self, rate_bps: u64);
}

pub fn new_controller(cfg: &Config) -> Box<dyn CongestionController> {
    let packet = cfg.mtu as u64;
    match cfg.cc {
        CcMode::Rate => Box::new(RateControl::new(cfg.rate_bps)),
        CcMode::Vegas => Box::new(Vegas::new(cfg.rate_bps, packet, cfg.vegas)),
    }
}

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

    fn window(&self) -> u64 {
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

    fn on_congestion(&mut self, _now: Instant) {
        self.current = (self.current * 7.0 / 8.0).max(self.cap as f64 / 16.0);
    }

    fn set_rate(&mut self, rate_bps: u64) {
        // The operator changed the link's rate: keep whatever fraction of the old one a
        // congestion response left us at, rather than climbing to a raised rate slowly.
        let fraction = self.current / self.cap.max(1) as f64;
        self.cap = rate_bps;
        self.current = (rate_bps as f64 * fraction).min(rate_bps as f64);
    }
}

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

    fn window(&self) -> u64 {
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

    fn on_congestion(&mut self, _now: Instant) {
        self.slow_start = false;
        self.cwnd = (self.cwnd * 0.75).max(VEGAS_MIN_PACKETS * self.packet as f64);
    }

    fn set_rate(&mut self, rate_bps: u64) {
        self.cap = rate_bps;
    }
}
