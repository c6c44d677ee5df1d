//! Blocking socket I/O that gives up at a deadline or when told to stop. Sockets carry short
//! timeouts so a thread stuck behind a stalled TCP connection still notices either.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often blocked reads and writes look at the deadline and stop flag.
pub const TICK: Duration = Duration::from_millis(100);

/// When to give up.
#[derive(Clone, Copy, Default)]
pub struct Limit<'a> {
    pub deadline: Option<Instant>,
    pub stop: Option<&'a AtomicBool>,
}

impl Limit<'_> {
    pub fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.stop.is_some_and(|s| s.load(Ordering::Relaxed))
    }
}

/// The error a transfer cut short by its deadline returns.
pub fn capped() -> io::Error {
    io::Error::new(ErrorKind::TimedOut, "run time cap reached")
}

pub fn is_capped(e: &io::Error) -> bool {
    e.kind() == ErrorKind::TimedOut
}

fn retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

pub fn prepare(s: &TcpStream) -> io::Result<()> {
    s.set_read_timeout(Some(TICK))?;
    s.set_write_timeout(Some(TICK))
}

/// Reads what is available (0 at EOF).
pub fn read_some(s: &mut TcpStream, buf: &mut [u8], limit: Limit) -> io::Result<usize> {
    loop {
        if limit.expired() {
            return Err(capped());
        }
        match s.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if retry(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn read_exact(s: &mut TcpStream, mut buf: &mut [u8], limit: Limit) -> io::Result<()> {
    while !buf.is_empty() {
        let n = read_some(s, buf, limit)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

pub fn write_all(s: &mut TcpStream, mut buf: &[u8], limit: Limit) -> io::Result<()> {
    while !buf.is_empty() {
        if limit.expired() {
            return Err(capped());
        }
        match s.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if retry(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
