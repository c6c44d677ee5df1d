//! Turns a simulation outcome into the JSON report of `pep-sim bulk`.

use serde::Serialize;

use std::time::Duration;

use crate::channel::{jain_fairness, reference_goodput_bps};
use crate::sim::{Outcome, Scenario, Workload};
use crate::timeline::{step_responses, QueueDelay, StepResponse, BUCKET};

/// A rate step counts as followed when the queue is back under this within the step's
/// bound, and a step up when the sender reaches this fraction of the new rate.
const STEP_QUEUE_BOUND: Duration = Duration::from_millis(100);
const STEP_RATE_FRACTION: f64 = 0.9;

#[derive(Debug, Serialize)]
pub struct InteractiveReport {
    pub messages: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The first sender's congestion controller, at the end of the run.
#[derive(Debug, Serialize)]
pub struct CapacityReport {
    pub estimate_bps: u64,
    pub drains: u64,
    pub needless_drains: u64,
    /// The jitter the sender measured (ms), at the end.
    pub jitter_ms: f64,
    pub probes: u64,
    pub rebases: u64,
    pub competes: u64,
    pub limited_by_estimate_s: f64,
    pub limited_by_ceiling_s: f64,
}

#[derive(Debug, Serialize)]
pub struct TimelineRow {
    /// Seconds from the start of the transfer.
    pub t: f64,
    pub delivered_mbps: f64,
    pub cross_mbps: f64,
    pub queue_max_ms: f64,
    pub estimate_mbps: f64,
    /// Stream bytes read at the receivers, as a rate.
    pub goodput_mbps: f64,
    pub datagram_size: u64,
}

#[derive(Debug, Serialize)]
pub struct LossesByCause {
    pub congestion: u64,
    pub corruption: u64,
    pub outage: u64,
}

/// What the forward link really did to packets (the simulator knows).
#[derive(Debug, Serialize)]
pub struct LossesTrue {
    pub corruption: u64,
    pub queue_drop: u64,
    pub random: u64,
    pub burst: u64,
    pub outage: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub goodput_bps: f64,
    pub ref_bps: f64,
    pub efficiency: f64,
    pub completion_s: Option<f64>,
    pub t_min_s: Option<f64>,
    pub completion_over_t_min: Option<f64>,
    pub intact: bool,
    pub bytes_delivered: u64,
    pub forward_wire_bytes: u64,
    pub return_wire_bytes: u64,
    pub return_over_forward: f64,
    pub retransmitted_bytes: u64,
    pub redundant_bytes: u64,
    /// Packets the A sides sent (data, ACKs and control).
    pub packets_sent: u64,
    /// Packets the A sides declared lost and then saw acknowledged (their own count).
    pub spurious_losses: u64,
    pub losses_by_cause: LossesByCause,
    pub losses_true: LossesTrue,
    pub return_losses_true: LossesTrue,
    pub congestion_events: u64,
    pub snacks_sent: u64,
    pub snacks_received: u64,
    pub acks_sent: u64,
    pub probes_sent: u64,
    pub outages_detected: u64,
    pub outage_events: Vec<(f64, &'static str)>,
    /// For each configured outage window: seconds from the link's return until the sender
    /// saw an ACK again and resumed sending.
    pub outage_resume_s: Vec<Option<f64>>,
    pub flow_resets: u64,
    pub jain_fairness: Option<f64>,
    pub per_flow_goodput_bps: Vec<f64>,
    pub link_utilisation: f64,
    /// Cross traffic's bytes on the wire delivered at the forward link over the transfer's
    /// time, as a rate (the competing flow's share beside the measured one).
    pub cross_delivered_bps: f64,
    pub mean_queue_delay_ms: f64,
    pub queue_peak_bytes: u64,
    pub rtt_min_ms: f64,
    pub rtt_smoothed_ms: f64,
    pub handshake_s: f64,
    /// Queueing delay every packet saw at the forward link (cross traffic included).
    pub queue_delay: QueueDelay,
    /// The forward link's mean rate over the transfer, outages and rate steps counted.
    pub link_average_bps: f64,
    /// Goodput over what an ideal TCP would carry at that mean rate (the `ref` formula).
    pub efficiency_of_capacity: f64,
    pub interactive: Option<InteractiveReport>,
    pub step_responses: Vec<StepResponse>,
    pub capacity: CapacityReport,
    /// The first sender's datagram size at the end, and how often it changed.
    pub datagram_size: u64,
    pub datagram_size_changes: u64,
    pub timeline: Option<Vec<TimelineRow>>,
    pub sim_seconds: f64,
    pub cpu_seconds: f64,
    pub events: u64,
}

pub fn build(sc: &Scenario, out: &Outcome, cpu_seconds: f64) -> Report {
    let forward_ber = sc.forward.impairments.ber;
    let ref_bps = reference_goodput_bps(sc.forward.rate_bps as f64, forward_ber);
    let delivered: u64 = out.flows.iter().map(|f| f.bytes_delivered).sum();
    let (goodput_bps, completion_s, t_min_s, per_flow) = match sc.workload {
        Workload::Seconds(s) => {
            let secs = s.as_secs_f64();
            let in_window: u64 = out.flows.iter().map(|f| f.bytes_in_window).sum();
            let per: Vec<f64> = out
                .flows
                .iter()
                .map(|f| f.bytes_in_window as f64 * 8.0 / secs)
                .collect();
            (in_window as f64 * 8.0 / secs, None, None, per)
        }
        Workload::Bytes(b) => {
            let done = out.flows.iter().all(|f| f.completed_at.is_some());
            let completion = out
                .flows
                .iter()
                .filter_map(|f| f.completed_at)
                .max()
                .filter(|_| done)
                .map(|d| d.as_secs_f64());
            let elapsed = completion
                .unwrap_or_else(|| (out.sim_end.saturating_sub(out.transfer_start)).as_secs_f64());
            let per: Vec<f64> = out
                .flows
                .iter()
                .map(|f| {
                    let t = f
                        .completed_at
                        .map_or(elapsed, |d| d.as_secs_f64())
                        .max(1e-9);
                    f.bytes_delivered as f64 * 8.0 / t
                })
                .collect();
            let t_min = sc.forward.delay.as_secs_f64() + b as f64 * 8.0 / ref_bps;
            (
                delivered as f64 * 8.0 / elapsed.max(1e-9),
                completion,
                Some(t_min),
                per,
            )
        }
    };
    let a = &out.a_stats;
    let sum = |f: fn(&pep_transport::Stats) -> u64| -> u64 { a.iter().map(f).sum() };
    let fwd = &out.forward;
    let active = out
        .sim_end
        .saturating_sub(out.transfer_start)
        .as_secs_f64()
        .max(1e-9);
    let losses_true = |l: &crate::link::LinkStats| LossesTrue {
        corruption: l.corrupted,
        queue_drop: l.queue_drops,
        random: l.lost,
        burst: l.burst_lost,
        outage: l.outage_dropped,
    };
    let start = out.transfer_start;
    let end = out.sim_end;
    let link_average_bps = average_rate(sc, start, end);
    let capacity_ref = reference_goodput_bps(link_average_bps, forward_ber);
    let interactive = sc.interactive.map(|_| {
        let mut l: Vec<f64> = out
            .interactive_latencies
            .iter()
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        l.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            l.get(((l.len().max(1) - 1) as f64 * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        InteractiveReport {
            messages: l.len(),
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
            max_ms: l.last().copied().unwrap_or(0.0),
        }
    });
    let buckets = out.forward_timeline.buckets();
    let mut steps = step_responses(
        buckets,
        sc.forward.rate_schedule.steps(),
        sc.forward.rate_bps as f64,
        STEP_QUEUE_BOUND,
        STEP_RATE_FRACTION,
        end,
    );
    for s in &mut steps {
        s.at_s -= start.as_secs_f64();
    }
    let cap = a.first().map(|s| s.capacity).unwrap_or_default();
    let secs = BUCKET.as_secs_f64();
    let timeline = buckets
        .iter()
        .enumerate()
        .filter(|(_, b)| b.t >= start.as_secs_f64())
        .map(|(i, b)| TimelineRow {
            t: b.t - start.as_secs_f64(),
            delivered_mbps: (b.delivered_bytes - b.cross_bytes) as f64 * 8.0 / secs / 1e6,
            cross_mbps: b.cross_bytes as f64 * 8.0 / secs / 1e6,
            queue_max_ms: b.queue_max_ms,
            estimate_mbps: out.estimates.get(i).copied().unwrap_or(0) as f64 / 1e6,
            goodput_mbps: out.payload.get(i).copied().unwrap_or(0) as f64 * 8.0 / secs / 1e6,
            datagram_size: out.datagram_sizes.get(i).copied().unwrap_or(0),
        })
        .collect();
    Report {
        goodput_bps,
        ref_bps,
        efficiency: goodput_bps / ref_bps,
        completion_s,
        t_min_s,
        completion_over_t_min: completion_s.zip(t_min_s).map(|(c, t)| c / t),
        intact: out.flows.iter().all(|f| f.intact),
        bytes_delivered: delivered,
        forward_wire_bytes: fwd.wire_bytes_offered,
        return_wire_bytes: out.ret.wire_bytes_offered,
        return_over_forward: out.ret.wire_bytes_offered as f64
            / fwd.wire_bytes_offered.max(1) as f64,
        retransmitted_bytes: sum(|s| s.stream_bytes_retransmitted),
        redundant_bytes: sum(|s| s.stream_bytes_redundant),
        packets_sent: sum(|s| s.packets_sent),
        spurious_losses: sum(|s| s.spurious_losses),
        losses_by_cause: LossesByCause {
            congestion: sum(|s| s.lost.congestion),
            corruption: sum(|s| s.lost.corruption),
            outage: sum(|s| s.lost.outage),
        },
        losses_true: losses_true(fwd),
        return_losses_true: losses_true(&out.ret),
        congestion_events: sum(|s| s.congestion_events),
        snacks_sent: out.b_stats.iter().map(|s| s.snacks_sent).sum(),
        snacks_received: sum(|s| s.snacks_received),
        acks_sent: out.b_stats.iter().map(|s| s.acks_sent).sum(),
        probes_sent: sum(|s| s.probes_sent),
        outages_detected: sum(|s| s.outages),
        outage_events: out
            .outage_events
            .iter()
            .map(|(t, e)| (t.as_secs_f64(), *e))
            .collect(),
        outage_resume_s: sc
            .forward
            .impairments
            .outages
            .windows
            .iter()
            .map(|w| {
                let back = w.start + w.duration;
                out.outage_events
                    .iter()
                    .find(|(t, e)| *e == "outage_ended" && *t >= back)
                    .map(|(t, _)| (*t - back).as_secs_f64())
            })
            .collect(),
        flow_resets: out.flows.iter().filter(|f| f.reset).count() as u64,
        jain_fairness: (out.flows.len() > 1).then(|| jain_fairness(&per_flow)),
        per_flow_goodput_bps: if per_flow.len() <= 64 {
            per_flow
        } else {
            Vec::new()
        },
        link_utilisation: fwd.busy.as_secs_f64() / active,
        cross_delivered_bps: buckets
            .iter()
            .filter(|b| b.t >= start.as_secs_f64())
            .map(|b| b.cross_bytes)
            .sum::<u64>() as f64
            * 8.0
            / active,
        mean_queue_delay_ms: fwd.queue_wait_total.as_secs_f64() * 1e3
            / fwd.packets_offered.saturating_sub(fwd.queue_drops).max(1) as f64,
        queue_peak_bytes: fwd.queue_peak_bytes,
        rtt_min_ms: a.first().map_or(0.0, |s| s.rtt_min.as_secs_f64() * 1e3),
        rtt_smoothed_ms: a
            .first()
            .map_or(0.0, |s| s.rtt_smoothed.as_secs_f64() * 1e3),
        handshake_s: out.transfer_start.as_secs_f64(),
        queue_delay: out.forward_timeline.queue_delay(),
        link_average_bps,
        efficiency_of_capacity: goodput_bps / capacity_ref.max(1.0),
        interactive,
        step_responses: steps,
        capacity: CapacityReport {
            estimate_bps: cap.estimate_bps,
            drains: cap.drains,
            needless_drains: cap.needless_drains,
            jitter_ms: cap.jitter.as_secs_f64() * 1e3,
            probes: cap.probes,
            rebases: cap.rebases,
            competes: cap.competes,
            limited_by_estimate_s: cap.limited_by_estimate.as_secs_f64(),
            limited_by_ceiling_s: cap.limited_by_ceiling.as_secs_f64(),
        },
        datagram_size: a.first().map_or(0, |s| s.datagram_size),
        datagram_size_changes: a.first().map_or(0, |s| s.datagram_size_changes),
        timeline: Some(timeline),
        sim_seconds: out.sim_end.as_secs_f64(),
        cpu_seconds,
        events: out.events_processed,
    }
}

/// Mean forward rate over `[start, end)`: the rate schedule integrated, outage time at zero.
fn average_rate(sc: &Scenario, start: Duration, end: Duration) -> f64 {
    let step = Duration::from_millis(1);
    let mut t = start;
    let (mut sum, mut n) = (0.0, 0u64);
    while t < end {
        if !sc.forward.impairments.outages.is_down(t) {
            sum += sc.forward.rate_at(t) as f64;
        }
        n += 1;
        t += step;
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}
