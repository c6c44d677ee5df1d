//! Rate-limited logging of dropped datagrams: a flood of junk must not become a flood of
//! log lines, yet an operator should learn that something is knocking.

use std::time::{Duration, Instant};

use pep_transport::Stats;

/// At most one summary line per this interval.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Remembers what was last reported.
#[derive(Debug, Default)]
pub struct DropLog {
    last_at: Option<Instant>,
    last: Vec<(&'static str, u64)>,
}

impl DropLog {
    /// Whether a summary could be logged now (so callers gather stats only then).
    pub fn is_due(&self, now: Instant) -> bool {
        self.last_at.is_none_or(|t| now >= t + DROP_LOG_INTERVAL)
    }

    /// A summary of drops since the last one, if one is due and anything was dropped.
    pub fn summary(&mut self, now: Instant, stats: &Stats, foreign: u64) -> Option<String> {
        if self.last_at.is_some_and(|t| now < t + DROP_LOG_INTERVAL) {
            return None;
        }
        let current = counts(stats, foreign);
        let delta: Vec<String> = current
            .iter()
            .map(|&(reason, n)| {
                let before = self
                    .last
                    .iter()
                    .find(|(r, _)| *r == reason)
                    .map_or(0, |(_, b)| *b);
                (reason, n.saturating_sub(before))
            })
            .filter(|&(_, d)| d > 0)
            .map(|(reason, d)| format!("{reason}={d}"))
            .collect();
        self.last = current;
        if delta.is_empty() {
            // Nothing new: the next drop may be reported at once.
            self.last_at = None;
            return None;
        }
        let since = self.last_at.map(|t| now - t);
        self.last_at = Some(now);
        Some(match since {
            Some(d) => format!("{} in the last {:.0?}", delta.join(" "), d),
            None => delta.join(" "),
        })
    }
}

fn counts(st: &Stats, foreign: u64) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = st.security.by_reason().to_vec();
    v.push(("malformed", st.malformed_dropped));
    v.push(("foreign", foreign));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_at_most_once_per_interval_with_the_deltas() {
        let t0 = Instant::now();
        let mut log = DropLog::default();
        let mut st = Stats::default();
        assert_eq!(log.summary(t0, &st, 0), None);
        st.security.unauthenticated = 5;
        assert_eq!(
            log.summary(t0, &st, 0).as_deref(),
            Some("unauthenticated=5")
        );
        st.security.unauthenticated = 900;
        st.security.handshake_rate_limited = 7;
        assert_eq!(log.summary(t0 + Duration::from_secs(3), &st, 2), None);
        let s = log.summary(t0 + Duration::from_secs(10), &st, 2).unwrap();
        assert_eq!(
            s,
            "unauthenticated=895 handshake_rate_limited=7 foreign=2 in the last 10s"
        );
    }
}
