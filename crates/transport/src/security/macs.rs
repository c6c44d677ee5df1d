//! The MACs a handshake datagram ends with. mac1 is keyed by a hash of the receiver's static
//! public key: checking it costs one BLAKE2s and no Diffie-Hellman, and only someone who
//! knows that key can make the receiver start one. mac2 (initiations only) is keyed by a
//! cookie the responder gave the initiator's address: it proves the initiator receives at
//! that address, which a spoofed flood cannot. Layout: docs/PROTOCOL.md, 7.6.

use blake2::digest::consts::U16;
use blake2::digest::{Digest, KeyInit, Mac};
use blake2::{Blake2s256, Blake2sMac};

use super::KEY_LEN;

pub(crate) const MAC_LEN: usize = 16;
pub(crate) type Tag = [u8; MAC_LEN];
/// mac1 and mac2 after an INIT.
pub(crate) const INIT_MACS: usize = 2 * MAC_LEN;
/// mac1 after a REPLY.
pub(crate) const REPLY_MACS: usize = MAC_LEN;

type Blake2sMac128 = Blake2sMac<U16>;

/// What anyone who knows one static public key can derive from it: the key of the mac1 of
/// messages to its owner, and the key of the cookies its owner sends.
#[derive(Clone)]
pub(crate) struct MacKeys {
    mac1: [u8; 32],
    cookie: [u8; 32],
}

impl MacKeys {
    pub(crate) fn of(public_key: &[u8; KEY_LEN]) -> Self {
        // Distinct labels, so neither key can stand in for the other.
        let derive = |label: &[u8]| -> [u8; 32] {
            Blake2s256::new()
                .chain_update(label)
                .chain_update(public_key)
                .finalize()
                .into()
        };
        MacKeys {
            mac1: derive(b"mac1----"),
            cookie: derive(b"cookie--"),
        }
    }

    pub(crate) fn cookie_key(&self) -> &[u8; 32] {
        &self.cookie
    }
}

fn keyed(key: &[u8]) -> Blake2sMac128 {
    <Blake2sMac128 as KeyInit>::new_from_slice(key).expect("MAC keys are 16 or 32 bytes")
}

/// Keyed BLAKE2s-128 of `parts` in order.
pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> Tag {
    let mut m = keyed(key);
    for p in parts {
        Mac::update(&mut m, p);
    }
    m.finalize().into_bytes().into()
}

/// Whether the `MAC_LEN` bytes at `at` are the MAC of everything before them (in constant
/// time).
fn verify_at(key: &[u8], datagram: &[u8], at: usize) -> bool {
    let (Some(covered), Some(tag)) = (datagram.get(..at), datagram.get(at..at + MAC_LEN)) else {
        return false;
    };
    let mut m = keyed(key);
    Mac::update(&mut m, covered);
    m.verify_slice(tag).is_ok()
}

fn stamp_at(key: &[u8], datagram: &mut [u8], at: usize) {
    if let Some(covered) = datagram.get(..at) {
        let tag = mac(key, &[covered]);
        if let Some(field) = datagram.get_mut(at..at + MAC_LEN) {
            field.copy_from_slice(&tag);
        }
    }
}

/// Where an INIT's mac1 starts.
fn init_mac1_at(datagram: &[u8]) -> Option<usize> {
    datagram.len().checked_sub(INIT_MACS)
}

/// Fills an INIT's mac1 (for the responder `to`) and mac2 (zeros without a cookie).
pub(crate) fn stamp_init(datagram: &mut [u8], to: &MacKeys, cookie: Option<&Tag>) {
    let Some(at) = init_mac1_at(datagram) else {
        return;
    };
    stamp_at(&to.mac1, datagram, at);
    match cookie {
        Some(c) => stamp_at(c, datagram, at + MAC_LEN),
        None => datagram[at + MAC_LEN..].fill(0),
    }
}

/// Fills a REPLY's mac1 for the initiator `to`.
pub(crate) fn stamp_reply(datagram: &mut [u8], to: &MacKeys) {
    if let Some(at) = datagram.len().checked_sub(REPLY_MACS) {
        stamp_at(&to.mac1, datagram, at);
    }
}

/// Whether an INIT's mac1 is the one for us (`ours`: our own public key's).
pub(crate) fn init_mac1_ok(datagram: &[u8], ours: &MacKeys) -> bool {
    init_mac1_at(datagram).is_some_and(|at| verify_at(&ours.mac1, datagram, at))
}

/// Whether a REPLY's mac1 is the one for us.
pub(crate) fn reply_mac1_ok(datagram: &[u8], ours: &MacKeys) -> bool {
    datagram
        .len()
        .checked_sub(REPLY_MACS)
        .is_some_and(|at| verify_at(&ours.mac1, datagram, at))
}

/// Whether an INIT's mac2 is keyed by `cookie`.
pub(crate) fn init_mac2_ok(datagram: &[u8], cookie: &Tag) -> bool {
    init_mac1_at(datagram).is_some_and(|at| verify_at(cookie, datagram, at + MAC_LEN))
}

/// An INIT's mac1 field: the associated data of the cookie sent in answer to it.
pub(crate) fn init_mac1(datagram: &[u8]) -> Option<Tag> {
    let at = init_mac1_at(datagram)?;
    datagram.get(at..at + MAC_LEN)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_key_bytes_and_cookie() {
        let to = MacKeys::of(&[7; 32]);
        let other = MacKeys::of(&[8; 32]);
        let mut d = vec![0x82u8; 100];
        stamp_init(&mut d, &to, None);
        assert!(init_mac1_ok(&d, &to));
        assert!(!init_mac1_ok(&d, &other));
        assert_eq!(d[84..], [0; 16]);
        let cookie = [3u8; 16];
        assert!(!init_mac2_ok(&d, &cookie));
        stamp_init(&mut d, &to, Some(&cookie));
        assert!(init_mac1_ok(&d, &to) && init_mac2_ok(&d, &cookie));
        assert!(!init_mac2_ok(&d, &[4u8; 16]));
        // Any byte before the MACs changed: both fail.
        d[10] ^= 1;
        assert!(!init_mac1_ok(&d, &to) && !init_mac2_ok(&d, &cookie));
        let mut r = vec![0x83u8; 60];
        stamp_reply(&mut r, &to);
        assert!(reply_mac1_ok(&r, &to) && !reply_mac1_ok(&r, &other));
        assert!(!init_mac1_ok(&[0u8; 20], &to) && !reply_mac1_ok(&[], &to));
    }
}
