//! pep-testbed: the `client — gw-a ═[linkemu]═ gw-b — server` topology in network namespaces,
//! named link profiles, a verifying traffic tool and a scenario runner. Needs root.
//!
//! ```text
//! pep-testbed run --profile lawson --ber 1e-6 --mode plain-cubic --workload download --seconds 30 --json
//! pep-testbed run --profile geo --mode pepd --workload bidir --bytes 10000000 # --pepd PATH
//! pep-testbed run --profile nasa --link veth --mode plain-cubic --workload download --bytes 1000000000
//! pep-testbed up --profile geo            # keeps the topology up until Ctrl-C; prints the names
//! pep-testbed up --profile geo --with-pepd --pepd-toml '[upstream] transparent_source = true'
//! ip netns exec NAME-sv pep-testbed xfer server
//! ip netns exec NAME-cl pep-testbed xfer client --connect 198.18.3.2:5001 --workload page
//! pep-testbed down                        # removes namespaces left by dead processes
//! ```
//!
//! Addresses: client 198.18.1.2 / fd00:198:18:1::2, server 198.18.3.2 / fd00:198:18:3::2
//! (see [`addr`]). The link's forward direction is gw-b → gw-a, towards the client.
//! `--link veth` ([`topology::LinkKind`]) joins the gateways with a bare veth pair instead
//! of the emulator, for measuring the gateways' own CPU cost at gigabit rates.
//!
//! In pepd mode ([`pepd`]) gw-a runs pepd as the terminal and gw-b as the hub, with TPROXY
//! interception and policy routing installed in their namespaces; [`PepdTestbed`] keeps
//! such a topology up for tests (kill and restart a gateway, take the hop down).
//!
//! In split-tcp mode ([`split`]) each gateway runs a kernel split-TCP relay instead (the
//! baseline pepd is compared with), behind the same interception.
//!
//! [`hub`] builds the hub-and-spoke form (`pep-testbed hub --terminals N`): one hub gateway,
//! N terminal gateways each with its own client network, one shared emulated forward
//! carrier and a return link per terminal; [`hub::HubTestbed`] keeps it up for tests.
//!
//! [`failover`] (`pep-testbed failover --scenario …`) probes through the hub topology while
//! a hub fails and reports how long each terminal took to be answered again.
//!
//! [`browser`] (`pep-testbed browser`) has headless chromium load a page from caddy
//! (HTTP/1.1, 2 and 3) across the link, without pepd or through pepd with a QUIC policy,
//! and reports each visit's load time and the protocol of every object.

pub mod addr;
pub mod browser;
pub mod cmd;
pub mod corpus;
pub mod cpu;
pub mod cross;
pub mod daemon;
pub mod failover;
pub mod fakepepd;
pub mod hub;
pub mod pepd;
pub mod ping;
pub mod profile;
pub mod relay_io;
pub mod runner;
pub mod split;
pub mod stats;
pub mod topology;
pub mod udp;
pub mod xfer;

pub use pep_linkemu::netns::require_root;
pub use pepd::{PepdOptions, PepdTestbed, Side};
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

/// Raises this process's soft limit on open files to its hard limit (for tests with many
/// connections; daemons started afterwards inherit it). Returns the new soft limit.
pub fn raise_nofile_limit() -> Result<u64, Error> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    Ok(hard)
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
    #[error("pepd: {0}")]
    Pepd(String),
    #[error("traffic: {0}")]
    Io(#[from] std::io::Error),
}
