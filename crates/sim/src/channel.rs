//! Impairment models shared by the simulator and the TUN link emulator: what happens to one
//! packet on one direction of a satellite link. Keeping them in one place means `pep-sim` and
//! `pep-linkemu` lose packets the same way for the same settings and seed.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::schedule::Schedule;

/// Seeded generator: a fixed algorithm (not `StdRng`), so a seed means the same run on every
/// build and platform.
pub type SeededRng = Xoshiro256PlusPlus;

pub fn seeded_rng(seed: u64) -> SeededRng {
    SeededRng::seed_from_u64(seed)
}

/// Probability that a packet of `wire_bytes` bytes is hit by at least one bit error when bits
/// fail independently with probability `ber`.
pub fn corruption_probability(ber: f64, wire_bytes: usize) -> f64 {
    if ber <= 0.0 {
        return 0.0;
    }
    // (1-ber)^(8L) computed in log space so tiny BERs keep their precision.
    1.0 - ((8.0 * wire_bytes as f64) * (-ber).ln_1p()).exp()
}

/// Two-state Gilbert-Elliott burst model, advanced once per packet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GilbertElliott {
    /// P(good -> bad) per packet.
    pub p: f64,
    /// P(bad -> good) per packet.
    pub r: f64,
    /// P(packet survives | bad).
    pub h: f64,
    /// P(packet survives | good).
    pub k: f64,
}

impl GilbertElliott {
    /// Long-run mean packet loss rate: stationary state weights times per-state loss.
    pub fn mean_loss(&self) -> f64 {
        if self.p + self.r <= 0.0 {
            return 1.0 - self.k;
        }
        let bad = self.p / (self.p + self.r);
        bad * (1.0 - self.h) + (1.0 - bad) * (1.0 - self.k)
    }
}

impl FromStr for GilbertElliott {
    type Err = ParseError;

    /// `p,r[,h[,k]]`; h defaults to 0 (everything lost in bad), k to 1 (nothing lost in good).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<f64> = s
            .split(',')
            .map(|v| v.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| ParseError::new("--ge", s, "expected p,r[,h[,k]] as numbers"))?;
        let (p, r, h, k) = match parts.as_slice() {
            [p, r] => (*p, *r, 0.0, 1.0),
            [p, r, h] => (*p, *r, *h, 1.0),
            [p, r, h, k] => (*p, *r, *h, *k),
            _ => return Err(ParseError::new("--ge", s, "expected p,r[,h[,k]]")),
        };
        for v in [p, r, h, k] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ParseError::new("--ge", s, "each value must be in [0, 1]"));
            }
        }
        Ok(GilbertElliott { p, r, h, k })
    }
}

/// One window in which the link passes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    pub start: Duration,
    pub duration: Duration,
}

impl Outage {
    pub fn contains(&self, t: Duration) -> bool {
        t >= self.start && t < self.start + self.duration
    }
}

impl FromStr for Outage {
    type Err = ParseError;

    /// `START_S+DURATION_S`, seconds as decimals, e.g. `70+60` or `1.5+0.1`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (start, duration) = s
            .split_once('+')
            .ok_or_else(|| ParseError::new("--outage", s, "expected START_S+DURATION_S"))?;
        let secs = |v: &str| -> Result<Duration, ParseError> {
            let f: f64 = v
                .trim()
                .parse()
                .map_err(|_| ParseError::new("--outage", s, "seconds must be numbers"))?;
            Duration::try_from_secs_f64(f)
                .map_err(|_| ParseError::new("--outage", s, "seconds must be non-negative"))
        };
        Ok(Outage {
            start: secs(start)?,
            duration: secs(duration)?,
        })
    }
}

/// Outage windows: explicit ones plus an optional periodic one (LEO handovers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutageSchedule {
    pub windows: Vec<Outage>,
    /// Every `period`, the link is down for `duration`, starting at `period` (not at zero).
    pub periodic: Option<PeriodicOutage>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeriodicOutage {
    pub period: Duration,
    pub duration: Duration,
}

impl FromStr for PeriodicOutage {
    type Err = ParseError;

    /// `PERIOD_S+DURATION_S`: down for DURATION every PERIOD, the first time at PERIOD.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const OPT: &str = "--outage-every";
        let o: Outage = s
            .parse()
            .map_err(|_| ParseError::new(OPT, s, "expected PERIOD_S+DURATION_S"))?;
        if o.start.is_zero() {
            return Err(ParseError::new(OPT, s, "period must be positive"));
        }
        if o.duration >= o.start {
            return Err(ParseError::new(
                OPT,
                s,
                "duration must be shorter than the period",
            ));
        }
        Ok(PeriodicOutage {
            period: o.start,
            duration: o.duration,
        })
    }
}

impl OutageSchedule {
    pub fn is_down(&self, t: Duration) -> bool {
        if self.windows.iter().any(|w| w.contains(t)) {
            return true;
        }
        match self.periodic {
            Some(p) if !p.period.is_zero() && t >= p.period => {
                let phase = t.as_nanos() % p.period.as_nanos();
                phase < p.duration.as_nanos()
            }
            _ => false,
        }
    }
}

/// Everything that can happen to a packet on one direction of the link, apart from queueing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Impairments {
    /// Independent bit error rate, applied per packet by its full on-wire length.
    pub ber: f64,
    /// Independent (Bernoulli) packet loss probability.
    pub loss: f64,
    pub burst: Option<GilbertElliott>,
    pub outages: OutageSchedule,
    /// Replaces `ber` from each of its steps on (weather that comes and goes).
    pub ber_schedule: Schedule,
}

impl Impairments {
    /// The bit error rate in force at `t`.
    pub fn ber_at(&self, t: Duration) -> f64 {
        self.ber_schedule.at(t).unwrap_or(self.ber)
    }
}

/// What the channel did to a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    Delivered,
    /// At least one bit flipped: a real receiver's checksum drops it.
    Corrupted,
    /// Bernoulli loss.
    Lost,
    /// Lost in a Gilbert-Elliott burst.
    BurstLost,
    /// Sent while the link was down.
    Outage,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Delivered => "delivered",
            Fate::Corrupted => "corrupted",
            Fate::Lost => "lost",
            Fate::BurstLost => "burst_lost",
            Fate::Outage => "outage",
        }
    }
}

/// One direction's impairment process with its own seeded generator.
pub struct Channel {
    imp: Impairments,
    rng: SeededRng,
    in_bad_state: bool,
}

impl Channel {
    pub fn new(imp: Impairments, seed: u64) -> Self {
        Channel {
            imp,
            rng: seeded_rng(seed),
            in_bad_state: false,
        }
    }

    pub fn impairments(&self) -> &Impairments {
        &self.imp
    }

    /// Decides the fate of a packet of `wire_bytes` bytes crossing the link at `t` (time since the
    /// link started). Draws from the generator in a fixed order so runs are reproducible.
    pub fn judge(&mut self, t: Duration, wire_bytes: usize) -> Fate {
        if self.imp.outages.is_down(t) {
            return Fate::Outage;
        }
        if let Some(ge) = self.imp.burst {
            let flip = if self.in_bad_state { ge.r } else { ge.p };
            if self.rng.random::<f64>() < flip {
                self.in_bad_state = !self.in_bad_state;
            }
            let survive = if self.in_bad_state { ge.h } else { ge.k };
            if self.rng.random::<f64>() >= survive {
                return Fate::BurstLost;
            }
        }
        if self.imp.loss > 0.0 && self.rng.random::<f64>() < self.imp.loss {
            return Fate::Lost;
        }
        let p_corrupt = corruption_probability(self.imp.ber_at(t), wire_bytes);
        if p_corrupt > 0.0 && self.rng.random::<f64>() < p_corrupt {
            return Fate::Corrupted;
        }
        Fate::Delivered
    }
}

/// A command-line or profile value that does not parse; names the option and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    option: &'static str,
    value: String,
    why: &'static str,
}

impl ParseError {
    pub(crate) fn new(option: &'static str, value: &str, why: &'static str) -> Self {
        ParseError {
            option,
            value: value.to_owned(),
            why,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}: {}", self.option, self.value, self.why)
    }
}

impl std::error::Error for ParseError {}

/// Reference goodput used by every pepd benchmark: what an ideal TCP with 1500-byte packets
/// carries over a link of `rate_bps` at `ber`.
pub fn reference_goodput_bps(rate_bps: f64, ber: f64) -> f64 {
    rate_bps * (1.0 - corruption_probability(ber, 1500)) * 1460.0 / 1500.0
}

/// Jain's fairness index of per-flow throughputs: 1.0 is perfectly fair.
pub fn jain_fairness(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sum_sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sum_sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sum_sq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ber_probability_matches_the_digest() {
        // 1500-byte packet at 1e-5 is lost 11.3 % of the time, 500-byte 3.9 %.
        assert!((corruption_probability(1e-5, 1500) - 0.1131).abs() < 1e-3);
        assert!((corruption_probability(1e-5, 500) - 0.0392).abs() < 1e-3);
        assert_eq!(corruption_probability(0.0, 1500), 0.0);
    }

    #[test]
    fn reference_goodput_matches_the_digest() {
        let r = |ber| reference_goodput_bps(1_544_000.0, ber) / 1e6;
        assert!((r(1e-8) - 1.503).abs() < 1e-3);
        assert!((r(1e-6) - 1.485).abs() < 1e-3);
        assert!((r(1e-5) - 1.333).abs() < 1e-3);
    }

    #[test]
    fn ber_channel_loses_the_expected_fraction() {
        let mut ch = Channel::new(
            Impairments {
                ber: 1e-6,
                ..Default::default()
            },
            7,
        );
        let n = 200_000;
        let lost = (0..n)
            .filter(|_| ch.judge(Duration::ZERO, 1500) != Fate::Delivered)
            .count();
        let p = corruption_probability(1e-6, 1500);
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            ((lost as f64) - n as f64 * p).abs() < 4.0 * sd,
            "lost {lost}"
        );
    }

    #[test]
    fn gilbert_elliott_meets_its_analytic_mean() {
        let ge: GilbertElliott = "0.01,0.2,0.1,0.999".parse().unwrap();
        let mut ch = Channel::new(
            Impairments {
                burst: Some(ge),
                ..Default::default()
            },
            11,
        );
        let n = 400_000;
        let lost = (0..n)
            .filter(|_| ch.judge(Duration::ZERO, 100) == Fate::BurstLost)
            .count();
        let measured = lost as f64 / n as f64;
        assert!(
            (measured - ge.mean_loss()).abs() < 0.1 * ge.mean_loss(),
            "{measured}"
        );
    }

    #[test]
    fn outage_windows_drop_everything_inside_only() {
        let sched = OutageSchedule {
            windows: vec!["10+5".parse().unwrap()],
            periodic: Some(PeriodicOutage {
                period: Duration::from_secs(15),
                duration: Duration::from_millis(100),
            }),
        };
        assert!(!sched.is_down(Duration::from_secs_f64(9.99)));
        assert!(sched.is_down(Duration::from_secs(10)));
        assert!(sched.is_down(Duration::from_secs_f64(14.99)));
        assert!(sched.is_down(Duration::from_secs_f64(15.05)));
        assert!(!sched.is_down(Duration::from_secs_f64(15.2)));
        assert!(sched.is_down(Duration::from_secs_f64(30.01)));
        assert!(!sched.is_down(Duration::from_secs_f64(0.05)));
    }

    #[test]
    fn periodic_outage_parses_and_rejects_nonsense() {
        let p: PeriodicOutage = "15+0.1".parse().unwrap();
        assert_eq!(p.period, Duration::from_secs(15));
        assert_eq!(p.duration, Duration::from_millis(100));
        for bad in ["0+1", "1+2", "x"] {
            let e = bad.parse::<PeriodicOutage>().unwrap_err().to_string();
            assert!(e.contains("--outage-every"), "{e}");
        }
    }

    #[test]
    fn parse_errors_name_the_option() {
        let e = "abc".parse::<Outage>().unwrap_err().to_string();
        assert!(e.contains("--outage"), "{e}");
        let e = "0.5".parse::<GilbertElliott>().unwrap_err().to_string();
        assert!(e.contains("--ge"), "{e}");
    }

    #[test]
    fn same_seed_same_fates() {
        let imp = Impairments {
            ber: 1e-5,
            loss: 0.01,
            ..Default::default()
        };
        let mut a = Channel::new(imp.clone(), 3);
        let mut b = Channel::new(imp, 3);
        for i in 0..10_000 {
            let t = Duration::from_millis(i);
            assert_eq!(a.judge(t, 1200), b.judge(t, 1200));
        }
    }

    #[test]
    fn jain_index() {
        assert!((jain_fairness(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_fairness(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
    }
}
