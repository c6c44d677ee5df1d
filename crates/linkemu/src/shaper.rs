//! One direction of the link as a sans-IO state machine: given a packet's arrival time and
//! length it decides whether and when the packet leaves the far end. Deciding everything at
//! arrival works because the queue is FIFO: a packet's serialisation slot is known as soon as it
//! is queued. That keeps the timing exact (no ticks) and lets tests drive it with virtual time.

use std::time::Duration;

use pep_sim::channel::{Channel, Fate};
use pep_sim::jitter::Jitter;
use pep_sim::timeline::Timeline;

use crate::config::DirectionConfig;

/// Why a packet did not make it across.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Drop-tail: the queue was full.
    Queue,
    Corrupted,
    Lost,
    BurstLost,
    Outage,
}

/// What happens to an offered packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the packet to the far end at this time (since the link started).
    Deliver {
        at: Duration,
    },
    Drop(DropReason),
}

pub struct Shaper {
    cfg: DirectionConfig,
    channel: Channel,
    /// The delay's variation and the order of deliveries, as in pep-sim (its draws come
    /// from a generator of their own, so the loss pattern of a seed is pep-sim's whatever
    /// the jitter).
    jitter: Jitter,
    /// When the serialiser finishes everything queued so far.
    link_free: Duration,
    timeline: Timeline,
}

impl Shaper {
    pub fn new(cfg: DirectionConfig, seed: u64) -> Self {
        Shaper {
            channel: Channel::new(cfg.impairments.clone(), seed),
            jitter: Jitter::new(cfg.jitter, seed),
            cfg,
            link_free: Duration::ZERO,
            timeline: Timeline::default(),
        }
    }

    /// The queueing delay each packet saw and what was delivered, over time.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Bytes queued or being serialised at `now`: what the serialiser still owes.
    pub fn backlog_bytes(&self, now: Duration) -> usize {
        let rate = self.cfg.rate_at(now);
        if rate <= 0.0 {
            return 0;
        }
        let owed = self.link_free.saturating_sub(now).as_secs_f64();
        (owed * rate / 8.0).round() as usize
    }

    fn serialisation_time(&self, len: usize, at: Duration) -> Duration {
        let rate = self.cfg.rate_at(at);
        if rate <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((len as f64 * 8.0 * 1e9 / rate).round() as u64)
    }

    /// Whether `len` more bytes arriving at `now` fit in the queue (an idle link takes any).
    pub fn has_room(&self, now: Duration, len: usize) -> bool {
        let backlog = self.backlog_bytes(now);
        backlog == 0 || backlog + len <= self.cfg.queue_bytes
    }

    /// Offers a packet of `len` IP bytes arriving at `now` (time since the link started).
    pub fn offer(&mut self, now: Duration, len: usize) -> Verdict {
        if !self.has_room(now, len) {
            self.timeline.record_queue_drop(now);
            return Verdict::Drop(DropReason::Queue);
        }
        let tx_start = self.link_free.max(now);
        let on_link = len + self.cfg.frame_overhead;
        let tx_end = tx_start + self.serialisation_time(on_link, tx_start);
        // A corrupted or lost packet still used its slot on the wire.
        self.link_free = tx_end;
        let fate = self.channel.judge(tx_start, on_link);
        self.timeline.record(
            now,
            tx_start - now,
            tx_end,
            on_link as u64,
            fate == Fate::Delivered,
            false,
        );
        match fate {
            Fate::Delivered => {}
            Fate::Corrupted => return Verdict::Drop(DropReason::Corrupted),
            Fate::Lost => return Verdict::Drop(DropReason::Lost),
            Fate::BurstLost => return Verdict::Drop(DropReason::BurstLost),
            Fate::Outage => return Verdict::Drop(DropReason::Outage),
        }
        let at = self.jitter.arrival(tx_end, self.cfg.delay_at(tx_end));
        Verdict::Deliver { at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pep_sim::channel::Impairments;
    use pep_sim::jitter::{JitterConfig, JitterKind};

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn serialises_at_the_configured_rate_then_delays() {
        let mut s = Shaper::new(
            DirectionConfig {
                rate_bps: 1_000_000.0,
                queue_bytes: 100_000,
                delay: ms(100),
                ..Default::default()
            },
            1,
        );
        // 1250 bytes = 10 ms at 1 Mb/s; back-to-back packets leave 10 ms apart.
        assert_eq!(s.offer(ms(0), 1250), Verdict::Deliver { at: ms(110) });
        assert_eq!(s.offer(ms(0), 1250), Verdict::Deliver { at: ms(120) });
        assert_eq!(s.backlog_bytes(ms(0)), 2500);
        // An idle link starts serialising at arrival.
        assert_eq!(s.offer(ms(500), 1250), Verdict::Deliver { at: ms(610) });
    }

    #[test]
    fn drop_tail_when_the_byte_limit_is_reached() {
        let mut s = Shaper::new(
            DirectionConfig {
                rate_bps: 1_000_000.0,
                queue_bytes: 3000,
                ..Default::default()
            },
            1,
        );
        assert!(matches!(s.offer(ms(0), 1500), Verdict::Deliver { .. }));
        assert!(matches!(s.offer(ms(0), 1500), Verdict::Deliver { .. }));
        assert_eq!(s.offer(ms(0), 1500), Verdict::Drop(DropReason::Queue));
        // 12 ms later one packet has left: room again.
        assert!(matches!(s.offer(ms(12), 1500), Verdict::Deliver { .. }));
    }

    #[test]
    fn jitter_does_not_reorder_unless_asked() {
        let cfg = DirectionConfig {
            delay: ms(20),
            jitter: JitterConfig {
                bound: ms(5),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut s = Shaper::new(cfg.clone(), 9);
        let mut last = Duration::ZERO;
        let mut spread = (Duration::MAX, Duration::ZERO);
        for i in 0..10_000u64 {
            let now = Duration::from_micros(i * 100);
            let Verdict::Deliver { at } = s.offer(now, 100) else {
                panic!("dropped")
            };
            assert!(at >= last);
            last = at;
            let d = at - now;
            spread = (spread.0.min(d), spread.1.max(d));
        }
        assert!(spread.0 >= ms(15) && spread.1 > ms(24), "{spread:?}");

        let mut s = Shaper::new(
            DirectionConfig {
                jitter: JitterConfig {
                    reorder: true,
                    ..cfg.jitter
                },
                ..cfg
            },
            9,
        );
        let mut reordered = 0;
        let mut last = Duration::ZERO;
        for i in 0..10_000u64 {
            let Verdict::Deliver { at } = s.offer(Duration::from_micros(i * 100), 100) else {
                panic!("dropped")
            };
            if at < last {
                reordered += 1;
            }
            last = last.max(at);
        }
        assert!(reordered > 100, "{reordered}");
    }

    #[test]
    fn slotted_jitter_delivers_in_bunches_one_frame_apart() {
        let mut s = Shaper::new(
            DirectionConfig {
                rate_bps: 10_000_000.0,
                delay: ms(300),
                jitter: JitterConfig {
                    kind: JitterKind::Slotted,
                    bound: ms(20),
                    reorder: false,
                },
                ..Default::default()
            },
            3,
        );
        // 1000-byte packets at 10 Mb/s: 800 µs apart, 50 to a 40 ms frame.
        let mut at = Vec::new();
        for i in 0..1250u64 {
            let Verdict::Deliver { at: t } = s.offer(Duration::from_micros(800 * i), 1000) else {
                panic!("dropped")
            };
            at.push(t);
        }
        assert!(at.windows(2).all(|w| w[0] <= w[1]));
        at.dedup();
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g == ms(40)), "{gaps:?}");
        assert!((25..=26).contains(&at.len()), "{}", at.len());
    }

    #[test]
    fn every_jitter_kind_delivers_at_the_simulators_arrival_times() {
        // The emulator's delays are the shared model's, packet for packet: the same seed
        // gives the same arrivals as the simulator's jitter process.
        let kinds = [
            (JitterKind::Uniform, false),
            (JitterKind::Uniform, true),
            (JitterKind::Wander, false),
            (JitterKind::Slotted, false),
        ];
        for (kind, reorder) in kinds {
            let jitter = JitterConfig {
                kind,
                bound: ms(20),
                reorder,
            };
            let mut s = Shaper::new(
                DirectionConfig {
                    rate_bps: 10_000_000.0,
                    delay: ms(300),
                    jitter,
                    ..Default::default()
                },
                7,
            );
            let mut model = Jitter::new(jitter, 7);
            // 1000 bytes every millisecond at 10 Mb/s: 800 µs on the wire, never a queue.
            for i in 0..2_000u64 {
                let now = ms(i);
                let tx_end = now + Duration::from_micros(800);
                let expected = model.arrival(tx_end, ms(300));
                assert_eq!(
                    s.offer(now, 1000),
                    Verdict::Deliver { at: expected },
                    "{kind} reorder={reorder} packet {i}"
                );
                assert!(expected.abs_diff(tx_end + ms(300)) <= ms(20));
            }
        }
    }

    #[test]
    fn outage_drops_and_still_uses_the_slot() {
        let mut s = Shaper::new(
            DirectionConfig {
                rate_bps: 1_000_000.0,
                impairments: Impairments {
                    outages: pep_sim::channel::OutageSchedule {
                        windows: vec!["1+1".parse().unwrap()],
                        periodic: None,
                    },
                    ..Default::default()
                },
                ..Default::default()
            },
            1,
        );
        assert_eq!(s.offer(ms(1500), 1250), Verdict::Drop(DropReason::Outage));
        assert_eq!(s.offer(ms(2000), 1250), Verdict::Deliver { at: ms(2010) });
    }
}
