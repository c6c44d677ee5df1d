//! A stand-in for pepd (`pep-testbed fake-pepd run -c FILE`) that relays intercepted TCP
//! straight over the routed path instead of the satellite transport. It uses everything the
//! testbed builds around the daemon — config file, TPROXY rules, policy routing, the
//! transparent upstream source, the notify socket — so that plumbing can be tested without
//! the daemon and a failing relay test can be pinned on one side or the other.
//!
//! It reads `[intercept] listen`, `[intercept] own_mark` and `[upstream]
//! transparent_source` from the config and ignores the rest. Each intercepted connection is
//! connected to its original destination; EOF travels on as a half-close, and a reset or a
//! refused/unreachable upstream as a reset.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::pepd::{ASSOCIATION_ESTABLISHED, OWN_MARK, READY, TPROXY_PORT};
use crate::relay_io::{arm_reset, join, notify, set_transparent, transparent_listener};
use crate::Error;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct FakeConfig {
    listen: Vec<SocketAddr>,
    own_mark: u32,
    transparent_source: bool,
}

fn load(path: &Path) -> Result<FakeConfig, Error> {
    let text = std::fs::read_to_string(path)?;
    let t: toml::Table = text
        .parse()
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let bad = |what: &str| Error::Invalid(format!("{}: {what}", path.display()));
    let section = |name: &str| t.get(name).and_then(toml::Value::as_table);
    let listen = match section("intercept").and_then(|i| i.get("listen")) {
        None => vec![
            SocketAddr::from(([0, 0, 0, 0], TPROXY_PORT)),
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, TPROXY_PORT)),
        ],
        Some(v) => v
            .as_array()
            .ok_or_else(|| bad("intercept.listen must be an array"))?
            .iter()
            .map(|a| {
                a.as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("intercept.listen holds a bad address"))
            })
            .collect::<Result<_, _>>()?,
    };
    let own_mark = match section("intercept").and_then(|i| i.get("own_mark")) {
        None => OWN_MARK,
        Some(v) => v
            .as_integer()
            .and_then(|m| u32::try_from(m).ok())
            .ok_or_else(|| bad("intercept.own_mark must be a 32-bit integer"))?,
    };
    let transparent_source = match section("upstream").and_then(|u| u.get("transparent_source")) {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| bad("upstream.transparent_source must be a boolean"))?,
    };
    Ok(FakeConfig {
        listen,
        own_mark,
        transparent_source,
    })
}

/// `fake-pepd run -c FILE` / `fake-pepd check-config -c FILE`.
pub fn main(args: &[String]) -> Result<(), Error> {
    let usage = || Error::Invalid("usage: fake-pepd (run|check-config) -c FILE".into());
    let [cmd, flag, file] = args else {
        return Err(usage());
    };
    if flag != "-c" {
        return Err(usage());
    }
    let cfg = load(Path::new(file))?;
    match cmd.as_str() {
        "check-config" => return Ok(()),
        "run" => {}
        _ => return Err(usage()),
    }
    let mut acceptors = Vec::new();
    for at in &cfg.listen {
        let l = transparent_listener(*at)?;
        let (mark, transparent) = (cfg.own_mark, cfg.transparent_source);
        acceptors.push(thread::spawn(move || loop {
            match l.accept() {
                Ok((s, _)) => {
                    thread::spawn(move || relay(s.into(), mark, transparent));
                }
                Err(e) => eprintln!("fake-pepd: accept: {e}"),
            }
        }));
    }
    eprintln!("fake-pepd: listening on {:?}", cfg.listen);
    notify(READY);
    notify(ASSOCIATION_ESTABLISHED);
    for a in acceptors {
        let _ = a.join();
    }
    Ok(())
}

fn relay(down: TcpStream, mark: u32, transparent: bool) {
    let up = match open_upstream(&down, mark, transparent) {
        Ok(up) => up,
        Err(e) => {
            eprintln!("fake-pepd: upstream: {e}");
            arm_reset(&down);
            return;
        }
    };
    let (from, to) = (down.peer_addr(), down.local_addr());
    let j = join(&down, &up).summary("client→server", "server→client");
    eprintln!("fake-pepd: {from:?} -> {to:?}: {j}");
}

fn open_upstream(down: &TcpStream, mark: u32, transparent: bool) -> io::Result<TcpStream> {
    // TPROXY leaves the original destination as the accepted socket's local address.
    let dst = down.local_addr()?;
    let src = down.peer_addr()?;
    let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    s.set_mark(mark)?;
    if transparent {
        set_transparent(&s, dst.is_ipv6())?;
        s.bind(&SocketAddr::new(src.ip(), 0).into())?;
    }
    s.connect_timeout(&dst.into(), CONNECT_TIMEOUT)?;
    Ok(s.into())
}
