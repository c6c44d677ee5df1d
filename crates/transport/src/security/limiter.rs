//! Bounds on the work and memory unauthenticated handshake traffic can cost: a token bucket
//! on the Diffie-Hellman work, and a fixed-size memory of recent initiations. Whoever reads
//! initiations owns one [`HandshakeGuard`]: a standalone association, or the endpoint that
//! screens them for all of its associations.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

/// Handshake messages a standalone association processes per second in the long run.
pub const HANDSHAKES_PER_SECOND: u32 = 20;
/// Handshake messages a standalone association may process back to back.
pub const HANDSHAKE_BURST: u32 = 20;
/// Initiation ephemerals remembered to refuse replays without doing any DH.
pub const RECENT_INITIATIONS: usize = 1024;

/// The replay memory and the work budget of everything that reads initiations.
pub(crate) struct HandshakeGuard {
    pub(crate) bucket: TokenBucket,
    pub(crate) recent: RecentInitiations,
}

impl HandshakeGuard {
    pub(crate) fn new(per_second: u32, burst: u32) -> Self {
        HandshakeGuard {
            bucket: TokenBucket::new(per_second, burst),
            recent: RecentInitiations::default(),
        }
    }

    /// The budget of a standalone association.
    pub(crate) fn standalone() -> Self {
        Self::new(HANDSHAKES_PER_SECOND, HANDSHAKE_BURST)
    }
}

pub(crate) struct TokenBucket {
    tokens: f64,
    last: Option<Instant>,
    per_second: f64,
    burst: f64,
}

impl Default for TokenBucket {
    fn default() -> Self {
        TokenBucket::new(HANDSHAKES_PER_SECOND, HANDSHAKE_BURST)
    }
}

impl TokenBucket {
    pub(crate) fn new(per_second: u32, burst: u32) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            last: None,
            per_second: f64::from(per_second),
            burst: f64::from(burst),
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let earned = now.saturating_duration_since(last).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Whether less than half the burst is left: the work is arriving faster than the
    /// rate, the endpoint's sign of load.
    pub(crate) fn below_half(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens < self.burst / 2.0
    }

    pub(crate) fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

pub(crate) struct RecentInitiations {
    order: VecDeque<[u8; 32]>,
    set: HashSet<[u8; 32]>,
}

impl Default for RecentInitiations {
    /// All memory is taken up front. Twice the entries kept: the hash set then always
    /// cleans up removed entries in place instead of growing, whatever the order of
    /// inserts and removals, so a flood cannot grow it (about 170 KB in all).
    fn default() -> Self {
        RecentInitiations {
            order: VecDeque::with_capacity(RECENT_INITIATIONS + 1),
            set: HashSet::with_capacity(2 * RECENT_INITIATIONS),
        }
    }
}

impl RecentInitiations {
    pub(crate) fn contains(&self, ephemeral: &[u8; 32]) -> bool {
        self.set.contains(ephemeral)
    }

    pub(crate) fn insert(&mut self, ephemeral: [u8; 32]) {
        if !self.set.insert(ephemeral) {
            return;
        }
        self.order.push_back(ephemeral);
        if self.order.len() > RECENT_INITIATIONS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::default();
        let burst = (0..100).filter(|_| b.try_take(t0)).count();
        assert_eq!(burst, HANDSHAKE_BURST as usize);
        // One second later: exactly the rate's worth more.
        let later = t0 + Duration::from_secs(1);
        let more = (0..100).filter(|_| b.try_take(later)).count();
        assert_eq!(more, HANDSHAKES_PER_SECOND as usize);
        let mut e = TokenBucket::new(1000, 200);
        assert_eq!((0..1000).filter(|_| e.try_take(t0)).count(), 200);
        let later = t0 + Duration::from_millis(100);
        assert_eq!((0..1000).filter(|_| e.try_take(later)).count(), 100);
    }

    #[test]
    fn recent_set_is_bounded() {
        let mut r = RecentInitiations::default();
        for i in 0..(RECENT_INITIATIONS as u32 + 500) {
            let mut e = [0u8; 32];
            e[..4].copy_from_slice(&i.to_be_bytes());
            r.insert(e);
        }
        assert_eq!(r.len(), RECENT_INITIATIONS);
        assert!(!r.contains(&[0u8; 32]));
        let mut last = [0u8; 32];
        last[..4].copy_from_slice(&(RECENT_INITIATIONS as u32 + 499).to_be_bytes());
        assert!(r.contains(&last));
        // Churn far beyond the size never makes either structure grow.
        let (order_cap, set_cap) = (r.order.capacity(), r.set.capacity());
        for i in 0..100_000u32 {
            let mut e = [0xffu8; 32];
            e[..4].copy_from_slice(&i.to_be_bytes());
            r.insert(e);
        }
        // (A set's reported capacity shrinks a little while removed entries await clean-up;
        // growing would double it.)
        assert_eq!(r.order.capacity(), order_cap);
        assert!(r.set.capacity() <= set_cap);
    }
}
