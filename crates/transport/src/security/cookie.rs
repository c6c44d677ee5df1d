//! Cookies: what a busy responder sends instead of doing a Diffie-Hellman. A cookie is a MAC
//! of the initiator's address under a secret that changes every two minutes; the initiator
//! proves it received one by keying its next INIT's mac2 with it. Spoofed initiations never
//! see their cookies, so under load only initiators that receive at their address get work
//! done. Layout: docs/PROTOCOL.md, 7.6.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::handshake::versioned_body;
use super::macs::{self, init_mac2_ok, MacKeys, Tag, MAC_LEN};
use super::KEY_LEN;
use crate::ids::ConnectionId;
use crate::packet::{LONG_HEADER_BIT, LONG_TYPE_COOKIE};
use crate::PROTOCOL_VERSION;

/// How long a cookie secret is used for new cookies; cookies under the one before are still
/// accepted, so a cookie stays good for at least this long.
pub const COOKIE_SECRET_LIFETIME: Duration = Duration::from_secs(120);
const NONCE_LEN: usize = 24;
const SEALED_LEN: usize = MAC_LEN + 16;

/// The responder's cookie secrets, and the key its cookies are encrypted under.
pub(crate) struct CookieJar {
    keys: MacKeys,
    rng: ChaCha20Rng,
    current: [u8; 32],
    previous: Option<[u8; 32]>,
    rotated_at: Option<Instant>,
}

impl CookieJar {
    /// `our_public_key`: the responder's; `seed`: the source of its secrets and nonces.
    pub(crate) fn new(our_public_key: &[u8; KEY_LEN], seed: [u8; 32]) -> Self {
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut current = [0u8; 32];
        rng.fill_bytes(&mut current);
        CookieJar {
            keys: MacKeys::of(our_public_key),
            rng,
            current,
            previous: None,
            rotated_at: None,
        }
    }

    /// The secrets in force at `now`, rotating first if the current one is too old.
    fn secrets(&mut self, now: Instant) -> ([u8; 32], Option<[u8; 32]>) {
        match self.rotated_at {
            None => self.rotated_at = Some(now),
            Some(at) if now >= at + COOKIE_SECRET_LIFETIME => {
                // After two lifetimes without use, the old secret is too old to honour.
                self.previous = (now < at + 2 * COOKIE_SECRET_LIFETIME).then_some(self.current);
                self.rng.fill_bytes(&mut self.current);
                self.rotated_at = Some(now);
            }
            Some(_) => {}
        }
        (self.current, self.previous)
    }

    /// The COOKIE answering an INIT from `from` whose connection ID was `dcid` and mac1
    /// `init_mac1` (bound as associated data, so the cookie is good for that INIT's sender
    /// only). 61 bytes plus the connection ID: smaller than any INIT.
    pub(crate) fn reply(
        &mut self,
        now: Instant,
        from: SocketAddr,
        dcid: ConnectionId,
        init_mac1: &Tag,
    ) -> Option<Vec<u8>> {
        let (secret, _) = self.secrets(now);
        let mut sealed = cookie_for(&secret, from);
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        let cipher = XChaCha20Poly1305::new(self.keys.cookie_key().into());
        let tag = cipher
            .encrypt_in_place_detached(XNonce::from_slice(&nonce), init_mac1, &mut sealed)
            .ok()?;
        let mut d = Vec::with_capacity(5 + dcid.len() + NONCE_LEN + SEALED_LEN);
        d.push(LONG_HEADER_BIT | LONG_TYPE_COOKIE);
        d.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        d.extend_from_slice(dcid.as_slice());
        d.extend_from_slice(&nonce);
        d.extend_from_slice(&sealed);
        d.extend_from_slice(&tag);
        Some(d)
    }

    /// Whether an INIT from `from` carries a mac2 keyed by a cookie we gave that address
    /// under the current or the previous secret.
    pub(crate) fn mac2_ok(&mut self, now: Instant, from: SocketAddr, init: &[u8]) -> bool {
        let (current, previous) = self.secrets(now);
        [Some(current), previous]
            .into_iter()
            .flatten()
            .any(|secret| init_mac2_ok(init, &cookie_for(&secret, from)))
    }
}

fn cookie_for(secret: &[u8; 32], from: SocketAddr) -> Tag {
    let port = from.port().to_be_bytes();
    match from.ip() {
        IpAddr::V4(a) => macs::mac(secret, &[&a.octets(), &port]),
        IpAddr::V6(a) => macs::mac(secret, &[&a.octets(), &port]),
    }
}

/// The connection ID a COOKIE is for (the initiator's, `local_cid_len` bytes long).
pub(crate) fn cookie_dcid(datagram: &[u8], local_cid_len: usize) -> Option<ConnectionId> {
    let mut r = versioned_body(datagram)?;
    ConnectionId::read(&mut r, local_cid_len).ok()
}

/// The cookie in a COOKIE from the responder `from_keys` answering the INIT whose mac1 was
/// `init_mac1`; `None` if it was not sealed for that INIT (forged, or for an older one).
pub(crate) fn open_cookie(
    datagram: &[u8],
    local_cid_len: usize,
    from_keys: &MacKeys,
    init_mac1: &Tag,
) -> Option<Tag> {
    let mut r = versioned_body(datagram)?;
    ConnectionId::read(&mut r, local_cid_len).ok()?;
    let rest = r.rest();
    if rest.len() != NONCE_LEN + SEALED_LEN {
        return None;
    }
    let (nonce, sealed) = rest.split_at(NONCE_LEN);
    let (body, tag) = sealed.split_at(MAC_LEN);
    let mut cookie: Tag = body.try_into().ok()?;
    let cipher = XChaCha20Poly1305::new(from_keys.cookie_key().into());
    cipher
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            init_mac1,
            &mut cookie,
            tag.into(),
        )
        .ok()?;
    Some(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::macs::stamp_init;

    fn addr(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, last], port))
    }

    #[test]
    fn cookie_round_trip_bound_to_address_and_rotating() {
        let responder = [5u8; 32];
        let keys = MacKeys::of(&responder);
        let mut jar = CookieJar::new(&responder, [1; 32]);
        let t0 = Instant::now();
        let cid = ConnectionId::new(&[0xab, 0xcd]).unwrap();
        let mut init = vec![0x82u8; 150];
        stamp_init(&mut init, &keys, None);
        let mac1 = macs::init_mac1(&init).unwrap();
        let reply = jar.reply(t0, addr(2, 7400), cid, &mac1).unwrap();
        assert_eq!(reply.len(), 5 + 2 + 24 + 16 + 16);
        assert_eq!(reply[..7], [0x84, 0, 0, 0, 2, 0xab, 0xcd]);
        assert_eq!(cookie_dcid(&reply, 2), Some(cid));
        // Only for the INIT it answered, and only from the responder's key.
        assert!(open_cookie(&reply, 2, &MacKeys::of(&[6; 32]), &mac1).is_none());
        assert!(open_cookie(&reply, 2, &keys, &[0; 16]).is_none());
        let cookie = open_cookie(&reply, 2, &keys, &mac1).unwrap();
        stamp_init(&mut init, &keys, Some(&cookie));
        assert!(jar.mac2_ok(t0, addr(2, 7400), &init));
        // Another address or port: refused.
        assert!(!jar.mac2_ok(t0, addr(3, 7400), &init));
        assert!(!jar.mac2_ok(t0, addr(2, 7401), &init));
        // One rotation later it is still good; two, and it is not.
        assert!(jar.mac2_ok(t0 + COOKIE_SECRET_LIFETIME, addr(2, 7400), &init));
        assert!(!jar.mac2_ok(t0 + 2 * COOKIE_SECRET_LIFETIME, addr(2, 7400), &init));
        let mut tampered = reply.clone();
        tampered[40] ^= 1;
        assert!(open_cookie(&tampered, 2, &keys, &mac1).is_none());
    }
}
