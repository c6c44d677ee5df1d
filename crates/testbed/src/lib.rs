//! pep-testbed: the `client — gw-a ═[linkemu]═ gw-b — server` topology in network namespaces,
//! named link profiles, a verifying traffic tool and a scenario runner.

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
