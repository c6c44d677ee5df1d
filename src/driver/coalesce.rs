//! When the loop leaves arrivals in the socket for a pass that is due soon anyway.
//!
//! A worker under light load paces a turn every few hundred microseconds and receives
//! acknowledgements between them; each arrival that wakes the loop costs a pass of its own
//! (a wake-up, the links' locks, a `recvmmsg` for one datagram). While the loop mostly
//! sends, a pass due within [`READ_COALESCING`] reads what arrived meanwhile instead: what
//! arrives then is mostly acknowledgements, which the association takes at the kernel's
//! receive time, so its RTT samples and delivery marks stay exact.
//!
//! Only from about 220 Mbit/s (twenty datagrams sent a millisecond): below that a pass
//! costs little next to the link's pace, and over an emulated 100 Mb/s carrier a hub that
//! coalesced reads moved about 2 % less in three runs (at 400 Mb/s and 1 Gbit it did not
//! differ; docs/BENCHMARKS.md). Satellite rates keep the loop as it was.
//!
//! Not while the loop mostly receives: data held back is acknowledged late, and
//! acknowledgements sent together reach the sender bunched. With coalescing in every loop
//! the fade case's latency bound failed; with it only where the loop mostly sends, it holds
//! (the bunched acknowledgements most likely read as more capacity than the path has).

use std::time::{Duration, Instant};

/// How soon a pass must be due for the loop to leave arrivals in the socket until then.
pub const READ_COALESCING: Duration = Duration::from_millis(1);

/// The span over which datagrams are counted.
const WINDOW: Duration = Duration::from_millis(10);

/// Datagrams sent in a [`WINDOW`] from which reads may wait: twenty a millisecond, about
/// 220 Mbit/s of full-size datagrams.
const DENSE_SENDS: u64 = 200;

/// Counts the datagrams the loop reads and sends, window by window, and says whether in
/// the last whole window it sent densely and at least twice as many as it read.
#[derive(Debug)]
pub struct ReadCoalescing {
    window_start: Instant,
    read: u64,
    sent: u64,
    mostly_sending: bool,
}

impl ReadCoalescing {
    pub fn new(now: Instant) -> ReadCoalescing {
        ReadCoalescing {
            window_start: now,
            read: 0,
            sent: 0,
            mostly_sending: false,
        }
    }

    /// A pass at `now` read `read` datagrams and sends `sent`.
    pub fn record(&mut self, now: Instant, read: usize, sent: usize) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= WINDOW {
            // A window followed by a long quiet gap says nothing of the pace now.
            self.mostly_sending = elapsed < 2 * WINDOW
                && self.read > 0
                && self.sent >= DENSE_SENDS
                && self.sent >= 2 * self.read;
            self.window_start = now;
            self.read = 0;
            self.sent = 0;
        }
        self.read += read as u64;
        self.sent += sent as u64;
    }

    /// Whether the loop, next due at `deadline`, waits for it rather than for the socket.
    pub fn reads_wait_for_pass(&self, deadline: Option<Instant>, now: Instant) -> bool {
        self.mostly_sending && deadline.is_some_and(|d| d <= now + READ_COALESCING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A window from `from` (where the last one closed) of passes each reading `read` and
    /// sending `sent`, one a millisecond, then the pass that closes it; the time of that
    /// pass.
    fn window(c: &mut ReadCoalescing, from: Instant, read: usize, sent: usize) -> Instant {
        for ms in 0..10 {
            c.record(from + MS * ms, read, sent);
        }
        let end = from + WINDOW;
        c.record(end, 0, 0);
        end
    }

    #[test]
    fn a_sender_waits_only_for_a_pass_due_within_the_coalescing_time() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        let now = window(&mut c, t0, 10, 20);
        assert!(!c.reads_wait_for_pass(None, now));
        assert!(c.reads_wait_for_pass(Some(now), now));
        assert!(c.reads_wait_for_pass(Some(now + READ_COALESCING), now));
        let later = now + READ_COALESCING + Duration::from_micros(1);
        assert!(!c.reads_wait_for_pass(Some(later), now));
    }

    #[test]
    fn a_receiver_never_waits() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        // 40 datagrams in and 10 acknowledgements out a millisecond, for a second.
        let mut now = t0;
        for _ in 0..100 {
            now = window(&mut c, now, 40, 10);
            assert!(!c.reads_wait_for_pass(Some(now), now));
        }
        // As many out as in does not wait either.
        now = window(&mut c, now, 30, 30);
        assert!(!c.reads_wait_for_pass(Some(now), now));
    }

    #[test]
    fn the_last_whole_window_decides_and_a_quiet_gap_ends_it() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        c.record(t0, 1, 2);
        assert!(
            !c.reads_wait_for_pass(Some(t0), t0),
            "the window is not over yet"
        );
        let t1 = window(&mut c, t0, 10, 20);
        assert!(c.reads_wait_for_pass(Some(t1), t1));
        // Nothing read: nothing to coalesce.
        let t2 = window(&mut c, t1, 0, 50);
        assert!(!c.reads_wait_for_pass(Some(t2), t2));
        let t3 = window(&mut c, t2, 10, 20);
        assert!(c.reads_wait_for_pass(Some(t3), t3));
        // A sender at satellite rates (nine datagrams a millisecond, 100 Mbit/s): no.
        let t3 = window(&mut c, t3, 2, 9);
        assert!(!c.reads_wait_for_pass(Some(t3), t3));
        let t3 = window(&mut c, t3, 10, 20);
        // A sender's window and then a long silence: the silence decides.
        c.record(t3, 10, 20);
        let t4 = t3 + 3 * WINDOW;
        c.record(t4, 0, 0);
        assert!(!c.reads_wait_for_pass(Some(t4), t4));
    }
}
