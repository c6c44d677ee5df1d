//! Deciding why a packet was lost. A loss with no queue behind it is corruption; a loss while
//! the path's RTT stands well above its minimum is congestion; in between, the configured
//! default decides. Decided once per lost packet, at the moment it is declared lost.

use std::time::Duration;

use crate::config::{LossCause, VegasParams};

#[derive(Debug, Clone, Copy)]
pub struct LossClassifier {
    pub default: LossCause,
    pub vegas: VegasParams,
}

/// Floors that keep timer and scheduling noise from reading as a queue.
const MIN_LOW: Duration = Duration::from_millis(1);
const MIN_HIGH: Duration = Duration::from_millis(5);

impl LossClassifier {
    /// `queue_delay`: RTT now minus the path minimum, if there are samples.
    /// `packet_time`: how long one full packet takes at the current sending rate.
    pub fn classify(&self, queue_delay: Option<Duration>, packet_time: Duration) -> LossCause {
        let Some(q) = queue_delay else {
            return self.default;
        };
        // Vegas deliberately keeps alpha..beta packets queued: that much is no evidence of
        // congestion. Well above beta, the queue is overflowing.
        let low = packet_time.mul_f64(self.vegas.alpha).max(MIN_LOW);
        let high = packet_time.mul_f64(2.0 * self.vegas.beta).max(MIN_HIGH);
        if q <= low {
            LossCause::Corruption
        } else if q >= high {
            LossCause::Congestion
        } else {
            self.default
        }
    }
}

/// Packets lost, by attributed cause.
/// Recent fraction of packets lost (outages aside), as an exponentially weighted average.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossRate {
    average: f64,
}

/// Weight of one packet's outcome: the average follows the last few hundred packets.
const LOSS_RATE_WEIGHT: f64 = 1.0 / 64.0;

/// Below this loss rate a tail loss is too rare to pay for redundant copies, which delay new
/// data behind them on a slow link (1 in 2,000 packets: a BER of about 4e-8 at 1500 bytes).
const REDUNDANCY_MIN_LOSS: f64 = 5e-4;

impl LossRate {
    pub fn on_delivered(&mut self) {
        self.average *= 1.0 - LOSS_RATE_WEIGHT;
    }

    pub fn on_lost(&mut self) {
        self.average = self.average * (1.0 - LOSS_RATE_WEIGHT) + LOSS_RATE_WEIGHT;
    }

    pub fn value(&self) -> f64 {
        self.average
    }

    /// Whether idle-link copies of outstanding data are likely to save a repair round trip.
    pub fn worth_redundancy(&self) -> bool {
        self.average >= REDUNDANCY_MIN_LOSS
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    pub congestion: u64,
    pub corruption: u64,
    pub outage: u64,
}

impl LossCounts {
    pub fn add(&mut self, cause: LossCause) {
        match cause {
            LossCause::Congestion => self.congestion += 1,
            LossCause::Corruption => self.corruption += 1,
            LossCause::Outage => self.outage += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.congestion + self.corruption + self.outage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redundancy_follows_the_recent_loss_rate() {
        let mut r = LossRate::default();
        assert!(!r.worth_redundancy());
        r.on_lost();
        assert!(r.worth_redundancy());
        for _ in 0..1000 {
            r.on_delivered();
        }
        assert!(!r.worth_redundancy(), "{}", r.value());
        // One packet in ten lost keeps it on.
        for i in 0..1000 {
            if i % 10 == 0 {
                r.on_lost();
            } else {
                r.on_delivered();
            }
        }
        assert!(
            r.worth_redundancy() && (r.value() - 0.1).abs() < 0.08,
            "{}",
            r.value()
        );
    }

    #[test]
    fn evidence_overrides_the_default_and_ambiguity_falls_back() {
        let c = LossClassifier {
            default: LossCause::Congestion,
            vegas: VegasParams::default(),
        };
        let pt = Duration::from_millis(1);
        assert_eq!(c.classify(Some(Duration::ZERO), pt), LossCause::Corruption);
        assert_eq!(
            c.classify(Some(Duration::from_millis(50)), pt),
            LossCause::Congestion
        );
        assert_eq!(
            c.classify(Some(Duration::from_millis(3)), pt),
            LossCause::Congestion
        );
        assert_eq!(c.classify(None, pt), LossCause::Congestion);
        let c = LossClassifier {
            default: LossCause::Corruption,
            ..c
        };
        assert_eq!(
            c.classify(Some(Duration::from_millis(3)), pt),
            LossCause::Corruption
        );
    }
}
