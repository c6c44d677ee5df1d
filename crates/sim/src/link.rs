//! One direction of a modelled satellite link: serialisation at a bit rate behind a drop-tail
//! queue, propagation delay and its jitter, and the channel's impairments.

use std::collections::VecDeque;
use std::time::Duration;

use crate::channel::{Channel, Fate, Impairments};
use crate::jitter::{Jitter, JitterConfig};
use crate::schedule::Schedule;
use crate::timeline::Timeline;

#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub rate_bps: u64,
    pub delay: Duration,
    /// Drop-tail limit on bytes waiting to be serialised.
    pub queue_bytes: u64,
    pub impairments: Impairments,
    /// Rate (bit/s) from each step on; `rate_bps` before the first (ACM steps).
    pub rate_schedule: Schedule,
    /// One-way delay (ms) from each step on; `delay` before the first (LEO path changes).
    pub delay_schedule: Schedule,
    /// Bytes the link layer adds to each packet (encapsulation such as GSE): they take
    /// link time and can be corrupted like the rest.
    pub frame_overhead: u64,
    /// How each packet's delay varies around the path's (`crate::jitter`).
    pub jitter: JitterConfig,
}

impl LinkConfig {
    /// A link of fixed rate and delay.
    pub fn fixed(rate_bps: u64, delay: Duration, queue_bytes: u64, imp: Impairments) -> Self {
        LinkConfig {
            rate_bps,
            delay,
            queue_bytes,
            impairments: imp,
            rate_schedule: Schedule::default(),
            delay_schedule: Schedule::default(),
            frame_overhead: 0,
            jitter: JitterConfig::default(),
        }
    }

    pub fn rate_at(&self, t: Duration) -> u64 {
        self.rate_schedule.at(t).map_or(self.rate_bps, |r| r as u64)
    }

    pub fn delay_at(&self, t: Duration) -> Duration {
        self.delay_schedule
            .at(t)
            .map_or(self.delay, |ms| Duration::from_secs_f64(ms / 1e3))
    }
}

/// What became of one packet offered to the link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Offer {
    /// Arrives intact at `arrival`.
    Delivered { arrival: Duration },
    /// The queue was full.
    QueueDrop,
    /// Serialised, then destroyed on the way.
    Impaired(Fate),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkStats {
    pub packets_offered: u64,
    pub wire_bytes_offered: u64,
    pub packets_delivered: u64,
    pub wire_bytes_delivered: u64,
    pub queue_drops: u64,
    pub corrupted: u64,
    pub lost: u64,
    pub burst_lost: u64,
    pub outage_dropped: u64,
    pub queue_peak_bytes: u64,
    /// Sum of time packets waited in the queue (for the mean).
    pub queue_wait_total: Duration,
    /// Time the transmitter was busy.
    pub busy: Duration,
    /// Cross traffic (not the simulated senders') offered and delivered, in wire bytes.
    pub cross_bytes_offered: u64,
    pub cross_bytes_delivered: u64,
}

pub struct Link {
    cfg: LinkConfig,
    channel: Channel,
    /// When the transmitter finishes the last queued packet.
    busy_until: Duration,
    /// Departure (end of serialisation) time and size of packets not yet fully sent.
    in_queue: VecDeque<(Duration, u64)>,
    queued_bytes: u64,
    /// Delivery times: the delay's jitter, and (unless reordering is allowed) no packet
    /// overtaking another, even when the delay steps down.
    jitter: Jitter,
    stats: LinkStats,
    timeline: Timeline,
}

impl Link {
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Link {
            channel: Channel::new(cfg.impairments.clone(), seed),
            jitter: Jitter::new(cfg.jitter, seed),
            cfg,
            busy_until: Duration::ZERO,
            in_queue: VecDeque::new(),
            queued_bytes: 0,
            stats: LinkStats::default(),
            timeline: Timeline::default(),
        }
    }

    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn serialisation(&self, bytes: u64, at: Duration) -> Duration {
        let rate = self.cfg.rate_at(at).max(1);
        let nanos = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate);
        Duration::from_nanos(nanos as u64)
    }

    /// Offers a packet of `wire_bytes` (everything that crosses the link) at time `now`.
    pub fn offer(&mut self, now: Duration, wire_bytes: u64) -> Offer {
        self.offer_as(now, wire_bytes, false)
    }

    /// Offers a packet of cross traffic: it takes its place in the queue and on the wire
    /// but belongs to no simulated sender.
    pub fn offer_cross(&mut self, now: Duration, wire_bytes: u64) -> Offer {
        self.stats.cross_bytes_offered += wire_bytes;
        let offer = self.offer_as(now, wire_bytes, true);
        if let Offer::Delivered { .. } = offer {
            self.stats.cross_bytes_delivered += wire_bytes;
        }
        offer
    }

    fn offer_as(&mut self, now: Duration, ip_bytes: u64, cross: bool) -> Offer {
        let wire_bytes = ip_bytes + self.cfg.frame_overhead;
        while let Some(&(depart, bytes)) = self.in_queue.front() {
            if depart > now {
                break;
            }
            self.in_queue.pop_front();
            self.queued_bytes -= bytes;
        }
        self.stats.packets_offered += 1;
        self.stats.wire_bytes_offered += wire_bytes;
        // The packet being serialised counts as queued until it has left.
        if self.queued_bytes + wire_bytes > self.cfg.queue_bytes && !self.in_queue.is_empty() {
            self.stats.queue_drops += 1;
            self.timeline.record_queue_drop(now);
            return Offer::QueueDrop;
        }
        let start = self.busy_until.max(now);
        let tx = self.serialisation(wire_bytes, start);
        let depart = start + tx;
        self.busy_until = depart;
        self.in_queue.push_back((depart, wire_bytes));
        self.queued_bytes += wire_bytes;
        self.stats.queue_peak_bytes = self.stats.queue_peak_bytes.max(self.queued_bytes);
        self.stats.queue_wait_total += start - now;
        self.stats.busy += tx;
        let fate = self.channel.judge(start, wire_bytes as usize);
        let delivered = fate == Fate::Delivered;
        self.timeline
            .record(now, start - now, depart, wire_bytes, delivered, cross);
        match fate {
            Fate::Delivered => {
                self.stats.packets_delivered += 1;
                self.stats.wire_bytes_delivered += wire_bytes;
                let arrival = self.jitter.arrival(depart, self.cfg.delay_at(depart));
                Offer::Delivered { arrival }
            }
            fate => {
                match fate {
                    Fate::Corrupted => self.stats.corrupted += 1,
                    Fate::Lost => self.stats.lost += 1,
                    Fate::BurstLost => self.stats.burst_lost += 1,
                    Fate::Outage => self.stats.outage_dropped += 1,
                    Fate::Delivered => {}
                }
                Offer::Impaired(fate)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(queue: u64) -> Link {
        Link::new(
            LinkConfig::fixed(
                8_000_000,
                Duration::from_millis(100),
                queue,
                Impairments::default(),
            ),
            1,
        )
    }

    #[test]
    fn serialises_back_to_back_and_adds_delay() {
        let mut l = link(1 << 20);
        // 1000 bytes at 8 Mb/s = 1 ms each.
        assert_eq!(
            l.offer(Duration::ZERO, 1000),
            Offer::Delivered {
                arrival: Duration::from_millis(101)
            }
        );
        assert_eq!(
            l.offer(Duration::ZERO, 1000),
            Offer::Delivered {
                arrival: Duration::from_millis(102)
            }
        );
    }

    #[test]
    fn drop_tail_when_queue_full() {
        let mut l = link(2500);
        assert!(matches!(
            l.offer(Duration::ZERO, 1000),
            Offer::Delivered { .. }
        ));
        assert!(matches!(
            l.offer(Duration::ZERO, 1000),
            Offer::Delivered { .. }
        ));
        assert_eq!(l.offer(Duration::ZERO, 1000), Offer::QueueDrop);
        // After the first has left there is room again.
        assert!(matches!(
            l.offer(Duration::from_millis(1), 1000),
            Offer::Delivered { .. }
        ));
    }
}
