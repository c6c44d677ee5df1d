//! The series of each configured peer, labelled `peer` with its configured name: never with
//! an address, so a peer that roams keeps its series and a hub has a bounded number of them
//! (the current address is one label of one gauge, replaced on a move).

use std::fmt;
use std::net::SocketAddr;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::{dropped_by_reason, merged};
use crate::tunnel::peer::AssociationState;

/// One configured peer at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerSnapshot {
    /// Its configured name: the `peer` label.
    pub name: String,
    pub state: AssociationState,
    /// Where its association sends now: configured, learned from its initiation, or moved
    /// by roaming. `None` before a peer without a configured address has associated.
    pub endpoint: Option<SocketAddr>,
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

/// Every per-peer family; nothing for a gateway without peers.
pub(super) fn encode(e: &mut DescriptorEncoder, peers: &[PeerSnapshot]) -> fmt::Result {
    let bytes = Some(&Unit::Bytes);
    let gauge = MetricType::Gauge;
    let counter = MetricType::Counter;
    family(
        e,
        (
            "peer_association_state",
            "Whether this peer's association is in this state (1) or not (0)",
            None,
            gauge,
        ),
        Some("state"),
        peers,
        |p| {
            AssociationState::ALL
                .iter()
                .map(|&s| (s.label().to_owned(), u64::from(p.state == s)))
                .collect()
        },
        encode_gauge,
    )?;
    family(
        e,
        ("peer_endpoint", "Where this peer's association sends now (1; the address is a label, replaced when the peer moves)", None, gauge),
        Some("address"),
        peers,
        |p| p.endpoint.iter().map(|a| (a.to_string(), 1)).collect(),
        encode_gauge,
    )?;
    family(
        e,
        ("peer_aead", "The AEAD of this peer's keys in use (1; the AEAD is a label, absent until a handshake completes)", None, gauge),
        Some("aead"),
        peers,
        |p| p.stats.aead.iter().map(|a| (a.name().to_owned(), 1)).collect(),
        encode_gauge,
    )?;
    family(
        e,
        ("peer_endpoint_moves", "Times this peer proved it is at a new address (roaming, NAT rebinding) and was followed there", None, counter),
        None,
        peers,
        |p| vec![(String::new(), p.stats.remote_moves)],
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_wire",
            "Tunnel datagram bytes to and from this peer, overhead included",
            bytes,
            counter,
        ),
        Some("direction"),
        peers,
        |p| {
            let s = &p.stats;
            owned(&[
                ("sent", s.wire_bytes_sent),
                ("received", s.wire_bytes_received),
            ])
        },
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_relay",
            "Payload relayed between local TCP connections and this peer",
            bytes,
            counter,
        ),
        Some("direction"),
        peers,
        |p| {
            owned(&[
                ("to_peer", p.bytes_to_peer_total),
                ("from_peer", p.bytes_from_peer_total),
            ])
        },
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_flows_active",
            "Flows with this peer that have a live local TCP connection",
            None,
            gauge,
        ),
        None,
        peers,
        |p| vec![(String::new(), p.flows_active)],
        encode_gauge,
    )?;
    family(
        e,
        (
            "peer_flows_opened",
            "Flows this peer's association opened, either side's",
            None,
            counter,
        ),
        None,
        peers,
        |p| vec![(String::new(), p.stats.flows_opened_total)],
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_flow_resets",
            "Flows with this peer reset, by reason (either side's)",
            None,
            counter,
        ),
        Some("reason"),
        peers,
        |p| owned(&merged(&p.flow_resets)),
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_flows_reset_stalled",
            "Flows with this peer reset because their local TCP side took none of the bytes \
             waiting for it for limits.stalled_flow_timeout under contention",
            None,
            counter,
        ),
        None,
        peers,
        |p| vec![(String::new(), p.flows_reset_stalled)],
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_flows_over_limit",
            "New flows with this peer, either side's, over a limit: its own `max_flows` \
             open already, the gateway's memory budget full, or the gateway's \
             `limits.max_flows` open across the peers",
            None,
            counter,
        ),
        Some("reason"),
        peers,
        |p| {
            owned(&[
                ("peer_max_flows", p.stats.flows_over_limit),
                ("memory_budget", p.flows_over_budget),
                ("gateway_max_flows", p.flows_over_gateway),
            ])
        },
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_packets_lost",
            "Packets to this peer declared lost, by attributed cause",
            None,
            counter,
        ),
        Some("cause"),
        peers,
        |p| {
            let l = &p.stats.lost;
            owned(&[
                ("congestion", l.congestion),
                ("corruption", l.corruption),
                ("outage", l.outage),
            ])
        },
        encode_counter,
    )?;
    family(
        e,
        (
            "peer_datagrams_dropped",
            "Datagrams routed to this peer's association and dropped there, by reason",
            None,
            counter,
        ),
        Some("reason"),
        peers,
        // Foreign datagrams belong to no peer: the gateway-wide series counts them.
        |p| {
            let mut reasons = dropped_by_reason(&p.stats, 0);
            reasons.retain(|&(r, _)| r != "foreign");
            owned(&reasons)
        },
        encode_counter,
    )
}

/// (name, help, unit, type) of a family.
type Descriptor<'a> = (&'a str, &'a str, Option<&'a Unit>, MetricType);

/// One family with a series per peer and, with `label`, per value of that label.
fn family(
    e: &mut DescriptorEncoder,
    (name, help, unit, ty): Descriptor<'_>,
    label: Option<&str>,
    peers: &[PeerSnapshot],
    values: impl Fn(&PeerSnapshot) -> Vec<(String, u64)>,
    encode_value: fn(MetricEncoder<'_>, u64) -> fmt::Result,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, ty)?;
    for p in peers {
        for (value, x) in values(p) {
            let mut labels = vec![("peer", p.name.as_str())];
            if let Some(label) = label {
                labels.push((label, value.as_str()));
            }
            encode_value(m.encode_family(&labels)?, x)?;
        }
    }
    Ok(())
}

fn encode_counter(m: MetricEncoder<'_>, x: u64) -> fmt::Result {
    ConstCounter::new(x).encode(m)
}

fn encode_gauge(m: MetricEncoder<'_>, x: u64) -> fmt::Result {
    ConstGauge::new(x).encode(m)
}

fn owned(values: &[(&str, u64)]) -> Vec<(String, u64)> {
    values.iter().map(|&(l, x)| (l.to_owned(), x)).collect()
}
