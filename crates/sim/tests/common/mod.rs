//! What the simulator's many-endpoint tests (hub, standby) share.

use std::cmp::Ordering;
use std::net::SocketAddr;
use std::time::Instant;

/// The hub's static private key.
pub const HUB_KEY: [u8; 32] = [0x11; 32];

/// Terminal `i`'s static private key.
pub fn terminal_key(i: usize) -> [u8; 32] {
    // Not in byte 0: X25519 clears its low bits.
    let mut k = [0x40u8; 32];
    k[1..3].copy_from_slice(&(i as u16).to_be_bytes());
    k
}

/// The hub's tunnel address.
pub fn hub_addr() -> SocketAddr {
    SocketAddr::from(([198, 18, 0, 1], 7400))
}

/// An event due at `at`; `seq` keeps events due at the same instant in the order they were
/// queued, so a run is deterministic. Ordered by (`at`, `seq`) only.
pub struct Queued<E> {
    pub at: Instant,
    pub seq: u64,
    pub ev: E,
}

impl<E> PartialEq for Queued<E> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<E> Eq for Queued<E> {}
impl<E> PartialOrd for Queued<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Queued<E> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}
