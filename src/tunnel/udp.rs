//! The tunnel socket, read and written in batches through quinn-udp: one `recvmmsg` fills
//! up to a batch of buffers, each of which may hold several datagrams the kernel coalesced
//! (GRO); one `sendmsg` sends a run of datagrams to one peer, cut into datagrams by the
//! kernel or the device (GSO). Where the kernel offers neither, datagrams go one per buffer
//! and one per send.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tracing::{debug, warn};

use super::outbox::Outbox;
use crate::sys::sockopt;

pub struct TunnelSocket {
    io: UdpSocket,
    state: UdpSocketState,
    /// Whether the kernel's refusal of segmentation offload was logged (once per socket).
    gso_refusal_logged: AtomicBool,
}

impl TunnelSocket {
    pub fn new(io: UdpSocket) -> io::Result<TunnelSocket> {
        let saved = sockopt::save(&io);
        let state = UdpSocketState::new((&io).into())?;
        sockopt::restore(&io, &saved)?;
        Ok(TunnelSocket {
            io,
            state,
            gso_refusal_logged: AtomicBool::new(false),
        })
    }

    /// Waits until datagrams may be waiting. A pending socket error ends the wait as that
    /// error (the socket was destroyed, `ss -K`: it receives nothing more, so without this
    /// its worker would wait on it for ever, unnoticed); a refused send's is taken and
    /// ignored, as when a read returns it.
    pub async fn readable(&self) -> io::Result<()> {
        let ready = self.io.ready(Interest::READABLE | Interest::ERROR).await?;
        if ready.is_error() {
            if let Some(e) = self.io.take_error()? {
                if e.kind() != io::ErrorKind::ConnectionRefused {
                    return Err(e);
                }
            }
            // Taken: the readiness clears, so that the next wait does not end at once.
            let _ = self.io.try_io(Interest::ERROR, || {
                Err::<(), io::Error>(io::ErrorKind::WouldBlock.into())
            });
        }
        Ok(())
    }

    /// Datagrams the kernel may coalesce into one received buffer (1 without GRO).
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// Datagrams one send may carry (1 without GSO, or once the kernel refused it).
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// Reads what is waiting into `bufs` without waiting, up to quinn-udp's batch at once:
    /// how many buffers were filled, `meta[i]` describing `bufs[i]`.
    pub fn try_recv(&self, bufs: &mut [Vec<u8>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        self.io.try_io(Interest::READABLE, || {
            recv_batch(&self.state, (&self.io).into(), bufs, meta)
        })
    }

    /// Sends every datagram of `outbox` in order, a run of them per send where the kernel
    /// segments; waits while the socket's buffer is full.
    pub async fn send(&self, outbox: &Outbox) -> io::Result<()> {
        let mut first = 0;
        while let Some(run) = outbox.run(first, self.max_gso_segments()) {
            first += run.count;
            if run.count == 1 {
                self.send_one(run.to, run.bytes, None).await?;
                continue;
            }
            if let Err(e) = self.send_one(run.to, run.bytes, Some(run.segment)).await {
                // A device that cannot checksum the segments (EIO), or a path MTU below
                // the segment size (EMSGSIZE, or EINVAL on older kernels): the datagrams
                // still go, one by one. On EIO and EINVAL quinn-udp turns offload off for
                // the socket, and the next runs are single datagrams.
                self.log_refusal(&e);
                for d in run.datagrams() {
                    self.send_one(run.to, d, None).await?;
                }
            }
        }
        Ok(())
    }

    /// One send of `contents` (cut into `segment`-byte datagrams if given). Errors that lose
    /// the datagrams as the link would are not errors here.
    async fn send_one(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment: Option<usize>,
    ) -> io::Result<()> {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: segment,
            src_ip: None,
        };
        loop {
            let sent = self.io.try_io(Interest::WRITABLE, || {
                self.state.try_send((&self.io).into(), &transmit)
            });
            match sent {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.io.writable().await?,
                // A full device queue or an ICMP error from an earlier datagram: the
                // datagrams are lost like on the link, and recovery repairs them.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(nix::libc::ENOBUFS)
                            | Some(nix::libc::ECONNREFUSED)
                            | Some(nix::libc::EHOSTUNREACH)
                            | Some(nix::libc::ENETUNREACH)
                    ) =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn log_refusal(&self, e: &io::Error) {
        if self.max_gso_segments() > 1 {
            debug!(error = %e, "segmented send refused; its datagrams sent one by one");
        } else if !self.gso_refusal_logged.swap(true, Ordering::Relaxed) {
            warn!(error = %e, "the kernel refused UDP segmentation offload on the tunnel socket; datagrams are sent one per system call from now on");
        }
    }
}

/// One `recvmmsg` through quinn-udp into `bufs`, up to its batch at once: how many buffers
/// were filled, `meta[i]` describing `bufs[i]`. `WouldBlock` when nothing waits.
pub fn recv_batch(
    state: &UdpSocketState,
    socket: quinn_udp::UdpSockRef<'_>,
    bufs: &mut [Vec<u8>],
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    let n = bufs.len().min(meta.len()).min(BATCH_SIZE);
    let mut bufs = bufs.iter_mut();
    let mut slices: [IoSliceMut<'_>; BATCH_SIZE] = std::array::from_fn(|_| {
        bufs.next()
            .map_or_else(|| IoSliceMut::new(&mut []), |b| IoSliceMut::new(b))
    });
    state.recv(socket, &mut slices[..n], &mut meta[..n])
}

/// The clocks as one pass read them, to place each datagram of the pass at the time the
/// kernel received it: a gateway whose loop was held up (a busy host) then hands its
/// association acknowledgements that arrived over the stall at their own times, not all at
/// the end of it, and the capacity estimate does not read the stall as a slow path.
pub struct ReceiveClock {
    now: Instant,
    /// The same moment as time since the Unix epoch, the kernel's timestamps' clock.
    unix_now: Duration,
}

impl ReceiveClock {
    pub fn now() -> ReceiveClock {
        let now = Instant::now();
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        ReceiveClock { now, unix_now }
    }

    /// The pass's `now`.
    pub fn now_instant(&self) -> Instant {
        self.now
    }

    /// When the kernel received the buffer `meta` describes; the pass's `now` where the
    /// socket gave no timestamp. Never later than the pass's `now` (a timestamp ahead of it
    /// is the wall clock being stepped).
    pub fn arrival(&self, meta: &RecvMeta) -> Instant {
        meta.timestamp
            .and_then(|ts| self.now.checked_sub(self.unix_now.saturating_sub(ts)))
            .unwrap_or(self.now)
    }
}

/// Where each datagram of a received buffer lies: GRO coalesces datagrams of `stride` bytes,
/// the last possibly shorter. An empty datagram is one (empty) datagram.
pub fn datagrams(meta: &RecvMeta) -> impl Iterator<Item = Range<usize>> {
    let len = meta.len;
    let stride = if meta.stride == 0 || meta.stride > len {
        len.max(1)
    } else {
        meta.stride
    };
    (0..len.max(1))
        .step_by(stride)
        .map(move |start| start..(start + stride).min(len))
}

/// How many buffers the driver receives into, and how large each is: the memory of
/// `batch` buffers of `min_size`, in buffers large enough for a whole coalesced batch of
/// `gro_segments` datagrams of up to `max_datagram` bytes (the kernel truncates a batch that
/// does not fit). Without GRO: `batch` of `min_size`.
pub fn receive_buffers(
    batch: usize,
    min_size: usize,
    gro_segments: usize,
    max_datagram: usize,
) -> (usize, usize) {
    let size = min_size.max(gro_segments.saturating_mul(max_datagram));
    let count = (batch * min_size / size).clamp(1, batch);
    (count, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(len: usize, stride: usize) -> RecvMeta {
        let mut m = RecvMeta::default();
        m.len = len;
        m.stride = stride;
        m
    }

    #[test]
    fn a_coalesced_buffer_splits_at_its_stride() {
        let split = |len, stride| {
            datagrams(&meta(len, stride))
                .map(|r| (r.start, r.end))
                .collect::<Vec<_>>()
        };
        assert_eq!(split(3000, 1000), [(0, 1000), (1000, 2000), (2000, 3000)]);
        assert_eq!(split(2500, 1000), [(0, 1000), (1000, 2000), (2000, 2500)]);
        assert_eq!(split(700, 700), [(0, 700)]);
        assert_eq!(split(700, 0), [(0, 700)]);
        assert_eq!(split(0, 0), [(0, 0)]);
    }

    #[test]
    fn receive_buffers_keep_the_memory_of_the_plain_batch() {
        assert_eq!(receive_buffers(64, 65_536, 1, 1456), (64, 65_536));
        // 64 × 1456 = 93,184 bytes a buffer: 45 of them in 4 MiB.
        assert_eq!(receive_buffers(64, 65_536, 64, 1456), (45, 93_184));
        assert_eq!(receive_buffers(64, 65_536, 64, 400), (64, 65_536));
        assert_eq!(receive_buffers(64, 65_536, 64, 8_972), (7, 574_208));
    }

    #[test]
    fn arrival_is_the_kernel_timestamp_on_the_monotonic_clock() {
        let now = Instant::now();
        let clock = ReceiveClock {
            now,
            unix_now: Duration::from_secs(1_800_000_000),
        };
        let stamped = |ts: Option<Duration>| {
            let mut m = meta(100, 100);
            m.timestamp = ts;
            clock.arrival(&m)
        };
        let ms = Duration::from_millis;
        assert_eq!(stamped(Some(clock.unix_now - ms(30))), now - ms(30));
        assert_eq!(stamped(Some(clock.unix_now)), now);
        // The wall clock stepped back since the datagram arrived: not after the pass.
        assert_eq!(stamped(Some(clock.unix_now + ms(5))), now);
        assert_eq!(stamped(None), now);
    }

    /// Two loopback sockets, each behind a [`TunnelSocket`]: everything one sends reaches
    /// the other in order, byte for byte, whether or not the kernel segments and coalesces.
    fn pair(v6: bool) -> (tokio::runtime::Runtime, TunnelSocket, TunnelSocket) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let any = if v6 { "[::1]:0" } else { "127.0.0.1:0" };
        let (a, b) = rt.block_on(async {
            let a = UdpSocket::bind(any).await.expect("bind");
            let b = UdpSocket::bind(any).await.expect("bind");
            // The burst is sent before anything is read: without GRO its datagrams would
            // overflow the default receive buffer.
            sockopt::force_buffers(&b, 4 << 20).expect("buffers (root)");
            (
                TunnelSocket::new(a).expect("state"),
                TunnelSocket::new(b).expect("state"),
            )
        });
        (rt, a, b)
    }

    fn burst_arrives_exactly(v6: bool) {
        let (rt, tx, rx) = pair(v6);
        let to = rx.io.local_addr().expect("addr");
        let from = tx.io.local_addr().expect("addr");
        // More than one segmented send holds (44 of 1456 bytes), a shorter last one, and a
        // datagram released later that must not join.
        let t = Instant::now();
        let mut outbox = Outbox::default();
        let mut sent = Vec::new();
        for i in 0..100u32 {
            let len = if i == 98 { 300 } else { 1456 };
            let d: Vec<u8> = (0..len).map(|k| (i as usize * 7 + k) as u8).collect();
            let released = if i == 99 {
                t + Duration::from_millis(1)
            } else {
                t
            };
            outbox.push(to, &d, released);
            sent.push(d);
        }
        let (count, size) = receive_buffers(64, 65_536, rx.gro_segments(), 1456);
        let mut bufs = vec![vec![0u8; size]; count];
        let mut metas = vec![RecvMeta::default(); BATCH_SIZE];
        let (got, coalesced) = rt.block_on(async {
            tx.send(&outbox).await.expect("send");
            let mut got: Vec<Vec<u8>> = Vec::new();
            let mut coalesced = 0;
            let mut last_stamp = Duration::ZERO;
            let deadline = Instant::now() + Duration::from_secs(5);
            while got.len() < sent.len() && Instant::now() < deadline {
                let _ = tokio::time::timeout(Duration::from_millis(100), rx.readable()).await;
                let n = match rx.try_recv(&mut bufs, &mut metas) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("recv: {e}"),
                };
                let clock = ReceiveClock::now();
                let mut last_arrival = t;
                for (buf, m) in bufs.iter().zip(&metas[..n]) {
                    assert_eq!(m.addr, from);
                    let stamp = m.timestamp.expect("a kernel receive timestamp");
                    assert!(stamp >= last_stamp, "timestamps in order");
                    last_stamp = stamp;
                    let arrival = clock.arrival(m);
                    assert!(arrival >= last_arrival, "arrivals in order, after the send");
                    assert!(arrival <= clock.now_instant());
                    last_arrival = arrival;
                    coalesced += usize::from(m.stride < m.len);
                    got.extend(datagrams(m).map(|r| buf[r].to_vec()));
                }
            }
            (got, coalesced)
        });
        assert_eq!(got.len(), sent.len());
        assert!(
            got == sent,
            "every datagram arrives, in order, byte for byte"
        );
        // Where the kernel offers both, loopback hands a segmented send to a receiver with
        // GRO whole: proof the batches were used. Elsewhere everything went one by one.
        if tx.max_gso_segments() > 1 && rx.gro_segments() > 1 {
            assert!(coalesced > 0, "no buffer held more than one datagram");
        }
    }

    #[test]
    fn a_burst_beyond_one_segmented_send_arrives_exactly_over_ipv4() {
        burst_arrives_exactly(false);
    }

    #[test]
    fn a_burst_beyond_one_segmented_send_arrives_exactly_over_ipv6() {
        burst_arrives_exactly(true);
    }

    /// The path-MTU behaviour stays as the kernel had it; receive timestamps are on.
    #[test]
    fn the_sockets_own_options_stay() {
        use std::os::fd::AsRawFd;

        use nix::sys::socket::{getsockopt, sockopt::ReceiveTimestampns};
        let (_rt, a, _) = pair(false);
        let plain = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let pmtu = |s: &dyn AsRawFd| {
            let mut v: nix::libc::c_int = -1;
            let mut len = std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t;
            // SAFETY: a live socket, and v/len describe a writable c_int.
            let rc = unsafe {
                nix::libc::getsockopt(
                    s.as_raw_fd(),
                    nix::libc::IPPROTO_IP,
                    nix::libc::IP_MTU_DISCOVER,
                    (&mut v as *mut nix::libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v
        };
        assert_eq!(pmtu(&a.io), pmtu(&plain));
        assert!(getsockopt(&a.io, ReceiveTimestampns).expect("timestamps"));
    }
}
