//! Congestion control: how much may be in flight and how fast to pace it. Behind a small
//! trait so modes can be added; the loss *cause* is decided elsewhere (`loss`), and only
//! losses attributed to congestion reach `on_congestion`, once per loss epoch.

mod adaptive;
mod delivery;
mod evidence;
mod jitter;
mod rate;
mod vegas;

use std::fmt;
use std::time::{Duration, Instant};

use crate::config::{CcMode, Config};
use crate::rtt::RttEstimator;

pub use adaptive::Adaptive;
pub use rate::RateControl;
pub use vegas::Vegas;

/// One newly acknowledged ack-eliciting packet.
#[derive(Debug, Clone, Copy)]
pub struct AckedPacket {
    pub pn: u64,
    pub bytes: u64,
    /// Path RTT sample if this packet was the largest acknowledged by the ACK.
    pub rtt_sample: Option<Duration>,
    /// Next packet number the sender will use (ends Vegas rounds).
    pub next_pn: u64,
    /// When it was sent.
    pub sent_at: Instant,
    /// Sent after the sender had fallen behind its pacing schedule (nothing to send, or
    /// held by a window): how fast it was delivered says nothing about the path's capacity.
    pub app_limited: bool,
}

/// A packet that just left.
#[derive(Debug, Clone, Copy)]
pub struct SentInfo {
    pub pn: u64,
    pub wire_bytes: u64,
    /// It will be acknowledged (it carries more than ACKs).
    pub ack_eliciting: bool,
    /// The pacer's schedule had slipped before it (see `Pacer::on_sent`).
    pub app_limited: bool,
    /// Where it had: how long the schedule went unused before it.
    pub gap: Duration,
}

/// The state after one ACK was processed, its losses included.
#[derive(Debug, Clone, Copy)]
pub struct AckSummary {
    /// Largest packet number this side knows the peer received.
    pub largest_acked: u64,
    /// How long the peer held this ACK back after receiving its largest packet.
    pub ack_delay: Duration,
    /// When the ACK would have arrived had it crossed the return path at its least delay
    /// (the peer's timestamps tell): the time its deliveries are measured at. `now` where the
    /// peer sends no timestamps.
    pub arrived: Instant,
}

/// What a controller knows of the path's capacity, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CapacityStats {
    /// Bottleneck rate the controller believes in (on-wire bit/s); the configured rate in
    /// modes that trust it.
    pub estimate_bps: u64,
    /// Queueing delay the controller last saw (standing RTT above the path minimum).
    pub queue_delay: Duration,
    /// How far the path's own jitter lifts the least RTT of one evidence span (zero on a path
    /// that does not jitter): what the controller allows for before it takes a delay for a
    /// queue.
    pub jitter: Duration,
    /// Time spent sending at a pace set by the estimate below the configured ceiling.
    pub limited_by_estimate: Duration,
    /// Time spent sending at the configured ceiling.
    pub limited_by_ceiling: Duration,
    /// Standing queues answered by a drain.
    pub drains: u64,
    /// Drains after which the delay stayed while everything sent was delivered: the queue
    /// was not ours (a longer path, or jitter), and the drain cost sending time for nothing.
    pub needless_drains: u64,
    /// Short sends above the estimate to look for more capacity.
    pub probes: u64,
    /// Times a delay that draining did not remove was taken for a longer path.
    pub rebases: u64,
    /// Times a queue that drains could not empty was taken for another sender's, whose
    /// buffer-filling only congestion losses answer.
    pub competes: u64,
}

pub trait CongestionController: Send + fmt::Debug {
    fn name(&self) -> &'static str;
    /// Bytes allowed in flight.
    fn window(&self, rtt: &RttEstimator) -> u64;
    /// Pacing rate in on-wire bits per second.
    fn pacing_rate(&self, rtt: &RttEstimator) -> u64;
    /// A packet (any: data, ACK or control) left under the pacer.
    fn on_sent(&mut self, _now: Instant, _sent: SentInfo, _rtt: &RttEstimator) {}
    /// The association restarted: packet numbers start again from 0. What was learnt
    /// about the path may stay; what belongs to the old packet numbers may not.
    fn on_restart(&mut self) {}
    /// A pause the pacer should take before the next packet (after a probe above the
    /// estimate).
    fn take_pause(&mut self) -> Option<Duration> {
        None
    }
    fn on_ack(&mut self, now: Instant, acked: AckedPacket, rtt: &RttEstimator);
    /// Once per ACK, after `on_ack` for each packet it acknowledged and after the losses
    /// it revealed were declared.
    fn on_ack_done(&mut self, _now: Instant, _summary: AckSummary, _rtt: &RttEstimator) {}
    /// The association was (re-)established: a good moment to measure the path.
    fn on_established(&mut self, _now: Instant) {}
    /// Whether the controller wants a packet sent now even with nothing to say: a padded
    /// PING, full size, for a measurement.
    fn wants_padding(&self) -> bool {
        false
    }
    /// A packet lost to corruption: it crossed the bottleneck and used its capacity.
    fn on_corruption_loss(&mut self, _wire_bytes: u64) {}
    /// Losses attributed to congestion: the caller guarantees at most once per loss epoch.
    /// `lost_pn`: the packet whose loss began the epoch.
    fn on_congestion(&mut self, now: Instant, lost_pn: u64, rtt: &RttEstimator);
    /// Changes the configured rate (cap) live.
    fn set_rate(&mut self, rate_bps: u64);
    /// Lowers or raises the cap without treating it as a new link: a hub's carrier share,
    /// which moves every few hundred milliseconds as other terminals come and go. A
    /// controller that keeps no path state of its own takes it as a new rate.
    fn set_ceiling(&mut self, rate_bps: u64) {
        self.set_rate(rate_bps);
    }
    fn capacity(&self, rtt: &RttEstimator) -> CapacityStats;
}

pub fn new_controller(cfg: &Config) -> Box<dyn CongestionController> {
    let packet = cfg.mtu as u64;
    match cfg.cc {
        CcMode::Rate => Box::new(RateControl::new(cfg.rate_bps)),
        CcMode::Vegas => Box::new(Vegas::new(cfg.rate_bps, packet, cfg.vegas)),
        CcMode::Adaptive => Box::new(Adaptive::new(cfg)),
    }
}
