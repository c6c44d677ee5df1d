//! The gateway's running set of peers: the table relays and the metrics read (peers, specs,
//! routes, by stable id), and the changes a reload hands the driver, which owns the endpoint
//! and the carrier scheduler and applies them there.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pep_transport::security::SecurityConfig;
use pep_transport::{Config, PeerId, PeerIdentity};

use crate::config::PeerSpec;
use crate::tunnel::peer::Peer;
use crate::tunnel::routes::Routes;

/// The peers at one instant, in the config's order. A reload replaces the whole table; a
/// holder of the old one sees a consistent set until it looks again.
pub struct PeerTable {
    pub peers: Vec<Arc<Peer>>,
    /// By place, as `peers`.
    pub specs: Vec<PeerSpec>,
    pub routes: Routes,
    position: HashMap<PeerId, usize>,
}

impl PeerTable {
    /// `specs[i]` is `peers[i]`'s.
    pub fn new(peers: Vec<Arc<Peer>>, specs: Vec<PeerSpec>) -> PeerTable {
        let routes = Routes::new(peers.iter().map(|l| l.id).zip(&specs));
        let position = peers.iter().enumerate().map(|(i, l)| (l.id, i)).collect();
        PeerTable {
            peers,
            specs,
            routes,
            position,
        }
    }

    /// Where peer `id` is in `peers`, while it is configured.
    pub fn position(&self, id: PeerId) -> Option<usize> {
        self.position.get(&id).copied()
    }

    pub fn peer(&self, id: PeerId) -> Option<&Arc<Peer>> {
        self.peers.get(self.position(id)?)
    }

    /// The peer an intercepted connection to `server` goes to, if any.
    pub fn route(&self, server: IpAddr) -> Option<&Arc<Peer>> {
        self.peer(self.routes.lookup(server)?)
    }

    /// The peers worker `worker` of `workers` serves (all of them with one worker).
    pub fn of_worker(&self, worker: usize, workers: usize) -> PeerTable {
        let (peers, specs) = self
            .peers
            .iter()
            .zip(&self.specs)
            .filter(|(l, _)| crate::tunnel::workers::owner(l.id, workers) == worker)
            .map(|(l, s)| (l.clone(), s.clone()))
            .unzip();
        PeerTable::new(peers, specs)
    }

    /// The id after every peer's here, for the peers a reload adds.
    fn next_id(&self) -> u32 {
        self.peers.iter().map(|l| l.id.0 + 1).max().unwrap_or(0)
    }
}

/// How the driver makes a peer's association.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    pub config: Config,
    /// `None` with `security.mode = "none"`.
    pub security: Option<SecurityConfig>,
}

/// A peer a reload added: its [`Peer`] is in the new table already, without an association.
#[derive(Clone)]
pub struct NewPeer {
    pub peer: Arc<Peer>,
    pub spec: PeerSpec,
    pub identity: PeerIdentity,
    pub settings: PeerSettings,
    /// What a datagram of its association costs on the carrier beyond its bytes.
    pub carrier_overhead: usize,
}

/// What one reload changed in the set of peers, for the driver: the peers to take out of
/// the endpoint and the scheduler (their flows reset) and the ones to put in.
#[derive(Clone)]
pub struct PeerChange {
    pub removed: Vec<Arc<Peer>>,
    pub added: Vec<NewPeer>,
}

/// The table and the changes not yet applied by the driver, behind one lock so that the
/// driver always finds the table that matches the changes it took.
pub struct PeerSet {
    table: RwLock<Arc<PeerTable>>,
    pending: Mutex<Pending>,
    /// By worker, set with a queued change: each driver looks on every pass, without the
    /// lock.
    changed: Vec<AtomicBool>,
}

struct Pending {
    /// By worker: every worker applies every change (each endpoint knows every peer).
    changes: Vec<Vec<PeerChange>>,
    /// Never goes down: a removed peer's id is not given to another.
    next_id: u32,
}

impl PeerSet {
    /// `table` served by `workers` drivers.
    pub fn new(table: PeerTable, workers: usize) -> PeerSet {
        let next_id = table.next_id();
        let workers = workers.max(1);
        PeerSet {
            table: RwLock::new(Arc::new(table)),
            pending: Mutex::new(Pending {
                changes: (0..workers).map(|_| Vec::new()).collect(),
                next_id,
            }),
            changed: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    pub fn table(&self) -> Arc<PeerTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// An id no peer of this process had.
    pub fn fresh_id(&self) -> PeerId {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let id = PeerId(p.next_id);
        p.next_id += 1;
        id
    }

    /// Installs `table` and queues `change` for the driver: from now on connections are
    /// routed by the new table, while the endpoint follows at the driver's next pass.
    pub fn replace(&self, table: PeerTable, change: PeerChange) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
        for (queue, changed) in p.changes.iter_mut().zip(&self.changed) {
            queue.push(change.clone());
            changed.store(true, Ordering::Release);
        }
    }

    /// The changes queued for `worker` since its last call, with the table they lead to;
    /// `None` if none.
    pub fn take_changes(&self, worker: usize) -> Option<(Vec<PeerChange>, Arc<PeerTable>)> {
        if !self.changed.get(worker)?.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let queue = p.changes.get_mut(worker)?;
        if queue.is_empty() {
            return None;
        }
        Some((std::mem::take(queue), self.table()))
    }
}
