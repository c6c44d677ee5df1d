//! Cross traffic on the emulated link that does not pass through pepd: an unresponsive UDP
//! stream from the server to the client at a set rate (another terminal's video on a shared
//! beam), and a plain TCP download on a port the interception leaves alone (a competing
//! sender that reacts to loss). Both run beside a scenario's workload.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::topology::Names;
use crate::udp::IPV4_UDP_OVERHEAD;
use crate::xfer::{client, server::Server, Amount, Outcome, Workload};
use crate::{addr, in_netns, Error};

/// TCP port of the cross-traffic server; the testbed's interception rules leave it alone
/// (away from the ports tests serve on, which rely on pepd carrying them).
pub const CROSS_TCP_PORT: u16 = 5801;
/// UDP port the cross stream is sent to on the client.
pub const CROSS_UDP_PORT: u16 = 5802;
/// Bytes on the wire per cross datagram (IPv4 + UDP + payload).
const UDP_WIRE_BYTES: usize = 1250;

#[derive(Clone, Debug, Default)]
pub struct CrossSpec {
    /// Rate of the UDP stream in bit/s of IP bytes.
    pub udp_bps: Option<f64>,
    /// A plain CUBIC download from the server lasting this long.
    pub tcp_seconds: Option<f64>,
}

impl CrossSpec {
    pub fn is_empty(&self) -> bool {
        self.udp_bps.is_none() && self.tcp_seconds.is_none()
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CrossOutcome {
    /// UDP bytes offered and delivered, as rates over the stream's life (IP bytes).
    pub udp_offered_bps: Option<f64>,
    pub udp_delivered_bps: Option<f64>,
    /// The plain TCP download, as the traffic tool measured it.
    pub tcp: Option<Outcome>,
}

type Counted = Result<(u64, Duration), Error>;

pub struct CrossTraffic {
    stop: Arc<AtomicBool>,
    udp: Option<(JoinHandle<Counted>, JoinHandle<Counted>)>,
    tcp: Option<(Server, JoinHandle<Result<Outcome, Error>>)>,
}

impl CrossTraffic {
    /// Starts what `spec` asks for between the topology's client and server.
    pub fn start(names: &Names, spec: &CrossSpec, ipv6: bool) -> Result<CrossTraffic, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = CrossTraffic {
            stop: stop.clone(),
            udp: None,
            tcp: None,
        };
        if let Some(rate) = spec.udp_bps {
            let sink_addr = SocketAddr::new(client_addr(ipv6), CROSS_UDP_PORT);
            let sink = in_netns(&names.client, move || UdpSocket::bind(sink_addr))??;
            sink.set_read_timeout(Some(Duration::from_millis(50)))?;
            let s = stop.clone();
            let rx = thread::spawn(move || drain(&sink, &s));
            let (s, ns) = (stop.clone(), names.server.clone());
            let tx = thread::spawn(move || {
                in_netns(&ns, move || blast(sink_addr, rate, &s)).and_then(|r| r)
            });
            c.udp = Some((tx, rx));
        }
        if let Some(secs) = spec.tcp_seconds {
            let target = SocketAddr::new(addr::server(ipv6), CROSS_TCP_PORT);
            let server = in_netns(&names.server, move || Server::bind(target, Some("cubic")))??;
            let opts = client::ClientOpts {
                server: target,
                cc: Some("cubic".into()),
                seed: 77,
                max_duration: Duration::from_secs_f64(secs + 30.0),
            };
            let ns = names.client.clone();
            let w = Workload::Download(Amount::Seconds(secs));
            let h = thread::spawn(move || in_netns(&ns, move || client::run(&w, &opts)));
            c.tcp = Some((server, h));
        }
        Ok(c)
    }

    /// Stops the UDP stream, waits for the TCP download and reports both.
    pub fn finish(mut self) -> Result<CrossOutcome, Error> {
        let mut out = CrossOutcome::default();
        if let Some((s, h)) = self.tcp.take() {
            out.tcp = Some(h.join().map_err(|_| panicked())??);
            drop(s);
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some((tx, rx)) = self.udp.take() {
            let (sent, span) = tx.join().map_err(|_| panicked())??;
            let (got, got_span) = rx.join().map_err(|_| panicked())??;
            let rate = |bytes: u64, d: Duration| bytes as f64 * 8.0 / d.as_secs_f64().max(1e-9);
            out.udp_offered_bps = Some(rate(sent, span));
            out.udp_delivered_bps = Some(rate(got, got_span));
        }
        Ok(out)
    }
}

impl Drop for CrossTraffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn panicked() -> Error {
    Error::Io(io::Error::other("cross-traffic thread panicked"))
}

fn client_addr(ipv6: bool) -> IpAddr {
    if ipv6 {
        addr::CLIENT_V6.into()
    } else {
        addr::CLIENT_V4.into()
    }
}

/// Sends datagrams to `dst` at `rate_bps` of IP bytes until `stop`; returns the IP bytes
/// sent and for how long.
fn blast(dst: SocketAddr, rate_bps: f64, stop: &AtomicBool) -> Counted {
    let bind: SocketAddr = if dst.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(bind)?;
    let buf = vec![0x5au8; UDP_WIRE_BYTES - IPV4_UDP_OVERHEAD];
    let gap = Duration::from_secs_f64(UDP_WIRE_BYTES as f64 * 8.0 / rate_bps.max(1.0));
    let start = Instant::now();
    let mut due = start;
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Sleep only when well ahead: smooth on average without a syscall per datagram.
        if due > now + Duration::from_millis(1) {
            thread::sleep(due - now);
            continue;
        }
        match sock.send_to(&buf, dst) {
            Ok(_) => sent += UDP_WIRE_BYTES as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {}
            Err(e) => return Err(e.into()),
        }
        due += gap;
    }
    Ok((sent, start.elapsed()))
}

/// Reads and discards until `stop`; returns the IP bytes received between the first and
/// the last datagram and that span.
fn drain(sock: &UdpSocket, stop: &AtomicBool) -> Counted {
    let mut buf = [0u8; 2048];
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut got = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let now = Instant::now();
                // The first datagram marks the start; its own bytes crossed before it.
                if first.is_some() {
                    got += (n + IPV4_UDP_OVERHEAD) as u64;
                }
                first.get_or_insert(now);
                last = now;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok((got, first.map_or(Duration::ZERO, |f| last - f)))
}
