//! Piecewise-constant schedules of a link setting over time, shared by the simulator and the
//! emulator: ACM steps of the rate (`0:20M,30:10M,60:5M,90:20M`), LEO delay steps, a BER that
//! changes with the weather.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::channel::ParseError;

/// Values from given times on: `steps` sorted by time. Before the first step the link's
/// configured value holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    steps: Vec<(Duration, f64)>,
}

impl Schedule {
    pub fn new(mut steps: Vec<(Duration, f64)>) -> Self {
        steps.sort_by_key(|s| s.0);
        Schedule { steps }
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The value at `t`, or `None` before the first step.
    pub fn at(&self, t: Duration) -> Option<f64> {
        let i = self.steps.partition_point(|s| s.0 <= t);
        i.checked_sub(1).map(|i| self.steps[i].1)
    }

    pub fn steps(&self) -> &[(Duration, f64)] {
        &self.steps
    }

    /// The same schedule `by` later (times count from the start of a transfer, the link's
    /// clock from before its handshake).
    pub fn shifted(&self, by: Duration) -> Schedule {
        Schedule {
            steps: self.steps.iter().map(|&(t, v)| (t + by, v)).collect(),
        }
    }

    /// `T:V[,T:V…]`: seconds (decimals allowed) and a value with an optional k, M or G
    /// suffix (×1e3, ×1e6, ×1e9). `option` names the option in errors.
    pub fn parse(option: &'static str, s: &str) -> Result<Schedule, ParseError> {
        let mut steps = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (t, v) = part
                .split_once(':')
                .ok_or_else(|| ParseError::new(option, s, "expected SECONDS:VALUE[,…]"))?;
            let secs: f64 = t
                .trim()
                .parse()
                .map_err(|_| ParseError::new(option, s, "times must be seconds"))?;
            let at = Duration::try_from_secs_f64(secs)
                .map_err(|_| ParseError::new(option, s, "times must be non-negative"))?;
            let value = parse_si(v.trim())
                .ok_or_else(|| ParseError::new(option, s, "values must be numbers (k/M/G ok)"))?;
            if !(value.is_finite() && value >= 0.0) {
                return Err(ParseError::new(option, s, "values must be non-negative"));
            }
            steps.push((at, value));
        }
        if steps.is_empty() {
            return Err(ParseError::new(option, s, "expected SECONDS:VALUE[,…]"));
        }
        Ok(Schedule::new(steps))
    }
}

/// `20M` → 2e7; `1.5k` → 1500; `1e-6` → 1e-6.
pub fn parse_si(s: &str) -> Option<f64> {
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .steps
            .iter()
            .map(|(t, v)| format!("{}:{v}", t.as_secs_f64()))
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// A rate schedule (`--rate-schedule`), values in bit/s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateSchedule(pub Schedule);

impl FromStr for RateSchedule {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Schedule::parse("--rate-schedule", s).map(RateSchedule)
    }
}

/// A delay schedule (`--delay-schedule`), values in milliseconds one way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DelaySchedule(pub Schedule);

impl FromStr for DelaySchedule {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Schedule::parse("--delay-schedule", s).map(DelaySchedule)
    }
}

/// A bit-error-rate schedule (`--ber-schedule`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BerSchedule(pub Schedule);

impl FromStr for BerSchedule {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sched = Schedule::parse("--ber-schedule", s)?;
        if sched.steps().iter().any(|&(_, v)| v >= 1.0) {
            return Err(ParseError::new(
                "--ber-schedule",
                s,
                "a BER must be below 1",
            ));
        }
        Ok(BerSchedule(sched))
    }
}

/// LEO-like delay steps: from `start`, every `period` the one-way delay moves to the next of
/// `delays_ms` (cycling), until `until`.
pub fn cycling_delays(period: Duration, delays_ms: &[f64], until: Duration) -> Schedule {
    let mut steps = Vec::new();
    let mut t = Duration::ZERO;
    let mut i = 0;
    while t <= until && !delays_ms.is_empty() {
        steps.push((t, delays_ms[i % delays_ms.len()]));
        i += 1;
        t += period;
    }
    Schedule::new(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_si_values_and_finds_the_step_in_force() {
        let s: RateSchedule = "0:20M,30:10M, 60:5M,90:20e6".parse().unwrap();
        let s = s.0;
        assert_eq!(s.at(Duration::ZERO), Some(20e6));
        assert_eq!(s.at(Duration::from_secs_f64(29.9)), Some(20e6));
        assert_eq!(s.at(Duration::from_secs(30)), Some(10e6));
        assert_eq!(s.at(Duration::from_secs(75)), Some(5e6));
        assert_eq!(s.at(Duration::from_secs(500)), Some(20e6));
        let late = Schedule::parse("--x", "10:1k").unwrap();
        assert_eq!(late.at(Duration::from_secs(9)), None);
        assert_eq!(late.at(Duration::from_secs(10)), Some(1000.0));
        assert_eq!(
            late.shifted(Duration::from_secs(1))
                .at(Duration::from_secs(10)),
            None
        );
    }

    #[test]
    fn bad_schedules_name_the_option() {
        for bad in ["", "x", "1:abc", "-1:5", "1:-5"] {
            let e = bad.parse::<RateSchedule>().unwrap_err().to_string();
            assert!(e.starts_with("--rate-schedule"), "{e}");
        }
        let e = "0:1".parse::<BerSchedule>().unwrap_err().to_string();
        assert!(e.contains("below 1"), "{e}");
    }

    #[test]
    fn cycling_delays_step_every_period() {
        let s = cycling_delays(
            Duration::from_secs(15),
            &[20.0, 35.0],
            Duration::from_secs(40),
        );
        assert_eq!(
            s.steps(),
            [
                (Duration::ZERO, 20.0),
                (Duration::from_secs(15), 35.0),
                (Duration::from_secs(30), 20.0)
            ]
        );
    }
}
