//! Per-packet protection: ChaCha20-Poly1305 with the packet number as nonce and the clear
//! header as associated data. Nothing but the 16-byte tag is added to the wire.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};

use super::KEY_LEN;

/// Bytes the tag adds to every protected packet.
pub const TAG_LEN: usize = 16;

/// One direction's packet key.
pub(crate) struct PacketKey {
    cipher: ChaCha20Poly1305,
}

/// The packet did not authenticate under this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unauthentic;

impl PacketKey {
    pub(crate) fn new(key: &[u8; KEY_LEN]) -> Self {
        PacketKey {
            cipher: ChaCha20Poly1305::new(Key::from_slice(key)),
        }
    }

    /// Encrypts everything after `header_len` in place and appends the tag.
    pub(crate) fn seal(&self, pn: u64, header_len: usize, packet: &mut Vec<u8>) {
        let (header, body) = packet.split_at_mut(header_len);
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce(pn), header, body)
            .expect("a datagram is far below ChaCha20-Poly1305's message size limit");
        packet.extend_from_slice(&tag);
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
        let tag = Tag::clone_from_slice(tag);
        self.cipher
            .decrypt_in_place_detached(&nonce(pn), header, body, &tag)
            .map_err(|_| Unauthentic)?;
        Ok(body_len)
    }
}

/// The Noise convention for ChaChaPoly: 32 zero bits, then the counter little-endian.
fn nonce(pn: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&pn.to_le_bytes());
    Nonce::from(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(key: &PacketKey, pn: u64) -> Vec<u8> {
        let mut p = vec![0x21, 0x00, 0x07];
        p.extend_from_slice(b"payload bytes");
        key.seal(pn, 3, &mut p);
        p
    }

    #[test]
    fn roundtrip_and_every_tampered_byte_is_rejected() {
        let key = PacketKey::new(&[7; 32]);
        let p = sealed(&key, 7);
        assert_eq!(p.len(), 3 + 13 + TAG_LEN);
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
                    "byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn wrong_nonce_key_or_length_is_rejected() {
        let key = PacketKey::new(&[7; 32]);
        let p = sealed(&key, 7);
        assert_eq!(key.open(8, 3, &mut p.clone()), Err(Unauthentic));
        assert_eq!(
            PacketKey::new(&[8; 32]).open(7, 3, &mut p.clone()),
            Err(Unauthentic)
        );
        assert_eq!(
            key.open(7, 3, &mut p[..p.len() - 1].to_vec()),
            Err(Unauthentic)
        );
        assert_eq!(key.open(7, 3, &mut p[..10].to_vec()), Err(Unauthentic));
    }
}
