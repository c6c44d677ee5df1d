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
