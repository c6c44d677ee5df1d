//! A hub's forward carrier (`[link] tx_rate`) shared between its terminals: each peer holds
//! at most one datagram its association produced, and the [`CarrierScheduler`] picks whose
//! leaves next, so every terminal gets its `min_rate` when it has data, the rest goes by
//! `weight`, and none exceeds its `tx_rate`. Every [`REFRESH`] each association is capped at
//! what the scheduler allocates it, so its controller paces near its share instead of
//! finding the share as a queue in front of the carrier.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::{CarrierScheduler, MemberId, MemberRates, PeerId};

use crate::config::PeerSpec;

/// How often the associations' ceilings follow the allocations (the scheduler recomputes
/// them at this pace too).
pub const REFRESH: Duration = Duration::from_millis(100);

/// A datagram produced by a link's association, waiting for its turn on the carrier.
struct Staged {
    to: SocketAddr,
    buf: Vec<u8>,
}

/// One peer on the carrier.
struct Member {
    id: MemberId,
    /// The rates last given to the scheduler.
    rates: MemberRates,
    /// Bytes a datagram costs on the carrier beyond its UDP payload.
    overhead: usize,
    staged: Option<Staged>,
}

pub struct CarrierShare {
    sched: CarrierScheduler,
    /// By peer: a reload may add and remove peers, and the others keep their place.
    members: HashMap<PeerId, Member>,
    peer_of: HashMap<MemberId, PeerId>,
    next_refresh: Option<Instant>,
}

impl CarrierShare {
    /// A carrier of `carrier_bps` with no member yet.
    pub fn new(carrier_bps: u64, mtu: usize, burst: Duration) -> CarrierShare {
        CarrierShare {
            sched: CarrierScheduler::new(carrier_bps, mtu).with_burst(burst),
            members: HashMap::new(),
            peer_of: HashMap::new(),
            next_refresh: None,
        }
    }

    /// `peer` shares the carrier from now on, at its `tx_rate`, `min_rate` and `weight`;
    /// `overhead`: what a datagram of it costs on the wire beyond its bytes.
    pub fn add(&mut self, peer: PeerId, spec: &PeerSpec, overhead: usize) {
        self.remove(peer);
        let rates = MemberRates {
            cir_bps: spec.min_bps,
            mir_bps: spec.tx_bps,
            weight: spec.weight,
        };
        let id = self.sched.add_member(rates);
        self.peer_of.insert(id, peer);
        self.members.insert(
            peer,
            Member {
                id,
                rates,
                overhead,
                staged: None,
            },
        );
        // The others' allocations follow at the next refresh.
        self.next_refresh = None;
    }

    /// `peer` no longer shares the carrier; a datagram it had staged is dropped.
    pub fn remove(&mut self, peer: PeerId) {
        if let Some(m) = self.members.remove(&peer) {
            self.peer_of.remove(&m.id);
            self.sched.remove(m.id);
            self.next_refresh = None;
        }
    }

    /// Whether `peer` has a datagram waiting (and so needs no other produced yet).
    pub fn is_staged(&self, peer: PeerId) -> bool {
        self.members.get(&peer).is_some_and(|m| m.staged.is_some())
    }

    /// Holds `peer`'s next datagram until the scheduler gives it its turn.
    pub fn stage(&mut self, peer: PeerId, to: SocketAddr, buf: Vec<u8>) {
        let Some(m) = self.members.get_mut(&peer) else {
            return;
        };
        m.staged = Some(Staged { to, buf });
        self.sched.wake(m.id);
    }

    /// The peer whose datagram leaves now, with the datagram, booked on the carrier; `None`
    /// while none may (see [`poll_timeout`](Self::poll_timeout)).
    pub fn next(&mut self, now: Instant) -> Option<(PeerId, SocketAddr, Vec<u8>)> {
        let CarrierShare {
            sched,
            peer_of,
            members,
            ..
        } = self;
        let cost =
            |m: &Member| -> Option<usize> { Some(m.staged.as_ref()?.buf.len() + m.overhead) };
        let member = sched.next(now, |id| cost(members.get(peer_of.get(&id)?)?))?;
        let peer = *peer_of.get(&member)?;
        let m = members.get_mut(&peer)?;
        let bytes = cost(m)?;
        let datagram = m.staged.take()?;
        sched.on_sent(now, member, bytes);
        Some((peer, datagram.to, datagram.buf))
    }

    /// When [`next`](Self::next) may return a datagram; `None` while none is staged.
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        self.sched.poll_timeout(now)
    }

    /// Whether the associations' ceilings are due to follow the allocations.
    pub fn refresh_due(&self, now: Instant) -> bool {
        self.next_refresh.is_none_or(|t| t <= now)
    }

    /// The carrier's rate as `[link] tx_rate` says now (a reload may have changed it).
    pub fn set_carrier(&mut self, carrier_bps: u64) {
        if self.sched.carrier_bps() != carrier_bps {
            self.sched.set_carrier_rate(carrier_bps);
        }
    }

    /// `peer`'s ceiling now: its allocation, at most `mir_bps` (its association's configured
    /// rate, which a reload may have changed since the scheduler last heard of it).
    pub fn ceiling(&mut self, peer: PeerId, mir_bps: u64) -> u64 {
        let Some(m) = self.members.get_mut(&peer) else {
            return mir_bps;
        };
        if m.rates.mir_bps != mir_bps {
            m.rates.mir_bps = mir_bps;
            self.sched.set_rates(m.id, m.rates);
        }
        self.sched.allocation(m.id).min(mir_bps)
    }

    /// `peer`'s CIR and weight as a reload changed them; its flows carry on.
    pub fn set_share_rates(&mut self, peer: PeerId, min_bps: u64, weight: u32) {
        let Some(m) = self.members.get_mut(&peer) else {
            return;
        };
        m.rates.cir_bps = min_bps;
        m.rates.weight = weight;
        self.sched.set_rates(m.id, m.rates);
    }

    /// The ceilings were refreshed at `now`.
    pub fn refreshed(&mut self, now: Instant) {
        self.next_refresh = Some(now + REFRESH);
    }
}
