//! End-to-end benchmark suites over the netns testbed (root needed):
//!
//!     cargo bench --bench e2e -- <lawson|nasa|geo-short|emu> [--runs N] [--seconds S] [--max-seconds S] [--modes plain-cubic,plain-bbr,pepd]
//!
//! Modes: end-to-end TCP on CUBIC and on BBR (the gateways route), and pepd on both gateways
//! (the `pepd` Cargo builds with the bench, or `$PEPD_BIN`).
//!
//! Each cell (mode × condition) runs several times with different link seeds; the harness
//! prints every run as a JSON line, then writes `target/bench/<suite>-runs.csv`,
//! `<suite>-summary.csv` (mean, SD, 95 % CI) and `<suite>.svg` (plotters).

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::builder::RangedU64ValueParser;
use clap::{Parser, ValueEnum};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::pepd::PepdOptions;
use pep_testbed::runner::{self, Mode, RunResult, RunSpec};
use pep_testbed::xfer::{Amount, Workload};
use pep_testbed::Profile;
use plotters::prelude::*;

const MODES: [Mode; 3] = [Mode::PlainCubic, Mode::PlainBbr, Mode::Pepd];

/// The bench's arguments (after `--` on the `cargo bench` command line).
#[derive(clap::Parser)]
#[command(
    bin_name = "cargo bench --bench e2e --",
    about = "End-to-end benchmark suites over the netns testbed (root needed)"
)]
struct Opts {
    #[arg(value_enum)]
    suite: Suite,
    /// Runs per cell, each with different link seeds.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..)
    )]
    runs: usize,
    /// Length of the lawson bulk downloads; the emu suite sends for at most 10 s of it.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    seconds: f64,
    /// Cap on each run's duration.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    max_seconds: f64,
    /// The modes to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        ignore_case = true,
        default_value = "plain-cubic,plain-bbr,pepd"
    )]
    modes: Vec<Mode>,
    /// `cargo bench` passes `--bench` to every bench target; it means nothing here.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Suite {
    Lawson,
    Nasa,
    GeoShort,
    Emu,
}

impl Suite {
    /// The name on the command line, which also names the output files.
    fn name(self) -> String {
        self.to_possible_value()
            .expect("no suite is skipped")
            .get_name()
            .to_owned()
    }
}

/// The daemon the pepd mode runs: `$PEPD_BIN`, else the one built with this bench.
fn pepd_options() -> PepdOptions {
    PepdOptions {
        binary: Some(
            std::env::var_os("PEPD_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pepd"))),
        ),
        ..Default::default()
    }
}

/// One cell of a suite: a condition (x axis) under one mode.
struct Cell {
    label: String,
    profile: Profile,
    link: LinkArgs,
    workload: Workload,
}

fn ber_label(ber: f64) -> String {
    if ber == 0.0 {
        "0".into()
    } else {
        format!("{ber:e}")
    }
}

fn bulk_cells(profile: Profile, bers: &[f64], workload: Workload) -> Vec<Cell> {
    bers.iter()
        .map(|&ber| Cell {
            label: ber_label(ber),
            profile,
            link: LinkArgs {
                ber: Some(ber),
                ..Default::default()
            },
            workload: workload.clone(),
        })
        .collect()
}

fn geo_short_cells() -> Vec<Cell> {
    let mut cells: Vec<Cell> = [
        ("rr-10KB", 10_000),
        ("rr-100KB", 100_000),
        ("rr-1MB", 1_000_000),
    ]
    .into_iter()
    .map(|(label, response)| Cell {
        label: label.into(),
        profile: Profile::Geo,
        link: LinkArgs::default(),
        workload: Workload::Rr {
            request: 200,
            response,
            repeat: 5,
        },
    })
    .collect();
    cells.push(Cell {
        label: "page".into(),
        profile: Profile::Geo,
        link: LinkArgs::default(),
        workload: Workload::Page,
    });
    cells
}

/// Per cell and mode: the runs' results.
type Results = Vec<(String, Mode, Vec<RunResult>)>;

fn run_cells(cells: &[Cell], o: &Opts) -> anyhow::Result<Results> {
    let mut all = Vec::new();
    for cell in cells {
        for &mode in &o.modes {
            let mut runs = Vec::new();
            for run in 0..o.runs {
                let mut link = cell.link.apply(cell.profile.link())?;
                // A different impairment realisation per run; the same ones for each mode.
                link.seed = 1000 + run as u64;
                let spec = RunSpec {
                    profile: cell.profile,
                    link,
                    link_kind: Default::default(),
                    mode,
                    workload: cell.workload.clone(),
                    max_duration: Duration::from_secs_f64(o.max_seconds),
                    seed: 1 + run as u64,
                    ipv6: false,
                    pepd: pepd_options(),
                    split: Default::default(),
                    cross: Default::default(),
                    timeline: false,
                    settle: Duration::ZERO,
                    content: pep_testbed::corpus::Content::Random,
                };
                let r = runner::run(&spec)?;
                println!("{}", serde_json::to_string(&r)?);
                runs.push(r);
            }
            all.push((cell.label.clone(), mode, runs));
        }
    }
    Ok(all)
}

/// Mean, sample SD and 95 % confidence half-width (Student t).
fn summarise(xs: &[f64]) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0, 0.0);
    }
    let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    const T95: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    let t = T95.get(xs.len() - 2).copied().unwrap_or(2.0);
    (mean, sd, t * sd / n.sqrt())
}

/// The figure of merit of a run: goodput for bulk; for short transfers the mean
/// per-request latency (rr) or the whole page's load time (page).
fn metric(r: &RunResult, short: bool) -> f64 {
    match (&r.workload, short) {
        (_, false) => r.outcome.goodput_bps,
        (Workload::Rr { .. }, true) if !r.outcome.latencies_s.is_empty() => {
            r.outcome.latencies_s.iter().sum::<f64>() / r.outcome.latencies_s.len() as f64
        }
        _ => r.outcome.completion_s,
    }
}

fn out_dir() -> anyhow::Result<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

fn write_csv(suite: &str, res: &Results, short: bool) -> anyhow::Result<()> {
    let dir = out_dir()?;
    let mut runs = String::from(
        "suite,condition,mode,run,goodput_bps,ref_bps,efficiency,completion_s,bytes,intact,capped,latency_median_s\n",
    );
    let mut summary = String::from(
        "suite,condition,mode,metric,n,mean,sd,ci95,mean_efficiency,ref_bps,capped_runs,failed_runs\n",
    );
    for (label, mode, rs) in res {
        for (i, r) in rs.iter().enumerate() {
            let mut lat = r.outcome.latencies_s.clone();
            lat.sort_by(f64::total_cmp);
            let median = lat.get(lat.len() / 2).copied().unwrap_or(f64::NAN);
            writeln!(
                runs,
                "{suite},{label},{},{i},{:.0},{:.0},{:.4},{:.3},{},{},{},{:.3}",
                mode.as_str(),
                r.outcome.goodput_bps,
                r.ref_bps,
                r.efficiency,
                r.outcome.completion_s,
                r.outcome.bytes,
                r.outcome.intact.map_or("unknown".into(), |b| b.to_string()),
                r.outcome.capped,
                median
            )?;
        }
        let xs: Vec<f64> = rs.iter().map(|r| metric(r, short)).collect();
        let (mean, sd, ci) = summarise(&xs);
        let eff = rs.iter().map(|r| r.efficiency).sum::<f64>() / rs.len() as f64;
        let capped = rs.iter().filter(|r| r.outcome.capped).count();
        let failed = rs
            .iter()
            .filter(|r| r.outcome.intact == Some(false) || r.outcome.error.is_some())
            .count();
        writeln!(
            summary,
            "{suite},{label},{},{},{},{mean:.4},{sd:.4},{ci:.4},{eff:.4},{:.0},{capped},{failed}",
            mode.as_str(),
            match (&rs.first().map(|r| &r.workload), short) {
                (_, false) => "goodput_bps",
                (Some(Workload::Rr { .. }), true) => "mean_request_latency_s",
                _ => "completion_s",
            },
            rs.len(),
            rs.first().map_or(0.0, |r| r.ref_bps),
        )?;
        eprintln!(
            "{suite} {label:>9} {:<11} mean {mean:.4e} sd {sd:.3e} ci95 ±{ci:.3e} eff {eff:.3} capped {capped}/{} failed {failed}",
            mode.as_str(),
            rs.len()
        );
    }
    fs::write(dir.join(format!("{suite}-runs.csv")), runs)?;
    fs::write(dir.join(format!("{suite}-summary.csv")), summary)?;
    Ok(())
}

fn plot(suite: &str, res: &Results, short: bool, title: &str) -> anyhow::Result<()> {
    let path = out_dir()?.join(format!("{suite}.svg"));
    let labels: Vec<String> = {
        let mut l: Vec<String> = Vec::new();
        for (label, _, _) in res {
            if !l.contains(label) {
                l.push(label.clone());
            }
        }
        l
    };
    let scale = if short { 1.0 } else { 1e-6 };
    let points = |mode: Mode| -> Vec<(f64, f64, f64)> {
        res.iter()
            .filter(|(_, m, _)| *m == mode)
            .filter_map(|(label, _, rs)| {
                let x = labels.iter().position(|l| l == label)? as f64;
                let (mean, _, ci) =
                    summarise(&rs.iter().map(|r| metric(r, short)).collect::<Vec<_>>());
                Some((x, mean * scale, ci * scale))
            })
            .collect()
    };
    let refs: Vec<(f64, f64)> = labels
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let r = res.iter().find(|(label, _, _)| label == l)?.2.first()?;
            Some((i as f64, r.ref_bps * scale))
        })
        .collect();
    let ymax = res
        .iter()
        .flat_map(|(_, _, rs)| rs.iter().map(|r| metric(r, short) * scale))
        .chain(refs.iter().filter(|_| !short).map(|r| r.1))
        .fold(0.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(&path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(labels.len() as f64 - 0.5), 0f64..ymax.max(1e-9))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_labels(labels.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc(if short { "workload" } else { "BER" })
        .y_desc(if short {
            "completion time (s)"
        } else {
            "goodput (Mb/s)"
        })
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !short {
        chart
            .draw_series(LineSeries::new(refs.clone(), BLACK.stroke_width(1)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label("reference (ideal TCP)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
    }
    for (mode, colour) in MODES.into_iter().zip([RED, BLUE, GREEN]) {
        let pts = points(mode);
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                colour.stroke_width(2),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(mode.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
        chart
            .draw_series(pts.iter().map(|p| {
                ErrorBar::new_vertical(p.0, p.1 - p.2, p.1, p.1 + p.2, colour.filled(), 8)
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Emulator load: UDP through the nasa link (100 Mb/s, 250 ms) at the full rate, with
/// full-size and with small packets, reporting delivered rate, packets in flight and CPU.
fn emu_suite(o: &Opts) -> anyhow::Result<()> {
    use pep_testbed::topology::{HostTuning, Topology};
    use pep_testbed::{addr, in_netns, udp};
    let mut csv = String::from(
        "payload_bytes,offered_bps,sent,received,delivered_ip_bps,in_flight_peak,emu_cpu_s,elapsed_s,cpu_share,queue_drops,write_errors\n",
    );
    for payload in [1472usize, 472, 172, 100] {
        let link = Profile::Nasa.link();
        let topo = Topology::up(
            &link,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
        )?;
        let epoch = topo.emulator().context("emulator")?.start_time();
        let dst = std::net::SocketAddr::new(addr::SERVER_V4.into(), 9000);
        let server = topo.names.server.clone();
        let rx = std::thread::spawn(move || {
            in_netns(&server, move || {
                udp::receive(
                    dst,
                    epoch,
                    Duration::from_millis(1500),
                    Duration::from_secs(120),
                )
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        let ip = payload + udp::IPV4_UDP_OVERHEAD;
        // Offer exactly the link rate: the question is whether the emulator keeps up.
        let pps = 100e6 / (ip as f64 * 8.0);
        let spec = udp::SendSpec {
            dst,
            payload,
            count: (pps * o.seconds.min(10.0)) as u64,
            pps,
            epoch,
        };
        let t0 = Instant::now();
        let sent = in_netns(&topo.names.client, move || udp::send(&spec))??;
        let send_s = t0.elapsed().as_secs_f64();
        let arrivals = rx
            .join()
            .map_err(|_| anyhow::anyhow!("receiver panicked"))???;
        let mut topo = topo;
        let stats = topo.stop_emulator().context("stats")?;
        // CPU over the busy period only: the emulator's own threads, whole run.
        let rate = udp::ip_rate_bps(&arrivals);
        let line = format!(
            "{payload},{:.0},{sent},{},{rate:.0},{},{:.3},{:.3},{:.3},{},{}",
            sent as f64 * ip as f64 * 8.0 / send_s,
            arrivals.len(),
            stats.ret.in_flight_peak_packets,
            stats.cpu_s,
            stats.elapsed_s,
            stats.cpu_s / send_s,
            stats.ret.dropped.queue,
            stats.ret.dropped.write_error,
        );
        eprintln!("{line}");
        csv.push_str(&line);
        csv.push('\n');
    }
    let path = out_dir()?.join("emu.csv");
    fs::write(&path, csv)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let o = Opts::parse();
    let (cells, short, title) = match o.suite {
        Suite::Lawson => (
            bulk_cells(
                Profile::Lawson,
                &[0.0, 1e-8, 1e-7, 1e-6, 1e-5],
                Workload::Download(Amount::Seconds(o.seconds)),
            ),
            false,
            "lawson: 1.544 Mb/s, 285 ms one-way, bulk download",
        ),
        Suite::Nasa => (
            bulk_cells(
                Profile::Nasa,
                &[0.0, 1e-7, 1e-5],
                Workload::Download(Amount::Bytes(100_000_000)),
            ),
            false,
            "nasa: 100 Mb/s, 250 ms one-way, 100 MB download",
        ),
        Suite::GeoShort => (
            geo_short_cells(),
            true,
            "geo: 20/2 Mb/s, 300 ms one-way, short transfers",
        ),
        Suite::Emu => return emu_suite(&o),
    };
    let suite = o.suite.name();
    let res = run_cells(&cells, &o)?;
    write_csv(&suite, &res, short)?;
    plot(&suite, &res, short, title)?;
    Ok(())
}
