//! Paced UDP probes for measuring the emulator itself (rate, loss, outages) without TCP's
//! control loop in the way. Each datagram carries its sequence number and send time.

use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

/// IPv4 + UDP header bytes: what the link carries on top of the payload.
pub const IPV4_UDP_OVERHEAD: usize = 28;

#[derive(Clone, Debug)]
pub struct SendSpec {
    pub dst: SocketAddr,
    /// Payload bytes per datagram (at least 16).
    pub payload: usize,
    pub count: u64,
    /// Datagrams per second.
    pub pps: f64,
    /// Send times are stamped relative to this.
    pub epoch: Instant,
}

/// Sends `spec.count` datagrams paced at `spec.pps` from the calling thread's namespace.
pub fn send(spec: &SendSpec) -> io::Result<u64> {
    let bind: SocketAddr = if spec.dst.is_ipv4() {
        "0.0.0.0:0".parse().map_err(io::Error::other)?
    } else {
        "[::]:0".parse().map_err(io::Error::other)?
    };
    let sock = UdpSocket::bind(bind)?;
    let mut buf = vec![0u8; spec.payload.max(16)];
    let start = Instant::now();
    let mut sent = 0;
    for seq in 0..spec.count {
        let due = start + Duration::from_secs_f64(seq as f64 / spec.pps);
        let now = Instant::now();
        // Sleeping only when well ahead keeps pacing smooth on the average without a
        // syscall per datagram at high rates.
        if due > now + Duration::from_millis(1) {
            thread::sleep(due - now);
        }
        let t = (Instant::now() - spec.epoch).as_nanos() as u64;
        buf[..8].copy_from_slice(&seq.to_be_bytes());
        buf[8..16].copy_from_slice(&t.to_be_bytes());
        match sock.send_to(&buf, spec.dst) {
            Ok(_) => sent += 1,
            // A full local queue is the sender's problem, not the link's: retry once later.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// One datagram that arrived.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub seq: u64,
    pub sent: Duration,
    pub received: Duration,
    pub bytes: usize,
}

/// Receives on `bind` until nothing has arrived for `idle` (after the first datagram) or
/// `max` has passed. Uses a large forced receive buffer so the socket never drops.
pub fn receive(
    bind: SocketAddr,
    epoch: Instant,
    idle: Duration,
    max: Duration,
) -> io::Result<Vec<Arrival>> {
    let sock = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_recv_buffer_size(64 << 20)?;
    // Root may exceed rmem_max; the plain setting above is the fallback.
    let _ = force_rcvbuf(&sock, 64 << 20);
    sock.bind(&bind.into())?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let start = Instant::now();
    let mut last = None::<Instant>;
    let mut out = Vec::new();
    let mut buf = [MaybeUninit::<u8>::uninit(); 65_536];
    loop {
        let now = Instant::now();
        if now - start > max || last.is_some_and(|l| now - l > idle) {
            return Ok(out);
        }
        match sock.recv(&mut buf) {
            Ok(n) if n >= 16 => {
                let received = Instant::now() - epoch;
                last = Some(Instant::now());
                // SAFETY: recv initialised the first `n` bytes.
                let b: Vec<u8> = buf[..16]
                    .iter()
                    .map(|x| unsafe { x.assume_init() })
                    .collect();
                let mut s = [0u8; 8];
                s.copy_from_slice(&b[..8]);
                let mut t = [0u8; 8];
                t.copy_from_slice(&b[8..16]);
                out.push(Arrival {
                    seq: u64::from_be_bytes(s),
                    sent: Duration::from_nanos(u64::from_be_bytes(t)),
                    received,
                    bytes: n,
                });
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

fn force_rcvbuf(sock: &Socket, bytes: i32) -> nix::Result<()> {
    use std::os::fd::AsFd;
    nix::sys::socket::setsockopt(
        &sock.as_fd(),
        nix::sys::socket::sockopt::RcvBufForce,
        &(bytes as usize),
    )
}

/// Rate in bit/s of IP bytes between the first and last arrival (the first datagram only
/// marks the start: its own serialisation happened before).
pub fn ip_rate_bps(arrivals: &[Arrival]) -> f64 {
    let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) else {
        return 0.0;
    };
    let span = (last.received - first.received).as_secs_f64();
    let bytes: usize = arrivals[1..]
        .iter()
        .map(|a| a.bytes + IPV4_UDP_OVERHEAD)
        .sum();
    if span > 0.0 {
        bytes as f64 * 8.0 / span
    } else {
        0.0
    }
}
