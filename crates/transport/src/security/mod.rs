//! Peer authentication and packet protection: a Noise IK handshake (snow) at association
//! start and at every rekey, then ChaCha20-Poly1305 per packet with the packet number as
//! nonce. Layout and rules: docs/PROTOCOL.md, "Security".

mod counts;
mod keys;

use std::time::Duration;

pub use counts::SecurityCounts;
pub use keys::{private_key_from_random, public_key, KEY_LEN};

/// What a gateway needs to authenticate its peer and protect the tunnel.
#[derive(Clone, PartialEq, Eq)]
pub struct SecurityConfig {
    pub local_private_key: [u8; KEY_LEN],
    pub peer_public_key: [u8; KEY_LEN],
    /// Mixed into the handshake (Noise `psk2`) when set.
    pub psk: Option<[u8; KEY_LEN]>,
    /// Keys older than this are replaced by a new handshake.
    pub rekey_interval: Duration,
    /// Packets sent or received under one key before it is replaced.
    pub rekey_after_packets: u64,
    /// The AEADs we accept for packets, most preferred first (sent in our HELLO).
    pub aeads: AeadOffer,
}

impl SecurityConfig {
    pub fn local_identity(&self) -> LocalIdentity {
        LocalIdentity {
            private_key: self.local_private_key,
            psk: self.psk,
        }
    }
}

/// What a gateway proves itself with in every handshake, whoever the peer.
#[derive(Clone, PartialEq, Eq)]
pub struct LocalIdentity {
    pub private_key: [u8; KEY_LEN],
    /// Mixed into every handshake (Noise `psk2`) when set: the pattern is fixed before the
    /// initiator is known, so the key is the same for all peers.
    pub psk: Option<[u8; KEY_LEN]>,
}

impl std::fmt::Debug for LocalIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalIdentity")
            .field("public_key", &public_key(&self.private_key))
            .field("psk", &self.psk.map(|_| "<set>"))
            .finish()
    }
}

impl std::fmt::Debug for SecurityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecurityConfig")
            .field("local_public_key", &public_key(&self.local_private_key))
            .field("peer_public_key", &self.peer_public_key)
            .field("psk", &self.psk.map(|_| "<set>"))
            .field("rekey_interval", &self.rekey_interval)
            .field("rekey_after_packets", &self.rekey_after_packets)
            .field("aeads", &self.aeads)
            .finish()
    }
}

mod aead;
mod cookie;
mod handshake;
mod hint;
mod limiter;
mod macs;
mod negotiate;
mod replay;

pub use crate::packet::{AeadOffer, MAX_OFFERED};
pub use aead::{PacketProtection, TAG_LEN};
pub use cookie::COOKIE_SECRET_LIFETIME;
pub(crate) use hint::HintBudget;
pub use hint::{
    HintCounts, HINTS_PER_SECOND, HINTS_PER_SOURCE_PER_SECOND, HINT_BURST, HINT_SOURCE_BURST,
};
pub use limiter::{
    InitiationMemory, HANDSHAKES_PER_SECOND, HANDSHAKE_BURST, PER_SOURCE_BURST,
    PER_SOURCE_PER_SECOND, RECENT_INITIATIONS,
};
pub use negotiate::{hardware_aes, negotiate};
pub use replay::REPLAY_WINDOW;

use std::time::Instant;

use crate::codec::{expand_truncated, Reader};
use crate::ids::ConnectionId;
use crate::packet::{decode_header, Header, Hello, ShortHeader};
use aead::PacketKey;
pub(crate) use cookie::{cookie_dcid, CookieJar};
pub(crate) use handshake::{
    initiation_ephemeral, parse_init, parse_reply, EphemeralSource, Responder, SessionKeys,
    SplitKeys,
};
use handshake::{Initiation, Refusal};
pub(crate) use limiter::{HandshakeGuard, SourceBudgets, TokenBucket};
pub(crate) use macs::{init_mac1, init_mac1_ok, reply_mac1_ok, MacKeys};
use replay::ReplayWindow;

/// Fills the MACs of an INIT for the responder whose static key is `responder_public_key`
/// (mac2 from `cookie`, zeros without one), as every initiator does. Public because
/// anyone who knows that key can: tests forge initiations a responder must screen.
pub fn stamp_initiation_macs(
    datagram: &mut [u8],
    responder_public_key: &[u8; KEY_LEN],
    cookie: Option<&[u8; 16]>,
) {
    macs::stamp_init(datagram, &MacKeys::of(responder_public_key), cookie);
}

/// Sends of one initiation before a fresh one (new ephemeral) replaces it: a responder that
/// lost its state since refuses the old one as a replay.
const SENDS_PER_INITIATION: u32 = 3;

/// Initiations HINTs may start or pull forward per second (burst one): a forged hint costs
/// the hub at most one handshake a second per terminal.
const HINTED_INITIATIONS_PER_SECOND: u32 = 1;

/// Why the security layer dropped a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    Unauthenticated,
    Replayed,
    HandshakeInvalid,
    HandshakeUnknownPeer,
    HandshakeRateLimited,
    HandshakeReplayed,
    HandshakeBadMac,
    CookieInvalid,
    AeadMismatch,
}

impl DropReason {
    pub(crate) fn count(self, c: &mut SecurityCounts) {
        let n = match self {
            DropReason::Unauthenticated => &mut c.unauthenticated,
            DropReason::Replayed => &mut c.replayed,
            DropReason::HandshakeInvalid => &mut c.handshake_invalid,
            DropReason::HandshakeUnknownPeer => &mut c.handshake_unknown_peer,
            DropReason::HandshakeRateLimited => &mut c.handshake_rate_limited,
            DropReason::HandshakeReplayed => &mut c.handshake_replayed,
            DropReason::HandshakeBadMac => &mut c.handshake_bad_mac,
            DropReason::CookieInvalid => &mut c.cookie_invalid,
            DropReason::AeadMismatch => &mut c.aead_mismatch,
        };
        *n += 1;
    }
}

impl From<Refusal> for DropReason {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid => DropReason::HandshakeInvalid,
        }
    }
}

/// The keys packets are sent and received under now.
struct Session {
    phase: bool,
    keys: SessionKeys,
    installed_at: Instant,
    /// Our next packet number when installed, for the packet-count rekey trigger.
    first_pn_sent: u64,
    /// The replay window's front when installed.
    first_pn_received: u64,
    /// Lowest packet number this key may still seal: a nonce is never used twice.
    next_seal: u64,
}

struct InitiationInFlight {
    init: Initiation,
    next_send: Instant,
    sends: u32,
    /// A cookie was taken in answer to this initiation: another COOKIE for it is a replay.
    cookie_taken: bool,
}

/// A reply sent and not yet confirmed: the keys are used once the initiator's first packet
/// under them arrives, which a replayed initiation can never produce.
pub(crate) struct PendingReply {
    ephemeral: [u8; KEY_LEN],
    datagram: Vec<u8>,
    keys: SessionKeys,
    /// The initiator's HELLO (encoded), applied on confirmation.
    pub(crate) peer_hello: crate::packet::Hello,
    /// Whether packet numbers under these keys start afresh (a new association).
    pub(crate) fresh_numbers: bool,
    answered_at: Instant,
}

impl PendingReply {
    pub(crate) fn into_keys(self) -> SessionKeys {
        self.keys
    }
}

/// A short packet that authenticated.
pub(crate) struct Opened {
    pub(crate) pn: u64,
    pub(crate) payload_len: usize,
    /// It came under the keys of our pending reply: the handshake is confirmed.
    pub(crate) confirmed: Option<PendingReply>,
}

/// An initiation that authenticated, read by an endpoint for one of its associations: what
/// the association needs to answer it. The initiator's static key was looked up by then.
pub struct AcceptedInitiation {
    pub(crate) responder: Box<Responder>,
    pub(crate) ephemeral: [u8; KEY_LEN],
    pub(crate) remote_static: [u8; KEY_LEN],
    pub(crate) hello: Hello,
}

impl AcceptedInitiation {
    /// The initiator's static public key, as the handshake authenticated it.
    pub fn remote_static(&self) -> [u8; KEY_LEN] {
        self.remote_static
    }

    /// The connection ID the initiator wants in the packets it receives.
    pub fn initiator_cid(&self) -> ConnectionId {
        self.hello.cid
    }
}

impl std::fmt::Debug for AcceptedInitiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptedInitiation")
            .field("remote_static", &self.remote_static)
            .field("hello", &self.hello)
            .finish_non_exhaustive()
    }
}

/// The HELLO an initiation carried, if it is of our version and names the same connection
/// ID as the INIT did in clear: what routed the reply must be what the initiator asked for.
pub(crate) fn initiation_hello(payload: &[u8], scid: ConnectionId) -> Result<Hello, DropReason> {
    match decode_header(&mut Reader::new(payload)) {
        Ok(Header::Hello(h)) if h.version == crate::PROTOCOL_VERSION && h.cid == scid => Ok(h),
        _ => Err(DropReason::HandshakeInvalid),
    }
}

/// What an initiation asks of the association.
pub(crate) enum InitiationRead {
    /// The initiator's HELLO and the responder state that answers it.
    Answer {
        responder: Box<Responder>,
        ephemeral: [u8; KEY_LEN],
        hello: Hello,
    },
    /// A copy of the initiation we already answered: the reply is queued again.
    Repeated,
    /// Both sides initiated; ours takes precedence.
    Collision,
    Dropped(DropReason),
}

pub(crate) struct Security {
    cfg: SecurityConfig,
    /// The side with the greater static public key wins simultaneous initiations and is
    /// the one that rekeys.
    leads: bool,
    source: EphemeralSource,
    current: Option<Session>,
    previous_recv: Option<(bool, PacketKey)>,
    initiation: Option<InitiationInFlight>,
    /// An initiation to another hub of the peer's address list, tried while the one we
    /// send to is silent (docs/PROTOCOL.md §10): where it goes, and its state.
    trial: Option<(std::net::SocketAddr, InitiationInFlight)>,
    pending: Option<PendingReply>,
    outbox: Option<Vec<u8>>,
    replay: ReplayWindow,
    /// Replay memory and work budget for initiations: `None` when an endpoint screens them
    /// (and the REPLYs routed to us) before they arrive.
    guard: Option<Box<HandshakeGuard>>,
    /// Keys of the MACs we send the peer, and of the cookies it sends us.
    peer_macs: MacKeys,
    /// Key of the MACs the peer sends us.
    own_macs: MacKeys,
    /// The peer's last cookie and when it came: our initiations carry it as mac2.
    cookie: Option<(Instant, macs::Tag)>,
    /// Initiations a HINT may call for: one a second.
    hint_budget: TokenBucket,
    /// A HINT asked for an initiation from then on (none was in flight).
    hinted_at: Option<Instant>,
}

impl Security {
    pub(crate) fn new(
        cfg: SecurityConfig,
        seed: [u8; 32],
        guard: Option<Box<HandshakeGuard>>,
    ) -> Self {
        let leads = public_key(&cfg.local_private_key) > cfg.peer_public_key;
        let peer_macs = MacKeys::of(&cfg.peer_public_key);
        let own_macs = MacKeys::of(&public_key(&cfg.local_private_key));
        Security {
            cfg,
            leads,
            source: EphemeralSource::new(seed),
            current: None,
            previous_recv: None,
            initiation: None,
            trial: None,
            pending: None,
            outbox: None,
            replay: ReplayWindow::default(),
            guard,
            peer_macs,
            own_macs,
            cookie: None,
            hint_budget: TokenBucket::new(HINTED_INITIATIONS_PER_SECOND, 1),
            hinted_at: None,
        }
    }

    /// Forgets every session key and handshake in progress: the association restarted and
    /// its packet numbers begin again, so no key may be used twice with them.
    pub(crate) fn reset_session(&mut self) {
        self.current = None;
        self.previous_recv = None;
        self.initiation = None;
        self.trial = None;
        self.pending = None;
        self.outbox = None;
        self.hinted_at = None;
        self.replay = ReplayWindow::default();
    }

    /// A HINT matched a packet of ours: the initiation in flight goes at once, or one
    /// starts now. False when one was acted on within the last second.
    pub(crate) fn on_matched_hint(&mut self, now: Instant) -> bool {
        if !self.hint_budget.try_take(now) {
            return false;
        }
        match self.initiation.as_mut() {
            Some(i) => i.next_send = i.next_send.min(now),
            None => self.hinted_at = Some(now),
        }
        true
    }

    /// The AEAD of the keys in use, once a handshake completed.
    pub(crate) fn protection(&self) -> Option<PacketProtection> {
        self.current.as_ref().map(|s| s.keys.protection)
    }

    /// The AEADs we accept, for our HELLO.
    pub(crate) fn offer(&self) -> AeadOffer {
        self.cfg.aeads
    }

    /// The packet keys of a handshake whose peer sent `peer_hello`: under the AEAD both
    /// offers settle on, or none if they have none in common.
    pub(crate) fn session_keys(
        &self,
        split: SplitKeys,
        peer_hello: &Hello,
    ) -> Result<SessionKeys, DropReason> {
        let theirs = peer_hello.aeads.unwrap_or_else(AeadOffer::implied);
        negotiate(&self.cfg.aeads, &theirs)
            .map(|p| split.protect(p))
            .ok_or(DropReason::AeadMismatch)
    }

    pub(crate) fn key_phase(&self) -> bool {
        self.current.as_ref().is_some_and(|s| s.phase)
    }

    /// Whether `pn` may be sealed under the current key: there is one, and the number was
    /// never used with it. Checked before a packet is built, so a bug can only cost a send.
    pub(crate) fn may_seal(&self, pn: u64) -> bool {
        self.current.as_ref().is_some_and(|s| pn >= s.next_seal)
    }

    /// Seals under the current key; callers asked `may_seal` first.
    pub(crate) fn seal(&mut self, pn: u64, header_len: usize, packet: &mut Vec<u8>) {
        if let Some(s) = self.current.as_mut() {
            s.keys.send.seal(pn, header_len, packet);
            s.next_seal = pn + 1;
        }
    }

    /// A handshake datagram to send ahead of anything else.
    pub(crate) fn take_outbox(&mut self) -> Option<Vec<u8>> {
        self.outbox.take()
    }

    pub(crate) fn has_outbox(&self) -> bool {
        self.outbox.is_some()
    }

    /// Whether we answered an initiation within `window` and wait for its confirmation: an
    /// initiation of our own would only cross it.
    pub(crate) fn awaiting_confirmation(&self, now: Instant, window: std::time::Duration) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| now < p.answered_at + window)
    }

    /// Whether an initiation of ours is in flight.
    pub(crate) fn initiating(&self) -> bool {
        self.initiation.is_some()
    }

    /// Whether a (re)key initiation should leave now while established.
    pub(crate) fn rekey_due(&self, now: Instant, next_pn: u64) -> bool {
        if let Some(i) = &self.initiation {
            return i.next_send <= now;
        }
        self.hinted_at.is_some_and(|t| t <= now)
            || self.rekey_deadline().is_some_and(|t| t <= now)
            || self.rekey_by_count(next_pn)
    }

    fn rekey_by_count(&self, next_pn: u64) -> bool {
        self.leads
            && self.current.as_ref().is_some_and(|s| {
                next_pn - s.first_pn_sent >= self.cfg.rekey_after_packets
                    || self.replay.front() - s.first_pn_received >= self.cfg.rekey_after_packets
            })
    }

    fn rekey_deadline(&self) -> Option<Instant> {
        if !self.leads {
            return None;
        }
        self.current
            .as_ref()
            .map(|s| s.installed_at + self.cfg.rekey_interval)
    }

    /// The earliest time a handshake datagram may be due.
    pub(crate) fn deadline(&self, established: bool) -> Option<Instant> {
        if let Some(i) = &self.initiation {
            return Some(i.next_send);
        }
        if established {
            [self.hinted_at, self.rekey_deadline()]
                .into_iter()
                .flatten()
                .min()
        } else {
            None
        }
    }

    /// The initiation to send now (a retransmission of the one in flight, or a new one
    /// carrying `hello()`), due again after `retransmit_after`.
    pub(crate) fn initiation(
        &mut self,
        now: Instant,
        retransmit_after: std::time::Duration,
        hello: impl FnOnce() -> Vec<u8>,
        scid: ConnectionId,
    ) -> Option<Vec<u8>> {
        let stale = self
            .initiation
            .as_ref()
            .is_some_and(|i| i.sends >= SENDS_PER_INITIATION);
        if self.initiation.is_none() || stale {
            let fresh = self.fresh_initiation(now, &hello(), scid)?;
            self.hinted_at = None;
            self.initiation = Some(fresh);
        }
        let cookie = self
            .cookie
            .filter(|(at, _)| now < *at + COOKIE_SECRET_LIFETIME)
            .map(|(_, c)| c);
        let i = self.initiation.as_mut()?;
        i.sends += 1;
        i.next_send = now + retransmit_after;
        let mut d = i.init.datagram.clone();
        if let Some(c) = &cookie {
            macs::stamp_init(&mut d, &self.peer_macs, Some(c));
        }
        Some(d)
    }

    /// The trial initiation to `to`, sent now: a fresh one (new ephemeral, `hello()`) when
    /// none is in flight to that address, else a copy of the one that is. Ours in flight
    /// to the hub we send to stays as it is.
    pub(crate) fn trial_initiation(
        &mut self,
        now: Instant,
        to: std::net::SocketAddr,
        hello: impl FnOnce() -> Vec<u8>,
        scid: ConnectionId,
    ) -> Option<Vec<u8>> {
        if self.trial.as_ref().is_none_or(|(at, _)| *at != to) {
            let fresh = self.fresh_initiation(now, &hello(), scid)?;
            self.trial = Some((to, fresh));
        }
        let (_, i) = self.trial.as_mut()?;
        i.sends += 1;
        Some(i.init.datagram.clone())
    }

    /// A new initiation (a fresh ephemeral key) carrying `hello`, stamped with mac1, due
    /// now and not sent yet.
    fn fresh_initiation(
        &mut self,
        now: Instant,
        hello: &[u8],
        scid: ConnectionId,
    ) -> Option<InitiationInFlight> {
        let mut init = Initiation::start(
            &self.cfg.local_identity(),
            &self.cfg.peer_public_key,
            &mut self.source,
            hello,
            scid,
        )
        .ok()?;
        macs::stamp_init(&mut init.datagram, &self.peer_macs, None);
        Some(InitiationInFlight {
            init,
            next_send: now,
            sends: 0,
            cookie_taken: false,
        })
    }

    /// Forgets the trial initiation: its hub's reply, if one comes, is dropped.
    pub(crate) fn end_trial(&mut self) {
        self.trial = None;
    }

    /// Reads the reply to the trial initiation from `from`, as [`read_reply`] does for ours:
    /// the responder's HELLO (encoded) and the keys.
    ///
    /// [`read_reply`]: Self::read_reply
    pub(crate) fn read_trial_reply(
        &mut self,
        now: Instant,
        from: std::net::SocketAddr,
        datagram: &[u8],
        local_cid_len: usize,
    ) -> Result<(Vec<u8>, SplitKeys), DropReason> {
        let (_, noise) =
            handshake::parse_reply(datagram, local_cid_len).ok_or(DropReason::HandshakeInvalid)?;
        if self.trial.as_ref().is_none_or(|(to, _)| *to != from) {
            return Err(DropReason::HandshakeInvalid);
        }
        if !macs::reply_mac1_ok(datagram, &self.own_macs) {
            return Err(DropReason::HandshakeBadMac);
        }
        if !self.take_token(now) {
            return Err(DropReason::HandshakeRateLimited);
        }
        let (_, i) = self.trial.as_mut().ok_or(DropReason::HandshakeInvalid)?;
        let done = i.init.finish(noise)?;
        self.trial = None;
        Ok(done)
    }

    /// A busy responder's COOKIE answering our initiation in flight: kept for the
    /// initiations that follow (their mac2), and the initiation is due again at once. Only
    /// the first COOKIE for an initiation counts, so replaying one changes nothing.
    pub(crate) fn on_cookie(
        &mut self,
        now: Instant,
        datagram: &[u8],
        local_cid_len: usize,
    ) -> Result<(), DropReason> {
        let i = self
            .initiation
            .as_mut()
            .filter(|i| !i.cookie_taken)
            .ok_or(DropReason::CookieInvalid)?;
        let mac1 = macs::init_mac1(&i.init.datagram).ok_or(DropReason::CookieInvalid)?;
        let cookie = cookie::open_cookie(datagram, local_cid_len, &self.peer_macs, &mac1)
            .ok_or(DropReason::CookieInvalid)?;
        i.cookie_taken = true;
        i.next_send = now;
        self.cookie = Some((now, cookie));
        Ok(())
    }

    /// Whether the guard (if this association has one) grants the work of one handshake
    /// message. Without one, the endpoint took the token before routing the message here.
    fn take_token(&mut self, now: Instant) -> bool {
        self.guard.as_mut().is_none_or(|g| g.bucket.try_take(now))
    }

    /// Reads a handshake initiation. Work is bounded: replays are refused before any
    /// Diffie-Hellman, the rest is rate limited.
    pub(crate) fn read_initiation(&mut self, now: Instant, datagram: &[u8]) -> InitiationRead {
        let Some((scid, noise)) = handshake::parse_init(datagram) else {
            return InitiationRead::Dropped(DropReason::HandshakeInvalid);
        };
        let Some(ephemeral) = handshake::initiation_ephemeral(noise) else {
            return InitiationRead::Dropped(DropReason::HandshakeInvalid);
        };
        if !macs::init_mac1_ok(datagram, &self.own_macs) {
            return InitiationRead::Dropped(DropReason::HandshakeBadMac);
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.ephemeral == ephemeral)
        {
            // Our reply was lost: send the same one again (a new one would not match
            // keys the initiator may already hold). Rate limited like new work, so
            // replaying the initiation cannot turn us into a reflector.
            if !self.take_token(now) {
                return InitiationRead::Dropped(DropReason::HandshakeRateLimited);
            }
            self.outbox = self.pending.as_ref().map(|p| p.datagram.clone());
            return InitiationRead::Repeated;
        }
        let Some(guard) = self.guard.as_mut() else {
            // The endpoint routes an initiation here only as a copy of one it answered.
            return InitiationRead::Dropped(DropReason::HandshakeReplayed);
        };
        if guard.recent.contains(&ephemeral) {
            return InitiationRead::Dropped(DropReason::HandshakeReplayed);
        }
        if self.initiation.is_some() && self.leads {
            return InitiationRead::Collision;
        }
        if !guard.bucket.try_take(now) {
            return InitiationRead::Dropped(DropReason::HandshakeRateLimited);
        }
        let (responder, remote, payload) =
            match Responder::read(&self.cfg.local_identity(), &mut self.source, noise) {
                Ok(r) => r,
                // Not remembered: anyone may copy a genuine initiation's ephemeral key
                // into a forgery, and the genuine one must still be answered.
                Err(r) => return InitiationRead::Dropped(r.into()),
            };
        // IK authenticates the initiator's static key; it must be the one configured.
        if remote != self.cfg.peer_public_key {
            guard.recent.insert(ephemeral);
            return InitiationRead::Dropped(DropReason::HandshakeUnknownPeer);
        }
        match initiation_hello(&payload, scid) {
            Ok(hello) => {
                guard.recent.insert(ephemeral);
                InitiationRead::Answer {
                    responder: Box::new(responder),
                    ephemeral,
                    hello,
                }
            }
            // The source connection ID in clear is outside the Noise message: a copy
            // with another one is a forgery, and is not remembered either.
            Err(d) => InitiationRead::Dropped(d),
        }
    }

    /// Takes an initiation an endpoint read and authenticated for this association.
    /// `ours_sent`: whether an initiation of ours in flight could have reached the peer.
    pub(crate) fn accept_initiation(
        &mut self,
        a: AcceptedInitiation,
        ours_sent: bool,
    ) -> InitiationRead {
        if a.remote_static != self.cfg.peer_public_key {
            return InitiationRead::Dropped(DropReason::HandshakeUnknownPeer);
        }
        if self.initiation.is_some() && self.leads && ours_sent {
            return InitiationRead::Collision;
        }
        InitiationRead::Answer {
            responder: a.responder,
            ephemeral: a.ephemeral,
            hello: a.hello,
        }
    }

    /// Answers an authenticated initiation; the keys wait for the initiator's confirmation.
    /// Without an AEAD in common the reply still goes (it carries our offer, so the
    /// initiator can tell why, authenticated) but no keys wait: `AeadMismatch`.
    pub(crate) fn answer(
        &mut self,
        now: Instant,
        responder: Box<Responder>,
        ephemeral: [u8; KEY_LEN],
        our_hello: &[u8],
        peer_hello: crate::packet::Hello,
        fresh_numbers: bool,
    ) -> Result<(), DropReason> {
        let (mut datagram, split) = responder.reply(our_hello, peer_hello.cid)?;
        macs::stamp_reply(&mut datagram, &self.peer_macs);
        // The peer's initiation won: ours would only collide with it.
        self.initiation = None;
        self.outbox = Some(datagram.clone());
        let keys = self.session_keys(split, &peer_hello)?;
        self.pending = Some(PendingReply {
            ephemeral,
            datagram,
            keys,
            peer_hello,
            fresh_numbers,
            answered_at: now,
        });
        Ok(())
    }

    /// Reads the reply to our initiation: the responder's HELLO (encoded) and the keys.
    pub(crate) fn read_reply(
        &mut self,
        now: Instant,
        datagram: &[u8],
        local_cid_len: usize,
    ) -> Result<(Vec<u8>, SplitKeys), DropReason> {
        let (_, noise) =
            handshake::parse_reply(datagram, local_cid_len).ok_or(DropReason::HandshakeInvalid)?;
        if self.initiation.is_none() {
            return Err(DropReason::HandshakeInvalid);
        }
        if !macs::reply_mac1_ok(datagram, &self.own_macs) {
            return Err(DropReason::HandshakeBadMac);
        }
        if !self.take_token(now) {
            return Err(DropReason::HandshakeRateLimited);
        }
        let i = self
            .initiation
            .as_mut()
            .ok_or(DropReason::HandshakeInvalid)?;
        let done = i.init.finish(noise)?;
        self.initiation = None;
        Ok(done)
    }

    /// Puts new keys in use. `rekey`: the association goes on and the old receive key
    /// stays for packets still in flight under it.
    pub(crate) fn install(
        &mut self,
        keys: SessionKeys,
        phase: bool,
        rekey: bool,
        now: Instant,
        next_pn: u64,
    ) {
        let old = self.current.take();
        self.previous_recv = if rekey {
            old.map(|s| (s.phase, s.keys.recv))
        } else {
            None
        };
        self.current = Some(Session {
            phase,
            keys,
            installed_at: now,
            first_pn_sent: next_pn,
            first_pn_received: self.replay.front(),
            next_seal: next_pn,
        });
    }

    pub(crate) fn next_phase(&self) -> bool {
        !self.key_phase()
    }

    /// Authenticates a short packet (in `packet`, a copy of the datagram) under whichever
    /// key its phase and tag fit.
    pub(crate) fn open(
        &mut self,
        short: &ShortHeader,
        expected: u64,
        packet: &mut [u8],
    ) -> Result<Opened, DropReason> {
        let header_len = short.encoded_len();
        let expand = |reference: u64| expand_truncated(short.pn_truncated, short.pn_len, reference);
        // The current and the previous key share this association's packet numbers and its
        // replay window; the phase bit says which of them may have sealed the packet.
        let pn = expand(expected);
        let same_numbers = [
            self.current
                .as_ref()
                .filter(|s| s.phase == short.key_phase)
                .map(|s| &s.keys.recv),
            self.previous_recv
                .as_ref()
                .filter(|(phase, _)| *phase == short.key_phase)
                .map(|(_, key)| key),
        ];
        let has_candidate = same_numbers.iter().any(Option::is_some);
        let fresh = self.replay.is_fresh(pn);
        // Then the keys of a reply awaiting confirmation: (packet number, key, confirms).
        let confirming = self
            .pending
            .as_ref()
            .filter(|p| p.fresh_numbers || fresh)
            .map(|p| {
                let pn = if p.fresh_numbers { expand(0) } else { pn };
                (pn, &p.keys.recv, true)
            });
        let [current, previous] = same_numbers.map(|k| k.filter(|_| fresh).map(|k| (pn, k, false)));
        let candidates = [current, previous, confirming];
        // ring zeroes what fails to authenticate, so a key tried after another failed
        // needs the packet as it arrived. Most packets have one candidate and no copy.
        let arrived = (candidates.iter().flatten().count() > 1).then(|| packet.to_vec());
        let opened = candidates.into_iter().flatten().enumerate().find_map(
            |(attempt, (pn, key, confirms))| {
                if let (true, Some(arrived)) = (attempt > 0, &arrived) {
                    packet.copy_from_slice(arrived);
                }
                let payload_len = key.open(pn, header_len, packet).ok()?;
                Some((pn, payload_len, confirms))
            },
        );
        match opened {
            Some((pn, payload_len, false)) => {
                self.replay.record(pn);
                return Ok(Opened {
                    pn,
                    payload_len,
                    confirmed: None,
                });
            }
            Some((pn, payload_len, true)) => {
                return Ok(Opened {
                    pn,
                    payload_len,
                    confirmed: self.pending.take(),
                })
            }
            None => {}
        }
        Err(if has_candidate && !fresh {
            DropReason::Replayed
        } else {
            DropReason::Unauthenticated
        })
    }

    /// Records the packet number of a confirming packet once its keys are installed (the
    /// window may have been reset for a new association in between).
    pub(crate) fn record(&mut self, pn: u64) {
        self.replay.record(pn);
    }
}
