//! Counters and gauges an operator or benchmark reads from an association.

use std::time::Duration;

use crate::loss::LossCounts;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub rtt_min: Duration,
    pub rtt_smoothed: Duration,
    pub pacing_rate_bps: u64,
    /// Congestion window in bytes (`u64::MAX` in rate mode: no window).
    pub cwnd_bytes: u64,
    pub bytes_in_flight: u64,
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
    pub flows_opened_total: u64,
    pub flows_reset: u64,
    pub peer_restarts: u64,
    /// Datagrams dropped because they did not parse.
    pub malformed_dropped: u64,
    /// Datagrams dropped because no association with the sender exists yet.
    pub unassociated_dropped: u64,
    pub duplicates_dropped: u64,
    pub protocol_violations: u64,
}
