//! Delay jitter of one direction of a link, shared by the simulator and the TUN link emulator
//! so that `--jitter-ms` means the same in both. Every kind keeps a packet's one-way delay
//! within `delay ± bound` (never below the packet's own serialisation end) and averages about
//! `delay`; they differ in how the delay moves from one packet to the next:
//!
//! - [`JitterKind::Uniform`]: each packet draws its own offset, uniformly in `±bound`, with
//!   no memory. Without reordering a packet is never delivered before the one ahead of it,
//!   so at thousands of packets per second the delay tends to `delay + bound` (the largest
//!   draw of the packets ahead) and packets leave in bunches when a low draw follows a high
//!   one: a gateway's or a modem's scheduler that holds traffic for varying times. With
//!   reordering each packet keeps its own draw and later packets overtake earlier ones.
//! - [`JitterKind::Wander`]: the delay follows a smooth curve of time, the sum of three slow
//!   sinusoids with seeded phases, within `±bound`: a LEO path whose length changes as the
//!   satellites move. Every packet sent at one instant sees the same delay, so nothing is
//!   reordered and nothing bunches; the delay rises and falls over seconds.
//! - [`JitterKind::Slotted`]: packets leave only at slot boundaries, one frame of
//!   `2 × bound` apart (at a seeded phase): an MF-TDMA return link (DVB-RCS2), where a
//!   terminal transmits in the slots it was granted each frame. A packet due at
//!   `delay − bound` waits for the next boundary, so its delay lies in
//!   `[delay − bound, delay + bound)`, and everything that came due within one frame
//!   arrives together.
//!
//! Packets that arrive together (a frame, a bunch) carry one arrival time, and the simulator
//! hands them to the endpoint as one batch, as the daemon reads its socket: one ACK then
//! covers them, on the testbed and in the simulator alike.
//!
//! The draws come from a generator of their own, so the loss pattern of a seed does not
//! depend on the jitter settings.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

use crate::channel::{seeded_rng, ParseError, SeededRng};

/// How the delay varies; see the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JitterKind {
    #[default]
    Uniform,
    Wander,
    Slotted,
}

impl JitterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JitterKind::Uniform => "uniform",
            JitterKind::Wander => "wander",
            JitterKind::Slotted => "slotted",
        }
    }
}

impl fmt::Display for JitterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JitterKind {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "uniform" => Ok(JitterKind::Uniform),
            "wander" => Ok(JitterKind::Wander),
            "slotted" => Ok(JitterKind::Slotted),
            _ => Err(ParseError::new(
                "--jitter-kind",
                s,
                "expected uniform, wander or slotted",
            )),
        }
    }
}

/// The jitter of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JitterConfig {
    pub kind: JitterKind,
    /// The most a packet's delay differs from the configured delay (`--jitter-ms`).
    pub bound: Duration,
    /// Packets may overtake each other. Only the uniform kind draws delays that would
    /// reorder; without this, a packet never arrives before the one ahead of it.
    pub reorder: bool,
}

/// Periods of the wander's sinusoids: shorter than the 15 s between LEO handovers, so the
/// path moves within every segment; not multiples of each other, so the curve does not repeat
/// within a run. With `bound` = 30 ms the delay changes by at most 3.8 % of elapsed time
/// (each sinusoid has a third of the bound).
const WANDER_PERIODS: [Duration; 3] = [
    Duration::from_millis(2_700),
    Duration::from_millis(6_100),
    Duration::from_millis(13_900),
];

/// Added to the link's seed for the jitter's own generator.
const JITTER_SEED: u64 = 0x6a09_e667_f3bc_c908;

/// One direction's jitter process.
#[derive(Debug)]
pub struct Jitter {
    cfg: JitterConfig,
    rng: SeededRng,
    /// Phases (radians) of the wander's sinusoids.
    phases: [f64; 3],
    /// Where the slot boundaries fall within a frame.
    slot_phase: Duration,
    /// The latest arrival handed out.
    last_arrival: Duration,
}

impl Jitter {
    /// `seed`: the direction's seed (the generator of the jitter is derived from it).
    pub fn new(cfg: JitterConfig, seed: u64) -> Self {
        let mut rng = seeded_rng(seed.wrapping_add(JITTER_SEED));
        let (mut phases, mut slot_phase) = ([0.0; 3], Duration::ZERO);
        // Only the kinds that need them draw at set-up: the uniform kind's per-packet draws
        // then follow each other from the generator's start.
        match cfg.kind {
            JitterKind::Uniform => {}
            JitterKind::Wander => {
                for p in &mut phases {
                    *p = rng.random_range(0.0..std::f64::consts::TAU);
                }
            }
            JitterKind::Slotted => {
                let frame = Self::frame(cfg.bound).as_nanos() as u64;
                if frame > 0 {
                    slot_phase = Duration::from_nanos(rng.random_range(0..frame));
                }
            }
        }
        Jitter {
            cfg,
            rng,
            phases,
            slot_phase,
            last_arrival: Duration::ZERO,
        }
    }

    pub fn config(&self) -> &JitterConfig {
        &self.cfg
    }

    /// The slotted kind's frame: twice the bound, so the wait for a slot spans the bound's
    /// whole `±` range.
    fn frame(bound: Duration) -> Duration {
        bound * 2
    }

    /// The wander's offset (seconds, within `±bound`) at `t`.
    fn wander(&self, t: Duration) -> f64 {
        let j = self.cfg.bound.as_secs_f64();
        let t = t.as_secs_f64();
        let sum: f64 = WANDER_PERIODS
            .iter()
            .zip(self.phases)
            .map(|(p, phase)| (std::f64::consts::TAU * t / p.as_secs_f64() + phase).sin())
            .sum();
        j * sum / WANDER_PERIODS.len() as f64
    }

    /// When a packet that finished serialisation at `depart` arrives at the far end, with the
    /// path's delay at that time `delay` (all times since the link started).
    pub fn arrival(&mut self, depart: Duration, delay: Duration) -> Duration {
        let mut at = depart + delay;
        let bound = self.cfg.bound;
        if !bound.is_zero() {
            at = match self.cfg.kind {
                JitterKind::Uniform => {
                    let j = bound.as_secs_f64();
                    let offset = self.rng.random_range(-j..=j);
                    let secs = (at.as_secs_f64() + offset).max(depart.as_secs_f64());
                    Duration::from_secs_f64(secs)
                }
                JitterKind::Wander => {
                    let secs = (at.as_secs_f64() + self.wander(depart)).max(depart.as_secs_f64());
                    Duration::from_secs_f64(secs)
                }
                JitterKind::Slotted => {
                    let due = at.saturating_sub(bound).max(depart);
                    let frame = Self::frame(bound).as_nanos();
                    let phase = self.slot_phase.as_nanos();
                    let due_ns = due.as_nanos();
                    // The first boundary `phase + k × frame` at or after `due`.
                    let slots = (due_ns + frame - phase % frame).div_ceil(frame);
                    let slot = slots * frame + phase % frame - frame;
                    Duration::from_nanos(u64::try_from(slot).unwrap_or(u64::MAX))
                }
            };
        }
        if !self.cfg.reorder {
            at = at.max(self.last_arrival);
        }
        self.last_arrival = self.last_arrival.max(at);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn jitter(kind: JitterKind, bound: Duration, reorder: bool) -> Jitter {
        Jitter::new(
            JitterConfig {
                kind,
                bound,
                reorder,
            },
            7,
        )
    }

    /// Delays of packets departing every `gap` for `n` packets, and how many arrived before
    /// one sent earlier.
    fn run(j: &mut Jitter, gap: Duration, n: u32, delay: Duration) -> (Vec<Duration>, u32) {
        let mut delays = Vec::new();
        let mut overtaken = 0;
        let mut latest = Duration::ZERO;
        for i in 0..n {
            let depart = gap * i;
            let at = j.arrival(depart, delay);
            if at < latest {
                overtaken += 1;
            }
            latest = latest.max(at);
            delays.push(at - depart);
        }
        (delays, overtaken)
    }

    #[test]
    fn without_a_bound_the_delay_is_the_paths() {
        for kind in [JitterKind::Uniform, JitterKind::Wander, JitterKind::Slotted] {
            let mut j = jitter(kind, Duration::ZERO, false);
            assert_eq!(j.arrival(ms(5), ms(300)), ms(305));
            // A shorter delay later never lets a packet overtake.
            assert_eq!(j.arrival(ms(6), ms(100)), ms(305));
        }
    }

    #[test]
    fn every_kind_stays_within_the_bound_and_averages_the_delay() {
        let delay = ms(300);
        for kind in [JitterKind::Uniform, JitterKind::Wander, JitterKind::Slotted] {
            // Sparse packets (one every 37 ms) so in-order delivery seldom holds one back.
            let mut j = jitter(kind, ms(20), true);
            let (d, _) = run(&mut j, ms(37), 2_000, delay);
            let lo = d.iter().min().copied().unwrap_or_default();
            let hi = d.iter().max().copied().unwrap_or_default();
            let mean = d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len() as f64;
            assert!(lo >= ms(280) && hi <= ms(320), "{kind}: {lo:?}..{hi:?}");
            // Each kind uses most of its range.
            assert!(lo <= ms(284) && hi >= ms(316), "{kind}: {lo:?}..{hi:?}");
            assert!((mean - 0.300).abs() < 0.003, "{kind}: mean {mean}");
        }
    }

    #[test]
    fn uniform_in_order_tends_to_the_top_of_the_bound_at_high_rates() {
        let mut j = jitter(JitterKind::Uniform, ms(20), false);
        let (d, overtaken) = run(&mut j, Duration::from_micros(500), 20_000, ms(300));
        assert_eq!(overtaken, 0);
        // Each packet waits for the largest draw among those sent just before it: the mean
        // is three quarters of the way up the bound, and hardly any packet sees less than
        // the path's own delay.
        let mean = d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len() as f64;
        assert!(mean > 0.312, "{mean}");
        let below = d.iter().filter(|&&x| x < ms(300)).count();
        assert!(below < 100, "{below}");
        let mut j = jitter(JitterKind::Uniform, ms(20), true);
        let (_, overtaken) = run(&mut j, Duration::from_micros(500), 20_000, ms(300));
        assert!(overtaken > 5_000, "{overtaken}");
    }

    #[test]
    fn wander_moves_smoothly_and_never_reorders() {
        let mut j = jitter(JitterKind::Wander, ms(30), true);
        let (d, overtaken) = run(&mut j, ms(1), 60_000, ms(300));
        assert_eq!(overtaken, 0);
        // From one millisecond to the next the delay changes by at most the curve's slope.
        let steepest = d
            .windows(2)
            .map(|w| w[0].abs_diff(w[1]))
            .max()
            .unwrap_or_default();
        assert!(steepest <= Duration::from_micros(40), "{steepest:?}");
    }

    #[test]
    fn slotted_packets_arrive_on_the_frame_boundaries() {
        let mut j = jitter(JitterKind::Slotted, ms(20), false);
        let frame = ms(40).as_nanos();
        let phase = j.slot_phase.as_nanos();
        let mut arrivals = Vec::new();
        for i in 0..4_000u32 {
            let depart = Duration::from_micros(250) * i;
            let at = j.arrival(depart, ms(300));
            assert_eq!((at.as_nanos() + frame - phase) % frame, 0, "{at:?}");
            arrivals.push(at);
        }
        arrivals.dedup();
        // One second of packets arrives in 25 bunches, one per frame.
        assert!((25..=26).contains(&arrivals.len()), "{}", arrivals.len());
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        for kind in [JitterKind::Uniform, JitterKind::Wander, JitterKind::Slotted] {
            let (a, _) = run(&mut jitter(kind, ms(10), true), ms(3), 1_000, ms(50));
            let (b, _) = run(&mut jitter(kind, ms(10), true), ms(3), 1_000, ms(50));
            assert_eq!(a, b);
        }
    }

    #[test]
    fn kinds_parse_by_name() {
        assert_eq!("wander".parse::<JitterKind>(), Ok(JitterKind::Wander));
        let e = "tdma".parse::<JitterKind>().unwrap_err().to_string();
        assert!(e.contains("--jitter-kind"), "{e}");
    }
}
