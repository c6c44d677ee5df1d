//! `pep-testbed soak`: mixed traffic through the pepd pair for a set time (bulk both ways,
//! request/response, short flows, half-closes, client resets), each gateway sampled every
//! few seconds (resident size, open descriptors, flows, accounted memory) into soak.csv
//! and soak.svg. At the end every transfer must have been byte-exact; each gateway's flow
//! counter must equal the connections the clients made, and its relay byte counters the
//! bytes the clients sent and received, exactly; both gateways' descriptors must be back to
//! their count before the traffic. It reports the resident size's slope over the end of
//! the run in % of the memory budget per hour.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::pepd::{fetch_metrics, PepdOptions, PepdTestbed, Side};
use pep_testbed::xfer::client::{self, ClientOpts};
use pep_testbed::xfer::pattern::Pattern;
use pep_testbed::xfer::proto::{HEADER_LEN, REPORT_LEN};
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
    /// Fail when a gateway's resident size grew faster than this, in % of its memory budget
    /// per hour, over the slope's window (the last 20 minutes, or the last 2/3 of a shorter
    /// run).
    #[arg(long, value_name = "PCT")]
    max_rss_slope: Option<f64>,
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

/// The reset's exchange: one request answered before the client resets.
const RESET_REQUEST: usize = 200;
const RESET_RESPONSE: usize = 2_000;

/// Bytes a completed transfer of `w` carried up (client to server) and down, headers and
/// reports included: what the gateways' relays must have counted for it. None for a
/// workload the mix does not use.
fn wire_bytes(w: Option<&Workload>) -> Option<(u64, u64)> {
    let (header, report) = (HEADER_LEN as u64, REPORT_LEN as u64);
    let rr = |request: usize, response: usize, repeat: usize| {
        let repeat = repeat as u64;
        (
            header + repeat * (8 + request as u64),
            repeat * response as u64,
        )
    };
    let Some(w) = w else {
        return Some(rr(RESET_REQUEST, RESET_RESPONSE, 1));
    };
    Some(match w {
        Workload::Bidir { up, down } => (header + up, down + report),
        Workload::Rr {
            request,
            response,
            repeat,
        } => rr(*request, *response, *repeat),
        Workload::Download(Amount::Bytes(n)) => (header, *n),
        Workload::HalfClose { up, down } => (header + up, *down),
        Workload::Upload(Amount::Bytes(n)) => (header + n, report),
        _ => return None,
    })
}

/// One request answered, then a reset while the server waits for the next: the bytes each
/// way are known exactly, as for the other transfers.
fn exchange_then_reset(o: &ClientOpts) -> Result<(), String> {
    let deadline = Instant::now() + o.max_duration;
    let mut s = client::rr_open(o, o.seed, deadline).map_err(|e| format!("connect: {e}"))?;
    let (mut up, mut down) = (Pattern::new(o.seed, 0), Pattern::new(o.seed, 1));
    let (_, intact) = client::exchange(
        &mut s,
        &mut up,
        &mut down,
        RESET_REQUEST,
        RESET_RESPONSE,
        deadline,
    )
    .map_err(|e| format!("reset's exchange: {e}"))?;
    if !intact {
        return Err("reset's exchange: corrupted".into());
    }
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .map_err(|e| e.to_string())
}

/// Least-squares slope of the resident size over the samples from `from_s` on, in bytes
/// per second (None with fewer than two samples there).
fn rss_slope(samples: &[Sample], from_s: f64) -> Option<f64> {
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.t_s >= from_s)
        .map(|s| (s.t_s, s.rss as f64))
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Where the slope's window starts: 20 minutes before the end of the traffic, or its last
/// 2/3 when the run is shorter than 30 minutes (the first third is the warm-up).
fn slope_window_start(traffic_s: f64) -> f64 {
    (traffic_s - 1200.0).max(traffic_s / 3.0)
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
    let results: Vec<(u64, Carried)> = tb.in_client(move || {
        let workers: Vec<_> = (0..concurrency)
            .map(|w| {
                thread::spawn(move || {
                    let mut out = Vec::new();
                    let mut i = w;
                    while Instant::now() < deadline {
                        out.push((i, transfer(i, to)));
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
    let traffic_s = t0.elapsed().as_secs_f64();
    let connections = results.len() as f64;
    let (sent, received) = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .fold((0u64, 0u64), |(u, d), (up, down)| (u + up, d + down));

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

    let counted: Vec<Counters> = gateways
        .iter()
        .map(|(side, _, ns)| Counters::fetch(*side, ns))
        .collect::<anyhow::Result<_>>()?;
    let failed: Vec<&(u64, Carried)> = results.iter().filter(|(_, r)| r.is_err()).collect();
    let window_from = slope_window_start(traffic_s);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{} connections in {traffic_s:.0} s ({} failed); server saw {} accepted; clients sent \
         {sent} B and received {received} B",
        results.len(),
        failed.len(),
        server.accepted().len()
    );
    let mut slopes = Vec::new();
    for (i, (side, _, _)) in gateways.iter().enumerate() {
        let peak = series[i].iter().map(|s| s.rss).max().unwrap_or(0);
        let c = &counted[i];
        // Samples stop at the end of the traffic, so the window ends there too.
        let traffic: Vec<Sample> = series[i]
            .iter()
            .copied()
            .filter(|s| s.t_s <= traffic_s)
            .collect();
        let slope = rss_slope(&traffic, window_from).map(|b| b * 3600.0 / c.budget * 100.0);
        slopes.push(slope);
        let _ = writeln!(
            report,
            "{side:?}: flows counted {}, relayed to peer {} B, from peer {} B, descriptors \
             {} → {}, RSS {:.1} → {:.1} MiB (peak {:.1}), RSS slope from {window_from:.0} s \
             to {traffic_s:.0} s: {} of the {:.0} MiB budget per hour",
            c.flows,
            c.to_peer,
            c.from_peer,
            baseline[i].fds,
            finals[i].fds,
            baseline[i].rss as f64 / 1048576.0,
            finals[i].rss as f64 / 1048576.0,
            peak as f64 / 1048576.0,
            slope.map_or("n/a".into(), |p| format!("{p:+.3} %")),
            c.budget / 1048576.0
        );
    }
    print!("{report}");
    if let Some((i, Err(e))) = failed.first() {
        bail!("{} transfers failed, e.g. #{i}: {e}", failed.len());
    }
    for (i, (side, _, _)) in gateways.iter().enumerate() {
        let c = &counted[i];
        if c.flows != connections {
            bail!(
                "{side:?} counted {} flows, the clients made {connections}",
                c.flows
            );
        }
        // The terminal relays what the clients send to its peer; the hub relays it from
        // its peer to the server, and the replies the other way.
        let (to_peer, from_peer) = match side {
            Side::Terminal => (sent, received),
            Side::Hub => (received, sent),
        };
        if (c.to_peer, c.from_peer) != (to_peer as f64, from_peer as f64) {
            bail!(
                "{side:?} relayed {} B to its peer and {} B from it; the clients sent {sent} B \
                 and received {received} B",
                c.to_peer,
                c.from_peer
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
        if let (Some(max), Some(slope)) = (args.max_rss_slope, slopes[i]) {
            if slope > max {
                bail!("{side:?}'s RSS grew {slope:.3} % of its budget per hour, over {max} %");
            }
        }
    }
    Ok(())
}

/// What a transfer carried up and down, or why it failed.
type Carried = Result<(u64, u64), String>;

/// One transfer of the mix, checked: the bytes it carried up and down, or why it failed.
fn transfer(i: u64, to: SocketAddr) -> Carried {
    let wl = workload(i);
    let opts = ClientOpts {
        server: to,
        cc: None,
        seed: 1_000_000 + i,
        max_duration: Duration::from_secs(300),
    };
    let bytes =
        wire_bytes(wl.as_ref()).ok_or_else(|| format!("{wl:?} is not in the soak's mix"))?;
    match wl {
        None => exchange_then_reset(&opts)?,
        Some(wl) => {
            let o = client::run(&wl, &opts);
            match (o.error, o.capped, o.intact) {
                (Some(e), _, _) => return Err(format!("{wl:?}: {e}")),
                (None, true, _) => return Err(format!("{wl:?}: capped")),
                (None, false, Some(false)) => return Err(format!("{wl:?}: corrupted")),
                _ => {}
            }
        }
    }
    Ok(bytes)
}

/// A gateway's totals at the end of the run.
struct Counters {
    /// Flows it relayed: intercepted at the terminal, opened by the peer at the hub.
    flows: f64,
    to_peer: f64,
    from_peer: f64,
    budget: f64,
}

impl Counters {
    fn fetch(side: Side, ns: &str) -> anyhow::Result<Counters> {
        let text = fetch_metrics(ns)?;
        let get = |series: &str| metric(&text, series).with_context(|| format!("no {series}"));
        let origin = match side {
            Side::Terminal => "intercepted",
            Side::Hub => "peer",
        };
        Ok(Counters {
            flows: get(&format!("pepd_flows_total{{origin=\"{origin}\"}}"))?,
            to_peer: get("pepd_relay_bytes_total{direction=\"to_peer\"}")?,
            from_peer: get("pepd_relay_bytes_total{direction=\"from_peer\"}")?,
            budget: get("pepd_memory_budget_bytes")?,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transfer_of_the_mix_has_known_bytes() {
        for i in 0..6 {
            assert!(wire_bytes(workload(i).as_ref()).is_some(), "#{i}");
        }
        assert_eq!(wire_bytes(None), Some((40 + 8 + 200, 2_000)));
        assert_eq!(
            wire_bytes(Some(&Workload::Bidir { up: 5, down: 7 })),
            Some((45, 24))
        );
    }

    #[test]
    fn slope_is_the_least_squares_fit_over_the_window() {
        let at = |t_s: f64, rss: u64| Sample {
            t_s,
            rss,
            ..Default::default()
        };
        // A warm-up jump, then 10 B/s.
        let s = [
            at(0.0, 0),
            at(10.0, 5_000),
            at(20.0, 5_100),
            at(30.0, 5_200),
        ];
        assert_eq!(rss_slope(&s, 10.0), Some(10.0));
        assert_eq!(rss_slope(&s, 30.0), None);
        assert_eq!(slope_window_start(180.0), 60.0);
        assert_eq!(slope_window_start(1800.0), 600.0);
    }
}
