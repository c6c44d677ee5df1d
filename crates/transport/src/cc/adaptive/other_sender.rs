//! Whether a standing queue is another sender's that refills the buffer whatever we do (a
//! loss-based flow such as CUBIC), told from our own queue and from a path that got longer.
//! docs/PROTOCOL.md §5.5.1 "Compete" gives the rules.

use std::time::{Duration, Instant};

/// More than this many overloads in one run (see `OtherSender`), spread over at least
/// `RUN_TIME` (or `RUN_RTTS` base RTTs): our own queue empties when we drain; a CUBIC
/// flow's does not, though it shrinks after each of its losses.
const AFTER: u32 = 3;
const RUN_TIME: Duration = Duration::from_secs(3);
const RUN_RTTS: u32 = 4;
/// Overloads further apart than this (or that many base RTTs) are separate events, not one
/// queue that stands: beside the simulator's CUBIC flow on GEO they came 1.1–1.9 s apart,
/// while on the LEO testbed profile one handover's overloads and the next one's, or a
/// host's stall, came 5.6–21 s apart, with the path's least RTT not seen in between (the
/// RTT estimator's minimum ages over 30–60 s, longer than a LEO segment lasts).
const RUN_GAP: Duration = Duration::from_secs(6);
const RUN_GAP_RTTS: u32 = 8;

/// A run of overloads that no RTT sample near the path's least RTT, no rebase and no long
/// gap interrupted, and whether the buffer overflowed during it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct OtherSender {
    overloads: u32,
    first: Option<Instant>,
    last: Option<Instant>,
    /// The first packet sent after the run's first drain that held back sending ended.
    drained_from: Option<u64>,
    /// A congestion loss of a packet sent after that came while the queue stood: the
    /// buffer overflowed although we had drained. A loss-based flow keeps
    /// doing that (it backs off only from drops); our own queue, drained, does not overflow.
    /// The losses of a LEO handover's outage come with the overload that begins a run, and
    /// those of an ACM step down are of packets sent before its first drain ended, at the
    /// rate before the step: counted, the step's own overflow and the overloads that a path
    /// jittering without reordering set off after it (every sample above the least RTT by
    /// more than `q_high`) made the simulator's LEO link with ACM steps and ±10 ms of
    /// uniform jitter compete with no other sender, at half the ceiling for 10 s.
    overflowed: bool,
}

impl OtherSender {
    /// The queue was seen gone, or taken for the path: a new run begins.
    pub(super) fn reset(&mut self) {
        *self = OtherSender::default();
    }

    fn end_if_stale(&mut self, now: Instant, base: Duration) {
        let gap = RUN_GAP.max(base * RUN_GAP_RTTS);
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) > gap)
        {
            self.reset();
        }
    }

    /// A drain that held back sending ended; the next packet sent is `next_pn`.
    pub(super) fn on_drain_ended(&mut self, now: Instant, base: Duration, next_pn: u64) {
        self.end_if_stale(now, base);
        if self.first.is_some() && self.drained_from.is_none() {
            self.drained_from = Some(next_pn);
        }
    }

    /// A congestion loss, of packet `lost_pn`, while the queue stood.
    pub(super) fn on_overflow(&mut self, now: Instant, base: Duration, lost_pn: u64) {
        self.end_if_stale(now, base);
        if self.drained_from.is_some_and(|from| lost_pn >= from) {
            self.overflowed = true;
        }
    }

    /// Counts an overload; true if the run makes the queue another sender's.
    pub(super) fn on_overload(&mut self, now: Instant, base: Duration) -> bool {
        self.end_if_stale(now, base);
        self.overloads += 1;
        self.last = Some(now);
        let first = *self.first.get_or_insert(now);
        let time = RUN_TIME.max(base * RUN_RTTS);
        self.overflowed && self.overloads > AFTER && now.saturating_duration_since(first) >= time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(600);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn overloads_that_keep_coming_with_the_buffer_overflowing_are_another_senders() {
        let t0 = Instant::now();
        let mut o = OtherSender::default();
        assert!(!o.on_overload(at(t0, 0), BASE));
        o.on_drain_ended(at(t0, 700), BASE, 1000);
        o.on_overflow(at(t0, 800), BASE, 1200);
        assert!(!o.on_overload(at(t0, 1900), BASE));
        // The fourth, but within 3 s of the first (4 base RTTs are 2.4 s).
        assert!(!o.on_overload(at(t0, 2500), BASE));
        assert!(o.on_overload(at(t0, 4600), BASE));
    }

    #[test]
    fn without_an_overflow_after_the_first_overload_the_queue_stays_ours() {
        let t0 = Instant::now();
        let mut o = OtherSender::default();
        // A handover's losses come with the overload that begins the run.
        o.on_overflow(at(t0, 0), BASE, 500);
        for ms in [0, 1000, 2000, 3000, 4000, 5000] {
            assert!(!o.on_overload(at(t0, ms), BASE), "{ms}");
        }
    }

    #[test]
    fn a_step_downs_own_overflow_is_not_another_senders() {
        let t0 = Instant::now();
        let mut o = OtherSender::default();
        // A rate step: the first overload, then the buffer overflows with packets sent at
        // the old rate, before the drain ended (the first packet after it is 1000). The
        // overloads that follow (a path that jitters) find no other sender.
        assert!(!o.on_overload(at(t0, 0), BASE));
        o.on_drain_ended(at(t0, 900), BASE, 1000);
        o.on_overflow(at(t0, 1000), BASE, 990);
        for ms in [1500, 2500, 3500, 4500] {
            assert!(!o.on_overload(at(t0, ms), BASE), "{ms}");
        }
        // The buffer overflows again, with a packet sent after the drain: another sender's.
        o.on_overflow(at(t0, 5000), BASE, 1400);
        assert!(o.on_overload(at(t0, 5500), BASE));
    }

    #[test]
    fn overloads_far_apart_are_separate_events() {
        let t0 = Instant::now();
        let base = Duration::from_millis(60);
        let mut o = OtherSender::default();
        // The LEO testbed run taken for a competitor: a stall's overload at 23.5 s, then a
        // handover's loss and overloads at 45.0–45.2 s.
        assert!(!o.on_overload(at(t0, 23_507), base));
        o.on_overflow(at(t0, 44_992), base, 900_000);
        for ms in [44_992, 45_095, 45_244, 48_300] {
            assert!(!o.on_overload(at(t0, ms), base), "{ms}");
        }
    }

    #[test]
    fn a_reset_begins_a_new_run() {
        let t0 = Instant::now();
        let mut o = OtherSender::default();
        o.on_overload(at(t0, 0), BASE);
        o.on_drain_ended(at(t0, 400), BASE, 100);
        o.on_overflow(at(t0, 500), BASE, 200);
        o.on_overload(at(t0, 1500), BASE);
        o.on_overload(at(t0, 3000), BASE);
        o.reset();
        assert!(!o.on_overload(at(t0, 4000), BASE));
    }
}
