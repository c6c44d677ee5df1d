//! Receiver side of acknowledgement: which packet numbers arrived, and when an ACK is due.
//! Every ACK lists the received ranges (so the gaps between them are the SNACK holes), newest
//! first, up to `max_ranges`; a hole keeps being reported in every ACK until newer holes push
//! it out, so a lost ACK costs nothing but delay.

use std::time::Instant;

use crate::config::AckPolicy;
use crate::frame::AckFrame;
use crate::range_set::RangeSet;

#[derive(Debug)]
pub struct AckTracker {
    policy: AckPolicy,
    received: RangeSet,
    largest: Option<(u64, Instant)>,
    unacked_eliciting: u32,
    first_unacked_at: Option<Instant>,
    immediate: bool,
    /// The zero of the times this side's ACKs carry.
    origin: Option<Instant>,
}

impl AckTracker {
    pub fn new(policy: AckPolicy) -> Self {
        AckTracker {
            policy,
            received: RangeSet::new(),
            largest: None,
            unacked_eliciting: 0,
            first_unacked_at: None,
            immediate: false,
            origin: None,
        }
    }

    pub fn set_policy(&mut self, policy: AckPolicy) {
        self.policy = policy;
    }

    pub fn largest(&self) -> Option<u64> {
        self.largest.map(|(pn, _)| pn)
    }

    pub fn is_duplicate(&self, pn: u64) -> bool {
        self.received.contains(pn)
    }

    /// Records a received packet. `urgent`: the sender asked for an immediate ACK (a probe).
    pub fn on_packet(&mut self, now: Instant, pn: u64, eliciting: bool, urgent: bool) {
        let new_hole = match self.largest {
            Some((l, _)) => pn > l + 1,
            None => pn > 0,
        };
        let fills_hole = self.largest.is_some_and(|(l, _)| pn < l);
        self.received.insert(pn..pn + 1);
        while self.received.len() > self.policy.max_ranges {
            self.received.pop_first();
        }
        self.origin.get_or_insert(now);
        if self.largest.is_none_or(|(l, _)| pn > l) {
            self.largest = Some((pn, now));
        }
        if eliciting {
            self.unacked_eliciting += 1;
            self.first_unacked_at.get_or_insert(now);
            if new_hole || fills_hole || urgent {
                self.immediate = true;
            }
        }
    }

    /// When the next ACK must go out, if one is owed.
    pub fn deadline(&self) -> Option<Instant> {
        let first = self.first_unacked_at?;
        if self.immediate || self.unacked_eliciting >= self.policy.every_packets {
            Some(first)
        } else {
            Some(first + self.policy.max_delay)
        }
    }

    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| d <= now)
    }

    /// Anything received that the peer has not yet been told about.
    pub fn has_pending(&self) -> bool {
        self.unacked_eliciting > 0
    }

    /// Builds the ACK to send now and resets the due state.
    pub fn build(&mut self, now: Instant) -> Option<AckFrame> {
        let (_, at) = self.largest?;
        let ranges = self.received.iter().rev().collect();
        self.unacked_eliciting = 0;
        self.first_unacked_at = None;
        self.immediate = false;
        let received_us = self
            .origin
            .map(|o| at.saturating_duration_since(o).as_micros() as u64);
        Some(AckFrame {
            ranges,
            delay_us: now.saturating_duration_since(at).as_micros() as u64,
            received_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn acks_every_n_or_after_delay_and_at_once_on_a_hole() {
        let policy = AckPolicy {
            every_packets: 3,
            max_delay: Duration::from_millis(50),
            max_ranges: 4,
        };
        let t = Instant::now();
        let mut a = AckTracker::new(policy);
        a.on_packet(t, 0, true, false);
        assert_eq!(a.deadline(), Some(t + Duration::from_millis(50)));
        a.on_packet(t, 1, true, false);
        a.on_packet(t, 2, true, false);
        assert!(a.is_due(t));
        assert_eq!(a.build(t).unwrap().ranges, vec![0..3]);
        a.on_packet(t, 5, true, false);
        assert!(a.is_due(t), "a new hole is reported at once");
        let ack = a.build(t).unwrap();
        assert_eq!(ack.ranges, vec![5..6, 0..3]);
        // Old ranges fall out once more than max_ranges exist.
        for pn in [7, 9, 11, 13] {
            a.on_packet(t, pn, true, false);
        }
        assert_eq!(
            a.build(t).unwrap().ranges,
            vec![13..14, 11..12, 9..10, 7..8]
        );
    }
}
