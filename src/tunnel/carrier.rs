//! A hub's forward carrier (`[link] tx_rate`) shared between its terminals: each peer holds
//! at most one datagram its association produced, and the [`CarrierScheduler`] picks whose
//! leaves next, so every terminal gets its `min_rate` when it has data, the rest goes by
//! `weight`, and none exceeds its `tx_rate`. Every [`REFRESH`] each association is capped at
//! what the scheduler allocates it, so its controller paces near its share instead of
//! finding the share as a queue in front of the carrier.
//!
//! A hub whose peers spread over workers has one [`CarrierShare`] per worker, each over its
//! own peers, on its part of the carrier ([`split`]); a pacer all of them book
//! ([`SharedCarrier`]) keeps their sum at the carrier while the parts follow the demand.

mod split;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pep_transport::{CarrierScheduler, MemberId, MemberRates, Pacer, PeerId};

use crate::config::PeerSpec;
pub use split::Demand;

// A member that staged a datagram within the scheduler's activity window counts in its
// worker's demand, and a worker tells the others its active peers need up to the scheduler's
// headroom times what they sent lately: the split between workers follows the same rules as
// the split between members.
use pep_transport::{ACTIVITY_WINDOW as ACTIVE, DEMAND_HEADROOM};

/// The carrier as the workers share it: one pacer every datagram of every worker is
/// booked on, and each worker's demand as it last published it.
pub struct SharedCarrier {
    pacer: Mutex<Pacer>,
    /// By worker: its active peers' demand, and when the last of them stops counting as
    /// active unless it sends again. A worker's loop may sleep long after its last send
    /// (a keepalive), so what it published expires by itself.
    demand: Mutex<Vec<(Demand, Instant)>>,
}

impl SharedCarrier {
    pub fn new(carrier_bps: u64, mtu: usize, burst: Duration, workers: usize) -> Arc<Self> {
        Arc::new(SharedCarrier {
            pacer: Mutex::new(Pacer::new(carrier_bps, mtu).with_burst(burst)),
            demand: Mutex::new(vec![(Demand::default(), Instant::now()); workers.max(1)]),
        })
    }

    fn pacer(&self) -> std::sync::MutexGuard<'_, Pacer> {
        self.pacer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `worker`'s demand at `now` (`told`, valid until `until`) and returns its
    /// part of `carrier_bps`, as it sees its own demand: `own` (its active peers' MIRs), or
    /// `idle` (every peer's) while none is active.
    fn part(
        &self,
        now: Instant,
        worker: usize,
        (told, until): (Demand, Instant),
        own: Demand,
        idle: Demand,
        carrier_bps: u64,
    ) -> u64 {
        {
            let mut p = self.pacer();
            if p.rate_bps() != carrier_bps {
                p.set_rate(carrier_bps);
            }
        }
        let mut d = self.demand.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = d.get_mut(worker) {
            *slot = (told, until);
        }
        let mut view: Vec<Demand> = d
            .iter()
            .map(|&(demand, until)| {
                if until > now {
                    demand
                } else {
                    Demand::default()
                }
            })
            .collect();
        // A worker takes what its peers may use: one speeding up is not held to what it
        // told the others, and one none of whose peers is active counts as if all were, so
        // the first of them to wake up is not held to nothing until the next refresh. The
        // shared pacer keeps the sum to the carrier meanwhile.
        if let Some(slot) = view.get_mut(worker) {
            *slot = if own.weight == 0 { idle } else { own };
        }
        split::part(carrier_bps, &view, worker)
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
    /// What it staged lately, for what its worker tells the others it needs.
    recent: Recent,
}

/// Bytes staged in the current and the previous [`ACTIVE`] window.
#[derive(Default)]
struct Recent {
    since: Option<Instant>,
    now: u64,
    before: u64,
}

impl Recent {
    fn add(&mut self, at: Instant, bytes: usize) {
        match self.since {
            Some(t) if at.saturating_duration_since(t) < ACTIVE => {}
            Some(t) if at.saturating_duration_since(t) < 2 * ACTIVE => {
                self.before = self.now;
                self.now = 0;
                self.since = Some(t + ACTIVE);
            }
            _ => {
                self.before = 0;
                self.now = 0;
                self.since = Some(at);
            }
        }
        self.now += bytes as u64;
    }

    /// The rate of the busier window, in bit/s.
    fn rate_bps(&self) -> u64 {
        self.now.max(self.before).saturating_mul(8 * 1000) / ACTIVE.as_millis() as u64
    }
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
                recent: Recent::default(),
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
        m.recent.add(now, buf.len() + m.overhead);
        m.staged = Some(Staged { to, buf });
        self.sched.wake(m.id);
        if woke && self.shared.is_some() {
            // Its worker's part follows at once, the others' at their next refresh; the
            // ceilings keep their own pace.
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
                let (told, own, all) = self.demand(now);
                let part = carrier.part(now, *worker, told, own, all, carrier_bps);
                part.max(least_part(self.mtu, carrier_bps))
            }
            None => carrier_bps,
        };
        if self.sched.carrier_bps() != rate {
            self.sched.set_carrier_rate(rate);
        }
    }

    /// What the members active at `now` need of the carrier, as the other workers are told
    /// (each at most [`DEMAND_HEADROOM`] times what it sent lately, so a peer that only
    /// sends keepalives takes nothing from another worker's), and until when the last of
    /// them stays active; what they may take as this worker sees it (their MIRs); and what
    /// all its members would.
    fn demand(&self, now: Instant) -> ((Demand, Instant), Demand, Demand) {
        let mut told = Demand::default();
        let mut own = Demand::default();
        let mut until = now;
        let mut all = Demand::default();
        for m in self.members.values() {
            all.add(&m.rates);
            if let Some(end) = m.active_at.map(|t| t + ACTIVE).filter(|&end| end > now) {
                own.add(&m.rates);
                let mut needs = m.rates;
                let lately = m.recent.rate_bps().saturating_mul(DEMAND_HEADROOM);
                needs.mir_bps = needs.mir_bps.min(lately.max(needs.cir_bps));
                told.add(&needs);
                until = until.max(end);
            }
        }
        ((told, until), own, all)
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

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1_000_000;

    fn spec(weight: u32) -> PeerSpec {
        PeerSpec {
            name: format!("w{weight}"),
            public_key: None,
            address: None,
            subnets: Vec::new(),
            tx_bps: 100 * M,
            rx_bps: 100 * M,
            min_bps: 0,
            weight,
            keepalive: Duration::from_secs(5),
            max_flows: 100,
        }
    }

    /// Worker `w`'s peer `w` stages a 1000-byte datagram every 100 µs (80 Mbit/s) from
    /// `from`, `count` of them, each sent as it may.
    fn busy(s: &mut CarrierShare, w: u32, from: Instant, count: u32) {
        let to = SocketAddr::from(([198, 18, 0, 2], 7400));
        for k in 0..count {
            let at = from + Duration::from_micros(100) * k;
            s.stage(at, PeerId(w), to, vec![0; 1000]);
            s.next(at);
        }
    }

    /// Worker `w`'s share of a 100 Mbit/s carrier, with peer `w` of `weight`.
    fn worker(carrier: &Arc<SharedCarrier>, w: u32, weight: u32) -> CarrierShare {
        worker_with(carrier, w, spec(weight))
    }

    fn worker_with(carrier: &Arc<SharedCarrier>, w: u32, spec: PeerSpec) -> CarrierShare {
        let mut s = CarrierShare::new(100 * M, 1500, Duration::from_millis(1))
            .on_worker(carrier.clone(), w as usize);
        s.add(PeerId(w), &spec, 0);
        s
    }

    /// The peers whose datagrams leave at `now`, each restaging as soon as it sent (as the
    /// driver's pass does), until the carrier holds the next back.
    fn released_at(s: &mut CarrierShare, now: Instant, peers: &[u32]) -> Vec<u32> {
        let to = SocketAddr::from(([198, 18, 0, 2], 7400));
        let mut out = Vec::new();
        loop {
            for &p in peers {
                if !s.is_staged(PeerId(p)) {
                    s.stage(now, PeerId(p), to, vec![0; 1000]);
                }
            }
            match s.next(now) {
                Some((peer, _, _)) => out.push(peer.0),
                None => return out,
            }
        }
    }

    #[test]
    fn a_peer_s_turn_is_a_run_of_datagrams_that_may_leave_in_one_send() {
        // 1 Gbit/s, a 2 ms burst, two busy peers of weight 1: a turn would be 125,000 bytes
        // and is cut to one send's 65,507, so 65 datagrams of 1000 bytes.
        let mut s = CarrierShare::new(1_000 * M, 1000, Duration::from_millis(2));
        let fast = PeerSpec {
            tx_bps: 1_000 * M,
            ..spec(1)
        };
        s.add(PeerId(1), &fast, 0);
        s.add(PeerId(2), &fast, 0);
        let t0 = Instant::now();
        assert_eq!(released_at(&mut s, t0, &[1, 2]), [1]);
        // Each millisecond after, the carrier owes 125 datagrams, released at one instant
        // as turns of 65 or 66 (the 507 bytes a turn leaves over add up) to one peer; a turn
        // the carrier cuts goes on at the next instant. Peer 2 had not sent before, so its
        // own schedule lets one datagram go at the first instant (its MIR has nothing to
        // catch up), and peer 1 starts its next turn.
        let mut turns: Vec<(u32, usize)> = Vec::new();
        let mut sent = [0usize; 2];
        for ms in 1..=20 {
            let released = released_at(&mut s, t0 + Duration::from_millis(ms), &[1, 2]);
            assert!(
                (124..=127).contains(&released.len()),
                "{ms} ms: {released:?}"
            );
            for p in released {
                sent[p as usize - 1] += 1;
                match turns.last_mut() {
                    Some((q, n)) if *q == p => *n += 1,
                    _ => turns.push((p, 1)),
                }
            }
        }
        assert_eq!(turns[..3], [(1, 64), (2, 1), (1, 66)]);
        let whole = &turns[3..turns.len() - 1];
        assert!(
            whole.iter().all(|&(_, n)| (65..=66).contains(&n)),
            "{turns:?}"
        );
        assert!(whole.windows(2).all(|w| w[0].0 != w[1].0));
        // The turns alternate: the peers part apart by peer 2's short first turn and where
        // the last one was cut, at most two turns.
        assert!(sent[0].abs_diff(sent[1]) <= 2 * 66, "{sent:?} {turns:?}");
    }

    #[test]
    fn a_worker_the_split_leaves_nothing_still_sends_a_datagram_a_refresh() {
        let to = SocketAddr::from(([198, 18, 0, 2], 7400));
        let carrier = SharedCarrier::new(100 * M, 1500, Duration::from_millis(1), 2);
        // Worker 1's peer has all of the carrier as its min_rate.
        let committed = PeerSpec {
            min_bps: 100 * M,
            ..spec(1)
        };
        let (mut a, mut b) = (worker(&carrier, 0, 1), worker_with(&carrier, 1, committed));
        let t = Instant::now();
        busy(&mut b, 1, t, 100);
        let now = t + Duration::from_millis(10);
        b.set_carrier(now, 100 * M);
        a.stage(now, PeerId(0), to, vec![0; 1500]);
        // One 1500-byte datagram a 100 ms refresh, not none.
        assert_eq!(a.sched.carrier_bps(), 120_000);
        let mut at = now;
        for _ in 0..2 {
            at = a.poll_timeout(at).expect("staged").max(at);
            assert!(at <= now + REFRESH, "{:?}", at - now);
            assert!(a.next(at).is_some());
            a.stage(at, PeerId(0), to, vec![0; 1500]);
        }
        assert!(a.poll_timeout(at).expect("staged") <= now + 2 * REFRESH);
    }

    #[test]
    fn busy_workers_split_the_carrier_by_their_peers_weights_and_keepalives_take_nothing() {
        let to = SocketAddr::from(([198, 18, 0, 2], 7400));
        let carrier = SharedCarrier::new(100 * M, 1500, Duration::from_millis(1), 2);
        let (mut a, mut b) = (worker(&carrier, 0, 1), worker(&carrier, 1, 3));
        let t = Instant::now();
        let mut now = t;
        // Both stage a datagram every 100 µs (80 Mbit/s each) for 200 ms.
        for k in 0..2000u32 {
            now = t + Duration::from_micros(100) * k;
            a.stage(now, PeerId(0), to, vec![0; 1000]);
            b.stage(now, PeerId(1), to, vec![0; 1000]);
            a.next(now);
            b.next(now);
        }
        b.set_carrier(now, 100 * M);
        a.set_carrier(now, 100 * M);
        b.set_carrier(now, 100 * M);
        assert_eq!(a.sched.carrier_bps(), 25 * M);
        assert_eq!(b.sched.carrier_bps(), 75 * M);

        // Worker 1's peer goes quiet but for one 100-byte keepalive: 4 kbit/s over the
        // window, 8 kbit/s with the headroom; worker 0 gets the rest.
        let later = now + Duration::from_millis(300);
        b.stage(later, PeerId(1), to, vec![0; 100]);
        b.next(later);
        busy(&mut a, 0, later, 100);
        let at = later + Duration::from_millis(10);
        b.set_carrier(at, 100 * M);
        a.set_carrier(at, 100 * M);
        assert_eq!(a.sched.carrier_bps(), 100 * M - 8_000);
        // Once the keepalive is 200 ms old, worker 1 has nothing active: all of it.
        a.set_carrier(later + Duration::from_millis(201), 100 * M);
        assert_eq!(a.sched.carrier_bps(), 100 * M);
    }
}
