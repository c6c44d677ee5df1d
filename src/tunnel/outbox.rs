//! The datagrams a pass sends, end to end in one buffer, so that a run of them to one peer
//! leaves in one segmented (GSO) send without a second copy.
//!
//! Only datagrams released at the same instant join a run. Within a pass a peer's
//! association is polled with one `now` until its pacer holds the next datagram back, so a
//! run is at most what that pacer let go at once (its burst allowance); the datagrams left
//! back to back before batching too, one `sendto` after another. At a hub the carrier
//! scheduler releases a pass's datagrams at one instant too, as far as the carrier's and
//! each peer's schedules allow at it, and a peer's turn on the carrier (up to one send's
//! bytes) is a run of datagrams to it.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Instant;

/// Most bytes one send carries: the largest UDP payload of an IPv4 packet (65,535 − 20 − 8).
/// The kernel refuses a segmented send beyond it.
pub const MAX_SEND_BYTES: usize = 65_507;

struct Queued {
    to: SocketAddr,
    /// Where the datagram ends in the buffer (it starts where the previous one ends).
    end: usize,
    released: Instant,
}

#[derive(Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    datagrams: Vec<Queued>,
}

/// Consecutive datagrams to one address that leave in one send: `segment` bytes each, the
/// last one possibly shorter.
pub struct Run<'a> {
    pub to: SocketAddr,
    pub bytes: &'a [u8],
    pub segment: usize,
    pub count: usize,
}

impl Run<'_> {
    /// The run's datagrams one by one.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.chunks(self.segment.max(1))
    }
}

impl Outbox {
    /// Queues a copy of `datagram`, which its pacer (or the carrier) released at `released`.
    pub fn push(&mut self, to: SocketAddr, datagram: &[u8], released: Instant) {
        self.bytes.extend_from_slice(datagram);
        self.datagrams.push(Queued {
            to,
            end: self.bytes.len(),
            released,
        });
    }

    pub fn len(&self) -> usize {
        self.datagrams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.datagrams.clear();
    }

    fn range(&self, i: usize) -> Range<usize> {
        let start = i.checked_sub(1).map_or(0, |p| self.datagrams[p].end);
        start..self.datagrams[i].end
    }

    /// The run that starts with datagram `first`: it and the datagrams after it to the same
    /// address, released at the same instant and of the same size (the last may be shorter),
    /// at most `max_segments` of them and [`MAX_SEND_BYTES`] together. `None` past the end.
    pub fn run(&self, first: usize, max_segments: usize) -> Option<Run<'_>> {
        let head = self.datagrams.get(first)?;
        let Range { start, end } = self.range(first);
        let segment = end - start;
        let mut count = 1;
        let mut last = end;
        for (i, d) in self.datagrams.iter().enumerate().skip(first + 1) {
            let len = self.range(i).len();
            let joins = count < max_segments
                && d.to == head.to
                && d.released == head.released
                && len > 0
                && len <= segment
                && d.end - start <= MAX_SEND_BYTES;
            if !joins {
                break;
            }
            count += 1;
            last = d.end;
            if len < segment {
                break;
            }
        }
        Some(Run {
            to: head.to,
            bytes: &self.bytes[start..last],
            segment,
            count,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn a() -> SocketAddr {
        SocketAddr::from(([198, 18, 0, 1], 4433))
    }

    fn b() -> SocketAddr {
        SocketAddr::from(([198, 18, 0, 2], 4433))
    }

    /// `count` copies of `datagram` to `a()`, all released at `t`.
    fn copies(count: usize, datagram: &[u8], t: Instant) -> Outbox {
        let mut o = Outbox::default();
        for _ in 0..count {
            o.push(a(), datagram, t);
        }
        o
    }

    /// (address, segment, count, bytes) of every run, taking them as the sender does.
    fn runs(o: &Outbox, max_segments: usize) -> Vec<(SocketAddr, usize, usize, usize)> {
        let mut out = Vec::new();
        let mut first = 0;
        while let Some(r) = o.run(first, max_segments) {
            out.push((r.to, r.segment, r.count, r.bytes.len()));
            first += r.count;
        }
        out
    }

    #[test]
    fn runs_join_equal_sizes_to_one_address_released_together() {
        let t = Instant::now();
        let mut o = copies(3, &[1; 100], t);
        // A shorter one ends the run it joins.
        o.push(a(), &[2; 40], t);
        o.push(a(), &[3; 100], t);
        // Another address, another instant, a longer datagram: each starts a new run.
        o.push(b(), &[4; 100], t);
        o.push(b(), &[5; 100], t + Duration::from_micros(1));
        o.push(b(), &[6; 200], t + Duration::from_micros(1));
        assert_eq!(o.len(), 8);
        assert_eq!(
            runs(&o, 64),
            [
                (a(), 100, 4, 340),
                (a(), 100, 1, 100),
                (b(), 100, 1, 100),
                (b(), 100, 1, 100),
                (b(), 200, 1, 200),
            ]
        );
        let first = o.run(0, 64).expect("run");
        let parts: Vec<&[u8]> = first.datagrams().collect();
        assert_eq!(parts, [&[1; 100][..], &[1; 100], &[1; 100], &[2; 40]]);
    }

    #[test]
    fn runs_stop_at_the_segment_count_and_the_byte_bound() {
        let t = Instant::now();
        let o = copies(5, &[0; 1000], t);
        assert_eq!(
            runs(&o, 2),
            [
                (a(), 1000, 2, 2000),
                (a(), 1000, 2, 2000),
                (a(), 1000, 1, 1000)
            ]
        );
        // Without offload every datagram goes on its own.
        assert_eq!(runs(&o, 1).len(), 5);

        let mut o = copies(70, &[0; 1456], t);
        assert!(o.run(70, 64).is_none());
        o.clear();
        assert!(o.run(0, 64).is_none());
        let o = copies(70, &[0; 1456], t);
        // 44 × 1456 = 64,064 bytes fit in one send, 45 would not.
        assert_eq!(
            runs(&o, 64),
            [(a(), 1456, 44, 64_064), (a(), 1456, 26, 37_856)]
        );
    }
}
