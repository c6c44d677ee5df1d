//! Members keyed by the instant they become due, earliest first. Entries are never removed
//! in place: a member's epoch moves on instead, and the owner drops entries whose epoch is
//! no longer the member's when they reach the top (or in a compaction).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Due {
    /// `None` sorts first: due at once.
    pub at: Option<Instant>,
    pub slot: usize,
    pub serial: u64,
    pub epoch: u32,
}

#[derive(Debug, Default)]
pub(super) struct DueQueue {
    heap: BinaryHeap<Reverse<Due>>,
}

impl DueQueue {
    pub fn push(&mut self, due: Due) {
        self.heap.push(Reverse(due));
    }

    pub fn peek(&self) -> Option<Due> {
        self.heap.peek().map(|r| r.0)
    }

    pub fn pop(&mut self) -> Option<Due> {
        self.heap.pop().map(|r| r.0)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Due) -> bool) {
        self.heap.retain(|r| keep(&r.0));
    }
}
