//! The endpoint: one per socket, in front of every association that socket carries. It finds
//! a datagram's association by the connection ID the receiver chose (no trial decryption), and
//! does the responder half of every handshake: replay memory and work budget shared by all
//! associations, the Noise read, and the lookup of the initiator's static key among the
//! configured peers. It never owns an association: the caller keeps each one where it likes
//! (behind its peer's lock) and hands the datagrams routed to it over. Layout and rules:
//! docs/PROTOCOL.md, "Connection IDs and the endpoint".

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::association::{Association, EndpointRouting, Role};
use crate::config::{Config, InvalidConfig};
use crate::ids::{ConnectionId, PeerId};
use crate::packet::{
    encode_hint, LONG_HEADER_BIT, LONG_TYPE_COOKIE, LONG_TYPE_HANDSHAKE_INIT,
    LONG_TYPE_HANDSHAKE_REPLY, LONG_TYPE_HELLO, LONG_TYPE_HINT,
};
use crate::security::{
    cookie_dcid, init_mac1, init_mac1_ok, initiation_ephemeral, initiation_hello, parse_init,
    parse_reply, public_key, reply_mac1_ok, AcceptedInitiation, CookieJar, DropReason,
    EphemeralSource, HandshakeGuard, HintBudget, InitiationMemory, LocalIdentity, MacKeys,
    Responder, SecurityConfig, SecurityCounts, SourceBudgets, TokenBucket, KEY_LEN,
};

/// An association of one endpoint: the slot its connection ID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AssocHandle(u32);

impl AssocHandle {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Handshake messages an endpoint processes per second in the long run. An IK responder
/// does four Diffie-Hellman operations (≈ 0.2 ms), so this is at most 40 % of a core; a
/// flood cannot take more, and once it takes half the burst the endpoint is under load and
/// answers initiations without a valid mac2 with cookies, which cost no Diffie-Hellman.
pub const ENDPOINT_HANDSHAKES_PER_SECOND: u32 = 2000;
/// Handshake messages an endpoint may process back to back: the initiations of 1000
/// terminals re-associating after a hub restart fit in it (≈ 0.2 s of work), and half of
/// it before any of them is asked for a cookie.
pub const ENDPOINT_HANDSHAKE_BURST: u32 = 1000;
/// How long the endpoint stays under load once its budget fell below half the burst, so
/// the cookie path does not flap with every token earned.
const LOAD_HOLD: Duration = Duration::from_secs(1);
/// Datagram bound of [`EndpointConfig::new`]: an Ethernet MTU.
const DEFAULT_MAX_DATAGRAM: usize = 1500;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// This endpoint's shard among `2^shard_bits`; a connection ID's top bits name it.
    pub shard: u8,
    /// 0..=3; 0 without connection IDs.
    pub shard_bits: u8,
    /// Bytes of the connection IDs this endpoint chooses: 0 (one peer) or 2 (a hub).
    pub cid_len: u8,
    pub handshakes_per_second: u32,
    pub handshake_burst: u32,
    /// Datagrams longer than this are dropped before routing, so none can make an
    /// association's receive buffer grow (the associations' `Config::max_datagram`).
    pub max_datagram: usize,
    /// Answer a short packet for a connection ID no association of this hub holds with a
    /// HINT (docs/PROTOCOL.md §7.7). Only with security and connection IDs.
    pub hints: bool,
    /// Shards this hub serves (its workers), 1..=`2^shard_bits`: a connection ID of a
    /// shard at or beyond it names no association anywhere, and gets a HINT here.
    pub shards: u8,
}

impl EndpointConfig {
    /// One shard choosing connection IDs of `cid_len` bytes, with the endpoint's handshake
    /// budget and datagrams up to the default MTU.
    pub fn new(cid_len: u8) -> Self {
        EndpointConfig {
            shard: 0,
            shard_bits: 0,
            cid_len,
            handshakes_per_second: ENDPOINT_HANDSHAKES_PER_SECOND,
            handshake_burst: ENDPOINT_HANDSHAKE_BURST,
            max_datagram: DEFAULT_MAX_DATAGRAM,
            hints: false,
            shards: 1,
        }
    }

    fn validate(&self) -> Result<(), InvalidConfig> {
        if !matches!(self.cid_len, 0 | 2) {
            return Err(InvalidConfig::new("endpoint.cid_len", "must be 0 or 2"));
        }
        if self.shard_bits > 3 || (self.cid_len == 0 && self.shard_bits > 0) {
            return Err(InvalidConfig::new(
                "endpoint.shard_bits",
                "at most 3, and 0 without connection IDs",
            ));
        }
        if u32::from(self.shard) >= 1 << self.shard_bits {
            return Err(InvalidConfig::new("endpoint.shard", "beyond 2^shard_bits"));
        }
        if self.shards == 0 || u32::from(self.shards) > 1 << self.shard_bits {
            return Err(InvalidConfig::new(
                "endpoint.shards",
                "between 1 and 2^shard_bits",
            ));
        }
        if self.hints && (self.cid_len == 0 || self.shard >= self.shards) {
            return Err(InvalidConfig::new(
                "endpoint.hints",
                "only for an endpoint that chooses connection IDs, of a shard it counts",
            ));
        }
        if self.handshakes_per_second == 0 || self.handshake_burst == 0 {
            return Err(InvalidConfig::new(
                "endpoint.handshakes",
                "rate and burst must be positive",
            ));
        }
        Ok(())
    }

    /// Associations one endpoint can hold: what the connection ID's slot bits can name.
    fn slots(&self) -> u32 {
        if self.cid_len == 0 {
            1
        } else {
            1 << (16 - u32::from(self.shard_bits))
        }
    }
}

/// What the endpoint knows of a configured peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// Its static key (security on); initiations are accepted from configured keys only.
    pub public_key: Option<[u8; KEY_LEN]>,
    /// Where it is, if configured (without security the address is its identity).
    pub address: Option<SocketAddr>,
}

/// Why a peer could not be added to a running endpoint: it would make a key or an address
/// name two peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerTableError {
    #[error("peer {0:?} is already in the table")]
    DuplicateId(PeerId),
    #[error("the public key is peer {0:?}'s")]
    DuplicateKey(PeerId),
    #[error("the address is peer {0:?}'s")]
    DuplicateAddress(PeerId),
}

/// What [`Endpoint::remove_peer`] freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedPeer {
    /// The peer's association, whose connection ID is free now: the caller drops it.
    pub association: Option<AssocHandle>,
}

/// What to do with a datagram.
#[derive(Debug)]
pub enum DatagramEvent {
    /// Hand it to this association (`Association::handle_datagram_from`).
    Routed(AssocHandle),
    /// An authenticated initiation from a configured peer: create its association first if
    /// `handle` is `None` (`Endpoint::new_association`), then `accept_initiation`.
    Initiation {
        peer: PeerId,
        handle: Option<AssocHandle>,
        accepted: AcceptedInitiation,
    },
    /// Send this datagram to `destination`: a COOKIE (the endpoint is under load and the
    /// initiation had no valid mac2) or a HINT (a short packet for a connection ID no
    /// association holds). Never larger than the datagram it answers.
    Response {
        destination: SocketAddr,
        datagram: Vec<u8>,
    },
}

/// Datagrams the endpoint dropped, by reason, and what it answered without an
/// association: COOKIEs and HINTs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// A short packet, reply or cookie whose connection ID names no association here (a
    /// short packet may get a HINT: `hints_sent`), or a HINT at a hub.
    pub unknown_cid: u64,
    /// Too short or too long to be ours, or of an unknown type.
    pub malformed: u64,
    /// A plaintext HELLO (security off) from an address no association is for.
    pub unknown_address: u64,
    /// Handshake screening: `wrong_mode`, `handshake_invalid` (which counts initiations of
    /// another protocol version), `handshake_unknown_peer`, `handshake_rate_limited` and
    /// `handshake_replayed` and `handshake_bad_mac` are used here.
    pub security: SecurityCounts,
    /// COOKIEs sent instead of doing an initiation's Diffie-Hellman.
    pub cookies_sent: u64,
    /// HINTs sent for short packets whose connection ID no association of this hub holds.
    pub hints_sent: u64,
    /// Such packets that got no HINT: their source's or the endpoint's budget was spent.
    pub hints_rate_limited: u64,
}

pub struct Endpoint {
    cfg: EndpointConfig,
    /// `None`: security off; associations are found by the peer's address until their
    /// HELLO has told the peer our connection ID.
    local: Option<LocalIdentity>,
    source: EphemeralSource,
    guard: HandshakeGuard,
    /// Our mac1 key (security on).
    macs: Option<MacKeys>,
    /// Cookie secrets (security on).
    cookies: Option<CookieJar>,
    /// The budget of initiations with a valid mac2: their senders proved their address,
    /// so a spoofed flood cannot take it from them; and each address's share of it.
    verified: TokenBucket,
    verified_by_source: SourceBudgets,
    /// Under load until then: initiations without a valid mac2 get cookies.
    load_until: Option<Instant>,
    /// HINTs still allowed, per source and in all.
    hints: HintBudget,
    /// By slot: the peer whose association holds it.
    slots: Vec<Option<PeerId>>,
    /// Slots given back, reused least recently freed first (after every fresh one), so a
    /// stale connection ID names nothing for as long as possible.
    free: VecDeque<u32>,
    peers: HashMap<PeerId, PeerIdentity>,
    keys: HashMap<[u8; KEY_LEN], PeerId>,
    addresses: HashMap<SocketAddr, PeerId>,
    by_peer: HashMap<PeerId, AssocHandle>,
    /// The last initiation answered for each peer, by ephemeral key: a copy of it is the
    /// initiator missing our reply, and goes to its association to be answered again.
    answered: HashMap<[u8; KEY_LEN], PeerId>,
    answered_by_peer: HashMap<PeerId, [u8; KEY_LEN]>,
    stats: EndpointStats,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("cfg", &self.cfg)
            .field("peers", &self.peers.len())
            .field("associations", &self.by_peer.len())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `local`: our identity when security is on, `None` when off. `rng_seed`: 32 random
    /// bytes, the source of every ephemeral key of the endpoint and its associations.
    pub fn new(
        cfg: EndpointConfig,
        local: Option<LocalIdentity>,
        rng_seed: [u8; 32],
    ) -> Result<Self, InvalidConfig> {
        cfg.validate()?;
        if cfg.hints && local.is_none() {
            return Err(InvalidConfig::new(
                "endpoint.hints",
                "only with security: a hint calls for an authenticated handshake",
            ));
        }
        let guard = HandshakeGuard::new(cfg.handshakes_per_second, cfg.handshake_burst);
        let verified = TokenBucket::new(cfg.handshakes_per_second, cfg.handshake_burst);
        let mut source = EphemeralSource::new(rng_seed);
        let ours = local.as_ref().map(|l| public_key(&l.private_key));
        let macs = ours.as_ref().map(MacKeys::of);
        let cookies = ours.map(|k| CookieJar::new(&k, source.seed()));
        Ok(Endpoint {
            cfg,
            local,
            source,
            guard,
            macs,
            cookies,
            verified,
            verified_by_source: SourceBudgets::default(),
            load_until: None,
            hints: HintBudget::new(),
            slots: Vec::new(),
            free: VecDeque::new(),
            peers: HashMap::new(),
            keys: HashMap::new(),
            addresses: HashMap::new(),
            by_peer: HashMap::new(),
            answered: HashMap::new(),
            answered_by_peer: HashMap::new(),
            stats: EndpointStats::default(),
        })
    }

    /// Replaces the table of configured peers; returns those no longer in it. Their
    /// associations keep being routed to until the caller `forget`s them.
    pub fn set_peers(
        &mut self,
        peers: impl IntoIterator<Item = (PeerId, PeerIdentity)>,
    ) -> Vec<PeerId> {
        let old = std::mem::take(&mut self.peers);
        self.peers = peers.into_iter().collect();
        self.index_peers();
        let mut removed: Vec<PeerId> = old
            .into_keys()
            .filter(|id| !self.peers.contains_key(id))
            .collect();
        removed.sort_unstable();
        removed
    }

    /// Adds one peer to the running table: its initiations are accepted from now on, and
    /// its association can be made. The others' are untouched.
    pub fn add_peer(&mut self, id: PeerId, identity: PeerIdentity) -> Result<(), PeerTableError> {
        if self.peers.contains_key(&id) {
            return Err(PeerTableError::DuplicateId(id));
        }
        if let Some(&other) = identity.public_key.and_then(|k| self.keys.get(&k)) {
            return Err(PeerTableError::DuplicateKey(other));
        }
        if let Some(&other) = identity.address.and_then(|a| self.addresses.get(&a)) {
            return Err(PeerTableError::DuplicateAddress(other));
        }
        if let Some(key) = identity.public_key {
            self.keys.insert(key, id);
        }
        if let Some(address) = identity.address {
            self.addresses.insert(address, id);
        }
        self.peers.insert(id, identity);
        Ok(())
    }

    /// Takes one peer out of the table and frees its association's connection ID: from now
    /// on its key is an unknown peer's and its connection ID names nothing. The caller drops
    /// the association named in the answer (the endpoint never owns one); `None` if `id` was
    /// not a peer.
    pub fn remove_peer(&mut self, id: PeerId) -> Option<RemovedPeer> {
        let identity = self.peers.remove(&id)?;
        if let Some(key) = identity.public_key {
            if self.keys.get(&key) == Some(&id) {
                self.keys.remove(&key);
            }
        }
        if let Some(address) = identity.address {
            if self.addresses.get(&address) == Some(&id) {
                self.addresses.remove(&address);
            }
        }
        let association = self.by_peer.get(&id).copied();
        if let Some(handle) = association {
            self.forget(handle);
        }
        if let Some(e) = self.answered_by_peer.remove(&id) {
            self.answered.remove(&e);
        }
        Some(RemovedPeer { association })
    }

    /// The lookups by key and by address, from the peer table.
    fn index_peers(&mut self) {
        self.keys = self
            .peers
            .iter()
            .filter_map(|(id, p)| Some((p.public_key?, *id)))
            .collect();
        self.addresses = self
            .peers
            .iter()
            .filter_map(|(id, p)| Some((p.address?, *id)))
            .collect();
    }

    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// The memory of initiations this endpoint refuses as replays, to share with others.
    pub fn initiations(&self) -> InitiationMemory {
        self.guard.recent.clone()
    }

    /// Refuses as replays the initiations `memory` holds, and adds those it authenticates
    /// there: endpoints in one process that share it (a hub's, one per worker) each refuse
    /// an initiation any of them authenticated, not once each.
    pub fn use_initiation_memory(&mut self, memory: InitiationMemory) {
        self.guard.recent = memory;
    }

    /// An initiation of `peer` another endpoint authenticated (it read it) and handed to
    /// this one, which holds or makes the peer's association: a copy of it that reaches
    /// this endpoint is the initiator missing the reply, and goes to the association to be
    /// answered again.
    pub fn adopt_initiation(&mut self, peer: PeerId, accepted: &AcceptedInitiation) {
        self.answer_copies(peer, accepted.ephemeral);
    }

    /// Copies of the initiation of `ephemeral` go to `peer`'s association, no longer those
    /// of the one answered for it before.
    fn answer_copies(&mut self, peer: PeerId, ephemeral: [u8; KEY_LEN]) {
        if let Some(old) = self.answered_by_peer.insert(peer, ephemeral) {
            self.answered.remove(&old);
        }
        self.answered.insert(ephemeral, peer);
    }

    /// The peer configured at `address`, if any.
    pub fn peer_at(&self, address: &SocketAddr) -> Option<PeerId> {
        self.addresses.get(address).copied()
    }

    /// The association made for `peer`, if any.
    pub fn association_of(&self, peer: PeerId) -> Option<AssocHandle> {
        self.by_peer.get(&peer).copied()
    }

    /// Decides what to do with one received datagram. Cheap for everything but initiations,
    /// which cost the Noise read once they pass the replay memory and the work budget.
    pub fn handle(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Option<DatagramEvent> {
        if datagram.len() > self.cfg.max_datagram {
            self.stats.malformed += 1;
            return None;
        }
        let Some(&first) = datagram.first() else {
            self.stats.malformed += 1;
            return None;
        };
        if first & LONG_HEADER_BIT == 0 {
            let cid_len = usize::from(self.cfg.cid_len);
            let Some(cid) = datagram.get(1..1 + cid_len) else {
                self.stats.malformed += 1;
                return None;
            };
            return self.route(cid).or_else(|| self.hint(now, from, datagram));
        }
        let secure = self.local.is_some();
        match first & !LONG_HEADER_BIT {
            LONG_TYPE_HELLO if !secure => self.route_by_address(from),
            LONG_TYPE_HANDSHAKE_INIT if secure => self.on_init(now, from, datagram),
            LONG_TYPE_HANDSHAKE_REPLY if secure => self.on_reply(now, datagram),
            LONG_TYPE_COOKIE if secure => self.on_cookie(datagram),
            // Only an endpoint without connection IDs (one peer) takes hints: a hub's
            // peers never send any, so two hubs cannot answer each other.
            LONG_TYPE_HINT if secure => self.route(&[]),
            LONG_TYPE_HELLO
            | LONG_TYPE_HANDSHAKE_INIT
            | LONG_TYPE_HANDSHAKE_REPLY
            | LONG_TYPE_COOKIE
            | LONG_TYPE_HINT => {
                self.stats.security.wrong_mode += 1;
                None
            }
            _ => {
                self.stats.malformed += 1;
                None
            }
        }
    }

    /// Makes the association of `peer`, with the connection ID of a free slot. `security`
    /// must be set exactly when the endpoint has an identity, with this peer's key.
    pub fn new_association(
        &mut self,
        now: Instant,
        peer: PeerId,
        cfg: Config,
        role: Role,
        epoch: u64,
        security: Option<SecurityConfig>,
    ) -> Result<(AssocHandle, Association), InvalidConfig> {
        let Some(identity) = self.peers.get(&peer) else {
            return Err(InvalidConfig::new("peer", "not among the endpoint's peers"));
        };
        if self.by_peer.contains_key(&peer) {
            return Err(InvalidConfig::new("peer", "already has an association"));
        }
        if security.is_some() != self.local.is_some() {
            return Err(InvalidConfig::new(
                "security",
                "the association and its endpoint must agree on security",
            ));
        }
        if let (Some(sec), Some(key)) = (&security, identity.public_key) {
            if sec.peer_public_key != key {
                return Err(InvalidConfig::new(
                    "security.peer_public_key",
                    "not the key the endpoint has for this peer",
                ));
            }
        }
        let remote = identity.address;
        let Some(slot) = self.free_slot() else {
            return Err(InvalidConfig::new("endpoint", "no free connection ID"));
        };
        let seed = self.source.seed();
        let assoc = Association::for_endpoint(
            cfg,
            role,
            epoch,
            now,
            security.map(|s| (s, seed)),
            EndpointRouting {
                local_cid: self.cid_for(slot),
                peer,
                remote,
            },
        )?;
        if self.free.front() == Some(&slot) {
            self.free.pop_front();
        }
        let index = slot as usize;
        if index >= self.slots.len() {
            self.slots.resize(index + 1, None);
        }
        self.slots[index] = Some(peer);
        let handle = AssocHandle(slot);
        self.by_peer.insert(peer, handle);
        Ok((handle, assoc))
    }

    /// Gives the slot of an association the caller dropped back; its connection ID then
    /// names nothing until reused.
    pub fn forget(&mut self, handle: AssocHandle) {
        let Some(peer) = self.slots.get_mut(handle.index()).and_then(Option::take) else {
            return;
        };
        if self.by_peer.get(&peer) == Some(&handle) {
            self.by_peer.remove(&peer);
        }
        if let Some(e) = self.answered_by_peer.remove(&peer) {
            self.answered.remove(&e);
        }
        self.free.push_back(handle.0);
    }

    /// Fresh slots first, then the least recently freed; not taken until the association
    /// is made.
    fn free_slot(&self) -> Option<u32> {
        let fresh = self.slots.len() as u32;
        if fresh < self.cfg.slots() {
            return Some(fresh);
        }
        self.free.front().copied()
    }

    fn cid_for(&self, slot: u32) -> ConnectionId {
        if self.cfg.cid_len == 0 {
            return ConnectionId::EMPTY;
        }
        let shard = u32::from(self.cfg.shard) << (16 - u32::from(self.cfg.shard_bits));
        let value = (shard | slot) as u16;
        ConnectionId::new(&value.to_be_bytes()).unwrap_or(ConnectionId::EMPTY)
    }

    fn slot_of(&self, cid: &[u8]) -> Option<u32> {
        let [hi, lo] = *cid else {
            return (self.cfg.cid_len == 0 && cid.is_empty()).then_some(0);
        };
        let value = u32::from(u16::from_be_bytes([hi, lo]));
        let slot_bits = 16 - u32::from(self.cfg.shard_bits);
        (value >> slot_bits == u32::from(self.cfg.shard)).then_some(value & ((1 << slot_bits) - 1))
    }

    fn route(&mut self, cid: &[u8]) -> Option<DatagramEvent> {
        let slot = self.slot_of(cid);
        match slot.and_then(|s| self.slots.get(s as usize).copied().flatten()) {
            Some(_) => slot.map(|s| DatagramEvent::Routed(AssocHandle(s))),
            None => {
                self.stats.unknown_cid += 1;
                None
            }
        }
    }

    /// The HINT answering a short packet whose connection ID `route` found nothing for, if
    /// one may go (docs/PROTOCOL.md §7.7): hints on; the ID names a slot of this shard that
    /// is empty, or a shard no worker of this hub serves (another worker's own is its to
    /// answer); the packet is long enough to be sealed; and the budgets grant it.
    fn hint(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Option<DatagramEvent> {
        if !self.cfg.hints || self.local.is_none() {
            return None;
        }
        let cid_len = usize::from(self.cfg.cid_len);
        let [hi, lo] = *datagram.get(1..1 + cid_len)? else {
            return None;
        };
        let shard =
            u32::from(u16::from_be_bytes([hi, lo])) >> (16 - u32::from(self.cfg.shard_bits));
        let ours = shard == u32::from(self.cfg.shard);
        if !ours && shard < u32::from(self.cfg.shards) {
            return None;
        }
        let mut hint = Vec::new();
        if !encode_hint(datagram, cid_len, crate::security::TAG_LEN, &mut hint) {
            return None;
        }
        if !self.hints.try_take(now, from) {
            self.stats.hints_rate_limited += 1;
            return None;
        }
        self.stats.hints_sent += 1;
        Some(DatagramEvent::Response {
            destination: from,
            datagram: hint,
        })
    }

    fn route_by_address(&mut self, from: SocketAddr) -> Option<DatagramEvent> {
        let handle = self
            .addresses
            .get(&from)
            .and_then(|peer| self.by_peer.get(peer));
        match handle {
            Some(h) => Some(DatagramEvent::Routed(*h)),
            None => {
                self.stats.unknown_address += 1;
                None
            }
        }
    }

    /// A reply to one of our associations' initiations costs it a Diffie-Hellman: it takes
    /// a token from the shared budget before it is routed.
    fn on_reply(&mut self, now: Instant, datagram: &[u8]) -> Option<DatagramEvent> {
        let Some((dcid, _)) = parse_reply(datagram, usize::from(self.cfg.cid_len)) else {
            self.count(DropReason::HandshakeInvalid);
            return None;
        };
        let routed = self.route(dcid.as_slice())?;
        if !self.mac1_ok(reply_mac1_ok, datagram) {
            return None;
        }
        if !self.guard.bucket.try_take(now) {
            self.count(DropReason::HandshakeRateLimited);
            return None;
        }
        Some(routed)
    }

    /// A COOKIE for one of our associations' initiations: opening it costs no
    /// Diffie-Hellman, so it is routed without a token.
    fn on_cookie(&mut self, datagram: &[u8]) -> Option<DatagramEvent> {
        let Some(dcid) = cookie_dcid(datagram, usize::from(self.cfg.cid_len)) else {
            self.count(DropReason::CookieInvalid);
            return None;
        };
        self.route(dcid.as_slice())
    }

    /// Whether a handshake message's mac1 is keyed for us (`check`: for its type); counts
    /// it when not.
    fn mac1_ok(&mut self, check: fn(&[u8], &MacKeys) -> bool, datagram: &[u8]) -> bool {
        let ok = self.macs.as_ref().is_some_and(|m| check(datagram, m));
        if !ok {
            self.count(DropReason::HandshakeBadMac);
        }
        ok
    }

    /// Whether initiations without a valid mac2 are to get cookies now.
    fn under_load(&mut self, now: Instant) -> bool {
        if self.guard.bucket.below_half(now) {
            self.load_until = Some(now + LOAD_HOLD);
        }
        self.load_until.is_some_and(|t| now < t)
    }

    /// The responder half of a handshake, in order of cost: mac1 (one hash); a copy of an
    /// initiation we answered goes to its association; one seen before is refused; an
    /// initiation with a valid mac2 takes from the budget of proven addresses; without one,
    /// under load it gets a cookie, otherwise it takes from the general budget; then the
    /// Noise read (two Diffie-Hellman) and the initiator's key among the peers.
    fn on_init(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Option<DatagramEvent> {
        let Some((scid, noise)) = parse_init(datagram) else {
            // Another protocol version lands here too: its layout is not ours to read.
            self.count(DropReason::HandshakeInvalid);
            return None;
        };
        let Some(ephemeral) = initiation_ephemeral(noise) else {
            self.count(DropReason::HandshakeInvalid);
            return None;
        };
        if !self.mac1_ok(init_mac1_ok, datagram) {
            return None;
        }
        if let Some(peer) = self.answered.get(&ephemeral) {
            let Some(&handle) = self.by_peer.get(peer) else {
                self.count(DropReason::HandshakeReplayed);
                return None;
            };
            // Answering again is work as well: a replayed initiation must not make us a
            // reflector.
            if !self.guard.bucket.try_take(now) {
                self.count(DropReason::HandshakeRateLimited);
                return None;
            }
            return Some(DatagramEvent::Routed(handle));
        }
        if self.guard.recent.contains(&ephemeral) {
            self.count(DropReason::HandshakeReplayed);
            return None;
        }
        let proven = self
            .cookies
            .as_mut()
            .is_some_and(|c| c.mac2_ok(now, from, datagram));
        let granted = if proven {
            self.verified_by_source.try_take(now, from.ip()) && self.verified.try_take(now)
        } else if self.under_load(now) {
            return self.cookie_reply(now, from, scid, datagram);
        } else {
            self.guard.bucket.try_take(now)
        };
        if !granted {
            self.count(DropReason::HandshakeRateLimited);
            return None;
        }
        let local = self.local.as_ref()?;
        let (responder, remote_static, payload) =
            match Responder::read(local, &mut self.source, noise) {
                Ok(r) => r,
                Err(r) => {
                    // Not remembered: anyone may copy a genuine initiation's ephemeral
                    // key into a forgery, and the genuine one must still be answered.
                    self.count(r.into());
                    return None;
                }
            };
        let Some(&peer) = self.keys.get(&remote_static) else {
            // Authentic, from a key we do not know: its copies cost no more work.
            self.guard.recent.insert(ephemeral);
            self.count(DropReason::HandshakeUnknownPeer);
            return None;
        };
        let hello = match initiation_hello(&payload, scid) {
            Ok(h) => h,
            Err(d) => {
                // The clear source connection ID is outside the Noise message: a copy
                // with another one is a forgery, not remembered either.
                self.count(d);
                return None;
            }
        };
        self.guard.recent.insert(ephemeral);
        self.answer_copies(peer, ephemeral);
        Some(DatagramEvent::Initiation {
            peer,
            handle: self.by_peer.get(&peer).copied(),
            accepted: AcceptedInitiation {
                responder: Box::new(responder),
                ephemeral,
                remote_static,
                hello,
            },
        })
    }

    fn cookie_reply(
        &mut self,
        now: Instant,
        from: SocketAddr,
        scid: ConnectionId,
        init: &[u8],
    ) -> Option<DatagramEvent> {
        let mac1 = init_mac1(init)?;
        let datagram = self.cookies.as_mut()?.reply(now, from, scid, &mac1)?;
        self.stats.cookies_sent += 1;
        Some(DatagramEvent::Response {
            destination: from,
            datagram,
        })
    }

    fn count(&mut self, reason: DropReason) {
        reason.count(&mut self.stats.security);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(cfg: EndpointConfig) -> Endpoint {
        Endpoint::new(cfg, None, [1; 32]).unwrap()
    }

    /// The association of peer `p`, security off.
    fn associate(
        e: &mut Endpoint,
        now: Instant,
        p: u32,
    ) -> Result<(AssocHandle, Association), InvalidConfig> {
        let cfg = Config::for_rate(1_000_000);
        e.new_association(now, PeerId(p), cfg, Role::Responder, 1, None)
    }

    /// A hub's endpoint with security and hints, of shard `shard` among `shards` with
    /// `shard_bits`.
    fn hinting(shard_bits: u8, shard: u8, shards: u8) -> Endpoint {
        let mut cfg = EndpointConfig::new(2);
        cfg.shard_bits = shard_bits;
        cfg.shard = shard;
        cfg.shards = shards;
        cfg.hints = true;
        let local = LocalIdentity {
            private_key: [0x11; KEY_LEN],
            psk: None,
        };
        Endpoint::new(cfg, Some(local), [1; 32]).unwrap()
    }

    /// A sealed-looking short packet: flags with a packet number of `pn_len` bytes, the
    /// connection ID, the number, `payload` bytes and a tag.
    fn short_packet(cid: [u8; 2], pn_len: usize, payload: usize) -> Vec<u8> {
        let mut d = vec![((pn_len as u8 - 1) << 5) | 0x10];
        d.extend_from_slice(&cid);
        d.extend((0..pn_len).map(|i| 0xa0 + i as u8));
        d.extend(std::iter::repeat_n(0x55, payload));
        d.extend(0xe0..0xf0u8);
        d
    }

    fn hint_of(e: &mut Endpoint, now: Instant, from: SocketAddr, d: &[u8]) -> Option<Vec<u8>> {
        match e.handle(now, from, d) {
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                assert_eq!(destination, from);
                Some(datagram)
            }
            None => None,
            Some(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_connection_id_gets_a_hint_smaller_than_it() {
        let mut e = hinting(0, 0, 1);
        let now = Instant::now();
        let from = SocketAddr::from(([198, 18, 1, 7], 7400));
        let two = short_packet([0x00, 0x07], 2, 1);
        assert_eq!(two.len(), 22, "the shortest sealed packet");
        let hint = hint_of(&mut e, now, from, &two).expect("a hint");
        assert_eq!(
            hint,
            [0x85, 0x00, 0x00, 0x00, 0x02, 0x30, 0x00, 0x07, 0xa0, 0xa1, 0xec, 0xed, 0xee, 0xef]
        );
        assert!(hint.len() < two.len());
        let four = short_packet([0x12, 0x34], 4, 100);
        let hint = hint_of(&mut e, now, from, &four).expect("a hint");
        assert_eq!(
            hint,
            [
                0x85, 0x00, 0x00, 0x00, 0x02, 0x70, 0x12, 0x34, 0xa0, 0xa1, 0xa2, 0xa3, 0xec, 0xed,
                0xee, 0xef
            ]
        );
        let parsed = crate::packet::parse_hint(&hint, 2).unwrap();
        assert_eq!(
            (parsed.trigger_flags, parsed.cid, parsed.packet_number()),
            (0x70, &[0x12, 0x34][..], (0xa0a1_a2a3, 4))
        );
        assert_eq!(parsed.tag_tail, [0xec, 0xed, 0xee, 0xef]);
        let s = e.stats();
        assert_eq!(
            (s.unknown_cid, s.hints_sent, s.hints_rate_limited),
            (2, 2, 0)
        );
    }

    #[test]
    fn no_hint_for_a_long_header_a_short_trigger_another_shards_id_or_without_security() {
        let now = Instant::now();
        let from = SocketAddr::from(([198, 18, 1, 7], 7400));
        // Shard 1 of 4 (2 bits): IDs 0x4000..0x7fff are its own.
        let mut e = hinting(2, 1, 4);
        let own = short_packet([0x40, 0x01], 2, 1);
        assert!(hint_of(&mut e, now, from, &own).is_some());
        // Too short to be sealed: a header, no payload, a tag.
        let short = short_packet([0x40, 0x02], 2, 0);
        assert!(hint_of(&mut e, now, from, &short).is_none());
        // Another worker's shard: its owner answers, not this one.
        let other = short_packet([0x80, 0x01], 2, 1);
        assert!(hint_of(&mut e, now, from, &other).is_none());
        // A hint is never answered with a hint (a hub takes none), nor is any long header.
        let hint = hint_of(&mut e, now, SocketAddr::from(([198, 18, 1, 8], 1)), &own).unwrap();
        assert!(e.handle(now, from, &hint).is_none());
        for kind in [LONG_TYPE_HANDSHAKE_REPLY, LONG_TYPE_COOKIE, 0x7f] {
            let mut d = own.clone();
            d[0] = LONG_HEADER_BIT | kind;
            assert!(hint_of(&mut e, now, from, &d).is_none());
        }
        assert_eq!(e.stats().hints_sent, 2);
        // Hints off, or no security: nothing.
        let mut off = endpoint(EndpointConfig::new(2));
        assert!(off.handle(now, from, &own).is_none());
        let mut cfg = EndpointConfig::new(2);
        cfg.hints = true;
        assert!(
            Endpoint::new(cfg, None, [0; 32]).is_err(),
            "hints need security"
        );
        let mut quiet = hinting(0, 0, 1);
        quiet.cfg.hints = false;
        assert!(quiet.handle(now, from, &own).is_none());
        assert_eq!(quiet.stats().unknown_cid, 1);
    }

    #[test]
    fn hints_are_limited_per_source_and_per_endpoint() {
        let mut e = hinting(0, 0, 1);
        let t0 = Instant::now();
        let from = SocketAddr::from(([198, 18, 1, 7], 7400));
        let d = short_packet([0x00, 0x07], 2, 1);
        let sent = (0..3)
            .filter(|i| hint_of(&mut e, t0 + Duration::from_micros(300 * i), from, &d).is_some())
            .count();
        assert_eq!(sent, 2, "two to one source within a millisecond");
        assert_eq!(e.stats().hints_rate_limited, 1);

        let mut e = hinting(0, 0, 1);
        let source = |i: u32| SocketAddr::from(([198, 18, (i >> 8) as u8, i as u8], 7400));
        let sent = (0..2000)
            .filter(|&i| hint_of(&mut e, t0, source(i), &d).is_some())
            .count();
        assert_eq!(sent, 1000, "the endpoint's burst");
        for ms in 1..=5u32 {
            let now = t0 + Duration::from_millis(u64::from(ms));
            let sent = (0..100)
                .filter(|&i| hint_of(&mut e, now, source(2000 + ms * 100 + i), &d).is_some())
                .count();
            assert_eq!(sent, 2, "2,000 a second at {ms} ms");
        }
    }

    #[test]
    fn a_shard_no_worker_serves_gets_a_hint() {
        let now = Instant::now();
        let from = SocketAddr::from(([198, 18, 1, 7], 7400));
        // Three workers with two shard bits: shard 3's IDs name no worker of this hub.
        let mut e = hinting(2, 0, 3);
        let nobody = short_packet([0xc0, 0x05], 2, 1);
        assert!(hint_of(&mut e, now, from, &nobody).is_some());
        let worker_2 = short_packet([0x80, 0x05], 2, 1);
        assert!(hint_of(&mut e, now, from, &worker_2).is_none());
        let mut cfg = EndpointConfig::new(2);
        cfg.shard_bits = 2;
        cfg.shards = 5;
        assert!(
            Endpoint::new(cfg, None, [0; 32]).is_err(),
            "more shards than bits name"
        );
    }

    #[test]
    fn connection_ids_name_shard_and_slot() {
        let mut cfg = EndpointConfig::new(2);
        cfg.shard_bits = 3;
        cfg.shard = 5;
        let e = endpoint(cfg);
        assert_eq!(e.cid_for(0x1abc).as_slice(), &[0xba, 0xbc]);
        assert_eq!(e.slot_of(&[0xba, 0xbc]), Some(0x1abc));
        // Another shard's connection ID is not ours.
        assert_eq!(e.slot_of(&[0x1a, 0xbc]), None);
        let e = endpoint(EndpointConfig::new(2));
        assert_eq!(e.cid_for(0x0102).as_slice(), &[1, 2]);
        assert_eq!(e.slot_of(&[0xff, 0xff]), Some(0xffff));
        let e = endpoint(EndpointConfig::new(0));
        assert!(e.cid_for(0).is_empty());
        assert_eq!(e.slot_of(&[]), Some(0));
    }

    #[test]
    fn invalid_configs_are_refused() {
        for (cid_len, shard_bits, shard) in [(1, 0, 0), (0, 1, 0), (2, 4, 0), (2, 1, 2)] {
            let mut cfg = EndpointConfig::new(cid_len);
            cfg.shard_bits = shard_bits;
            cfg.shard = shard;
            assert!(Endpoint::new(cfg, None, [0; 32]).is_err());
        }
    }

    #[test]
    fn slots_are_fresh_first_then_least_recently_freed() {
        let mut cfg = EndpointConfig::new(2);
        cfg.shard_bits = 3;
        let mut e = endpoint(cfg);
        let peers = (0..8192u32).map(|i| {
            (
                PeerId(i),
                PeerIdentity {
                    public_key: None,
                    address: Some(SocketAddr::from(([198, 18, 0, 1], 1000 + i as u16))),
                },
            )
        });
        assert!(e.set_peers(peers).is_empty());
        let now = Instant::now();
        let make = |e: &mut Endpoint, p: u32| associate(e, now, p).map(|(h, _)| h);
        let first: Vec<AssocHandle> = (0..8192).map(|p| make(&mut e, p).unwrap()).collect();
        assert_eq!(first[8191], AssocHandle(8191));
        assert!(make(&mut e, 0).is_err(), "one association per peer");
        e.forget(first[7]);
        e.forget(first[3]);
        assert_eq!(make(&mut e, 7).unwrap(), AssocHandle(7));
        assert_eq!(make(&mut e, 3).unwrap(), AssocHandle(3));
        assert_eq!(e.stats(), EndpointStats::default());
        assert_eq!(e.set_peers([]), (0..8192).map(PeerId).collect::<Vec<_>>());
    }

    #[test]
    fn a_peer_added_and_removed_at_run_time() {
        let mut e = endpoint(EndpointConfig::new(2));
        let at = |port: u16| SocketAddr::from(([198, 18, 0, 1], port));
        let identity = |port: u16| PeerIdentity {
            public_key: Some([port as u8; KEY_LEN]),
            address: Some(at(port)),
        };
        e.set_peers([(PeerId(0), identity(1)), (PeerId(1), identity(2))]);
        assert_eq!(
            e.add_peer(PeerId(1), identity(3)),
            Err(PeerTableError::DuplicateId(PeerId(1)))
        );
        assert_eq!(
            e.add_peer(PeerId(2), identity(2)),
            Err(PeerTableError::DuplicateKey(PeerId(1)))
        );
        let same_address = PeerIdentity {
            public_key: Some([9; KEY_LEN]),
            address: Some(at(1)),
        };
        assert_eq!(
            e.add_peer(PeerId(2), same_address),
            Err(PeerTableError::DuplicateAddress(PeerId(0)))
        );
        e.add_peer(PeerId(2), identity(3)).unwrap();
        let now = Instant::now();
        let make = |e: &mut Endpoint, p: u32| associate(e, now, p).map(|(h, a)| (h, a.local_cid()));
        let (h0, _) = make(&mut e, 0).unwrap();
        let (h1, cid1) = make(&mut e, 1).unwrap();
        let (h2, _) = make(&mut e, 2).unwrap();
        assert_eq!(
            (h0, h1, h2),
            (AssocHandle(0), AssocHandle(1), AssocHandle(2))
        );
        assert_eq!(
            e.remove_peer(PeerId(1)),
            Some(RemovedPeer {
                association: Some(h1)
            })
        );
        assert_eq!(e.remove_peer(PeerId(1)), None);
        assert_eq!(e.association_of(PeerId(1)), None);
        assert!(make(&mut e, 1).is_err(), "no longer a peer");
        // Its connection ID and its address name nothing; the others route as before.
        let mut short = vec![0u8; 20];
        short[1..3].copy_from_slice(cid1.as_slice());
        assert!(e.handle(now, at(2), &short).is_none());
        assert_eq!(e.stats().unknown_cid, 1);
        let hello = [LONG_HEADER_BIT | LONG_TYPE_HELLO, 0, 0, 0];
        assert!(e.handle(now, at(2), &hello).is_none());
        assert_eq!(e.stats().unknown_address, 1);
        assert!(matches!(
            e.handle(now, at(3), &hello),
            Some(DatagramEvent::Routed(h)) if h == h2
        ));
        // Its key and address may be another peer's now.
        e.add_peer(PeerId(3), identity(2)).unwrap();
        assert!(e.association_of(PeerId(3)).is_none());
    }
}
