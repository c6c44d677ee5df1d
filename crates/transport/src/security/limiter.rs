//! Bounds on the work and memory unauthenticated handshake traffic can cost: a token bucket
//! on the Diffie-Hellman work, and a fixed-size memory of recent initiations. Whoever reads
//! initiations owns one [`HandshakeGuard`]: a standalone association, or the endpoint that
//! screens them for all of its associations.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handshake messages a standalone association processes per second in the long run.
pub const HANDSHAKES_PER_SECOND: u32 = 20;
/// Handshake messages a standalone association may process back to back.
pub const HANDSHAKE_BURST: u32 = 20;
/// Initiation ephemerals remembered to refuse replays without doing any DH.
pub const RECENT_INITIATIONS: usize = 1024;
/// Initiations with a proven address (a valid mac2) served per second from one IP address:
/// an attacker who receives at its address gets cookies too, and must not take the whole
/// budget of proven addresses. Tens of terminals behind one NAT address fit in it.
pub const PER_SOURCE_PER_SECOND: u32 = 20;
pub const PER_SOURCE_BURST: u32 = 5;
/// Source addresses whose budgets are kept; more are served from the shared budget alone.
const SOURCES: usize = 4096;
/// How often at most the budgets of sources gone quiet are cleared out when all are in use,
/// so a stream of new addresses cannot make every initiation pay for the sweep.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The replay memory and the work budget of everything that reads initiations.
pub(crate) struct HandshakeGuard {
    pub(crate) bucket: TokenBucket,
    pub(crate) recent: InitiationMemory,
}

impl HandshakeGuard {
    pub(crate) fn new(per_second: u32, burst: u32) -> Self {
        HandshakeGuard {
            bucket: TokenBucket::new(per_second, burst),
            recent: InitiationMemory::default(),
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

    /// Whether the bucket holds its whole burst: it remembers nothing of its past.
    fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
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

/// A token bucket per source (an IP address for initiations with a proven address, a
/// socket address for hints), [`SOURCES`] of them at most.
pub(crate) struct SourceBudgets<K = IpAddr> {
    buckets: HashMap<K, TokenBucket>,
    swept_at: Option<Instant>,
    per_second: u32,
    burst: u32,
}

impl Default for SourceBudgets<IpAddr> {
    fn default() -> Self {
        SourceBudgets::new(PER_SOURCE_PER_SECOND, PER_SOURCE_BURST)
    }
}

impl<K: Hash + Eq + Copy> SourceBudgets<K> {
    pub(crate) fn new(per_second: u32, burst: u32) -> Self {
        SourceBudgets {
            buckets: HashMap::new(),
            swept_at: None,
            per_second,
            burst,
        }
    }

    pub(crate) fn try_take(&mut self, now: Instant, source: K) -> bool {
        if self.buckets.len() >= SOURCES && !self.buckets.contains_key(&source) {
            if self.swept_at.is_some_and(|t| now < t + SWEEP_INTERVAL) {
                // The shared budget still bounds the work.
                return true;
            }
            self.swept_at = Some(now);
            self.buckets.retain(|_, b| !b.is_full(now));
            if self.buckets.len() >= SOURCES {
                return true;
            }
        }
        let (per_second, burst) = (self.per_second, self.burst);
        self.buckets
            .entry(source)
            .or_insert_with(|| TokenBucket::new(per_second, burst))
            .try_take(now)
    }
}

/// The memory of initiations seen ([`RECENT_INITIATIONS`] of them), which several endpoints
/// in one process may share (a hub's workers, an endpoint each): an initiation one of them
/// authenticated is then a replay to every one, whichever socket a copy reaches.
#[derive(Clone, Default)]
pub struct InitiationMemory(Arc<Mutex<RecentInitiations>>);

impl InitiationMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, RecentInitiations> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn contains(&self, ephemeral: &[u8; 32]) -> bool {
        self.lock().contains(ephemeral)
    }

    pub(crate) fn insert(&self, ephemeral: [u8; 32]) {
        self.lock().insert(ephemeral);
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
    fn each_source_has_its_own_budget_and_their_number_is_bounded() {
        let t0 = Instant::now();
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0xc612_0000 + i));
        let mut s = SourceBudgets::default();
        let burst = PER_SOURCE_BURST as usize;
        assert_eq!((0..20).filter(|_| s.try_take(t0, ip(1))).count(), burst);
        assert_eq!((0..20).filter(|_| s.try_take(t0, ip(2))).count(), burst);
        // A tenth of a second earns a tenth of the rate.
        let later = t0 + Duration::from_millis(100);
        assert_eq!(
            (0..100).filter(|_| s.try_take(later, ip(1))).count(),
            PER_SOURCE_PER_SECOND as usize / 10
        );
        // Filled with busy sources: a new one is left to the shared budget, not refused,
        // and nothing grows.
        for i in 3..SOURCES as u32 + 1 {
            assert!(s.try_take(later, ip(i)));
        }
        assert_eq!(s.buckets.len(), SOURCES);
        assert!((0..20).all(|_| s.try_take(later, ip(100_000))));
        assert_eq!(s.buckets.len(), SOURCES);
        // Once they have gone quiet (their buckets full again) they make room.
        let quiet = later + Duration::from_secs(2);
        assert_eq!(
            (0..20).filter(|_| s.try_take(quiet, ip(100_001))).count(),
            burst
        );
        assert_eq!(s.buckets.len(), 1);
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
