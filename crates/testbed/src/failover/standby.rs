//! An active/standby pair of hubs up on [`FailoverTopology`]: pepd on both hubs with the same
//! config (`[tunnel] redundant = true`, the same key and `[[peer]]` list), keepalived on
//! both, pepd on every terminal; and the failures the scenarios inject.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::hub::HubLinks;
use crate::pepd::{fetch_metrics, PepdOptions, TUNNEL_PORT};
use crate::topology::{HostTuning, LAN_DEV, SAT_DEV};
use crate::Error;

use super::gateways::{Additions, FailoverGateways};
use super::keepalived::{self, Keepalived, VrrpSettings};
use super::topology::{hub_sat, FailoverTopology, Layout, HUBS, LAN_VIP, TUNNEL_VIP};

/// What the hubs' configs get over the hub topology's.
const REDUNDANT_TOML: &str = "[tunnel]\nredundant = true";

/// How the terminals reach the hubs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HubAddressing {
    /// One tunnel address, which keepalived (or a test) moves between the hubs.
    Shared,
    /// Each hub at its own address on the teleport segment, which every terminal lists in
    /// `[peer] address`, hub 1 first: no virtual address, no keepalived.
    Listed,
}

/// Hub 1 starts as the active one: its priority is the higher.
const PRIORITIES: [u8; HUBS] = [150, 100];

pub struct StandbyTestbed {
    // Declared first so they drop first: keepalived and the daemons stop before their
    // namespaces go.
    keepalived: Vec<Keepalived>,
    gateways: FailoverGateways,
    topo: FailoverTopology,
}

impl StandbyTestbed {
    /// Everything up. With keepalived (`advert_int` given): hub 1 holding both addresses
    /// and every terminal associated with it. Without: no hub holds an address
    /// ([`StandbyTestbed::take_addresses`]), and every terminal has started.
    pub fn up(
        links: &HubLinks,
        opts: &PepdOptions,
        advert_int: Option<Duration>,
    ) -> Result<StandbyTestbed, Error> {
        Self::start(links, opts, advert_int, HubAddressing::Shared)
    }

    /// Both hubs up at their own addresses and every terminal listing both, hub 1 first
    /// ([`HubAddressing::Listed`]); returns once hub 1 has every terminal's association.
    pub fn up_listed(links: &HubLinks, opts: &PepdOptions) -> Result<StandbyTestbed, Error> {
        Self::start(links, opts, None, HubAddressing::Listed)
    }

    fn start(
        links: &HubLinks,
        opts: &PepdOptions,
        advert_int: Option<Duration>,
        addressing: HubAddressing,
    ) -> Result<StandbyTestbed, Error> {
        if advert_int.is_some() {
            keepalived::require()?;
        }
        let topo = FailoverTopology::up(
            links,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
            Layout::STANDBY,
        )?;
        let gateways = FailoverGateways::prepare(
            &topo,
            links,
            opts,
            &Additions {
                hub: &|k| match addressing {
                    HubAddressing::Shared => REDUNDANT_TOML.to_owned(),
                    HubAddressing::Listed => {
                        format!("{REDUNDANT_TOML}\nbind = \"{}:{TUNNEL_PORT}\"", hub_sat(k))
                    }
                },
                terminal: &|_| match addressing {
                    HubAddressing::Shared => String::new(),
                    HubAddressing::Listed => {
                        let list: Vec<String> = (1..=HUBS)
                            .map(|k| format!("\"{}:{TUNNEL_PORT}\"", hub_sat(k)))
                            .collect();
                        format!("[peer]\naddress = [{}]", list.join(", "))
                    }
                },
                hub_tx_share: 1.0,
            },
        )?;
        let mut tb = StandbyTestbed {
            keepalived: Vec::new(),
            gateways,
            topo,
        };
        let allowed = opts
            .ready_timeout
            .unwrap_or(Duration::from_secs(15) + 4 * links.rtt());
        let deadline = Instant::now() + allowed;
        // The hubs first: both must start without holding the addresses.
        tb.gateways.start_hubs(deadline, allowed)?;
        let Some(advert_int) = advert_int else {
            let listed = addressing == HubAddressing::Listed;
            tb.gateways.start_terminals(deadline, allowed, listed)?;
            if listed {
                tb.gateways
                    .wait_for_associations(1, links.terminals, deadline)?;
            }
            return Ok(tb);
        };
        for k in 1..=HUBS {
            let settings = VrrpSettings {
                hub: k,
                other: HUBS + 1 - k,
                priority: PRIORITIES[k - 1],
                advert_int,
                pepd: tb.gateways.program().to_owned(),
            };
            let ns = tb.topo.names.hubs[k - 1].clone();
            tb.keepalived
                .push(Keepalived::start(tb.gateways.dir(), &ns, &settings)?);
        }
        tb.wait_until_active(1, deadline)?;
        tb.gateways.start_terminals(deadline, allowed, true)?;
        tb.gateways
            .wait_for_associations(1, links.terminals, deadline)?;
        Ok(tb)
    }

    pub fn topology(&self) -> &FailoverTopology {
        &self.topo
    }

    /// Whether hub `k` (from 1) holds both virtual addresses.
    pub fn is_active(&self, k: usize) -> Result<bool, Error> {
        Ok(self.topo.holds(k, SAT_DEV, TUNNEL_VIP)? && self.topo.holds(k, LAN_DEV, LAN_VIP)?)
    }

    /// Puts both virtual addresses on hub `k` (what keepalived does when it takes over).
    pub fn take_addresses(&self, k: usize) -> Result<(), Error> {
        let ns = &self.topo.names.hubs[k - 1];
        crate::cmd::ip_in(
            ns,
            &["addr", "add", &format!("{TUNNEL_VIP}/24"), "dev", SAT_DEV],
        )?;
        crate::cmd::ip_in(
            ns,
            &["addr", "add", &format!("{LAN_VIP}/24"), "dev", LAN_DEV],
        )
        .map(drop)
    }

    /// The namespace hub `k`'s pepd runs in.
    pub fn hub_namespace(&self, k: usize) -> &str {
        &self.topo.names.hubs[k - 1]
    }

    /// Whether hub `k` holds either virtual address.
    pub fn holds_any(&self, k: usize) -> Result<bool, Error> {
        Ok(self.topo.holds(k, SAT_DEV, TUNNEL_VIP)? || self.topo.holds(k, LAN_DEV, LAN_VIP)?)
    }

    fn wait_until_active(&self, k: usize, deadline: Instant) -> Result<(), Error> {
        loop {
            if self.is_active(k)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Invalid(format!(
                    "hub {k} never held both virtual addresses; its keepalived log:\n{}",
                    self.keepalived[k - 1].log_tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls hub `k`'s metrics until it counts `count` associations established.
    pub fn wait_for_associations(
        &self,
        k: usize,
        count: usize,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.gateways.wait_for_associations(k, count, deadline)
    }

    /// Hub `k`'s associations established now (None: its metrics do not answer).
    pub fn associations(&self, k: usize) -> Option<usize> {
        self.gateways.associations(k)
    }

    /// Terminal `i`'s (from 1) metrics now.
    pub fn terminal_metrics(&self, i: usize) -> Result<String, Error> {
        fetch_metrics(self.gateways.terminal(i).namespace())
    }

    /// SIGKILL to hub `k`'s pepd.
    pub fn kill_pepd(&mut self, k: usize) -> Result<(), Error> {
        self.gateways.kill_hub(k)
    }

    /// Starts hub `k`'s pepd again and waits for its readiness.
    pub fn restart_pepd(&mut self, k: usize, allowed: Duration) -> Result<(), Error> {
        self.gateways.restart_hub(k, allowed)
    }

    /// Hub `k` gone at once: its interfaces down, then pepd and keepalived killed.
    pub fn cut_hub(&mut self, k: usize) -> Result<(), Error> {
        self.topo.cut_hub(k)?;
        self.keepalived[k - 1].kill();
        self.gateways.kill_hub(k)
    }

    /// The end of every pepd log and both keepalived logs.
    pub fn log_tails(&self, lines: usize) -> Vec<(String, String)> {
        let mut v = self.gateways.log_tails(lines);
        for (k, ka) in self.keepalived.iter().enumerate() {
            v.push((format!("keepalived h{}", k + 1), ka.log_tail(lines)));
        }
        v
    }

    pub fn dir(&self) -> &Path {
        self.gateways.dir()
    }
}
