//! A [`Snapshot`] in the OpenMetrics text format: the gateway-wide families section by
//! section, in the order a scrape lists them, then each peer's ([`peers`]).

use std::fmt;

use pep_transport::security::PacketProtection;
use pep_transport::Stats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::{AnnounceSnapshot, CompressionSnapshot, Snapshot, WorkerSnapshot, PREFIX};
use crate::tunnel::peer::AssociationState;

mod peers;

/// Encodes `s` in the OpenMetrics text format, `# EOF` included: the body of a scrape
/// response, to be sent with [`CONTENT_TYPE`](super::CONTENT_TYPE).
pub fn encode(s: &Snapshot) -> Result<String, fmt::Error> {
    // A registry per scrape holding one collector over a copy of the snapshot: the
    // collector has to be `'static`, and building it costs far less than a scrape's
    // round trip.
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(SnapshotCollector(s.clone())));
    let mut out = String::with_capacity(8 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = &self.0;
        let e = &mut enc;
        build_and_associations(e, s)?;
        path(e, &s.stats)?;
        capacity(e, &s.stats)?;
        datagram_size(e, &s.stats)?;
        congestion(e, &s.stats)?;
        wire(e, s)?;
        handshakes(e, s)?;
        workers(e, &s.workers)?;
        keys_and_protocol(e, &s.stats)?;
        stream_payload(e, &s.stats)?;
        flows(e, s)?;
        traffic_classes(e, s)?;
        compression(e, &s.relay.compression)?;
        memory(e, s)?;
        if let Some(a) = &s.announce {
            announcements(e, a)?;
        }
        peers::encode(e, &s.peers)
    }
}

const BYTES: Option<&Unit> = Some(&Unit::Bytes);
const SECONDS: Option<&Unit> = Some(&Unit::Seconds);

/// The build, the associations' states and AEADs, and their restarts and outages.
fn build_and_associations(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    let st = &s.stats;
    let (version, protocol) = s.build_info;
    let protocol = protocol.to_string();
    let info = Info::new([
        ("version", version),
        ("protocol_version", protocol.as_str()),
    ]);
    let m = e.encode_descriptor(
        "build",
        "Daemon version and transport protocol version",
        None,
        info.metric_type(),
    )?;
    info.encode(m)?;

    let states: Vec<(&str, u64)> = AssociationState::ALL
        .iter()
        .map(|&x| {
            let peers = s.associations.iter().filter(|&&a| a == x).count();
            (x.label(), peers as u64)
        })
        .collect();
    gauge_family(
        e,
        "association_state",
        "Peers whose association is in this state (with one peer: 1 for its current state, 0 for the others)",
        None,
        "state",
        &states,
    )?;
    let aeads: Vec<(&str, u64)> = AEADS
        .iter()
        .map(|&a| {
            let peers = s.peers.iter().filter(|p| p.stats.aead == Some(a)).count();
            (a.name(), peers as u64)
        })
        .collect();
    gauge_family(
        e,
        "association_aead",
        "Peers whose association's keys in use are of this AEAD (the one the handshake settled on)",
        None,
        "aead",
        &aeads,
    )?;
    counter(
        e,
        "association_restarts",
        "Times the association was re-established after being lost or after a peer restart",
        None,
        s.association_restarts,
    )?;
    counter(
        e,
        "peer_restarts",
        "Peer gateway restarts detected (each resets every flow)",
        None,
        st.peer_restarts,
    )?;
    counter(
        e,
        "outages",
        "Link outages: periods in which the peer stopped answering",
        None,
        st.outages,
    )
}

/// The path's round-trip time and the pace the sender keeps on it.
fn path(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    gauge_family(
        e,
        "rtt",
        "Round-trip time: smoothed estimate, and recent minimum (the initial RTT before any sample)",
        SECONDS,
        "kind",
        &[
            ("smoothed", st.rtt_smoothed.as_secs_f64()),
            ("min", st.rtt_min.as_secs_f64()),
        ],
    )?;
    // The transport counts bits; Prometheus' base unit is the byte.
    gauge(
        e,
        "pacing_rate",
        "Rate the sender paces packets at, overhead included",
        Some(&bytes_per_second()),
        st.pacing_rate_bps as f64 / 8.0,
    )
}

fn bytes_per_second() -> Unit {
    Unit::Other("bytes_per_second".to_owned())
}

/// The capacity the congestion controller believes in (in `rate` mode, its rate) and what
/// it did to find it.
fn capacity(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    let cap = &st.capacity;
    gauge(
        e,
        "capacity_estimate",
        "Bottleneck rate the sender's congestion control estimates (the configured rate in rate mode), overhead included",
        Some(&bytes_per_second()),
        cap.estimate_bps as f64 / 8.0,
    )?;
    gauge(
        e,
        "queue_delay",
        "Queueing delay the congestion control last saw: the RTT standing above the path's base",
        SECONDS,
        cap.queue_delay.as_secs_f64(),
    )?;
    counter_family(
        e,
        "send_limited",
        "Time spent sending at a pace set by the capacity estimate below the configured rate, or at the configured rate",
        SECONDS,
        "by",
        &[
            ("estimate", cap.limited_by_estimate.as_secs_f64()),
            ("ceiling", cap.limited_by_ceiling.as_secs_f64()),
        ],
    )?;
    counter_family(
        e,
        "capacity_events",
        "Congestion control events: drains of a standing queue, probes for more capacity, base-RTT moves after a path change, queues taken for another sender's that only losses answer",
        None,
        "kind",
        &[
            ("drain", cap.drains),
            ("probe", cap.probes),
            ("rebase", cap.rebases),
            ("compete", cap.competes),
        ],
    )?;
    counter(
        e,
        "needless_drains",
        "Drains after which the delay stayed while everything sent was delivered: the queue was not this sender's (a longer path, or jitter)",
        None,
        cap.needless_drains,
    )?;
    gauge(
        e,
        "path_jitter",
        "How far the path's own jitter lifts the least RTT of an evidence span: what the congestion control allows for before it takes a delay for a queue",
        SECONDS,
        cap.jitter.as_secs_f64(),
    )
}

/// The size data datagrams are cut to, and the corruption by size it is chosen from.
fn datagram_size(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    gauge(
        e,
        "datagram_size",
        "Bytes the tunnel's data datagrams are cut to now (they follow the error rate)",
        BYTES,
        st.datagram_size,
    )?;
    counter(
        e,
        "datagram_size_changes",
        "Times the data datagram size changed",
        None,
        st.datagram_size_changes,
    )?;
    let classes = corruption_by_size_class(&st.corruption_by_size);
    let labelled: Vec<(&str, f64)> = classes.iter().map(|(l, v)| (l.as_str(), *v)).collect();
    gauge_family(
        e,
        "corruption_loss_ratio",
        "Fraction of recent data packets of each size on the link lost to corruption (what the datagram size is chosen from)",
        None,
        "size",
        &labelled,
    )
}

/// The window, what is in flight, and the losses and the responses to them.
fn congestion(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    // u64::MAX means "no window" (rate mode): an absent series says that, a huge number
    // would wreck every graph it appears on.
    if st.cwnd_bytes != u64::MAX {
        gauge(
            e,
            "cwnd",
            "Congestion window (absent in rate mode, which has none)",
            BYTES,
            st.cwnd_bytes,
        )?;
    }
    gauge(
        e,
        "in_flight",
        "Bytes sent and neither acknowledged nor declared lost",
        BYTES,
        st.bytes_in_flight,
    )?;
    counter(
        e,
        "congestion_events",
        "Congestion responses (at most one per loss epoch)",
        None,
        st.congestion_events,
    )?;
    counter_family(
        e,
        "packets_lost",
        "Packets declared lost, by attributed cause",
        None,
        "cause",
        &[
            ("congestion", st.lost.congestion),
            ("corruption", st.lost.corruption),
            ("outage", st.lost.outage),
        ],
    )?;
    counter(
        e,
        "spurious_losses",
        "Packets declared lost that the peer turned out to have received: their repairs were needless",
        None,
        st.spurious_losses,
    )?;
    gauge(
        e,
        "reorder_window",
        "How long a packet may trail a later one before it counts as lost; zero while the path is not seen to reorder",
        SECONDS,
        st.reorder_window.as_secs_f64(),
    )
}

/// The tunnel's datagrams: bytes and packets each way, acknowledgements, probes, drops.
fn wire(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    let st = &s.stats;
    counter_family(
        e,
        "wire",
        "Tunnel datagram bytes, overhead included",
        BYTES,
        "direction",
        &[
            ("sent", st.wire_bytes_sent),
            ("received", st.wire_bytes_received),
        ],
    )?;
    counter_family(
        e,
        "wire_packets",
        "Tunnel datagrams",
        None,
        "direction",
        &[("sent", st.packets_sent), ("received", st.packets_received)],
    )?;
    counter_family(
        e,
        "acks",
        "Acknowledgements, SNACKs included",
        None,
        "direction",
        &[("sent", st.acks_sent), ("received", st.acks_received)],
    )?;
    counter_family(
        e,
        "snacks",
        "Selective negative acknowledgements: ACKs that named at least one hole",
        None,
        "direction",
        &[("sent", st.snacks_sent), ("received", st.snacks_received)],
    )?;
    counter(
        e,
        "probes_sent",
        "Probe packets sent (loss or outage detection)",
        None,
        st.probes_sent,
    )?;
    counter_family(
        e,
        "datagrams_dropped",
        "Received datagrams dropped, by reason",
        None,
        "reason",
        &dropped_by_reason(st, s.tunnel_foreign_datagrams),
    )
}

/// Handshakes completed, the COOKIEs sent instead under load, the HINTs sent and
/// received, and the associations taken over from another hub.
fn handshakes(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    counter(
        e,
        "handshakes",
        "Noise handshakes completed (association starts and rekeys)",
        None,
        s.stats.handshakes_completed,
    )?;
    counter(
        e,
        "cookies_sent",
        "COOKIEs sent under load instead of doing an initiation's Diffie-Hellman",
        None,
        s.cookies_sent,
    )?;
    counter(
        e,
        "hints_sent",
        "HINTs sent in answer to short packets for connection IDs this hub does not hold",
        None,
        s.hints_sent,
    )?;
    counter(
        e,
        "hints_rate_limited",
        "Short packets for connection IDs this hub does not hold that got no HINT: the budget of their source or of the endpoint was spent",
        None,
        s.hints_rate_limited,
    )?;
    let h = &s.stats.hints;
    counter_family(
        e,
        "hints_received",
        "HINTs received from the hub, by what became of them",
        None,
        "result",
        &[
            ("acted", h.acted),
            ("rate_limited", h.rate_limited),
            ("unmatched", h.unmatched),
            ("elsewhere", h.elsewhere),
            ("ignored", h.ignored),
        ],
    )?;
    counter(
        e,
        "associations_taken_over",
        "Associations begun by a peer that echoed another epoch than ours: it came from another hub of the same key, or from an earlier run of this one",
        None,
        s.stats.associations_taken_over,
    )?;
    counter(
        e,
        "handovers",
        "Moves of this terminal to another hub of its address list; each resets its flows",
        None,
        s.stats.handovers,
    )?;
    let t = &s.stats.handover_trials;
    counter_family(
        e,
        "handover_trials",
        "Tries of another hub of the address list while the one serving this terminal was silent (or of the first, to return), by how they ended",
        None,
        "result",
        &[
            ("moved", t.moved),
            ("stayed", t.stayed),
            ("unanswered", t.unanswered),
        ],
    )
}

/// Each worker thread's associations and datagrams, labelled by its number.
fn workers(e: &mut DescriptorEncoder, workers: &[WorkerSnapshot]) -> fmt::Result {
    let labels: Vec<String> = (0..workers.len()).map(|i| i.to_string()).collect();
    let by_worker = |f: fn(&WorkerSnapshot) -> u64| -> Vec<(&str, u64)> {
        labels
            .iter()
            .map(String::as_str)
            .zip(workers.iter().map(f))
            .collect()
    };
    gauge_family(
        e,
        "worker_associations",
        "Associations each worker thread serves",
        None,
        "worker",
        &by_worker(|w| w.associations),
    )?;
    counter_family(
        e,
        "worker_datagrams",
        "Tunnel datagrams each worker thread's socket read",
        None,
        "worker",
        &by_worker(|w| w.datagrams),
    )?;
    counter_family(
        e,
        "worker_handoffs",
        "Tunnel datagrams a worker thread read for another's association and handed on",
        None,
        "worker",
        &by_worker(|w| w.handed_off),
    )?;
    counter_family(
        e,
        "worker_inbox_drops",
        "Datagrams and initiations other worker threads read for this one's associations and dropped because its inbox was full",
        None,
        "worker",
        &by_worker(|w| w.inbox_dropped),
    )
}

/// The session keys' guard and changes, and the peer's breaches of the protocol.
fn keys_and_protocol(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    counter(
        e,
        "nonce_refusals",
        "Sends refused because their packet number was already used under the current key (never expected: a guard against nonce reuse)",
        None,
        st.security.nonce_refused,
    )?;
    counter(
        e,
        "rekeys",
        "Session key changes within a running association",
        None,
        st.rekeys,
    )?;
    counter(
        e,
        "protocol_violations",
        "Packets from the peer that broke the protocol",
        None,
        st.protocol_violations,
    )
}

/// The flows' payload: sent, acknowledged, sent again, sent as a redundant copy.
fn stream_payload(e: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    counter(
        e,
        "stream_sent",
        "Stream payload sent for the first time",
        BYTES,
        st.stream_bytes_sent,
    )?;
    counter(
        e,
        "stream_acked",
        "Stream payload acknowledged by the peer",
        BYTES,
        st.stream_bytes_acked,
    )?;
    counter(
        e,
        "stream_retransmitted",
        "Stream payload sent again after a loss",
        BYTES,
        st.stream_bytes_retransmitted,
    )?;
    counter(
        e,
        "stream_redundant",
        "Stream payload sent as a redundant copy on an otherwise idle link",
        BYTES,
        st.stream_bytes_redundant,
    )
}

/// The flows: the relays' (TCP side) and the associations' (tunnel side).
fn flows(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    let r = &s.relay;
    let st = &s.stats;
    gauge(
        e,
        "flows_active",
        "Flows with a live local TCP connection",
        None,
        r.flows_active,
    )?;
    gauge(
        e,
        "flows_open",
        "Flows open with every peer, either side's, which limits.max_flows bounds",
        None,
        r.flows_open,
    )?;
    counter_family(
        e,
        "flows",
        "Flows opened, by where the TCP connection came from",
        None,
        "origin",
        &[
            ("intercepted", r.flows_intercepted_total),
            ("peer", r.flows_from_peer_total),
        ],
    )?;
    counter(
        e,
        "flows_refused",
        "Intercepted connections refused (a limit, or no route with fail = closed), and flows a peer may not open",
        None,
        r.flows_refused_total,
    )?;
    counter(
        e,
        "flows_bypassed",
        "Intercepted connections relayed unproxied (a limit, or no route with fail = open)",
        None,
        r.flows_bypassed_total,
    )?;
    counter(
        e,
        "flows_unrouted",
        "Intercepted connections whose destination no peer's subnets hold (refused or bypassed by [rules] fail)",
        None,
        r.flows_unrouted_total,
    )?;
    counter(
        e,
        "flows_isolated",
        "Flows a peer opened from outside its subnets or into another peer's, reset (also in flows_refused)",
        None,
        r.flows_isolated_total,
    )?;
    counter_family(
        e,
        "relay",
        "Payload relayed between local TCP connections and the tunnel",
        BYTES,
        "direction",
        &[
            ("to_peer", r.bytes_to_peer_total),
            ("from_peer", r.bytes_from_peer_total),
        ],
    )?;
    counter_family(
        e,
        "connect_errors",
        "Upstream connects that failed, by reason",
        None,
        "reason",
        &merged(&r.connect_errors),
    )?;
    counter_family(
        e,
        "intercept_errors",
        "Connections that could not be intercepted, by reason",
        None,
        "reason",
        &merged(&r.intercept_errors),
    )?;
    counter_family(
        e,
        "flow_resets",
        "Flows reset, by reason (either side's)",
        None,
        "reason",
        &merged(&r.flow_resets),
    )?;
    counter(
        e,
        "flows_reset_stalled",
        "Flows reset because their local TCP side took none of the bytes waiting for it for \
         limits.stalled_flow_timeout while the peer's receive window or the budget was \
         contended (also in flow_resets as resource_limit)",
        None,
        r.flows_reset_stalled_total,
    )?;
    gauge(
        e,
        "association_flows_open",
        "Flows the transport association holds open (including ones still draining)",
        None,
        st.flows_open,
    )?;
    counter(
        e,
        "association_flows_opened",
        "Flows the transport association opened, either side's",
        None,
        st.flows_opened_total,
    )?;
    counter(
        e,
        "association_flows_reset",
        "Flows the transport association reset, either side's",
        None,
        st.flows_reset,
    )
}

/// What the relays of compressed flows did: bytes before and after, blocks by level, CPU
/// time, blocks refused.
fn compression(e: &mut DescriptorEncoder, c: &CompressionSnapshot) -> fmt::Result {
    counter_family(
        e,
        "compression_plain",
        "Application bytes of compressed flows: read from TCP into blocks (to_peer), decoded from blocks and written to TCP (from_peer)",
        BYTES,
        "direction",
        &[("to_peer", c.plain_sent), ("from_peer", c.plain_received)],
    )?;
    counter_family(
        e,
        "compression_block",
        "Bytes of the blocks compressed flows carried, headers included: written to the flows (to_peer), taken from them (from_peer)",
        BYTES,
        "direction",
        &[("to_peer", c.blocks_sent), ("from_peer", c.blocks_received)],
    )?;
    counter_family(
        e,
        "compression_blocks_sent",
        "Blocks sent, by level: raw (did not shrink, not worth it, or not compressed here), fast (zstd 1), hard (zstd 6)",
        None,
        "level",
        &merged(&c.blocks_by_level),
    )?;
    counter(
        e,
        "compression_over_budget",
        "Blocks sent raw because the memory budget had no room for a compressed one",
        None,
        c.over_budget,
    )?;
    let mut m = e.encode_descriptor(
        "compression_cpu",
        "CPU time the relays spent compressing and decompressing blocks",
        SECONDS,
        MetricType::Counter,
    )?;
    for (work, ns) in [("compress", c.compress_ns), ("decompress", c.decompress_ns)] {
        ConstCounter::new(ns as f64 / 1e9).encode(m.encode_family(&[("work", work)])?)?;
    }
    counter_family(
        e,
        "compression_refused",
        "Flows reset because a block the peer sent was refused, by reason",
        None,
        "reason",
        &merged(&c.refused),
    )
}

/// The memory budget, what counts against it, and the flows waiting for their quota of it.
fn memory(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    gauge(
        e,
        "memory_in_use",
        "Buffer memory in use",
        BYTES,
        s.memory_in_use_bytes,
    )?;
    gauge(
        e,
        "memory_accounted",
        "Memory counted against the budget: fixed costs, per-flow costs and payload",
        BYTES,
        s.memory_accounted_bytes,
    )?;
    gauge(
        e,
        "memory_budget",
        "Buffer memory budget",
        BYTES,
        s.memory_budget_bytes,
    )?;
    gauge(
        e,
        "flows_at_share",
        "Flows holding their share of a contended send budget, not reading from their \
         TCP side until the peer acknowledges some of it",
        None,
        s.stats.flows_waiting_for_quota,
    )
}

/// Sums entries that share a label, keeping first-seen order: a label repeated in the
/// daemon's list must still be one series, or the exposition would be invalid.
fn merged(entries: &[(&'static str, u64)]) -> Vec<(&'static str, u64)> {
    let mut out: Vec<(&'static str, u64)> = Vec::with_capacity(entries.len());
    for &(label, n) in entries {
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total = total.saturating_add(n),
            None => out.push((label, n)),
        }
    }
    out
}

/// Every AEAD an association may use, in the order the metrics list them.
const AEADS: [PacketProtection; 2] = [
    PacketProtection::ChaCha20Poly1305,
    PacketProtection::Aes256Gcm,
];

/// Each traffic class's bytes, flows and queue delay, summed over the peers; nothing
/// without `[[class]]`.
fn traffic_classes(e: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    if s.traffic_classes.is_empty() {
        return Ok(());
    }
    let none = pep_transport::TrafficClassStats::default();
    let classes: Vec<(&str, &pep_transport::TrafficClassStats)> = s
        .traffic_classes
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (
                name.as_str(),
                s.stats.traffic_classes.get(i).unwrap_or(&none),
            )
        })
        .collect();
    let of = |f: fn(&pep_transport::TrafficClassStats) -> u64| -> Vec<(&str, u64)> {
        classes.iter().map(|(n, c)| (*n, f(c))).collect()
    };
    counter_family(
        e,
        "class_sent",
        "Stream bytes of the class's flows sent to the peers for the first time",
        BYTES,
        "class",
        &of(|c| c.bytes_sent),
    )?;
    counter_family(
        e,
        "class_retransmitted",
        "Stream bytes of the class's flows sent again after a loss",
        BYTES,
        "class",
        &of(|c| c.bytes_retransmitted),
    )?;
    let delays: Vec<(&str, f64)> = classes
        .iter()
        .map(|(n, c)| (*n, c.queue_delay_byte_seconds))
        .collect();
    counter_family(
        e,
        "class_queue_delay",
        "Sum over the class's bytes sent for the first time of how long each waited in pepd between its write and its first transmission; its rate over the rate of class_sent_bytes is the class's mean queue delay",
        Some(&Unit::Other("byte_seconds".to_owned())),
        "class",
        &delays,
    )?;
    gauge_family(
        e,
        "class_flows",
        "Flows in the class now",
        None,
        "class",
        &of(|c| c.flows_open),
    )?;
    counter_family(
        e,
        "class_flows_opened",
        "Flows put in the class",
        None,
        "class",
        &of(|c| c.flows_total),
    )
}

/// The routes `[announce]` writes for a routing daemon, by why they are there.
fn announcements(e: &mut DescriptorEncoder, a: &AnnounceSnapshot) -> fmt::Result {
    gauge_family(
        e,
        "announced_prefixes",
        "Prefixes this hub announces: of terminals it serves (table=\"serving\") and of \
         terminals in an outage (table=\"outage\")",
        None,
        "table",
        &[("serving", a.serving), ("outage", a.outage)],
    )?;
    counter(
        e,
        "announce_errors",
        "Changes to the announcement tables that failed (an `ip` batch or read)",
        None,
        a.errors,
    )
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> fmt::Result {
    let c = ConstCounter::new(value);
    let m = e.encode_descriptor(name, help, unit, c.metric_type())?;
    c.encode(m)
}

fn gauge<V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: V,
) -> fmt::Result {
    let g = ConstGauge::new(value);
    let m = e.encode_descriptor(name, help, unit, g.metric_type())?;
    g.encode(m)
}

fn counter_family<V: EncodeCounterValue + Copy>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    values: &[(&str, V)],
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for &(value, n) in values {
        let labels = [(label, value)];
        ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge_family<V: EncodeGaugeValue + Copy>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    values: &[(&str, V)],
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for &(value, x) in values {
        let labels = [(label, value)];
        ConstGauge::new(x).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Width of the size classes the metrics report corruption by: coarser than the sender's
/// own, so the series stay few.
const SIZE_CLASS_BYTES: usize = 256;

/// The sender's corruption by size folded into `SIZE_CLASS_BYTES` classes labelled by their
/// range ("256-511"); each a loss ratio weighted by its packets.
fn corruption_by_size_class(
    classes: &[pep_transport::datagram_size::ClassLoss],
) -> Vec<(String, f64)> {
    let mut folded: std::collections::BTreeMap<usize, (f64, f64)> = Default::default();
    for c in classes {
        let e = folded.entry(c.from_bytes / SIZE_CLASS_BYTES).or_default();
        e.0 += c.resolved;
        e.1 += c.resolved * c.loss;
    }
    folded
        .into_iter()
        .filter(|(_, (resolved, _))| *resolved > 0.0)
        .map(|(k, (resolved, lost))| {
            let from = k * SIZE_CLASS_BYTES;
            (
                format!("{from}-{}", from + SIZE_CLASS_BYTES - 1),
                lost / resolved,
            )
        })
        .collect()
}

/// Every reason a received datagram is dropped, with its count.
fn dropped_by_reason(st: &Stats, foreign: u64) -> Vec<(&'static str, u64)> {
    let mut v = vec![
        ("malformed", st.malformed_dropped),
        ("unassociated", st.unassociated_dropped),
        ("duplicate", st.duplicates_dropped),
        ("foreign", foreign),
    ];
    v.extend(st.security.by_reason());
    v
}
