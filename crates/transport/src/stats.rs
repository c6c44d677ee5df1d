//! Counters and gauges an operator or benchmark reads from an association.

use std::time::Duration;

use crate::cc::CapacityStats;
use crate::datagram_size::ClassLoss;
use crate::loss::LossCounts;
use crate::security::{HintCounts, PacketProtection, SecurityCounts};
use crate::traffic_class::TrafficClassStats;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub rtt_min: Duration,
    pub rtt_smoothed: Duration,
    pub pacing_rate_bps: u64,
    /// Congestion window in bytes (`u64::MAX` in rate mode: no window).
    pub cwnd_bytes: u64,
    pub bytes_in_flight: u64,
    /// The congestion controller's view of the path's capacity.
    pub capacity: CapacityStats,
    /// Bytes data datagrams are cut to now (docs/PROTOCOL.md §5.8).
    pub datagram_size: u64,
    /// Times the datagram size changed.
    pub datagram_size_changes: u64,
    /// Corruption by the size of data packets on the link, that the size is chosen from.
    pub corruption_by_size: Vec<ClassLoss>,
    pub packets_sent: u64,
    /// On-wire bytes sent, overhead included.
    pub wire_bytes_sent: u64,
    pub packets_received: u64,
    pub wire_bytes_received: u64,
    /// Stream bytes sent for the first time.
    pub stream_bytes_sent: u64,
    /// Stream bytes acknowledged by the peer.
    pub stream_bytes_acked: u64,
    /// Stream bytes sent again after a loss.
    pub stream_bytes_retransmitted: u64,
    /// Stream bytes sent as a redundant copy on an otherwise idle link.
    pub stream_bytes_redundant: u64,
    /// Packets declared lost, by attributed cause.
    pub lost: LossCounts,
    /// Packets declared lost that the peer turned out to have received (a path that
    /// reorders, or an outage shorter than it looked): their repairs were needless.
    pub spurious_losses: u64,
    /// How long a packet may trail a later one before it counts as lost, while the path is
    /// seen to reorder; zero while it is not (three later packets decide).
    pub reorder_window: Duration,
    /// Congestion responses (at most one per loss epoch).
    pub congestion_events: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    /// ACKs that named at least one hole.
    pub snacks_sent: u64,
    pub snacks_received: u64,
    pub probes_sent: u64,
    pub outages: u64,
    pub flows_open: u64,
    /// Open flows whose application holds back writes until its data is acknowledged
    /// ([`Association::wait_for_quota`](crate::Association::wait_for_quota)).
    pub flows_waiting_for_quota: u64,
    pub flows_opened_total: u64,
    /// Flows refused because `max_flows` were open: opens by the application (refused with
    /// [`OpenError::TooManyFlows`](crate::OpenError::TooManyFlows)) and by the peer (reset
    /// with `ResourceLimit`).
    pub flows_over_limit: u64,
    pub flows_reset: u64,
    pub peer_restarts: u64,
    /// Associations begun by a peer that echoed neither our epoch nor none: it was
    /// associated with another hub of the same key, or with an earlier run of ours.
    pub associations_taken_over: u64,
    /// Datagrams dropped because they did not parse.
    pub malformed_dropped: u64,
    /// Datagrams dropped because no association with the sender exists yet.
    pub unassociated_dropped: u64,
    pub duplicates_dropped: u64,
    pub protocol_violations: u64,
    /// Datagrams the security layer dropped, by reason.
    pub security: SecurityCounts,
    /// HINTs received, by what became of them.
    pub hints: HintCounts,
    /// Noise handshakes completed (association starts and rekeys).
    pub handshakes_completed: u64,
    /// Key changes within a running association.
    pub rekeys: u64,
    /// Times the peer's address changed after it proved it is at the new one.
    pub remote_moves: u64,
    /// Moves of a terminal to another hub of its list.
    pub handovers: u64,
    /// Trials of another hub of the list, by how they ended.
    pub handover_trials: crate::association::TrialCounts,
    /// The AEAD the two HELLOs settled on for the keys in use: `None` before the first
    /// handshake completes and without security.
    pub aead: Option<PacketProtection>,
    /// Each configured traffic class, by number (empty when none is configured).
    pub traffic_classes: Vec<TrafficClassStats>,
}
