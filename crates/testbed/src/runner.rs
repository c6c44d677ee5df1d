//! One scenario: build the testbed for a profile, run a workload between client and server
//! under a mode, tear down, and report one JSON-serialisable result.

use std::net::SocketAddr;
use std::time::Duration;

use pep_linkemu::{DirectionConfig, LinkConfig, LinkStats};
use pep_sim::channel::reference_goodput_bps;
use serde::Serialize;

use crate::topology::{HostTuning, Topology};
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
    /// pepd on both gateways (issue 4).
    Pepd,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::PlainCubic => "plain-cubic",
            Mode::PlainBbr => "plain-bbr",
            Mode::Pepd => "pepd",
        }
    }

    /// How the end hosts are set up in this mode.
    fn host_tuning(self) -> Result<HostTuning, Error> {
        let cc = match self {
            Mode::PlainCubic => "cubic",
            Mode::PlainBbr => "bbr",
            Mode::Pepd => return Err(Error::NotImplemented(PEPD_PENDING)),
        };
        Ok(HostTuning {
            congestion_control: cc.to_owned(),
        })
    }
}

const PEPD_PENDING: &str = "--mode pepd is not implemented yet: it arrives with the daemon \
     (issue 4), which will start `pepd run -c FILE` on gw-a and gw-b with TPROXY rules";

/// Starts what a mode runs on the gateways. Plain modes run nothing: the gateways route.
///
/// Issue 4 adds `Mode::Pepd` here: write a config per gateway, install the nftables TPROXY
/// rules in gw-a and gw-b (`crate::cmd::run("ip", ["netns", "exec", ns, "nft", ...])`) and
/// start `pepd run -c FILE` in each with `Topology::spawn_in`, which kills it on teardown.
fn start_gateways(mode: Mode, _topo: &mut Topology) -> Result<(), Error> {
    match mode {
        Mode::PlainCubic | Mode::PlainBbr => Ok(()),
        Mode::Pepd => Err(Error::NotImplemented(PEPD_PENDING)),
    }
}

#[derive(Clone, Debug)]
pub struct RunSpec {
    pub profile: Profile,
    /// The profile's link with any overrides applied.
    pub link: LinkConfig,
    pub mode: Mode,
    pub workload: Workload,
    /// Run-time cap: a transfer still going then is cut and reported as `capped`.
    pub max_duration: Duration,
    pub seed: u64,
    pub ipv6: bool,
}

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
    pub mode: Mode,
    pub workload: Workload,
    pub ipv6: bool,
    pub seed: u64,
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
}

pub fn run(spec: &RunSpec) -> Result<RunResult, Error> {
    let hosts = spec.mode.host_tuning()?;
    let mut topo = Topology::up(&spec.link, &hosts)?;
    start_gateways(spec.mode, &mut topo)?;
    let target = SocketAddr::new(addr::server(spec.ipv6), XFER_PORT);
    let cc = hosts.congestion_control.clone();
    let server = in_netns(&topo.names.server, move || Server::bind(target, Some(&cc)))??;
    let opts = client::ClientOpts {
        server: target,
        cc: Some(hosts.congestion_control),
        seed: spec.seed,
        max_duration: spec.max_duration,
    };
    let w = spec.workload.clone();
    let outcome: Outcome = in_netns(&topo.names.client, move || client::run(&w, &opts))?;
    drop(server);
    let emulator = topo.stop_emulator();
    drop(topo);
    let data_dir = if spec.workload.data_goes_up() {
        &spec.link.ret
    } else {
        &spec.link.forward
    };
    let ref_bps = reference_goodput_bps(data_dir.rate_bps, data_dir.impairments.ber);
    Ok(RunResult {
        profile: spec.profile,
        mode: spec.mode,
        workload: spec.workload.clone(),
        ipv6: spec.ipv6,
        seed: spec.seed,
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
    })
}
