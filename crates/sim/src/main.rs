//! `pep-sim bulk …`: runs one simulated bulk transfer and prints a JSON report.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nix::time::{clock_gettime, ClockId};

use pep_sim::channel::{GilbertElliott, Impairments, Outage, OutageSchedule, PeriodicOutage};
use pep_sim::jitter::{JitterConfig, JitterKind};
use pep_sim::link::LinkConfig;
use pep_sim::report;
use pep_sim::schedule::{BerSchedule, DelaySchedule, RateSchedule, Schedule};
use pep_sim::sim::{CrossTraffic, Interactive, Scenario, Simulation, Workload};
use pep_transport::{CcMode, Config, LossCause, SizeMode, TrafficClass, VegasParams};

/// Packets of the `--cross-cubic` flow on the wire: a full-size TCP segment.
const CUBIC_PACKET_BYTES: u64 = 1500;

#[derive(Parser)]
#[command(
    name = "pep-sim",
    version,
    about = "Deterministic satellite-link simulator for pepd's transport"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bulk transfer from gateway A to gateway B over the modelled link.
    Bulk(Box<BulkArgs>),
}

#[derive(Clone, Copy, ValueEnum)]
enum CcArg {
    Adaptive,
    Rate,
    Vegas,
}

#[derive(Clone, Copy)]
struct DatagramSizeArg(SizeMode);

impl std::str::FromStr for DatagramSizeArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adaptive" => Ok(DatagramSizeArg(SizeMode::Adaptive)),
            "mtu" => Ok(DatagramSizeArg(SizeMode::Fixed(usize::MAX))),
            n => n
                .parse()
                .map(|n| DatagramSizeArg(SizeMode::Fixed(n)))
                .map_err(|_| format!("{s:?}: expected adaptive, mtu or a number of bytes")),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LossArg {
    Corruption,
    Congestion,
}

#[derive(clap::Args)]
struct BulkArgs {
    /// Forward (A→B) link rate in bit/s.
    #[arg(long)]
    rate_bps: u64,
    /// Return (B→A) link rate in bit/s [default: the forward rate].
    #[arg(long)]
    return_rate_bps: Option<u64>,
    /// One-way propagation delay in ms, both directions.
    #[arg(long)]
    delay_ms: f64,
    /// Each packet's one-way delay varies within ±this many ms of --delay-ms, both
    /// directions; how it varies is --jitter-kind.
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
    /// --jitter-ms for the return direction only.
    #[arg(long)]
    return_jitter_ms: Option<f64>,
    /// How the delay varies within ±--jitter-ms: `uniform` (each packet on its own; in
    /// order, the delay stays near the top of the bound and packets leave in bunches),
    /// `wander` (a smooth curve over seconds, as a LEO path changes) or `slotted` (packets
    /// leave at slot boundaries 2 × --jitter-ms apart, as on an MF-TDMA return link).
    #[arg(long, default_value = "uniform")]
    jitter_kind: JitterKind,
    /// --jitter-kind for the return direction only.
    #[arg(long)]
    return_jitter_kind: Option<JitterKind>,
    /// Let jitter reorder packets (the uniform kind); otherwise a packet never overtakes
    /// the one before it.
    #[arg(long)]
    reorder: bool,
    /// Bit error rate of the forward link.
    #[arg(long, default_value_t = 0.0)]
    ber: f64,
    /// Bit error rate of the return link [default: the forward BER].
    #[arg(long)]
    return_ber: Option<f64>,
    /// Bernoulli packet loss probability, both directions.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Gilbert-Elliott bursts p,r[,h[,k]], both directions.
    #[arg(long)]
    ge: Option<GilbertElliott>,
    /// IP MTU of the path.
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Bytes the link layer adds to each packet (encapsulation); the senders know it.
    #[arg(long, default_value_t = 0)]
    frame_overhead: u64,
    /// Datagram size: `adaptive` (follows the error rate), `mtu`, or a fixed number of bytes
    /// the transport writes.
    #[arg(long, default_value = "adaptive")]
    datagram_size: DatagramSizeArg,
    /// Run for this many seconds of transfer.
    #[arg(long, conflicts_with = "bytes", required_unless_present = "bytes")]
    seconds: Option<f64>,
    /// Transfer this many bytes in total (split across flows), then finish.
    #[arg(long)]
    bytes: Option<u64>,
    /// Flows per association.
    #[arg(long, default_value_t = 1)]
    flows: usize,
    /// Gateway pairs sharing the link (each with its own congestion control).
    #[arg(long, default_value_t = 1)]
    associations: usize,
    #[arg(long, value_enum, default_value = "adaptive")]
    cc: CcArg,
    #[arg(long, value_enum, default_value = "corruption")]
    loss_default: LossArg,
    /// Rate each sender is configured with [default: the link rate]; set it above the link
    /// rate to model a misconfigured gateway, or divide a shared link.
    #[arg(long)]
    cc_rate_bps: Option<u64>,
    #[arg(long)]
    vegas_alpha: Option<f64>,
    #[arg(long)]
    vegas_beta: Option<f64>,
    #[arg(long)]
    vegas_gamma: Option<f64>,
    /// Drop-tail queue limit in bytes, each direction [default: one forward BDP, at least 64 KB].
    #[arg(long)]
    queue_bytes: Option<u64>,
    /// Outage window START_S+DURATION_S (time from the start of the transfer), both directions.
    #[arg(long)]
    outage: Vec<Outage>,
    /// Periodic outage PERIOD_S+DURATION_S (from the start of the transfer), both directions.
    #[arg(long)]
    outage_every: Option<PeriodicOutage>,
    /// Forward rate over time, SECONDS:BITS[,…] from the start of the transfer, e.g.
    /// 0:20M,30:10M,60:5M,90:20M (ACM steps); --rate-bps before the first step.
    #[arg(long)]
    rate_schedule: Option<RateSchedule>,
    /// One-way delay over time, SECONDS:MS[,…], both directions (LEO path changes).
    #[arg(long)]
    delay_schedule: Option<DelaySchedule>,
    /// Forward BER over time, SECONDS:BER[,…].
    #[arg(long)]
    ber_schedule: Option<BerSchedule>,
    /// Unresponsive cross traffic on the forward link at this rate (bit/s, on the wire).
    #[arg(long)]
    cross_bps: Option<u64>,
    /// Packet size of the cross traffic (bytes on the wire).
    #[arg(long, default_value_t = 1250)]
    cross_packet_bytes: u64,
    /// A loss-based TCP flow (CUBIC, 1500-byte packets) on the forward link from the start,
    /// filling the bottleneck's buffer beside the simulated senders.
    #[arg(long)]
    cross_cubic: bool,
    /// Beside the bulk flows, write a message of --interactive-bytes every this many ms on
    /// its own flow and report its latency.
    #[arg(long)]
    interactive_ms: Option<u64>,
    #[arg(long, default_value_t = 1000)]
    interactive_bytes: usize,
    /// Put the interactive flow in a priority traffic class capped at this rate (bit/s of
    /// stream bytes), ahead of the bulk flows' class (default: one class for every flow).
    #[arg(long)]
    interactive_priority_bps: Option<u64>,
    /// Open the flows this many seconds after the association is established (default: at
    /// once).
    #[arg(long, default_value_t = 0.0)]
    start_after_s: f64,
    /// Include the forward link's timeline (100 ms buckets) in the report.
    #[arg(long)]
    timeline: bool,
    /// ACK every N packets.
    #[arg(long)]
    ack_every: Option<u32>,
    /// ... or after this many ms.
    #[arg(long)]
    ack_delay_ms: Option<u64>,
    /// Disable redundant copies of unacknowledged data on an idle link.
    #[arg(long)]
    no_redundancy: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up after this many simulated seconds of transfer.
    #[arg(long, default_value_t = 3600.0)]
    time_limit_s: f64,
    /// Print the JSON report (the only output format today).
    #[arg(long)]
    json: bool,
}

fn cpu_seconds() -> f64 {
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
        .unwrap_or(0.0)
}

fn scenario(a: &BulkArgs) -> Result<Scenario> {
    if !(0.0..1.0).contains(&a.ber) || a.return_ber.is_some_and(|b| !(0.0..1.0).contains(&b)) {
        bail!("--ber/--return-ber must be in [0, 1)");
    }
    if a.flows == 0 || a.associations == 0 {
        bail!("--flows and --associations must be at least 1");
    }
    let return_rate = a.return_rate_bps.unwrap_or(a.rate_bps);
    let delay = Duration::try_from_secs_f64(a.delay_ms / 1e3).context("--delay-ms")?;
    let bdp = (a.rate_bps as f64 / 8.0 * 2.0 * delay.as_secs_f64()) as u64;
    let queue_bytes = a.queue_bytes.unwrap_or(bdp.max(64 * 1024));
    let handshake_allowance = 4.0 * delay.as_secs_f64() + 2.0 + a.start_after_s;
    // Outage windows are given relative to the transfer; the link's clock starts at the
    // handshake, which takes one round trip.
    let shift = 2.0 * delay.as_secs_f64() + a.start_after_s;
    let outages = OutageSchedule {
        windows: a
            .outage
            .iter()
            .map(|o| Outage {
                start: o.start + Duration::from_secs_f64(shift),
                duration: o.duration,
            })
            .collect(),
        periodic: None,
    };
    let shift = Duration::from_secs_f64(shift);
    let shifted = |s: Option<&Schedule>| s.map(|s| s.shifted(shift)).unwrap_or_default();
    let imp = |ber: f64, ber_schedule: Schedule| Impairments {
        ber,
        loss: a.loss,
        burst: a.ge,
        outages: outages.clone(),
        ber_schedule,
    };
    let mut forward = LinkConfig::fixed(
        a.rate_bps,
        delay,
        queue_bytes,
        imp(a.ber, shifted(a.ber_schedule.as_ref().map(|s| &s.0))),
    );
    forward.rate_schedule = shifted(a.rate_schedule.as_ref().map(|s| &s.0));
    forward.frame_overhead = a.frame_overhead;
    forward.delay_schedule = shifted(a.delay_schedule.as_ref().map(|s| &s.0));
    let mut ret = LinkConfig::fixed(
        return_rate,
        delay,
        (return_rate as f64 / 8.0 * 2.0 * delay.as_secs_f64()).max(64.0 * 1024.0) as u64,
        imp(a.return_ber.unwrap_or(a.ber), Schedule::default()),
    );
    ret.delay_schedule = forward.delay_schedule.clone();
    ret.frame_overhead = a.frame_overhead;
    let jitter = |ms: f64, kind: JitterKind| -> Result<JitterConfig> {
        Ok(JitterConfig {
            kind,
            bound: Duration::try_from_secs_f64(ms / 1e3).context("--jitter-ms")?,
            reorder: a.reorder,
        })
    };
    forward.jitter = jitter(a.jitter_ms, a.jitter_kind)?;
    ret.jitter = jitter(
        a.return_jitter_ms.unwrap_or(a.jitter_ms),
        a.return_jitter_kind.unwrap_or(a.jitter_kind),
    )?;
    if let Some(p) = a.outage_every {
        // The periodic outage counts from the link's start; keep it periodic and accept
        // that its phase includes the handshake.
        forward.impairments.outages.periodic = Some(p);
        ret.impairments.outages.periodic = Some(p);
    }
    let configure = |rate: u64| -> Config {
        let mut c = Config::for_rate(rate);
        c.mtu = a.mtu;
        c.datagram_size = a.datagram_size.0;
        c.frame_overhead = a.frame_overhead as usize;
        c.cc = match a.cc {
            CcArg::Adaptive => CcMode::Adaptive,
            CcArg::Rate => CcMode::Rate,
            CcArg::Vegas => CcMode::Vegas,
        };
        c.loss_default = match a.loss_default {
            LossArg::Corruption => LossCause::Corruption,
            LossArg::Congestion => LossCause::Congestion,
        };
        let d = VegasParams::default();
        c.vegas = VegasParams {
            alpha: a.vegas_alpha.unwrap_or(d.alpha),
            beta: a.vegas_beta.unwrap_or(d.beta),
            gamma: a.vegas_gamma.unwrap_or(d.gamma),
        };
        if let Some(n) = a.ack_every {
            c.ack.every_packets = n;
        }
        if let Some(ms) = a.ack_delay_ms {
            c.ack.max_delay = Duration::from_millis(ms);
        }
        c.idle_redundancy = !a.no_redundancy;
        c.initial_rtt = (delay * 2).max(Duration::from_millis(100));
        c
    };
    let forward_cfg_rate = a.cc_rate_bps.unwrap_or(a.rate_bps);
    let workload = match (a.seconds, a.bytes) {
        (Some(s), _) => Workload::Seconds(Duration::try_from_secs_f64(s).context("--seconds")?),
        (None, Some(b)) => Workload::Bytes(b),
        (None, None) => bail!("give --seconds or --bytes"),
    };
    let mut a_config = configure(forward_cfg_rate);
    if let Some(cap) = a.interactive_priority_bps {
        a_config.classes = vec![
            TrafficClass::default(),
            TrafficClass {
                weight: 1,
                priority: true,
                max_rate_bps: Some(cap),
            },
        ];
    }
    let b_config = configure(return_rate);
    a_config.validate()?;
    b_config.validate()?;
    Ok(Scenario {
        forward,
        ret,
        a_config,
        b_config,
        associations: a.associations,
        flows_per_association: a.flows,
        workload,
        seed: a.seed,
        time_limit: Duration::from_secs_f64(a.time_limit_s + handshake_allowance),
        cross_traffic: a.cross_bps.map(|rate_bps| CrossTraffic {
            rate_bps,
            packet_bytes: a.cross_packet_bytes,
        }),
        competing_flow: a.cross_cubic.then_some(CUBIC_PACKET_BYTES),
        interactive: a.interactive_ms.map(|ms| Interactive {
            every: Duration::from_millis(ms),
            bytes: a.interactive_bytes.max(1),
            class: if a.interactive_priority_bps.is_some() {
                1
            } else {
                0
            },
        }),
        start_after: Duration::try_from_secs_f64(a.start_after_s).context("--start-after-s")?,
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Bulk(args) => {
            let sc = scenario(&args)?;
            let cpu0 = cpu_seconds();
            let outcome = Simulation::new(sc.clone())?.run();
            let cpu = cpu_seconds() - cpu0;
            let mut r = report::build(&sc, &outcome, cpu);
            if !args.timeline {
                r.timeline = None;
            }
            let _ = args.json;
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
    }
    Ok(())
}
