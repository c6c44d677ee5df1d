//! What one direction of a link did over time, measured at the bottleneck itself: the
//! queueing delay each packet saw and the bytes it delivered, in fixed time buckets, plus
//! every packet's wait for percentiles. Shared by the simulator and the emulator, so queue
//! figures are measured, not inferred from the endpoints.

use std::time::Duration;

use serde::Serialize;

/// Width of one bucket.
pub const BUCKET: Duration = Duration::from_millis(100);

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Bucket {
    /// Start of the bucket, seconds since the link started.
    pub t: f64,
    /// Longest queueing delay of a packet that entered the queue in this bucket (ms).
    pub queue_max_ms: f64,
    /// Bytes whose serialisation ended in this bucket and that were not dropped.
    pub delivered_bytes: u64,
    /// Of those, bytes of cross traffic (not the measured sender's).
    pub cross_bytes: u64,
    /// Packets dropped by the full queue.
    pub queue_drops: u64,
}

/// Percentiles of the queueing delay of every packet that entered the queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct QueueDelay {
    pub packets: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Clone, Debug, Default)]
pub struct Timeline {
    buckets: Vec<Bucket>,
    /// Each queued packet's wait in microseconds, in arrival order.
    waits_us: Vec<u32>,
}

impl Timeline {
    fn bucket(&mut self, at: Duration) -> &mut Bucket {
        let i = (at.as_nanos() / BUCKET.as_nanos()) as usize;
        while self.buckets.len() <= i {
            let t = (self.buckets.len() as u32 * BUCKET).as_secs_f64();
            self.buckets.push(Bucket {
                t,
                ..Bucket::default()
            });
        }
        &mut self.buckets[i]
    }

    /// A packet entered the queue at `arrival`, waited `wait` and finished serialisation at
    /// `departure`; `delivered` unless an impairment then destroyed it.
    pub fn record(
        &mut self,
        arrival: Duration,
        wait: Duration,
        departure: Duration,
        bytes: u64,
        delivered: bool,
        cross: bool,
    ) {
        let ms = wait.as_secs_f64() * 1e3;
        let b = self.bucket(arrival);
        b.queue_max_ms = b.queue_max_ms.max(ms);
        self.waits_us
            .push(u32::try_from(wait.as_micros()).unwrap_or(u32::MAX));
        if delivered {
            let b = self.bucket(departure);
            b.delivered_bytes += bytes;
            if cross {
                b.cross_bytes += bytes;
            }
        }
    }

    pub fn record_queue_drop(&mut self, arrival: Duration) {
        self.bucket(arrival).queue_drops += 1;
    }

    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Percentiles over every packet that entered the queue.
    pub fn queue_delay(&self) -> QueueDelay {
        let mut w = self.waits_us.clone();
        if w.is_empty() {
            return QueueDelay::default();
        }
        w.sort_unstable();
        let pick = |q: f64| {
            let i = ((w.len() - 1) as f64 * q).round() as usize;
            f64::from(w[i]) / 1e3
        };
        QueueDelay {
            packets: w.len() as u64,
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
            max_ms: f64::from(*w.last().unwrap_or(&0)) / 1e3,
        }
    }
}

/// A queue counts as back under its bound once it stays there this long: the step's own
/// queue is gone, and a later spike is another event (reported apart).
pub const SETTLE_HOLD: Duration = Duration::from_secs(2);

/// How the link followed one step of its rate: after a step down, how long until the queue
/// was back under a bound (and stayed there for [`SETTLE_HOLD`]); after a step up, how long
/// until the measured sender's delivered rate, over one second, reached a fraction of the
/// new rate.
#[derive(Clone, Debug, Serialize)]
pub struct StepResponse {
    /// Seconds since the link started.
    pub at_s: f64,
    pub from_bps: f64,
    pub to_bps: f64,
    /// Step down: seconds from the step until the queue was under the bound and stayed
    /// there for [`SETTLE_HOLD`] (or to the next step); `None` if that never happened.
    pub queue_settled_s: Option<f64>,
    /// Step down: the longest queue after it settled, to the next step (ms).
    pub later_queue_max_ms: Option<f64>,
    /// Step up: seconds from the step until the sender's delivered rate over one second
    /// first reached `fraction` of the new rate.
    pub reached_s: Option<f64>,
}

/// Responses to each step of `steps` (time, new rate), judged on `buckets` until the next
/// step or `end`.
pub fn step_responses(
    buckets: &[Bucket],
    steps: &[(Duration, f64)],
    initial_bps: f64,
    queue_bound: Duration,
    fraction: f64,
    end: Duration,
) -> Vec<StepResponse> {
    let bound_ms = queue_bound.as_secs_f64() * 1e3;
    let per_sec = (Duration::from_secs(1).as_nanos() / BUCKET.as_nanos()) as usize;
    let mut out = Vec::new();
    let mut from = initial_bps;
    for (k, &(at, to)) in steps.iter().enumerate() {
        let next = steps.get(k + 1).map_or(end, |s| s.0);
        let idx = |t: Duration| (t.as_nanos() / BUCKET.as_nanos()) as usize;
        let (lo, hi) = (idx(at), idx(next).min(buckets.len()));
        let span = buckets.get(lo..hi).unwrap_or_default();
        let mut r = StepResponse {
            at_s: at.as_secs_f64(),
            from_bps: from,
            to_bps: to,
            queue_settled_s: None,
            later_queue_max_ms: None,
            reached_s: None,
        };
        if to < from {
            let hold = (SETTLE_HOLD.as_nanos() / BUCKET.as_nanos()) as usize;
            // The first bucket from which the queue stays under the bound for the hold.
            let settled = (0..span.len()).find(|&i| {
                let run = &span[i..(i + hold).min(span.len())];
                run.iter().all(|b| b.queue_max_ms < bound_ms)
            });
            r.queue_settled_s = settled.map(|i| (i as u32 * BUCKET).as_secs_f64());
            r.later_queue_max_ms =
                settled.map(|i| span[i..].iter().map(|b| b.queue_max_ms).fold(0.0, f64::max));
        } else if to > from && span.len() >= per_sec {
            r.reached_s = (0..=span.len() - per_sec).find_map(|i| {
                let bytes: u64 = span[i..i + per_sec]
                    .iter()
                    .map(|b| b.delivered_bytes - b.cross_bytes)
                    .sum();
                (bytes as f64 * 8.0 >= fraction * to)
                    .then(|| ((i + per_sec) as u32 * BUCKET).as_secs_f64())
            });
        }
        out.push(r);
        from = to;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_percentiles() {
        let mut t = Timeline::default();
        let ms = Duration::from_millis;
        for i in 0..100u64 {
            t.record(ms(i * 10), ms(i), ms(i * 10 + 1), 1000, i % 10 != 0, false);
        }
        t.record_queue_drop(ms(55));
        let b = t.buckets();
        assert_eq!(b.len(), 10);
        assert_eq!(b[0].queue_max_ms, 9.0);
        assert_eq!(b[0].delivered_bytes, 9000);
        assert_eq!(b[0].queue_drops, 1);
        let q = t.queue_delay();
        assert_eq!(q.packets, 100);
        assert_eq!(q.max_ms, 99.0);
        assert_eq!(q.p50_ms, 50.0);
        assert_eq!(q.p99_ms, 98.0);
    }

    #[test]
    fn step_down_settles_and_step_up_reaches() {
        // 10 s at 8 Mb/s; the rate halves at 2 s: queue high for 1.5 s (and a lone spike at
        // 5.8 s, after it had settled: reported apart); back up at 6 s,
        // delivery at the new rate from 7 s: the one-second average reaches 0.9 of it over
        // 6.8–7.8 s (8 buckets at the new rate, 2 at the old).
        let buckets: Vec<Bucket> = (0..100u32)
            .map(|i| {
                let t = (i * BUCKET).as_secs_f64();
                Bucket {
                    t,
                    queue_max_ms: match i {
                        20..35 => 400.0,
                        58 => 150.0,
                        _ => 5.0,
                    },
                    delivered_bytes: if t >= 7.0 { 100_000 } else { 50_000 },
                    ..Bucket::default()
                }
            })
            .collect();
        let s = |t: u64| Duration::from_secs(t);
        let r = step_responses(
            &buckets,
            &[(s(2), 4e6), (s(6), 8e6)],
            8e6,
            Duration::from_millis(100),
            0.9,
            s(10),
        );
        assert!((r[0].queue_settled_s.unwrap() - 1.5).abs() < 1e-9, "{r:?}");
        assert_eq!(r[0].later_queue_max_ms, Some(150.0));
        assert_eq!(r[0].reached_s, None);
        assert!((r[1].reached_s.unwrap() - 1.8).abs() < 1e-9, "{r:?}");
    }
}
