//! A failover run's figures from the probers' connection logs: per terminal how long after
//! the failure a new request was first answered exactly, how its connections ended, and
//! its request p99 around the failure beside a control run's; over the terminals, the
//! worst and median recovery and the flows reset or left hanging.

use serde::Serialize;

use crate::stats::percentile;

/// How one probe connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The response arrived; `exact` when every byte matched the pattern.
    Answered { exact: bool },
    /// Reset, aborted, or closed before the response was complete.
    Reset,
    /// The connection was refused.
    Refused,
    /// Any other error (unreachable, corrupted request at the server, …).
    Failed,
    /// Still open when the run ended.
    Open,
}

/// One probe connection: seconds from the run's start.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Request {
    pub started_s: f64,
    /// `None` while open.
    pub ended_s: Option<f64>,
    pub ending: Ending,
}

impl Request {
    fn latency_s(&self) -> Option<f64> {
        match self.ending {
            Ending::Answered { .. } => Some(self.ended_s? - self.started_s),
            _ => None,
        }
    }
}

/// Where the failure and the end of the run fall, in seconds from the run's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeline {
    pub failure_at_s: f64,
    pub end_s: f64,
    /// Requests started this close to the end are left out of the counts: they had no
    /// time to end (the path's round trip and a second).
    pub tail_s: f64,
    /// The request p99 is taken over requests started in
    /// `[failure_at_s - before_s, failure_at_s + after_s]`.
    pub p99_before_s: f64,
    pub p99_after_s: f64,
}

impl Timeline {
    fn counted(&self, r: &Request) -> bool {
        r.started_s < self.end_s - self.tail_s
    }

    fn in_p99_window(&self, r: &Request) -> bool {
        r.started_s >= self.failure_at_s - self.p99_before_s
            && r.started_s <= self.failure_at_s + self.p99_after_s
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestCounts {
    /// Counted connections (those started before the run's tail).
    pub started: usize,
    pub answered: usize,
    /// Answered, but some byte differed.
    pub inexact: usize,
    pub reset: usize,
    pub refused: usize,
    pub failed: usize,
    pub hung: usize,
    /// Started in the run's tail and not counted.
    pub left_out: usize,
    /// The p99 of the answered requests' latency in the window around the failure.
    pub p99_s: Option<f64>,
    /// The same window of the control run.
    pub control_p99_s: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TerminalReport {
    pub terminal: usize,
    /// Whether the hub serving it failed.
    pub affected: bool,
    /// Seconds from the failure until a request started after it was answered exactly;
    /// `None` when none was.
    pub recovery_s: Option<f64>,
    pub requests: RequestCounts,
}

/// The p99 of the answered latencies of `log` in `t`'s window.
fn window_p99(log: &[Request], t: &Timeline) -> Option<f64> {
    let lat: Vec<f64> = log
        .iter()
        .filter(|r| t.in_p99_window(r))
        .filter_map(Request::latency_s)
        .collect();
    (!lat.is_empty()).then(|| percentile(&lat, 0.99))
}

/// One terminal's figures from its log and, when there was one, the control run's log.
pub fn terminal_report(
    terminal: usize,
    affected: bool,
    log: &[Request],
    control: Option<&[Request]>,
    t: &Timeline,
) -> TerminalReport {
    let recovery_s = log
        .iter()
        .filter(|r| r.started_s >= t.failure_at_s)
        .filter(|r| r.ending == Ending::Answered { exact: true })
        .filter_map(|r| r.ended_s)
        .reduce(f64::min)
        .map(|ended| ended - t.failure_at_s);
    let counted: Vec<&Request> = log.iter().filter(|r| t.counted(r)).collect();
    let count = |f: &dyn Fn(Ending) -> bool| counted.iter().filter(|r| f(r.ending)).count();
    let requests = RequestCounts {
        started: counted.len(),
        answered: count(&|e| matches!(e, Ending::Answered { .. })),
        inexact: count(&|e| e == Ending::Answered { exact: false }),
        reset: count(&|e| e == Ending::Reset),
        refused: count(&|e| e == Ending::Refused),
        failed: count(&|e| e == Ending::Failed),
        hung: count(&|e| e == Ending::Open),
        left_out: log.len() - counted.len(),
        p99_s: window_p99(log, t),
        control_p99_s: control.and_then(|c| window_p99(c, t)),
    };
    TerminalReport {
        terminal,
        affected,
        recovery_s,
        requests,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// Over the affected terminals; `None` when one of them never recovered.
    pub max: Option<f64>,
    pub median: Option<f64>,
    /// Affected terminals with no exact answer after the failure.
    pub unrecovered: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unaffected {
    pub terminals: Vec<usize>,
    /// The largest request p99 among them, and the control run's.
    pub request_p99_s_max: Option<f64>,
    pub control_p99_s_max: Option<f64>,
    /// Their connections that ended reset, refused or failed.
    pub resets: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub recovery_s: Recovery,
    /// Counted connections of every terminal that ended reset, refused or failed.
    pub reset_flows: usize,
    /// Counted connections still open at the end.
    pub hung_flows: usize,
    /// Every answered request was exact.
    pub all_exact: bool,
    pub unaffected: Unaffected,
}

fn max_of(xs: impl Iterator<Item = f64>) -> Option<f64> {
    xs.reduce(f64::max)
}

/// The figures over all terminals.
pub fn summarise(per_terminal: &[TerminalReport]) -> Summary {
    let affected: Vec<&TerminalReport> = per_terminal.iter().filter(|r| r.affected).collect();
    let recovered: Vec<f64> = affected.iter().filter_map(|r| r.recovery_s).collect();
    let unrecovered = affected.len() - recovered.len();
    let complete = unrecovered == 0 && !recovered.is_empty();
    let unaffected: Vec<&TerminalReport> = per_terminal.iter().filter(|r| !r.affected).collect();
    let ended_badly =
        |r: &TerminalReport| r.requests.reset + r.requests.refused + r.requests.failed;
    Summary {
        recovery_s: Recovery {
            max: complete
                .then(|| max_of(recovered.iter().copied()))
                .flatten(),
            median: complete.then(|| percentile(&recovered, 0.5)),
            unrecovered,
        },
        reset_flows: per_terminal.iter().map(ended_badly).sum(),
        hung_flows: per_terminal.iter().map(|r| r.requests.hung).sum(),
        all_exact: per_terminal.iter().all(|r| r.requests.inexact == 0),
        unaffected: Unaffected {
            terminals: unaffected.iter().map(|r| r.terminal).collect(),
            request_p99_s_max: max_of(unaffected.iter().filter_map(|r| r.requests.p99_s)),
            control_p99_s_max: max_of(unaffected.iter().filter_map(|r| r.requests.control_p99_s)),
            resets: unaffected.iter().map(|r| ended_badly(r)).sum(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(started_s: f64, ended_s: f64) -> Request {
        Request {
            started_s,
            ended_s: Some(ended_s),
            ending: Ending::Answered { exact: true },
        }
    }

    fn ended(started_s: f64, ended_s: f64, ending: Ending) -> Request {
        Request {
            started_s,
            ended_s: Some(ended_s),
            ending,
        }
    }

    fn open(started_s: f64) -> Request {
        Request {
            started_s,
            ended_s: None,
            ending: Ending::Open,
        }
    }

    const T: Timeline = Timeline {
        failure_at_s: 20.0,
        end_s: 45.0,
        tail_s: 1.5,
        p99_before_s: 5.0,
        p99_after_s: 20.0,
    };

    #[test]
    fn recovery_counts_only_exact_answers_to_requests_started_after_the_failure() {
        let log = [
            // Started before the failure, answered after it: not a recovery.
            answered(19.75, 20.5),
            ended(20.0, 20.25, Ending::Reset),
            // Answered but not exact: not a recovery either.
            ended(21.0, 21.25, Ending::Answered { exact: false }),
            // Started later but answered earlier than the next one: the earliest end wins.
            answered(22.5, 23.0),
            answered(22.0, 23.5),
        ];
        let r = terminal_report(1, true, &log, None, &T);
        assert_eq!(r.recovery_s, Some(3.0));
        assert_eq!(r.requests.answered, 4);
        assert_eq!(r.requests.inexact, 1);
        assert_eq!(r.requests.reset, 1);
    }

    #[test]
    fn a_terminal_that_never_recovers_has_no_recovery_and_no_max() {
        let log = [answered(10.0, 10.5), ended(21.0, 22.0, Ending::Refused)];
        let r = terminal_report(2, true, &log, None, &T);
        assert_eq!(r.recovery_s, None);
        let s = summarise(&[
            r,
            terminal_report(3, true, &[answered(21.0, 22.5)], None, &T),
        ]);
        assert_eq!(
            s.recovery_s,
            Recovery {
                max: None,
                median: None,
                unrecovered: 1
            }
        );
        assert_eq!(s.reset_flows, 1);
    }

    #[test]
    fn open_connections_are_hung_unless_started_in_the_tail() {
        let log = [
            open(30.0),
            open(43.25),
            // 43.5 is the tail's first instant: left out.
            open(43.5),
            open(44.75),
            ended(43.75, 44.0, Ending::Reset),
            ended(10.0, 12.0, Ending::Failed),
            answered(11.0, 11.5),
        ];
        let r = terminal_report(1, true, &log, None, &T);
        assert_eq!(
            r.requests,
            RequestCounts {
                started: 4,
                answered: 1,
                inexact: 0,
                reset: 0,
                refused: 0,
                failed: 1,
                hung: 2,
                left_out: 3,
                p99_s: None,
                control_p99_s: None,
            }
        );
    }

    #[test]
    fn the_p99_covers_the_window_around_the_failure_in_both_runs() {
        // 100 answered requests in the window (15 s to 40 s), latencies k/128 s (exact in
        // binary) for k = 1..=100; and slow ones outside it that must not count.
        let mut log: Vec<Request> = (1..=100)
            .map(|k| {
                let start = 15.0 + f64::from(k) * 0.25;
                answered(start, start + f64::from(k) / 128.0)
            })
            .collect();
        log.push(answered(14.75, 24.75));
        log.push(answered(40.25, 44.0));
        // Nearest rank of 0.99 over 100 sorted values: index round(99 × 0.99) = 98, k = 99.
        let control: Vec<Request> = (0..10)
            .map(|k| answered(16.0 + f64::from(k), 16.5 + f64::from(k)))
            .collect();
        let r = terminal_report(4, false, &log, Some(&control), &T);
        assert_eq!(r.requests.p99_s, Some(99.0 / 128.0));
        assert_eq!(r.requests.control_p99_s, Some(0.5));
        let s = summarise(&[r]);
        assert_eq!(s.unaffected.terminals, vec![4]);
        assert_eq!(s.unaffected.request_p99_s_max, Some(99.0 / 128.0));
        assert_eq!(s.unaffected.control_p99_s_max, Some(0.5));
        // No affected terminal: nothing to recover.
        assert_eq!(s.recovery_s.unrecovered, 0);
        assert_eq!(s.recovery_s.max, None);
    }

    #[test]
    fn the_summary_takes_the_worst_and_median_recovery_and_sums_the_flows() {
        let reports: Vec<TerminalReport> = [
            (
                1,
                vec![answered(20.5, 21.5), ended(19.0, 20.5, Ending::Reset)],
            ),
            (2, vec![answered(22.0, 24.0), open(20.0)]),
            (
                3,
                vec![answered(21.0, 22.5), ended(18.0, 20.25, Ending::Refused)],
            ),
        ]
        .into_iter()
        .map(|(i, log)| terminal_report(i, true, &log, None, &T))
        .collect();
        let s = summarise(&reports);
        assert_eq!(
            s.recovery_s,
            Recovery {
                max: Some(4.0),
                median: Some(2.5),
                unrecovered: 0
            }
        );
        assert_eq!(s.reset_flows, 2);
        assert_eq!(s.hung_flows, 1);
        assert!(s.all_exact);
        assert!(s.unaffected.terminals.is_empty());
        assert_eq!(s.unaffected.resets, 0);
    }
}
