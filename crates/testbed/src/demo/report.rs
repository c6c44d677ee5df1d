//! The demo's numbers: per workload the completion times of each mode, their medians, the
//! speed-up and goodput, as a text table and as JSON.

use std::fmt::Write as _;
use std::time::Instant;

use pep_linkemu::LinkConfig;
use pep_testbed::runner::{LinkSummary, Mode, RunResult};
use pep_testbed::stats::percentile;
use pep_testbed::xfer::Outcome;
use pep_testbed::Profile;
use serde::Serialize;

use super::Metric;

/// One mode's measurements of one workload.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Series {
    /// The row's figure (completion time, or request latency) of every run, in run order.
    pub runs_s: Vec<f64>,
    /// Payload bytes of one run's download (of the last run, when runs were capped).
    pub bytes: u64,
    /// Runs cut by their time limit: the figure is the limit, a lower bound.
    pub capped: u32,
}

impl Series {
    pub fn median_s(&self) -> f64 {
        let mut v = self.runs_s.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// Goodput at the median completion time.
    pub fn goodput_bps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.median_s()
    }
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: String,
    pub metric: Metric,
    pub plain: Series,
    pub pepd: Series,
}

impl Row {
    pub fn new(label: &str, metric: Metric) -> Row {
        Row {
            workload: label.to_owned(),
            metric,
            plain: Series::default(),
            pepd: Series::default(),
        }
    }

    pub fn record(&mut self, mode: Mode, o: &Outcome) {
        let s = match mode {
            Mode::Pepd => &mut self.pepd,
            // The baseline column: whatever pepd is compared with.
            Mode::PlainCubic | Mode::PlainBbr | Mode::SplitTcp => &mut self.plain,
        };
        let figure = match self.metric {
            Metric::Completion => o.completion_s,
            Metric::RequestP95 => percentile(&o.latencies_s, 0.95),
        };
        s.runs_s.push(figure);
        s.bytes = o.bytes;
        s.capped += u32::from(o.capped);
    }

    /// The median as the table shows it: capped runs make it a lower bound.
    pub fn shown(s: &Series) -> String {
        let bound = if s.capped > 0 { ">" } else { "" };
        format!("{bound}{:.2} s", s.median_s())
    }

    /// How many times faster the transfer completes through pepd (median against median).
    pub fn speedup(&self) -> f64 {
        self.plain.median_s() / self.pepd.median_s()
    }
}

/// The row as it goes into demo.json: the medians and derived figures spelt out.
#[derive(Serialize)]
struct RowJson<'a> {
    workload: &'a str,
    metric: Metric,
    plain_capped_runs: u32,
    bytes: u64,
    plain_s: f64,
    pepd_s: f64,
    speedup: f64,
    plain_goodput_bps: f64,
    pepd_goodput_bps: f64,
    plain_runs_s: &'a [f64],
    pepd_runs_s: &'a [f64],
}

#[derive(Serialize)]
pub struct Report {
    pub profile: Profile,
    pub forward: LinkSummary,
    #[serde(rename = "return")]
    pub ret: LinkSummary,
    pub repeat: u32,
    /// Wall time of the whole demo up to the report, topology set-up included.
    pub wall_s: f64,
    #[serde(serialize_with = "rows_json")]
    pub rows: Vec<Row>,
    /// Every run as `pep-testbed run --json` reports it.
    pub runs: Vec<RunResult>,
}

fn rows_json<S: serde::Serializer>(rows: &[Row], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(rows.iter().map(|r| RowJson {
        workload: &r.workload,
        metric: r.metric,
        plain_capped_runs: r.plain.capped,
        bytes: r.pepd.bytes,
        plain_s: r.plain.median_s(),
        pepd_s: r.pepd.median_s(),
        speedup: r.speedup(),
        plain_goodput_bps: r.plain.goodput_bps(),
        pepd_goodput_bps: r.pepd.goodput_bps(),
        plain_runs_s: &r.plain.runs_s,
        pepd_runs_s: &r.pepd.runs_s,
    }))
}

impl Report {
    pub fn new(
        profile: Profile,
        link: &LinkConfig,
        repeat: u32,
        rows: Vec<Row>,
        runs: Vec<RunResult>,
        started: Instant,
    ) -> Report {
        Report {
            profile,
            forward: (&link.forward).into(),
            ret: (&link.ret).into(),
            repeat,
            wall_s: started.elapsed().as_secs_f64(),
            rows,
            runs,
        }
    }

    /// One line naming the link, e.g. "geo: 20 Mb/s down, 2 Mb/s up, 300 ms one-way".
    pub fn link_line(&self) -> String {
        format!(
            "{}: {} Mb/s down, {} Mb/s up, {} ms one-way, BER {}",
            self.profile,
            self.forward.rate_bps / 1e6,
            self.ret.rate_bps / 1e6,
            self.forward.delay_ms,
            self.forward.ber
        )
    }

    /// The side-by-side table printed to stdout.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let runs = if self.repeat == 1 {
            "1 run per mode".to_owned()
        } else {
            format!("median of {} runs per mode", self.repeat)
        };
        let _ = writeln!(t, "\npepd demo — {} ({runs})\n", self.link_line());
        let _ = writeln!(
            t,
            "| {:<26} | {:>10} | {:>10} | {:>8} | {:>13} | {:>13} |",
            "workload", "plain TCP", "pepd", "speed-up", "plain goodput", "pepd goodput"
        );
        let _ = writeln!(
            t,
            "|{:-<28}|{:->12}|{:->12}|{:->10}|{:->15}|{:->15}|",
            "", "", "", "", "", ""
        );
        for r in &self.rows {
            let goodput = |s: &Series| match r.metric {
                Metric::Completion => format!("{:>8.2} Mb/s", s.goodput_bps() / 1e6),
                Metric::RequestP95 => "-".to_owned(),
            };
            let _ = writeln!(
                t,
                "| {:<26} | {:>10} | {:>10} | {:>7.1}× | {:>13} | {:>13} |",
                r.workload,
                Row::shown(&r.plain),
                Row::shown(&r.pepd),
                r.speedup(),
                goodput(&r.plain),
                goodput(&r.pepd)
            );
        }
        let _ = writeln!(
            t,
            "\nplain TCP: end-to-end kernel CUBIC; pepd: through the pepd gateway pair. Time \
             from connect to the last verified byte; goodput = payload / time. \"5 MB at BER \
             1e-6\": the same link losing packets to bit errors; plain TCP is stopped after {} s \
             (\">\": a lower bound). \"fade\": the forward link at 10 Mb/s while pepd is set up \
             for 20 (a rain fade), a 1 KB request every 200 ms beside a 5 MB download; the \
             figure is the requests' 95th-percentile latency (one round trip is 0.6 s).",
            super::LOSSY_PLAIN_CAP.as_secs()
        );
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_speedup() {
        let mut r = Row::new("x", Metric::Completion);
        for (mode, s) in [
            (Mode::PlainCubic, 4.0),
            (Mode::PlainCubic, 9.0),
            (Mode::PlainCubic, 5.0),
            (Mode::Pepd, 1.0),
            (Mode::Pepd, 3.0),
        ] {
            r.record(
                mode,
                &Outcome {
                    bytes: 1_000_000,
                    completion_s: s,
                    ..Default::default()
                },
            );
        }
        assert_eq!(r.plain.median_s(), 5.0);
        assert_eq!(r.pepd.median_s(), 2.0);
        assert_eq!(r.speedup(), 2.5);
        assert_eq!(r.pepd.goodput_bps(), 4e6);
    }
}

#[cfg(test)]
mod metric_tests {
    use super::*;

    #[test]
    fn latency_rows_take_the_95th_percentile_and_capped_rows_say_so() {
        let mut r = Row::new("fade", Metric::RequestP95);
        let latencies: Vec<f64> = (1..=100).map(|i| f64::from(i) / 100.0).collect();
        r.record(
            Mode::Pepd,
            &Outcome {
                latencies_s: latencies,
                ..Default::default()
            },
        );
        assert_eq!(r.pepd.median_s(), 0.95);
        let mut c = Row::new("lossy", Metric::Completion);
        c.record(
            Mode::PlainCubic,
            &Outcome {
                completion_s: 15.0,
                capped: true,
                ..Default::default()
            },
        );
        assert_eq!(Row::shown(&c.plain), ">15.00 s");
        assert_eq!(Row::shown(&r.pepd), "0.95 s");
    }
}
