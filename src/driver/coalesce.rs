//! When the loop leaves arrivals in the socket for a pass that is due soon anyway.
//!
//! A worker that sends densely also wakes for every acknowledgement that arrives between
//! its paced turns, and each wake-up costs a pass of its own (a wake-up, the links' locks,
//! a `recvmmsg` for one datagram). Where that is all it reads, a pass due within
//! [`READ_COALESCING`] reads what arrived meanwhile instead. An acknowledgement then waits
//! up to about 2 ms (tokio's timer rounds up to whole milliseconds) but is handled at the
//! kernel's receive time, so the RTT samples and delivery marks it gives stay exact.
//!
//! Only where nothing is lost by it, judged over the last whole [`WINDOW`]:
//! - No stream data read ([`DATA_BYTES`]): data held back is acknowledged late, and
//!   acknowledgements sent together reach the sender bunched. With coalescing in every
//!   loop the fade case's latency bound failed; with it only where the loop mostly sends,
//!   it held (the bunched acknowledgements most likely read as more capacity than the path
//!   has). A hub with uplink traffic therefore keeps waking for each arrival.
//! - Every datagram with the kernel's receive time: without it, a datagram is stamped with
//!   the pass's time, late by the wait.
//! - Nothing handed on to another worker: the owner has usually moved its clock past the
//!   arrival by the time it gets a late hand-off, and stamps it with its own.
//! - Twenty datagrams sent a millisecond or more (about 220 Mbit/s of full-size ones):
//!   below that a pass costs little next to the link's pace, and over an emulated
//!   100 Mb/s carrier a hub that coalesced reads moved about 2 % less in three runs (at
//!   400 Mb/s and 1 Gbit it did not differ; docs/BENCHMARKS.md). Satellite rates keep the
//!   loop as it was.

use std::time::{Duration, Instant};

/// How soon a pass must be due for the loop to leave arrivals in the socket until then.
pub const READ_COALESCING: Duration = Duration::from_millis(1);

/// The span over which passes are counted.
const WINDOW: Duration = Duration::from_millis(10);

/// Datagrams sent a [`WINDOW`] (scaled to a window's real length) from which reads may
/// wait.
const DENSE_SENDS: u64 = 200;

/// A datagram this long most likely carries stream data: acknowledgements are tens of
/// bytes (one reporting many holes may reach it, which only keeps the loop waking).
pub const DATA_BYTES: usize = 512;

/// What one pass read and sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassCounts {
    /// Datagrams read from the socket, this worker's or not.
    pub read: u64,
    /// Of them, [`DATA_BYTES`] or longer.
    pub data: u64,
    /// Of them, without the kernel's receive time.
    pub untimed: u64,
    /// Of them, handed on to the worker that owns them.
    pub handed_on: u64,
    /// Datagrams sent.
    pub sent: u64,
}

impl PassCounts {
    /// One datagram of `len` bytes read, with or without the kernel's receive time.
    pub fn read_one(&mut self, len: usize, timed: bool) {
        self.read += 1;
        self.data += u64::from(len >= DATA_BYTES);
        self.untimed += u64::from(!timed);
    }

    fn add(&mut self, other: &PassCounts) {
        self.read += other.read;
        self.data += other.data;
        self.untimed += other.untimed;
        self.handed_on += other.handed_on;
        self.sent += other.sent;
    }
}

/// The passes of the current window, and what the last whole one allows.
#[derive(Debug)]
pub struct ReadCoalescing {
    window_start: Instant,
    window: PassCounts,
    allowed: bool,
}

impl ReadCoalescing {
    pub fn new(now: Instant) -> ReadCoalescing {
        ReadCoalescing {
            window_start: now,
            window: PassCounts::default(),
            allowed: false,
        }
    }

    /// A pass at `now`. The pass that closes a window opens the next with its counts.
    pub fn record(&mut self, now: Instant, pass: &PassCounts) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= WINDOW {
            let w = &self.window;
            // A window with a quiet gap after it says nothing of the pace now.
            let recent = elapsed < 2 * WINDOW;
            let dense = u128::from(w.sent) * WINDOW.as_micros()
                >= u128::from(DENSE_SENDS) * elapsed.as_micros();
            self.allowed = recent
                && dense
                && w.read > 0
                && w.sent >= 2 * w.read
                && w.data == 0
                && w.untimed == 0
                && w.handed_on == 0;
            self.window_start = now;
            self.window = PassCounts::default();
        }
        self.window.add(pass);
    }

    /// Whether the loop, next due at `deadline`, waits for it rather than for the socket.
    pub fn reads_wait_for_pass(&self, deadline: Option<Instant>, now: Instant) -> bool {
        self.allowed && deadline.is_some_and(|d| d <= now + READ_COALESCING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A pass that read `acks` acknowledgements (kernel-stamped, this worker's) and sent
    /// `sent` datagrams.
    fn acks_and_sends(acks: u64, sent: u64) -> PassCounts {
        let mut p = PassCounts {
            sent,
            ..PassCounts::default()
        };
        for _ in 0..acks {
            p.read_one(60, true);
        }
        p
    }

    /// A window from `from` (where the last one closed) of ten passes of `pass`, one a
    /// millisecond, then the pass that closes it; the time of that pass.
    fn window(c: &mut ReadCoalescing, from: Instant, pass: PassCounts) -> Instant {
        for ms in 0..10 {
            c.record(from + MS * ms, &pass);
        }
        let end = from + WINDOW;
        c.record(end, &PassCounts::default());
        end
    }

    fn waits(c: &ReadCoalescing, at: Instant) -> bool {
        c.reads_wait_for_pass(Some(at), at)
    }

    #[test]
    fn a_sender_waits_only_for_a_pass_due_within_the_coalescing_time() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        let now = window(&mut c, t0, acks_and_sends(10, 20));
        assert!(!c.reads_wait_for_pass(None, now));
        assert!(c.reads_wait_for_pass(Some(now), now));
        assert!(c.reads_wait_for_pass(Some(now + READ_COALESCING), now));
        let later = now + READ_COALESCING + Duration::from_micros(1);
        assert!(!c.reads_wait_for_pass(Some(later), now));
    }

    #[test]
    fn the_bounds_are_exact() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        // 200 sent and 100 read: both bounds met.
        let t = window(&mut c, t0, acks_and_sends(10, 20));
        assert!(waits(&c, t));
        // 199 sent: not dense.
        let mut p = acks_and_sends(10, 20);
        c.record(t, &acks_and_sends(0, 19));
        for ms in 1..10 {
            c.record(t + MS * ms, &p);
        }
        let t = t + WINDOW;
        c.record(t, &PassCounts::default());
        assert!(!waits(&c, t));
        // 200 sent and 101 read: not twice as many.
        p.read_one(60, true);
        c.record(t, &acks_and_sends(10, 20));
        let plain = acks_and_sends(10, 20);
        for ms in 1..10 {
            c.record(t + MS * ms, if ms == 1 { &p } else { &plain });
        }
        let t = t + WINDOW;
        c.record(t, &PassCounts::default());
        assert!(!waits(&c, t));
        // 200 sent over a 19 ms window is not twenty a millisecond.
        let t = window(&mut c, t, acks_and_sends(10, 20));
        assert!(waits(&c, t));
        for ms in 0..10 {
            c.record(t + MS * ms, &acks_and_sends(10, 20));
        }
        let t = t + Duration::from_millis(19);
        c.record(t, &PassCounts::default());
        assert!(!waits(&c, t));
    }

    #[test]
    fn a_receiver_never_waits() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        let mut now = t0;
        // 40 datagrams in and 25 acknowledgements out a millisecond, for a second.
        let mut receiving = acks_and_sends(0, 25);
        for _ in 0..40 {
            receiving.read_one(1_400, true);
        }
        for _ in 0..100 {
            now = window(&mut c, now, receiving);
            assert!(!waits(&c, now));
        }
        // One data datagram among a sender's acknowledgements is enough to keep waking.
        let mut mostly = acks_and_sends(10, 40);
        now = window(&mut c, now, mostly);
        assert!(waits(&c, now));
        mostly.read_one(DATA_BYTES, true);
        now = window(&mut c, now, mostly);
        assert!(!waits(&c, now));
        let mut just_short = acks_and_sends(10, 40);
        just_short.read_one(DATA_BYTES - 1, true);
        now = window(&mut c, now, just_short);
        assert!(waits(&c, now));
    }

    #[test]
    fn untimed_or_handed_on_datagrams_keep_the_loop_waking() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        let mut untimed = acks_and_sends(10, 40);
        untimed.read_one(60, false);
        let t = window(&mut c, t0, untimed);
        assert!(!waits(&c, t));
        let mut handed = acks_and_sends(10, 40);
        handed.handed_on = 1;
        let t = window(&mut c, t, handed);
        assert!(!waits(&c, t));
        let t = window(&mut c, t, acks_and_sends(10, 40));
        assert!(waits(&c, t));
    }

    #[test]
    fn the_last_whole_window_decides_and_a_quiet_gap_ends_it() {
        let t0 = Instant::now();
        let mut c = ReadCoalescing::new(t0);
        c.record(t0, &acks_and_sends(10, 20));
        assert!(!waits(&c, t0), "the window is not over yet");
        let t1 = window(&mut c, t0, acks_and_sends(10, 20));
        assert!(waits(&c, t1));
        // Nothing read: nothing to coalesce.
        let t2 = window(&mut c, t1, acks_and_sends(0, 50));
        assert!(!waits(&c, t2));
        // A sender's window so busy that it stays dense over three windows' time, then a
        // long silence: the silence decides.
        let t3 = window(&mut c, t2, acks_and_sends(10, 100));
        assert!(waits(&c, t3));
        for ms in 0..10 {
            c.record(t3 + MS * ms, &acks_and_sends(10, 100));
        }
        let t4 = t3 + 3 * WINDOW;
        c.record(t4, &PassCounts::default());
        assert!(!waits(&c, t4));
        // Time read backwards (a pass's clock before the window's start) changes nothing.
        c.record(t4 - MS, &acks_and_sends(10, 20));
        assert!(!waits(&c, t4));
    }
}
