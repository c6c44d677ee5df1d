//! The replay window: every packet number is accepted at most once, and numbers too far
//! behind the highest seen are refused outright.

/// Packet numbers remembered behind the highest one. Retransmissions travel under new
/// numbers, so refusing a packet older than this only costs a packet reordered by more than
/// the window, which SNACK repairs.
pub const REPLAY_WINDOW: u64 = 4096;

const WORDS: usize = (REPLAY_WINDOW / 64) as usize;

#[derive(Clone)]
pub(crate) struct ReplayWindow {
    /// One past the highest number recorded; 0 when none.
    next: u64,
    /// Bit `pn % REPLAY_WINDOW` is set when `pn` (within the window) was recorded.
    seen: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            next: 0,
            seen: [0; WORDS],
        }
    }
}

impl ReplayWindow {
    /// Whether `pn` may still be accepted (checked before and after authentication).
    pub(crate) fn is_fresh(&self, pn: u64) -> bool {
        if pn >= self.next {
            return true;
        }
        if self.next - pn > REPLAY_WINDOW {
            return false;
        }
        let (w, b) = slot(pn);
        self.seen[w] & (1 << b) == 0
    }

    /// One past the highest number recorded.
    pub(crate) fn front(&self) -> u64 {
        self.next
    }

    /// Records an authenticated packet number. Call only after `is_fresh` said yes.
    pub(crate) fn record(&mut self, pn: u64) {
        if pn >= self.next {
            // Forget the numbers that slide out of the window.
            let advance = pn + 1 - self.next;
            if advance >= REPLAY_WINDOW {
                self.seen = [0; WORDS];
            } else {
                for old in self.next..=pn {
                    let (w, b) = slot(old);
                    self.seen[w] &= !(1 << b);
                }
            }
            self.next = pn + 1;
        }
        let (w, b) = slot(pn);
        self.seen[w] |= 1 << b;
    }
}

fn slot(pn: u64) -> (usize, u32) {
    let i = pn % REPLAY_WINDOW;
    ((i / 64) as usize, (i % 64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn duplicates_and_stale_numbers_are_refused() {
        let mut w = ReplayWindow::default();
        assert!(w.is_fresh(0));
        w.record(0);
        assert!(!w.is_fresh(0));
        w.record(10_000);
        // The window holds the REPLAY_WINDOW numbers up to the highest.
        assert!(!w.is_fresh(10_000 - REPLAY_WINDOW));
        assert!(w.is_fresh(10_000 - REPLAY_WINDOW + 1));
        assert!(w.is_fresh(9_999));
        assert!(w.is_fresh(10_001));
    }

    proptest! {
        /// Against a model that remembers everything: the window never accepts a number
        /// twice, and accepts every new number within REPLAY_WINDOW of the highest.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u64..12_000, any::<bool>()), 1..600)) {
            let mut w = ReplayWindow::default();
            let mut seen = BTreeSet::new();
            let mut highest: Option<u64> = None;
            for (pn, jump) in ops {
                // Mix far jumps with local reordering around the highest number.
                let pn = if jump { pn * 7 } else { highest.map_or(pn, |h| h.saturating_sub(pn % 5000)) };
                let fresh = w.is_fresh(pn);
                let model_new = !seen.contains(&pn);
                let in_window = highest.is_none_or(|h| pn + REPLAY_WINDOW > h);
                prop_assert_eq!(fresh, model_new && in_window, "pn {} highest {:?}", pn, highest);
                if fresh {
                    w.record(pn);
                    seen.insert(pn);
                    highest = Some(highest.map_or(pn, |h| h.max(pn)));
                }
            }
        }
    }
}
