//! The traffic tool's server: accepts connections and does what each header asks.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::io::{self as xio, Limit};
use super::pattern::{Digest, Pattern};
use super::proto::{encode_report, Header, Op, Report};

const CHUNK: usize = 64 * 1024;

/// Accept backlog: large enough that a thousand clients connecting at once (through a proxy
/// that opens them all together) are not dropped and left to SYN retransmission.
const BACKLOG: i32 = 4096;

/// A running server; dropping it stops accepting and cuts open connections.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Clones of open connections, so stopping can cut them; each removes itself when done.
    conns: Conns,
    /// Peer address of every connection accepted, in order.
    accepted: Arc<Mutex<Vec<SocketAddr>>>,
    /// Connections that ended in an error, and the error.
    failures: Failures,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` in the calling thread's namespace; `cc` sets the congestion control
    /// of accepted connections.
    pub fn bind(addr: SocketAddr, cc: Option<&str>) -> io::Result<Server> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        sock.set_reuse_address(true)?;
        if let Some(cc) = cc {
            sock.set_tcp_congestion(cc.as_bytes())?;
        }
        sock.set_nodelay(true)?;
        sock.bind(&addr.into())?;
        sock.listen(BACKLOG)?;
        // accept() honours the receive timeout, which lets the acceptor see the stop flag.
        sock.set_read_timeout(Some(xio::TICK))?;
        let listener: TcpListener = sock.into();
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (s, c, a, f) = (
            stop.clone(),
            conns.clone(),
            accepted.clone(),
            failures.clone(),
        );
        let acceptor = thread::Builder::new()
            .name("xfer-accept".into())
            .spawn(move || accept_loop(&listener, &s, &c, &a, &f))?;
        Ok(Server {
            addr,
            stop,
            conns,
            accepted,
            failures,
            acceptor: Some(acceptor),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The peer address of every connection accepted so far: through a proxy it shows whose
    /// address the server sees (the proxy's, or the client's with a transparent source).
    pub fn accepted(&self) -> Vec<SocketAddr> {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Connections that ended in an error (peer address and error), in the order they
    /// ended: the server's side of a failed transfer.
    pub fn failures(&self) -> Vec<(SocketAddr, String)> {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serves until the process ends (for the command-line server).
    pub fn wait(mut self) {
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for (_, c) in self.conns.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

type Conns = Arc<Mutex<HashMap<u64, TcpStream>>>;
type Failures = Arc<Mutex<Vec<(SocketAddr, String)>>>;

fn accept_loop(
    listener: &TcpListener,
    stop: &Arc<AtomicBool>,
    conns: &Conns,
    accepted: &Mutex<Vec<SocketAddr>>,
    failures: &Failures,
) {
    let mut next_id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok((stream, peer)) = listener.accept() else {
            continue;
        };
        accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(peer);
        let id = next_id;
        next_id += 1;
        if let Ok(c) = stream.try_clone() {
            conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, c);
        }
        let (stop, conns, failures) = (stop.clone(), conns.clone(), failures.clone());
        let _ = thread::Builder::new()
            .name("xfer-conn".into())
            .spawn(move || {
                // A client that misbehaves or vanishes only ends its own connection.
                if let Err(e) = serve(stream, &stop) {
                    failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((peer, e.to_string()));
                }
                conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            });
    }
}

fn serve(mut s: TcpStream, stop: &AtomicBool) -> io::Result<()> {
    xio::prepare(&s)?;
    let limit = Limit {
        deadline: None,
        stop: Some(stop),
    };
    let mut hdr = [0u8; super::proto::HEADER_LEN];
    xio::read_exact(&mut s, &mut hdr, limit)?;
    let h = Header::decode(&hdr)?;
    let mut up = Pattern::new(h.seed, 0);
    let mut down = Pattern::new(h.seed, 1);
    let mut buf = vec![0u8; CHUNK];
    match h.op {
        Op::Upload => {
            let (n, ok, digest) = receive_to_eof(&mut s, &mut up, &mut buf, limit)?;
            let report = Report {
                received: n,
                intact: ok && (h.up == 0 || n == h.up),
                digest,
            };
            xio::write_all(&mut s, &encode_report(&report), limit)?;
        }
        Op::Bidir => {
            let mut tx = s.try_clone()?;
            let (received, sent) = thread::scope(|sc| {
                let sender = sc.spawn(|| {
                    let mut b = vec![0u8; CHUNK];
                    send(&mut tx, &mut down, h.down, &mut b, limit)
                });
                let r = receive_to_eof(&mut s, &mut up, &mut buf, limit);
                let sent = sender
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("sender panicked")));
                (r, sent)
            });
            let (n, ok, digest) = received?;
            sent?;
            let report = Report {
                received: n,
                intact: ok && n == h.up,
                digest,
            };
            xio::write_all(&mut s, &encode_report(&report), limit)?;
        }
        Op::Download => {
            let until = (h.duration_ms > 0)
                .then(|| Instant::now() + Duration::from_millis(h.duration_ms.into()));
            let total = if until.is_some() { u64::MAX } else { h.down };
            let until_limit = Limit {
                deadline: until,
                ..limit
            };
            match h.pace_kbps {
                0 => send(&mut s, &mut down, total, &mut buf, until_limit),
                kbps => send_paced(&mut s, &mut down, total, f64::from(kbps) * 1e3, until_limit),
            }
            .or_else(|e| {
                if xio::is_capped(&e) && !limit.expired() {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?;
        }
        Op::Rr => loop {
            let mut req = [0u8; 8];
            match xio::read_exact(&mut s, &mut req, limit) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                r => r?,
            }
            let req_len = u32::from_be_bytes([req[0], req[1], req[2], req[3]]) as usize;
            let resp_len = u32::from_be_bytes([req[4], req[5], req[6], req[7]]) as u64;
            let mut body = vec![0u8; req_len];
            xio::read_exact(&mut s, &mut body, limit)?;
            if !up.verify(&body) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request corrupted",
                ));
            }
            send(&mut s, &mut down, resp_len, &mut buf, limit)?;
        },
        Op::HalfClose => {
            let (n, ok, _) = receive_to_eof(&mut s, &mut up, &mut buf, limit)?;
            // Replying only to a complete, intact request makes a broken half-close visible.
            if ok && n == h.up {
                send(&mut s, &mut down, h.down, &mut buf, limit)?;
            }
        }
    }
    s.shutdown(Shutdown::Write)
}

fn receive_to_eof(
    s: &mut TcpStream,
    p: &mut Pattern,
    buf: &mut [u8],
    limit: Limit,
) -> io::Result<(u64, bool, Digest)> {
    let (mut n, mut ok, mut digest) = (0u64, true, Digest::default());
    loop {
        let got = xio::read_some(s, buf, limit)?;
        if got == 0 {
            return Ok((n, ok, digest));
        }
        ok &= p.verify(&buf[..got]);
        digest.update(&buf[..got]);
        n += got as u64;
    }
}

/// Bytes a paced stream writes at a time: small enough that its rate is smooth over a few
/// milliseconds.
const PACED_CHUNK: usize = 1_250;

/// Sends `total` bytes of the pattern at `rate_bps` (until the limit when `total` is
/// `u64::MAX`), as a live source produces them: each chunk is due when the bytes before it
/// have had their time at the rate, and what fell due while the connection did not take
/// it is written as soon as it does.
fn send_paced(
    s: &mut TcpStream,
    p: &mut Pattern,
    total: u64,
    rate_bps: f64,
    limit: Limit,
) -> io::Result<u64> {
    let mut buf = [0u8; PACED_CHUNK];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let due = start + Duration::from_secs_f64(sent as f64 * 8.0 / rate_bps);
        let now = Instant::now();
        if due > now {
            if limit.deadline.is_some_and(|d| d <= due) {
                return Err(xio::capped());
            }
            thread::sleep(due - now);
        }
        let n = (total - sent).min(PACED_CHUNK as u64) as usize;
        p.fill(&mut buf[..n]);
        xio::write_all(s, &buf[..n], limit)?;
        sent += n as u64;
    }
    Ok(sent)
}

/// Sends `total` bytes of the pattern (until the limit when `total` is `u64::MAX`).
pub fn send(
    s: &mut TcpStream,
    p: &mut Pattern,
    total: u64,
    buf: &mut [u8],
    limit: Limit,
) -> io::Result<u64> {
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        xio::write_all(s, &buf[..n], limit)?;
        sent += n as u64;
    }
    Ok(sent)
}
