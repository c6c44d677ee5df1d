//! What the simulator's many-endpoint tests (hub, standby) share.

use std::cmp::Ordering;
use std::time::Instant;

/// An event due at `at`; `seq` keeps events due at the same instant in the order they were
/// queued, so a run is deterministic. Ordered by (`at`, `seq`) only.
pub struct Queued<E> {
    pub at: Instant,
    pub seq: u64,
    pub ev: E,
}

impl<E> PartialEq for Queued<E> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<E> Eq for Queued<E> {}
impl<E> PartialOrd for Queued<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Queued<E> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}
