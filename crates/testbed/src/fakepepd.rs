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

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use nix::libc;
use socket2::{Domain, Protocol, Socket, Type};

use crate::pepd::{ASSOCIATION_ESTABLISHED, OWN_MARK, READY, TPROXY_PORT};
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

/// IP_TRANSPARENT / IPV6_TRANSPARENT: accept connections to (or bind to) any address.
fn set_transparent(s: &Socket, v6: bool) -> io::Result<()> {
    if !v6 {
        return s.set_ip_transparent(true);
    }
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from a live local; the descriptor is open.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_IPV6,
            libc::IPV6_TRANSPARENT,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn listener(at: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(at), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    set_transparent(&s, at.is_ipv6())?;
    if at.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&at.into())?;
    s.listen(4096)?;
    Ok(s)
}

fn notify(msg: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        if let Ok(s) = UnixDatagram::unbound() {
            let _ = s.send_to(msg.as_bytes(), path);
        }
    }
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
        let l = listener(*at)?;
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

/// Closing with SO_LINGER 0 sends a reset instead of a FIN.
fn arm_reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
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
    let reset = Arc::new(AtomicBool::new(false));
    let pipes = [(&down, &up), (&up, &down)].map(|(from, to)| {
        let (from, to, reset) = (from.try_clone(), to.try_clone(), reset.clone());
        thread::spawn(move || match (from, to) {
            (Ok(f), Ok(t)) => pipe(f, t, &reset),
            (Err(e), _) | (_, Err(e)) => format!("clone failed: {e}"),
        })
    });
    let [client_to_server, server_to_client] =
        pipes.map(|p| p.join().unwrap_or_else(|_| "panicked".into()));
    let reset = reset.load(Ordering::Relaxed);
    if reset {
        arm_reset(&down);
        arm_reset(&up);
    }
    eprintln!(
        "fake-pepd: {:?} -> {:?}: client→server {client_to_server}; server→client \
         {server_to_client}; {}",
        down.peer_addr(),
        down.local_addr(),
        if reset { "reset" } else { "closed" }
    );
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

/// Copies `from` to `to` until EOF (passed on as a half-close) or an error (a reset: both
/// ends get one once both directions stop). Says how it ended, for the log.
fn pipe(mut from: TcpStream, mut to: TcpStream, reset: &AtomicBool) -> String {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let r = from.read(&mut buf).and_then(|n| {
            if n > 0 {
                to.write_all(&buf[..n])?;
            }
            Ok(n)
        });
        match r {
            // After a reset the EOF is the other direction waking this one up: no FIN then.
            Ok(0) if reset.load(Ordering::Relaxed) => {
                return format!("{total} bytes, stopped by the reset")
            }
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return format!("{total} bytes, EOF");
            }
            Ok(n) => total += n as u64,
            Err(e) => {
                reset.store(true, Ordering::Relaxed);
                // Wake the other direction's blocked read so both sockets can be reset.
                let _ = to.shutdown(Shutdown::Read);
                return format!("{total} bytes, {e}");
            }
        }
    }
}
