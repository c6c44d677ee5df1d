//! Which AEAD protects an association: each side offers the AEADs it accepts, in its order of
//! preference, inside its handshake HELLO; both compute the same choice from the two offers.
//! The offers ride in the Noise payloads, so they are authenticated with the keys and an
//! attacker cannot strip or reorder them (docs/PROTOCOL.md §7.2).

use std::fmt;

use super::aead::PacketProtection;
use crate::packet::{AeadOffer, MAX_OFFERED};

const ID_CHACHA20_POLY1305: u8 = 1;
const ID_AES_256_GCM: u8 = 2;

impl PacketProtection {
    /// Its identifier in an offer.
    pub fn id(self) -> u8 {
        match self {
            PacketProtection::ChaCha20Poly1305 => ID_CHACHA20_POLY1305,
            PacketProtection::Aes256Gcm => ID_AES_256_GCM,
        }
    }

    fn from_id(id: u8) -> Option<Self> {
        match id {
            ID_CHACHA20_POLY1305 => Some(PacketProtection::ChaCha20Poly1305),
            ID_AES_256_GCM => Some(PacketProtection::Aes256Gcm),
            _ => None,
        }
    }

    /// The name used in configuration, stats and metrics.
    pub fn name(self) -> &'static str {
        match self {
            PacketProtection::ChaCha20Poly1305 => "chacha20-poly1305",
            PacketProtection::Aes256Gcm => "aes-256-gcm",
        }
    }
}

impl fmt::Display for PacketProtection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// An offer keeps identifiers this build does not know (a newer peer may offer them); they
// have no rank, so they are never chosen.
impl AeadOffer {
    /// Both AEADs, AES-256-GCM first only where this CPU has AES instructions (without
    /// them it is several times slower than ChaCha20-Poly1305).
    pub fn auto(hardware_aes: bool) -> Self {
        if hardware_aes {
            Self::of(&[
                PacketProtection::Aes256Gcm,
                PacketProtection::ChaCha20Poly1305,
            ])
        } else {
            Self::of(&[
                PacketProtection::ChaCha20Poly1305,
                PacketProtection::Aes256Gcm,
            ])
        }
    }

    /// One AEAD and no other (`[security] aead` pinned).
    pub fn only(p: PacketProtection) -> Self {
        Self::of(&[p])
    }

    /// What a peer that sends no offer accepts: a version-2 gateway from before the offer
    /// existed, which only ever used ChaCha20-Poly1305.
    pub fn implied() -> Self {
        Self::only(PacketProtection::ChaCha20Poly1305)
    }

    fn of(preference: &[PacketProtection]) -> Self {
        let mut ids = [0u8; MAX_OFFERED];
        for (slot, p) in ids.iter_mut().zip(preference) {
            *slot = p.id();
        }
        AeadOffer::from_ids(&ids[..preference.len()])
    }

    /// Rank of `p` in this offer (0 = most preferred), if offered.
    fn rank(&self, p: PacketProtection) -> Option<usize> {
        self.ids().iter().position(|&id| id == p.id())
    }
}

impl fmt::Debug for AeadOffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for &id in self.ids() {
            match PacketProtection::from_id(id) {
                Some(p) => l.entry(&p.name()),
                None => l.entry(&id),
            };
        }
        l.finish()
    }
}

/// The AEAD both offers accept with the lowest sum of the two ranks; a tie goes to
/// ChaCha20-Poly1305, so AES-256-GCM wins only when both sides prefer it (both have AES
/// instructions) or one side accepts nothing else. The sum and the tie rule are symmetric,
/// so both sides reach the same choice. `None`: nothing in common.
pub fn negotiate(ours: &AeadOffer, theirs: &AeadOffer) -> Option<PacketProtection> {
    // Listed in tie-break order.
    [
        PacketProtection::ChaCha20Poly1305,
        PacketProtection::Aes256Gcm,
    ]
    .into_iter()
    .filter_map(|p| Some((ours.rank(p)? + theirs.rank(p)?, p)))
    .min_by_key(|&(rank, _)| rank)
    .map(|(_, p)| p)
}

/// Whether this CPU has the instructions AES-256-GCM needs to be fast and constant-time
/// (AES rounds and carry-less multiplication). Read once by the daemon and passed in as
/// `AeadOffer::auto`'s argument: the state machine never looks at the machine it runs on,
/// so simulations replay the same everywhere.
pub fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        // Rust's "aes" on aarch64 is FEAT_AES together with FEAT_PMULL.
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Reader;
    use PacketProtection::{Aes256Gcm as Aes, ChaCha20Poly1305 as ChaCha};

    fn both_ways(a: AeadOffer, b: AeadOffer) -> Option<PacketProtection> {
        let choice = negotiate(&a, &b);
        assert_eq!(choice, negotiate(&b, &a), "{a:?} vs {b:?}");
        choice
    }

    #[test]
    fn choices_for_every_pair_of_settings() {
        let hw = AeadOffer::auto(true);
        let soft = AeadOffer::auto(false);
        let aes = AeadOffer::only(Aes);
        let chacha = AeadOffer::only(ChaCha);
        let old = AeadOffer::implied();
        assert_eq!(both_ways(hw, hw), Some(Aes));
        assert_eq!(both_ways(hw, soft), Some(ChaCha));
        assert_eq!(both_ways(soft, soft), Some(ChaCha));
        assert_eq!(both_ways(aes, soft), Some(Aes));
        assert_eq!(both_ways(aes, hw), Some(Aes));
        assert_eq!(both_ways(chacha, hw), Some(ChaCha));
        assert_eq!(both_ways(old, hw), Some(ChaCha));
        assert_eq!(both_ways(aes, chacha), None);
        assert_eq!(both_ways(aes, old), None);
    }

    #[test]
    fn unknown_identifiers_are_kept_and_never_chosen() {
        let mut r = Reader::new(&[3, 9, ID_AES_256_GCM, 7]);
        let newer = AeadOffer::decode(&mut r).unwrap();
        assert_eq!(format!("{newer:?}"), r#"[9, "aes-256-gcm", 7]"#);
        let mut out = Vec::new();
        newer.encode(&mut out);
        assert_eq!(out, [3, 9, ID_AES_256_GCM, 7]);
        assert_eq!(both_ways(newer, AeadOffer::auto(false)), Some(Aes));
        let only_unknown = AeadOffer::decode(&mut Reader::new(&[1, 9])).unwrap();
        assert_eq!(both_ways(only_unknown, AeadOffer::auto(true)), None);
    }

    #[test]
    fn encoding_and_malformed_offers() {
        let mut out = Vec::new();
        AeadOffer::auto(true).encode(&mut out);
        assert_eq!(out, [2, ID_AES_256_GCM, ID_CHACHA20_POLY1305]);
        assert_eq!(
            AeadOffer::decode(&mut Reader::new(&out)),
            Ok(AeadOffer::auto(true))
        );
        assert!(AeadOffer::decode(&mut Reader::new(&[0])).is_err());
        assert!(AeadOffer::decode(&mut Reader::new(&[9, 1, 1, 1, 1, 1, 1, 1, 1, 1])).is_err());
        assert!(AeadOffer::decode(&mut Reader::new(&[2, 1])).is_err());
    }
}
