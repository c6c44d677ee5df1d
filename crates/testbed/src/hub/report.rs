//! A hub run's figures: per terminal its goodput both ways, whether every byte arrived
//! intact, its busiest window against its MIR and its requests' latency percentiles; over
//! the terminals, Jain's index of their download goodputs divided by their weights.

use std::time::Duration;

use serde::Serialize;

use crate::stats::percentile;
use crate::xfer::{Amount, Outcome};

use super::gateways::TerminalRates;
use super::traffic::{TerminalTraffic, TrafficSpec};

/// How the figures are cut from the samples.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    /// Downloads are sampled in bins of this length.
    pub bin: Duration,
    /// Goodput leaves out the first this long of each download (connection setup and the
    /// controller's start).
    pub warmup: Duration,
    /// The window whose busiest instance is held against the MIR.
    pub mir_window: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct BulkReport {
    pub bytes: u64,
    pub completion_s: f64,
    /// Over the whole transfer, setup included.
    pub goodput_bps: f64,
    /// Every byte arrived, in order, nothing more: the pattern verified and, for a sized
    /// transfer, the count exact.
    pub exact: bool,
    pub capped: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DownloadReport {
    #[serde(flatten)]
    pub bulk: BulkReport,
    /// After the warm-up, up to where the first of the run's downloads ended: the span
    /// every download shares.
    pub steady_goodput_bps: f64,
    /// The busiest `mir_window` of the download.
    pub max_window_bps: f64,
    pub max_window_over_mir: f64,
    /// `steady_goodput_bps` over min(MIR, carrier): what a terminal alone is entitled to.
    pub steady_over_entitled: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RequestsReport {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub exact: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TerminalReport {
    pub terminal: usize,
    #[serde(flatten)]
    pub rates: TerminalRates,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download: Option<DownloadReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<BulkReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<RequestsReport>,
}

/// The figures over all terminals.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Every transfer and response of every terminal arrived exact.
    pub all_exact: bool,
    /// Jain's index of steady download goodput ÷ weight over the downloading terminals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jain_goodput_per_weight: Option<f64>,
    /// The largest `max_window_over_mir` of any terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_window_over_mir: Option<f64>,
    /// The largest request p99 of any terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_p99_ms: Option<f64>,
}

fn bps(bytes: u64, over: Duration) -> f64 {
    if over.is_zero() {
        0.0
    } else {
        bytes as f64 * 8.0 / over.as_secs_f64()
    }
}

fn bulk(o: &Outcome, amount: Amount) -> BulkReport {
    let sized = match amount {
        Amount::Bytes(n) => o.bytes == n,
        Amount::Seconds(_) => true,
    };
    BulkReport {
        bytes: o.bytes,
        completion_s: o.completion_s,
        goodput_bps: o.goodput_bps,
        exact: o.intact == Some(true) && o.error.is_none() && !o.capped && sized,
        capped: o.capped,
        error: o.error.clone(),
    }
}

/// Bytes per second of the busiest `window` bins of `bins` (of the whole when shorter).
fn max_window(bins: &[u64], window: usize, bin: Duration) -> f64 {
    let window = window.clamp(1, bins.len().max(1));
    bins.windows(window)
        .map(|w| bps(w.iter().sum(), bin * window as u32))
        .fold(0.0, f64::max)
}

/// The reports by terminal and the summary over them.
pub fn summarise(
    traffic: &[TerminalTraffic],
    rates: &[TerminalRates],
    carrier_bps: f64,
    spec: &TrafficSpec,
    w: Windows,
) -> (Vec<TerminalReport>, Summary) {
    let bins_of = |d: Duration| (d.as_nanos() / w.bin.as_nanos().max(1)) as usize;
    // Full bins only: a download's last bin ends when it did, not when the bin does.
    let full = |bins: &[u64]| bins.len().saturating_sub(1);
    let shared_end = traffic
        .iter()
        .filter_map(|t| t.download.as_ref())
        .map(|(_, bins)| full(bins))
        .min()
        .unwrap_or(0);
    let warmup = bins_of(w.warmup);
    let steady_from = if warmup < shared_end { warmup } else { 0 };
    let mut reports = Vec::new();
    for (k, (t, r)) in traffic.iter().zip(rates).enumerate() {
        let download = t.download.as_ref().map(|(o, bins)| {
            let steady = &bins[steady_from.min(bins.len())..shared_end.min(bins.len())];
            let steady_bps = bps(steady.iter().sum(), w.bin * steady.len() as u32);
            let most = max_window(&bins[..full(bins)], bins_of(w.mir_window), w.bin);
            DownloadReport {
                bulk: bulk(o, spec.amount),
                steady_goodput_bps: steady_bps,
                max_window_bps: most,
                max_window_over_mir: most / r.mir_bps,
                steady_over_entitled: steady_bps / r.mir_bps.min(carrier_bps),
            }
        });
        let requests = t.requests.as_ref().map(|o| {
            let ms = |q| percentile(&o.latencies_s, q) * 1e3;
            RequestsReport {
                count: o.latencies_s.len(),
                p50_ms: ms(0.5),
                p99_ms: ms(0.99),
                max_ms: ms(1.0),
                exact: o.intact == Some(true) && o.error.is_none() && !o.latencies_s.is_empty(),
                error: o.error.clone(),
            }
        });
        reports.push(TerminalReport {
            terminal: k + 1,
            rates: *r,
            download,
            upload: t.upload.as_ref().map(|o| bulk(o, spec.amount)),
            requests,
        });
    }
    let per_weight: Vec<f64> = reports
        .iter()
        .filter_map(|r| {
            let d = r.download.as_ref()?;
            Some(d.steady_goodput_bps / f64::from(r.rates.weight.max(1)))
        })
        .collect();
    let max_of = |xs: Vec<f64>| xs.into_iter().reduce(f64::max);
    let summary = Summary {
        all_exact: reports.iter().all(|r| {
            r.download.as_ref().is_none_or(|d| d.bulk.exact)
                && r.upload.as_ref().is_none_or(|u| u.exact)
                && r.requests.as_ref().is_none_or(|q| q.exact)
        }),
        jain_goodput_per_weight: (per_weight.len() > 1)
            .then(|| pep_sim::channel::jain_fairness(&per_weight)),
        max_window_over_mir: max_of(
            reports
                .iter()
                .filter_map(|r| Some(r.download.as_ref()?.max_window_over_mir))
                .collect(),
        ),
        requests_p99_ms: max_of(
            reports
                .iter()
                .filter_map(|r| Some(r.requests.as_ref()?.p99_ms))
                .collect(),
        ),
    };
    (reports, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_window_is_found_and_a_short_download_is_its_own_window() {
        let bin = Duration::from_millis(100);
        // 10 bins: 1,000 bytes each but 3,000 in bins 4 and 5.
        let mut bins = vec![1_000u64; 10];
        bins[4] = 3_000;
        bins[5] = 3_000;
        // Busiest 2 bins: 6,000 bytes in 0.2 s = 240,000 bit/s.
        assert_eq!(max_window(&bins, 2, bin), 240_000.0);
        // A window longer than the download covers all of it: 14,000 bytes in 1 s.
        assert_eq!(max_window(&bins, 50, bin), 112_000.0);
        assert_eq!(max_window(&[], 50, bin), 0.0);
    }

    #[test]
    fn goodput_per_weight_is_fair_when_it_follows_the_weights() {
        let bin = Duration::from_millis(100);
        let rates = |w| TerminalRates {
            mir_bps: 8e6,
            cir_bps: 0.0,
            weight: w,
        };
        // Two downloads, the second getting twice the bytes per bin, for 2 s; the first
        // bin is warm-up and the last a partial one.
        let dl = |per_bin: u64| TerminalTraffic {
            download: Some((
                Outcome {
                    bytes: per_bin * 20,
                    intact: Some(true),
                    ..Default::default()
                },
                vec![per_bin; 20],
            )),
            ..Default::default()
        };
        let traffic = [dl(10_000), dl(20_000)];
        let spec = TrafficSpec {
            activities: Vec::new(),
            amount: Amount::Seconds(2.0),
            request: (1000, 1000),
            request_every: Duration::from_millis(200),
            bin,
            max_duration: Duration::from_secs(10),
        };
        let w = Windows {
            bin,
            warmup: bin,
            mir_window: Duration::from_secs(1),
        };
        let (reports, summary) = summarise(&traffic, &[rates(1), rates(2)], 20e6, &spec, w);
        let d = |k: usize| reports[k].download.as_ref().expect("download");
        assert_eq!(d(0).steady_goodput_bps, 800_000.0);
        assert_eq!(d(1).steady_goodput_bps, 1_600_000.0);
        assert_eq!(d(1).max_window_bps, 1_600_000.0);
        assert_eq!(d(1).max_window_over_mir, 0.2);
        assert_eq!(d(0).steady_over_entitled, 0.1);
        assert_eq!(summary.jain_goodput_per_weight, Some(1.0));
        assert!(summary.all_exact);
        assert_eq!(summary.requests_p99_ms, None);
    }
}
