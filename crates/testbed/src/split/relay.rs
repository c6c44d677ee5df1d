//! The split-TCP relay process (`pep-testbed split-relay run -c FILE`), one per gateway.
//! Every connection TPROXY hands it (the near side) is accepted here, so the LAN host's
//! TCP ends on this gateway; it opens one kernel TCP connection to the peer gateway's
//! relay, sends the original destination ([`super::header`]) and splices the two together.
//! The peer (the far side) reads the destination, connects to it and splices in turn. Both
//! roles run in every relay, so connections may start on either side.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use super::{header, RelayConfig};
use crate::pepd::READY;
use crate::relay_io::{arm_reset, join, notify, transparent_listener};
use crate::Error;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a tunnel connection may take to name its destination.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

fn load(path: &Path) -> Result<RelayConfig, Error> {
    let text = std::fs::read_to_string(path)?;
    toml::from_str(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// Settings every relay socket gets: the chosen congestion control, and no Nagle delay,
/// so a small request is not held back waiting for the ACK of the previous one.
fn tune(s: SockRef<'_>, cfg: &RelayConfig) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_tcp_congestion(cfg.congestion_control.as_bytes())
}

/// `split-relay run -c FILE`: serves until killed.
pub fn main(config: &Path) -> Result<(), Error> {
    let cfg = load(config)?;
    let mut listeners = Vec::new();
    for at in &cfg.intercept {
        listeners.push((transparent_listener(*at)?, Role::Near));
    }
    let tunnel = Socket::new(
        Domain::for_address(cfg.tunnel_listen),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    tunnel.set_reuse_address(true)?;
    tunnel.bind(&cfg.tunnel_listen.into())?;
    tunnel.listen(4096)?;
    listeners.push((tunnel, Role::Far));
    let mut acceptors = Vec::new();
    for (l, role) in listeners {
        let cfg = cfg.clone();
        acceptors.push(thread::spawn(move || loop {
            match l.accept() {
                Ok((s, _)) => {
                    let cfg = cfg.clone();
                    thread::spawn(move || role.serve(s.into(), &cfg));
                }
                Err(e) => eprintln!("split-relay: accept: {e}"),
            }
        }));
    }
    eprintln!(
        "split-relay: intercepting on {:?}, tunnel on {}, peer {}, {}",
        cfg.intercept, cfg.tunnel_listen, cfg.peer, cfg.congestion_control
    );
    notify(READY);
    for a in acceptors {
        let _ = a.join();
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Role {
    /// An intercepted connection from this gateway's LAN.
    Near,
    /// A tunnel connection from the peer relay.
    Far,
}

impl Role {
    fn serve(self, accepted: TcpStream, cfg: &RelayConfig) {
        let (label, other) = match self {
            Role::Near => ("near", open_tunnel(&accepted, cfg)),
            Role::Far => ("far", open_destination(&accepted, cfg)),
        };
        let other = match other {
            Ok(o) => o,
            Err(e) => {
                eprintln!("split-relay: {label} {:?}: {e}", accepted.peer_addr());
                arm_reset(&accepted);
                return;
            }
        };
        // Named before the relay: a closed socket has no peer address left.
        let (from, to) = (accepted.peer_addr(), other.peer_addr());
        let j = join(&accepted, &other).summary("in", "out");
        eprintln!("split-relay: {label} {from:?} -> {to:?}: {j}");
    }
}

fn connect(dst: SocketAddr, cfg: &RelayConfig) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    // Marked as pepd marks its own sockets, so the interception rules leave them alone.
    s.set_mark(cfg.own_mark)?;
    tune(SockRef::from(&s), cfg)?;
    s.connect_timeout(&dst.into(), CONNECT_TIMEOUT)?;
    Ok(s.into())
}

/// Near side: a tunnel connection to the peer relay that names the original destination
/// (TPROXY leaves it as the accepted socket's local address).
fn open_tunnel(intercepted: &TcpStream, cfg: &RelayConfig) -> io::Result<TcpStream> {
    use std::io::Write;
    tune(SockRef::from(intercepted), cfg)?;
    let dst = intercepted.local_addr()?;
    let mut t = connect(cfg.peer, cfg)?;
    t.write_all(&header::encode(dst))?;
    Ok(t)
}

/// Far side: the connection to the destination the tunnel names.
fn open_destination(tunnel: &TcpStream, cfg: &RelayConfig) -> io::Result<TcpStream> {
    tune(SockRef::from(tunnel), cfg)?;
    tunnel.set_read_timeout(Some(HEADER_TIMEOUT))?;
    let mut r = tunnel;
    let dst = header::read(&mut r)?;
    tunnel.set_read_timeout(None)?;
    connect(dst, cfg)
}
