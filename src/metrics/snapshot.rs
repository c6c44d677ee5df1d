//! What the daemon reports at one instant, collected from the gateway's peers, workers and
//! counters: each scrape takes a fresh one.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::tunnel::gateway::Gateway;
use crate::tunnel::peer::{AssociationState, Peer, PeerCounters};
use crate::tunnel::workers::owner;

/// Relay-side counters: the TCP half of the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelaySnapshot {
    /// Flows with a live local TCP connection.
    pub flows_active: u64,
    /// Flows counted against `limits.max_flows`: with every peer, from their open to their
    /// relay's end.
    pub flows_open: u64,
    /// TCP connections intercepted locally and opened as flows towards the peer.
    pub flows_intercepted_total: u64,
    /// Flows the peer opened, connected out from here.
    pub flows_from_peer_total: u64,
    /// Intercepted connections refused because a limit was reached (`over_limit = refuse`).
    pub flows_refused_total: u64,
    /// Intercepted connections relayed unproxied because a limit was reached
    /// (`over_limit = bypass`).
    pub flows_bypassed_total: u64,
    /// Intercepted connections no peer's subnets hold; also in refused or bypassed, as
    /// `[rules] fail` decided.
    pub flows_unrouted_total: u64,
    /// Flows a peer opened that it may not (isolation); also in refused.
    pub flows_isolated_total: u64,
    /// Read from local TCP connections into the tunnel.
    pub bytes_to_peer_total: u64,
    /// Written from the tunnel to local TCP connections.
    pub bytes_from_peer_total: u64,
    /// Upstream connects that failed, by the reset reason they became (`refused`,
    /// `unreachable`, `timeout`, `resource_limit`, ...).
    pub connect_errors: Vec<(&'static str, u64)>,
    /// Interception failures, by reason (`accept`, `inspect`).
    pub intercept_errors: Vec<(&'static str, u64)>,
    /// Flows reset, by reason (`aborted`, `refused`, `unreachable`, `timeout`,
    /// `peer_restart`, `outage_limit`, `resource_limit`, `protocol`, `closed`, ...).
    pub flow_resets: Vec<(&'static str, u64)>,
    /// Flows reset because their local TCP side took nothing for
    /// `limits.stalled_flow_timeout` under contention (also `resource_limit` above).
    pub flows_reset_stalled_total: u64,
    /// What the relays of compressed flows did.
    pub compression: CompressionSnapshot,
}

/// The relays' compression, summed over the peers (flows whose streams are blocks only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompressionSnapshot {
    /// Application bytes read from TCP into blocks, and the bytes of those blocks.
    pub plain_sent: u64,
    pub blocks_sent: u64,
    /// Bytes of blocks taken from the flows, and the application bytes they decoded to.
    pub blocks_received: u64,
    pub plain_received: u64,
    /// Blocks sent, by treatment (`raw`, `fast`, `hard`).
    pub blocks_by_level: Vec<(&'static str, u64)>,
    /// Blocks sent raw because the budget had no room for a compressed one.
    pub over_budget: u64,
    pub compress_ns: u64,
    pub decompress_ns: u64,
    /// Flows reset for blocks the peer sent that were refused, by reason.
    pub refused: Vec<(&'static str, u64)>,
}

/// Everything the daemon reports at one instant; the daemon fills it at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub stats: pep_transport::Stats,
    /// Each peer's association, in config order.
    pub associations: Vec<AssociationState>,
    /// Times the association was (re)established after a loss or a peer restart.
    pub association_restarts: u64,
    pub relay: RelaySnapshot,
    /// Payload in the transport's buffers, both directions.
    pub memory_in_use_bytes: u64,
    /// Everything counted against the budget: fixed costs, per-flow costs and payload.
    pub memory_accounted_bytes: u64,
    pub memory_budget_bytes: u64,
    /// Datagrams dropped because they did not come from the peer.
    pub tunnel_foreign_datagrams: u64,
    /// COOKIEs the endpoint sent instead of doing a handshake's Diffie-Hellman.
    pub cookies_sent: u64,
    /// HINTs the endpoint sent for short packets of connection IDs it does not hold.
    pub hints_sent: u64,
    /// Such packets that got no HINT, the budgets being spent.
    pub hints_rate_limited: u64,
    /// (daemon version, transport protocol version).
    pub build_info: (&'static str, u32),
    /// Each configured peer's own series, in config order.
    pub peers: Vec<PeerSnapshot>,
    /// Each worker thread's share, by number (one for a pair and a terminal).
    pub workers: Vec<WorkerSnapshot>,
    /// The traffic classes' names by number (`stats.traffic_classes` has their figures);
    /// empty without `[[class]]`.
    pub traffic_classes: Vec<String>,
    /// The announcement routes; `None` without `[announce]`.
    pub announce: Option<AnnounceSnapshot>,
}

/// The announcement routes (`[announce]`) at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnnounceSnapshot {
    /// Prefixes of terminals whose association is established, in `announce.table`.
    pub serving: u64,
    /// Prefixes of terminals whose association is in an outage, in `announce.outage_table`.
    pub outage: u64,
    /// `ip` batches (and reads of the tables) that failed.
    pub errors: u64,
}

/// One worker thread of a hub at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSnapshot {
    /// Associations of the peers it serves.
    pub associations: u64,
    /// Datagrams its socket read.
    pub datagrams: u64,
    /// Of them, handed to the worker that owns their association.
    pub handed_off: u64,
    /// Handoffs to it dropped because its inbox was full.
    pub inbox_dropped: u64,
}

/// One configured peer at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerSnapshot {
    /// Its configured name: the `peer` label.
    pub name: String,
    pub state: AssociationState,
    /// Where its association sends now: configured, learned from its initiation, or moved
    /// by roaming. `None` before a peer without a configured address has associated.
    pub endpoint: Option<SocketAddr>,
    /// Which hub of a terminal's address list serves it (0: the preferred); `None` with
    /// one address.
    pub hub_rank: Option<u64>,
    /// Its association's counters (all zero while it has none).
    pub stats: pep_transport::Stats,
    /// Flows with a live local TCP connection.
    pub flows_active: u64,
    pub bytes_to_peer_total: u64,
    pub bytes_from_peer_total: u64,
    /// Flows reset, by reason (either side's).
    pub flow_resets: Vec<(&'static str, u64)>,
    /// New flows, either side's, the memory budget had no room for.
    pub flows_over_budget: u64,
    /// New flows, either side's, refused while `limits.max_flows` were open across the peers.
    pub flows_over_gateway: u64,
    /// Flows with this peer reset because their local TCP side stalled under contention.
    pub flows_reset_stalled: u64,
}

impl Snapshot {
    /// What the metrics endpoint serves at this instant.
    pub fn of(gateway: &Gateway) -> Snapshot {
        let (stats, send, recv) = gateway.stats();
        let peers = gateway.peers();
        let counters: Vec<&PeerCounters> = peers
            .iter()
            .map(|l| &l.counters)
            .chain([gateway.retired_counters()])
            .collect();
        let get = PeerCounters::get;
        let sum = |f: fn(&PeerCounters) -> &AtomicU64| -> u64 {
            counters.iter().map(|c| get(f(c))).sum()
        };
        let by_reason = |f: fn(&PeerCounters) -> Vec<(&'static str, u64)>| {
            let mut total: Vec<(&'static str, u64)> = Vec::new();
            for c in &counters {
                for (i, (label, n)) in f(c).into_iter().enumerate() {
                    match total.get_mut(i) {
                        Some(t) => t.1 += n,
                        None => total.push((label, n)),
                    }
                }
            }
            total
        };
        let c = &gateway.counters;
        Snapshot {
            stats,
            associations: peers.iter().map(|l| l.counters.state()).collect(),
            association_restarts: peers
                .iter()
                .map(|l| get(&l.counters.associations_established).saturating_sub(1))
                .sum::<u64>()
                + gateway.retired_restarts(),
            relay: RelaySnapshot {
                flows_active: sum(|c| &c.relays_active),
                flows_open: gateway.open_flows.open() as u64,
                flows_intercepted_total: get(&c.flows_intercepted),
                flows_from_peer_total: sum(|c| &c.flows_from_peer),
                flows_refused_total: get(&c.flows_refused),
                flows_bypassed_total: get(&c.flows_bypassed),
                flows_unrouted_total: get(&c.flows_unrouted),
                flows_isolated_total: get(&c.flows_isolated),
                bytes_to_peer_total: sum(|c| &c.bytes_to_peer),
                bytes_from_peer_total: sum(|c| &c.bytes_from_peer),
                connect_errors: by_reason(|c| c.connect_errors.snapshot()),
                intercept_errors: vec![
                    ("accept", get(&c.accept_errors)),
                    ("inspect", get(&c.inspect_errors)),
                ],
                flow_resets: by_reason(|c| c.flow_resets.snapshot()),
                flows_reset_stalled_total: sum(|c| &c.flows_reset_stalled),
                compression: CompressionSnapshot {
                    plain_sent: sum(|c| &c.compression.plain_sent),
                    blocks_sent: sum(|c| &c.compression.blocks_sent),
                    blocks_received: sum(|c| &c.compression.blocks_received),
                    plain_received: sum(|c| &c.compression.plain_received),
                    blocks_by_level: vec![
                        ("raw", sum(|c| &c.compression.sent_raw)),
                        ("fast", sum(|c| &c.compression.sent_fast)),
                        ("hard", sum(|c| &c.compression.sent_hard)),
                    ],
                    over_budget: sum(|c| &c.compression.over_budget),
                    compress_ns: sum(|c| &c.compression.compress_ns),
                    decompress_ns: sum(|c| &c.compression.decompress_ns),
                    refused: pep_compress::BlockError::REASONS
                        .iter()
                        .enumerate()
                        .map(|(i, r)| {
                            let n = counters
                                .iter()
                                .map(|c| get(&c.compression.refused[i]))
                                .sum();
                            (*r, n)
                        })
                        .collect(),
                },
            },
            memory_in_use_bytes: send + recv,
            memory_accounted_bytes: gateway.memory.accounted(send, recv),
            memory_budget_bytes: gateway.memory.budget(),
            tunnel_foreign_datagrams: get(&c.foreign_datagrams),
            cookies_sent: c.endpoints().iter().map(|e| e.cookies_sent).sum(),
            hints_sent: c.endpoints().iter().map(|e| e.hints_sent).sum(),
            hints_rate_limited: c.endpoints().iter().map(|e| e.hints_rate_limited).sum(),
            workers: worker_snapshots(gateway, &peers),
            build_info: (env!("CARGO_PKG_VERSION"), pep_transport::PROTOCOL_VERSION),
            peers: peers.iter().map(|l| peer_snapshot(l)).collect(),
            traffic_classes: gateway.classes.names(),
            // The announcements are the daemon's, not the gateway's: it adds them.
            announce: None,
        }
    }
}

/// Each worker's associations (of `peers`) and datagrams.
fn worker_snapshots(gateway: &Gateway, peers: &[Arc<Peer>]) -> Vec<WorkerSnapshot> {
    let count = gateway.workers.count();
    let mut held = vec![0u64; count];
    for l in peers {
        if l.lock().assoc.is_some() {
            held[owner(l.id, count)] += 1;
        }
    }
    let get = PeerCounters::get;
    gateway
        .workers
        .iter()
        .zip(held)
        .map(|(w, associations)| WorkerSnapshot {
            associations,
            datagrams: get(&w.datagrams),
            handed_off: get(&w.handed_off),
            inbox_dropped: get(&w.inbox_dropped),
        })
        .collect()
}

/// One peer's own series.
fn peer_snapshot(peer: &Peer) -> PeerSnapshot {
    let c = &peer.counters;
    let get = PeerCounters::get;
    PeerSnapshot {
        name: peer.name.to_string(),
        state: c.state(),
        endpoint: peer.remote(),
        hub_rank: peer.hub_rank(),
        stats: peer.stats().map(|(s, _, _)| s).unwrap_or_default(),
        flows_active: get(&c.relays_active),
        bytes_to_peer_total: get(&c.bytes_to_peer),
        bytes_from_peer_total: get(&c.bytes_from_peer),
        flow_resets: c.flow_resets.snapshot(),
        flows_over_budget: get(&c.flows_over_budget),
        flows_over_gateway: get(&c.flows_over_gateway),
        flows_reset_stalled: get(&c.flows_reset_stalled),
    }
}
