//! A hub's forward carrier (`[link] tx_rate`) shared between its terminals: each link holds
//! at most one datagram its association produced, and the [`CarrierScheduler`] picks whose
//! leaves next, so every terminal gets its `min_rate` when it has data, the rest goes by
//! `weight`, and none exceeds its `tx_rate`. Every [`REFRESH`] each association is capped at
//! what the scheduler allocates it, so its controller paces near its share instead of
//! finding the share as a queue in front of the carrier.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::{CarrierScheduler, MemberId, MemberRates};

use crate::config::PeerSpec;

/// How often the associations' ceilings follow the allocations (the scheduler recomputes
/// them at this pace too).
pub const REFRESH: Duration = Duration::from_millis(100);

/// A datagram produced by a link's association, waiting for its turn on the carrier.
struct Staged {
    to: SocketAddr,
    buf: Vec<u8>,
}

pub struct CarrierShare {
    sched: CarrierScheduler,
    /// By link.
    members: Vec<MemberId>,
    link_of: HashMap<MemberId, usize>,
    /// By link: the rates last given to the scheduler.
    rates: Vec<MemberRates>,
    /// By link: bytes a datagram costs on the carrier beyond its UDP payload.
    overhead: Vec<usize>,
    /// By link.
    staged: Vec<Option<Staged>>,
    next_refresh: Option<Instant>,
}

impl CarrierShare {
    /// One member per peer in `specs` (by link), at its `tx_rate`, `min_rate` and `weight`;
    /// `overhead` by link: what a datagram costs on the wire beyond its bytes.
    pub fn new(
        carrier_bps: u64,
        mtu: usize,
        burst: Duration,
        specs: &[PeerSpec],
        overhead: Vec<usize>,
    ) -> CarrierShare {
        let mut sched = CarrierScheduler::new(carrier_bps, mtu).with_burst(burst);
        let rates: Vec<MemberRates> = specs
            .iter()
            .map(|s| MemberRates {
                cir_bps: s.min_bps,
                mir_bps: s.tx_bps,
                weight: s.weight,
            })
            .collect();
        let members: Vec<MemberId> = rates.iter().map(|r| sched.add_member(*r)).collect();
        CarrierShare {
            sched,
            link_of: members.iter().enumerate().map(|(l, &m)| (m, l)).collect(),
            members,
            rates,
            overhead,
            staged: specs.iter().map(|_| None).collect(),
            next_refresh: None,
        }
    }

    /// Whether `link` has a datagram waiting (and so needs no other produced yet).
    pub fn is_staged(&self, link: usize) -> bool {
        self.staged.get(link).is_some_and(Option::is_some)
    }

    /// Holds `link`'s next datagram until the scheduler gives it its turn.
    pub fn stage(&mut self, link: usize, to: SocketAddr, buf: Vec<u8>) {
        let (Some(slot), Some(&member)) = (self.staged.get_mut(link), self.members.get(link))
        else {
            return;
        };
        *slot = Some(Staged { to, buf });
        self.sched.wake(member);
    }

    /// The link whose datagram leaves now, with the datagram, booked on the carrier; `None`
    /// while none may (see [`poll_timeout`](Self::poll_timeout)).
    pub fn next(&mut self, now: Instant) -> Option<(usize, SocketAddr, Vec<u8>)> {
        let CarrierShare {
            sched,
            link_of,
            staged,
            overhead,
            ..
        } = self;
        let cost = |link: usize| -> Option<usize> {
            let s = staged.get(link)?.as_ref()?;
            Some(s.buf.len() + overhead.get(link).copied().unwrap_or(0))
        };
        let member = sched.next(now, |m| cost(*link_of.get(&m)?))?;
        let link = *link_of.get(&member)?;
        let bytes = cost(link)?;
        let datagram = staged.get_mut(link)?.take()?;
        sched.on_sent(now, member, bytes);
        Some((link, datagram.to, datagram.buf))
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

    /// `link`'s ceiling now: its allocation, at most `mir_bps` (its association's configured
    /// rate, which a reload may have changed since the scheduler last heard of it).
    pub fn ceiling(&mut self, link: usize, mir_bps: u64) -> u64 {
        let (Some(&member), Some(rates)) = (self.members.get(link), self.rates.get_mut(link))
        else {
            return mir_bps;
        };
        if rates.mir_bps != mir_bps {
            rates.mir_bps = mir_bps;
            self.sched.set_rates(member, *rates);
        }
        self.sched.allocation(member).min(mir_bps)
    }

    /// `link`'s CIR and weight as a reload changed them; its flows carry on.
    pub fn set_share_rates(&mut self, link: usize, min_bps: u64, weight: u32) {
        let (Some(&member), Some(rates)) = (self.members.get(link), self.rates.get_mut(link))
        else {
            return;
        };
        rates.cir_bps = min_bps;
        rates.weight = weight;
        self.sched.set_rates(member, *rates);
    }

    /// The ceilings were refreshed at `now`.
    pub fn refreshed(&mut self, now: Instant) {
        self.next_refresh = Some(now + REFRESH);
    }
}
