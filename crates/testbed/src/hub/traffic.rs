//! What each terminal's client does through the hub: a bulk download (sampled in bins, so
//! its rate over any window can be read), a bulk upload, requests at a fixed pace, any of
//! them at once; all against one xfer server behind the hub.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::in_netns;
use crate::xfer::client::{self, ClientOpts};
use crate::xfer::{Amount, Outcome, Workload};

/// Which terminals do something: `all`, `none` or a list of numbers and ranges from 1,
/// such as `1,3-8`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminalSet {
    All,
    Some(Vec<std::ops::RangeInclusive<usize>>),
}

impl TerminalSet {
    /// Whether terminal `i` (from 1) is in the set.
    pub fn contains(&self, i: usize) -> bool {
        match self {
            TerminalSet::All => true,
            TerminalSet::Some(ranges) => ranges.iter().any(|r| r.contains(&i)),
        }
    }
}

impl std::str::FromStr for TerminalSet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "all" => return Ok(TerminalSet::All),
            "none" | "" => return Ok(TerminalSet::Some(Vec::new())),
            _ => {}
        }
        let number = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{t:?} in {s:?} is not a terminal number (from 1)"))
        };
        let mut ranges = Vec::new();
        for part in s.split(',') {
            let (from, to) = match part.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => (number(part)?, number(part)?),
            };
            if from > to {
                return Err(format!("{part:?} in {s:?} runs backwards"));
            }
            ranges.push(from..=to);
        }
        Ok(TerminalSet::Some(ranges))
    }
}

/// What one terminal's client runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Activities {
    pub download: bool,
    pub upload: bool,
    /// Requests at a fixed pace, for as long as any terminal's bulk transfer runs.
    pub requests: bool,
}

impl Activities {
    pub fn bulk(&self) -> bool {
        self.download || self.upload
    }
}

#[derive(Clone, Debug)]
pub struct TrafficSpec {
    /// By terminal, from terminal 1.
    pub activities: Vec<Activities>,
    /// Each bulk transfer's size or length; with no bulk transfer anywhere, `Seconds` is
    /// how long the requests go on.
    pub amount: Amount,
    /// Request and response sizes.
    pub request: (usize, usize),
    pub request_every: Duration,
    /// Downloads are sampled in bins of this length.
    pub bin: Duration,
    pub max_duration: Duration,
}

/// What one terminal's client measured.
#[derive(Clone, Debug, Default)]
pub struct TerminalTraffic {
    /// The outcome, and the bytes received in each bin from its start.
    pub download: Option<(Outcome, Vec<u64>)>,
    pub upload: Option<Outcome>,
    pub requests: Option<Outcome>,
}

/// Connection seeds: distinct per terminal and activity, so no two streams look alike.
pub fn seed(terminal: usize, activity: u64) -> u64 {
    terminal as u64 * 10 + activity
}

fn opts(server: SocketAddr, seed: u64, max: Duration) -> ClientOpts {
    ClientOpts {
        server,
        cc: None,
        seed,
        max_duration: max,
    }
}

/// A failed start of the traffic tool in a namespace, as an outcome.
fn broken(e: impl std::fmt::Display) -> Outcome {
    Outcome {
        error: Some(e.to_string()),
        intact: Some(false),
        ..Default::default()
    }
}

/// Runs every terminal's activities at once from its client namespace (`clients`, by
/// terminal) against `server`, and returns what each measured.
pub fn run(clients: &[String], server: SocketAddr, spec: &TrafficSpec) -> Vec<TerminalTraffic> {
    let bulk_done = Arc::new(AtomicBool::new(false));
    let max = spec.max_duration;
    let mut bulk = Vec::new();
    let mut paced = Vec::new();
    for (k, (ns, act)) in clients.iter().zip(&spec.activities).enumerate() {
        let i = k + 1;
        if act.download {
            let (ns, o, a, bin) = (
                ns.clone(),
                opts(server, seed(i, 1), max),
                spec.amount,
                spec.bin,
            );
            bulk.push((
                k,
                true,
                thread::spawn(move || {
                    in_netns(&ns, move || client::download_sampled(&o, a, bin))
                        .map(|(out, bins)| Slot::Download(out, bins))
                        .unwrap_or_else(|e| Slot::Download(broken(e), Vec::new()))
                }),
            ));
        }
        if act.upload {
            let (ns, o, w) = (
                ns.clone(),
                opts(server, seed(i, 2), max),
                Workload::Upload(spec.amount),
            );
            bulk.push((
                k,
                false,
                thread::spawn(move || {
                    Slot::Upload(in_netns(&ns, move || client::run(&w, &o)).unwrap_or_else(broken))
                }),
            ));
        }
        if act.requests {
            let (ns, o, sizes, every, done) = (
                ns.clone(),
                opts(server, seed(i, 3), max),
                spec.request,
                spec.request_every,
                bulk_done.clone(),
            );
            paced.push((
                k,
                thread::spawn(move || {
                    in_netns(&ns, move || client::requests_until(&o, sizes, every, &done))
                        .unwrap_or_else(broken)
                }),
            ));
        }
    }
    let mut out = vec![TerminalTraffic::default(); spec.activities.len()];
    if bulk.is_empty() {
        if let Amount::Seconds(s) = spec.amount {
            let until = Instant::now() + Duration::from_secs_f64(s).min(max);
            while Instant::now() < until {
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for (k, download, h) in bulk {
        let panicked = || match download {
            true => Slot::Download(broken("panicked"), Vec::new()),
            false => Slot::Upload(broken("panicked")),
        };
        match h.join().unwrap_or_else(|_| panicked()) {
            Slot::Download(o, bins) => out[k].download = Some((o, bins)),
            Slot::Upload(o) => out[k].upload = Some(o),
        }
    }
    bulk_done.store(true, Ordering::Relaxed);
    for (k, h) in paced {
        out[k].requests = Some(h.join().unwrap_or_else(|_| broken("panicked")));
    }
    out
}

enum Slot {
    Download(Outcome, Vec<u64>),
    Upload(Outcome),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sets_parse_lists_ranges_all_and_none() {
        let s: TerminalSet = "1,3-5".parse().expect("parses");
        let members: Vec<usize> = (1..=8).filter(|&i| s.contains(i)).collect();
        assert_eq!(members, vec![1, 3, 4, 5]);
        assert!("all".parse::<TerminalSet>().expect("parses").contains(150));
        assert!(!"none".parse::<TerminalSet>().expect("parses").contains(1));
        assert!("0".parse::<TerminalSet>().is_err());
        assert!("5-3".parse::<TerminalSet>().is_err());
        assert!("x".parse::<TerminalSet>().is_err());
    }
}
