//! The kernel split-TCP baseline (`--mode split-tcp`), what users compare pepd with:
//! PEPsal's design, a TPROXY-intercepting relay on each gateway. A LAN host's connection
//! ends on its gateway; one plain kernel TCP connection per flow carries it across the link
//! to the other gateway's relay, which connects to the real destination. Bytes move with
//! splice(2) through a pipe ([`crate::relay_io`]), so no payload passes through user space;
//! congestion control is the kernel's (CUBIC unless told otherwise).
//!
//! The gateways get the same interception rules and policy routing as pepd
//! ([`crate::pepd::install_interception`]), the relay listening on pepd's TPROXY port, and
//! the TCP buffer ceilings of the end hosts ([`crate::topology::raise_tcp_buffers`]) so
//! autotuning can open a window over a long link.

mod header;
pub mod relay;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use crate::addr::{GW_A_SAT_V4, GW_B_SAT_V4};
use crate::daemon::{Daemon, Launch};
use crate::pepd::{
    fresh_dir, install_interception, remove_dir, Side, KEEP_ENV, OWN_MARK, READY, TPROXY_PORT,
};
use crate::topology::{raise_tcp_buffers, Names};
use crate::Error;

/// The port each relay accepts its peer's tunnel connections on (on the link's address).
pub const TUNNEL_PORT: u16 = 7500;

/// How long a relay gets to bind its listeners and say READY.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Lines of each relay's log printed when a test panics with the relays up.
const TAIL_ON_PANIC: usize = 30;

/// One relay's config file (TOML).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// TPROXY listeners for intercepted connections.
    pub intercept: Vec<SocketAddr>,
    /// Where the peer relay's tunnel connections arrive.
    pub tunnel_listen: SocketAddr,
    /// The peer relay's tunnel listener.
    pub peer: SocketAddr,
    /// Mark on the relay's own connections (as pepd's `[intercept] own_mark`).
    pub own_mark: u32,
    /// TCP congestion control of every relay socket, e.g. "cubic" or "bbr".
    pub congestion_control: String,
}

impl RelayConfig {
    /// The config of `side`'s relay.
    pub fn for_side(side: Side, congestion_control: &str) -> RelayConfig {
        let a = SocketAddr::from((GW_A_SAT_V4, TUNNEL_PORT));
        let b = SocketAddr::from((GW_B_SAT_V4, TUNNEL_PORT));
        let (own, peer) = match side {
            Side::Terminal => (a, b),
            Side::Hub => (b, a),
        };
        RelayConfig {
            intercept: vec![
                SocketAddr::from(([0, 0, 0, 0], TPROXY_PORT)),
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, TPROXY_PORT)),
            ],
            tunnel_listen: own,
            peer,
            own_mark: OWN_MARK,
            congestion_control: congestion_control.to_owned(),
        }
    }
}

/// How the runner starts the relays.
#[derive(Clone, Debug)]
pub struct SplitOptions {
    /// The `pep-testbed` executable that has the `split-relay` command; default: this one.
    pub binary: Option<PathBuf>,
    /// Congestion control of the relays' sockets.
    pub congestion_control: String,
}

impl Default for SplitOptions {
    fn default() -> Self {
        SplitOptions {
            binary: None,
            congestion_control: "cubic".into(),
        }
    }
}

/// The split relay running on both gateways; dropping it stops them and removes their
/// directory (kept when `PEPTB_KEEP` is set).
pub struct SplitGateways {
    dir: PathBuf,
    keep: bool,
    /// By side: terminal (gw-a), hub (gw-b).
    relays: Vec<Daemon>,
}

impl SplitGateways {
    /// Installs interception on both gateways, starts a relay on each and waits until both
    /// listen.
    pub fn start(names: &Names, opts: &SplitOptions) -> Result<SplitGateways, Error> {
        let program = match &opts.binary {
            Some(p) => p.clone(),
            None => std::env::current_exe()?,
        };
        let launch = Launch {
            program,
            args: vec!["split-relay".into()],
            env: Vec::new(),
        };
        let mut g = SplitGateways {
            dir: fresh_dir(names.base())?,
            keep: std::env::var_os(KEEP_ENV).is_some(),
            relays: Vec::new(),
        };
        for side in Side::BOTH {
            let ns = side.namespace(names);
            let cfg = RelayConfig::for_side(side, &opts.congestion_control);
            let text = toml::to_string(&cfg)
                .map_err(|e| Error::Invalid(format!("writing the relay config: {e}")))?;
            let label = format!("{} (split relay)", side.gateway());
            let d = Daemon::prepare(&g.dir, side.gateway(), &label, ns, &text)?;
            install_interception(ns)?;
            raise_tcp_buffers(ns)?;
            g.relays.push(d);
        }
        let mut since = Vec::new();
        for d in &mut g.relays {
            since.push(d.spawn(&launch)?);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for (d, t) in g.relays.iter_mut().zip(since) {
            d.wait_for(READY, t, deadline, READY_TIMEOUT)?;
        }
        Ok(g)
    }

    /// Each relay's process id (while it runs), keyed by gateway name.
    pub fn pids(&self) -> Vec<(String, Option<u32>)> {
        Side::BOTH
            .into_iter()
            .zip(&self.relays)
            .map(|(s, d)| (s.gateway().to_owned(), d.pid()))
            .collect()
    }

    /// The tails of both logs, keyed by gateway name.
    pub fn log_tails(&self, lines: usize) -> std::collections::BTreeMap<String, String> {
        Side::BOTH
            .into_iter()
            .zip(&self.relays)
            .map(|(s, d)| (s.gateway().to_owned(), d.log_tail(lines)))
            .collect()
    }
}

impl Drop for SplitGateways {
    fn drop(&mut self) {
        if thread::panicking() {
            for d in &self.relays {
                d.dump_tail(TAIL_ON_PANIC);
            }
        }
        self.relays.clear();
        remove_dir(&self.dir, self.keep);
    }
}
