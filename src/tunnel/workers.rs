//! Where a hub's peers and datagrams are served when its associations spread over worker
//! threads (docs/OPERATIONS.md, "Capacity: cores"): which worker owns a peer, which one a
//! datagram belongs to, and the inboxes through which a worker hands another what it read
//! for it.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pep_transport::packet::{placed_by_address, shard_of};
use pep_transport::security::AcceptedInitiation;
use pep_transport::PeerId;
use tokio::sync::Notify;

/// Bits of the connection ID that name the shard of `workers` workers: the fewest that
/// count them (0 for one, which leaves a single worker's IDs as they always were).
pub fn shard_bits(workers: usize) -> u8 {
    workers.next_power_of_two().trailing_zeros() as u8
}

/// The worker that serves `peer`: by its id, which it keeps across reloads, so a peer's
/// association never moves.
pub fn owner(peer: PeerId, workers: usize) -> usize {
    peer.0 as usize % workers.max(1)
}

/// Where the peers whose authenticated initiations a worker handed to their owner sent
/// them from, the last address of each: the retransmissions of an initiation come from
/// there, and only its owner can answer them. One entry per peer at most.
#[derive(Default)]
pub struct Initiators {
    by_address: HashMap<SocketAddr, PeerId>,
    by_peer: HashMap<PeerId, SocketAddr>,
}

impl Initiators {
    pub fn learn(&mut self, from: SocketAddr, peer: PeerId) {
        if let Some(old) = self.by_peer.insert(peer, from) {
            if old != from && self.by_address.get(&old) == Some(&peer) {
                self.by_address.remove(&old);
            }
        }
        if let Some(other) = self.by_address.insert(from, peer) {
            if other != peer && self.by_peer.get(&other) == Some(&from) {
                self.by_peer.remove(&other);
            }
        }
    }

    pub fn get(&self, from: &SocketAddr) -> Option<PeerId> {
        self.by_address.get(from).copied()
    }
}

/// Handoffs one worker's inbox holds, some passes' worth of datagrams
/// (`crate::tunnel::driver::BATCH` a pass): a worker that falls behind has what others hand it
/// dropped (and counted) rather than held without bound.
pub const INBOX_CAPACITY: usize = 1024;

/// Where a worker stands: its number among the workers, and the connection IDs and
/// datagram sizes its endpoint reads.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    pub worker: usize,
    pub workers: usize,
    pub cid_len: u8,
    pub shard_bits: u8,
    pub max_datagram: usize,
}

impl Place {
    /// The other worker a datagram from `from` belongs to, if any: the one its connection
    /// ID's shard names, or for a HELLO or an INIT the owner of the peer `peer_at` knows
    /// at that address. `None`: this worker's endpoint decides (its own, an initiation from
    /// elsewhere, a shard no worker has, or a datagram longer than any endpoint reads,
    /// which it counts without another worker's copy of it).
    pub fn elsewhere(
        &self,
        datagram: &[u8],
        from: SocketAddr,
        peer_at: impl FnOnce(&SocketAddr) -> Option<PeerId>,
    ) -> Option<usize> {
        if self.workers == 1 || datagram.len() > self.max_datagram {
            return None;
        }
        let to = match shard_of(datagram, self.cid_len, self.shard_bits) {
            Some(shard) => shard,
            None if placed_by_address(datagram) => owner(peer_at(&from)?, self.workers),
            None => return None,
        };
        (to != self.worker && to < self.workers).then_some(to)
    }
}

/// What one worker hands another.
pub enum Handoff {
    /// A datagram read by a worker that does not own its association.
    Datagram {
        from: SocketAddr,
        bytes: Vec<u8>,
        arrived: Instant,
    },
    /// An initiation the reader authenticated, for the worker that owns its peer.
    Initiation {
        from: SocketAddr,
        peer: PeerId,
        accepted: AcceptedInitiation,
    },
}

/// One worker's inbox and the counters the metrics read of it.
#[derive(Default)]
pub struct Worker {
    inbox: Mutex<VecDeque<Handoff>>,
    /// Wakes the worker's loop; its peers hold it too.
    pub wake: Arc<Notify>,
    /// Datagrams its socket read.
    pub datagrams: AtomicU64,
    /// Of them, handed to another worker.
    pub handed_off: AtomicU64,
    /// Handoffs to it dropped because its inbox held [`INBOX_CAPACITY`].
    pub inbox_dropped: AtomicU64,
    /// Health probes asked of its loop ([`Workers::ask`]), and the last one its loop saw
    /// ([`Worker::answer`]): a loop that runs catches up within one pass.
    asked: AtomicU64,
    answered: AtomicU64,
}

impl Worker {
    /// Called by the worker's loop at the top of every pass.
    pub fn answer(&self) {
        self.answered
            .store(self.asked.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Every worker of the gateway, by number.
pub struct Workers {
    workers: Vec<Worker>,
}

impl Workers {
    /// `count` workers, the first waking through `first_wake` (the gateway's own wake-up,
    /// which a single worker keeps).
    pub fn new(count: usize, first_wake: Arc<Notify>) -> Workers {
        let workers = (0..count.max(1))
            .map(|i| Worker {
                wake: if i == 0 {
                    first_wake.clone()
                } else {
                    Arc::default()
                },
                ..Worker::default()
            })
            .collect();
        Workers { workers }
    }

    pub fn count(&self) -> usize {
        self.workers.len()
    }

    pub fn get(&self, i: usize) -> Option<&Worker> {
        self.workers.get(i)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Worker> {
        self.workers.iter()
    }

    /// The wake-up of the worker that owns `peer`.
    pub fn wake_of(&self, peer: PeerId) -> Arc<Notify> {
        self.workers[owner(peer, self.count())].wake.clone()
    }

    /// Asks every worker's loop to show that it runs, and wakes it: what each must answer,
    /// by worker (see [`Workers::unanswered`]).
    pub fn ask(&self) -> Vec<u64> {
        self.workers
            .iter()
            .map(|w| {
                let asked = w.asked.fetch_add(1, Ordering::Relaxed) + 1;
                w.wake.notify_one();
                asked
            })
            .collect()
    }

    /// The first worker whose loop has not yet answered what [`Workers::ask`] asked.
    pub fn unanswered(&self, asked: &[u64]) -> Option<usize> {
        self.workers
            .iter()
            .zip(asked)
            .position(|(w, &a)| w.answered.load(Ordering::Relaxed) < a)
    }

    /// Wakes every worker (a reload queued changes for each).
    pub fn wake_all(&self) {
        for w in &self.workers {
            w.wake.notify_one();
        }
    }

    /// Puts what `make` makes in worker `to`'s inbox and wakes it, unless the inbox is
    /// full (then nothing is made, and `to` counts the drop); `from` counts what it handed
    /// on. Whether it was taken.
    pub fn hand_off(&self, from: usize, to: usize, make: impl FnOnce() -> Handoff) -> bool {
        let Some(w) = self.workers.get(to) else {
            return false;
        };
        {
            let mut inbox = w.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if inbox.len() >= INBOX_CAPACITY {
                w.inbox_dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            inbox.push_back(make());
        }
        if let Some(f) = self.workers.get(from) {
            f.handed_off.fetch_add(1, Ordering::Relaxed);
        }
        w.wake.notify_one();
        true
    }

    /// Up to `max` of what was handed to worker `i`, oldest first, into `out`, so that a
    /// pass leaves room for the worker's own socket. Whether more waits.
    pub fn take_inbox(&self, i: usize, out: &mut Vec<Handoff>, max: usize) -> bool {
        let Some(w) = self.workers.get(i) else {
            return false;
        };
        let mut inbox = w.inbox.lock().unwrap_or_else(|p| p.into_inner());
        let n = inbox.len().min(max);
        out.extend(inbox.drain(..n));
        !inbox.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pep_transport::packet::{LONG_HEADER_BIT, LONG_TYPE_HANDSHAKE_REPLY, LONG_TYPE_HELLO};

    #[test]
    fn shard_bits_count_the_workers() {
        let bits: Vec<u8> = (1..=8).map(shard_bits).collect();
        assert_eq!(bits, [0, 1, 2, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn peers_go_round_the_workers_by_id() {
        let owners: Vec<usize> = (0..6).map(|i| owner(PeerId(i), 4)).collect();
        assert_eq!(owners, [0, 1, 2, 3, 0, 1]);
        assert_eq!(owner(PeerId(7), 1), 0);
    }

    #[test]
    fn a_datagram_goes_to_its_shard_s_worker_or_stays() {
        let from: SocketAddr = "198.18.0.2:7400".parse().expect("addr");
        let other: SocketAddr = "198.18.0.3:7400".parse().expect("addr");
        // Peer 3 is at `from`: worker 1 of 2 (and of 3: 3 mod 3 = 0).
        let peer_at = |a: &SocketAddr| (*a == from).then_some(PeerId(3));
        let at = |worker, workers| Place {
            worker,
            workers,
            cid_len: 2,
            shard_bits: shard_bits(workers),
            max_datagram: 1500,
        };
        let shard_1 = [0x40, 0x80, 0x00, 0xAA];
        assert_eq!(at(0, 2).elsewhere(&shard_1, from, peer_at), Some(1));
        assert_eq!(at(1, 2).elsewhere(&shard_1, from, peer_at), None);
        // Longer than any endpoint reads: not copied for another worker, the reader's
        // endpoint counts it.
        let mut long = vec![0x40, 0x80, 0x00];
        long.resize(1500, 0xAA);
        assert_eq!(at(0, 2).elsewhere(&long, from, peer_at), Some(1));
        long.push(0xAA);
        assert_eq!(at(0, 2).elsewhere(&long, from, peer_at), None);
        // Three workers: 2 shard bits; 0b10 names worker 2, 0b11 no worker (the reader's
        // endpoint counts it as an unknown connection ID).
        assert_eq!(at(0, 3).elsewhere(&shard_1, from, peer_at), Some(2));
        assert_eq!(at(0, 3).elsewhere(&[0x40, 0xC0, 0, 0], from, peer_at), None);
        // A HELLO goes to the owner of the peer configured at its source, if any.
        let hello = [LONG_HEADER_BIT | LONG_TYPE_HELLO, 0, 0, 0];
        assert_eq!(at(0, 2).elsewhere(&hello, from, peer_at), Some(1));
        assert_eq!(at(1, 2).elsewhere(&hello, from, peer_at), None);
        assert_eq!(at(1, 3).elsewhere(&hello, from, peer_at), Some(0));
        assert_eq!(at(0, 2).elsewhere(&hello, other, peer_at), None);
        // Initiations go to the owner of the peer known at their source, else are screened
        // where they land.
        let init = [LONG_HEADER_BIT | 0x02, 0x80, 0, 0];
        assert_eq!(at(0, 2).elsewhere(&init, from, peer_at), Some(1));
        assert_eq!(at(1, 2).elsewhere(&init, from, peer_at), None);
        assert_eq!(at(0, 2).elsewhere(&init, other, peer_at), None);
        // A REPLY to the hub's initiation goes to the shard it names, whatever its source.
        let reply = [
            LONG_HEADER_BIT | LONG_TYPE_HANDSHAKE_REPLY,
            0,
            0,
            0,
            2,
            0x80,
            0,
            0,
        ];
        assert_eq!(at(0, 2).elsewhere(&reply, other, peer_at), Some(1));
        assert_eq!(at(1, 2).elsewhere(&reply, other, peer_at), None);
        // One worker keeps everything.
        let single = Place {
            worker: 0,
            workers: 1,
            cid_len: 2,
            shard_bits: 0,
            max_datagram: 1500,
        };
        assert_eq!(single.elsewhere(&shard_1, from, peer_at), None);
        assert_eq!(single.elsewhere(&hello, from, peer_at), None);
    }

    #[test]
    fn initiators_keep_the_last_address_of_each_peer() {
        let a: SocketAddr = "198.18.0.2:7400".parse().expect("addr");
        let b: SocketAddr = "198.18.0.2:40001".parse().expect("addr");
        let mut known = Initiators::default();
        known.learn(a, PeerId(1));
        assert_eq!(known.get(&a), Some(PeerId(1)));
        // Its NAT moved it: the old address names nobody.
        known.learn(b, PeerId(1));
        assert_eq!((known.get(&a), known.get(&b)), (None, Some(PeerId(1))));
        // Another peer now at b: peer 1 has no address, so its next move leaves b alone.
        known.learn(b, PeerId(2));
        known.learn(a, PeerId(1));
        assert_eq!(
            (known.get(&a), known.get(&b)),
            (Some(PeerId(1)), Some(PeerId(2)))
        );
        known.learn(b, PeerId(2));
        assert_eq!(known.by_peer.len(), 2);
        assert_eq!(known.by_address.len(), 2);
    }

    fn datagram(byte: u8) -> Handoff {
        Handoff::Datagram {
            from: "198.18.0.2:7400".parse().expect("addr"),
            bytes: vec![byte],
            arrived: Instant::now(),
        }
    }

    fn bytes_of(h: &[Handoff]) -> Vec<u8> {
        h.iter()
            .filter_map(|h| match h {
                Handoff::Datagram { bytes, .. } => bytes.first().copied(),
                Handoff::Initiation { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_hand_off_reaches_the_inbox_and_is_counted_by_the_giver() {
        let workers = Workers::new(2, Arc::default());
        assert!(workers.hand_off(0, 1, || datagram(1)));
        let mut got = Vec::new();
        assert!(!workers.take_inbox(0, &mut got, 64));
        assert!(got.is_empty());
        assert!(!workers.take_inbox(1, &mut got, 64));
        assert_eq!(bytes_of(&got), [1]);
        let count = |i: usize| {
            let w = workers.get(i).expect("worker");
            w.handed_off.load(Ordering::Relaxed)
        };
        assert_eq!((count(0), count(1)), (1, 0));
        workers.take_inbox(1, &mut got, 64);
        assert_eq!(got.len(), 1, "taken once");
    }

    #[test]
    fn a_full_inbox_drops_and_counts_without_making_the_copy() {
        let workers = Workers::new(2, Arc::default());
        for i in 0..INBOX_CAPACITY {
            assert!(workers.hand_off(0, 1, || datagram(i as u8)));
        }
        let made = std::cell::Cell::new(false);
        let taken = workers.hand_off(0, 1, || {
            made.set(true);
            datagram(0)
        });
        assert!(!taken);
        assert!(!made.get(), "nothing copied for a full inbox");
        let w = |i: usize| workers.get(i).expect("worker");
        assert_eq!(w(1).inbox_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(w(0).inbox_dropped.load(Ordering::Relaxed), 0);
        assert_eq!(
            w(0).handed_off.load(Ordering::Relaxed),
            INBOX_CAPACITY as u64
        );
    }

    #[test]
    fn an_inbox_is_taken_a_batch_at_a_time_oldest_first() {
        let workers = Workers::new(2, Arc::default());
        for i in 0..5 {
            workers.hand_off(0, 1, || datagram(i));
        }
        let mut got = Vec::new();
        assert!(workers.take_inbox(1, &mut got, 2), "more waits");
        assert_eq!(bytes_of(&got), [0, 1]);
        got.clear();
        assert!(workers.take_inbox(1, &mut got, 2));
        assert!(!workers.take_inbox(1, &mut got, 2), "the last one taken");
        assert_eq!(bytes_of(&got), [2, 3, 4]);
    }
}
