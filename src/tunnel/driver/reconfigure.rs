//! The driver's half of a reload that adds or removes peers: the endpoint's peer table,
//! the associations, the carrier scheduler's members and each peer's quota of the memory
//! budget follow the gateway's new table, and nothing of the peers that stay is touched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use pep_transport::{Association, Event, PeerId, ResetReason};
use tracing::{info, warn};

use super::Driver;
use crate::tunnel::outbox::Outbox;
use crate::tunnel::peer::AssociationState;
use crate::tunnel::peer::Peer;
use crate::tunnel::peer_table::NewPeer;

/// Why a removed peer's flows end: its clients see a reset, as for a failed connect.
const REMOVED: ResetReason = ResetReason::Aborted;

impl Driver {
    /// Applies the peer changes queued since the last pass; true if the peers changed. A
    /// removed peer's CLOSE joins `tx`.
    pub(super) fn apply_peer_changes(&mut self, now: Instant, tx: &mut Outbox) -> bool {
        let Some((changes, all)) = self.gateway.peers.take_changes(self.worker) else {
            return false;
        };
        let table = super::own_view(&all, self.worker, self.gateway.workers.count());
        for change in changes {
            for peer in &change.removed {
                self.remove_peer(now, peer, tx);
            }
            for peer in change.added {
                self.add_peer(now, peer);
            }
        }
        let deadlines: HashMap<PeerId, Option<Instant>> = self
            .table
            .peers
            .iter()
            .zip(&self.deadlines)
            .map(|(l, d)| (l.id, *d))
            .collect();
        self.deadlines = table
            .peers
            .iter()
            .map(|l| match deadlines.get(&l.id) {
                Some(d) => *d,
                None => l.lock().assoc.as_ref().and_then(Association::poll_timeout),
            })
            .collect();
        if let Some(allowed) = self.allowed.as_mut() {
            // Any peer's datagram may reach any worker's socket (and be handed on).
            *allowed = all.specs.iter().filter_map(|p| p.address).collect();
        }
        // The budget is the gateway's: each peer's quota of it follows the number of peers.
        let memory = &self.gateway.memory;
        let budget = memory.budget();
        let quota = crate::tunnel::memory::peer_send_quota(budget, all.peers.len());
        for l in &table.peers {
            l.set_send_budget(quota);
        }
        memory.set_receive_reserve(crate::tunnel::memory::receive_reserve(
            budget,
            self.factory.configs(),
        ));
        self.table = table;
        self.all = all;
        self.cursor = 0;
        true
    }

    /// Whether this driver's worker serves `peer`.
    fn owns(&self, peer: pep_transport::PeerId) -> bool {
        crate::tunnel::workers::owner(peer, self.gateway.workers.count()) == self.worker
    }

    /// Takes the peer out of the endpoint and the carrier, closes its association (one
    /// CLOSE tells the peer) and resets its flows.
    fn remove_peer(&mut self, now: Instant, peer: &Arc<Peer>, tx: &mut Outbox) {
        let id = peer.id;
        if let Some(handle) = self.endpoint.remove_peer(id).and_then(|r| r.association) {
            self.by_handle.remove(&handle);
        }
        self.factory.peers.remove(&id);
        if let Some(share) = self.share.as_mut() {
            share.remove(id);
        }
        if !self.owns(id) {
            // Every endpoint forgets the peer; its owner closes the association.
            return;
        }
        let mut st = peer.lock();
        let mut last_stats = None;
        if let Some(mut assoc) = st.assoc.take() {
            assoc.close(0, "peer removed from the configuration");
            let mut buf = Vec::new();
            if let Some(to) = assoc.poll_transmit_to(now, &mut buf) {
                tx.push(to, &buf, now);
            }
            while let Some(ev) = assoc.poll_event() {
                if let Event::FlowReset { flow, reason } = ev {
                    peer.counters.flow_resets.add(reason);
                    st.flow_reset(flow, reason);
                }
            }
            last_stats = Some(assoc.stats());
        }
        // Flows the association no longer had a record of end too: nothing carries them.
        st.reset_all_flows(REMOVED);
        st.report_send(&peer.memory);
        drop(st);
        self.set_state(peer, AssociationState::Closed);
        self.gateway.retire(peer, last_stats);
        info!(peer = %peer.name, "peer removed: its association is closed and its flows reset");
    }

    /// Puts the peer into the endpoint and the carrier, and makes its association now if
    /// its address is configured and the hub is not redundant (else on its first
    /// initiation).
    fn add_peer(&mut self, now: Instant, peer: NewPeer) {
        let NewPeer {
            peer,
            spec,
            identity,
            settings,
            carrier_overhead,
        } = peer;
        let id = peer.id;
        if let Err(e) = self.endpoint.add_peer(id, identity) {
            warn!(peer = %peer.name, error = %e, "peer not added");
            return;
        }
        self.factory.peers.insert(id, settings);
        if !self.owns(id) {
            // Every endpoint learns the peer, so any worker can screen its initiations; its
            // owner makes the association and schedules it on the carrier.
            return;
        }
        if let Some(share) = self.share.as_mut() {
            share.add(id, &spec, carrier_overhead);
        }
        if self.factory.makes_up_front(spec.address) {
            match self.factory.make(&mut self.endpoint, now, id) {
                Ok((handle, assoc)) => {
                    peer.lock().assoc = Some(assoc);
                    self.by_handle.insert(handle, id);
                }
                Err(e) => {
                    warn!(peer = %peer.name, key = e.key, why = e.why, "cannot make the association");
                }
            }
        }
        peer.wake();
        info!(peer = %peer.name, "peer added");
    }
}
