//! One proxied TCP connection ↔ one flow: bytes both ways with backpressure, half-close
//! in each direction on its own, resets both ways, the idle timeout, and the reset of a
//! flow whose TCP side stopped taking bytes while others need what it holds.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pep_transport::{ReadOutcome, ResetReason};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use crate::link::{FlowGone, FlowRef, LinkCounters, PeerLink};
use crate::memory::FlowCharge;
use crate::scratch;

/// Largest piece moved per read, either way.
pub const CHUNK: usize = 64 * 1024;

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both directions finished with FIN.
    Closed,
    /// The peer side reset the flow; the TCP connection was reset too.
    ResetByPeer(ResetReason),
    /// The local TCP side failed or reset; the flow was reset towards the peer.
    ResetLocally(ResetReason),
}

pub struct Relay {
    pub link: Arc<PeerLink>,
    pub flow: FlowRef,
    pub tcp: TcpStream,
    pub idle_timeout: Option<Duration>,
    /// `limits.stalled_flow_timeout`: how long the TCP side may take none of the bytes
    /// waiting for it before the flow is reset under contention.
    pub stalled_timeout: Option<Duration>,
    /// The TCP side already sent FIN (and the flow was finished).
    pub tcp_read_done: bool,
    /// The flow's share of the memory budget, returned when the relay ends.
    pub charge: FlowCharge,
}

impl Relay {
    pub async fn run(self) -> RelayEnd {
        let Relay {
            link,
            flow,
            tcp,
            idle_timeout,
            stalled_timeout,
            tcp_read_done,
            charge,
        } = self;
        let _active = ActiveRelay::new(&link);
        let mut st = Pump {
            link: &link,
            flow: &flow,
            tcp: &tcp,
            reading_tcp: !tcp_read_done,
            pending: None,
            fin_to_tcp: false,
            last_activity: Instant::now(),
            stalled_since: None,
        };
        let end = st.run(idle_timeout, stalled_timeout).await;
        drop(st);
        drop(charge);
        match end {
            RelayEnd::Closed => {}
            RelayEnd::ResetByPeer(_) | RelayEnd::ResetLocally(_) => abort_tcp(tcp),
        }
        end
    }
}

/// Counts a relay as active for as long as it lives (what a drain waits for).
struct ActiveRelay<'a>(&'a PeerLink);

impl<'a> ActiveRelay<'a> {
    fn new(link: &'a PeerLink) -> Self {
        LinkCounters::add(&link.counters.relays_active, 1);
        ActiveRelay(link)
    }
}

impl Drop for ActiveRelay<'_> {
    fn drop(&mut self) {
        self.0
            .counters
            .relays_active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Closes a TCP connection with RST instead of FIN.
pub fn abort_tcp(tcp: TcpStream) {
    let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
    drop(tcp);
}

struct Pump<'a> {
    link: &'a PeerLink,
    flow: &'a FlowRef,
    tcp: &'a TcpStream,
    /// The TCP side has not sent FIN yet.
    reading_tcp: bool,
    /// Bytes taken from the flow and not yet written to TCP.
    pending: Option<Bytes>,
    /// The flow's FIN was passed on to TCP (shutdown of our write side).
    fin_to_tcp: bool,
    last_activity: Instant,
    /// Since when `pending` waits for a TCP side that takes none of it.
    stalled_since: Option<Instant>,
}

impl Drop for Pump<'_> {
    fn drop(&mut self) {
        if let Some(data) = &self.pending {
            self.link.memory.release(data.len() as u64);
        }
    }
}

impl Pump<'_> {
    async fn run(
        &mut self,
        idle_timeout: Option<Duration>,
        stalled_timeout: Option<Duration>,
    ) -> RelayEnd {
        loop {
            if let Err(end) = self.flow_to_tcp() {
                return end;
            }
            let stall_end = self.stalled_since.zip(stalled_timeout).map(|(s, t)| s + t);
            if stall_end.is_some_and(|d| Instant::now() >= d) {
                match self.link.reset_if_stalled(self.flow) {
                    Ok(false) => {}
                    Ok(true) => {
                        debug!(flow = self.flow.id, "TCP side stalled under contention");
                        return RelayEnd::ResetLocally(ResetReason::ResourceLimit);
                    }
                    Err(FlowGone::Reset(r)) => return RelayEnd::ResetByPeer(r),
                    Err(FlowGone::Closed) => return self.local_reset(ResetReason::Closed),
                }
            }
            let room = match self.tcp_to_flow() {
                Ok(room) => room,
                Err(end) => return end,
            };
            if !self.reading_tcp && self.fin_to_tcp && self.pending.is_none() {
                return RelayEnd::Closed;
            }
            let idle_deadline = idle_timeout.map(|t| self.last_activity + t);
            // Past its end, a stall waits for the link to say contention came.
            let stall_end = stall_end.filter(|&d| Instant::now() < d);
            let timer = idle_deadline.into_iter().chain(stall_end).min();
            let timer_due = async {
                match timer {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.tcp.readable(), if self.reading_tcp && room > 0 => {
                    if r.is_err() {
                        return self.local_reset(ResetReason::Aborted);
                    }
                }
                r = self.tcp.writable(), if self.pending.is_some() => {
                    if r.is_err() {
                        return self.local_reset(ResetReason::Aborted);
                    }
                }
                _ = self.flow.signal.notify.notified() => {}
                _ = timer_due => {
                    if idle_deadline.is_some_and(|d| Instant::now() >= d) {
                        debug!(flow = self.flow.id, "idle timeout");
                        return self.local_reset(ResetReason::Timeout);
                    }
                }
            }
        }
    }

    /// Moves what the flow has to the TCP connection until either side blocks.
    fn flow_to_tcp(&mut self) -> Result<(), RelayEnd> {
        loop {
            if let Some(data) = self.pending.as_mut() {
                match self.tcp.try_write(data) {
                    Ok(n) => {
                        self.last_activity = Instant::now();
                        self.stalled_since = None;
                        LinkCounters::add(&self.link.counters.bytes_from_peer, n as u64);
                        self.link.memory.release(n as u64);
                        let _ = data.split_to(n);
                        if data.is_empty() {
                            self.pending = None;
                        }
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.stalled_since.get_or_insert_with(Instant::now);
                        return Ok(());
                    }
                    Err(_) => return Err(self.local_reset(ResetReason::Aborted)),
                }
            }
            if self.fin_to_tcp {
                return Ok(());
            }
            match self.link.read(self.flow, CHUNK) {
                Ok(ReadOutcome::Data(b)) => {
                    self.link.memory.hold(b.len() as u64);
                    self.pending = Some(b);
                }
                Ok(ReadOutcome::Blocked) => return Ok(()),
                Ok(ReadOutcome::Finished) | Err(FlowGone::Closed) => {
                    self.fin_to_tcp = true;
                    if socket2::SockRef::from(self.tcp)
                        .shutdown(std::net::Shutdown::Write)
                        .is_err()
                    {
                        return Err(self.local_reset(ResetReason::Aborted));
                    }
                    return Ok(());
                }
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
            }
        }
    }

    /// Moves bytes from the TCP connection into the flow while it has room; returns the
    /// room left (0: wait for the flow to drain).
    fn tcp_to_flow(&mut self) -> Result<usize, RelayEnd> {
        while self.reading_tcp {
            let room = match self.link.write_room(self.flow) {
                Ok(r) => r,
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
            };
            if room == 0 {
                return Ok(0);
            }
            let want = room.min(scratch::SIZE);
            // Read and handed to the flow in one go, so the buffer is this thread's, not
            // the relay's.
            let read = scratch::with(|buf| {
                let r = self.tcp.try_read(&mut buf[..want]);
                let written = match r {
                    Ok(n) if n > 0 => Some(self.link.write(self.flow, &buf[..n])),
                    _ => None,
                };
                (r, written)
            });
            match read {
                (Ok(0), _) => {
                    self.reading_tcp = false;
                    match self.link.finish(self.flow) {
                        Ok(()) => {}
                        Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                        Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
                    }
                }
                (Ok(n), written) => {
                    self.last_activity = Instant::now();
                    LinkCounters::add(&self.link.counters.bytes_to_peer, n as u64);
                    match written {
                        // The room was checked under the same budget a moment ago and only
                        // this relay writes to the flow, so all of it fits.
                        Some(Ok(_)) | None => {}
                        Some(Err(FlowGone::Reset(r))) => return Err(RelayEnd::ResetByPeer(r)),
                        Some(Err(FlowGone::Closed)) => {
                            return Err(self.local_reset(ResetReason::Closed))
                        }
                    }
                }
                (Err(e), _) if e.kind() == io::ErrorKind::WouldBlock => return Ok(room),
                (Err(_), _) => return Err(self.local_reset(ResetReason::Aborted)),
            }
        }
        Ok(0)
    }

    fn local_reset(&self, reason: ResetReason) -> RelayEnd {
        self.link.reset(self.flow, reason);
        RelayEnd::ResetLocally(reason)
    }
}
