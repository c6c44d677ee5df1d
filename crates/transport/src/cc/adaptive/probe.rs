//! A measurement in flight: a probe above the estimate, or the establishment train. It is
//! followed through the ACKs of its own packets and judged when its last is acknowledged.

use std::time::{Duration, Instant};

use crate::cc::delivery::bits_per_second;

/// An ACK, dated by when its largest packet reached the peer, with the delivered total
/// after it.
type Dated = (Instant, u64);
/// An RTT sample of one of the probe's packets: (sent at, RTT).
type Sample = (Instant, Duration);

#[derive(Debug, Clone)]
pub struct Probe {
    /// The rate it was sent at.
    pub rate: f64,
    pub first_pn: u64,
    /// Set when it stops sending.
    pub last_pn: Option<u64>,
    /// The establishment train: its result may lower the estimate.
    pub train: bool,
    /// It went out on a slotted path whose frames (the ACK clumps' period) were this long:
    /// it spans several of them and is measured from its first whole frame to its last.
    pub frame: Option<Duration>,
    /// The most queue it can leave where the path cannot carry it, when it went at the lower
    /// gain of a lengthened probe; `None` at the full gain.
    pub queue_bound: Option<Duration>,
    /// Some of it went out after an idle gap: it can show more capacity, never less.
    pub app_limited: bool,
    /// When its first and latest packets left.
    pub sent: Option<(Instant, Instant)>,
    /// The latest ACK that acknowledged nothing sent after it, and the one before that
    /// (the first is `acks`' first).
    end: Option<Dated>,
    before_end: Option<Dated>,
    /// When the first ACK of its packets and the latest that acknowledged nothing sent
    /// after it arrived (not less the ACK delay): where its ACKs lie in the delivery meter.
    pub arrivals: Option<(Instant, Instant)>,
    /// Every RTT sample of its packets, in the order they came (at most `KEEP_SAMPLES`).
    samples: Vec<Sample>,
    /// Every ACK of its packets from its first to the latest that acknowledged nothing sent
    /// after it, in the order they came (at most `KEEP_SAMPLES`).
    acks: Vec<Dated>,
    /// RTT samples of its packet with the least RTT (its earliest, unless that one's ACK
    /// waited on the way back: the queue only grows while a probe sends above the path's
    /// rate), its latest, and the one before the latest.
    low_sample: Option<Sample>,
    last_sample: Option<Sample>,
    before_last_sample: Option<Sample>,
    /// The largest fall of the RTT from one of its samples to the next: a queue that only
    /// grows while it sends makes none, a path that jitters does.
    pub largest_fall: Duration,
}

/// What a finished probe says, by two measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Delivered bytes over the time between its first and last ACK: ACKs that bunch up
    /// on the way back make it read high.
    pub by_acks: f64,
    /// A queue that grew by `g` while the probe sent for `t` at rate R means the path
    /// carried R / (1 + g/t): a delayed ACK makes it read low.
    pub by_delay: Option<f64>,
    /// How much longer the queue was for its latest packet than for its least.
    pub growth: Option<Duration>,
}

impl Probe {
    pub fn new(rate: f64, first_pn: u64, train: bool) -> Probe {
        Probe {
            rate,
            first_pn,
            last_pn: None,
            train,
            app_limited: false,
            sent: None,
            end: None,
            before_end: None,
            frame: None,
            queue_bound: None,
            arrivals: None,
            samples: Vec::new(),
            acks: Vec::new(),
            low_sample: None,
            last_sample: None,
            before_last_sample: None,
            largest_fall: Duration::ZERO,
        }
    }

    /// Its first ACK.
    fn start(&self) -> Option<Dated> {
        self.acks.first().copied()
    }

    pub fn first_ack_at(&self) -> Option<Instant> {
        self.start().map(|(at, _)| at)
    }

    pub fn covers(&self, pn: u64) -> bool {
        pn >= self.first_pn && self.last_pn.is_none_or(|l| pn <= l)
    }

    pub fn on_sent(&mut self, now: Instant, pn: u64, app_limited: bool) {
        if self.last_pn.is_some() {
            return;
        }
        let first = self.sent.map_or(now, |(a, _)| a);
        self.sent = Some((first, now));
        // A gap before its first packet is outside what it measures (from its first ACK).
        self.app_limited |= app_limited && pn > self.first_pn;
    }

    pub fn on_sample(&mut self, pn: u64, sample: Sample) {
        if !self.covers(pn) {
            return;
        }
        // An ACK held up on the return path (behind a request on a slow return link) raises
        // the first sample: measured from it, the queue's growth reads short and the path
        // fast, as the ACK rate does from the same late ACK.
        if self.low_sample.is_none_or(|(_, rtt)| sample.1 < rtt) {
            self.low_sample = Some(sample);
        }
        if let Some((_, last)) = self.last_sample {
            self.largest_fall = self.largest_fall.max(last.saturating_sub(sample.1));
        }
        if self.samples.len() < KEEP_SAMPLES {
            self.samples.push(sample);
        }
        self.before_last_sample = self.last_sample;
        self.last_sample = Some(sample);
    }

    /// Follows one ACK (dated `at`, with `delivered` after it, acknowledging up to
    /// `largest_acked`). Returns whether the probe is finished. Only ACKs within its packets
    /// count: the one that also acknowledges packets sent after it may have waited for
    /// them.
    pub fn on_ack(
        &mut self,
        arrived: Instant,
        at: Instant,
        delivered: u64,
        largest_acked: u64,
    ) -> bool {
        if largest_acked < self.first_pn {
            return false;
        }
        if self.last_pn.is_none_or(|l| largest_acked <= l) {
            let first = self.arrivals.map_or(arrived, |(a, _)| a);
            self.arrivals = Some((first, arrived));
            if !self.acks.is_empty() {
                self.before_end = self.end;
                self.end = Some((at, delivered));
            }
            if self.acks.len() < KEEP_SAMPLES {
                self.acks.push((at, delivered));
            }
        }
        self.last_pn.is_some_and(|l| largest_acked >= l)
    }

    /// Both measures, from the first ACK and sample to the last; or, with `trim`, to the
    /// ones before the last where there are such, so one late final ACK cannot move both.
    /// `noise`: how much of the queue's growth the path's jitter alone may show, left out
    /// of the delay measure. `None` when fewer than `min_bytes` were delivered between its
    /// ACKs.
    pub fn verdict(&self, trim: bool, min_bytes: u64, noise: Duration) -> Option<Verdict> {
        let end = if trim {
            self.before_end
                .filter(|e| Some(*e) != self.start())
                .or(self.end)
        } else {
            self.end
        };
        let last = if trim {
            self.before_last_sample
                .filter(|s| Some(*s) != self.low_sample)
                .or(self.last_sample)
        } else {
            self.last_sample
        };
        let ((t0, d0), (t1, d1)) = self.start().zip(end)?;
        let bytes = d1.saturating_sub(d0);
        if bytes < min_bytes {
            return None;
        }
        let by_acks = bits_per_second(bytes, t1.saturating_duration_since(t0))?;
        let samples = self.low_sample.zip(last);
        let growth = samples.map(|((_, r0), (_, r1))| r1.saturating_sub(r0).saturating_sub(noise));
        let by_delay = samples.and_then(|((s0, _), (s1, _))| {
            let span = s1.saturating_duration_since(s0).as_secs_f64();
            let g = growth?.as_secs_f64();
            (span > 0.0).then(|| self.rate / (1.0 + g / span))
        });
        Some(Verdict {
            by_acks,
            by_delay,
            growth,
        })
    }

    /// The delivery rate fitted to all of its ACKs: the least-squares slope of the delivered
    /// count over the ACKs' dates. Where the path's delay jitters, its first and last ACK
    /// each move by as much as the jitter, and a rate between those two alone moves with
    /// them; the fit moves by what the jitter does to all of its ACKs together. `None` with
    /// fewer than three ACKs, or fewer than `min_bytes` delivered between them.
    pub fn fitted_rate(&self, min_bytes: u64) -> Option<f64> {
        let (&(t0, d0), &(_, d1)) = (self.acks.first()?, self.acks.last()?);
        if self.acks.len() < 3 || d1.saturating_sub(d0) < min_bytes {
            return None;
        }
        let points = || {
            self.acks.iter().map(move |&(t, d)| {
                let secs = t.saturating_duration_since(t0).as_secs_f64();
                (secs, d.saturating_sub(d0) as f64)
            })
        };
        let n = self.acks.len() as f64;
        let (sum_t, sum_d) = points().fold((0.0, 0.0), |(st, sd), (t, d)| (st + t, sd + d));
        let (mean_t, mean_d) = (sum_t / n, sum_d / n);
        let (cov, var) = points().fold((0.0, 0.0), |(c, v), (t, d)| {
            let dt = t - mean_t;
            (c + dt * (d - mean_d), v + dt * dt)
        });
        let bytes_per_second = cov / var;
        (var > 0.0 && bytes_per_second > 0.0).then_some(bytes_per_second * 8.0)
    }

    /// When the ACK of the first of its packets sent at least `skip` after its first
    /// arrived: where a measurement that leaves out its first stretch starts.
    pub fn settled_from(&self, skip: Duration) -> Option<Instant> {
        let (first, _) = self.sent?;
        self.samples
            .iter()
            .find(|s| s.0 >= first + skip)
            .map(|&(at, rtt)| at + rtt)
    }

    /// When the ACK of the last of its packets sent at least `skip` before its last arrived:
    /// where a measurement that leaves out its last stretch ends (the packets the pause after
    /// it leaves unacknowledged until the peer's timer, or the next packets, have them
    /// acknowledged).
    pub fn settled_until(&self, skip: Duration) -> Option<Instant> {
        let (_, last) = self.sent?;
        self.samples
            .iter()
            .filter(|s| s.0 + skip <= last)
            .map(|&(at, rtt)| at + rtt)
            .max()
    }

    /// How much the queue grew while it was sent, on a path whose ACKs come in clumps: the
    /// least RTT of the packets sent in its last `window` less the least of those sent in its
    /// first (a window as long as the clump period holds a packet that waited for no slot),
    /// less `noise`; and the delay rate `R / (1 + g/t)` with `t` the time between the
    /// windows' middles. `None` when it lasted less than two windows.
    pub fn growth_over(&self, window: Duration, noise: Duration) -> Option<(Duration, f64)> {
        let first = self.samples.iter().map(|s| s.0).min()?;
        let last = self.samples.iter().map(|s| s.0).max()?;
        let t = last.saturating_duration_since(first).checked_sub(window)?;
        if t < window {
            return None;
        }
        let least = |keep: &dyn Fn(Instant) -> bool| {
            self.samples.iter().filter(|s| keep(s.0)).map(|s| s.1).min()
        };
        let early = least(&|at| at < first + window)?;
        let late = least(&|at| at + window > last)?;
        let growth = late.saturating_sub(early).saturating_sub(noise);
        let rate = self.rate / (1.0 + growth.as_secs_f64() / t.as_secs_f64());
        Some((growth, rate))
    }
}

/// RTT samples a probe keeps: one per ACK, and a probe spans at most a few hundred
/// milliseconds of them.
const KEEP_SAMPLES: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_the_acks_and_the_queue_of_its_own_packets() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // 20 packets at 20 Mb/s into a 10 Mb/s path: 1250 bytes each, so every ACK of 2
        // packets comes 2 ms after the last, and each packet queues 0.5 ms longer.
        let mut p = Probe::new(20e6, 100, false);
        for i in 0..20u64 {
            p.on_sent(t0 + Duration::from_micros(500 * i), 100 + i, false);
        }
        p.last_pn = Some(119);
        let mut delivered = 0;
        let mut done = false;
        for k in 0..10u64 {
            delivered += 2500;
            let pn = 101 + 2 * k;
            let sent = t0 + Duration::from_micros(500 * (pn - 100));
            p.on_sample(
                pn,
                (sent, ms(600) + Duration::from_micros(500 * (pn - 100))),
            );
            done = p.on_ack(t0 + ms(600 + 2 * k), t0 + ms(600 + 2 * k), delivered, pn);
        }
        assert!(done);
        let v = p.verdict(false, 0, Duration::ZERO).expect("verdict");
        // 9 ACK intervals of 2 ms carried 9 × 2500 bytes: 10 Mb/s.
        assert!((v.by_acks - 10e6).abs() < 1.0, "{v:?}");
        // The queue grew 9 ms over 9 ms of sending at 20 Mb/s: 10 Mb/s.
        assert!((v.by_delay.expect("delay") - 10e6).abs() < 1.0, "{v:?}");
        assert_eq!(v.growth, Some(ms(9)));
        // Without the last ACK and sample: the same rates from one interval less.
        let t = p.verdict(true, 0, Duration::ZERO).expect("trimmed");
        assert!((t.by_acks - 10e6).abs() < 1.0, "{t:?}");
        assert_eq!(t.growth, Some(ms(8)));
        assert!(p.verdict(false, 1_000_000, Duration::ZERO).is_none());
    }

    #[test]
    fn a_rate_fitted_to_all_acks_moves_less_with_jitter_than_one_between_two() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        // Ten ACKs of 12,500 bytes each 10 ms apart (10 Mb/s), acknowledged as they come,
        // each `offset(k)` µs after its slot.
        let acked = |offset: &dyn Fn(u64) -> u64| {
            let mut p = Probe::new(12e6, 100, false);
            p.last_pn = Some(119);
            for k in 0..10u64 {
                let at = t0 + us(10_000 * k + offset(k));
                p.on_ack(at, at, 12_500 * (k + 1), 100 + 2 * k);
            }
            p
        };
        let regular = acked(&|_| 5_000);
        let rate = regular.fitted_rate(0).expect("fitted");
        assert!((rate - 10e6).abs() < 1.0, "{rate}");
        // The path's jitter delays the first ACK by 5 ms and hurries the last by as much:
        // between those two the rate reads 11.25 Mb/s, fitted to all ten 10.54.
        let moved = acked(&|k| match k {
            0 => 10_000,
            9 => 0,
            _ => 5_000,
        });
        let between = moved.verdict(false, 0, Duration::ZERO).expect("verdict");
        assert!((between.by_acks - 11.25e6).abs() < 1.0, "{between:?}");
        let fitted = moved.fitted_rate(0).expect("fitted");
        assert!((fitted - 10.540_540e6).abs() < 10.0, "{fitted}");
        assert!(moved.fitted_rate(200_000).is_none());
    }

    #[test]
    fn a_first_ack_held_up_on_the_way_back_does_not_make_the_path_fast() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // As above, 20 Mb/s into 10, but the first sampled packet's ACK waited 3 ms behind
        // something on the return link: its RTT reads 3 ms high.
        let mut p = Probe::new(20e6, 100, false);
        p.last_pn = Some(119);
        for k in 0..10u64 {
            let pn = 101 + 2 * k;
            let sent = t0 + Duration::from_micros(500 * (pn - 100));
            let late = if k == 0 { ms(3) } else { ms(0) };
            let rtt = ms(600) + Duration::from_micros(500 * (pn - 100)) + late;
            p.on_sample(pn, (sent, rtt));
        }
        p.acks.push((t0, 0));
        p.end = Some((t0 + ms(18), 22_500));
        let v = p.verdict(false, 0, Duration::ZERO).expect("verdict");
        // Measured from the second packet's sample: 8 ms of growth over 8 ms of sending.
        assert_eq!(v.growth, Some(ms(8)));
        assert!((v.by_delay.expect("delay") - 10e6).abs() < 1.0, "{v:?}");
    }

    #[test]
    fn an_ack_that_also_covers_later_packets_does_not_count() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Probe::new(20e6, 10, false);
        p.last_pn = Some(19);
        assert!(!p.on_ack(t0, t0, 0, 9));
        assert!(!p.on_ack(t0 + ms(1), t0 + ms(1), 1000, 12));
        assert!(!p.on_ack(t0 + ms(2), t0 + ms(2), 2000, 16));
        // Acknowledges 19 and the packets after it, held back by the peer's timer.
        assert!(p.on_ack(t0 + ms(50), t0 + ms(50), 5000, 25));
        let v = p.verdict(false, 0, Duration::ZERO).expect("verdict");
        assert!((v.by_acks - 8e6).abs() < 1.0, "{v:?}");
    }

    #[test]
    fn on_a_slotted_path_the_growth_runs_from_its_first_frame_to_its_last() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A packet every millisecond for 160 ms into a path that carries half of it (the
        // queue grows a millisecond per millisecond) and holds each packet for the next slot
        // boundary, one every 40 ms from the first packet on.
        let mut p = Probe::new(20e6, 0, false);
        for t in 0..160u64 {
            p.on_sent(t0 + ms(t), t, false);
        }
        p.last_pn = Some(159);
        for t in 0..160u64 {
            let wait = (40 - t % 40) % 40;
            p.on_sample(t, (t0 + ms(t), ms(600 + t + wait)));
        }
        // Least RTT of packets sent in the first 40 ms: 600 (t = 0); in the last 40 ms:
        // 720 (t = 120). The windows' middles are 119 ms apart.
        let (growth, rate) = p.growth_over(ms(40), Duration::ZERO).expect("growth");
        assert_eq!(growth, ms(120));
        assert!((rate - 20e6 * 119.0 / 239.0).abs() < 1.0, "{rate}");
        // The jitter allowed for comes off the growth.
        assert_eq!(p.growth_over(ms(40), ms(20)).expect("growth").0, ms(100));
        // Too short for two windows.
        assert!(p.growth_over(ms(80), Duration::ZERO).is_none());
        // Its first packet sent 40 ms in (t = 40) was acknowledged at 40 + 640; the latest
        // acknowledgement of one sent 40 ms before its end (t <= 119) came at 119 + 720.
        assert_eq!(p.settled_from(ms(40)), Some(t0 + ms(680)));
        assert_eq!(p.settled_until(ms(40)), Some(t0 + ms(839)));
    }
}
