//! Bytes sent after a given packet: what is in the pipe or the queue beyond the latest ACK.

use std::collections::VecDeque;

/// Cumulative ack-eliciting bytes sent up to each packet number still at or above the
/// largest acknowledged (numbers are consecutive, so a ring indexed from the oldest is
/// enough). Packets that are never acknowledged on their own (ACK-only) add nothing.
#[derive(Debug, Default)]
pub struct SentLog {
    first_pn: u64,
    totals: VecDeque<u64>,
    total: u64,
}

impl SentLog {
    pub fn on_sent(&mut self, pn: u64, wire_bytes: u64) {
        if self.totals.is_empty() {
            self.first_pn = pn;
        }
        // Numbers between (ACK-only packets) carry the total as it stood.
        while self.first_pn + (self.totals.len() as u64) < pn {
            self.totals.push_back(self.total);
        }
        self.total += wire_bytes;
        if self.first_pn + self.totals.len() as u64 == pn {
            self.totals.push_back(self.total);
        }
    }

    pub fn forget_before(&mut self, pn: u64) {
        while self.first_pn < pn && self.totals.len() > 1 {
            self.totals.pop_front();
            self.first_pn += 1;
        }
    }

    /// Bytes sent up to and including packet `pn`, while it is held (not yet forgotten).
    pub fn total_through(&self, pn: u64) -> Option<u64> {
        let i = pn.checked_sub(self.first_pn)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| self.totals.get(i))
            .copied()
    }

    /// Bytes sent after packet `pn`. Numbers before the oldest held (already forgotten)
    /// count from it.
    pub fn bytes_after(&self, pn: u64) -> u64 {
        let i = pn.saturating_sub(self.first_pn);
        usize::try_from(i)
            .ok()
            .and_then(|i| self.totals.get(i))
            .map_or(0, |&t| self.total - t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_after_a_packet_skip_what_is_never_acknowledged() {
        let mut l = SentLog::default();
        l.on_sent(10, 100);
        l.on_sent(11, 200);
        // 12 was ACK-only.
        l.on_sent(13, 300);
        assert_eq!(l.bytes_after(10), 500);
        assert_eq!(l.bytes_after(11), 300);
        assert_eq!(l.bytes_after(12), 300);
        assert_eq!(l.bytes_after(13), 0);
        assert_eq!(l.bytes_after(99), 0);
        l.forget_before(12);
        assert_eq!(l.bytes_after(12), 300);
        assert_eq!(l.bytes_after(11), 300);
    }
}
