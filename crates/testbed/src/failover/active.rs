//! Several active hubs (N+1) up on [`FailoverTopology`]'s active-set layout: every hub runs
//! pepd on its own tunnel address with the same key and `[[peer]]` list
//! (`[tunnel] redundant = true`), connects upstream from the client's own address
//! (`transparent_source`) and writes the routes of the terminals it serves for FRR to
//! announce (`[announce]`); every terminal lists the hubs in its own order of preference,
//! its home hub first. The router learns each terminal's LAN from the hub that serves it.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::hub::topology::lan_prefix;
use crate::hub::HubLinks;
use crate::pepd::{fetch_metrics, Interception, PepdOptions, TUNNEL_PORT};
use crate::topology::HostTuning;
use crate::Error;

use super::frr::{self, Frr, OUTAGE_TABLE, SERVING_TABLE};
use super::gateways::{Additions, FailoverGateways};
use super::topology::{hub_lan, hub_sat, FailoverTopology, Layout};

/// How the hubs divide the one carrier.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ActiveSet {
    pub hubs: usize,
    /// Each hub's `link.tx_rate` as a part of the carrier's rate: `1/N` never oversubscribes
    /// it; `1/(N−1)` uses it fully once one hub is gone.
    pub hub_tx_share: f64,
}

/// Terminal `i`'s (from 1) home hub (from 1): the terminals are spread evenly, in blocks.
pub fn home_hub(i: usize, terminals: usize, hubs: usize) -> usize {
    (i - 1) * hubs / terminals + 1
}

/// Terminal `i`'s hubs in order of preference: its home, then the others, their order
/// turned by one for each terminal of the same home, so that a failed hub's terminals
/// spread over the others.
pub fn hub_order(i: usize, terminals: usize, hubs: usize) -> Vec<usize> {
    let home = home_hub(i, terminals, hubs);
    let first_of_home = (1..=i)
        .find(|&j| home_hub(j, terminals, hubs) == home)
        .unwrap_or(i);
    let turn = (i - first_of_home) % (hubs - 1).max(1);
    let mut others: Vec<usize> = (1..hubs).map(|d| (home - 1 + d) % hubs + 1).collect();
    others.rotate_left(turn);
    std::iter::once(home).chain(others).collect()
}

pub struct ActiveSetTestbed {
    // Declared first so they drop first: the routing daemons and pepd stop before their
    // namespaces go.
    /// Hub 1, …, hub N, then the router.
    frr: Vec<Frr>,
    gateways: FailoverGateways,
    topo: FailoverTopology,
    set: ActiveSet,
    terminals: usize,
}

impl ActiveSetTestbed {
    /// Everything up: FRR on every hub and the router, pepd on every hub and terminal, and
    /// every terminal associated with its home hub and announced by it.
    pub fn up(
        links: &HubLinks,
        opts: &PepdOptions,
        set: ActiveSet,
    ) -> Result<ActiveSetTestbed, Error> {
        frr::require()?;
        if !(set.hub_tx_share > 0.0 && set.hub_tx_share <= 1.0) {
            return Err(Error::Invalid(format!(
                "a hub's share of the carrier must be in (0, 1], not {}",
                set.hub_tx_share
            )));
        }
        let topo = FailoverTopology::up(
            links,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
            Layout::active_set(set.hubs),
        )?;
        // The router's BGP sessions reach the hubs' own addresses; a deployment's rules
        // (`pepd nft-rules`) leave traffic to the host itself alone.
        let opts = PepdOptions {
            interception: Interception::Pepd,
            ..opts.clone()
        };
        let terminals = links.terminals;
        let gateways = FailoverGateways::prepare(
            &topo,
            links,
            &opts,
            &Additions {
                hub: &hub_toml,
                terminal: &|i| terminal_toml(i, terminals, set.hubs),
                hub_tx_share: set.hub_tx_share,
            },
        )?;
        let mut tb = ActiveSetTestbed {
            frr: Vec::new(),
            gateways,
            topo,
            set,
            terminals,
        };
        for k in 1..=set.hubs {
            let ns = tb.topo.names.hubs[k - 1].clone();
            tb.frr.push(Frr::start(
                tb.gateways.dir(),
                &ns,
                &format!("h{k}"),
                &frr::hub_zebra(k),
                &frr::hub_bgpd(k),
            )?);
        }
        let router = tb.router_namespace().to_owned();
        tb.frr.push(Frr::start(
            tb.gateways.dir(),
            &router,
            "rtr",
            &frr::router_zebra(),
            &frr::router_bgpd(set.hubs),
        )?);
        let allowed = opts
            .ready_timeout
            .unwrap_or(Duration::from_secs(15) + 4 * links.rtt());
        let deadline = Instant::now() + allowed;
        tb.gateways.start_hubs(deadline, allowed)?;
        tb.gateways.start_terminals(deadline, allowed, true)?;
        for k in 1..=set.hubs {
            let homed = (1..=terminals)
                .filter(|&i| home_hub(i, terminals, set.hubs) == k)
                .count();
            tb.gateways.wait_for_associations(k, homed, deadline)?;
        }
        for i in 1..=terminals {
            let home = home_hub(i, terminals, set.hubs);
            tb.wait_for_route(i, Some(hub_lan(home)), deadline)?;
        }
        Ok(tb)
    }

    pub fn topology(&self) -> &FailoverTopology {
        &self.topo
    }

    pub fn set(&self) -> ActiveSet {
        self.set
    }

    fn router_namespace(&self) -> &str {
        self.topo
            .names
            .router
            .as_deref()
            .expect("the active-set layout has a router")
    }

    /// The hub (from 1) the router sends terminal `i`'s LAN to now (`None`: no route).
    pub fn routed_to(&self, i: usize) -> Result<Option<usize>, Error> {
        let hop = frr::router_next_hop(self.router_namespace(), &lan_prefix(i))?;
        Ok(hop.and_then(|a| (1..=self.set.hubs).find(|&k| hub_lan(k) == a)))
    }

    /// Waits until the router sends terminal `i`'s LAN to `via` (`None`: no route).
    fn wait_for_route(
        &self,
        i: usize,
        via: Option<Ipv4Addr>,
        deadline: Instant,
    ) -> Result<(), Error> {
        let prefix = lan_prefix(i);
        loop {
            let hop = frr::router_next_hop(self.router_namespace(), &prefix)?;
            if hop == via {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let router = self.frr.last().map(|f| f.log_tail(20)).unwrap_or_default();
                return Err(Error::Invalid(format!(
                    "the router sends {prefix} via {hop:?}, not {via:?}; its FRR log:\n{router}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Hub `k`'s associations established now (None: its metrics do not answer).
    pub fn associations(&self, k: usize) -> Option<usize> {
        self.gateways.associations(k)
    }

    /// The hub (from 1) terminal `i`'s pepd is associated with now, from its
    /// `pepd_peer_endpoint` gauge (`None`: no metrics, or no hub address in them).
    pub fn served_by(&self, i: usize) -> Option<usize> {
        let text = fetch_metrics(self.gateways.terminal(i).namespace()).ok()?;
        let line = text
            .lines()
            .find(|l| l.starts_with("pepd_peer_endpoint{") && l.trim_end().ends_with(" 1"))?;
        (1..=self.set.hubs).find(|&k| line.contains(&format!("\"{}:{TUNNEL_PORT}\"", hub_sat(k))))
    }

    /// Terminal `i`'s home hub.
    pub fn home(&self, i: usize) -> usize {
        home_hub(i, self.terminals, self.set.hubs)
    }

    /// Hub `k` gone at once: its interfaces down, then pepd and its routing daemons killed
    /// (a power cut: nothing leaves it after the first step).
    pub fn cut_hub(&mut self, k: usize) -> Result<(), Error> {
        self.topo.cut_hub(k)?;
        self.frr[k - 1].kill();
        self.gateways.kill_hub(k)
    }

    /// The end of every pepd log and every FRR log.
    pub fn log_tails(&self, lines: usize) -> Vec<(String, String)> {
        let mut v = self.gateways.log_tails(lines);
        for (k, f) in self.frr.iter().enumerate() {
            let name = match k < self.set.hubs {
                true => format!("frr h{}", k + 1),
                false => "frr rtr".to_owned(),
            };
            v.push((name, f.log_tail(lines)));
        }
        v
    }

    pub fn dir(&self) -> &Path {
        self.gateways.dir()
    }
}

/// What hub `k`'s config gets over the hub topology's.
fn hub_toml(k: usize) -> String {
    format!(
        "[tunnel]\nbind = \"{}:{TUNNEL_PORT}\"\nredundant = true\n\
         [announce]\ntable = {SERVING_TABLE}\noutage_table = {OUTAGE_TABLE}\n\
         [upstream]\ntransparent_source = true\n",
        hub_sat(k)
    )
}

/// What terminal `i`'s config gets over the hub topology's: its hubs in order.
fn terminal_toml(i: usize, terminals: usize, hubs: usize) -> String {
    let list: Vec<String> = hub_order(i, terminals, hubs)
        .into_iter()
        .map(|k| format!("\"{}:{TUNNEL_PORT}\"", hub_sat(k)))
        .collect();
    format!("[peer]\naddress = [{}]\n", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_spread_evenly_and_backups_rotate() {
        let homes: Vec<usize> = (1..=12).map(|i| home_hub(i, 12, 3)).collect();
        assert_eq!(homes, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        let orders: Vec<Vec<usize>> = (1..=12).map(|i| hub_order(i, 12, 3)).collect();
        assert_eq!(orders[0..4], [[1, 2, 3], [1, 3, 2], [1, 2, 3], [1, 3, 2]]);
        assert_eq!(orders[4..8], [[2, 3, 1], [2, 1, 3], [2, 3, 1], [2, 1, 3]]);
        assert_eq!(orders[8..12], [[3, 1, 2], [3, 2, 1], [3, 1, 2], [3, 2, 1]]);
        // One terminal per hub: each goes on to the next hub.
        assert_eq!(hub_order(1, 3, 3), [1, 2, 3]);
        assert_eq!(hub_order(3, 3, 3), [3, 1, 2]);
        assert_eq!(
            terminal_toml(6, 12, 3),
            "[peer]\naddress = [\"198.19.0.12:7400\", \"198.19.0.11:7400\", \"198.19.0.13:7400\"]\n"
        );
    }
}
