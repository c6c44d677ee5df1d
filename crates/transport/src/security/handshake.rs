//! The Noise IK handshake (through snow): who the peer is, and the packet keys of one
//! session. The initiator's message carries its HELLO and the responder's reply its own, so
//! the association parameters are authenticated with the keys.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};
use snow::HandshakeState;

use super::aead::PacketKey;
use super::{SecurityConfig, KEY_LEN};
use crate::packet::{LONG_HEADER_BIT, LONG_TYPE_HANDSHAKE_INIT, LONG_TYPE_HANDSHAKE_REPLY};
use crate::PROTOCOL_VERSION;

const PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
const PATTERN_PSK: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
/// Binds both messages to this protocol and version.
const PROLOGUE: &[u8] = b"pepd tunnel v1";
/// Type byte and version in front of the Noise message.
pub(crate) const HANDSHAKE_HEADER_LEN: usize = 5;
/// Bound on a handshake message; ours are under 200 bytes.
const MAX_MESSAGE: usize = 512;

/// Why a handshake message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Invalid,
    UnknownPeer,
}

/// The two packet keys of a session, seen from one side.
pub(crate) struct SessionKeys {
    pub(crate) send: PacketKey,
    pub(crate) recv: PacketKey,
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
    cfg: &'a SecurityConfig,
    source: &mut EphemeralSource,
) -> Result<snow::Builder<'a>, snow::Error> {
    let pattern = if cfg.psk.is_some() {
        PATTERN_PSK
    } else {
        PATTERN
    };
    let params = pattern.parse().expect("the pattern names are valid");
    let mut b = snow::Builder::with_resolver(params, source.resolver())
        .prologue(PROLOGUE)?
        .local_private_key(&cfg.local_private_key)?;
    if let Some(psk) = &cfg.psk {
        b = b.psk(2, psk)?;
    }
    Ok(b)
}

fn handshake_datagram(kind: u8, noise: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(HANDSHAKE_HEADER_LEN + noise.len());
    d.push(LONG_HEADER_BIT | kind);
    d.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    d.extend_from_slice(noise);
    d
}

/// Splits a handshake datagram into its Noise message, refusing other versions.
pub(crate) fn noise_message(datagram: &[u8]) -> Option<&[u8]> {
    let version = datagram.get(1..HANDSHAKE_HEADER_LEN)?;
    if version != PROTOCOL_VERSION.to_be_bytes() || datagram.len() > MAX_MESSAGE {
        return None;
    }
    Some(&datagram[HANDSHAKE_HEADER_LEN..])
}

/// The initiator's ephemeral public key: the first field of its message, used to spot
/// replays before any Diffie-Hellman work.
pub(crate) fn initiation_ephemeral(noise: &[u8]) -> Option<[u8; KEY_LEN]> {
    noise.get(..KEY_LEN)?.try_into().ok()
}

impl Initiation {
    pub(crate) fn start(
        cfg: &SecurityConfig,
        source: &mut EphemeralSource,
        hello: &[u8],
    ) -> Result<Self, snow::Error> {
        let mut state = builder(cfg, source)?
            .remote_public_key(&cfg.peer_public_key)?
            .build_initiator()?;
        let mut buf = [0u8; MAX_MESSAGE];
        let n = state.write_message(hello, &mut buf)?;
        Ok(Initiation {
            state,
            datagram: handshake_datagram(LONG_TYPE_HANDSHAKE_INIT, &buf[..n]),
        })
    }

    /// Reads the responder's reply: its HELLO and the session keys. A reply that fails
    /// leaves the initiation usable for the genuine one.
    pub(crate) fn finish(&mut self, noise: &[u8]) -> Result<(Vec<u8>, SessionKeys), Refusal> {
        let mut payload = [0u8; MAX_MESSAGE];
        let n = self
            .state
            .read_message(noise, &mut payload)
            .map_err(|_| Refusal::Invalid)?;
        let (to_responder, to_initiator) = self.state.dangerously_get_raw_split();
        Ok((
            payload[..n].to_vec(),
            SessionKeys {
                send: PacketKey::new(&to_responder),
                recv: PacketKey::new(&to_initiator),
            },
        ))
    }
}

impl Responder {
    /// Reads an initiation; returns the initiator's HELLO.
    pub(crate) fn read(
        cfg: &SecurityConfig,
        source: &mut EphemeralSource,
        noise: &[u8],
    ) -> Result<(Self, Vec<u8>), Refusal> {
        let mut state = builder(cfg, source)
            .and_then(|b| b.build_responder())
            .map_err(|_| Refusal::Invalid)?;
        let mut payload = [0u8; MAX_MESSAGE];
        let n = state
            .read_message(noise, &mut payload)
            .map_err(|_| Refusal::Invalid)?;
        // IK authenticates the initiator's static key; it must be the one configured.
        if state.get_remote_static() != Some(&cfg.peer_public_key[..]) {
            return Err(Refusal::UnknownPeer);
        }
        Ok((Responder { state }, payload[..n].to_vec()))
    }

    /// Writes the reply carrying our HELLO; returns the datagram and the session keys.
    pub(crate) fn reply(mut self, hello: &[u8]) -> Result<(Vec<u8>, SessionKeys), Refusal> {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = self
            .state
            .write_message(hello, &mut buf)
            .map_err(|_| Refusal::Invalid)?;
        let (to_responder, to_initiator) = self.state.dangerously_get_raw_split();
        Ok((
            handshake_datagram(LONG_TYPE_HANDSHAKE_REPLY, &buf[..n]),
            SessionKeys {
                send: PacketKey::new(&to_initiator),
                recv: PacketKey::new(&to_responder),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::public_key;
    use std::time::Duration;

    fn pair(psk: Option<[u8; 32]>) -> (SecurityConfig, SecurityConfig) {
        let a = [1u8; 32];
        let b = [2u8; 32];
        let cfg = |local: [u8; 32], peer: [u8; 32]| SecurityConfig {
            local_private_key: local,
            peer_public_key: public_key(&peer),
            psk,
            rekey_interval: Duration::from_secs(120),
            rekey_after_packets: 1 << 30,
        };
        (cfg(a, b), cfg(b, a))
    }

    fn complete(a: &SecurityConfig, b: &SecurityConfig) -> Result<(), Refusal> {
        let mut src = EphemeralSource::new([9; 32]);
        let mut init = Initiation::start(a, &mut src, b"hello-a").unwrap();
        let (resp, hello) = Responder::read(b, &mut src, noise_message(&init.datagram).unwrap())?;
        assert_eq!(hello, b"hello-a");
        let (reply, rkeys) = resp.reply(b"hello-b")?;
        let (hello, ikeys) = init.finish(noise_message(&reply).unwrap())?;
        assert_eq!(hello, b"hello-b");
        let mut p = vec![0u8, 1, 2, 3];
        ikeys.send.seal(5, 1, &mut p);
        assert_eq!(rkeys.recv.open(5, 1, &mut p), Ok(3));
        let mut q = vec![0u8, 4];
        rkeys.send.seal(6, 1, &mut q);
        assert_eq!(ikeys.recv.open(6, 1, &mut q), Ok(1));
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
        let mut stranger = a.clone();
        stranger.local_private_key = [3; 32];
        // The responder only accepts the static key it was configured with.
        assert_eq!(complete(&stranger, &b), Err(Refusal::UnknownPeer));
        // An initiator that expects another responder key cannot be read at all.
        let mut misdirected = a.clone();
        misdirected.peer_public_key = public_key(&[4; 32]);
        assert_eq!(complete(&misdirected, &b), Err(Refusal::Invalid));
        let (a, _) = pair(Some([5; 32]));
        let (_, b) = pair(Some([6; 32]));
        assert!(complete(&a, &b).is_err());
    }

    #[test]
    fn a_forged_reply_leaves_the_initiation_usable() {
        let (a, b) = pair(None);
        let mut src = EphemeralSource::new([9; 32]);
        let mut init = Initiation::start(&a, &mut src, b"x").unwrap();
        assert!(init.finish(&[0u8; 80]).is_err());
        let (resp, _) =
            Responder::read(&b, &mut src, noise_message(&init.datagram).unwrap()).unwrap();
        let (reply, _) = resp.reply(b"y").unwrap();
        assert!(init.finish(noise_message(&reply).unwrap()).is_ok());
    }
}
