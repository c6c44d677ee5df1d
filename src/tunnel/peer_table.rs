//! The gateway's running set of peers: the table relays and the metrics read (links, specs,
//! routes, by stable id), and the changes a reload hands the driver, which owns the endpoint
//! and the carrier scheduler and applies them there.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pep_transport::security::SecurityConfig;
use pep_transport::{Config, PeerId, PeerIdentity};

use crate::config::PeerSpec;
use crate::tunnel::conn::PeerLink;
use crate::tunnel::routes::Routes;

/// The peers at one instant, in the config's order. A reload replaces the whole table; a
/// holder of the old one sees a consistent set until it looks again.
pub struct PeerTable {
    pub links: Vec<Arc<PeerLink>>,
    /// By place, as `links`.
    pub specs: Vec<PeerSpec>,
    pub routes: Routes,
    position: HashMap<PeerId, usize>,
}

impl PeerTable {
    /// `specs[i]` is `links[i]`'s.
    pub fn new(links: Vec<Arc<PeerLink>>, specs: Vec<PeerSpec>) -> PeerTable {
        let routes = Routes::new(links.iter().map(|l| l.peer).zip(&specs));
        let position = links.iter().enumerate().map(|(i, l)| (l.peer, i)).collect();
        PeerTable {
            links,
            specs,
            routes,
            position,
        }
    }

    /// Where peer `id` is in `links`, while it is configured.
    pub fn position(&self, id: PeerId) -> Option<usize> {
        self.position.get(&id).copied()
    }

    pub fn link(&self, id: PeerId) -> Option<&Arc<PeerLink>> {
        self.links.get(self.position(id)?)
    }

    /// The link an intercepted connection to `server` goes to, if any.
    pub fn route(&self, server: IpAddr) -> Option<&Arc<PeerLink>> {
        self.link(self.routes.lookup(server)?)
    }

    /// The peers worker `worker` of `workers` serves (all of them with one worker).
    pub fn of_worker(&self, worker: usize, workers: usize) -> PeerTable {
        let (links, specs) = self
            .links
            .iter()
            .zip(&self.specs)
            .filter(|(l, _)| crate::tunnel::workers::owner(l.peer, workers) == worker)
            .map(|(l, s)| (l.clone(), s.clone()))
            .unzip();
        PeerTable::new(links, specs)
    }

    /// The id after every peer's here, for the peers a reload adds.
    fn next_id(&self) -> u32 {
        self.links.iter().map(|l| l.peer.0 + 1).max().unwrap_or(0)
    }
}

/// How the driver makes a peer's association.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    pub config: Config,
    /// `None` with `security.mode = "none"`.
    pub security: Option<SecurityConfig>,
}

/// A peer a reload added: its link is in the new table already, without an association.
#[derive(Clone)]
pub struct NewPeer {
    pub link: Arc<PeerLink>,
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
    pub removed: Vec<Arc<PeerLink>>,
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
