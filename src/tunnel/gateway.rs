//! The gateway's peers: one [`Peer`] per configured peer, the route table that picks the
//! peer an intercepted connection goes to, the counters that belong to no single peer, and
//! what the metrics report (today's series, summed over the peers by [`totals`]).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use pep_transport::{EndpointStats, Stats};
#[cfg(test)]
use tokio::sync::Notify;

use crate::config::TrafficClasses;
use crate::tunnel::flowcount::{OpenFlow, OpenFlows};
use crate::tunnel::memory::MemoryAccount;
use crate::tunnel::peer::{Peer, PeerCounters};
use crate::tunnel::peer_table::{PeerSet, PeerTable};
use crate::tunnel::state_feed::StateFeed;
use crate::tunnel::totals;
use crate::tunnel::workers::Workers;

pub struct Gateway {
    /// The configured peers, which a reload may change.
    pub peers: PeerSet,
    pub counters: GatewayCounters,
    /// `[link] tx_rate`, which a reload may change: with `[[peer]]` entries the carrier the
    /// peers share.
    pub carrier_bps: AtomicU64,
    /// The workers the peers are spread over (one for a pair and a terminal); each peer
    /// holds its owner's wake-up.
    pub workers: Workers,
    /// The memory budget and what counts against it: one for the gateway, every peer holds
    /// it, as `limits.memory_budget` is the process's.
    pub memory: Arc<MemoryAccount>,
    /// The flows open with every peer, which `limits.max_flows` bounds.
    pub open_flows: Arc<OpenFlows>,
    /// What the peers a reload removed had counted, so that the gateway's totals (counters
    /// to Prometheus) never go back when a peer's series go.
    retired: Retired,
    /// `[[class]]`: the traffic class each new flow is put in.
    pub classes: TrafficClasses,
    /// Every peer's association state change, for the announcements.
    pub states: StateFeed,
}

#[derive(Default)]
struct Retired {
    counters: PeerCounters,
    /// Counters only: a removed association has no path gauges.
    stats: Mutex<Stats>,
    restarts: AtomicU64,
}

/// Counters of the gateway as a whole: interception happens before a connection is routed
/// to a peer, and the tunnel socket is shared.
#[derive(Default)]
pub struct GatewayCounters {
    pub flows_intercepted: AtomicU64,
    /// Intercepted connections refused: a limit, no route with `[rules] fail = "closed"`,
    /// or a flow a peer may not open (isolation).
    pub flows_refused: AtomicU64,
    /// Intercepted connections relayed unproxied: a limit, or no route with `[rules] fail
    /// = "open"`.
    pub flows_bypassed: AtomicU64,
    /// Of the above, connections whose destination no peer's subnets hold.
    pub flows_unrouted: AtomicU64,
    /// Flows a peer opened that it may not (a source outside its subnets, or a destination
    /// routed to another peer); counted in `flows_refused` too.
    pub flows_isolated: AtomicU64,
    pub accept_errors: AtomicU64,
    pub inspect_errors: AtomicU64,
    /// Datagrams on the tunnel socket from an address no peer may send from.
    pub foreign_datagrams: AtomicU64,
    /// Each worker's endpoint shard's drops, as its driver last saw them.
    pub endpoint: Mutex<Vec<EndpointStats>>,
}

impl GatewayCounters {
    /// Every shard's.
    pub fn endpoints(&self) -> Vec<EndpointStats> {
        self.endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_endpoint(&self, worker: usize, stats: EndpointStats) {
        let mut e = self.endpoint.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() <= worker {
            e.resize(worker + 1, EndpointStats::default());
        }
        e[worker] = stats;
    }
}

impl Gateway {
    /// The gateway of `peers`, with the carrier at `carrier_bps` and at most `max_flows`
    /// flows open across the peers, on one worker.
    #[cfg(test)]
    pub fn new(
        peers: PeerTable,
        carrier_bps: u64,
        wake: Arc<Notify>,
        memory: Arc<MemoryAccount>,
        max_flows: usize,
    ) -> Gateway {
        let workers = Workers::new(1, wake);
        Gateway::on_workers(peers, carrier_bps, workers, memory, max_flows)
    }

    /// As [`new`](Self::new), the peers spread over `workers`.
    pub fn on_workers(
        peers: PeerTable,
        carrier_bps: u64,
        workers: Workers,
        memory: Arc<MemoryAccount>,
        max_flows: usize,
    ) -> Gateway {
        Gateway {
            peers: PeerSet::new(peers, workers.count()),
            counters: GatewayCounters::default(),
            carrier_bps: AtomicU64::new(carrier_bps),
            workers,
            memory,
            open_flows: Arc::new(OpenFlows::new(max_flows)),
            retired: Retired::default(),
            classes: TrafficClasses::default(),
            states: StateFeed::default(),
        }
    }

    /// Puts new flows in `classes`.
    pub fn with_classes(mut self, classes: TrafficClasses) -> Gateway {
        self.classes = classes;
        self
    }

    /// Keeps what a removed peer counted in the gateway's totals; `stats`: its
    /// association's last, if it had one.
    pub fn retire(&self, peer: &Peer, stats: Option<Stats>) {
        let get = PeerCounters::get;
        let c = &peer.counters;
        self.retired.counters.add_totals(c);
        PeerCounters::add(
            &self.retired.restarts,
            get(&c.associations_established).saturating_sub(1),
        );
        if let Some(s) = stats {
            let mut r = self.retired.stats.lock().unwrap_or_else(|p| p.into_inner());
            totals::add_association(&mut r, &totals::counters_only(s));
        }
    }

    /// A place for one more flow, either side's, or `None` while `limits.max_flows` are open
    /// across the peers.
    pub fn take_flow_slot(&self) -> Option<OpenFlow> {
        if self.peers.table().peers.len() > 1 {
            return self.open_flows.try_take();
        }
        // One peer's own limit, never above the gateway's, bounds the total already. Its
        // association counts a flow until the transport ends it, this count until the relay
        // does: checked here too, a pair could refuse a flow it takes today in between.
        Some(self.open_flows.take())
    }

    /// The peers now.
    pub fn peers(&self) -> Vec<Arc<Peer>> {
        self.peers.table().peers.clone()
    }

    /// The peer an intercepted connection to `server` goes to, if any.
    pub fn route(&self, server: std::net::IpAddr) -> Option<Arc<Peer>> {
        self.peers.table().route(server).cloned()
    }

    /// Relays running over every peer (what a drain waits for).
    pub fn relays_active(&self) -> u64 {
        self.peers
            .table()
            .peers
            .iter()
            .map(|l| PeerCounters::get(&l.counters.relays_active))
            .sum()
    }

    /// Every association's stats added up, with the endpoint's drops, and the bytes they
    /// buffer to send and received.
    pub fn stats(&self) -> (Stats, u64, u64) {
        let mut total: Option<Stats> = None;
        let (mut send, mut recv) = (0, 0);
        for peer in &self.peers.table().peers {
            let Some((s, sent, received)) = peer.stats() else {
                continue;
            };
            send += sent;
            recv += received;
            match total.as_mut() {
                None => total = Some(s),
                Some(t) => totals::add_association(t, &s),
            }
        }
        let mut total = total.unwrap_or_default();
        totals::add_association(
            &mut total,
            &self.retired.stats.lock().unwrap_or_else(|p| p.into_inner()),
        );
        for e in &self.counters.endpoints() {
            totals::add_endpoint(&mut total, e);
        }
        (total, send, recv)
    }

    /// What the peers a reload removed had counted.
    pub fn retired_counters(&self) -> &PeerCounters {
        &self.retired.counters
    }

    /// Restarts of the associations of the peers a reload removed.
    pub fn retired_restarts(&self) -> u64 {
        PeerCounters::get(&self.retired.restarts)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::tunnel::memory::FlowCharge;

    use super::*;

    fn peer(id: u32, name: &str, memory: &Arc<MemoryAccount>, wake: &Arc<Notify>) -> Arc<Peer> {
        let l = Peer::new(
            pep_transport::PeerId(id),
            name,
            None,
            1 << 20,
            memory.clone(),
            wake.clone(),
        );
        Arc::new(l)
    }

    #[test]
    fn a_removed_peer_s_counts_stay_in_the_totals_and_its_series_go() {
        let memory = Arc::new(MemoryAccount::new(1 << 30, 0, 0));
        let wake = Arc::new(Notify::new());
        let (a, b) = (peer(0, "a", &memory, &wake), peer(1, "b", &memory, &wake));
        for (l, n) in [(&a, 3), (&b, 5)] {
            PeerCounters::add(&l.counters.bytes_to_peer, 1000 * n);
            PeerCounters::add(&l.counters.flows_from_peer, n);
            PeerCounters::add(&l.counters.associations_established, n);
            l.counters
                .flow_resets
                .add(pep_transport::ResetReason::Aborted);
        }
        let gateway = Gateway::new(
            PeerTable::new(vec![a.clone(), b.clone()], Vec::new()),
            0,
            wake,
            memory,
            10_000,
        );
        let before = crate::metrics::Snapshot::of(&gateway);
        assert_eq!(before.relay.bytes_to_peer_total, 8000);
        let b_stats = Stats {
            packets_sent: 70,
            rtt_smoothed: Duration::from_secs(9),
            flows_open: 2,
            ..Stats::default()
        };
        gateway.peers.replace(
            PeerTable::new(vec![a], Vec::new()),
            crate::tunnel::peer_table::PeerChange {
                removed: vec![b.clone()],
                added: Vec::new(),
            },
        );
        gateway.retire(&b, Some(b_stats));
        let after = crate::metrics::Snapshot::of(&gateway);
        assert_eq!(after.relay.bytes_to_peer_total, 8000);
        assert_eq!(after.relay.flows_from_peer_total, 8);
        assert_eq!(after.association_restarts, 2 + 4);
        assert_eq!(after.relay.flow_resets, before.relay.flow_resets);
        assert_eq!(after.stats.packets_sent, 70);
        assert_eq!(
            after.stats.rtt_smoothed,
            Duration::ZERO,
            "no gauge of b's stays"
        );
        assert_eq!(after.stats.flows_open, 0);
        let names: Vec<&str> = after.peers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a"]);
    }

    #[test]
    fn max_flows_bounds_every_peer_s_flows_together_and_one_peer_s_own_bound_it_alone() {
        let memory = Arc::new(MemoryAccount::new(1 << 30, 0, 0));
        let wake = Arc::new(Notify::new());
        let (a, b) = (peer(0, "a", &memory, &wake), peer(1, "b", &memory, &wake));
        let gateway = Gateway::new(
            PeerTable::new(vec![a.clone(), b.clone()], Vec::new()),
            0,
            wake,
            memory.clone(),
            3,
        );
        // As the driver and the interception take them: a flow each side opened, each
        // slot riding with the flow's memory charge.
        let charge = |l: &Peer| Some(l.charge_flow().with_slot(gateway.take_flow_slot()?));
        let mut open: Vec<FlowCharge> =
            [&a, &b, &a].into_iter().filter_map(|l| charge(l)).collect();
        assert_eq!(open.len(), 3);
        assert!(charge(&b).is_none(), "the 4th across both peers");
        assert_eq!((gateway.open_flows.open(), memory.flows()), (3, 3));
        assert_eq!(crate::metrics::Snapshot::of(&gateway).relay.flows_open, 3);
        open.pop();
        assert_eq!(crate::metrics::Snapshot::of(&gateway).relay.flows_open, 2);
        open.push(charge(&b).expect("room the ended flow left"));
        gateway.open_flows.set_max(1);
        assert!(
            charge(&a).is_none(),
            "a lower max refuses, the open flows stay"
        );
        assert_eq!(gateway.open_flows.open(), 3);
        // With one peer left, its own limit bounds the total: the count goes on, unbounded.
        gateway.peers.replace(
            PeerTable::new(vec![a.clone()], Vec::new()),
            crate::tunnel::peer_table::PeerChange {
                removed: vec![b],
                added: Vec::new(),
            },
        );
        open.push(charge(&a).expect("one peer"));
        assert_eq!(gateway.open_flows.open(), 4);
        open.clear();
        assert_eq!((gateway.open_flows.open(), memory.flows()), (0, 0));
        assert_eq!(crate::metrics::Snapshot::of(&gateway).relay.flows_open, 0);
    }
}
