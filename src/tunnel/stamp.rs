//! A moment kept in an atomic, so that a report can read when something last happened
//! without taking a lock and the place that records it pays one store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When something last happened: nanoseconds after the process's first stamp, 0 for never.
#[derive(Debug, Default)]
pub struct Stamp(AtomicU64);

/// The instant every stamp counts from.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Stamp {
    pub fn set(&self, at: Instant) {
        let since = at.saturating_duration_since(origin()).as_nanos();
        // Never 0, which means never; u64 nanoseconds last 584 years.
        let nanos = u64::try_from(since).unwrap_or(u64::MAX).max(1);
        self.0.store(nanos, Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<Instant> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(origin() + Duration::from_nanos(nanos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_what_was_set_and_none_before() {
        let s = Stamp::default();
        assert_eq!(s.get(), None);
        let at = Instant::now() + Duration::from_millis(1500);
        s.set(at);
        assert_eq!(s.get(), Some(at));
        // Before the origin (another stamp set first, later): the origin itself, not never.
        let early = Stamp::default();
        early.set(
            origin()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or(origin()),
        );
        assert!(early.get().is_some());
    }
}
