//! CPU time of the gateways' processes over a run, for comparing what pepd and the split
//! relay spend per byte carried (issue 15): user and system seconds of every thread of a
//! process, live or exited, from `/proc/PID/stat`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::Error;

/// Bytes in the "GB" of CPU-seconds per GB.
const GB: f64 = 1e9;

/// User and system CPU seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuTimes {
    pub user_s: f64,
    pub system_s: f64,
}

impl CpuTimes {
    pub fn total_s(&self) -> f64 {
        self.user_s + self.system_s
    }

    /// What was spent between `earlier` and this sample.
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: self.user_s - earlier.user_s,
            system_s: self.system_s - earlier.system_s,
        }
    }
}

/// The CPU times of process `pid` (all its threads) so far.
pub fn process_times(pid: u32) -> Result<CpuTimes, Error> {
    stat_times(Path::new(&format!("/proc/{pid}/stat")))
}

/// The CPU times a `stat` file of /proc gives: a process's (`/proc/PID/stat`) or a
/// thread's (`/proc/PID/task/TID/stat`).
pub fn stat_times(path: &Path) -> Result<CpuTimes, Error> {
    let text = std::fs::read_to_string(path)?;
    parse_stat(&text, clock_ticks()?)
        .ok_or_else(|| Error::Invalid(format!("{} has no utime/stime: {text:?}", path.display())))
}

/// utime and stime (fields 14 and 15, in clock ticks) of a `/proc/PID/stat` line. The
/// command name (field 2) may hold spaces and parentheses, so fields count from its last `)`.
fn parse_stat(text: &str, ticks_per_s: f64) -> Option<CpuTimes> {
    let after_name = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name; utime is field 14.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(CpuTimes {
        user_s: utime as f64 / ticks_per_s,
        system_s: stime as f64 / ticks_per_s,
    })
}

/// The whole machine's CPU so far, every core together, from the first line of `/proc/stat`:
/// `(busy, softirq)` seconds, busy being user, nice, system, irq and softirq time (not idle,
/// I/O wait or time the hypervisor stole).
pub fn machine_times() -> Result<(f64, f64), Error> {
    let text = std::fs::read_to_string("/proc/stat")?;
    let ticks = clock_ticks()?;
    parse_proc_stat(&text, ticks)
        .ok_or_else(|| Error::Invalid(format!("/proc/stat has no cpu line: {text:.200}")))
}

fn parse_proc_stat(text: &str, ticks_per_s: f64) -> Option<(f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq ...
    let [user, nice, system, _idle, _iowait, irq, softirq, ..] = f[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some((busy as f64 / ticks_per_s, softirq as f64 / ticks_per_s))
}

fn clock_ticks() -> Result<f64, Error> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map(|t| t as f64)
        .ok_or_else(|| Error::Invalid("no clock tick rate (sysconf CLK_TCK)".into()))
}

/// The whole machine over the workload: what the gateways' processes leave out (the kernel's
/// packet work done in softirq for other processes or in ksoftirqd, the end hosts' traffic
/// tool, the emulator), for reading their figures against each other. It counts whatever
/// else runs on the machine too: compare runs made on an otherwise idle one.
#[derive(Clone, Debug, Serialize)]
pub struct MachineCpu {
    /// Busy CPU seconds of every core together.
    pub busy_s: f64,
    /// The part of `busy_s` spent in softirq (most of the kernel's packet work).
    pub softirq_s: f64,
    /// `busy_s` per 10⁹ bytes of verified payload.
    pub busy_s_per_gb: f64,
}

/// One process's CPU over the workload.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessCpu {
    #[serde(flatten)]
    pub times: CpuTimes,
    pub total_s: f64,
}

/// The gateways' processes' CPU over the workload, and per GB of verified payload.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayCpu {
    /// Keyed by gateway name.
    pub processes: BTreeMap<String, ProcessCpu>,
    /// All the gateways' processes together.
    pub total_s: f64,
    /// `total_s` per 10⁹ bytes of verified payload.
    pub cpu_s_per_gb: f64,
    pub machine: MachineCpu,
}

/// CPU samples of a set of named processes, taken when the workload starts.
pub struct CpuMeter {
    start: Vec<(String, u32, CpuTimes)>,
    machine_start: (f64, f64),
}

impl CpuMeter {
    /// Samples each `(name, pid)` now.
    pub fn start(processes: &[(String, u32)]) -> Result<CpuMeter, Error> {
        let start = processes
            .iter()
            .map(|(name, pid)| Ok((name.clone(), *pid, process_times(*pid)?)))
            .collect::<Result<_, Error>>()?;
        Ok(CpuMeter {
            start,
            machine_start: machine_times()?,
        })
    }

    /// What each process spent since [`CpuMeter::start`], per GB of `bytes`.
    pub fn finish(&self, bytes: u64) -> Result<GatewayCpu, Error> {
        let mut processes = BTreeMap::new();
        for (name, pid, start) in &self.start {
            let times = process_times(*pid)?.since(start);
            processes.insert(
                name.clone(),
                ProcessCpu {
                    total_s: times.total_s(),
                    times,
                },
            );
        }
        let total_s = processes.values().map(|p| p.total_s).sum::<f64>();
        let per_gb = |s: f64| {
            if bytes > 0 {
                s / (bytes as f64 / GB)
            } else {
                0.0
            }
        };
        let (busy, softirq) = machine_times()?;
        let busy_s = busy - self.machine_start.0;
        Ok(GatewayCpu {
            processes,
            total_s,
            cpu_s_per_gb: per_gb(total_s),
            machine: MachineCpu {
                busy_s,
                softirq_s: softirq - self.machine_start.1,
                busy_s_per_gb: per_gb(busy_s),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_read_after_a_name_with_spaces_and_parentheses() {
        let line = "4242 (pep (test) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 \
                    250 75 3 4 20 0 9 0 12345 1000000 300 18446744073709551615";
        let t = parse_stat(line, 100.0).expect("parses");
        assert_eq!(
            t,
            CpuTimes {
                user_s: 2.5,
                system_s: 0.75
            }
        );
        assert_eq!(parse_stat("4242 (x) S 1 2", 100.0), None);
    }

    #[test]
    fn the_machine_line_of_proc_stat_gives_busy_and_softirq_time() {
        let text = "cpu  1000 50 300 9000 20 5 45 7 0 0\ncpu0 500 25 150 4500 10 2 20 3 0 0\n";
        // user 1000 + nice 50 + system 300 + irq 5 + softirq 45 ticks; idle, iowait and
        // steal left out.
        assert_eq!(parse_proc_stat(text, 100.0), Some((14.0, 0.45)));
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5 6 7\n", 100.0), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3\n", 100.0), None);
        assert_eq!(parse_proc_stat("cpu  1\n", 100.0), None);
        let (busy, _) = machine_times().expect("/proc/stat");
        assert!(busy > 0.0);
    }

    #[test]
    fn this_process_has_spent_cpu_and_differences_subtract() {
        // Spin until the kernel has charged at least one clock tick.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut t = process_times(std::process::id()).expect("own stat");
        while t.total_s() == 0.0 && std::time::Instant::now() < deadline {
            std::hint::black_box((0..100_000u64).sum::<u64>());
            t = process_times(std::process::id()).expect("own stat");
        }
        assert!(t.total_s() > 0.0, "{t:?}");
        assert_eq!(t.since(&t).total_s(), 0.0);
    }
}
