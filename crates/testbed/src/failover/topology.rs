//! The failover topology in network namespaces. The active/standby layout:
//!
//! ```text
//!            sv 198.18.3.2 ─┐ br-lan (in sw) ┌─ h1 lan0 198.18.3.11   h1 sat0 198.19.0.11 ─┐ br-tp (in sw)
//!                           └────────────────┴─ h2 lan0 198.18.3.12   h2 sat0 198.19.0.12 ─┤
//!                                                                  mod tp0 198.19.0.254 ───┘
//!  mod ═[carrier]═ sat ─┬─[return 1]─ t1 — c1
//!                       └─ …          tN — cN
//! ```
//!
//! `sw` is a switch: two bridges, one for the LAN side (the server and the hubs' `lan0`),
//! one for the teleport segment (the hubs' `sat0` and the modem). `mod` is the modem: it
//! routes between the teleport segment and the emulated carrier to `sat`, which fans out
//! to the terminals as in [`crate::hub::topology`]. The hubs share two virtual addresses,
//! which keepalived moves: [`TUNNEL_VIP`] on `sat0` (every terminal's hub address) and
//! [`LAN_VIP`] on `lan0` (the server's default route). Neither is on any interface when
//! the topology comes up.
//!
//! The active-set layout ([`Layout::active_set`]) has three or more hubs, each serving on
//! its own addresses, and puts the server behind a router:
//!
//! ```text
//!  sv 198.18.4.2 ── rtr 198.18.4.1 | 198.18.3.254 on br-lan ── h1 … hN lan0 198.18.3.1k
//! ```
//!
//! `rtr` learns each terminal's LAN from the hub that serves the terminal (BGP, see
//! [`super::frr`]), so the server's replies to a client's own address reach that hub.

use std::net::Ipv4Addr;

use pep_linkemu::LinkStats;

use crate::cmd::{ip_in, run, sysctl_in};
use crate::hub::topology::{
    build_spokes, wire, HubLinks, SpokeLinks, MAX_TERMINALS, TERMINALS_NET,
};
use crate::topology::{
    add_tun, fresh_base, remove_namespace, tune_host, HostTuning, HOST_DEV, LAN_DEV, SAT_DEV,
};
use crate::Error;

/// The hubs' shared tunnel address: the hub topology's, so terminal configs are the same.
pub const TUNNEL_VIP: Ipv4Addr = crate::hub::topology::HUB_SAT_V4;
/// The hubs' shared LAN address, the server's next hop.
pub const LAN_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 1);
/// The server, on the hubs' LAN segment.
pub const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 2);
/// The modem's address on the teleport segment.
pub const MODEM: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 254);
/// Hubs in a redundant pair.
pub const HUBS: usize = 2;
/// The server in the active-set layout, behind the router.
pub const ROUTED_SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 4, 2);
/// The router's address on the server's segment.
pub const ROUTER_SERVER_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 4, 1);
/// The router's address on the hubs' LAN segment.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 254);
/// The most hubs the address plan and the router's config are written for.
pub const MAX_HUBS: usize = 8;

/// How many hubs, and where the server sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub hubs: usize,
    /// The server behind a router that learns the terminals' LANs by BGP; otherwise on the
    /// hubs' segment, its default route the LAN virtual address.
    pub routed: bool,
}

impl Layout {
    /// Two hubs sharing virtual addresses, the server on their segment.
    pub const STANDBY: Layout = Layout {
        hubs: HUBS,
        routed: false,
    };

    /// `hubs` hubs on their own addresses, the server behind the router.
    pub fn active_set(hubs: usize) -> Layout {
        Layout { hubs, routed: true }
    }
}

/// Hub `k`'s (from 1) own address on the teleport segment.
pub fn hub_sat(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 0, 10 + k as u8)
}

/// Hub `k`'s own LAN address.
pub fn hub_lan(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 3, 10 + k as u8)
}

const TELEPORT: &str = "198.19.0.0/24";
const SERVER_NET: &str = "198.18.4.0/24";
const ROUTER_SERVER_DEV: &str = "sv0";
const BR_LAN: &str = "br-lan";
const BR_TP: &str = "br-tp";
const MOD_DEV: &str = "tp0";
/// Namespace names of one instance: `peptb-PID-N-ROLE`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FailoverNames {
    pub base: String,
    pub switch: String,
    /// By hub, from hub 1.
    pub hubs: Vec<String>,
    /// The active-set layout's router.
    pub router: Option<String>,
    pub server: String,
    pub modem: String,
    pub sat: String,
    pub terminals: Vec<String>,
    pub clients: Vec<String>,
}

impl FailoverNames {
    fn fresh(terminals: usize, layout: Layout) -> FailoverNames {
        let base = fresh_base();
        FailoverNames {
            switch: format!("{base}-sw"),
            hubs: (1..=layout.hubs).map(|k| format!("{base}-h{k}")).collect(),
            router: layout.routed.then(|| format!("{base}-rtr")),
            server: format!("{base}-sv"),
            modem: format!("{base}-mod"),
            sat: format!("{base}-sat"),
            terminals: (1..=terminals).map(|i| format!("{base}-t{i}")).collect(),
            clients: (1..=terminals).map(|i| format!("{base}-c{i}")).collect(),
            base,
        }
    }

    fn all(&self) -> Vec<&str> {
        let mut v = vec![self.switch.as_str()];
        v.extend(self.hubs.iter().map(String::as_str));
        v.extend(self.router.as_deref());
        v.extend([self.server.as_str(), &self.modem, &self.sat]);
        v.extend(self.terminals.iter().map(String::as_str));
        v.extend(self.clients.iter().map(String::as_str));
        v
    }
}

/// The topology up with its emulators running; dropping it tears everything down (and
/// ends whatever still runs in its namespaces).
pub struct FailoverTopology {
    pub names: FailoverNames,
    pub layout: Layout,
    created: Vec<String>,
    links: Option<SpokeLinks>,
}

impl FailoverTopology {
    pub fn up(
        links: &HubLinks,
        hosts: &HostTuning,
        layout: Layout,
    ) -> Result<FailoverTopology, Error> {
        if !(1..=MAX_TERMINALS).contains(&links.terminals) {
            return Err(Error::Invalid(format!(
                "{} terminals: between 1 and {MAX_TERMINALS} fit the address plan",
                links.terminals
            )));
        }
        if !(2..=MAX_HUBS).contains(&layout.hubs) {
            return Err(Error::Invalid(format!(
                "{} hubs: between 2 and {MAX_HUBS} fit the address plan",
                layout.hubs
            )));
        }
        let mut t = FailoverTopology {
            names: FailoverNames::fresh(links.terminals, layout),
            layout,
            created: Vec::new(),
            links: None,
        };
        // On error `t` drops here and removes whatever was already built.
        t.build(links.terminals, hosts)?;
        t.links = Some(SpokeLinks::start(
            links,
            (&t.names.modem, SAT_DEV),
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
        for br in [BR_LAN, BR_TP] {
            ip_in(&n.switch, &["link", "add", br, "type", "bridge"])?;
            ip_in(&n.switch, &["link", "set", br, "up"])?;
        }
        let port = |ns: &str, dev: &str, addr: Ipv4Addr, sw_dev: &str, bridge: &str| {
            switch_port(&n.switch, ns, dev, addr, sw_dev, bridge)
        };
        for (k, hub) in n.hubs.iter().enumerate() {
            let k = k + 1;
            port(hub, LAN_DEV, hub_lan(k), &format!("l{k}"), BR_LAN)?;
            port(hub, SAT_DEV, hub_sat(k), &format!("s{k}"), BR_TP)?;
            let modem = MODEM.to_string();
            ip_in(hub, &["route", "add", TERMINALS_NET, "via", &modem])?;
            if n.router.is_some() {
                let router = ROUTER.to_string();
                ip_in(hub, &["route", "add", SERVER_NET, "via", &router])?;
            }
        }
        match &n.router {
            Some(rtr) => {
                port(rtr, LAN_DEV, ROUTER, "rt", BR_LAN)?;
                sysctl_in(rtr, &["net.ipv4.ip_forward=1"])?;
                wire(
                    rtr,
                    ROUTER_SERVER_DEV,
                    ROUTER_SERVER_SIDE,
                    &n.server,
                    HOST_DEV,
                    ROUTED_SERVER,
                )?;
                let via = ROUTER_SERVER_SIDE.to_string();
                ip_in(&n.server, &["route", "add", "default", "via", &via])?;
            }
            None => {
                port(&n.server, HOST_DEV, SERVER, "sv", BR_LAN)?;
                let via = LAN_VIP.to_string();
                ip_in(&n.server, &["route", "add", "default", "via", &via])?;
            }
        }
        tune_host(&n.server, hosts)?;
        port(&n.modem, MOD_DEV, MODEM, "md", BR_TP)?;
        sysctl_in(&n.modem, &["net.ipv4.ip_forward=1"])?;
        add_tun(&n.modem, SAT_DEV)?;
        ip_in(&n.modem, &["route", "add", TERMINALS_NET, "dev", SAT_DEV])?;
        build_spokes(
            &n.sat,
            TELEPORT,
            &n.terminals[..terminals],
            &n.clients,
            hosts,
        )
    }

    /// The server's address in this layout.
    pub fn server(&self) -> Ipv4Addr {
        match self.layout.routed {
            true => ROUTED_SERVER,
            false => SERVER,
        }
    }

    /// The carrier's counters so far.
    pub fn carrier_stats(&self) -> Option<LinkStats> {
        self.links.as_ref().map(SpokeLinks::carrier_stats)
    }

    /// Whether hub `k` (from 1) holds `addr` on `dev` now.
    pub fn holds(&self, k: usize, dev: &str, addr: Ipv4Addr) -> Result<bool, Error> {
        let out = ip_in(
            &self.names.hubs[k - 1],
            &["-4", "-o", "addr", "show", "dev", dev],
        )?;
        let needle = format!(" {addr}/");
        Ok(out.contains(&needle))
    }

    /// Takes hub `k`'s interfaces down at once (its power cut: nothing leaves it after
    /// this).
    pub fn cut_hub(&self, k: usize) -> Result<(), Error> {
        let ns = &self.names.hubs[k - 1];
        crate::cmd::run_with_input(
            "ip",
            &["-n", ns, "-batch", "-"],
            &format!("link set {LAN_DEV} down\nlink set {SAT_DEV} down\n"),
        )
        .map(drop)
    }
}

impl Drop for FailoverTopology {
    fn drop(&mut self) {
        drop(self.links.take());
        for ns in self.created.drain(..) {
            remove_namespace(&ns);
        }
    }
}

/// Namespace `ns`'s interface `dev` (address `addr`/24), whose other end `sw_dev` is a
/// port of `bridge` in the switch namespace.
fn switch_port(
    switch: &str,
    ns: &str,
    dev: &str,
    addr: Ipv4Addr,
    sw_dev: &str,
    bridge: &str,
) -> Result<(), Error> {
    ip_in(
        ns,
        &[
            "link", "add", dev, "type", "veth", "peer", "name", sw_dev, "netns", switch,
        ],
    )?;
    ip_in(switch, &["link", "set", sw_dev, "master", bridge, "up"])?;
    ip_in(ns, &["addr", "add", &format!("{addr}/24"), "dev", dev])?;
    ip_in(ns, &["link", "set", dev, "up"]).map(drop)
}
