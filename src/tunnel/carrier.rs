//! A hub's forward carrier (`[link] tx_rate`) shared between its terminals: each peer holds
//! at most one datagram its association produced, and the [`CarrierScheduler`] picks whose
//! leaves next, so every terminal gets its `min_rate` when it has data, the rest goes by
//! `weight`, and none exceeds its `tx_rate`. Every [`REFRESH`] each association is capped at
//! what the scheduler allocates it, so its controller paces near its share instead of
//! finding the share as a queue in front of the carrier.
//!
//! A hub whose peers spread over workers has one [`CarrierShare`] per worker, each over its
//! own peers. Every peer's share, its ceiling, is what one scheduler over all the peers
//! would allocate it ([`split`]), whichever worker serves it; a worker schedules its peers
//! on their shares added up, and a pacer all of them book ([`SharedCarrier`]) keeps the
//! workers' sum at the carrier while the shares follow the demand.

mod split;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pep_transport::{CarrierScheduler, Counted, MemberId, MemberRates, Pacer, PeerId, Shares};

use crate::config::PeerSpec;

// A member that staged a datagram within the scheduler's activity window is not new to the
// carrier: one that was not has its worker's part follow at once.
use pep_transport::ACTIVITY_WINDOW as ACTIVE;

/// The carrier as the workers share it: one pacer every datagram of every worker is
/// booked on, and the members each worker last published.
pub struct SharedCarrier {
    pacer: Mutex<Pacer>,
    board: Mutex<split::Board>,
}

impl SharedCarrier {
    pub fn new(carrier_bps: u64, mtu: usize, burst: Duration, workers: usize) -> Arc<Self> {
        Arc::new(SharedCarrier {
            pacer: Mutex::new(Pacer::new(carrier_bps, mtu).with_burst(burst)),
            board: Mutex::new(split::Board::new(workers)),
        })
    }

    fn pacer(&self) -> std::sync::MutexGuard<'_, Pacer> {
        self.pacer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `worker`'s members that count at `now` (`own`) and returns the shares of
    /// `carrier_bps` between every worker's; `counting` is scratch space.
    fn shares(
        &self,
        now: Instant,
        worker: usize,
        own: &[Counted],
        carrier_bps: u64,
        counting: &mut Vec<MemberRates>,
    ) -> Shares {
        {
            let mut p = self.pacer();
            if p.rate_bps() != carrier_bps {
                p.set_rate(carrier_bps);
            }
        }
        {
            let mut board = self.board.lock().unwrap_or_else(|p| p.into_inner());
            board.publish(worker, own);
            board.counting(now, counting);
        }
        // The water-filling sorts: outside the lock the other workers take.
        Shares::of(carrier_bps, counting)
    }
}

/// How often the associations' ceilings follow the allocations (the scheduler recomputes
/// them at this pace too).
pub const REFRESH: Duration = Duration::from_millis(100);

/// The least part of `carrier_bps` a worker schedules on: one `mtu` datagram a
/// [`REFRESH`]. The split may leave a worker nothing (the others' min_rates fill the
/// carrier), and its scheduler would then book a datagram at 1 bit/s, hours ahead, which
/// no later part undoes; at this rate a booking ends before the part is looked at again.
/// The shared pacer keeps the workers' sum to the carrier all the same.
fn least_part(mtu: usize, carrier_bps: u64) -> u64 {
    let per_refresh = (mtu as u64 * 8).saturating_mul(1000) / REFRESH.as_millis() as u64;
    per_refresh.min(carrier_bps)
}

/// A datagram produced by a peer's association, waiting for its turn on the carrier.
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
    /// When it last staged a datagram.
    active_at: Option<Instant>,
}

pub struct CarrierShare {
    sched: CarrierScheduler,
    /// By peer: a reload may add and remove peers, and the others keep their place.
    members: HashMap<PeerId, Member>,
    peer_of: HashMap<MemberId, PeerId>,
    next_refresh: Option<Instant>,
    /// With workers: the carrier they share, and this one's number.
    shared: Option<(Arc<SharedCarrier>, usize)>,
    /// The carrier's rate as last set (of which `sched` has this worker's part).
    carrier_bps: u64,
    /// The largest datagram, which sets a worker's least part ([`least_part`]).
    mtu: usize,
    /// On a worker: the shares between all workers' members as last computed, which set
    /// its peers' ceilings.
    shares: Option<Shares>,
    /// Scratch for [`follow_demand`](Self::follow_demand): this worker's members that count,
    /// and every worker's.
    counted: Vec<Counted>,
    counting: Vec<MemberRates>,
}

impl CarrierShare {
    /// A carrier of `carrier_bps` with no member yet.
    pub fn new(carrier_bps: u64, mtu: usize, burst: Duration) -> CarrierShare {
        CarrierShare {
            // A peer's turn may fill one segmented send (the driver's outbox joins the
            // datagrams released to one peer at one instant).
            sched: CarrierScheduler::new(carrier_bps, mtu)
                .with_burst(burst)
                .with_turns_up_to(crate::tunnel::outbox::MAX_SEND_BYTES),
            members: HashMap::new(),
            peer_of: HashMap::new(),
            next_refresh: None,
            shared: None,
            carrier_bps,
            mtu,
            shares: None,
            counted: Vec::new(),
            counting: Vec::new(),
        }
    }

    /// This share is worker `worker`'s part of `carrier`.
    pub fn on_worker(mut self, carrier: Arc<SharedCarrier>, worker: usize) -> CarrierShare {
        self.shared = Some((carrier, worker));
        self
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
                active_at: None,
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

    /// Holds `peer`'s next datagram, produced at `now`, until the scheduler gives it its
    /// turn.
    pub fn stage(&mut self, now: Instant, peer: PeerId, to: SocketAddr, buf: Vec<u8>) {
        let Some(m) = self.members.get_mut(&peer) else {
            return;
        };
        let woke = m
            .active_at
            .is_none_or(|t| now.saturating_duration_since(t) > ACTIVE);
        m.active_at = Some(now);
        m.staged = Some(Staged { to, buf });
        self.sched.wake(m.id);
        if woke && self.shared.is_some() {
            // Its worker's part follows at once (with its share in it), the others' at
            // their next refresh; the ceilings keep their own pace.
            self.follow_demand(now);
        }
    }

    /// The peer whose datagram leaves now, with the datagram, booked on the carrier; `None`
    /// while none may (see [`poll_timeout`](Self::poll_timeout)).
    pub fn next(&mut self, now: Instant) -> Option<(PeerId, SocketAddr, Vec<u8>)> {
        if let Some((carrier, _)) = &self.shared {
            if carrier.pacer().delay_until(now).is_some() {
                return None;
            }
        }
        let CarrierShare {
            sched,
            peer_of,
            members,
            shared,
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
        if let Some((carrier, _)) = shared {
            carrier.pacer().on_sent(now, bytes as u64);
        }
        Some((peer, datagram.to, datagram.buf))
    }

    /// When [`next`](Self::next) may return a datagram; `None` while none is staged.
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        let own = self.sched.poll_timeout(now)?;
        let shared = self
            .shared
            .as_ref()
            .and_then(|(c, _)| c.pacer().delay_until(now));
        Some(shared.map_or(own, |s| s.max(own)))
    }

    /// Whether the associations' ceilings are due to follow the allocations.
    pub fn refresh_due(&self, now: Instant) -> bool {
        self.next_refresh.is_none_or(|t| t <= now)
    }

    /// The carrier's rate as `[link] tx_rate` says now (a reload may have changed it); on
    /// a worker, its part of it as the workers' demand at `now` has it.
    pub fn set_carrier(&mut self, now: Instant, carrier_bps: u64) {
        self.carrier_bps = carrier_bps;
        self.follow_demand(now);
    }

    /// The scheduler's carrier: the whole, or this worker's part as the demand is at `now`.
    fn follow_demand(&mut self, now: Instant) {
        let carrier_bps = self.carrier_bps;
        let rate = match &self.shared {
            Some((carrier, worker)) => {
                self.sched.counted(now, &mut self.counted);
                let shares =
                    carrier.shares(now, *worker, &self.counted, carrier_bps, &mut self.counting);
                self.shares = Some(shares);
                let (members, peer_of) = (&self.members, &self.peer_of);
                let own = self
                    .counted
                    .iter()
                    .filter_map(|c| Some(&members.get(peer_of.get(&c.id)?)?.rates));
                split::part(&shares, carrier_bps, own).max(least_part(self.mtu, carrier_bps))
            }
            None => carrier_bps,
        };
        if self.sched.carrier_bps() != rate {
            self.sched.set_carrier_rate(rate);
        }
    }

    /// `peer`'s ceiling now: its allocation (on a worker, its share between all workers'
    /// members), at most `mir_bps` (its association's configured rate, which a reload may
    /// have changed since the scheduler last heard of it).
    pub fn ceiling(&mut self, peer: PeerId, mir_bps: u64) -> u64 {
        let Some(m) = self.members.get_mut(&peer) else {
            return mir_bps;
        };
        if m.rates.mir_bps != mir_bps {
            m.rates.mir_bps = mir_bps;
            self.sched.set_rates(m.id, m.rates);
        }
        match &self.shares {
            Some(shares) => shares.allocation(&m.rates).min(mir_bps),
            None => self.sched.allocation(m.id).min(mir_bps),
        }
    }

    /// `peer`'s rates as the scheduler has them (its MIR as of the last [`ceiling`](Self::ceiling)).
    pub fn rates(&self, peer: PeerId) -> Option<MemberRates> {
        self.members.get(&peer).map(|m| m.rates)
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

#[cfg(test)]
mod tests;
