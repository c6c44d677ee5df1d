//! The budgets of HINTs (docs/PROTOCOL.md §3.3, §7.7): how many a hub sends for unknown
//! connection IDs, in all and to one source; and what a terminal made of those it received.

use std::net::SocketAddr;
use std::time::Instant;

use super::limiter::{SourceBudgets, TokenBucket};

/// HINTs one endpoint sends per second in the long run: its handshake budget's rate, so the
/// initiations they call for fit in the work the endpoint can do.
pub const HINTS_PER_SECOND: u32 = 2000;
/// HINTs one endpoint may send back to back.
pub const HINT_BURST: u32 = 1000;
/// HINTs sent per second to one source address (address and port).
pub const HINTS_PER_SOURCE_PER_SECOND: u32 = 2;
/// HINTs one source address may get back to back.
pub const HINT_SOURCE_BURST: u32 = 2;

/// What a hub's endpoint may still send: a token from the source's budget and one from
/// the endpoint's.
pub(crate) struct HintBudget {
    endpoint: TokenBucket,
    by_source: SourceBudgets<SocketAddr>,
}

impl HintBudget {
    pub(crate) fn new() -> Self {
        HintBudget {
            endpoint: TokenBucket::new(HINTS_PER_SECOND, HINT_BURST),
            by_source: SourceBudgets::new(HINTS_PER_SOURCE_PER_SECOND, HINT_SOURCE_BURST),
        }
    }

    /// Whether a HINT may go to `to` now. The source's token is taken first: a flood from
    /// one address spends its own budget, not the endpoint's.
    pub(crate) fn try_take(&mut self, now: Instant, to: SocketAddr) -> bool {
        self.by_source.try_take(now, to) && self.endpoint.try_take(now)
    }
}

/// HINTs an association received, by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HintCounts {
    /// Matched a packet of ours outstanding at the hub we send to: an initiation was
    /// started, or the one in flight sent at once.
    pub acted: u64,
    /// Matched, but one hint was acted on within the last second.
    pub rate_limited: u64,
    /// Echoed no packet of ours outstanding (connection ID, packet number or tag tail).
    pub unmatched: u64,
    /// Came from another address than the hub we send to.
    pub elsewhere: u64,
    /// Arrived while the association was not established: it is initiating already.
    pub ignored: u64,
}
