//! Each peer's association state changes, as the drivers see them, for one watcher outside
//! the tunnel (the announcements). The drivers push and never wait: a change that finds the
//! channel full is dropped and counted, and the watcher's own periodic look at every peer's
//! state repairs it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use pep_transport::PeerId;
use tokio::sync::mpsc;

use crate::tunnel::peer::AssociationState;

/// One change: the peer and the state it entered.
pub type StateChange = (PeerId, AssociationState);

#[derive(Default)]
pub struct StateFeed {
    tx: OnceLock<mpsc::Sender<StateChange>>,
    dropped: AtomicU64,
}

impl StateFeed {
    /// The changes from now on, at most `capacity` waiting; `None` if someone watches
    /// already.
    pub fn watch(&self, capacity: usize) -> Option<mpsc::Receiver<StateChange>> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.tx.set(tx).ok()?;
        Some(rx)
    }

    /// Tells the watcher, if any, that `peer` entered `state`.
    pub fn changed(&self, peer: PeerId, state: AssociationState) {
        if let Some(tx) = self.tx.get() {
            if tx.try_send((peer, state)).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Changes that found the channel full (or its watcher gone).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_watcher_gets_the_changes_and_a_full_channel_drops_without_waiting() {
        let feed = StateFeed::default();
        // Unwatched: nothing is kept, nothing counted.
        feed.changed(PeerId(1), AssociationState::Established);
        assert_eq!(feed.dropped(), 0);
        let mut rx = feed.watch(2).expect("first watcher");
        assert!(feed.watch(2).is_none());
        feed.changed(PeerId(1), AssociationState::Established);
        feed.changed(PeerId(2), AssociationState::Outage);
        feed.changed(PeerId(3), AssociationState::Closed);
        assert_eq!(feed.dropped(), 1);
        assert_eq!(
            rx.try_recv().ok(),
            Some((PeerId(1), AssociationState::Established))
        );
        assert_eq!(
            rx.try_recv().ok(),
            Some((PeerId(2), AssociationState::Outage))
        );
        assert!(rx.try_recv().is_err());
    }
}
