//! What `pepd status` and `pepd flows` show and SIGUSR1 logs: the snapshot the metrics take,
//! with what only an operator's view needs beside it (how long ago things happened, each
//! peer's place on the carrier, the open flows). The daemon builds it; the client reads it
//! back from JSON, so both ends share these types.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::Side;
use crate::metrics::{PeerSnapshot, Snapshot};
use crate::tunnel::gateway::Gateway;
use crate::tunnel::peer::{reset_label, AssociationState, Peer};

/// The daemon at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The daemon's version.
    pub pepd: String,
    /// Its tunnel protocol's version.
    pub protocol: u32,
    /// "terminal" or "hub".
    pub side: String,
    pub uptime_seconds: f64,
    pub carrier: CarrierStatus,
    pub gateway: GatewayStatus,
    /// In the config's order; only the one asked for when a request names a peer.
    pub peers: Vec<PeerStatus>,
}

/// What this gateway sends over the satellite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarrierStatus {
    /// `link.tx_rate`: a pair's sending rate, a hub's forward carrier.
    pub tx_rate_bps: u64,
    /// Whether peers share it (`[[peer]]` entries: each is allocated a part).
    pub shared: bool,
    /// Every peer's pacing rate added up.
    pub pacing_bps: u64,
}

/// The gateway as a whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayStatus {
    /// Peers configured, and of them those whose association is established (all of
    /// them, also when a request names one).
    pub peers: u64,
    pub peers_established: u64,
    /// Flows open with every peer, and the most `limits.max_flows` allows.
    pub flows_open: u64,
    pub max_flows: u64,
    /// What counts against `limits.memory_budget`, and the budget.
    pub memory_accounted_bytes: u64,
    pub memory_budget_bytes: u64,
    /// Every tunnel worker, by number.
    pub workers: Vec<WorkerStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub associations: u64,
    pub datagrams: u64,
    pub handed_off: u64,
    pub inbox_dropped: u64,
}

/// One configured peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    /// "connecting", "established", "outage" or "closed".
    pub state: String,
    /// How long it has been in that state (an outage: since the peer last answered).
    pub state_seconds: f64,
    /// Where its association sends; `None` before a peer of unknown address associated.
    pub endpoint: Option<SocketAddr>,
    pub endpoint_moves: u64,
    pub endpoint_moved_seconds_ago: Option<f64>,
    /// `None` before the first handshake, and without security.
    pub last_handshake_seconds_ago: Option<f64>,
    /// Since its last authenticated packet.
    pub last_packet_seconds_ago: Option<f64>,
    /// How long the outage it is in has lasted; `None` when not in one.
    pub outage_seconds: Option<f64>,
    pub rtt_seconds: f64,
    pub rtt_min_seconds: f64,
    pub queue_delay_seconds: f64,
    /// Bytes its data datagrams are cut to.
    pub datagram_size: u64,
    pub pacing_bps: u64,
    pub capacity_estimate_bps: u64,
    /// The most its congestion control may send: its allocation on a shared carrier,
    /// else its `tx_rate`.
    pub ceiling_bps: u64,
    /// Its `tx_rate`: the most it may be sent (a hub's MIR for it).
    pub tx_rate_bps: u64,
    /// Its part of a shared carrier; `None` for a pair's peer.
    pub share: Option<ShareStatus>,
    pub packets_sent: u64,
    pub lost: LostStatus,
    /// Flows with a live local TCP connection.
    pub flows_open: u64,
    /// Payload relayed from local TCP connections to the peer, and from it.
    pub bytes_to_peer: u64,
    pub bytes_from_peer: u64,
}

/// A peer's part of a hub's carrier as the scheduler last allocated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareStatus {
    pub allocated_bps: u64,
    /// Its `min_rate` (CIR) and `weight`.
    pub cir_bps: u64,
    pub weight: u32,
    /// The carrier holds it below its `tx_rate` (MIR): the others' shares take the rest.
    pub capped: bool,
}

/// Packets declared lost, by the cause the transport attributed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostStatus {
    pub congestion: u64,
    pub corruption: u64,
    pub outage: u64,
}

/// One open flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowStatus {
    pub peer: String,
    /// "intercepted": a client here opened it; "peer": opened from the other side.
    pub origin: String,
    pub client: Option<SocketAddr>,
    pub server: Option<SocketAddr>,
    pub age_seconds: f64,
    /// Bytes handed to the tunnel, and taken from it.
    pub bytes_to_peer: u64,
    pub bytes_from_peer: u64,
    /// "opening", "open", "half-closed-local", "half-closed-remote", "closing" or "reset".
    pub state: String,
    /// Why it was reset, as the metrics' `reason` label says it.
    pub reset_reason: Option<String>,
}

/// A request named a peer the gateway does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no peer is named {0:?}")]
pub struct UnknownPeer(pub String);

/// Builds the reports of one running daemon.
pub struct StatusSource {
    pub gateway: Arc<Gateway>,
    pub side: Side,
    /// The peers share the carrier (`[[peer]]` entries).
    pub shared_carrier: bool,
    pub started: Instant,
}

impl StatusSource {
    /// The daemon now; with `only`, that peer's alone.
    pub fn status(&self, only: Option<&str>) -> Result<Status, UnknownPeer> {
        let snap = Snapshot::of(&self.gateway);
        let table = self.gateway.peers.table();
        let by_name: HashMap<&str, (&Arc<Peer>, u64)> = table
            .peers
            .iter()
            .zip(&table.specs)
            .map(|(p, spec)| (&*p.name, (p, spec.tx_bps)))
            .collect();
        if let Some(name) = only {
            if !snap.peers.iter().any(|p| p.name == name) {
                return Err(UnknownPeer(name.to_owned()));
            }
        }
        let now = Instant::now();
        let peers: Vec<PeerStatus> = snap
            .peers
            .iter()
            .map(|p| self.peer_status(p, by_name.get(p.name.as_str()).copied(), now))
            .collect();
        let carrier = CarrierStatus {
            tx_rate_bps: self
                .gateway
                .carrier_bps
                .load(std::sync::atomic::Ordering::Relaxed),
            shared: self.shared_carrier,
            pacing_bps: peers.iter().map(|p| p.pacing_bps).sum(),
        };
        let gateway = GatewayStatus {
            peers: peers.len() as u64,
            peers_established: peers.iter().filter(|p| p.state == "established").count() as u64,
            flows_open: snap.relay.flows_open,
            max_flows: self.gateway.open_flows.max() as u64,
            memory_accounted_bytes: snap.memory_accounted_bytes,
            memory_budget_bytes: snap.memory_budget_bytes,
            workers: snap
                .workers
                .iter()
                .map(|w| WorkerStatus {
                    associations: w.associations,
                    datagrams: w.datagrams,
                    handed_off: w.handed_off,
                    inbox_dropped: w.inbox_dropped,
                })
                .collect(),
        };
        let (version, protocol) = snap.build_info;
        Ok(Status {
            pepd: version.to_owned(),
            protocol,
            side: match self.side {
                Side::Terminal => "terminal",
                Side::Hub => "hub",
            }
            .to_owned(),
            uptime_seconds: now.saturating_duration_since(self.started).as_secs_f64(),
            carrier,
            gateway,
            peers: peers
                .into_iter()
                .filter(|p| only.is_none_or(|n| p.name == n))
                .collect(),
        })
    }

    /// One peer: the snapshot's figures, and what its association and carrier place add.
    /// `peer`: its runtime state and configured `tx_rate`, unless a reload removed it
    /// since the snapshot.
    fn peer_status(
        &self,
        snap: &PeerSnapshot,
        peer: Option<(&Arc<Peer>, u64)>,
        now: Instant,
    ) -> PeerStatus {
        let st = &snap.stats;
        let view = peer.and_then(|(p, _)| p.association_view());
        let times = view.map(|v| v.times).unwrap_or_default();
        // Ages count from the moment the view was read, which the instants are of.
        let at = view.map_or(now, |v| v.taken);
        let ago = |t: Option<Instant>| t.map(|t| at.saturating_duration_since(t).as_secs_f64());
        let outage_seconds = match snap.state {
            AssociationState::Outage => ago(times.outage_since),
            _ => None,
        };
        let since = peer
            .and_then(|(p, _)| p.counters.state_since())
            .unwrap_or(self.started);
        let state_seconds =
            outage_seconds.unwrap_or_else(|| now.saturating_duration_since(since).as_secs_f64());
        let tx_rate_bps = view.map_or_else(|| peer.map_or(0, |(_, tx)| tx), |v| v.tx_bps);
        let share = peer
            .and_then(|(p, _)| p.carrier.get())
            .map(|a| ShareStatus {
                allocated_bps: a.allocated_bps,
                cir_bps: a.cir_bps,
                weight: a.weight,
                capped: a.allocated_bps < tx_rate_bps,
            });
        PeerStatus {
            name: snap.name.clone(),
            state: snap.state.label().to_owned(),
            state_seconds,
            endpoint: snap.endpoint,
            endpoint_moves: st.remote_moves,
            endpoint_moved_seconds_ago: ago(times.remote_moved_at),
            last_handshake_seconds_ago: ago(times.last_handshake),
            last_packet_seconds_ago: ago(times.last_received),
            outage_seconds,
            rtt_seconds: st.rtt_smoothed.as_secs_f64(),
            rtt_min_seconds: st.rtt_min.as_secs_f64(),
            queue_delay_seconds: st.capacity.queue_delay.as_secs_f64(),
            datagram_size: st.datagram_size,
            pacing_bps: st.pacing_rate_bps,
            capacity_estimate_bps: st.capacity.estimate_bps,
            ceiling_bps: share
                .as_ref()
                .map_or(tx_rate_bps, |s| s.allocated_bps.min(tx_rate_bps)),
            tx_rate_bps,
            share,
            packets_sent: st.packets_sent,
            lost: LostStatus {
                congestion: st.lost.congestion,
                corruption: st.lost.corruption,
                outage: st.lost.outage,
            },
            flows_open: snap.flows_active,
            bytes_to_peer: snap.bytes_to_peer_total,
            bytes_from_peer: snap.bytes_from_peer_total,
        }
    }

    /// The flows open now, by peer in the config's order, the oldest first; with `only`,
    /// that peer's alone.
    pub fn flows(&self, only: Option<&str>) -> Result<Vec<FlowStatus>, UnknownPeer> {
        let table = self.gateway.peers.table();
        if let Some(name) = only {
            if !table.peers.iter().any(|p| &*p.name == name) {
                return Err(UnknownPeer(name.to_owned()));
            }
        }
        let now = Instant::now();
        let mut out = Vec::new();
        for peer in table
            .peers
            .iter()
            .filter(|p| only.is_none_or(|n| &*p.name == n))
        {
            let mut flows = peer.flows();
            flows.sort_by_key(|f| (f.opened, f.id));
            out.extend(flows.into_iter().map(|f| {
                let i = f.info;
                let reset_reason = match i.state {
                    pep_transport::FlowState::Reset(r) => Some(reset_label(r).to_owned()),
                    _ => None,
                };
                FlowStatus {
                    peer: peer.name.to_string(),
                    origin: if i.opened_here { "intercepted" } else { "peer" }.to_owned(),
                    client: i.meta.map(|m| m.client),
                    server: i.meta.map(|m| m.server),
                    age_seconds: now.saturating_duration_since(f.opened).as_secs_f64(),
                    bytes_to_peer: i.bytes_written,
                    bytes_from_peer: i.bytes_read,
                    state: i.state.label().to_owned(),
                    reset_reason,
                }
            }));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
