//! Sender's record of packets in flight, indexed by packet number (numbers are consecutive,
//! so a ring buffer indexed by offset from the oldest is enough).

use std::collections::VecDeque;
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
    Ping,
    Close,
}

#[derive(Debug, Clone)]
pub struct SentPacket {
    pub time: Instant,
    /// Bytes on the wire, overhead included.
    pub wire_bytes: u64,
    pub frames: Vec<SentFrame>,
    /// A redundant copy of this packet, or the original this is a copy of: while one of the
    /// pair is outstanding, losing the other needs no repair.
    pub twin: Option<u64>,
    pub is_copy: bool,
    pub has_data: bool,
}

#[derive(Debug, Default)]
pub struct SentPackets {
    base: u64,
    slots: VecDeque<Option<SentPacket>>,
    in_flight: usize,
    bytes_in_flight: u64,
}

impl SentPackets {
    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight == 0
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

    pub fn contains(&self, pn: u64) -> bool {
        self.get(pn).is_some()
    }

    pub fn remove(&mut self, pn: u64) -> Option<SentPacket> {
        let i = usize::try_from(pn.checked_sub(self.base)?).ok()?;
        let p = self.slots.get_mut(i)?.take()?;
        self.bytes_in_flight -= p.wire_bytes;
        self.in_flight -= 1;
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

    /// Oldest outstanding packet number.
    pub fn oldest(&self) -> Option<u64> {
        self.slots
            .iter()
            .position(Option::is_some)
            .map(|i| self.base + i as u64)
    }

    /// Oldest outstanding packet carrying data that has no redundant copy yet and is not one.
    pub fn oldest_uncopied_at_or_after(&self, from: u64) -> Option<u64> {
        let start = from.saturating_sub(self.base) as usize;
        self.slots
            .iter()
            .enumerate()
            .skip(start)
            .find(|(_, s)| {
                s.as_ref()
                    .is_some_and(|p| p.has_data && !p.is_copy && p.twin.is_none())
            })
            .map(|(i, _)| self.base + i as u64)
    }

    pub fn end(&self) -> u64 {
        self.base + self.slots.len() as u64
    }
}
