//! `pep-testbed soak`: mixed traffic through the pepd pair for a set time (bulk both ways,
//! request/response, short flows, half-closes, client resets), each gateway sampled every
//! few seconds (resident size, open descriptors, flows, accounted memory) into soak.csv
//! and soak.svg. At the end every transfer must have been byte-exact, each gateway's flow
//! counter must equal the connections the clients made, exactly, and both gateways'
//! descriptors must be back to their count before the traffic.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::pepd::{fetch_metrics, PepdOptions, PepdTestbed, Side};
use pep_testbed::xfer::client::{self, ClientOpts};
use pep_testbed::xfer::{Amount, Workload};
use pep_testbed::{addr, Profile};
use plotters::prelude::*;

#[derive(Clone, Debug, clap::Args)]
pub struct SoakArgs {
    /// Link profile to emulate.
    #[arg(long, value_enum, default_value_t = Profile::Geo)]
    profile: Profile,
    #[command(flatten)]
    link: LinkArgs,
    /// How long new transfers are started.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Client threads, each running one transfer after another.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds between samples.
    #[arg(long, default_value_t = 5.0)]
    sample_s: f64,
    /// Directory for soak.csv and soak.svg (created if missing).
    #[arg(long, value_name = "DIR", default_value = "soak-out")]
    out: PathBuf,
    /// The pepd executable (default: $PEPD_BIN, else `pepd` beside this program).
    #[arg(long = "pepd", value_name = "PATH")]
    pepd: Option<PathBuf>,
}

/// The mix, one after another per client thread; `None` is a client reset.
fn workload(i: u64) -> Option<Workload> {
    Some(match i % 6 {
        0 => Workload::Bidir {
            up: 256_000,
            down: 256_000,
        },
        1 => Workload::Rr {
            request: 200,
            response: 2_000,
            repeat: 5,
        },
        2 => Workload::Download(Amount::Bytes(2_000)),
        3 => Workload::HalfClose {
            up: 10_000,
            down: 100_000,
        },
        4 => Workload::Upload(Amount::Bytes(128_000)),
        _ => return None,
    })
}

/// Connects, sends a little and resets the connection.
fn client_reset(to: SocketAddr) -> Result<(), String> {
    use std::io::Write;
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(20))
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"reset soon").map_err(|e| e.to_string())?;
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    t_s: f64,
    rss: u64,
    fds: u64,
    flows_active: f64,
    accounted: f64,
}

fn rss_and_fds(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok((kib * 1024, fds))
}

/// The value of an unlabelled series, or of `name{label}` with the label written out.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn sample(pid: u32, ns: &str, t0: Instant) -> anyhow::Result<Sample> {
    let (rss, fds) = rss_and_fds(pid)?;
    let text = fetch_metrics(ns)?;
    Ok(Sample {
        t_s: t0.elapsed().as_secs_f64(),
        rss,
        fds,
        flows_active: metric(&text, "pepd_flows_active").unwrap_or(f64::NAN),
        accounted: metric(&text, "pepd_memory_accounted_bytes").unwrap_or(f64::NAN),
    })
}

pub fn run(args: &SoakArgs) -> anyhow::Result<()> {
    let link = args.link.apply(args.profile.link())?;
    let opts = PepdOptions {
        binary: args.pepd.clone(),
        forbid_routed_tcp: true,
        ..Default::default()
    };
    pep_testbed::raise_nofile_limit()?;
    let tb = PepdTestbed::up(&link, &opts)?;
    let server = tb.xfer_server(false, 5001)?;
    let to = SocketAddr::new(addr::server(false), 5001);
    let gateways: Vec<(Side, u32, String)> = Side::BOTH
        .iter()
        .map(|&s| {
            let pid = tb.gateways().pid(s).context("gateway not running")?;
            Ok((s, pid, s.namespace(tb.names()).to_owned()))
        })
        .collect::<anyhow::Result<_>>()?;
    let t0 = Instant::now();
    let baseline: Vec<Sample> = gateways
        .iter()
        .map(|(_, pid, ns)| sample(*pid, ns, t0))
        .collect::<anyhow::Result<_>>()?;

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, gateways) = (done.clone(), gateways.clone());
        let every = Duration::from_secs_f64(args.sample_s);
        thread::spawn(move || -> anyhow::Result<Vec<Vec<Sample>>> {
            let mut series = vec![Vec::new(); gateways.len()];
            while !done.load(Ordering::Relaxed) {
                for (i, (_, pid, ns)) in gateways.iter().enumerate() {
                    series[i].push(sample(*pid, ns, t0)?);
                }
                thread::sleep(every);
            }
            Ok(series)
        })
    };

    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let concurrency = args.concurrency as u64;
    let results: Vec<(u64, Result<(), String>)> = tb.in_client(move || {
        let workers: Vec<_> = (0..concurrency)
            .map(|w| {
                thread::spawn(move || {
                    let mut out = Vec::new();
                    let mut i = w;
                    while Instant::now() < deadline {
                        let r = match workload(i) {
                            Some(wl) => {
                                let o = client::run(
                                    &wl,
                                    &ClientOpts {
                                        server: to,
                                        cc: None,
                                        seed: 1_000_000 + i,
                                        max_duration: Duration::from_secs(300),
                                    },
                                );
                                match (o.error, o.capped, o.intact) {
                                    (Some(e), _, _) => Err(format!("{wl:?}: {e}")),
                                    (None, true, _) => Err(format!("{wl:?}: capped")),
                                    (None, false, Some(false)) => Err(format!("{wl:?}: corrupted")),
                                    _ => Ok(()),
                                }
                            }
                            None => client_reset(to),
                        };
                        out.push((i, r));
                        i += concurrency;
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })?;
    let connections = results.len() as f64;

    // Flows end once their closes are acknowledged across the link.
    let settle = Instant::now() + Duration::from_secs(60);
    let mut finals;
    loop {
        finals = gateways
            .iter()
            .map(|(_, pid, ns)| sample(*pid, ns, t0))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let quiet = finals
            .iter()
            .zip(&baseline)
            .all(|(f, b)| f.flows_active == 0.0 && f.fds == b.fds);
        if quiet || Instant::now() > settle {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    done.store(true, Ordering::Relaxed);
    let mut series = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))??;
    for (s, f) in series.iter_mut().zip(&finals) {
        s.push(*f);
    }

    std::fs::create_dir_all(&args.out)?;
    write_csv(&args.out.join("soak.csv"), &gateways, &series)?;
    draw(&args.out.join("soak.svg"), &gateways, &series)?;

    let counted: Vec<f64> = gateways
        .iter()
        .map(|(side, _, ns)| {
            let text = fetch_metrics(ns)?;
            let origin = match side {
                Side::Terminal => "intercepted",
                Side::Hub => "peer",
            };
            Ok(metric(&text, &format!("pepd_flows_total{{origin=\"{origin}\"}}")).unwrap_or(-1.0))
        })
        .collect::<anyhow::Result<_>>()?;
    let failed: Vec<&(u64, Result<(), String>)> =
        results.iter().filter(|(_, r)| r.is_err()).collect();
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{} connections in {:.0} s ({} failed); server saw {} accepted",
        results.len(),
        args.seconds,
        failed.len(),
        server.accepted().len()
    );
    for (i, (side, _, _)) in gateways.iter().enumerate() {
        let peak = series[i].iter().map(|s| s.rss).max().unwrap_or(0);
        let _ = writeln!(
            report,
            "{side:?}: flows counted {}, descriptors {} → {}, RSS {:.1} → {:.1} MiB (peak {:.1})",
            counted[i],
            baseline[i].fds,
            finals[i].fds,
            baseline[i].rss as f64 / 1048576.0,
            finals[i].rss as f64 / 1048576.0,
            peak as f64 / 1048576.0
        );
    }
    print!("{report}");
    if let Some((i, Err(e))) = failed.first() {
        bail!("{} transfers failed, e.g. #{i}: {e}", failed.len());
    }
    for (i, (side, _, _)) in gateways.iter().enumerate() {
        if counted[i] != connections {
            bail!(
                "{side:?} counted {} flows, the clients made {connections}",
                counted[i]
            );
        }
        if finals[i].fds != baseline[i].fds || finals[i].flows_active != 0.0 {
            bail!(
                "{side:?} still holds {} descriptors ({} before) and {} flows",
                finals[i].fds,
                baseline[i].fds,
                finals[i].flows_active
            );
        }
    }
    Ok(())
}

fn write_csv(
    path: &Path,
    gateways: &[(Side, u32, String)],
    series: &[Vec<Sample>],
) -> anyhow::Result<()> {
    let mut csv = String::from("t_s,gateway,rss_bytes,fds,flows_active,memory_accounted_bytes\n");
    for ((side, _, _), s) in gateways.iter().zip(series) {
        for x in s {
            let _ = writeln!(
                csv,
                "{:.1},{},{},{},{},{}",
                x.t_s,
                side.as_str(),
                x.rss,
                x.fds,
                x.flows_active,
                x.accounted
            );
        }
    }
    std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))
}

/// plotters' errors borrow the backend's; flatten them to text at this edge.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// Resident size of each gateway over time.
fn draw(
    path: &Path,
    gateways: &[(Side, u32, String)],
    series: &[Vec<Sample>],
) -> anyhow::Result<()> {
    let mib = |b: u64| b as f64 / 1048576.0;
    let tmax = series
        .iter()
        .flatten()
        .map(|s| s.t_s)
        .fold(1.0f64, f64::max);
    let ymax = series
        .iter()
        .flatten()
        .map(|s| mib(s.rss))
        .fold(1.0f64, f64::max)
        * 1.2;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("pepd soak: resident size per gateway", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("RSS (MiB)")
        .draw()
        .map_err(plot_err)?;
    let colours = [RGBColor(0x29, 0x80, 0xb9), RGBColor(0xc0, 0x39, 0x2b)];
    for (((side, _, _), s), colour) in gateways.iter().zip(series).zip(colours) {
        chart
            .draw_series(LineSeries::new(
                s.iter().map(|x| (x.t_s, mib(x.rss))),
                colour,
            ))
            .map_err(plot_err)?
            .label(side.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
