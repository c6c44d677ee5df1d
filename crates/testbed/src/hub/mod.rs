//! `pep-testbed hub --terminals N`: one hub gateway serving N terminal gateways over a
//! shared emulated forward carrier and a return link per terminal ([`topology`]), pepd on
//! every gateway with a key of its own ([`gateways`]), traffic from every terminal's
//! client to a server behind the hub ([`traffic`]), and the figures of a run ([`report`]).

pub mod gateways;
pub mod report;
pub mod topology;
pub mod traffic;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pep_linkemu::LinkStats;
use serde::Serialize;

use crate::pepd::PepdOptions;
use crate::runner::{LinkSummary, XFER_PORT};
use crate::topology::HostTuning;
use crate::xfer::server::Server;
use crate::xfer::Amount;
use crate::{in_netns, Error};

pub use gateways::{HubGateways, TerminalRates};
pub use report::{Summary, TerminalReport, Windows};
pub use topology::{HubLinks, HubTopology};
pub use traffic::{Activities, TerminalSet, TerminalTraffic, TrafficSpec};

/// A hub topology with pepd up on every gateway and every association established.
pub struct HubTestbed {
    // Declared first so it drops first: the daemons stop before their namespaces go.
    gateways: HubGateways,
    topo: HubTopology,
    links: HubLinks,
}

impl HubTestbed {
    pub fn up(
        links: &HubLinks,
        rates: &[TerminalRates],
        opts: &PepdOptions,
    ) -> Result<HubTestbed, Error> {
        let topo = HubTopology::up(
            links,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
        )?;
        let gateways = HubGateways::start(&topo.names, links, rates, opts)?;
        Ok(HubTestbed {
            gateways,
            topo,
            links: links.clone(),
        })
    }

    pub fn topology(&self) -> &HubTopology {
        &self.topo
    }

    pub fn gateways(&self) -> &HubGateways {
        &self.gateways
    }

    pub fn gateways_mut(&mut self) -> &mut HubGateways {
        &mut self.gateways
    }

    pub fn links(&self) -> &HubLinks {
        &self.links
    }

    /// An xfer server behind the hub at `port`.
    pub fn xfer_server(&self, port: u16) -> Result<Server, Error> {
        let at = SocketAddr::from((topology::SERVER, port));
        Ok(in_netns(&self.topo.names.server, move || {
            Server::bind(at, None)
        })??)
    }

    /// Runs `spec` from every terminal's client against a server at `port` (blocking).
    pub fn traffic(&self, port: u16, spec: &TrafficSpec) -> Vec<TerminalTraffic> {
        let at = SocketAddr::from((topology::SERVER, port));
        traffic::run(&self.topo.names.clients, at, spec)
    }
}

/// One hub run.
#[derive(Clone, Debug)]
pub struct HubSpec {
    pub links: HubLinks,
    /// By terminal.
    pub rates: Vec<TerminalRates>,
    pub traffic: TrafficSpec,
    pub pepd: PepdOptions,
    pub windows: Windows,
    /// Wait this long after every association is up before the traffic starts.
    pub settle: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct HubResult {
    pub terminals: usize,
    pub carrier: LinkSummary,
    /// Each terminal's return link.
    #[serde(rename = "return")]
    pub ret: LinkSummary,
    pub rtt_ms: f64,
    pub amount: Amount,
    /// By terminal.
    pub activities: Vec<Activities>,
    pub per_terminal: Vec<TerminalReport>,
    #[serde(flatten)]
    pub summary: Summary,
    /// The carrier's emulator counters at the end.
    pub carrier_emulator: Option<LinkStats>,
    /// When something was not exact: the end of every gateway's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pepd_log_tail: Option<BTreeMap<String, String>>,
}

/// Builds the hub topology, runs the traffic, tears down and reports.
pub fn run(spec: &HubSpec) -> Result<HubResult, Error> {
    let tb = HubTestbed::up(&spec.links, &spec.rates, &spec.pepd)?;
    let server = tb.xfer_server(XFER_PORT)?;
    std::thread::sleep(spec.settle);
    let traffic = tb.traffic(XFER_PORT, &spec.traffic);
    drop(server);
    let (per_terminal, summary) = report::summarise(
        &traffic,
        &spec.rates,
        spec.links.carrier.rate_bps,
        &spec.traffic,
        spec.windows,
    );
    let pepd_log_tail = (!summary.all_exact).then(|| {
        tb.gateways()
            .log_tails(30)
            .into_iter()
            .collect::<BTreeMap<_, _>>()
    });
    let carrier_emulator = tb.topology().carrier_stats();
    drop(tb);
    Ok(HubResult {
        terminals: spec.links.terminals,
        carrier: (&spec.links.carrier).into(),
        ret: (&spec.links.ret).into(),
        rtt_ms: spec.links.rtt().as_secs_f64() * 1e3,
        amount: spec.traffic.amount,
        activities: spec.traffic.activities.clone(),
        per_terminal,
        summary,
        carrier_emulator,
        pepd_log_tail,
    })
}
