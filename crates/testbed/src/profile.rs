//! Named link profiles. Forward is gw-b → gw-a (towards the client, the satellite terminal);
//! return is gw-a → gw-b.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use pep_linkemu::{DirectionConfig, LinkConfig};
use pep_sim::channel::Outage;
use pep_sim::schedule::Schedule;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// 1.544 Mb/s both ways, 285 ms one-way (literature/000).
    Lawson,
    /// 100 Mb/s both ways, 250 ms one-way (literature/002).
    Nasa,
    /// Consumer GEO: 20 Mb/s forward, 2 Mb/s return, 300 ms one-way.
    Geo,
    /// 2048 kb/s forward, 256 kb/s return, 260 ms one-way (literature/001).
    Adalr,
    /// 100/20 Mb/s, 20–40 ms one-way stepping every 15 s (a new satellite), 5 ms of uniform jitter, a
    /// 100–200 ms outage at each step.
    Leo,
}

/// Smallest queue a profile gets, so a slow link still holds a burst of full-size packets.
const MIN_QUEUE_BYTES: usize = 32 * 1500;

fn direction(rate_bps: f64, delay_ms: u64, rtt: Duration) -> DirectionConfig {
    // Drop-tail buffer of one bandwidth-delay product (the classic sizing rule).
    let bdp = (rate_bps / 8.0 * rtt.as_secs_f64()) as usize;
    DirectionConfig {
        rate_bps,
        queue_bytes: bdp.max(MIN_QUEUE_BYTES),
        delay: Duration::from_millis(delay_ms),
        ..Default::default()
    }
}

impl Profile {
    pub fn link(self) -> LinkConfig {
        let (fwd, ret, delay_ms) = match self {
            Profile::Lawson => (1_544_000.0, 1_544_000.0, 285),
            Profile::Nasa => (100e6, 100e6, 250),
            Profile::Geo => (20e6, 2e6, 300),
            Profile::Adalr => (2_048_000.0, 256_000.0, 260),
            Profile::Leo => (100e6, 20e6, 20),
        };
        let rtt = Duration::from_millis(2 * delay_ms);
        let mut link = LinkConfig {
            forward: direction(fwd, delay_ms, rtt),
            ret: direction(ret, delay_ms, rtt),
            seed: 1,
            ..Default::default()
        };
        if self == Profile::Leo {
            let (delays, outages) = leo_handovers();
            for d in [&mut link.forward, &mut link.ret] {
                d.jitter.bound = Duration::from_millis(5);
                d.delay_schedule = delays.clone();
                d.impairments.outages.windows = outages.clone();
            }
        }
        link
    }
}

/// Seconds between LEO handovers, and how many the profile lays out (an hour's worth).
const LEO_PERIOD_S: u64 = 15;
const LEO_HANDOVERS: u64 = 240;
/// One-way delays (ms) the path cycles through, one per satellite.
const LEO_DELAYS_MS: [f64; 4] = [20.0, 32.0, 25.0, 40.0];

/// The LEO path's delay steps and the outage at each: 100, 150 or 200 ms in turn.
fn leo_handovers() -> (Schedule, Vec<Outage>) {
    let mut steps = Vec::new();
    let mut outages = Vec::new();
    for k in 0..=LEO_HANDOVERS {
        let at = Duration::from_secs(k * LEO_PERIOD_S);
        steps.push((at, LEO_DELAYS_MS[k as usize % LEO_DELAYS_MS.len()]));
        if k > 0 {
            outages.push(Outage {
                start: at,
                duration: Duration::from_millis(100 + 50 * (k % 3)),
            });
        }
    }
    (Schedule::new(steps), outages)
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Profile::Lawson => "lawson",
            Profile::Nasa => "nasa",
            Profile::Geo => "geo",
            Profile::Adalr => "adalr",
            Profile::Leo => "leo",
        };
        f.write_str(s)
    }
}

impl FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        <Profile as clap::ValueEnum>::from_str(s, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geo_is_asymmetric_and_queues_hold_a_bdp() {
        let l = Profile::Geo.link();
        assert_eq!(l.forward.rate_bps, 20e6);
        assert_eq!(l.ret.rate_bps, 2e6);
        assert_eq!(l.forward.queue_bytes, 1_500_000);
        assert_eq!(Profile::Lawson.link().ret.delay, Duration::from_millis(285));
        let leo = Profile::Leo.link().forward;
        assert_eq!(
            leo.delay_at(Duration::from_secs(14)),
            Duration::from_millis(20)
        );
        assert_eq!(
            leo.delay_at(Duration::from_secs(15)),
            Duration::from_millis(32)
        );
        assert_eq!(
            leo.delay_at(Duration::from_secs(60)),
            Duration::from_millis(20)
        );
        let out = &leo.impairments.outages;
        assert!(out.is_down(Duration::from_millis(15_100)));
        assert!(!out.is_down(Duration::from_millis(15_160)));
        assert!(out.is_down(Duration::from_millis(30_190)));
        assert!(!out.is_down(Duration::from_millis(45_100)));
    }
}
