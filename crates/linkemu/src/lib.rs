//! pep-linkemu: a point-to-point IP link emulator between two TUN devices.
//!
//! Each direction has its own [`shaper::Shaper`] (rate, drop-tail queue, delay, jitter and the
//! shared impairment models of `pep_sim::channel`); [`engine::Emulator`] moves packets between
//! the TUN devices with one reader and one writer thread per direction.

pub mod checksum;
pub mod cli;
pub mod config;
pub mod engine;
pub mod gso;
pub mod netns;
pub mod shaper;
pub mod stats;
pub mod tun;

pub use config::{DirectionConfig, LinkConfig};
pub use engine::{Emulator, Endpoint};
pub use stats::{DirectionStats, LinkStats};

/// Errors from setting up or running the emulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("network namespace {name:?}: {source}")]
    Netns {
        name: String,
        source: std::io::Error,
    },
    #[error("TUN device {dev:?}: {source}")]
    Tun { dev: String, source: std::io::Error },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("thread: {0}")]
    Thread(std::io::Error),
}
