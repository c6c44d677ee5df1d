//! The gateway's statistics: every association's and every endpoint shard's added up into
//! the one [`Stats`] the gateway-wide series report. Each struct is taken apart field by
//! field with no `..`, so a field the transport gains fails to compile here until it is
//! decided how it adds up.

use std::time::Duration;

use pep_transport::cc::CapacityStats;
use pep_transport::security::HintCounts;
use pep_transport::{
    EndpointStats, LossCounts, SecurityCounts, Stats, TrafficClassStats, TrialCounts,
};

/// Adds one association's stats to a total: counters and amounts add up; of the path
/// gauges (RTT, queue delay, datagram size) the total keeps the largest, which is what an
/// alert on them looks for.
pub fn add_association(t: &mut Stats, s: &Stats) {
    let Stats {
        rtt_min,
        rtt_smoothed,
        pacing_rate_bps,
        cwnd_bytes,
        bytes_in_flight,
        capacity,
        datagram_size,
        datagram_size_changes,
        corruption_by_size,
        packets_sent,
        wire_bytes_sent,
        packets_received,
        wire_bytes_received,
        stream_bytes_sent,
        stream_bytes_acked,
        stream_bytes_retransmitted,
        stream_bytes_redundant,
        lost,
        congestion_events,
        acks_sent,
        acks_received,
        snacks_sent,
        snacks_received,
        probes_sent,
        outages,
        flows_open,
        flows_waiting_for_quota,
        flows_opened_total,
        flows_over_limit,
        flows_reset,
        peer_restarts,
        associations_taken_over,
        malformed_dropped,
        unassociated_dropped,
        duplicates_dropped,
        protocol_violations,
        security,
        hints,
        handshakes_completed,
        rekeys,
        remote_moves,
        handovers,
        handover_trials,
        spurious_losses,
        reorder_window,
        // Each association's own: the metrics count the AEADs by peer, not from a total.
        aead: _,
        traffic_classes,
    } = s;
    t.rtt_min = t.rtt_min.max(*rtt_min);
    t.rtt_smoothed = t.rtt_smoothed.max(*rtt_smoothed);
    t.pacing_rate_bps += pacing_rate_bps;
    t.cwnd_bytes = t.cwnd_bytes.saturating_add(*cwnd_bytes);
    t.bytes_in_flight += bytes_in_flight;
    add_capacity(&mut t.capacity, capacity);
    t.datagram_size = t.datagram_size.max(*datagram_size);
    t.datagram_size_changes += datagram_size_changes;
    t.corruption_by_size
        .extend(corruption_by_size.iter().cloned());
    t.packets_sent += packets_sent;
    t.wire_bytes_sent += wire_bytes_sent;
    t.packets_received += packets_received;
    t.wire_bytes_received += wire_bytes_received;
    t.stream_bytes_sent += stream_bytes_sent;
    t.stream_bytes_acked += stream_bytes_acked;
    t.stream_bytes_retransmitted += stream_bytes_retransmitted;
    t.stream_bytes_redundant += stream_bytes_redundant;
    add_losses(&mut t.lost, lost);
    t.congestion_events += congestion_events;
    t.acks_sent += acks_sent;
    t.acks_received += acks_received;
    t.snacks_sent += snacks_sent;
    t.snacks_received += snacks_received;
    t.probes_sent += probes_sent;
    t.outages += outages;
    t.flows_open += flows_open;
    t.flows_waiting_for_quota += flows_waiting_for_quota;
    t.flows_opened_total += flows_opened_total;
    t.flows_over_limit += flows_over_limit;
    t.flows_reset += flows_reset;
    t.peer_restarts += peer_restarts;
    t.associations_taken_over += associations_taken_over;
    t.malformed_dropped += malformed_dropped;
    t.unassociated_dropped += unassociated_dropped;
    t.duplicates_dropped += duplicates_dropped;
    t.protocol_violations += protocol_violations;
    add_security(&mut t.security, security);
    add_hints(&mut t.hints, hints);
    t.handshakes_completed += handshakes_completed;
    t.rekeys += rekeys;
    t.remote_moves += remote_moves;
    t.handovers += handovers;
    add_trials(&mut t.handover_trials, handover_trials);
    t.spurious_losses += spurious_losses;
    t.reorder_window = t.reorder_window.max(*reorder_window);
    add_traffic_classes(&mut t.traffic_classes, traffic_classes);
}

/// Class by class: every association has the gateway's table of classes.
fn add_traffic_classes(t: &mut Vec<TrafficClassStats>, s: &[TrafficClassStats]) {
    if t.len() < s.len() {
        t.resize(s.len(), TrafficClassStats::default());
    }
    for (t, s) in t.iter_mut().zip(s) {
        let TrafficClassStats {
            bytes_sent,
            bytes_retransmitted,
            queue_delay_byte_seconds,
            flows_open,
            flows_total,
        } = s;
        t.bytes_sent += bytes_sent;
        t.bytes_retransmitted += bytes_retransmitted;
        t.queue_delay_byte_seconds += queue_delay_byte_seconds;
        t.flows_open += flows_open;
        t.flows_total += flows_total;
    }
}

fn add_capacity(t: &mut CapacityStats, s: &CapacityStats) {
    let CapacityStats {
        estimate_bps,
        queue_delay,
        limited_by_estimate,
        limited_by_ceiling,
        drains,
        probes,
        rebases,
        competes,
        jitter,
        needless_drains,
    } = s;
    t.estimate_bps += estimate_bps;
    t.queue_delay = t.queue_delay.max(*queue_delay);
    t.limited_by_estimate += *limited_by_estimate;
    t.limited_by_ceiling += *limited_by_ceiling;
    t.drains += drains;
    t.probes += probes;
    t.rebases += rebases;
    t.competes += competes;
    t.jitter = t.jitter.max(*jitter);
    t.needless_drains += needless_drains;
}

fn add_losses(t: &mut LossCounts, s: &LossCounts) {
    let LossCounts {
        congestion,
        corruption,
        outage,
    } = s;
    t.congestion += congestion;
    t.corruption += corruption;
    t.outage += outage;
}

fn add_hints(t: &mut HintCounts, s: &HintCounts) {
    let HintCounts {
        acted,
        rate_limited,
        unmatched,
        elsewhere,
        ignored,
    } = s;
    t.acted += acted;
    t.rate_limited += rate_limited;
    t.unmatched += unmatched;
    t.elsewhere += elsewhere;
    t.ignored += ignored;
}

fn add_trials(t: &mut TrialCounts, s: &TrialCounts) {
    let TrialCounts {
        moved,
        stayed,
        unanswered,
    } = s;
    t.moved += moved;
    t.stayed += stayed;
    t.unanswered += unanswered;
}

fn add_security(t: &mut SecurityCounts, s: &SecurityCounts) {
    let SecurityCounts {
        unauthenticated,
        replayed,
        wrong_mode,
        handshake_invalid,
        handshake_unknown_peer,
        handshake_rate_limited,
        handshake_replayed,
        handshake_bad_mac,
        cookie_invalid,
        nonce_refused,
        aead_mismatch,
        handshake_collision,
    } = s;
    t.unauthenticated += unauthenticated;
    t.replayed += replayed;
    t.wrong_mode += wrong_mode;
    t.handshake_invalid += handshake_invalid;
    t.handshake_unknown_peer += handshake_unknown_peer;
    t.handshake_rate_limited += handshake_rate_limited;
    t.handshake_replayed += handshake_replayed;
    t.handshake_bad_mac += handshake_bad_mac;
    t.cookie_invalid += cookie_invalid;
    t.nonce_refused += nonce_refused;
    t.aead_mismatch += aead_mismatch;
    t.handshake_collision += handshake_collision;
}

/// The endpoint's drops in the associations' series: what it could route to no association
/// (an unknown connection ID, a plaintext HELLO from an address no peer has) is
/// `unassociated`, as a standalone association counted it; its handshake screening adds to
/// the security drops.
pub fn add_endpoint(t: &mut Stats, e: &EndpointStats) {
    let EndpointStats {
        unknown_cid,
        malformed,
        unknown_address,
        security,
        // No association counts these: the snapshot adds up the shards' on its own.
        cookies_sent: _,
        hints_sent: _,
        hints_rate_limited: _,
    } = e;
    t.malformed_dropped += malformed;
    t.unassociated_dropped += unknown_cid + unknown_address;
    add_security(&mut t.security, security);
}

/// `s` without what describes a running association (its path and flows now), so that
/// adding it to a total counts what it did and nothing of what it was.
pub fn counters_only(s: Stats) -> Stats {
    let Stats {
        rtt_min: _,
        rtt_smoothed: _,
        pacing_rate_bps: _,
        cwnd_bytes: _,
        bytes_in_flight: _,
        capacity,
        datagram_size: _,
        datagram_size_changes,
        corruption_by_size: _,
        packets_sent,
        wire_bytes_sent,
        packets_received,
        wire_bytes_received,
        stream_bytes_sent,
        stream_bytes_acked,
        stream_bytes_retransmitted,
        stream_bytes_redundant,
        lost,
        congestion_events,
        acks_sent,
        acks_received,
        snacks_sent,
        snacks_received,
        probes_sent,
        outages,
        flows_open: _,
        flows_waiting_for_quota: _,
        flows_opened_total,
        flows_over_limit,
        flows_reset,
        peer_restarts,
        associations_taken_over,
        malformed_dropped,
        unassociated_dropped,
        duplicates_dropped,
        protocol_violations,
        security,
        hints,
        handshakes_completed,
        rekeys,
        remote_moves,
        handovers,
        handover_trials,
        spurious_losses,
        reorder_window: _,
        aead,
        traffic_classes,
    } = s;
    let CapacityStats {
        estimate_bps: _,
        queue_delay: _,
        limited_by_estimate,
        limited_by_ceiling,
        drains,
        probes,
        rebases,
        competes,
        jitter: _,
        needless_drains,
    } = capacity;
    Stats {
        rtt_min: Duration::ZERO,
        rtt_smoothed: Duration::ZERO,
        pacing_rate_bps: 0,
        cwnd_bytes: 0,
        bytes_in_flight: 0,
        capacity: CapacityStats {
            estimate_bps: 0,
            queue_delay: Duration::ZERO,
            limited_by_estimate,
            limited_by_ceiling,
            drains,
            probes,
            rebases,
            competes,
            jitter: Duration::ZERO,
            needless_drains,
        },
        datagram_size: 0,
        datagram_size_changes,
        corruption_by_size: Vec::new(),
        packets_sent,
        wire_bytes_sent,
        packets_received,
        wire_bytes_received,
        stream_bytes_sent,
        stream_bytes_acked,
        stream_bytes_retransmitted,
        stream_bytes_redundant,
        lost,
        congestion_events,
        acks_sent,
        acks_received,
        snacks_sent,
        snacks_received,
        probes_sent,
        outages,
        flows_open: 0,
        flows_waiting_for_quota: 0,
        flows_opened_total,
        flows_over_limit,
        flows_reset,
        peer_restarts,
        associations_taken_over,
        malformed_dropped,
        unassociated_dropped,
        duplicates_dropped,
        protocol_violations,
        security,
        hints,
        handshakes_completed,
        rekeys,
        remote_moves,
        handovers,
        handover_trials,
        spurious_losses,
        reorder_window: Duration::ZERO,
        aead,
        traffic_classes: traffic_classes
            .into_iter()
            .map(|c| TrafficClassStats { flows_open: 0, ..c })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_peer_leaves_its_counters_and_none_of_its_gauges() {
        let s = Stats {
            flows_open: 3,
            flows_waiting_for_quota: 2,
            flows_opened_total: 7,
            pacing_rate_bps: 1_000_000,
            ..Stats::default()
        };
        let c = counters_only(s);
        assert_eq!(
            (c.flows_open, c.flows_waiting_for_quota, c.pacing_rate_bps),
            (0, 0, 0)
        );
        assert_eq!(c.flows_opened_total, 7);
    }

    #[test]
    fn stats_add_counters_and_keep_the_largest_path_gauges() {
        let mut a = Stats {
            rtt_smoothed: Duration::from_millis(600),
            packets_sent: 10,
            cwnd_bytes: u64::MAX,
            ..Stats::default()
        };
        a.security.unauthenticated = 2;
        let mut b = Stats {
            rtt_smoothed: Duration::from_millis(550),
            packets_sent: 5,
            cwnd_bytes: 1000,
            ..Stats::default()
        };
        b.security.unauthenticated = 3;
        add_association(&mut a, &b);
        assert_eq!(a.rtt_smoothed, Duration::from_millis(600));
        assert_eq!(a.packets_sent, 15);
        assert_eq!(a.cwnd_bytes, u64::MAX);
        assert_eq!(a.security.unauthenticated, 5);
        let mut e = EndpointStats {
            unknown_cid: 4,
            malformed: 1,
            ..EndpointStats::default()
        };
        e.security.handshake_unknown_peer = 7;
        add_endpoint(&mut a, &e);
        assert_eq!(a.unassociated_dropped, 4);
        assert_eq!(a.malformed_dropped, 1);
        assert_eq!(a.security.handshake_unknown_peer, 7);
    }
}
