//! Prometheus metrics: what the daemon reports at one instant ([`Snapshot`]), collected from
//! the tunnel's state, its encoding in the OpenMetrics text format, and the small HTTP
//! endpoint that serves it.
//!
//! The daemon keeps its own counters (in the transport's `Stats` and the relay's atomics);
//! this module never counts anything itself. Each scrape asks the daemon for a fresh
//! [`Snapshot`] and reports those values as they are, so a counter here is exactly as
//! monotonic as the daemon's counter behind it and nothing is counted twice.
//!
//! Every name, label and unit is listed in `docs/METRICS.md`; keep the two in step.

mod encode;
mod http;
mod snapshot;

pub use encode::encode;
pub use http::{serve, HealthSource, SnapshotSource, CONTENT_TYPE};
pub use snapshot::{
    AnnounceSnapshot, CompressionSnapshot, PeerSnapshot, RelaySnapshot, Snapshot, WorkerSnapshot,
};

/// Prefix of every metric name.
pub const PREFIX: &str = "pepd";

#[cfg(test)]
mod tests;
