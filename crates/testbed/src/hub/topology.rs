//! The hub-and-spoke topology in network namespaces:
//!
//! ```text
//! server — hub ═[carrier]═ sat ─┬─[return 1]─ t1 — c1
//!                               ├─[return 2]─ t2 — c2
//!                               └─ …          tN — cN
//! ```
//!
//! `sat` stands for the satellite: a router namespace between TUN devices. The hub's
//! forward carrier is one emulated link (rate, queue and delay of the profile's forward
//! direction) from the hub to `sat`, which fans its packets out to the terminals; each
//! terminal's return channel is an emulated link of its own (the profile's return
//! direction) from the terminal to `sat`. The carrier's return half and each return link's
//! forward half pass packets through at once, so every packet crosses one shaped direction.
//! No gateway forwards IP: whatever reaches a LAN was carried by pepd.

use std::net::Ipv4Addr;

use pep_linkemu::{DirectionConfig, Emulator, Endpoint, LinkConfig, LinkStats};

use crate::addr::{GW_B_LAN_V4, SERVER_V4};
use crate::cmd::{ip_in, run, sysctl_in};
use crate::topology::{
    add_tun, fresh_base, remove_namespace, tune_host, HostTuning, HOST_DEV, LAN_DEV, SAT_DEV,
};
use crate::Error;

/// Terminal LANs are numbered into one /16, after the pair's subnets.
pub const MAX_TERMINALS: usize = 150;
const FIRST_LAN: usize = 100;

/// The hub's tunnel address, on its satellite interface.
pub const HUB_SAT_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

/// Terminal `i`'s (from 1) tunnel address.
pub fn terminal_sat(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 1, i as u8)
}

/// Terminal `i`'s LAN, 198.18.(100+i).0/24: the gateway is .1, the client .2.
pub fn lan_prefix(i: usize) -> String {
    format!("198.18.{}.0/24", FIRST_LAN + i)
}

pub fn lan_gateway(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (FIRST_LAN + i) as u8, 1)
}

pub fn client(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (FIRST_LAN + i) as u8, 2)
}

/// The server, behind the hub (the pair's server address).
pub const SERVER: Ipv4Addr = SERVER_V4;

/// The links of a hub topology.
#[derive(Clone, Debug)]
pub struct HubLinks {
    pub terminals: usize,
    /// The shared forward carrier, hub → terminals.
    pub carrier: DirectionConfig,
    /// Each terminal's return channel, terminal → hub.
    pub ret: DirectionConfig,
    pub seed: u64,
}

impl HubLinks {
    /// The carrier from `link`'s forward direction, every return link from its return.
    pub fn from_pair(link: &LinkConfig, terminals: usize) -> HubLinks {
        HubLinks {
            terminals,
            carrier: link.forward.clone(),
            ret: link.ret.clone(),
            seed: link.seed,
        }
    }

    /// Propagation round trip between the hub and a terminal.
    pub fn rtt(&self) -> std::time::Duration {
        self.carrier.delay + self.ret.delay
    }
}

/// Namespace names of one hub instance: `peptb-PID-N-ROLE`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HubNames {
    pub base: String,
    pub hub: String,
    pub server: String,
    /// The router the carrier fans out from.
    pub sat: String,
    pub terminals: Vec<String>,
    pub clients: Vec<String>,
}

impl HubNames {
    fn fresh(terminals: usize) -> HubNames {
        let base = fresh_base();
        HubNames {
            hub: format!("{base}-hub"),
            server: format!("{base}-sv"),
            sat: format!("{base}-sat"),
            terminals: (1..=terminals).map(|i| format!("{base}-t{i}")).collect(),
            clients: (1..=terminals).map(|i| format!("{base}-c{i}")).collect(),
            base,
        }
    }

    fn all(&self) -> Vec<&str> {
        let mut v = vec![self.hub.as_str(), &self.server, &self.sat];
        v.extend(self.terminals.iter().map(String::as_str));
        v.extend(self.clients.iter().map(String::as_str));
        v
    }
}

/// A hub topology up, with its emulators running; dropping it tears everything down.
pub struct HubTopology {
    pub names: HubNames,
    created: Vec<String>,
    links: Option<SpokeLinks>,
}

/// Device names in `sat` (namespace-local): the hub's side of the carrier, and terminal
/// `i`'s return link.
const SAT_HUB_DEV: &str = "hub0";
/// The terminals' tunnel addresses.
pub(crate) const TERMINALS_NET: &str = "198.19.1.0/24";
fn sat_terminal_dev(i: usize) -> String {
    format!("tm{i}")
}

/// A direction that delivers at once: the unshaped half of a link.
fn passthrough() -> DirectionConfig {
    DirectionConfig::default()
}

impl HubTopology {
    pub fn up(links: &HubLinks, hosts: &HostTuning) -> Result<HubTopology, Error> {
        if !(1..=MAX_TERMINALS).contains(&links.terminals) {
            return Err(Error::Invalid(format!(
                "{} terminals: between 1 and {MAX_TERMINALS} fit the address plan",
                links.terminals
            )));
        }
        let mut t = HubTopology {
            names: HubNames::fresh(links.terminals),
            created: Vec::new(),
            links: None,
        };
        // On error `t` drops here and removes whatever was already built.
        t.build(links.terminals, hosts)?;
        t.links = Some(SpokeLinks::start(
            links,
            (&t.names.hub, SAT_DEV),
            &t.names.sat,
            &t.names.terminals,
        )?);
        Ok(t)
    }

    fn build(&mut self, terminals: usize, hosts: &HostTuning) -> Result<(), Error> {
        let n = self.names.clone();
        for ns in n.all() {
            run("ip", &["netns", "add", ns])?;
            self.created.push(ns.to_owned());
            ip_in(ns, &["link", "set", "lo", "up"])?;
        }
        let lan = |gw: &str, gw_addr: Ipv4Addr, host: &str, host_addr: Ipv4Addr| {
            wire(gw, LAN_DEV, gw_addr, host, HOST_DEV, host_addr)?;
            let via = gw_addr.to_string();
            ip_in(host, &["route", "add", "default", "via", &via])?;
            tune_host(host, hosts)
        };
        lan(&n.hub, GW_B_LAN_V4, &n.server, SERVER)?;
        let hub_sat = HUB_SAT_V4.to_string();
        add_tun(&n.hub, SAT_DEV)?;
        ip_in(&n.hub, &["addr", "add", &hub_sat, "dev", SAT_DEV])?;
        ip_in(&n.hub, &["route", "add", TERMINALS_NET, "dev", SAT_DEV])?;
        build_spokes(
            &n.sat,
            &hub_sat,
            &n.terminals[..terminals],
            &n.clients,
            hosts,
        )
    }

    /// The carrier's counters so far (its forward direction is the shared one).
    pub fn carrier_stats(&self) -> Option<LinkStats> {
        self.links.as_ref().map(SpokeLinks::carrier_stats)
    }

    fn teardown(&mut self) {
        // Stop the emulators before their TUN devices go away.
        drop(self.links.take());
        for ns in self.created.drain(..) {
            remove_namespace(&ns);
        }
    }
}

impl Drop for HubTopology {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The terminals' side of a hub topology, the same behind one hub or several: `sat`
/// forwards between the carrier's end (`hub0`, towards `hub_side`) and each terminal's
/// return link; each terminal has its tunnel address on `sat0` and a client on its LAN.
pub(crate) fn build_spokes(
    sat: &str,
    hub_side: &str,
    terminals: &[String],
    clients: &[String],
    hosts: &HostTuning,
) -> Result<(), Error> {
    sysctl_in(sat, &["net.ipv4.ip_forward=1"])?;
    add_tun(sat, SAT_HUB_DEV)?;
    ip_in(sat, &["route", "add", hub_side, "dev", SAT_HUB_DEV])?;
    for (k, (t, c)) in terminals.iter().zip(clients).enumerate() {
        let i = k + 1;
        wire(t, LAN_DEV, lan_gateway(i), c, HOST_DEV, client(i))?;
        let via = lan_gateway(i).to_string();
        ip_in(c, &["route", "add", "default", "via", &via])?;
        tune_host(c, hosts)?;
        let dev = sat_terminal_dev(i);
        let own = terminal_sat(i).to_string();
        add_tun(sat, &dev)?;
        ip_in(sat, &["route", "add", &own, "dev", &dev])?;
        add_tun(t, SAT_DEV)?;
        ip_in(t, &["addr", "add", &own, "dev", SAT_DEV])?;
        ip_in(t, &["route", "add", hub_side, "dev", SAT_DEV])?;
    }
    Ok(())
}

/// The emulated links of [`build_spokes`]: the carrier from its hub-side end to `sat`, and
/// each terminal's return link. Dropping it stops them.
pub(crate) struct SpokeLinks {
    carrier: Emulator,
    // Held for their drop: each stops its emulator.
    _returns: Vec<Emulator>,
}

impl SpokeLinks {
    pub(crate) fn start(
        links: &HubLinks,
        carrier_from: (&str, &str),
        sat: &str,
        terminals: &[String],
    ) -> Result<SpokeLinks, Error> {
        let ep = |ns: &str, dev: &str| Endpoint {
            netns: Some(ns.to_owned()),
            dev: dev.to_owned(),
        };
        let carrier = LinkConfig {
            forward: links.carrier.clone(),
            ret: passthrough(),
            seed: links.seed,
            ..Default::default()
        };
        let carrier = Emulator::start(
            &carrier,
            &ep(carrier_from.0, carrier_from.1),
            &ep(sat, SAT_HUB_DEV),
        )?;
        let mut returns = Vec::new();
        for (k, t) in terminals.iter().enumerate() {
            let i = k + 1;
            let ret = LinkConfig {
                forward: passthrough(),
                ret: links.ret.clone(),
                // Each return link loses its own packets.
                seed: links.seed.wrapping_add(i as u64),
                ..Default::default()
            };
            returns.push(Emulator::start(
                &ret,
                &ep(sat, &sat_terminal_dev(i)),
                &ep(t, SAT_DEV),
            )?);
        }
        Ok(SpokeLinks {
            carrier,
            _returns: returns,
        })
    }

    pub(crate) fn carrier_stats(&self) -> LinkStats {
        self.carrier.stats()
    }
}

/// A veth pair from `a` (device `da`, address `aa`/24) to `b` (`db`, `ab`/24), both up.
pub(crate) fn wire(
    a: &str,
    da: &str,
    aa: Ipv4Addr,
    b: &str,
    db: &str,
    ab: Ipv4Addr,
) -> Result<(), Error> {
    ip_in(
        a,
        &[
            "link", "add", da, "type", "veth", "peer", "name", db, "netns", b,
        ],
    )?;
    for (ns, dev, addr) in [(a, da, aa), (b, db, ab)] {
        ip_in(ns, &["addr", "add", &format!("{addr}/24"), "dev", dev])?;
        ip_in(ns, &["link", "set", dev, "up"])?;
    }
    Ok(())
}
