//! `pep-testbed demo`: the one-command answer to "what does pepd buy me?". Runs the same
//! downloads and page load over an emulated satellite link twice — plain end-to-end TCP
//! (kernel CUBIC) and through the pepd gateway pair — and prints, writes as JSON and charts
//! the completion times side by side. Two rows show what pepd exists for beyond a clean
//! link: the same link losing packets to bit errors (BER 1e-6), and the link in a rain fade
//! below the rate pepd was set up for, where what counts is the latency of small requests
//! beside a download.
//!
//! Every measurement is one [`runner::run`], so each gets a fresh topology: no TCP metrics
//! cache, queue or association state carries over from one transfer to the next, and the
//! demo measures exactly what `pep-testbed run` would.

mod chart;
mod report;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pep_linkemu::LinkConfig;
use pep_testbed::pepd::{locate_pepd, PepdOptions};
use pep_testbed::runner::{self, Mode, RunResult, RunSpec};
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::{Amount, Workload};
use pep_testbed::Profile;

use report::{Report, Row};

/// The modes compared, in table order: the baseline first.
const MODES: [Mode; 2] = [Mode::PlainCubic, Mode::Pepd];

/// A transfer still running after this long is a failure (the slowest default one, 20 MB
/// over plain CUBIC on the geo link, takes well under a minute).
const TRANSFER_CAP: Duration = Duration::from_secs(180);

#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Link profile to emulate.
    #[arg(long, value_enum, default_value_t = Profile::Geo)]
    profile: Profile,
    /// Directory for demo.json and demo.svg (created if missing).
    #[arg(long, value_name = "DIR", default_value = "demo-out")]
    out: PathBuf,
    /// Measure every transfer this many times per mode; the table shows medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    repeat: u32,
    /// Skip the 20 MB download (the longest part).
    #[arg(long)]
    quick: bool,
    /// The pepd executable (default: $PEPD_BIN, else `pepd` beside this program).
    #[arg(long = "pepd", value_name = "PATH")]
    pepd: Option<PathBuf>,
}

/// One thing the demo transfers, and on what.
#[derive(Clone, Debug)]
struct Case {
    label: &'static str,
    workload: Workload,
    /// What the row shows.
    metric: Metric,
    /// The link as the profile has it, or changed.
    link: LinkChange,
    /// Plain TCP may be cut at this time (it then shows as capped); pepd never may.
    plain_cap: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LinkChange {
    None,
    /// Bit errors at this rate, both directions.
    Ber(f64),
    /// The forward link at this rate while pepd is set up for the profile's.
    Fade {
        forward_bps: f64,
    },
}

/// The figure a row compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// From connect to the last verified byte.
    Completion,
    /// 95th percentile of the requests' latencies (interactive workload).
    RequestP95,
}

/// Bytes of the lossy and fade rows' downloads.
const SIDE_ROW_BYTES: u64 = 5_000_000;
/// Plain TCP's time limit on the lossy link (it would need minutes).
const LOSSY_PLAIN_CAP: Duration = Duration::from_secs(15);
/// How long the gateways are up before the fade row's traffic: pepd measures the link in
/// the first round trip of an association.
const FADE_SETTLE: Duration = Duration::from_secs(2);

fn cases(quick: bool) -> Vec<Case> {
    let download = |label, bytes| Case {
        label,
        workload: Workload::Download(Amount::Bytes(bytes)),
        metric: Metric::Completion,
        link: LinkChange::None,
        plain_cap: None,
    };
    let mut v = vec![
        download("download 100 kB", 100_000),
        download("download 1 MB", 1_000_000),
    ];
    if !quick {
        v.push(download("download 20 MB", 20_000_000));
    }
    v.push(Case {
        label: "web page (16 objects)",
        workload: Workload::Page,
        ..download("", 0)
    });
    v.push(Case {
        label: "5 MB at BER 1e-6",
        link: LinkChange::Ber(1e-6),
        plain_cap: Some(LOSSY_PLAIN_CAP),
        ..download("", SIDE_ROW_BYTES)
    });
    v.push(Case {
        label: "fade: 1 KB requests (p95)",
        workload: Workload::Interactive {
            download: Amount::Bytes(SIDE_ROW_BYTES),
            request: 1000,
            response: 1000,
            every_ms: 200,
        },
        metric: Metric::RequestP95,
        link: LinkChange::Fade { forward_bps: 10e6 },
        plain_cap: None,
    });
    v
}

impl Case {
    fn link(&self, base: &LinkConfig) -> LinkConfig {
        let mut link = base.clone();
        match self.link {
            LinkChange::None => {}
            LinkChange::Ber(ber) => {
                link.forward.impairments.ber = ber;
                link.ret.impairments.ber = ber;
            }
            LinkChange::Fade { forward_bps } => link.forward.rate_bps = forward_bps,
        }
        link
    }

    /// pepd is configured for the profile's link, whatever the emulated link does now.
    fn pepd_options(&self, base: &LinkConfig, binary: PathBuf) -> PepdOptions {
        let provisioned = base.forward.rate_bps as u64;
        let (hub_toml, terminal_toml) = match self.link {
            LinkChange::Fade { .. } => (
                format!("[link]\ntx_rate = {provisioned}"),
                format!("[link]\nrx_rate = {provisioned}"),
            ),
            _ => (String::new(), String::new()),
        };
        PepdOptions {
            binary: Some(binary),
            hub_toml,
            terminal_toml,
            ..Default::default()
        }
    }

    fn cap(&self, mode: Mode) -> Duration {
        match (mode, self.plain_cap) {
            (Mode::PlainCubic | Mode::PlainBbr, Some(cap)) => cap,
            _ => TRANSFER_CAP,
        }
    }

    fn settle(&self) -> Duration {
        match self.link {
            LinkChange::Fade { .. } => FADE_SETTLE,
            _ => Duration::ZERO,
        }
    }
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if !nix::unistd::geteuid().is_root() {
        bail!("the demo builds network namespaces: run it as root");
    }
    // Fail before building anything if the pepd half cannot run.
    let pepd = locate_pepd(args.pepd.as_deref())?;
    fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let link = args.profile.link();
    let cases = cases(args.quick);
    let total = cases.len() * MODES.len() * args.repeat as usize;
    eprintln!(
        "pep-testbed demo: {} profile, {} transfers (pepd: {})",
        args.profile,
        total,
        pepd.display()
    );
    let mut rows: Vec<Row> = cases.iter().map(|c| Row::new(c.label, c.metric)).collect();
    let mut runs = Vec::new();
    let mut done = 0;
    // Repeats outermost and modes innermost, so a slow spell on a shared machine hits
    // both modes of a workload alike rather than one mode's whole series.
    for rep in 0..args.repeat {
        for (case, row) in cases.iter().zip(rows.iter_mut()) {
            for mode in MODES {
                done += 1;
                let spec = RunSpec {
                    profile: args.profile,
                    link: case.link(&link),
                    link_kind: Default::default(),
                    mode,
                    workload: case.workload.clone(),
                    max_duration: case.cap(mode),
                    seed: u64::from(rep) + 1,
                    ipv6: false,
                    pepd: case.pepd_options(&link, pepd.clone()),
                    split: Default::default(),
                    cross: Default::default(),
                    timeline: false,
                    settle: case.settle(),
                    content: pep_testbed::corpus::Content::Random,
                };
                let r = runner::run(&spec)
                    .with_context(|| format!("{} over {}", case.label, mode.as_str()))?;
                let may_cap = case.plain_cap.is_some() && mode != Mode::Pepd;
                verify(&r, may_cap).with_context(|| {
                    format!(
                        "{} over {} failed verification; result:\n{}",
                        case.label,
                        mode.as_str(),
                        serde_json::to_string_pretty(&r).unwrap_or_else(|e| e.to_string())
                    )
                })?;
                eprintln!(
                    "[{done}/{total}] {:<26} {:<11} {:>7.2} s  {:>7.2} Mb/s  verified{}",
                    case.label,
                    mode.as_str(),
                    r.outcome.completion_s,
                    r.outcome.goodput_bps / 1e6,
                    if r.outcome.capped { " (capped)" } else { "" }
                );
                row.record(mode, &r.outcome);
                runs.push(r);
            }
        }
    }
    let report = Report::new(args.profile, &link, args.repeat, rows, runs, started);
    print!("{}", report.table());
    let json = args.out.join("demo.json");
    fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let svg = args.out.join("demo.svg");
    chart::draw(&svg, &report).with_context(|| format!("drawing {}", svg.display()))?;
    eprintln!(
        "wrote {} and {} ({:.0} s in all)",
        json.display(),
        svg.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A number is only printed for a transfer that delivered every byte it should have, intact:
/// the traffic tool verified each byte against the pattern, and a download's digest must
/// equal the one computed here independently of the receiver. A transfer that `may_cap`
/// may instead be cut by its time limit, every byte that arrived by then verified.
fn verify(r: &RunResult, may_cap: bool) -> anyhow::Result<()> {
    let o = &r.outcome;
    if let Some(e) = &o.error {
        bail!("transfer error: {e}");
    }
    if o.intact != Some(true) {
        bail!("payload did not verify (intact = {:?})", o.intact);
    }
    if o.capped {
        if may_cap {
            return Ok(());
        }
        bail!("still running at its time limit");
    }
    if let Workload::Interactive { .. } = r.workload {
        if o.latencies_s.is_empty() {
            bail!("no request was answered");
        }
    }
    let downloaded = match r.workload {
        Workload::Download(Amount::Bytes(n)) => Some(n),
        Workload::Interactive {
            download: Amount::Bytes(n),
            ..
        } => Some(n),
        _ => None,
    };
    if let Some(n) = downloaded {
        if o.bytes != n {
            bail!("received {} of {n} bytes", o.bytes);
        }
        let want = expected_digest(r.seed, 1, n).hex();
        if o.down_digest.as_deref() != Some(want.as_str()) {
            bail!(
                "payload digest {:?}, expected {want}",
                o.down_digest.as_deref()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pep_testbed::xfer::Outcome;

    fn result(workload: Workload, outcome: Outcome) -> RunResult {
        RunResult {
            profile: Profile::Geo,
            link: Default::default(),
            mode: Mode::Pepd,
            workload,
            ipv6: false,
            seed: 3,
            content: pep_testbed::corpus::info(pep_testbed::corpus::Content::Random)
                .expect("random needs no corpus"),
            content_ratio: 1.0,
            outcome,
            ref_bps: 0.0,
            efficiency: 0.0,
            forward: (&Profile::Geo.link().forward).into(),
            ret: (&Profile::Geo.link().ret).into(),
            emulator: None,
            workload_start_s: 0.0,
            step_responses: Vec::new(),
            cross: None,
            timeline: None,
            pepd_capacity: None,
            pepd_compression: None,
            gateway_cpu: None,
            link_average_bps: 0.0,
            efficiency_of_capacity: 0.0,
            pepd_log_tail: None,
        }
    }

    fn intact_download(n: u64, digest: String) -> Outcome {
        Outcome {
            bytes: n,
            completion_s: 1.0,
            intact: Some(true),
            down_digest: Some(digest),
            ..Default::default()
        }
    }

    #[test]
    fn only_exact_payloads_pass() {
        let n = 5_000;
        let w = Workload::Download(Amount::Bytes(n));
        let good = expected_digest(3, 1, n).hex();
        assert!(verify(&result(w.clone(), intact_download(n, good.clone())), false).is_ok());
        let wrong = expected_digest(3, 1, n - 1).hex();
        assert!(verify(&result(w.clone(), intact_download(n, wrong)), false).is_err());
        assert!(verify(
            &result(w.clone(), intact_download(n - 1, good.clone())),
            false
        )
        .is_err());
        let mut failed = intact_download(n, good);
        failed.error = Some("Connection reset by peer".into());
        assert!(verify(&result(w, failed), false).is_err());
        let capped = Outcome {
            capped: true,
            intact: Some(true),
            ..Default::default()
        };
        assert!(verify(&result(Workload::Page, capped.clone()), false).is_err());
        // Only where the row allows it, and only with what arrived intact.
        assert!(verify(&result(Workload::Page, capped.clone()), true).is_ok());
        let corrupt = Outcome {
            intact: Some(false),
            ..capped
        };
        assert!(verify(&result(Workload::Page, corrupt), true).is_err());
    }

    #[test]
    fn quick_drops_only_the_big_download() {
        assert_eq!(cases(false).len(), 6);
        let quick: Vec<_> = cases(true).iter().map(|c| c.label).collect();
        assert_eq!(quick.len(), 5);
        assert!(!quick.iter().any(|l| l.contains("20 MB")));
    }
}
