//! `pep-testbed demo`: the one-command answer to "what does pepd buy me?". Runs the same
//! downloads and page load over an emulated satellite link twice — plain end-to-end TCP
//! (kernel CUBIC) and through the pepd gateway pair — and prints, writes as JSON and charts
//! the completion times side by side.
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

/// One thing the demo transfers.
#[derive(Clone, Debug)]
struct Case {
    label: &'static str,
    workload: Workload,
}

fn cases(quick: bool) -> Vec<Case> {
    let download = |label, bytes| Case {
        label,
        workload: Workload::Download(Amount::Bytes(bytes)),
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
    });
    v
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
    let mut rows: Vec<Row> = cases.iter().map(|c| Row::new(c.label)).collect();
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
                    link: link.clone(),
                    mode,
                    workload: case.workload.clone(),
                    max_duration: TRANSFER_CAP,
                    seed: u64::from(rep) + 1,
                    ipv6: false,
                    pepd: PepdOptions {
                        binary: Some(pepd.clone()),
                        ..Default::default()
                    },
                    cross: Default::default(),
                    timeline: false,
                    settle: Duration::ZERO,
                };
                let r = runner::run(&spec)
                    .with_context(|| format!("{} over {}", case.label, mode.as_str()))?;
                verify(&r).with_context(|| {
                    format!(
                        "{} over {} failed verification; result:\n{}",
                        case.label,
                        mode.as_str(),
                        serde_json::to_string_pretty(&r).unwrap_or_else(|e| e.to_string())
                    )
                })?;
                eprintln!(
                    "[{done}/{total}] {:<22} {:<11} {:>7.2} s  {:>7.2} Mb/s  verified",
                    case.label,
                    mode.as_str(),
                    r.outcome.completion_s,
                    r.outcome.goodput_bps / 1e6
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
/// equal the one computed here independently of the receiver.
fn verify(r: &RunResult) -> anyhow::Result<()> {
    let o = &r.outcome;
    if let Some(e) = &o.error {
        bail!("transfer error: {e}");
    }
    if o.capped {
        bail!("still running after {TRANSFER_CAP:?}");
    }
    if o.intact != Some(true) {
        bail!("payload did not verify (intact = {:?})", o.intact);
    }
    if let Workload::Download(Amount::Bytes(n)) = r.workload {
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
            mode: Mode::Pepd,
            workload,
            ipv6: false,
            seed: 3,
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
        assert!(verify(&result(w.clone(), intact_download(n, good.clone()))).is_ok());
        let wrong = expected_digest(3, 1, n - 1).hex();
        assert!(verify(&result(w.clone(), intact_download(n, wrong))).is_err());
        assert!(verify(&result(w.clone(), intact_download(n - 1, good.clone()))).is_err());
        let mut failed = intact_download(n, good);
        failed.error = Some("Connection reset by peer".into());
        assert!(verify(&result(w, failed)).is_err());
        let capped = Outcome {
            capped: true,
            intact: Some(true),
            ..Default::default()
        };
        assert!(verify(&result(Workload::Page, capped)).is_err());
    }

    #[test]
    fn quick_drops_only_the_big_download() {
        assert_eq!(cases(false).len(), 4);
        let quick: Vec<_> = cases(true).iter().map(|c| c.label).collect();
        assert_eq!(quick.len(), 3);
        assert!(!quick.iter().any(|l| l.contains("20 MB")));
    }
}
