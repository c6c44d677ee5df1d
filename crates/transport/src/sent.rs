//! Sender's record of packets in flight, indexed by packet number (numbers are consecutive,
//! so a ring buffer indexed by offset from the oldest is enough).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::frame::ResetReason;

/// What a packet carried that must be repaired if it is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentFrame {
    Data {
        flow: u64,
        offset: u64,
        len: u32,
        fin: bool,
    },
    Open {
        flow: u64,
    },
    Reset {
        flow: u64,
        reason: ResetReason,
    },
    FlowCredit {
        flow: u64,
    },
    AssocCredit,
    StreamSnack,
    Ping,
}

#[derive(Debug, Clone)]
pub struct SentPacket {
    pub time: Instant,
    /// Bytes on the wire, overhead included.
    pub wire_bytes: u64,
    pub frames: Vec<SentFrame>,
    /// Packets carrying the same data (an original and its redundant copies) share a group,
    /// named by the original's number: while one member is outstanding, losing another needs
    /// no repair.
    pub group: Option<u64>,
    pub is_copy: bool,
    /// Redundant copies made of this original.
    pub copies: u8,
    pub has_data: bool,
    /// Sent after the pacer's schedule slipped (see `Pacer::on_sent`).
    pub app_limited: bool,
    /// The packet's last bytes as sent (the end of its AEAD tag; zeros without security):
    /// a HINT that echoes them is about this packet.
    pub tag_tail: [u8; crate::packet::HINT_TAG_TAIL_LEN],
}

#[derive(Debug, Default)]
pub struct SentPackets {
    base: u64,
    slots: VecDeque<Option<SentPacket>>,
    in_flight: usize,
    bytes_in_flight: u64,
    /// Outstanding members per redundancy group.
    groups: HashMap<u64, u32>,
    /// Frame lists of packets no longer tracked, cleared, for the next packets to reuse: a
    /// packet sent then costs no allocation for its list.
    spare_frame_lists: Vec<Vec<SentFrame>>,
}

/// Spare frame lists kept at most (a burst's worth; more are freed).
const SPARE_FRAME_LISTS: usize = 64;
/// A list that grew beyond this many frames is freed, not kept (packets carry one or two).
const SPARE_FRAME_LIST_CAPACITY: usize = 16;

impl SentPackets {
    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight == 0
    }

    /// An empty frame list for a packet about to be built.
    pub fn frame_list(&mut self) -> Vec<SentFrame> {
        self.spare_frame_lists.pop().unwrap_or_default()
    }

    /// Takes back the frame list of a packet that left the record.
    pub fn recycle(&mut self, mut frames: Vec<SentFrame>) {
        let capacity = frames.capacity();
        if self.spare_frame_lists.len() < SPARE_FRAME_LISTS
            && (1..=SPARE_FRAME_LIST_CAPACITY).contains(&capacity)
        {
            frames.clear();
            self.spare_frame_lists.push(frames);
        }
    }

    pub fn insert(&mut self, pn: u64, p: SentPacket) {
        if self.slots.is_empty() {
            self.base = pn;
        }
        while self.base + (self.slots.len() as u64) < pn {
            self.slots.push_back(None);
        }
        self.bytes_in_flight += p.wire_bytes;
        self.in_flight += 1;
        if let Some(g) = p.group {
            *self.groups.entry(g).or_insert(0) += 1;
        }
        self.slots.push_back(Some(p));
    }

    pub fn get(&self, pn: u64) -> Option<&SentPacket> {
        let i = pn.checked_sub(self.base)?;
        self.slots.get(usize::try_from(i).ok()?)?.as_ref()
    }

    pub fn get_mut(&mut self, pn: u64) -> Option<&mut SentPacket> {
        let i = pn.checked_sub(self.base)?;
        self.slots.get_mut(usize::try_from(i).ok()?)?.as_mut()
    }

    pub fn remove(&mut self, pn: u64) -> Option<SentPacket> {
        let i = usize::try_from(pn.checked_sub(self.base)?).ok()?;
        let p = self.slots.get_mut(i)?.take()?;
        self.bytes_in_flight -= p.wire_bytes;
        self.in_flight -= 1;
        if let Some(g) = p.group {
            if let Some(n) = self.groups.get_mut(&g) {
                *n -= 1;
                if *n == 0 {
                    self.groups.remove(&g);
                }
            }
        }
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(p)
    }

    /// Outstanding packet numbers in `lo..hi`, oldest first.
    pub fn outstanding_in(&self, lo: u64, hi: u64) -> Vec<u64> {
        let lo = lo.max(self.base);
        let end = hi.min(self.base + self.slots.len() as u64);
        (lo..end)
            .filter(|&pn| self.slots[(pn - self.base) as usize].is_some())
            .collect()
    }

    /// Newest outstanding original numbered below `below` that carries data and has fewer
    /// than `copies` redundant copies.
    pub fn newest_to_copy_below(&self, below: u64, copies: u8) -> Option<u64> {
        let end = below.min(self.end()).checked_sub(self.base)? as usize;
        self.slots
            .range(..end)
            .rposition(|s| {
                s.as_ref()
                    .is_some_and(|p| p.has_data && !p.is_copy && p.copies < copies)
            })
            .map(|i| self.base + i as u64)
    }

    /// Counts a copy of `original`; a `complete` copy joins (or founds) its redundancy group.
    pub fn note_copy(&mut self, original: u64, complete: bool) -> Option<u64> {
        let p = self.get_mut(original)?;
        p.copies += 1;
        if !complete {
            return None;
        }
        if p.group.is_none() {
            p.group = Some(original);
            *self.groups.entry(original).or_insert(0) += 1;
        }
        Some(original)
    }

    /// Whether any member of `group` is still outstanding.
    pub fn group_outstanding(&self, group: u64) -> bool {
        self.groups.contains_key(&group)
    }

    pub fn end(&self) -> u64 {
        self.base + self.slots.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_tail_costs_no_memory() {
        // It fills what was padding: an association records every packet in flight.
        assert_eq!(std::mem::size_of::<SentPacket>(), 72);
        assert_eq!(std::mem::size_of::<Option<SentPacket>>(), 72);
    }

    #[test]
    fn frame_lists_come_back_empty_and_only_small_ones_are_kept() {
        let mut s = SentPackets::default();
        let mut list = s.frame_list();
        list.extend([SentFrame::Ping, SentFrame::AssocCredit]);
        let kept = list.capacity();
        s.recycle(list);
        let again = s.frame_list();
        assert!(again.is_empty());
        assert_eq!(again.capacity(), kept, "the same list, reused");
        // A list that grew large, and one that never held anything, are not kept.
        s.recycle(vec![SentFrame::Ping; SPARE_FRAME_LIST_CAPACITY + 1]);
        s.recycle(Vec::new());
        assert_eq!(s.frame_list().capacity(), 0);
        // At most SPARE_FRAME_LISTS wait.
        for _ in 0..SPARE_FRAME_LISTS + 10 {
            s.recycle(vec![SentFrame::Ping]);
        }
        assert_eq!(s.spare_frame_lists.len(), SPARE_FRAME_LISTS);
    }
}
