//! Link configuration: what each direction of the emulated link does.

use std::time::Duration;

use pep_sim::channel::Impairments;
use pep_sim::jitter::JitterConfig;
use pep_sim::schedule::Schedule;

/// The longest a UDP GSO burst may take to serialise and still cross whole (64 KiB at
/// 5.2 Gb/s and up).
pub const WHOLE_BURST_SERIALISATION: Duration = Duration::from_micros(100);

/// One direction of the link.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectionConfig {
    /// Serialisation rate in bit/s of IP bytes (TUN carries no link header); 0 means unlimited.
    pub rate_bps: f64,
    /// Drop-tail queue limit: bytes waiting for or in serialisation.
    pub queue_bytes: usize,
    /// One-way propagation delay.
    pub delay: Duration,
    /// How each packet's delay varies within `delay ± bound`, and whether packets may
    /// overtake each other (`pep_sim::jitter`, the simulator's model).
    pub jitter: JitterConfig,
    pub impairments: Impairments,
    /// Rate (bit/s) from each step on, counted from the emulator's start; `rate_bps` before
    /// the first (ACM steps).
    pub rate_schedule: Schedule,
    /// One-way delay (ms) from each step on; `delay` before the first (LEO path changes).
    pub delay_schedule: Schedule,
    /// Bytes the link layer adds to each packet (encapsulation such as GSE): they take
    /// serialisation time and can be corrupted like the rest.
    pub frame_overhead: usize,
}

impl Default for DirectionConfig {
    fn default() -> Self {
        DirectionConfig {
            rate_bps: 0.0,
            queue_bytes: 1 << 20,
            delay: Duration::ZERO,
            jitter: JitterConfig::default(),
            impairments: Impairments::default(),
            rate_schedule: Schedule::default(),
            delay_schedule: Schedule::default(),
            frame_overhead: 0,
        }
    }
}

impl DirectionConfig {
    /// The serialisation rate at `t` since the emulator started (0: unlimited).
    pub fn rate_at(&self, t: Duration) -> f64 {
        self.rate_schedule.at(t).unwrap_or(self.rate_bps)
    }

    pub fn delay_at(&self, t: Duration) -> Duration {
        self.delay_schedule
            .at(t)
            .map_or(self.delay, |ms| Duration::from_secs_f64(ms / 1e3))
    }

    /// Whether a UDP GSO burst may cross as one unit: the link does nothing to single
    /// datagrams (no loss or errors of any kind, no jitter, no per-frame overhead) and
    /// serialising the largest burst takes at most [`WHOLE_BURST_SERIALISATION`], so that
    /// delivering its datagrams together does not change their timing measurably.
    pub fn passes_bursts_whole(&self) -> bool {
        let imp = &self.impairments;
        let untouched = imp.ber == 0.0
            && imp.loss == 0.0
            && imp.burst.is_none()
            && imp.outages.windows.is_empty()
            && imp.outages.periodic.is_none()
            && imp.ber_schedule.is_empty()
            && self.jitter.bound.is_zero()
            && self.frame_overhead == 0;
        let largest_burst_bits = 65_536.0 * 8.0;
        let fast = self.rate_bps == 0.0
            || largest_burst_bits / self.rate_bps <= WHOLE_BURST_SERIALISATION.as_secs_f64();
        untouched && fast && self.rate_schedule.is_empty()
    }

    pub fn validate(&self) -> Result<(), crate::Error> {
        let bad = |what: &str| Err(crate::Error::Config(what.to_owned()));
        if !(self.rate_bps.is_finite() && self.rate_bps >= 0.0) {
            return bad("rate must be a non-negative number");
        }
        let imp = &self.impairments;
        if !(0.0..=1.0).contains(&imp.ber) || !(0.0..=1.0).contains(&imp.loss) {
            return bad("BER and loss must be in [0, 1]");
        }
        if self.queue_bytes < 1500 && self.rate_bps > 0.0 {
            return bad("queue must hold at least one 1500-byte packet");
        }
        Ok(())
    }
}

/// Both directions. `forward` carries packets from endpoint A to endpoint B.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkConfig {
    pub forward: DirectionConfig,
    pub ret: DirectionConfig,
    /// Seeds both directions' generators (they get distinct streams derived from it).
    pub seed: u64,
    /// Read and write the TUN devices packet by packet, without UDP segmentation offload: the
    /// sending kernel then cuts every UDP GSO burst before the emulator sees it (what the
    /// emulator did before it had the offload; for comparisons).
    pub per_packet: bool,
}

impl LinkConfig {
    /// Seed of one direction: distinct so the two directions do not lose the same packets.
    pub fn direction_seed(&self, forward: bool) -> u64 {
        if forward {
            self.seed
        } else {
            self.seed ^ 0x9e37_79b9_7f4a_7c15
        }
    }
}
