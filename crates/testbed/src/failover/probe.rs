//! A terminal's prober: from its client namespace, a new TCP connection to the server
//! every interval, each carrying one request and its response (pattern-checked), whether or
//! not the earlier ones ended. Each connection is logged with when it started and ended and
//! how ([`Ending`]), so that the report can tell when requests were answered again after a
//! failure and which connections were reset or left hanging.

use std::io::{self, ErrorKind};
use std::net::{Shutdown, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::in_netns;
use crate::xfer::client::{exchange, rr_open, ClientOpts};
use crate::xfer::io::is_capped;
use crate::xfer::pattern::Pattern;
use crate::Error;

use super::report::{Ending, Request};

#[derive(Clone, Debug)]
pub struct ProbeSpec {
    pub server: SocketAddr,
    pub every: Duration,
    /// Request and response sizes.
    pub sizes: (usize, usize),
    /// Times in the log are seconds from here.
    pub epoch: Instant,
    /// No connection starts at or after this, and every one still open then is logged
    /// [`Ending::Open`].
    pub until: Instant,
}

/// A prober running in a namespace; [`Prober::finish`] waits for the end and returns its log.
pub struct Prober {
    handle: JoinHandle<Result<Vec<Request>, Error>>,
}

impl Prober {
    /// Starts probing from namespace `ns`; `seed` keeps its patterns apart from other
    /// terminals'.
    pub fn start(ns: &str, seed: u64, spec: ProbeSpec) -> Prober {
        let ns = ns.to_owned();
        let handle = thread::spawn(move || in_netns(&ns, move || probe(seed, &spec)));
        Prober { handle }
    }

    /// The log, ordered by start, once `until` has passed and every connection ended.
    pub fn finish(self) -> Result<Vec<Request>, Error> {
        self.handle
            .join()
            .map_err(|_| Error::Invalid("a prober panicked".into()))?
    }
}

fn probe(seed: u64, spec: &ProbeSpec) -> Vec<Request> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut connections = Vec::new();
    let mut next = Instant::now();
    let mut k = 0u64;
    while next < spec.until {
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        // Threads spawned here stay in the namespace this one entered.
        let (log, spec2) = (log.clone(), spec.clone());
        let stream_seed = seed * 1_000_000 + k;
        connections.push(thread::spawn(move || {
            let r = one_request(stream_seed, &spec2);
            log.lock().unwrap_or_else(|p| p.into_inner()).push(r);
        }));
        k += 1;
        next += spec.every;
    }
    for c in connections {
        let _ = c.join();
    }
    let mut log = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    log.sort_by(|a: &Request, b: &Request| a.started_s.total_cmp(&b.started_s));
    log
}

fn one_request(seed: u64, spec: &ProbeSpec) -> Request {
    let since = |t: Instant| t.saturating_duration_since(spec.epoch).as_secs_f64();
    let started = Instant::now();
    let o = ClientOpts {
        server: spec.server,
        cc: None,
        seed,
        max_duration: spec.until.saturating_duration_since(started),
    };
    let r = (|| -> io::Result<bool> {
        let mut s = rr_open(&o, seed, spec.until)?;
        let (mut up, mut down) = (Pattern::new(seed, 0), Pattern::new(seed, 1));
        let (_, exact) = exchange(
            &mut s,
            &mut up,
            &mut down,
            spec.sizes.0,
            spec.sizes.1,
            spec.until,
        )?;
        let _ = s.shutdown(Shutdown::Both);
        Ok(exact)
    })();
    let ending = match &r {
        Ok(exact) => Ending::Answered { exact: *exact },
        Err(e) => ending_of(e),
    };
    Request {
        started_s: since(started),
        ended_s: (ending != Ending::Open).then(|| since(Instant::now())),
        ending,
    }
}

/// How a connection that failed with `e` ended.
fn ending_of(e: &io::Error) -> Ending {
    if is_capped(e) {
        return Ending::Open;
    }
    match e.kind() {
        ErrorKind::ConnectionRefused => Ending::Refused,
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => Ending::Reset,
        _ => Ending::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_into_endings() {
        let e = |k: ErrorKind| ending_of(&io::Error::from(k));
        assert_eq!(e(ErrorKind::TimedOut), Ending::Open);
        assert_eq!(e(ErrorKind::ConnectionRefused), Ending::Refused);
        assert_eq!(e(ErrorKind::ConnectionReset), Ending::Reset);
        assert_eq!(e(ErrorKind::UnexpectedEof), Ending::Reset);
        assert_eq!(e(ErrorKind::BrokenPipe), Ending::Reset);
        assert_eq!(e(ErrorKind::HostUnreachable), Ending::Failed);
        assert_eq!(e(ErrorKind::InvalidData), Ending::Failed);
    }
}
