//! One proxied TCP connection ↔ one flow: bytes both ways with backpressure, half-close
//! in each direction on its own, resets both ways, the idle timeout, and the reset of a
//! flow whose TCP side stopped taking bytes while others need what it holds.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pep_transport::{ReadOutcome, ResetReason};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use crate::proxy::scratch;
use crate::tunnel::memory::FlowCharge;
use crate::tunnel::peer::{FlowGone, FlowRef, Peer, PeerCounters};

use crate::config::budget::CHUNK;

/// Most pieces of a flow written to TCP in one vectored write: the flow hands its bytes
/// over as they arrived, one datagram's worth each, and a system call for each was the
/// receiving gateway's largest cost.
const WRITE_PIECES: usize = 64;

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
    pub peer: Arc<Peer>,
    pub flow: FlowRef,
    pub tcp: TcpStream,
    pub idle_timeout: Option<Duration>,
    /// `limits.stalled_flow_timeout`: how long the TCP side may take none of the bytes
    /// waiting for it before the flow is reset under contention.
    pub stalled_timeout: Option<Duration>,
    /// The TCP side already sent FIN (and the flow was finished).
    pub tcp_read_done: bool,
    /// The flow's part of the memory budget, returned when the relay ends.
    pub charge: FlowCharge,
}

impl Relay {
    pub async fn run(self) -> RelayEnd {
        let Relay {
            peer,
            flow,
            tcp,
            idle_timeout,
            stalled_timeout,
            tcp_read_done,
            charge,
        } = self;
        let _active = ActiveRelay::new(&peer);
        let mut st = Pump {
            peer: &peer,
            flow: &flow,
            tcp: &tcp,
            reading_tcp: !tcp_read_done,
            pending: VecDeque::new(),
            deferred: None,
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
struct ActiveRelay<'a>(&'a Peer);

impl<'a> ActiveRelay<'a> {
    fn new(peer: &'a Peer) -> Self {
        PeerCounters::add(&peer.counters.relays_active, 1);
        ActiveRelay(peer)
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
    peer: &'a Peer,
    flow: &'a FlowRef,
    tcp: &'a TcpStream,
    /// The TCP side has not sent FIN yet.
    reading_tcp: bool,
    /// Bytes taken from the flow and not yet written to TCP, in the pieces the flow gave.
    pending: VecDeque<Bytes>,
    /// What the flow said after the bytes in `pending` (its end, or that it is gone), acted
    /// on once they are written: the flow says it only once, or no longer knows the flow.
    deferred: Option<Result<ReadOutcome, FlowGone>>,
    /// The flow's FIN was passed on to TCP (shutdown of our write side).
    fin_to_tcp: bool,
    last_activity: Instant,
    /// Since when `pending` waits for a TCP side that takes none of it.
    stalled_since: Option<Instant>,
}

impl Drop for Pump<'_> {
    fn drop(&mut self) {
        let held: usize = self.pending.iter().map(Bytes::len).sum();
        self.peer.memory.release(held as u64);
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
                match self.peer.reset_if_stalled(self.flow) {
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
            if !self.reading_tcp && self.fin_to_tcp && self.pending.is_empty() {
                return RelayEnd::Closed;
            }
            let idle_deadline = idle_timeout.map(|t| self.last_activity + t);
            // Past its end, a stall waits for the peer to say contention came.
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
                r = self.tcp.writable(), if !self.pending.is_empty() => {
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
            if !self.pending.is_empty() {
                match self.write_pending() {
                    Ok(()) => {
                        self.stalled_since = None;
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
            let outcome = match self.deferred.take() {
                Some(o) => o,
                None => match self.take_from_flow() {
                    Some(o) => o,
                    None => continue,
                },
            };
            match outcome {
                Ok(ReadOutcome::Data(b)) => {
                    self.peer.memory.hold(b.len() as u64);
                    self.pending.push_back(b);
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

    /// Takes up to [`CHUNK`] bytes (in at most [`WRITE_PIECES`] pieces) from the flow into
    /// `pending`. `None` once some were taken (what ended the taking, other than nothing
    /// more for now, waits in `deferred`); else what the flow said.
    fn take_from_flow(&mut self) -> Option<Result<ReadOutcome, FlowGone>> {
        let mut taken = 0;
        while taken < CHUNK && self.pending.len() < WRITE_PIECES {
            match self.peer.read(self.flow, CHUNK - taken) {
                Ok(ReadOutcome::Data(b)) => {
                    if self.pending.is_empty() {
                        self.pending.reserve(WRITE_PIECES);
                    }
                    taken += b.len();
                    self.peer.memory.hold(b.len() as u64);
                    self.pending.push_back(b);
                }
                Ok(ReadOutcome::Blocked) if taken > 0 => break,
                other if taken > 0 => {
                    self.deferred = Some(other);
                    break;
                }
                other => return Some(other),
            }
        }
        None
    }

    /// One vectored write of what `pending` holds; what was written leaves it.
    fn write_pending(&mut self) -> io::Result<()> {
        let mut slices = [IoSlice::new(&[]); WRITE_PIECES];
        for (slice, piece) in slices.iter_mut().zip(&self.pending) {
            *slice = IoSlice::new(piece);
        }
        let count = self.pending.len().min(WRITE_PIECES);
        let n = self.tcp.try_write_vectored(&slices[..count])?;
        self.last_activity = Instant::now();
        PeerCounters::add(&self.peer.counters.bytes_from_peer, n as u64);
        self.peer.memory.release(n as u64);
        let mut left = n;
        while let Some(front) = self.pending.front_mut() {
            if front.len() > left {
                let _ = front.split_to(left);
                break;
            }
            left -= front.len();
            self.pending.pop_front();
        }
        if self.pending.is_empty() {
            // An idle relay holds no queue.
            self.pending = VecDeque::new();
        }
        Ok(())
    }

    /// Moves bytes from the TCP connection into the flow while it has room; returns the
    /// room left (0: wait for the flow to drain).
    fn tcp_to_flow(&mut self) -> Result<usize, RelayEnd> {
        while self.reading_tcp {
            let room = match self.peer.write_room(self.flow) {
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
                    Ok(n) if n > 0 => Some(self.peer.write(self.flow, &buf[..n])),
                    _ => None,
                };
                (r, written)
            });
            match read {
                (Ok(0), _) => {
                    self.reading_tcp = false;
                    match self.peer.finish(self.flow) {
                        Ok(()) => {}
                        Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                        Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
                    }
                }
                (Ok(n), written) => {
                    self.last_activity = Instant::now();
                    PeerCounters::add(&self.peer.counters.bytes_to_peer, n as u64);
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
        self.peer.reset(self.flow, reason);
        RelayEnd::ResetLocally(reason)
    }
}

/// Logs how a relay of `flow` ended.
pub fn log_end(
    flow: pep_transport::FlowId,
    client: std::net::SocketAddr,
    server: std::net::SocketAddr,
    end: RelayEnd,
) {
    debug!(flow, %client, %server, ?end, "flow ended");
}
