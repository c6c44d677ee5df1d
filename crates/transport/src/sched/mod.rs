//! Shares one forward carrier between members (one per terminal association at a hub): each
//! gets its CIR whenever it has data, never more than its MIR, and what the CIRs leave by
//! weight; what an idle member leaves goes to the others. Sans-IO like the rest of the crate:
//! the caller passes `Instant`s in, asks [`CarrierScheduler::next`] whose datagram goes next,
//! sends it and reports it with [`CarrierScheduler::on_sent`]. docs/PROTOCOL.md §5.9 states
//! the guarantees and the constants.
//!
//! Three kinds of [`Pacer`] schedules, all booked with the bytes actually sent: the carrier's,
//! and per member one at its MIR (a send must fit it) and one at its CIR (a member whose CIR
//! schedule is due is served first). Members whose CIR is due wait in a queue by due time;
//! the others take turns by deficit round robin.

mod due;
mod share;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::pacer::Pacer;
use due::{Due, DueQueue};
use share::WaterLevel;

/// A member counts towards the shares for this long after it was last seen with data: long
/// enough that one sending a request every few hundred milliseconds keeps its share, short
/// enough that a member gone quiet hands its share on within a few round trips of the others.
pub const ACTIVITY_WINDOW: Duration = Duration::from_millis(200);

/// Allocations are recomputed at most this often (and at once when members or rates change):
/// the association's controller takes them as a ceiling and moves on round-trip time scales.
const ALLOCATION_REFRESH: Duration = Duration::from_millis(100);

/// A member that sent at less than its share over the last refresh period counts in the
/// water level at this many times what it sent (within its CIR and MIR): a terminal whose
/// only traffic is keepalives, acknowledgements or a request now and then leaves what it does
/// not use to the others, while one that is speeding up (by up to this factor per period)
/// is not held back; its own allocation stays the share it would get.
pub const DEMAND_HEADROOM: u64 = 2;

/// Queues holding more stale entries than this beyond twice the member count are compacted.
const STALE_ENTRY_SLACK: usize = 64;

/// What a member is promised and how it shares the rest. Rates in bit/s of the bytes passed
/// to [`CarrierScheduler::on_sent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRates {
    /// Committed rate: served ahead of any weight share whenever the member has data.
    pub cir_bps: u64,
    /// Maximum rate: never exceeded over any window longer than a burst.
    pub mir_bps: u64,
    /// Share of what is left once every CIR is served (0 counts as 1).
    pub weight: u32,
}

impl MemberRates {
    /// A weight of at least 1 and a MIR of at least the CIR.
    fn normalised(self) -> Self {
        MemberRates {
            cir_bps: self.cir_bps,
            mir_bps: self.mir_bps.max(self.cir_bps),
            weight: self.weight.max(1),
        }
    }
}

/// What each of `members` may use of `carrier_bps` by the scheduler's rule, in the order
/// given: its CIR, then a share of what the CIRs leave by weight, never above its MIR, the
/// share a capped member cannot use going to the others. CIRs above the carrier (which
/// configuration refuses) give each its CIR.
pub fn allocations(carrier_bps: u64, members: &[MemberRates]) -> Vec<u64> {
    let shares = Shares::of(carrier_bps, &mut members.to_vec());
    members.iter().map(|r| shares.allocation(r)).collect()
}

/// A carrier shared by the scheduler's rule between the members that count towards it (its
/// water level), as [`allocations`] shares it: what any member may use at that level, also
/// one that counted at less than its own rates (as [`CarrierScheduler`] counts a member
/// within its demand, [`Counted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    level: WaterLevel,
    carrier_bps: u64,
}

impl Shares {
    /// `carrier_bps` shared between `counted`, each at the rates it counts with. Reorders
    /// `counted` (and gives each a weight of at least 1 and a MIR of at least its CIR).
    pub fn of(carrier_bps: u64, counted: &mut [MemberRates]) -> Shares {
        for r in counted.iter_mut() {
            *r = r.normalised();
        }
        Shares {
            level: share::water_level(carrier_bps, counted),
            carrier_bps,
        }
    }

    /// What a member with `rates` may use: its CIR plus its weighted share at the level, at
    /// most its MIR.
    pub fn allocation(&self, rates: &MemberRates) -> u64 {
        share::allocation(&rates.normalised(), self.level, self.carrier_bps)
    }
}

/// A member as it counts towards the allocations at one instant ([`CarrierScheduler::counted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub id: MemberId,
    /// Its rates with the MIR it counts at: within [`DEMAND_HEADROOM`] times its demand.
    pub rates: MemberRates,
    /// Until when it counts unless it has data or sends again.
    pub until: Instant,
}

/// One member of a [`CarrierScheduler`]. Never reused: an id of a removed member stays
/// unknown even when its slot serves a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberId {
    slot: usize,
    serial: u64,
}

#[derive(Debug)]
struct Member {
    serial: u64,
    rates: MemberRates,
    mir: Pacer,
    /// `None` with a CIR of 0.
    cir: Option<Pacer>,
    /// Deficit round robin credit in bytes; negative after a send the caller made beyond it.
    deficit: i64,
    /// Its turn at the head of the ring has begun (its quantum is added).
    turn_started: bool,
    /// Believed to have data: woken and not since seen without.
    backlogged: bool,
    in_ring: bool,
    /// Out of the ring until its MIR schedule is due.
    parked: bool,
    park_epoch: u32,
    /// Has a live entry in the CIR queue.
    cir_queued: bool,
    cir_epoch: u32,
    last_sent: Option<Instant>,
    /// Bytes sent since the current refresh period began.
    period_bytes: u64,
    /// What it sent over the last complete refresh period, in bit/s; `None` for a member
    /// added or changed since, until a period ends.
    demand_bps: Option<u64>,
}

impl Member {
    fn id(&self, slot: usize) -> MemberId {
        MemberId {
            slot,
            serial: self.serial,
        }
    }
}

/// Shares one paced carrier between members by CIR, MIR and weight. See the module docs.
#[derive(Debug)]
pub struct CarrierScheduler {
    carrier: Pacer,
    mtu: usize,
    burst: Duration,
    members: Slab<Member>,
    next_serial: u64,
    /// Deficit round robin order; may hold entries of removed or idle members, dropped when
    /// they reach the head.
    ring: VecDeque<MemberId>,
    /// Backlogged members with a CIR, by when their CIR schedule is due.
    cir_due: DueQueue,
    /// Members held back by their MIR, by when it lets them send again.
    mir_parked: DueQueue,
    /// `None` after a change of members or rates: recomputed when next needed, so adding
    /// a thousand members costs one computation, not a thousand.
    level: Cell<Option<WaterLevel>>,
    refresh_at: Option<Instant>,
    last_now: Option<Instant>,
    /// When the current refresh period began (each member's `period_bytes` count from it).
    period_start: Option<Instant>,
    /// Reused by each periodic refresh of `level`.
    scratch: Vec<MemberRates>,
    /// The longest turn per unit of weight, in bytes; at most an MTU unless
    /// [`with_turns_up_to`](Self::with_turns_up_to) says more.
    max_turn: usize,
    /// The weights of the members counted at the last refresh of `level`.
    active_weight: u64,
}

impl CarrierScheduler {
    /// A carrier of `carrier_bps` carrying datagrams of at most `mtu` bytes (the deficit
    /// round robin quantum is weight × `mtu`).
    pub fn new(carrier_bps: u64, mtu: usize) -> Self {
        CarrierScheduler {
            carrier: Pacer::new(carrier_bps, mtu),
            mtu,
            burst: Duration::ZERO,
            members: Slab::new(),
            next_serial: 0,
            ring: VecDeque::new(),
            cir_due: DueQueue::default(),
            mir_parked: DueQueue::default(),
            level: Cell::new(None),
            refresh_at: None,
            last_now: None,
            period_start: None,
            scratch: Vec::new(),
            max_turn: mtu,
            active_weight: 0,
        }
    }

    /// Lets the carrier and each MIR and CIR schedule fall behind by up to `burst` (at least
    /// two datagrams) and catch up back to back, for an event loop with a coarse timer.
    /// Applies to the carrier now and to members added afterwards.
    pub fn with_burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self.carrier = self.carrier.with_burst(burst);
        self
    }

    /// Lets a member's turn in the round robin grow beyond one MTU per unit of weight, up to
    /// `max_bytes` per unit: to what the carrier carries in one `burst` shared by the weights
    /// of the active members. A turn's datagrams leave back to back to one peer, which a
    /// driver may send as one segmented send; a round of the ring still takes about one
    /// burst, so no member waits longer for its turn than the pacers already allow.
    pub fn with_turns_up_to(mut self, max_bytes: usize) -> Self {
        self.max_turn = max_bytes.max(self.mtu);
        self
    }

    pub fn carrier_bps(&self) -> u64 {
        self.carrier.rate_bps()
    }

    /// A new carrier rate (ACM changed the forward carrier's modulation, or a reload).
    pub fn set_carrier_rate(&mut self, carrier_bps: u64) {
        self.carrier.set_rate(carrier_bps);
        self.level.set(None);
    }

    /// Adds a member, taken to have data until [`next`](Self::next) learns otherwise.
    pub fn add_member(&mut self, rates: MemberRates) -> MemberId {
        let rates = rates.normalised();
        let serial = self.next_serial;
        self.next_serial += 1;
        let member = Member {
            serial,
            rates,
            mir: self.member_pacer(rates.mir_bps),
            cir: (rates.cir_bps > 0).then(|| self.member_pacer(rates.cir_bps)),
            deficit: 0,
            turn_started: false,
            backlogged: false,
            in_ring: false,
            parked: false,
            park_epoch: 0,
            cir_queued: false,
            cir_epoch: 0,
            last_sent: None,
            period_bytes: 0,
            demand_bps: None,
        };
        let slot = self.members.insert(member);
        let id = MemberId { slot, serial };
        self.wake(id);
        self.level.set(None);
        id
    }

    /// Removes a member; its share goes to the others at once. False if it was unknown.
    pub fn remove(&mut self, id: MemberId) -> bool {
        if self.member(id).is_none() {
            return false;
        }
        self.members.remove(id.slot);
        let limit = 2 * self.members.len() + STALE_ENTRY_SLACK;
        if self.ring.len() > limit {
            let members = &self.members;
            self.ring.retain(|id| {
                members
                    .get(id.slot)
                    .is_some_and(|m| m.serial == id.serial && m.in_ring)
            });
        }
        self.compact();
        self.level.set(None);
        true
    }

    /// New rates for a member, in force from its next datagram. False if it was unknown.
    pub fn set_rates(&mut self, id: MemberId, rates: MemberRates) -> bool {
        let rates = rates.normalised();
        let new_cir = (rates.cir_bps > 0).then(|| self.member_pacer(rates.cir_bps));
        let Some(member) = self.member_mut(id) else {
            return false;
        };
        member.rates = rates;
        // What it sent under the old rates says little about what it will under the new.
        member.demand_bps = None;
        member.mir.set_rate(rates.mir_bps);
        let had_cir = member.cir.is_some();
        match (member.cir.as_mut(), new_cir) {
            // Keeps the schedule's place: a rate change is no reason for a burst.
            (Some(cir), Some(_)) => cir.set_rate(rates.cir_bps),
            (_, new_cir) => member.cir = new_cir,
        }
        if had_cir != member.cir.is_some() {
            self.requeue_cir(id);
        }
        self.level.set(None);
        true
    }

    /// Says that a member has data again. A member seen without data by [`next`](Self::next)
    /// is not asked again until woken.
    pub fn wake(&mut self, id: MemberId) {
        let Some(member) = self.member_mut(id) else {
            return;
        };
        if member.backlogged {
            return;
        }
        member.backlogged = true;
        if !member.in_ring && !member.parked {
            member.in_ring = true;
            self.ring.push_back(id);
        }
        if !self.member(id).is_some_and(|m| m.cir_queued) {
            self.requeue_cir(id);
        }
    }

    /// The member whose datagram should leave now, or `None` if none may (see
    /// [`poll_timeout`](Self::poll_timeout)). `ready` gives the size of a member's next
    /// datagram, or `None` if it has nothing to send; it may be asked several times per call
    /// and must not change its answer within one call. The caller sends one datagram of the
    /// member returned and reports it with [`on_sent`](Self::on_sent).
    pub fn next(
        &mut self,
        now: Instant,
        mut ready: impl FnMut(MemberId) -> Option<usize>,
    ) -> Option<MemberId> {
        self.observe(now);
        if self.carrier.delay_until(now).is_some() {
            return None;
        }
        if let Some(id) = self.next_within_cir(now, &mut ready) {
            return Some(id);
        }
        self.next_by_weight(now, &mut ready)
    }

    /// Books a datagram of `bytes` that the caller sent for `id` (normally the member
    /// [`next`](Self::next) returned) on the carrier and on the member's schedules. Bytes
    /// within the member's CIR schedule do not count against its weight share.
    pub fn on_sent(&mut self, now: Instant, id: MemberId, bytes: usize) {
        self.observe(now);
        let bytes = bytes as u64;
        self.carrier.on_sent(now, bytes);
        let Some(member) = self.member_mut(id) else {
            return;
        };
        member.last_sent = Some(now);
        member.period_bytes = member.period_bytes.saturating_add(bytes);
        member.mir.on_sent(now, bytes);
        let within_cir = match member.cir.as_mut() {
            Some(cir) if cir.delay_until(now).is_none() => {
                cir.on_sent(now, bytes);
                true
            }
            _ => false,
        };
        if within_cir {
            self.requeue_cir(id);
        } else {
            member.deficit = member
                .deficit
                .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// When [`next`](Self::next) may next return a member (never before `now`), or `None`
    /// while no member is known to have data: wait for [`wake`](Self::wake).
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        let earliest = |due: Option<Due>| due.map(|d| d.at.map_or(now, |t| t.max(now)));
        let ring = (!self.ring.is_empty()).then_some(now);
        let member_due = [
            ring,
            earliest(self.cir_due.peek()),
            earliest(self.mir_parked.peek()),
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(
            self.carrier
                .delay_until(now)
                .map_or(member_due, |t| t.max(member_due)),
        )
    }

    /// What the member may use now, in bit/s: its CIR plus its weighted share of what the
    /// CIRs of the recently active members leave, at most its MIR (a ceiling for the
    /// association's congestion controller). 0 for an unknown member.
    pub fn allocation(&self, id: MemberId) -> u64 {
        let Some(member) = self.member(id) else {
            return 0;
        };
        let level = self.level.get().unwrap_or_else(|| {
            let level = self.water_level(self.last_now, &mut Vec::new());
            self.level.set(Some(level));
            level
        });
        share::allocation(&member.rates, level, self.carrier.rate_bps())
    }

    fn member_pacer(&self, rate_bps: u64) -> Pacer {
        Pacer::new(rate_bps, self.mtu).with_burst(self.burst)
    }

    fn member(&self, id: MemberId) -> Option<&Member> {
        self.members.get(id.slot).filter(|m| m.serial == id.serial)
    }

    fn member_mut(&mut self, id: MemberId) -> Option<&mut Member> {
        self.members
            .get_mut(id.slot)
            .filter(|m| m.serial == id.serial)
    }

    fn quantum(&self, member: &Member) -> i64 {
        let unit = i64::try_from(self.turn_unit()).unwrap_or(i64::MAX);
        i64::from(member.rates.weight).saturating_mul(unit)
    }

    /// A turn's bytes per unit of weight: one MTU, or with longer turns allowed the carrier's
    /// burst divided among the active weights, within one MTU and the longest turn.
    fn turn_unit(&self) -> usize {
        if self.max_turn <= self.mtu {
            return self.mtu;
        }
        let burst_bytes =
            u128::from(self.carrier.rate_bps()) * self.burst.as_nanos() / 8 / 1_000_000_000;
        let unit = burst_bytes / u128::from(self.active_weight.max(1));
        usize::try_from(unit)
            .unwrap_or(usize::MAX)
            .clamp(self.mtu, self.max_turn)
    }

    /// Moves the member's CIR queue entry to when its CIR schedule is due (or drops it).
    fn requeue_cir(&mut self, id: MemberId) {
        let Some(member) = self.member_mut(id) else {
            return;
        };
        member.cir_epoch = member.cir_epoch.wrapping_add(1);
        member.cir_queued = member.backlogged && member.cir.is_some();
        let due = member.cir.as_ref().map(Pacer::delay_until_or_now);
        if let (true, Some(at)) = (member.cir_queued, due) {
            let entry = Due {
                at,
                slot: id.slot,
                serial: id.serial,
                epoch: member.cir_epoch,
            };
            self.cir_due.push(entry);
            self.compact();
        }
    }

    fn cir_entry_is_live(members: &Slab<Member>, due: &Due) -> bool {
        members
            .get(due.slot)
            .is_some_and(|m| m.serial == due.serial && m.cir_queued && m.cir_epoch == due.epoch)
    }

    fn park_entry_is_live(members: &Slab<Member>, due: &Due) -> bool {
        members
            .get(due.slot)
            .is_some_and(|m| m.serial == due.serial && m.parked && m.park_epoch == due.epoch)
    }

    /// Drops stale queue entries once they outnumber the members (removals and rate changes
    /// leave entries behind that may not reach the top for a while).
    fn compact(&mut self) {
        let limit = 2 * self.members.len() + STALE_ENTRY_SLACK;
        let members = &self.members;
        if self.cir_due.len() > limit {
            self.cir_due.retain(|d| Self::cir_entry_is_live(members, d));
        }
        if self.mir_parked.len() > limit {
            self.mir_parked
                .retain(|d| Self::park_entry_is_live(members, d));
        }
    }

    /// Takes the time: members whose MIR lets them send again rejoin the ring, and the
    /// allocations are refreshed when due.
    fn observe(&mut self, now: Instant) {
        self.last_now = Some(now);
        while let Some(due) = self.mir_parked.peek() {
            if due.at.is_some_and(|t| t > now) {
                break;
            }
            self.mir_parked.pop();
            if !Self::park_entry_is_live(&self.members, &due) {
                continue;
            }
            let member = &mut self.members[due.slot];
            member.parked = false;
            if member.backlogged && !member.in_ring {
                member.in_ring = true;
                let id = member.id(due.slot);
                self.ring.push_back(id);
            }
        }
        if self.level.get().is_none() || self.refresh_at.is_none_or(|t| now >= t) {
            self.end_period(now);
            let mut scratch = std::mem::take(&mut self.scratch);
            self.level
                .set(Some(self.water_level(Some(now), &mut scratch)));
            self.active_weight = scratch.iter().map(|r| u64::from(r.weight)).sum();
            self.scratch = scratch;
            self.refresh_at = Some(now + ALLOCATION_REFRESH);
        }
    }

    /// Closes the refresh period at `now` (if one has run long enough to measure): each
    /// member's demand is what it sent in it.
    fn end_period(&mut self, now: Instant) {
        let Some(start) = self.period_start else {
            // Nothing was sent before the first time seen: members take nobody's share
            // before they send, so associations that all handshake at once (a hub's start)
            // do not cap the first one with data at 1/n.
            for (_, m) in self.members.iter_mut() {
                m.demand_bps = Some(0);
            }
            self.period_start = Some(now);
            return;
        };
        let length = now.saturating_duration_since(start);
        if length < ALLOCATION_REFRESH / 2 {
            return;
        }
        let nanos = length.as_nanos().max(1);
        for (_, m) in self.members.iter_mut() {
            let bps = u128::from(m.period_bytes) * 8 * 1_000_000_000 / nanos;
            m.demand_bps = Some(u64::try_from(bps).unwrap_or(u64::MAX));
            m.period_bytes = 0;
        }
        self.period_start = Some(now);
    }

    /// Each member that counts towards the allocations at `now` (see
    /// [`allocation`](Self::allocation)), with the rates it counts at and until when; into
    /// `out`, which is cleared first. The refresh period ends first if it is due, as when
    /// the allocations are refreshed.
    pub fn counted(&mut self, now: Instant, out: &mut Vec<Counted>) {
        self.observe(now);
        out.clear();
        let floor_bps = self.demand_floor_bps();
        out.extend(self.members.iter().filter_map(|(slot, m)| {
            let until = if m.backlogged {
                now + ACTIVITY_WINDOW
            } else {
                m.last_sent
                    .map(|t| t + ACTIVITY_WINDOW)
                    .filter(|&until| until > now)?
            };
            Some(Counted {
                id: m.id(slot),
                rates: Self::counted_rates(m, Some(now), floor_bps),
                until,
            })
        }));
    }

    /// The least demand a member counts at: one MTU a refresh period.
    fn demand_floor_bps(&self) -> u64 {
        u64::try_from((self.mtu as u128) * 8 * 1_000_000_000 / ALLOCATION_REFRESH.as_nanos().max(1))
            .unwrap_or(u64::MAX)
    }

    /// `m`'s rates with its MIR at most [`DEMAND_HEADROOM`] times its demand (at least
    /// `floor_bps`, never below its CIR); before any time was seen, its rates.
    fn counted_rates(m: &Member, now: Option<Instant>, floor_bps: u64) -> MemberRates {
        match m.demand_bps.filter(|_| now.is_some()) {
            Some(d) => MemberRates {
                mir_bps: m
                    .rates
                    .mir_bps
                    .min(d.saturating_mul(DEMAND_HEADROOM).max(floor_bps))
                    .max(m.rates.cir_bps),
                ..m.rates
            },
            None => m.rates,
        }
    }

    /// The water level of the members with data or seen sending within [`ACTIVITY_WINDOW`]
    /// of `now`, each counted at its MIR or at [`DEMAND_HEADROOM`] times its demand (at least
    /// a datagram per refresh period), whichever is less; before any time was seen, the
    /// members with data at their MIR.
    fn water_level(&self, now: Option<Instant>, scratch: &mut Vec<MemberRates>) -> WaterLevel {
        let recently = |m: &Member| {
            m.backlogged
                || matches!((now, m.last_sent), (Some(now), Some(t))
                    if now.saturating_duration_since(t) < ACTIVITY_WINDOW)
        };
        let floor_bps = self.demand_floor_bps();
        scratch.clear();
        scratch.extend(
            self.members
                .iter()
                .map(|(_, m)| m)
                .filter(|m| recently(m))
                .map(|m| Self::counted_rates(m, now, floor_bps)),
        );
        share::water_level(self.carrier.rate_bps(), scratch)
    }

    /// Pass 1: the member whose CIR schedule has been due longest, if it has data and its MIR
    /// lets it send.
    fn next_within_cir(
        &mut self,
        now: Instant,
        ready: &mut impl FnMut(MemberId) -> Option<usize>,
    ) -> Option<MemberId> {
        while let Some(due) = self.cir_due.peek() {
            if due.at.is_some_and(|t| t > now) {
                return None;
            }
            if !Self::cir_entry_is_live(&self.members, &due) {
                self.cir_due.pop();
                continue;
            }
            let member = &mut self.members[due.slot];
            let id = member.id(due.slot);
            if !member.backlogged || ready(id).is_none() {
                member.backlogged = false;
                member.cir_queued = false;
                self.cir_due.pop();
                continue;
            }
            if let Some(mir_due) = member.mir.delay_until(now) {
                // It waits for its MIR anyway; look again then.
                self.cir_due.pop();
                member.cir_epoch = member.cir_epoch.wrapping_add(1);
                self.cir_due.push(Due {
                    at: Some(mir_due),
                    epoch: member.cir_epoch,
                    ..due
                });
                continue;
            }
            // Its entry stays: on_sent moves it to the next due time.
            return Some(id);
        }
        None
    }

    /// Pass 2: deficit round robin over the ring, skipping members held by their MIR.
    fn next_by_weight(
        &mut self,
        now: Instant,
        ready: &mut impl FnMut(MemberId) -> Option<usize>,
    ) -> Option<MemberId> {
        // A round visits every entry once. Rounds repeat while some member only lacked credit
        // (a datagram larger than its deficit plus quantum); they end once no member in the
        // ring has data and may send.
        let mut round_left = self.ring.len();
        let mut lacked_credit = false;
        loop {
            if round_left == 0 {
                if !lacked_credit {
                    return None;
                }
                round_left = self.ring.len();
                lacked_credit = false;
            }
            let id = *self.ring.front()?;
            round_left -= 1;
            let quantum = match self.member(id) {
                Some(m) => self.quantum(m),
                None => {
                    self.ring.pop_front();
                    continue;
                }
            };
            let member = &mut self.members[id.slot];
            let size = if member.backlogged { ready(id) } else { None };
            let Some(size) = size else {
                member.backlogged = false;
                member.in_ring = false;
                member.deficit = 0;
                member.turn_started = false;
                self.ring.pop_front();
                continue;
            };
            if let Some(mir_due) = member.mir.delay_until(now) {
                // Unused credit is not saved up while the member is held by its own MIR.
                member.in_ring = false;
                member.parked = true;
                member.park_epoch = member.park_epoch.wrapping_add(1);
                member.deficit = member.deficit.min(0);
                member.turn_started = false;
                self.ring.pop_front();
                self.mir_parked.push(Due {
                    at: Some(mir_due),
                    slot: id.slot,
                    serial: id.serial,
                    epoch: member.park_epoch,
                });
                continue;
            }
            if !member.turn_started {
                member.turn_started = true;
                member.deficit = member.deficit.saturating_add(quantum);
            }
            if member.deficit >= i64::try_from(size).unwrap_or(i64::MAX) {
                return Some(id);
            }
            member.turn_started = false;
            lacked_credit = true;
            self.ring.rotate_left(1);
        }
    }
}
