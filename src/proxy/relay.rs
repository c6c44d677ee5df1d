//! One proxied TCP connection ↔ one flow: bytes both ways with backpressure, half-close
//! in each direction on its own, resets both ways, the idle timeout, and the reset of a
//! flow whose TCP side stopped taking bytes while others need what it holds.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pep_compress::{BlockKind, Choice, Level, Signals, RAW_HEADER};
use pep_transport::{ReadOutcome, ResetReason};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use crate::proxy::compression::{with_block_buffers, FlowBlocks};
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
    /// The flow's streams are compression blocks (docs/PROTOCOL.md §9).
    pub blocks: Option<FlowBlocks>,
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
            blocks,
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
            blocks,
            refused: false,
            blocks_held: 0,
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
    blocks: Option<FlowBlocks>,
    /// The flow was reset here for a block the peer sent that was refused.
    refused: bool,
    /// What `blocks` holds (a block for the flow, a payload from it), as last counted in
    /// the memory account.
    blocks_held: usize,
}

impl Drop for Pump<'_> {
    fn drop(&mut self) {
        let held: usize = self.pending.iter().map(Bytes::len).sum();
        self.peer.memory.release((held + self.blocks_held) as u64);
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
            let sent_all = self
                .blocks
                .as_ref()
                .is_none_or(|b| b.backlog.is_empty() && !b.fin_after_backlog);
            if !self.reading_tcp && self.fin_to_tcp && self.pending.is_empty() && sent_all {
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
                Err(FlowGone::Reset(r)) if self.refused => return Err(RelayEnd::ResetLocally(r)),
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
            }
        }
    }

    /// Feeds a piece of the flow to the block decoder; the bytes it decodes join `pending`.
    /// Returns how many, or the reason the flow was reset for a refused block.
    fn decode(&mut self, piece: Bytes) -> Result<usize, ResetReason> {
        let Some(blocks) = self.blocks.as_mut() else {
            return Ok(0);
        };
        let c = &self.peer.counters.compression;
        PeerCounters::add(&c.blocks_received, piece.len() as u64);
        let mut decoded = 0;
        let pending = &mut self.pending;
        let fed = blocks.decoder.feed(piece, &mut |b: Bytes| {
            decoded += b.len();
            pending.push_back(b);
        });
        self.peer.memory.hold(decoded as u64);
        PeerCounters::add(&c.plain_received, decoded as u64);
        let (_, spent) = blocks.decoder.take_decompressed();
        PeerCounters::add(&c.decompress_ns, spent.as_nanos() as u64);
        self.count_blocks_held();
        match fed {
            Ok(()) => Ok(decoded),
            Err(e) => {
                debug!(flow = self.flow.id, error = %e, "block refused");
                Err(self.refuse_block(e.reason()))
            }
        }
    }

    /// Resets the flow for a block the peer sent that was refused, counted by `reason`.
    fn refuse_block(&mut self, reason: &str) -> ResetReason {
        self.peer.counters.compression.refuse(reason);
        self.peer.reset(self.flow, ResetReason::Protocol);
        self.refused = true;
        ResetReason::Protocol
    }

    /// Brings the memory account up to what `blocks` holds now.
    fn count_blocks_held(&mut self) {
        let now = self
            .blocks
            .as_ref()
            .map_or(0, |b| b.decoder.held() + b.backlog.capacity());
        if now > self.blocks_held {
            self.peer.memory.hold((now - self.blocks_held) as u64);
        } else {
            self.peer.memory.release((self.blocks_held - now) as u64);
        }
        self.blocks_held = now;
    }

    /// Takes up to [`CHUNK`] bytes (in at most [`WRITE_PIECES`] pieces) from the flow into
    /// `pending`. `None` once some were taken (what ended the taking, other than nothing
    /// more for now, waits in `deferred`); else what the flow said.
    fn take_from_flow(&mut self) -> Option<Result<ReadOutcome, FlowGone>> {
        let mut taken = 0;
        while taken < CHUNK && self.pending.len() < WRITE_PIECES {
            // Blocks: no more than the block in progress needs, so that a flow never has
            // more than one block's content decoded and not yet written.
            let max = self
                .blocks
                .as_ref()
                .map_or(CHUNK - taken, |b| b.decoder.want().min(CHUNK - taken));
            match self.peer.read(self.flow, max) {
                Ok(ReadOutcome::Data(b)) if self.blocks.is_some() => {
                    if self.pending.is_empty() {
                        self.pending.reserve(WRITE_PIECES);
                    }
                    match self.decode(b) {
                        Ok(n) => taken += n,
                        Err(reason) => return Some(Err(FlowGone::Reset(reason))),
                    }
                }
                Ok(ReadOutcome::Finished)
                    if self
                        .blocks
                        .as_ref()
                        .is_some_and(|b| b.decoder.finish().is_err()) =>
                {
                    return Some(Err(FlowGone::Reset(self.refuse_block("truncated"))));
                }
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
        if self.blocks.is_some() {
            return self.tcp_to_blocks();
        }
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

    /// [`tcp_to_flow`](Self::tcp_to_flow) for a flow whose streams are blocks: each read
    /// becomes one block, raw or compressed as the policy says; what of a block the flow
    /// has no room for waits in the backlog, and nothing more is read until it went.
    fn tcp_to_blocks(&mut self) -> Result<usize, RelayEnd> {
        loop {
            if !self.write_backlog()? {
                return Ok(0);
            }
            if !self.reading_tcp {
                return Ok(0);
            }
            let room = match self.peer.write_room(self.flow) {
                Ok(r) => r,
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
            };
            if room == 0 {
                return Ok(0);
            }
            let choice = self.choose_block()?;
            let read = match choice {
                Choice::Raw => self.raw_block(room),
                Choice::Zstd(level) => self.compressed_block(level),
            };
            self.count_blocks_held();
            match read {
                (Ok(0), _) => {
                    self.reading_tcp = false;
                    if let Some(b) = self.blocks.as_mut() {
                        b.fin_after_backlog = true;
                    }
                }
                (Ok(n), written) => {
                    self.last_activity = Instant::now();
                    PeerCounters::add(&self.peer.counters.bytes_to_peer, n as u64);
                    match written {
                        Some(Ok(())) | None => {}
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
    }

    /// Writes what the backlog holds; whether it is empty now (and the flow finished, if
    /// TCP's FIN waited for it).
    fn write_backlog(&mut self) -> Result<bool, RelayEnd> {
        let Some(blocks) = self.blocks.as_mut() else {
            return Ok(true);
        };
        if !blocks.backlog.is_empty() {
            match self.peer.write(self.flow, &blocks.backlog) {
                Ok(n) => {
                    blocks.backlog.drain(..n);
                }
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
            }
            if !blocks.backlog.is_empty() {
                // A short write: the flow says when it has room again.
                return Ok(false);
            }
            blocks.backlog = Vec::new();
            self.count_blocks_held();
        }
        let Some(blocks) = self.blocks.as_mut() else {
            return Ok(true);
        };
        if blocks.fin_after_backlog {
            blocks.fin_after_backlog = false;
            match self.peer.finish(self.flow) {
                Ok(()) => {}
                Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
                Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
            }
        }
        Ok(true)
    }

    /// What the next block is: raw where this gateway does not compress the flow, where the
    /// data did not shrink, or where the memory budget has no room for a compressed block
    /// that the flow cannot take at once; else the policy's level.
    fn choose_block(&mut self) -> Result<Choice, RelayEnd> {
        let Some(blocks) = self.blocks.as_ref() else {
            return Ok(Choice::Raw);
        };
        let Some(policy) = blocks.policy.as_ref() else {
            return Ok(Choice::Raw);
        };
        if policy.skipping() {
            return Ok(Choice::Raw);
        }
        let link = match self
            .peer
            .send_conditions(self.flow, blocks.max_block as u64)
        {
            Ok(l) => l,
            Err(FlowGone::Reset(r)) => return Err(RelayEnd::ResetByPeer(r)),
            Err(FlowGone::Closed) => return Err(self.local_reset(ResetReason::Closed)),
        };
        let choice = policy.choose(Signals {
            link_bound: link.link_bound,
            source_drained: blocks.source_drained,
            link_bps: link.link_bps,
        });
        if choice != Choice::Raw && !link.memory_room {
            PeerCounters::add(&self.peer.counters.compression.over_budget, 1);
            return Ok(Choice::Raw);
        }
        Ok(choice)
    }

    /// Reads what fits the flow's `room` into one raw block and writes it.
    fn raw_block(&mut self, room: usize) -> (io::Result<usize>, Option<Result<(), FlowGone>>) {
        let Some(blocks) = self.blocks.as_mut() else {
            return (Ok(0), None);
        };
        // A room smaller than a header still takes a byte: the rest waits in the backlog.
        let want = room
            .saturating_sub(RAW_HEADER)
            .clamp(1, scratch::SIZE - RAW_HEADER)
            .min(blocks.max_block);
        let peer = self.peer;
        let flow = self.flow;
        let tcp = self.tcp;
        scratch::with(|buf| {
            let r = tcp.try_read(&mut buf[RAW_HEADER..RAW_HEADER + want]);
            let n = match r {
                Ok(n) if n > 0 => n,
                _ => return (r, None),
            };
            blocks.source_drained = n < want;
            buf[..RAW_HEADER].copy_from_slice(&pep_compress::block::raw_header(n));
            let block = &buf[..RAW_HEADER + n];
            let written = peer.write(flow, block).map(|w| {
                blocks.backlog.extend_from_slice(&block[w..]);
            });
            if let Some(p) = blocks.policy.as_mut() {
                p.sent_raw(n);
            }
            let c = &peer.counters.compression;
            PeerCounters::add(&c.plain_sent, n as u64);
            PeerCounters::add(&c.blocks_sent, block.len() as u64);
            PeerCounters::add(&c.sent_raw, 1);
            (Ok(n), Some(written))
        })
    }

    /// Reads up to a block's worth, compresses it at `level` (raw if that is smaller) and
    /// writes it; what the flow has no room for waits in the backlog.
    fn compressed_block(
        &mut self,
        level: Level,
    ) -> (io::Result<usize>, Option<Result<(), FlowGone>>) {
        let Some(blocks) = self.blocks.as_mut() else {
            return (Ok(0), None);
        };
        let peer = self.peer;
        let flow = self.flow;
        let tcp = self.tcp;
        with_block_buffers(blocks.max_block, |input, out| {
            let mut filled = 0;
            let mut ended = None;
            while filled < input.len() {
                match tcp.try_read(&mut input[filled..]) {
                    Ok(0) => {
                        ended = Some(Ok(0));
                        break;
                    }
                    Ok(n) => filled += n,
                    Err(e) => {
                        ended = Some(Err(e));
                        break;
                    }
                }
            }
            if filled == 0 {
                return (ended.unwrap_or(Ok(0)), None);
            }
            if matches!(&ended, Some(Err(e)) if e.kind() != io::ErrorKind::WouldBlock) {
                return (ended.unwrap_or(Ok(0)), None);
            }
            blocks.source_drained = filled < input.len();
            let started = std::time::Instant::now();
            let kind = pep_compress::encode_block(&input[..filled], Some(level), out);
            let spent = started.elapsed().as_nanos() as u64;
            let c = &peer.counters.compression;
            PeerCounters::add(&c.compress_ns, spent);
            PeerCounters::add(&c.plain_sent, filled as u64);
            PeerCounters::add(&c.blocks_sent, out.len() as u64);
            PeerCounters::add(
                match (kind, level) {
                    (BlockKind::Raw, _) => &c.sent_raw,
                    (BlockKind::Zstd, Level::Fast) => &c.sent_fast,
                    (BlockKind::Zstd, Level::Hard) => &c.sent_hard,
                },
                1,
            );
            if let Some(p) = blocks.policy.as_mut() {
                p.compressed(level, filled, out.len(), spent);
            }
            let written = peer.write(flow, out).map(|w| {
                blocks.backlog.extend_from_slice(&out[w..]);
            });
            // TCP's FIN right behind the data: taken on the next read.
            (Ok(filled), Some(written))
        })
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
