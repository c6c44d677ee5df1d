//! What the testbed's own TPROXY relays share ([`crate::fakepepd`], [`crate::split`]): the
//! transparent listener intercepted connections arrive on, the readiness message, and
//! joining two TCP connections so bytes, half-closes and resets pass between them, moved
//! with splice(2) so no payload is copied through user space.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::libc;
use socket2::{Domain, Protocol, Socket, Type};

/// What each direction's pipe is asked to hold: one splice moves up to this much, so
/// fewer system calls per byte than the default 64 KiB (1 MiB is also the default
/// `fs.pipe-max-size`).
const PIPE_BYTES: usize = 1 << 20;

/// IP_TRANSPARENT / IPV6_TRANSPARENT: accept connections to (or bind to) any address.
pub fn set_transparent(s: &Socket, v6: bool) -> io::Result<()> {
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

/// A transparent listener at `at`: TPROXY hands it connections to any address.
pub fn transparent_listener(at: SocketAddr) -> io::Result<Socket> {
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

/// Sends `msg` on `$NOTIFY_SOCKET` (the systemd protocol the testbed waits on), if set.
pub fn notify(msg: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        if let Ok(s) = UnixDatagram::unbound() {
            let _ = s.send_to(msg.as_bytes(), path);
        }
    }
}

/// Closing with SO_LINGER 0 sends a reset instead of a FIN.
pub fn arm_reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// How a [`join`] ended: each direction's bytes and end, and whether both sides were reset.
#[derive(Debug)]
pub struct Joined {
    pub a_to_b: String,
    pub b_to_a: String,
    pub reset: bool,
}

impl Joined {
    /// One line for the log, the two directions named as the caller calls them.
    pub fn summary(&self, a_to_b: &str, b_to_a: &str) -> String {
        format!(
            "{a_to_b} {}; {b_to_a} {}; {}",
            self.a_to_b,
            self.b_to_a,
            if self.reset { "reset" } else { "closed" }
        )
    }
}

/// Moves bytes both ways between `a` and `b` until both directions end. EOF travels on as
/// a half-close; an error on either side resets both once both directions stopped.
pub fn join(a: &TcpStream, b: &TcpStream) -> Joined {
    let reset = AtomicBool::new(false);
    let (a_to_b, b_to_a) = thread::scope(|s| {
        let forth = s.spawn(|| pump(a, b, &reset));
        let back = pump(b, a, &reset);
        (forth.join().unwrap_or_else(|_| "panicked".into()), back)
    });
    let reset = reset.load(Ordering::Relaxed);
    if reset {
        arm_reset(a);
        arm_reset(b);
    }
    Joined {
        a_to_b,
        b_to_a,
        reset,
    }
}

/// A pipe with room for [`PIPE_BYTES`] where the kernel allows it; returns it with the
/// room it got.
fn pipe() -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // Without the larger pipe each splice moves at most 16 pages: slower, still correct.
    let room = fcntl(
        wr.as_raw_fd(),
        FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as libc::c_int),
    )
    .ok()
    .and_then(|n| usize::try_from(n).ok())
    .unwrap_or(64 * 1024);
    Ok((rd, wr, room))
}

/// One splice, retried when a signal interrupted it.
fn splice_all_of(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    loop {
        match splice(&from, None, &to, None, len, SpliceFFlags::SPLICE_F_MOVE) {
            Err(Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// Socket → pipe → socket until the source ends; returns how many bytes went through, or
/// the error that stopped it.
fn splice_until_eof(from: &TcpStream, to: &TcpStream, total: &mut u64) -> io::Result<()> {
    let (rd, wr, room) = pipe()?;
    loop {
        let n = splice_all_of(from, &wr, room)?;
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            let m = splice_all_of(&rd, to, left)?;
            if m == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left -= m;
        }
        *total += n as u64;
    }
}

/// One direction of [`join`]; says how it ended, for the log.
fn pump(from: &TcpStream, to: &TcpStream, reset: &AtomicBool) -> String {
    let mut total = 0u64;
    match splice_until_eof(from, to, &mut total) {
        // After a reset the EOF is the other direction waking this one up: no FIN then.
        Ok(()) if reset.load(Ordering::Relaxed) => format!("{total} bytes, stopped by the reset"),
        Ok(()) => {
            let _ = to.shutdown(Shutdown::Write);
            format!("{total} bytes, EOF")
        }
        Err(e) => {
            reset.store(true, Ordering::Relaxed);
            // Wake the other direction's blocked splice so both sockets can be reset.
            let _ = to.shutdown(Shutdown::Read);
            format!("{total} bytes, {e}")
        }
    }
}
