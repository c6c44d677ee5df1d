//! Static X25519 key pairs: generation and public-key derivation, through snow's resolver so
//! the handshake and the key tools agree on the curve implementation.

use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

/// Bytes of an X25519 private or public key, and of a pre-shared key.
pub const KEY_LEN: usize = 32;

/// The public key belonging to `private` (X25519 base-point multiplication after clamping).
pub fn public_key(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let mut dh = curve25519();
    dh.set(private);
    let mut out = [0u8; KEY_LEN];
    out.copy_from_slice(dh.pubkey());
    out
}

/// A private key from 32 bytes of caller-supplied randomness (the caller owns the entropy
/// source: the daemon reads the OS, tests pass fixed bytes).
pub fn private_key_from_random(random: [u8; KEY_LEN]) -> [u8; KEY_LEN] {
    // X25519 clamps on use; storing the clamped form keeps files canonical.
    let mut k = random;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    k
}

fn curve25519() -> Box<dyn snow::types::Dh> {
    DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .expect("snow's default resolver always provides Curve25519")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7748_vector() {
        // RFC 7748 section 6.1, Alice's key pair.
        let private: [u8; 32] =
            hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public: [u8; 32] =
            hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(public_key(&private), public);
    }

    #[test]
    fn clamping_does_not_change_the_public_key() {
        let random = [0xA5u8; 32];
        assert_eq!(
            public_key(&private_key_from_random(random)),
            public_key(&random)
        );
    }

    fn hex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
}
