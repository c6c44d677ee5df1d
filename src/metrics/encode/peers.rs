//! The series of each configured peer, labelled `peer` with its configured name: never with
//! an address, so a peer that roams keeps its series and a hub has a bounded number of them
//! (the current address is one label of one gauge, replaced on a move). One table lists
//! the families in the order a scrape shows them.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::{dropped_by_reason, merged, BYTES};
use crate::metrics::PeerSnapshot;
use crate::tunnel::peer::AssociationState;

/// Every per-peer family; nothing for a gateway without peers.
pub(super) fn encode(e: &mut DescriptorEncoder, peers: &[PeerSnapshot]) -> fmt::Result {
    for f in FAMILIES {
        f.encode(e, peers)?;
    }
    Ok(())
}

/// One family with a series per peer and, with `label`, per value of that label.
struct PeerFamily {
    name: &'static str,
    help: &'static str,
    unit: Option<&'static Unit>,
    kind: Kind,
    label: Option<&'static str>,
    /// A peer's series: the label's value (empty without a label) and the number.
    values: fn(&PeerSnapshot) -> Vec<(String, u64)>,
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

const FAMILIES: &[PeerFamily] = &[
    PeerFamily {
        name: "peer_association_state",
        help: "Whether this peer's association is in this state (1) or not (0)",
        unit: None,
        kind: Kind::Gauge,
        label: Some("state"),
        values: |p| {
            AssociationState::ALL
                .iter()
                .map(|&s| (s.label().to_owned(), u64::from(p.state == s)))
                .collect()
        },
    },
    PeerFamily {
        name: "peer_endpoint",
        help: "Where this peer's association sends now (1; the address is a label, replaced when the peer moves)",
        unit: None,
        kind: Kind::Gauge,
        label: Some("address"),
        values: |p| p.endpoint.iter().map(|a| (a.to_string(), 1)).collect(),
    },
    PeerFamily {
        name: "peer_hub_rank",
        help: "Which hub of this terminal's address list serves it (0: the first, preferred); absent with one address",
        unit: None,
        kind: Kind::Gauge,
        label: None,
        values: |p| p.hub_rank.iter().map(|&r| (String::new(), r)).collect(),
    },
    PeerFamily {
        name: "peer_aead",
        help: "The AEAD of this peer's keys in use (1; the AEAD is a label, absent until a handshake completes)",
        unit: None,
        kind: Kind::Gauge,
        label: Some("aead"),
        values: |p| p.stats.aead.iter().map(|a| (a.name().to_owned(), 1)).collect(),
    },
    PeerFamily {
        name: "peer_endpoint_moves",
        help: "Times this peer proved it is at a new address (roaming, NAT rebinding) and was followed there",
        unit: None,
        kind: Kind::Counter,
        label: None,
        values: |p| vec![(String::new(), p.stats.remote_moves)],
    },
    PeerFamily {
        name: "peer_wire",
        help: "Tunnel datagram bytes to and from this peer, overhead included",
        unit: BYTES,
        kind: Kind::Counter,
        label: Some("direction"),
        values: |p| {
            let s = &p.stats;
            owned(&[
                ("sent", s.wire_bytes_sent),
                ("received", s.wire_bytes_received),
            ])
        },
    },
    PeerFamily {
        name: "peer_relay",
        help: "Payload relayed between local TCP connections and this peer",
        unit: BYTES,
        kind: Kind::Counter,
        label: Some("direction"),
        values: |p| {
            owned(&[
                ("to_peer", p.bytes_to_peer_total),
                ("from_peer", p.bytes_from_peer_total),
            ])
        },
    },
    PeerFamily {
        name: "peer_flows_active",
        help: "Flows with this peer that have a live local TCP connection",
        unit: None,
        kind: Kind::Gauge,
        label: None,
        values: |p| vec![(String::new(), p.flows_active)],
    },
    PeerFamily {
        name: "peer_flows_opened",
        help: "Flows this peer's association opened, either side's",
        unit: None,
        kind: Kind::Counter,
        label: None,
        values: |p| vec![(String::new(), p.stats.flows_opened_total)],
    },
    PeerFamily {
        name: "peer_flow_resets",
        help: "Flows with this peer reset, by reason (either side's)",
        unit: None,
        kind: Kind::Counter,
        label: Some("reason"),
        values: |p| owned(&merged(&p.flow_resets)),
    },
    PeerFamily {
        name: "peer_flows_reset_stalled",
        help: "Flows with this peer reset because their local TCP side took none of the bytes \
               waiting for it for limits.stalled_flow_timeout under contention",
        unit: None,
        kind: Kind::Counter,
        label: None,
        values: |p| vec![(String::new(), p.flows_reset_stalled)],
    },
    PeerFamily {
        name: "peer_flows_over_limit",
        help: "New flows with this peer, either side's, over a limit: its own `max_flows` \
               open already, the gateway's memory budget full, or the gateway's \
               `limits.max_flows` open across the peers",
        unit: None,
        kind: Kind::Counter,
        label: Some("reason"),
        values: |p| {
            owned(&[
                ("peer_max_flows", p.stats.flows_over_limit),
                ("memory_budget", p.flows_over_budget),
                ("gateway_max_flows", p.flows_over_gateway),
            ])
        },
    },
    PeerFamily {
        name: "peer_packets_lost",
        help: "Packets to this peer declared lost, by attributed cause",
        unit: None,
        kind: Kind::Counter,
        label: Some("cause"),
        values: |p| {
            let l = &p.stats.lost;
            owned(&[
                ("congestion", l.congestion),
                ("corruption", l.corruption),
                ("outage", l.outage),
            ])
        },
    },
    PeerFamily {
        name: "peer_datagrams_dropped",
        help: "Datagrams routed to this peer's association and dropped there, by reason",
        unit: None,
        kind: Kind::Counter,
        label: Some("reason"),
        // Foreign datagrams belong to no peer: the gateway-wide series counts them.
        values: |p| {
            let mut reasons = dropped_by_reason(&p.stats, 0);
            reasons.retain(|&(r, _)| r != "foreign");
            owned(&reasons)
        },
    },
];

impl PeerFamily {
    fn encode(&self, e: &mut DescriptorEncoder, peers: &[PeerSnapshot]) -> fmt::Result {
        let mut m = e.encode_descriptor(self.name, self.help, self.unit, self.kind.into())?;
        for p in peers {
            for (value, x) in (self.values)(p) {
                let mut labels = vec![("peer", p.name.as_str())];
                if let Some(label) = self.label {
                    labels.push((label, value.as_str()));
                }
                self.kind.encode(m.encode_family(&labels)?, x)?;
            }
        }
        Ok(())
    }
}

impl Kind {
    fn encode(self, m: MetricEncoder<'_>, x: u64) -> fmt::Result {
        match self {
            Kind::Counter => ConstCounter::new(x).encode(m),
            Kind::Gauge => ConstGauge::new(x).encode(m),
        }
    }
}

impl From<Kind> for MetricType {
    fn from(k: Kind) -> MetricType {
        match k {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
        }
    }
}

fn owned(values: &[(&str, u64)]) -> Vec<(String, u64)> {
    values.iter().map(|&(l, x)| (l.to_owned(), x)).collect()
}
