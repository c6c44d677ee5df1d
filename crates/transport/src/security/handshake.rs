//! The Noise IK handshake (through snow): who the peer is, and the packet keys of one
//! session. The initiator's message carries its HELLO and the responder's reply its own, so
//! the association parameters are authenticated with the keys.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};
use snow::HandshakeState;

use super::aead::{PacketKey, PacketProtection};
use super::macs::{INIT_MACS, REPLY_MACS};
use super::{LocalIdentity, KEY_LEN};
use crate::codec::Reader;
use crate::ids::ConnectionId;
use crate::packet::{
    HANDSHAKE_HEADER_LEN, LONG_HEADER_BIT, LONG_TYPE_HANDSHAKE_INIT, LONG_TYPE_HANDSHAKE_REPLY,
};
use crate::PROTOCOL_VERSION;

const PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
const PATTERN_PSK: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
/// Binds both messages to this protocol and version.
const PROLOGUE: &[u8] = b"pepd tunnel v2";
/// Bound on a handshake datagram; ours are under 250 bytes.
const MAX_MESSAGE: usize = 512;

/// Why a handshake message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Invalid,
}

/// The two packet keys of a session, seen from one side.
pub(crate) struct SessionKeys {
    pub(crate) protection: PacketProtection,
    pub(crate) send: PacketKey,
    pub(crate) recv: PacketKey,
}

/// The two 32-byte secrets a completed handshake yields, seen from one side: keys for
/// whichever AEAD the two HELLOs settle on, which is known only once the peer's is read.
pub(crate) struct SplitKeys {
    send: [u8; KEY_LEN],
    recv: [u8; KEY_LEN],
}

impl SplitKeys {
    pub(crate) fn protect(self, protection: PacketProtection) -> SessionKeys {
        SessionKeys {
            protection,
            send: PacketKey::new(protection, &self.send),
            recv: PacketKey::new(protection, &self.recv),
        }
    }
}

/// Our initiation in flight: the exact datagram (retransmitted as is, so any reply to any
/// copy completes it) and the state that reads the reply.
pub(crate) struct Initiation {
    state: HandshakeState,
    pub(crate) datagram: Vec<u8>,
}

/// A responder that has read an initiation and not yet replied.
pub(crate) struct Responder {
    state: HandshakeState,
}

/// Deterministic randomness for ephemeral keys: the caller seeds the association, so the
/// simulator replays runs exactly and the core never reads the OS.
pub(crate) struct EphemeralSource {
    rng: ChaCha20Rng,
}

impl EphemeralSource {
    pub(crate) fn new(seed: [u8; 32]) -> Self {
        EphemeralSource {
            rng: ChaCha20Rng::from_seed(seed),
        }
    }

    /// Seed for another source (an association an endpoint creates).
    pub(crate) fn seed(&mut self) -> [u8; 32] {
        let mut seed = [0u8; 32];
        self.rng.fill_bytes(&mut seed);
        seed
    }

    fn resolver(&mut self) -> Box<dyn CryptoResolver + Send> {
        let mut seed = [0u8; 32];
        self.rng.fill_bytes(&mut seed);
        Box::new(SeededResolver { seed })
    }
}

struct SeededResolver {
    seed: [u8; 32],
}

struct SeededRandom(ChaCha20Rng);

impl Random for SeededRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

impl CryptoResolver for SeededResolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        Some(Box::new(SeededRandom(ChaCha20Rng::from_seed(self.seed))))
    }
    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        DefaultResolver.resolve_dh(choice)
    }
    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}

fn builder<'a>(
    local: &'a LocalIdentity,
    source: &mut EphemeralSource,
) -> Result<snow::Builder<'a>, snow::Error> {
    let pattern = if local.psk.is_some() {
        PATTERN_PSK
    } else {
        PATTERN
    };
    let params = pattern.parse().expect("the pattern names are valid");
    let mut b = snow::Builder::with_resolver(params, source.resolver())
        .prologue(PROLOGUE)?
        .local_private_key(&local.private_key)?;
    if let Some(psk) = &local.psk {
        b = b.psk(2, psk)?;
    }
    Ok(b)
}

/// `type | version | (INIT: scid_len scid; REPLY: dcid) | Noise message | MACs`, the MACs
/// zero until the sender stamps them for its peer (`macs`).
fn handshake_datagram(kind: u8, cid: ConnectionId, noise: &[u8]) -> Vec<u8> {
    let (prefixed, macs) = if kind == LONG_TYPE_HANDSHAKE_INIT {
        (true, INIT_MACS)
    } else {
        (false, REPLY_MACS)
    };
    let mut d = Vec::with_capacity(HANDSHAKE_HEADER_LEN + 1 + cid.len() + noise.len() + macs);
    d.push(LONG_HEADER_BIT | kind);
    d.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    if prefixed {
        cid.write_prefixed(&mut d);
    } else {
        d.extend_from_slice(cid.as_slice());
    }
    d.extend_from_slice(noise);
    d.resize(d.len() + macs, 0);
    d
}

/// The version field and what follows it, refusing other versions and oversized datagrams.
pub(super) fn versioned_body(datagram: &[u8]) -> Option<Reader<'_>> {
    let version = datagram.get(1..HANDSHAKE_HEADER_LEN)?;
    if version != PROTOCOL_VERSION.to_be_bytes() || datagram.len() > MAX_MESSAGE {
        return None;
    }
    Some(Reader::new(&datagram[HANDSHAKE_HEADER_LEN..]))
}

/// The Noise message between the connection ID and the MACs.
fn noise_before_macs<'a>(r: &mut Reader<'a>, macs: usize) -> Option<&'a [u8]> {
    let rest = r.rest();
    rest.get(..rest.len().checked_sub(macs)?)
}

/// An INIT split into its fields. `None`: another version, or not an INIT of ours.
pub(crate) fn parse_init(datagram: &[u8]) -> Option<(ConnectionId, &[u8])> {
    let mut r = versioned_body(datagram)?;
    let scid = ConnectionId::read_prefixed(&mut r).ok()?;
    Some((scid, noise_before_macs(&mut r, INIT_MACS)?))
}

/// A REPLY split into its DCID (of the length the initiator chose, `local_cid_len`) and
/// Noise message.
pub(crate) fn parse_reply(datagram: &[u8], local_cid_len: usize) -> Option<(ConnectionId, &[u8])> {
    let mut r = versioned_body(datagram)?;
    let dcid = ConnectionId::read(&mut r, local_cid_len).ok()?;
    Some((dcid, noise_before_macs(&mut r, REPLY_MACS)?))
}

/// The initiator's ephemeral public key: the first field of its message, used to spot
/// replays before any Diffie-Hellman work.
pub(crate) fn initiation_ephemeral(noise: &[u8]) -> Option<[u8; KEY_LEN]> {
    noise.get(..KEY_LEN)?.try_into().ok()
}

impl Initiation {
    /// `scid`: our connection ID, in clear for routing; `hello` carries it again, encrypted.
    pub(crate) fn start(
        local: &LocalIdentity,
        peer_public_key: &[u8; KEY_LEN],
        source: &mut EphemeralSource,
        hello: &[u8],
        scid: ConnectionId,
    ) -> Result<Self, snow::Error> {
        let mut state = builder(local, source)?
            .remote_public_key(peer_public_key)?
            .build_initiator()?;
        let mut buf = [0u8; MAX_MESSAGE];
        let n = state.write_message(hello, &mut buf)?;
        Ok(Initiation {
            state,
            datagram: handshake_datagram(LONG_TYPE_HANDSHAKE_INIT, scid, &buf[..n]),
        })
    }

    /// Reads the responder's reply: its HELLO and the session keys. A reply that fails
    /// leaves the initiation usable for the genuine one.
    pub(crate) fn finish(&mut self, noise: &[u8]) -> Result<(Vec<u8>, SplitKeys), Refusal> {
        let mut payload = [0u8; MAX_MESSAGE];
        let n = self
            .state
            .read_message(noise, &mut payload)
            .map_err(|_| Refusal::Invalid)?;
        let (to_responder, to_initiator) = self.state.dangerously_get_raw_split();
        Ok((
            payload[..n].to_vec(),
            SplitKeys {
                send: to_responder,
                recv: to_initiator,
            },
        ))
    }
}

impl Responder {
    /// Reads an initiation; returns the initiator's static key (IK authenticates it; the
    /// caller decides whether it knows it) and its HELLO.
    pub(crate) fn read(
        local: &LocalIdentity,
        source: &mut EphemeralSource,
        noise: &[u8],
    ) -> Result<(Self, [u8; KEY_LEN], Vec<u8>), Refusal> {
        let mut state = builder(local, source)
            .and_then(|b| b.build_responder())
            .map_err(|_| Refusal::Invalid)?;
        let mut payload = [0u8; MAX_MESSAGE];
        let n = state
            .read_message(noise, &mut payload)
            .map_err(|_| Refusal::Invalid)?;
        let remote: [u8; KEY_LEN] = state
            .get_remote_static()
            .and_then(|k| k.try_into().ok())
            .ok_or(Refusal::Invalid)?;
        Ok((Responder { state }, remote, payload[..n].to_vec()))
    }

    /// Writes the reply carrying our HELLO, addressed to the initiator's connection ID;
    /// returns the datagram and the session keys.
    pub(crate) fn reply(
        mut self,
        hello: &[u8],
        dcid: ConnectionId,
    ) -> Result<(Vec<u8>, SplitKeys), Refusal> {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = self
            .state
            .write_message(hello, &mut buf)
            .map_err(|_| Refusal::Invalid)?;
        let (to_responder, to_initiator) = self.state.dangerously_get_raw_split();
        Ok((
            handshake_datagram(LONG_TYPE_HANDSHAKE_REPLY, dcid, &buf[..n]),
            SplitKeys {
                send: to_initiator,
                recv: to_responder,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::public_key;

    /// One side: who it is and whom it expects.
    struct Side {
        local: LocalIdentity,
        peer: [u8; KEY_LEN],
    }

    fn pair(psk: Option<[u8; 32]>) -> (Side, Side) {
        let a = [1u8; 32];
        let b = [2u8; 32];
        let side = |local: [u8; 32], peer: [u8; 32]| Side {
            local: LocalIdentity {
                private_key: local,
                psk,
            },
            peer: public_key(&peer),
        };
        (side(a, b), side(b, a))
    }

    fn noise(datagram: &[u8]) -> &[u8] {
        match datagram[0] & !LONG_HEADER_BIT {
            LONG_TYPE_HANDSHAKE_INIT => parse_init(datagram).unwrap().1,
            _ => parse_reply(datagram, 2).unwrap().1,
        }
    }

    #[derive(Debug, PartialEq)]
    enum Failed {
        Refused(Refusal),
        UnknownPeer,
    }

    impl From<Refusal> for Failed {
        fn from(r: Refusal) -> Self {
            Failed::Refused(r)
        }
    }

    fn complete(a: &Side, b: &Side) -> Result<(), Failed> {
        let mut src = EphemeralSource::new([9; 32]);
        let scid = ConnectionId::new(&[0xab, 0xcd]).unwrap();
        let mut init = Initiation::start(&a.local, &a.peer, &mut src, b"hello-a", scid).unwrap();
        assert_eq!(parse_init(&init.datagram).unwrap().0, scid);
        let (resp, remote, hello) = Responder::read(&b.local, &mut src, noise(&init.datagram))?;
        // IK authenticates the initiator's static key; this responder expects one only.
        if remote != b.peer {
            return Err(Failed::UnknownPeer);
        }
        assert_eq!(hello, b"hello-a");
        let (reply, rkeys) = resp.reply(b"hello-b", scid)?;
        assert_eq!(parse_reply(&reply, 2).unwrap().0, scid);
        let (hello, ikeys) = init.finish(noise(&reply))?;
        assert_eq!(hello, b"hello-b");
        // Both sides hold the same secrets, and they key either AEAD.
        assert_eq!((ikeys.send, ikeys.recv), (rkeys.recv, rkeys.send));
        for protection in [
            PacketProtection::Aes256Gcm,
            PacketProtection::ChaCha20Poly1305,
        ] {
            let (ikeys, rkeys) = (
                SplitKeys { ..ikeys }.protect(protection),
                SplitKeys { ..rkeys }.protect(protection),
            );
            let mut p = vec![0u8, 1, 2, 3];
            ikeys.send.seal(5, 1, &mut p);
            assert_eq!(rkeys.recv.open(5, 1, &mut p), Ok(3));
            let mut q = vec![0u8, 4];
            rkeys.send.seal(6, 1, &mut q);
            assert_eq!(ikeys.recv.open(6, 1, &mut q), Ok(1));
        }
        Ok(())
    }

    #[test]
    fn handshake_completes_with_and_without_psk() {
        let (a, b) = pair(None);
        complete(&a, &b).unwrap();
        let (a, b) = pair(Some([5; 32]));
        complete(&a, &b).unwrap();
    }

    #[test]
    fn a_stranger_or_wrong_psk_is_refused() {
        let (a, b) = pair(None);
        let stranger = Side {
            local: LocalIdentity {
                private_key: [3; 32],
                psk: None,
            },
            peer: a.peer,
        };
        // The responder only accepts the static key it was configured with.
        assert_eq!(complete(&stranger, &b), Err(Failed::UnknownPeer));
        // An initiator that expects another responder key cannot be read at all.
        let misdirected = Side {
            local: LocalIdentity {
                private_key: [1; 32],
                psk: None,
            },
            peer: public_key(&[4; 32]),
        };
        assert_eq!(
            complete(&misdirected, &b),
            Err(Failed::Refused(Refusal::Invalid))
        );
        let (a, _) = pair(Some([5; 32]));
        let (_, b) = pair(Some([6; 32]));
        assert!(complete(&a, &b).is_err());
    }

    #[test]
    fn a_forged_reply_leaves_the_initiation_usable() {
        let (a, b) = pair(None);
        let mut src = EphemeralSource::new([9; 32]);
        let mut init =
            Initiation::start(&a.local, &a.peer, &mut src, b"x", ConnectionId::EMPTY).unwrap();
        assert!(init.finish(&[0u8; 80]).is_err());
        let (resp, _, _) = Responder::read(&b.local, &mut src, noise(&init.datagram)).unwrap();
        let (reply, _) = resp.reply(b"y", ConnectionId::EMPTY).unwrap();
        assert!(init.finish(parse_reply(&reply, 0).unwrap().1).is_ok());
    }

    /// The responder's HELLO (its AEAD offer included) is authenticated by the reply's tag:
    /// any bit changed in it on the path fails, and the genuine reply still completes.
    #[test]
    fn a_reply_changed_on_the_path_is_refused() {
        let (a, b) = pair(None);
        let mut src = EphemeralSource::new([9; 32]);
        let mut init =
            Initiation::start(&a.local, &a.peer, &mut src, b"x", ConnectionId::EMPTY).unwrap();
        let (resp, _, _) = Responder::read(&b.local, &mut src, noise(&init.datagram)).unwrap();
        let (reply, _) = resp
            .reply(b"hello, offer last", ConnectionId::EMPTY)
            .unwrap();
        let genuine = parse_reply(&reply, 0).unwrap().1.to_vec();
        for i in 0..genuine.len() {
            let mut forged = genuine.clone();
            forged[i] ^= 0x03;
            assert_eq!(
                init.finish(&forged).map(|_| ()),
                Err(Refusal::Invalid),
                "byte {i}"
            );
        }
        let (hello, _) = init.finish(&genuine).unwrap();
        assert_eq!(hello, b"hello, offer last");
    }

    #[test]
    fn handshake_layout_and_other_versions() {
        let (a, _) = pair(None);
        let mut src = EphemeralSource::new([9; 32]);
        let scid = ConnectionId::new(&[1, 2]).unwrap();
        let init = Initiation::start(&a.local, &a.peer, &mut src, b"h", scid).unwrap();
        let d = &init.datagram;
        assert_eq!(d[..8], [0x82, 0, 0, 0, 2, 2, 1, 2]);
        // e (32), s (32 + 16), payload (1 + 16), then mac1 and mac2 (zero until stamped).
        assert_eq!(d.len(), 8 + 32 + 48 + 17 + 32);
        assert_eq!(parse_init(d).unwrap().1.len(), 32 + 48 + 17);
        let mut v1 = d.clone();
        v1[4] = 1;
        assert!(parse_init(&v1).is_none());
        assert!(parse_init(&d[..8 + 31]).is_none());
    }
}
