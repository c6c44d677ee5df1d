//! The gateway's open flows across every peer, which `limits.max_flows` bounds: each holds
//! a descriptor or more from its open to its relay's end, so the open-file limit and the
//! kernel's tables are sized for this total, however many peers share it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct OpenFlows {
    open: AtomicUsize,
    max: AtomicUsize,
}

impl OpenFlows {
    pub fn new(max: usize) -> OpenFlows {
        OpenFlows {
            open: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
        }
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// A lower `max` closes no open flow: new ones wait until fewer are open.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// A slot for one more flow, or `None` while `max` are open.
    pub fn try_take(self: &Arc<Self>) -> Option<OpenFlow> {
        let max = self.max();
        // Compare and swap, so that opens on several threads cannot all pass at `max - 1`.
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(OpenFlow(self.clone()))
    }

    /// A slot whatever the count, for a flow another limit bounds already.
    pub fn take(self: &Arc<Self>) -> OpenFlow {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenFlow(self.clone())
    }
}

/// One open flow, counted until dropped: the flow's relay keeps it to its end, however the
/// flow ends.
#[derive(Debug)]
pub struct OpenFlow(Arc<OpenFlows>);

impl Drop for OpenFlow {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_open_until_its_slot_drops() {
        let flows = Arc::new(OpenFlows::new(3));
        let intercepted = flows.try_take().expect("room");
        let from_peer = flows.try_take().expect("room");
        assert_eq!(flows.open(), 2);
        drop(intercepted);
        assert_eq!(flows.open(), 1);
        drop(from_peer);
        assert_eq!(flows.open(), 0);
        // Nothing taken, nothing to give back: the count cannot go below zero.
        assert!(flows.try_take().is_some());
        assert_eq!(flows.open(), 0);
    }

    #[test]
    fn refuses_at_max_and_makes_room_when_one_ends() {
        let flows = Arc::new(OpenFlows::new(2));
        let mut slots: Vec<OpenFlow> = (0..2).filter_map(|_| flows.try_take()).collect();
        assert_eq!((slots.len(), flows.open()), (2, 2));
        // A refusal takes nothing.
        assert!(flows.try_take().is_none());
        assert!(flows.try_take().is_none());
        assert_eq!(flows.open(), 2);
        slots.pop();
        assert_eq!(flows.open(), 1);
        slots.push(flows.try_take().expect("the room the ended flow left"));
        assert_eq!(flows.open(), 2);
        slots.clear();
        assert_eq!(flows.open(), 0);
    }

    #[test]
    fn a_lower_max_keeps_the_open_flows() {
        let flows = Arc::new(OpenFlows::new(3));
        let mut slots: Vec<OpenFlow> = (0..3).filter_map(|_| flows.try_take()).collect();
        flows.set_max(1);
        assert_eq!((flows.open(), flows.max()), (3, 1));
        assert!(flows.try_take().is_none());
        slots.truncate(1);
        assert!(flows.try_take().is_none(), "1 open is the new max");
        slots.clear();
        let again = flows.try_take().expect("room");
        assert_eq!(flows.open(), 1);
        drop(again);
        assert_eq!(flows.open(), 0);
    }

    #[test]
    fn take_counts_past_max() {
        let flows = Arc::new(OpenFlows::new(1));
        let bounded = flows.try_take().expect("room");
        let unbounded = flows.take();
        assert_eq!(flows.open(), 2);
        assert!(flows.try_take().is_none());
        drop((bounded, unbounded));
        assert_eq!(flows.open(), 0);
    }

    #[test]
    fn concurrent_opens_never_pass_max() {
        let flows = Arc::new(OpenFlows::new(5));
        let taken: Vec<Vec<OpenFlow>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..10).filter_map(|_| flows.try_take()).collect()))
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        assert_eq!(taken.iter().map(Vec::len).sum::<usize>(), 5);
        assert_eq!(flows.open(), 5);
        drop(taken);
        assert_eq!(flows.open(), 0);
    }
}
