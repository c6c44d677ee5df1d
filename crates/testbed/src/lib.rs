//! pep-testbed: the `client — gw-a ═[linkemu]═ gw-b — server` topology in network namespaces,
//! named link profiles, a verifying traffic tool and a scenario runner. Needs root.
//!
//! ```text
//! pep-testbed run --profile lawson --ber 1e-6 --mode plain-cubic --workload download --seconds 30 --json
//! pep-testbed up --profile geo            # keeps the topology up until Ctrl-C; prints the names
//! ip netns exec NAME-sv pep-testbed xfer server
//! ip netns exec NAME-cl pep-testbed xfer client --connect 198.18.3.2:5001 --workload page
//! pep-testbed down                        # removes namespaces left by dead processes
//! ```
//!
//! Addresses: client 198.18.1.2 / fd00:198:18:1::2, server 198.18.3.2 / fd00:198:18:3::2
//! (see [`addr`]). The link's forward direction is gw-b → gw-a, towards the client.

pub mod addr;
pub mod cmd;
pub mod ping;
pub mod profile;
pub mod runner;
pub mod topology;
pub mod udp;
pub mod xfer;

pub use profile::Profile;
pub use runner::{Mode, RunResult, RunSpec};
pub use topology::Topology;

/// Runs `f` on a thread inside network namespace `ns` (threads it spawns stay there).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    Ok(pep_linkemu::netns::run_in(Some(ns), move || Ok(f()))?)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("running `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error(transparent)]
    Emulator(#[from] pep_linkemu::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotImplemented(&'static str),
    #[error("traffic: {0}")]
    Io(#[from] std::io::Error),
}
