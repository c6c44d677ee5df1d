//! What the security layer counts: the datagrams it dropped, by reason.

/// Datagrams dropped by the security layer. None of them gets a reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SecurityCounts {
    /// Failed authentication, or no key to open it with.
    pub unauthenticated: u64,
    /// Authenticated before, or older than the replay window.
    pub replayed: u64,
    /// A plaintext HELLO while security is on, or a handshake while it is off.
    pub wrong_mode: u64,
    /// A handshake message that did not verify or parse.
    pub handshake_invalid: u64,
    /// A valid handshake from a static key other than the configured peer's.
    pub handshake_unknown_peer: u64,
    /// Handshake initiations over the processing rate limit.
    pub handshake_rate_limited: u64,
    /// A handshake initiation seen before (same ephemeral key).
    pub handshake_replayed: u64,
    /// A handshake message whose mac1 is not keyed for us: dropped before any
    /// Diffie-Hellman.
    pub handshake_bad_mac: u64,
    /// A COOKIE that was forged, stale, replayed or for no initiation of ours.
    pub cookie_invalid: u64,
    /// Sends refused because the packet number was already used under the current key
    /// (never expected; a guard against nonce reuse).
    pub nonce_refused: u64,
    /// A handshake that authenticated but whose two AEAD offers have nothing in common
    /// (both sides pinned to different AEADs): no keys are installed.
    pub aead_mismatch: u64,
    /// The peer's initiation crossed one of ours that stands (we lead, and ours went to the
    /// address the peer's came from): the peer answers ours instead. Many of these while a
    /// peer stays unassociated mean the two sides keep missing each other.
    pub handshake_collision: u64,
}

impl SecurityCounts {
    /// Each reason with its metric label, for exporters.
    pub fn by_reason(&self) -> [(&'static str, u64); 11] {
        [
            ("unauthenticated", self.unauthenticated),
            ("replayed", self.replayed),
            ("wrong_mode", self.wrong_mode),
            ("handshake_invalid", self.handshake_invalid),
            ("handshake_unknown_peer", self.handshake_unknown_peer),
            ("handshake_rate_limited", self.handshake_rate_limited),
            ("handshake_replayed", self.handshake_replayed),
            ("handshake_bad_mac", self.handshake_bad_mac),
            ("cookie_invalid", self.cookie_invalid),
            ("aead_mismatch", self.aead_mismatch),
            ("handshake_collision", self.handshake_collision),
        ]
    }
}
