//! The two halves of a flow: the bytes we send (kept until acknowledged, repaired when lost)
//! and the bytes we receive (reassembled in order, released as the consumer reads).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::range_set::RangeSet;

/// A piece of a send stream chosen for one DATA frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub len: usize,
    pub fin: bool,
    pub retransmit: bool,
}

#[derive(Debug)]
pub struct SendStream {
    /// Bytes from `acked_base` to the end of what the application wrote.
    buf: VecDeque<u8>,
    /// Everything below is acknowledged and released.
    acked_base: u64,
    /// First offset never sent.
    next_new: u64,
    acked: RangeSet,
    lost: RangeSet,
    fin_written: bool,
    fin_sent: bool,
    fin_lost: bool,
    fin_acked: bool,
    /// The peer's limit for this flow (absolute offset).
    credit: u64,
    buffer_limit: u64,
}

impl SendStream {
    pub fn new(initial_credit: u64, buffer_limit: u64) -> Self {
        SendStream {
            buf: VecDeque::new(),
            acked_base: 0,
            next_new: 0,
            acked: RangeSet::new(),
            lost: RangeSet::new(),
            fin_written: false,
            fin_sent: false,
            fin_lost: false,
            fin_acked: false,
            credit: initial_credit,
            buffer_limit,
        }
    }

    /// Offset just past the last byte written.
    pub fn end(&self) -> u64 {
        self.acked_base + self.buf.len() as u64
    }

    pub fn next_new(&self) -> u64 {
        self.next_new
    }

    pub fn acked_base(&self) -> u64 {
        self.acked_base
    }

    pub fn is_finished_by_app(&self) -> bool {
        self.fin_written
    }

    /// Copies as much of `data` as the buffer allows; returns the count.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let room = self.buffer_limit.saturating_sub(self.buf.len() as u64);
        let n = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        self.buf.extend(&data[..n]);
        n
    }

    /// Bytes the buffer holds allocated (at least what is written and unacknowledged).
    #[cfg(test)]
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    pub fn room(&self) -> usize {
        usize::try_from(self.buffer_limit.saturating_sub(self.buf.len() as u64))
            .unwrap_or(usize::MAX)
    }

    pub fn has_room(&self) -> bool {
        (self.buf.len() as u64) < self.buffer_limit
    }

    pub fn finish(&mut self) {
        self.fin_written = true;
    }

    pub fn raise_credit(&mut self, max_offset: u64) {
        self.credit = self.credit.max(max_offset);
    }

    /// Repairs or new bytes within credit, or a FIN, are waiting.
    pub fn has_sendable(&self, assoc_allowance: u64) -> bool {
        !self.lost.is_empty()
            || self.fin_lost
            || (self.next_new < self.end().min(self.credit) && assoc_allowance > 0)
            || (self.fin_written && !self.fin_sent && self.next_new == self.end())
    }

    /// The next chunk will be a repair (bytes or a FIN sent before and taken for lost).
    pub fn repair_pending(&self) -> bool {
        !self.lost.is_empty() || self.fin_lost
    }

    pub fn fin_acked(&self) -> bool {
        self.fin_acked
    }

    /// Whether everything including the FIN is acknowledged.
    pub fn is_done(&self) -> bool {
        self.fin_acked && self.acked_base == self.end()
    }

    /// Picks the next chunk (repairs first) of at most `max_len` bytes and marks it sent.
    /// New bytes are limited by flow credit and by `assoc_allowance`.
    pub fn next_chunk(&mut self, max_len: usize, assoc_allowance: u64) -> Option<Chunk> {
        if let Some(r) = self.lost.first() {
            let len = ((r.end - r.start) as usize).min(max_len);
            if len == 0 {
                return None;
            }
            self.lost.remove(r.start..r.start + len as u64);
            let end = r.start + len as u64;
            let fin = self.fin_lost && end == self.end();
            if fin {
                self.fin_lost = false;
            }
            return Some(Chunk {
                offset: r.start,
                len,
                fin,
                retransmit: true,
            });
        }
        if self.fin_lost {
            self.fin_lost = false;
            return Some(Chunk {
                offset: self.end(),
                len: 0,
                fin: true,
                retransmit: true,
            });
        }
        let limit = self
            .end()
            .min(self.credit)
            .min(self.next_new.saturating_add(assoc_allowance));
        if self.next_new < limit {
            let len = ((limit - self.next_new) as usize).min(max_len);
            if len == 0 {
                return None;
            }
            let offset = self.next_new;
            self.next_new += len as u64;
            let fin = self.fin_written && self.next_new == self.end();
            if fin {
                self.fin_sent = true;
            }
            return Some(Chunk {
                offset,
                len,
                fin,
                retransmit: false,
            });
        }
        if self.fin_written && !self.fin_sent && self.next_new == self.end() {
            self.fin_sent = true;
            return Some(Chunk {
                offset: self.next_new,
                len: 0,
                fin: true,
                retransmit: false,
            });
        }
        None
    }

    /// Appends the bytes at `offset..offset+len` (which must be unacknowledged) to `out`.
    pub fn copy_to(&self, offset: u64, len: usize, out: &mut Vec<u8>) {
        let start = (offset - self.acked_base) as usize;
        let (a, b) = self.buf.as_slices();
        let end = start + len;
        if end <= a.len() {
            out.extend_from_slice(&a[start..end]);
        } else if start >= a.len() {
            out.extend_from_slice(&b[start - a.len()..end - a.len()]);
        } else {
            out.extend_from_slice(&a[start..]);
            out.extend_from_slice(&b[..end - a.len()]);
        }
    }

    /// Parts of `offset..offset+len` still unacknowledged (for a redundant copy).
    pub fn unacked_within(&self, offset: u64, len: usize) -> Vec<std::ops::Range<u64>> {
        let lo = offset.max(self.acked_base);
        let hi = offset + len as u64;
        if lo >= hi {
            return Vec::new();
        }
        self.acked.gaps_within(lo..hi)
    }

    pub fn on_acked(&mut self, offset: u64, len: usize, fin: bool) {
        let end = offset + len as u64;
        if fin {
            self.fin_acked = true;
            self.fin_lost = false;
        }
        if end <= self.acked_base {
            return;
        }
        self.acked.insert(offset.max(self.acked_base)..end);
        self.lost.remove(offset..end);
        if let Some(first) = self.acked.first() {
            if first.start <= self.acked_base {
                let advance = (first.end - self.acked_base) as usize;
                self.buf.drain(..advance);
                self.acked_base = first.end;
                self.acked.pop_first();
                if self.buf.is_empty() {
                    // A flow that went quiet must not keep the room its busiest moment
                    // grew: thousands of idle flows would hold their peaks.
                    self.buf = VecDeque::new();
                }
            }
        }
    }

    /// The receiver reports `r` missing although we may have taken it as acknowledged.
    /// Returns false if some of it was already released and cannot be repaired.
    pub fn on_stream_snack(&mut self, r: std::ops::Range<u64>) -> bool {
        if r.start < self.acked_base {
            return false;
        }
        let hi = r.end.min(self.next_new);
        if r.start < hi {
            self.acked.remove(r.start..hi);
            self.lost.insert(r.start..hi);
        }
        true
    }

    pub fn on_lost(&mut self, offset: u64, len: usize, fin: bool) {
        let lo = offset.max(self.acked_base);
        let hi = offset + len as u64;
        if lo < hi {
            for gap in self.acked.gaps_within(lo..hi) {
                self.lost.insert(gap);
            }
        }
        if fin && !self.fin_acked {
            self.fin_lost = true;
        }
    }
}

/// Outcome of delivering a DATA frame to a receive stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// Bytes beyond the credit we granted.
    CreditExceeded,
    /// A FIN that contradicts an earlier one, or data beyond the FIN.
    FinalSizeChanged,
}

#[derive(Debug)]
pub struct RecvStream {
    ready: VecDeque<Bytes>,
    /// Out-of-order bytes above `contiguous`, non-overlapping, keyed by offset.
    pending: BTreeMap<u64, Bytes>,
    /// What `pending` covers, so overlapping retransmissions are stored once.
    pending_ranges: RangeSet,
    pending_bytes: u64,
    /// All bytes below are received.
    contiguous: u64,
    /// All bytes below are consumed by the application.
    read: u64,
    /// Highest byte offset + 1 ever received (what the sender has charged to our budget).
    highest: u64,
    fin_offset: Option<u64>,
    fin_delivered: bool,
    limit_advertised: u64,
}

impl RecvStream {
    pub fn new(window: u64) -> Self {
        RecvStream {
            ready: VecDeque::new(),
            pending: BTreeMap::new(),
            pending_ranges: RangeSet::new(),
            pending_bytes: 0,
            contiguous: 0,
            read: 0,
            highest: 0,
            fin_offset: None,
            fin_delivered: false,
            limit_advertised: window,
        }
    }

    /// Reference for expanding truncated offsets: the sender guarantees its frames lie within
    /// its unambiguous span of this point.
    pub fn contiguous(&self) -> u64 {
        self.contiguous
    }

    /// The highest offset the peer may have sent up to: the credit we advertised.
    pub fn limit_advertised(&self) -> u64 {
        self.limit_advertised
    }

    pub fn highest(&self) -> u64 {
        self.highest
    }

    pub fn read_offset(&self) -> u64 {
        self.read
    }

    /// Whether the peer has said where its stream ends (its FIN arrived, maybe ahead of
    /// data still missing).
    pub fn is_finished_by_peer(&self) -> bool {
        self.fin_offset.is_some()
    }

    /// Stores a frame's bytes; returns how far `highest` advanced (bytes newly charged to
    /// the association budget).
    pub fn on_data(&mut self, offset: u64, data: &[u8], fin: bool) -> Result<u64, RecvError> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(RecvError::CreditExceeded)?;
        if end > self.limit_advertised {
            return Err(RecvError::CreditExceeded);
        }
        if let Some(f) = self.fin_offset {
            if end > f || (fin && end != f) {
                return Err(RecvError::FinalSizeChanged);
            }
        }
        if fin {
            if end < self.highest {
                return Err(RecvError::FinalSizeChanged);
            }
            self.fin_offset = Some(end);
        }
        let charged = end.saturating_sub(self.highest);
        self.highest = self.highest.max(end);
        if end <= self.contiguous || data.is_empty() {
            return Ok(charged);
        }
        let skip = self.contiguous.saturating_sub(offset) as usize;
        let (offset, data) = (offset + skip as u64, &data[skip..]);
        if offset == self.contiguous {
            self.ready.push_back(Bytes::copy_from_slice(data));
            self.contiguous = end;
            self.drain_pending();
        } else {
            for gap in self.pending_ranges.gaps_within(offset..end) {
                let lo = (gap.start - offset) as usize;
                let hi = (gap.end - offset) as usize;
                self.pending
                    .insert(gap.start, Bytes::copy_from_slice(&data[lo..hi]));
                self.pending_bytes += (hi - lo) as u64;
            }
            self.pending_ranges.insert(offset..end);
        }
        Ok(charged)
    }

    fn drain_pending(&mut self) {
        self.pending_ranges.remove_below(self.contiguous);
        while let Some(entry) = self.pending.first_entry() {
            let start = *entry.key();
            if start > self.contiguous {
                break;
            }
            let chunk = entry.remove();
            self.pending_bytes -= chunk.len() as u64;
            let end = start + chunk.len() as u64;
            if end > self.contiguous {
                let skip = (self.contiguous - start) as usize;
                self.ready.push_back(chunk.slice(skip..));
                self.contiguous = end;
            }
        }
        self.pending_ranges.remove_below(self.contiguous);
    }

    /// Missing byte ranges between the cumulative point and the highest byte received.
    pub fn gaps(&self, max: usize) -> Vec<std::ops::Range<u64>> {
        let mut out = Vec::new();
        let mut cursor = self.contiguous;
        for (&start, chunk) in &self.pending {
            if out.len() >= max {
                break;
            }
            if start > cursor {
                out.push(cursor..start);
            }
            cursor = cursor.max(start + chunk.len() as u64);
        }
        out
    }

    pub fn has_gap(&self) -> bool {
        !self.pending.is_empty()
    }

    pub fn has_readable(&self) -> bool {
        !self.ready.is_empty() || self.fin_ready()
    }

    fn fin_ready(&self) -> bool {
        self.fin_offset == Some(self.contiguous) && self.read == self.contiguous
    }

    pub fn fin_delivered(&self) -> bool {
        self.fin_delivered
    }

    /// Records that the sender has sent up to `end` (a discarded frame, a final offset);
    /// returns how far the charged total advanced.
    pub fn raise_highest(&mut self, end: u64) -> u64 {
        let extra = end.saturating_sub(self.highest);
        self.highest += extra;
        extra
    }

    /// Up to `max` in-order bytes; `None` when nothing is ready.
    pub fn read(&mut self, max: usize) -> Option<Bytes> {
        let front = self.ready.front_mut()?;
        let chunk = if front.len() <= max {
            self.ready.pop_front()?
        } else {
            front.split_to(max)
        };
        self.read += chunk.len() as u64;
        if self.ready.is_empty() {
            // As for the send side: a drained queue gives its room back.
            self.ready = VecDeque::new();
        }
        Some(chunk)
    }

    /// True once, when the application has read everything and learns of the FIN.
    pub fn take_fin(&mut self) -> bool {
        if self.fin_ready() && !self.fin_delivered {
            self.fin_delivered = true;
            return true;
        }
        false
    }

    /// A new limit worth announcing with `window` bytes open beyond what was read, once it
    /// moves the advertised one by a quarter of that.
    pub fn credit_update(&self, window: u64) -> Option<u64> {
        if self.fin_offset.is_some() {
            return None;
        }
        let target = self.read + window;
        (target >= self.limit_advertised + window / 4).then_some(target)
    }

    pub fn current_limit(&self) -> u64 {
        self.limit_advertised
    }

    pub fn set_advertised(&mut self, limit: u64) {
        self.limit_advertised = self.limit_advertised.max(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_stream_repairs_before_new_data_and_releases_on_ack() {
        let mut s = SendStream::new(1 << 20, 1 << 20);
        assert_eq!(s.write(&[7u8; 3000]), 3000);
        s.finish();
        let a = s.next_chunk(1000, u64::MAX).unwrap();
        let b = s.next_chunk(1000, u64::MAX).unwrap();
        let c = s.next_chunk(1000, u64::MAX).unwrap();
        assert!(c.fin && !a.fin && !b.fin);
        assert!(s.next_chunk(1000, u64::MAX).is_none());
        s.on_lost(b.offset, b.len, b.fin);
        s.on_lost(c.offset, c.len, c.fin);
        s.on_acked(a.offset, a.len, a.fin);
        assert_eq!(s.acked_base(), 1000);
        let r = s.next_chunk(1500, u64::MAX).unwrap();
        assert_eq!(
            (r.offset, r.len, r.fin, r.retransmit),
            (1000, 1500, false, true)
        );
        let r2 = s.next_chunk(1500, u64::MAX).unwrap();
        assert_eq!((r2.offset, r2.len, r2.fin), (2500, 500, true));
        s.on_acked(1000, 2000, true);
        assert!(s.is_done());
    }

    #[test]
    fn drained_buffers_give_their_room_back() {
        let mut s = SendStream::new(1 << 20, 1 << 20);
        assert_eq!(s.write(&[7u8; 100_000]), 100_000);
        assert!(s.allocated() >= 100_000);
        let c = s.next_chunk(100_000, u64::MAX).unwrap();
        s.on_acked(c.offset, 60_000, false);
        assert!(
            s.allocated() >= 40_000,
            "still holds the unacknowledged part"
        );
        s.on_acked(60_000, 40_000, false);
        assert_eq!(s.allocated(), 0);

        let mut r = RecvStream::new(1 << 20);
        for i in 0..1000u64 {
            r.on_data(i * 100, &[1u8; 100], false).unwrap();
        }
        assert!(r.ready.capacity() >= 1000);
        while r.read(64 * 1024).is_some() {}
        assert_eq!(r.ready.capacity(), 0);
    }

    #[test]
    fn send_stream_respects_credit_and_allowance() {
        let mut s = SendStream::new(100, 1 << 20);
        s.write(&[1u8; 500]);
        assert_eq!(s.next_chunk(1000, u64::MAX).unwrap().len, 100);
        assert!(s.next_chunk(1000, u64::MAX).is_none());
        s.raise_credit(1000);
        assert_eq!(s.next_chunk(1000, 50).unwrap().len, 50);
    }

    #[test]
    fn recv_stream_reassembles_out_of_order_and_duplicates() {
        let mut r = RecvStream::new(1 << 20);
        let data: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        r.on_data(2000, &data[2000..], true).unwrap();
        r.on_data(1000, &data[1000..2000], false).unwrap();
        r.on_data(500, &data[500..1500], false).unwrap();
        assert!(!r.has_readable());
        r.on_data(0, &data[..800], false).unwrap();
        let mut got = Vec::new();
        while let Some(b) = r.read(700) {
            got.extend_from_slice(&b);
        }
        assert_eq!(got, data);
        assert!(r.take_fin());
        assert!(!r.take_fin());
    }

    #[test]
    fn overlapping_out_of_order_segments_are_stored_once() {
        let mut r = RecvStream::new(1 << 20);
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        // Byte-shifted retransmissions of the same region, all above a hole at 0..100.
        for shift in 0..50u64 {
            let lo = 100 + shift;
            r.on_data(lo, &data[lo as usize..5000], false).unwrap();
        }
        assert_eq!(r.pending_bytes, 4900);
        r.on_data(0, &data[..100], false).unwrap();
        let mut got = Vec::new();
        while let Some(b) = r.read(usize::MAX) {
            got.extend_from_slice(&b);
        }
        assert_eq!(got, &data[..5000]);
        assert_eq!(r.pending_bytes, 0);
    }

    #[test]
    fn recv_stream_rejects_credit_overrun_and_final_size_changes() {
        let mut r = RecvStream::new(1000);
        assert_eq!(
            r.on_data(900, &[0; 200], false),
            Err(RecvError::CreditExceeded)
        );
        r.on_data(0, &[0; 10], true).unwrap();
        assert_eq!(
            r.on_data(10, &[0; 5], false),
            Err(RecvError::FinalSizeChanged)
        );
    }
}
