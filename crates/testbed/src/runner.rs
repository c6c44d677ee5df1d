//! One scenario: build the testbed for a profile, run a workload between client and server
//! under a mode, tear down, and report one JSON-serialisable result.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pep_linkemu::{DirectionConfig, LinkConfig, LinkStats};
use pep_sim::channel::reference_goodput_bps;
use pep_sim::timeline::{step_responses, Bucket, StepResponse};
use serde::Serialize;

use crate::corpus::{Content, CorpusInfo};
use crate::cpu::{CpuMeter, GatewayCpu};
use crate::cross::{CrossOutcome, CrossSpec, CrossTraffic};
use crate::pepd::{Gateways, PepdOptions, Side};
use crate::split::{SplitGateways, SplitOptions};
use crate::topology::{HostTuning, LinkKind, Topology};
use crate::xfer::{client, server::Server, Outcome, Workload};
use crate::{addr, in_netns, Error, Profile};

/// TCP port of the traffic server.
pub const XFER_PORT: u16 = 5001;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// End-to-end TCP, endpoints on CUBIC; the gateways only route.
    PlainCubic,
    /// End-to-end TCP, endpoints on BBR; the gateways only route.
    PlainBbr,
    /// pepd on both gateways, intercepting with TPROXY; endpoints on the kernel default
    /// (CUBIC), talking to their local gateway only.
    Pepd,
    /// The kernel split-TCP baseline ([`crate::split`]): a relay on each gateway,
    /// intercepting with TPROXY like pepd and carrying each flow across the link on one
    /// kernel TCP connection; endpoints on CUBIC.
    SplitTcp,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::PlainCubic => "plain-cubic",
            Mode::PlainBbr => "plain-bbr",
            Mode::Pepd => "pepd",
            Mode::SplitTcp => "split-tcp",
        }
    }

    /// How the end hosts are set up in this mode.
    fn host_tuning(self) -> HostTuning {
        let cc = match self {
            Mode::PlainCubic => "cubic",
            Mode::PlainBbr => "bbr",
            // Each host's TCP only spans its LAN to the gateway: the kernel default will do.
            Mode::Pepd | Mode::SplitTcp => "cubic",
        };
        HostTuning {
            congestion_control: cc.to_owned(),
        }
    }
}

/// What runs on the gateways in a mode.
enum GatewayProcesses {
    Pepd(Gateways),
    Split(SplitGateways),
}

impl GatewayProcesses {
    /// Each gateway's process id, keyed by gateway name (those running).
    fn pids(&self) -> Vec<(String, u32)> {
        let all = match self {
            GatewayProcesses::Pepd(g) => Side::BOTH
                .into_iter()
                .map(|s| (s.gateway().to_owned(), g.pid(s)))
                .collect(),
            GatewayProcesses::Split(g) => g.pids(),
        };
        all.into_iter()
            .filter_map(|(name, pid)| Some((name, pid?)))
            .collect()
    }

    fn log_tails(&self, lines: usize) -> BTreeMap<String, String> {
        match self {
            GatewayProcesses::Pepd(g) => g.log_tails(lines),
            GatewayProcesses::Split(g) => g.log_tails(lines),
        }
    }
}

/// Starts what a mode runs on the gateways: nothing in the plain modes (the gateways
/// route), pepd on both in `Mode::Pepd` (see [`crate::pepd`]), up and associated when this
/// returns, the split relays in `Mode::SplitTcp`. Dropping the result stops them.
fn start_gateways(spec: &RunSpec, topo: &Topology) -> Result<Option<GatewayProcesses>, Error> {
    Ok(match spec.mode {
        Mode::PlainCubic | Mode::PlainBbr => None,
        Mode::Pepd => Some(GatewayProcesses::Pepd(Gateways::start(
            &topo.names,
            &spec.link,
            &spec.pepd,
        )?)),
        Mode::SplitTcp => Some(GatewayProcesses::Split(SplitGateways::start(
            &topo.names,
            &spec.split,
        )?)),
    })
}

#[derive(Clone, Debug)]
pub struct RunSpec {
    pub profile: Profile,
    /// The profile's link with any overrides applied.
    pub link: LinkConfig,
    /// What joins the gateways: the emulator applying `link`, or a bare veth pair (then
    /// `link` only sets pepd's provisioned rates and the reference goodput).
    pub link_kind: LinkKind,
    pub mode: Mode,
    pub workload: Workload,
    /// Run-time cap: a transfer still going then is cut and reported as `capped`.
    pub max_duration: Duration,
    pub seed: u64,
    pub ipv6: bool,
    /// How pepd runs in `Mode::Pepd` (ignored otherwise).
    pub pepd: PepdOptions,
    /// How the relays run in `Mode::SplitTcp` (ignored otherwise).
    pub split: SplitOptions,
    /// Traffic beside the workload that does not pass through pepd.
    pub cross: CrossSpec,
    /// Include the forward link's timeline (100 ms buckets) in the result.
    pub timeline: bool,
    /// Wait this long after the gateways are up before the workload starts: a gateway that
    /// has been running a while when traffic comes (pepd measures the link in the first
    /// round trip after the association is established).
    pub settle: Duration,
    /// What the streams carry.
    pub content: Content,
}

impl RunSpec {
    /// `workload` under `mode` over `profile`'s `link`, emulated, with everything else at
    /// its default: IPv4, seed 1, a 300 s cap, no cross traffic, no timeline, no settling.
    pub fn new(profile: Profile, link: LinkConfig, mode: Mode, workload: Workload) -> RunSpec {
        RunSpec {
            profile,
            link,
            link_kind: LinkKind::Emulated,
            mode,
            workload,
            max_duration: Duration::from_secs(300),
            seed: 1,
            ipv6: false,
            pepd: PepdOptions::default(),
            split: SplitOptions::default(),
            cross: CrossSpec::default(),
            timeline: false,
            settle: Duration::ZERO,
            content: Content::Random,
        }
    }
}

/// A rate step counts as followed when the queue is back under this, and a step up when the
/// link delivers this fraction of the new rate (issue 13's acceptance).
const STEP_QUEUE_BOUND: Duration = Duration::from_millis(100);
const STEP_RATE_FRACTION: f64 = 0.9;

#[derive(Clone, Debug, Serialize)]
pub struct LinkSummary {
    pub rate_bps: f64,
    pub delay_ms: f64,
    pub ber: f64,
    pub loss: f64,
    pub queue_bytes: usize,
}

impl From<&DirectionConfig> for LinkSummary {
    fn from(d: &DirectionConfig) -> Self {
        LinkSummary {
            rate_bps: d.rate_bps,
            delay_ms: d.delay.as_secs_f64() * 1e3,
            ber: d.impairments.ber,
            loss: d.impairments.loss,
            queue_bytes: d.queue_bytes,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub profile: Profile,
    pub link: LinkKind,
    pub mode: Mode,
    pub workload: Workload,
    pub ipv6: bool,
    pub seed: u64,
    /// What the streams carried, and the corpus that was.
    pub content: CorpusInfo,
    /// How much smaller that content gets as pepd compresses it at its hard level, in its
    /// blocks (`pep_compress::offline_ratio`): what a compressed run is compared with.
    pub content_ratio: f64,
    /// What the traffic tool measured (flattened into the JSON object).
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Rate of the data direction × (1−BER)^(8·1500) × 1460/1500.
    pub ref_bps: f64,
    pub efficiency: f64,
    pub forward: LinkSummary,
    #[serde(rename = "return")]
    pub ret: LinkSummary,
    pub emulator: Option<LinkStats>,
    /// Seconds from the emulator's start (the clock of its schedules and outages) to the
    /// start of the workload.
    pub workload_start_s: f64,
    /// For each step of the forward rate schedule, as the emulator measured it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub step_responses: Vec<StepResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross: Option<CrossOutcome>,
    /// In pepd mode, each gateway's congestion control at the end of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pepd_capacity: Option<BTreeMap<String, crate::pepd::CapacityReport>>,
    /// In pepd mode, what each gateway sent on the hop and what its compression did, over
    /// the daemon's life (start, handshake and the workload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pepd_compression: Option<BTreeMap<String, crate::pepd::CompressionReport>>,
    /// The forward link's mean rate over the workload, rate steps counted and outages at
    /// zero, and the goodput over what an ideal TCP would carry at that rate (the `ref`
    /// formula).
    pub link_average_bps: f64,
    pub efficiency_of_capacity: f64,
    /// The forward link over time, seconds from the emulator's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<Bucket>>,
    /// In pepd and split-tcp mode: CPU (user + system) of each gateway's process over the
    /// workload, and of both per GB of verified payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_cpu: Option<GatewayCpu>,
    /// In pepd and split-tcp mode, when the transfer failed: the tail of each gateway's
    /// log (pepd's or the relay's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pepd_log_tail: Option<BTreeMap<String, String>>,
}

pub fn run(spec: &RunSpec) -> Result<RunResult, Error> {
    let content = crate::corpus::info(spec.content)?;
    let seed = spec.content.seed(spec.seed);
    let content_ratio = crate::corpus::offline_ratio(spec.content, seed)?;
    let hosts = spec.mode.host_tuning();
    let mut topo = Topology::up_over(spec.link_kind, &spec.link, &hosts)?;
    let gateways = start_gateways(spec, &topo)?;
    let target = SocketAddr::new(addr::server(spec.ipv6), XFER_PORT);
    let cc = hosts.congestion_control.clone();
    let server = in_netns(&topo.names.server, move || Server::bind(target, Some(&cc)))??;
    let opts = client::ClientOpts {
        server: target,
        cc: Some(hosts.congestion_control),
        seed,
        max_duration: spec.max_duration,
    };
    std::thread::sleep(spec.settle);
    let cross = if spec.cross.is_empty() {
        None
    } else {
        Some(CrossTraffic::start(&topo.names, &spec.cross, spec.ipv6)?)
    };
    let w = spec.workload.clone();
    let workload_start_s = topo.emulator_elapsed().as_secs_f64();
    let cpu_meter = gateways
        .as_ref()
        .map(|g| CpuMeter::start(&g.pids()))
        .transpose()?;
    let outcome: Outcome = in_netns(&topo.names.client, move || client::run(&w, &opts))?;
    let gateway_cpu = cpu_meter.map(|m| m.finish(outcome.bytes)).transpose()?;
    let cross = cross.map(CrossTraffic::finish).transpose()?;
    drop(server);
    let failed = outcome.error.is_some() || outcome.intact == Some(false);
    let pepd_log_tail = gateways
        .as_ref()
        .filter(|_| failed)
        .map(|g| g.log_tails(30));
    let pepd_capacity = match &gateways {
        Some(GatewayProcesses::Pepd(g)) => Some(g.capacity_reports()),
        _ => None,
    };
    let pepd_compression = match &gateways {
        Some(GatewayProcesses::Pepd(g)) => Some(g.compression_reports()),
        _ => None,
    };
    drop(gateways);
    let forward_timeline = topo.emulator_timelines().map(|[f, _]| f);
    let emulator = topo.stop_emulator();
    drop(topo);
    let buckets = forward_timeline
        .as_ref()
        .map(|t| t.buckets().to_vec())
        .unwrap_or_default();
    let end = Duration::from_secs_f64(emulator.as_ref().map_or(0.0, |e| e.elapsed_s));
    let step_responses = step_responses(
        &buckets,
        spec.link.forward.rate_schedule.steps(),
        spec.link.forward.rate_bps,
        STEP_QUEUE_BOUND,
        STEP_RATE_FRACTION,
        end,
    );
    let data_dir = if spec.workload.data_goes_up() {
        &spec.link.ret
    } else {
        &spec.link.forward
    };
    let ref_bps = reference_goodput_bps(data_dir.rate_bps, data_dir.impairments.ber);
    let window = (
        Duration::from_secs_f64(workload_start_s),
        Duration::from_secs_f64(workload_start_s + outcome.completion_s),
    );
    let link_average_bps = average_rate(data_dir, window);
    let capacity_ref = reference_goodput_bps(link_average_bps, data_dir.impairments.ber);
    let efficiency_of_capacity = if capacity_ref > 0.0 {
        outcome.goodput_bps / capacity_ref
    } else {
        0.0
    };
    Ok(RunResult {
        profile: spec.profile,
        link: spec.link_kind,
        mode: spec.mode,
        workload: spec.workload.clone(),
        ipv6: spec.ipv6,
        seed: spec.seed,
        content,
        content_ratio,
        ref_bps,
        efficiency: if ref_bps > 0.0 {
            outcome.goodput_bps / ref_bps
        } else {
            0.0
        },
        outcome,
        forward: (&spec.link.forward).into(),
        ret: (&spec.link.ret).into(),
        emulator,
        workload_start_s,
        step_responses,
        cross,
        timeline: spec.timeline.then_some(buckets),
        pepd_capacity,
        pepd_compression,
        gateway_cpu,
        link_average_bps,
        efficiency_of_capacity,
        pepd_log_tail,
    })
}

/// Mean rate of `d` over `(from, to)` (emulator time): its rate schedule integrated, outage
/// time at zero.
fn average_rate(d: &DirectionConfig, (from, to): (Duration, Duration)) -> f64 {
    let step = Duration::from_millis(1);
    let (mut sum, mut n) = (0.0, 0u64);
    let mut t = from;
    while t < to {
        if !d.impairments.outages.is_down(t) {
            sum += d.rate_at(t);
        }
        n += 1;
        t += step;
    }
    if n == 0 {
        d.rate_bps
    } else {
        sum / n as f64
    }
}
