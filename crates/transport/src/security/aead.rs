//! Per-packet protection: an AEAD from ring (AES-256-GCM or ChaCha20-Poly1305) with the packet
//! number as nonce and the clear header as associated data. Nothing but the 16-byte tag is added
//! to the wire, whichever AEAD protects the association.

use ring::aead::{
    Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};

use super::KEY_LEN;

/// Bytes the tag adds to every protected packet.
pub const TAG_LEN: usize = 16;

/// The AEAD that protects an association's packets. Both take a 32-byte key, a 12-byte nonce
/// and add a 16-byte tag, so the choice changes neither the key schedule nor the wire layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketProtection {
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl PacketProtection {
    fn algorithm(self) -> &'static ring::aead::Algorithm {
        match self {
            PacketProtection::Aes256Gcm => &AES_256_GCM,
            PacketProtection::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        }
    }
}

/// One direction's packet key.
pub(crate) struct PacketKey {
    key: LessSafeKey,
}

/// The packet did not authenticate under this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unauthentic;

impl PacketKey {
    pub(crate) fn new(protection: PacketProtection, key: &[u8; KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(protection.algorithm(), key)
            .expect("both AEADs take a 32-byte key, which KEY_LEN guarantees");
        PacketKey {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Encrypts everything after `header_len` in place and appends the tag.
    pub(crate) fn seal(&self, pn: u64, header_len: usize, packet: &mut Vec<u8>) {
        let (header, body) = packet.split_at_mut(header_len);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(pn), Aad::from(&*header), body)
            .expect("a datagram is far below either AEAD's message size limit");
        packet.extend_from_slice(tag.as_ref());
    }

    /// Verifies and decrypts in place; returns the plaintext payload length (tag excluded).
    pub(crate) fn open(
        &self,
        pn: u64,
        header_len: usize,
        packet: &mut [u8],
    ) -> Result<usize, Unauthentic> {
        let body_len = packet
            .len()
            .checked_sub(header_len + TAG_LEN)
            .ok_or(Unauthentic)?;
        let (header, rest) = packet.split_at_mut(header_len);
        let (body, tag) = rest.split_at_mut(body_len);
        let tag = Tag::try_from(&*tag).map_err(|_| Unauthentic)?;
        self.key
            .open_in_place_separate_tag(nonce(pn), Aad::from(&*header), tag, body, 0..)
            .map_err(|_| Unauthentic)?;
        Ok(body_len)
    }
}

/// The Noise convention for ChaChaPoly: 32 zero bits, then the counter little-endian. A sender's
/// packet numbers only count up, so neither AEAD ever sees a nonce twice under one key.
fn nonce(pn: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&pn.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: [PacketProtection; 2] = [
        PacketProtection::Aes256Gcm,
        PacketProtection::ChaCha20Poly1305,
    ];

    fn sealed(key: &PacketKey, pn: u64) -> Vec<u8> {
        let mut p = vec![0x21, 0x00, 0x07];
        p.extend_from_slice(b"payload bytes");
        key.seal(pn, 3, &mut p);
        p
    }

    #[test]
    fn roundtrip_and_every_tampered_byte_is_rejected() {
        for protection in BOTH {
            let key = PacketKey::new(protection, &[7; 32]);
            let p = sealed(&key, 7);
            assert_eq!(p.len(), 3 + 13 + TAG_LEN);
            assert_eq!(&p[..3], &[0x21, 0x00, 0x07], "{protection:?}");
            assert_ne!(&p[3..16], b"payload bytes", "{protection:?}");
            let mut ok = p.clone();
            assert_eq!(key.open(7, 3, &mut ok), Ok(13));
            assert_eq!(&ok[3..16], b"payload bytes");
            for i in 0..p.len() {
                for bit in 0..8 {
                    let mut bad = p.clone();
                    bad[i] ^= 1 << bit;
                    assert_eq!(
                        key.open(7, 3, &mut bad),
                        Err(Unauthentic),
                        "{protection:?} byte {i} bit {bit}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_nonce_key_or_length_is_rejected() {
        for protection in BOTH {
            let key = PacketKey::new(protection, &[7; 32]);
            let p = sealed(&key, 7);
            assert_eq!(key.open(8, 3, &mut p.clone()), Err(Unauthentic));
            assert_eq!(
                PacketKey::new(protection, &[8; 32]).open(7, 3, &mut p.clone()),
                Err(Unauthentic)
            );
            assert_eq!(
                key.open(7, 3, &mut p[..p.len() - 1].to_vec()),
                Err(Unauthentic)
            );
            assert_eq!(key.open(7, 3, &mut p[..10].to_vec()), Err(Unauthentic));
        }
    }

    /// ring zeroes what fails to authenticate, so whoever tries a second key on a packet
    /// needs it as it arrived (`Security::open` keeps a copy when there is a second key).
    #[test]
    fn a_failed_open_does_not_leave_the_packet_as_it_arrived() {
        for protection in BOTH {
            let p = sealed(&PacketKey::new(protection, &[7; 32]), 7);
            let mut tried = p.clone();
            let other = PacketKey::new(protection, &[8; 32]);
            assert_eq!(other.open(7, 3, &mut tried), Err(Unauthentic));
            assert_ne!(tried, p, "{protection:?}");
        }
    }

    #[test]
    fn the_two_aeads_never_open_each_others_packets() {
        let aes = PacketKey::new(PacketProtection::Aes256Gcm, &[7; 32]);
        let chacha = PacketKey::new(PacketProtection::ChaCha20Poly1305, &[7; 32]);
        assert_eq!(chacha.open(7, 3, &mut sealed(&aes, 7)), Err(Unauthentic));
        assert_eq!(aes.open(7, 3, &mut sealed(&chacha, 7)), Err(Unauthentic));
    }

    #[test]
    fn one_key_seals_distinct_packet_numbers_into_distinct_ciphertexts() {
        for protection in BOTH {
            let key = PacketKey::new(protection, &[7; 32]);
            assert_ne!(sealed(&key, 7), sealed(&key, 8), "{protection:?}");
        }
    }

    /// ring's ChaCha20-Poly1305 with the same nonce layout produces the bytes the RustCrypto
    /// implementation did, so associations that keep ChaCha20 are unchanged on the wire.
    #[test]
    fn chacha20_packets_are_byte_identical_to_the_rustcrypto_implementation() {
        use chacha20poly1305::aead::{AeadInPlace, KeyInit};
        use chacha20poly1305::{ChaCha20Poly1305, Key};
        let ours = sealed(
            &PacketKey::new(PacketProtection::ChaCha20Poly1305, &[7; 32]),
            7,
        );
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&[7; 32]));
        let mut theirs = vec![0x21, 0x00, 0x07];
        theirs.extend_from_slice(b"payload bytes");
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&7u64.to_le_bytes());
        let (header, body) = theirs.split_at_mut(3);
        let tag = cipher
            .encrypt_in_place_detached(&n.into(), header, body)
            .expect("short message");
        theirs.extend_from_slice(&tag);
        assert_eq!(ours, theirs);
    }
}
