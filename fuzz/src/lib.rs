//! Harness code shared by the fuzz targets and the seed-corpus generator. Kept out of the
//! `fuzz_targets/` files so the generator builds the very same association pair the
//! `receive` target attacks: the pool indices in the committed `receive` seeds only mean
//! something if both agree.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use pep_transport::codec::{put_varint, DecodeError, Reader};
use pep_transport::frame::{self, Frame};
use pep_transport::packet::{decode_header, parse_packet, Header};
use pep_transport::{Association, Config, Event, FlowId, FlowMeta, ReadOutcome, ResetReason, Role};

// ---- blocks ----------------------------------------------------------------------------

/// A compressed flow's stream as a peer may send it: the first byte picks the agreed block
/// size (2^10 to 2^17) and how the receiver takes the bytes (as the relay does, what the
/// decoder wants; or in pieces of a size the second byte gives), the rest is the stream.
/// Checks that no input panics, that nothing decodes to more than one block at a time or to
/// more than `MAX_RATIO` bytes per byte taken, that the decoder holds at most one block, and
/// that it stops at the first refused block. Then the same bytes, as application data, go
/// through the encoder at each level and must come back exactly.
pub fn check_blocks(data: &[u8]) {
    use pep_compress::{encode_block, Decoder, Level, MAX_RATIO};
    let [mode, piece, stream @ ..] = data else {
        return;
    };
    let max_block = 1usize << (10 + (mode & 7));
    let as_the_relay = mode & 8 == 0;
    let piece = usize::from(*piece).max(1);
    let mut d = Decoder::new(max_block);
    let mut taken = 0usize;
    let mut decoded = 0usize;
    let mut at = 0;
    while at < stream.len() {
        let n = if as_the_relay { d.want() } else { piece }.min(stream.len() - at);
        assert!(n > 0, "the decoder wants nothing");
        let input = bytes::Bytes::copy_from_slice(&stream[at..at + n]);
        at += n;
        taken += n;
        let r = d.feed(input, &mut |b: bytes::Bytes| {
            assert!(
                !b.is_empty() && b.len() <= max_block,
                "{} bytes at once",
                b.len()
            );
            decoded += b.len();
        });
        assert!(d.held() <= max_block, "holds {}", d.held());
        assert!(decoded <= taken * MAX_RATIO, "{decoded} from {taken}");
        if let Err(e) = r {
            assert!(!e.reason().is_empty());
            break;
        }
    }
    let _ = d.finish();

    let chunk = max_block.min(stream.len().max(1));
    for level in [None, Some(Level::Fast), Some(Level::Hard)] {
        let mut encoded = Vec::new();
        for c in stream.chunks(chunk) {
            encode_block(c, level, &mut encoded);
        }
        let mut d = Decoder::new(max_block);
        let mut back = Vec::new();
        d.feed(bytes::Bytes::from(encoded), &mut |b: bytes::Bytes| {
            back.extend_from_slice(&b)
        })
        .expect("our own blocks decode");
        d.finish().expect("our own blocks end on a boundary");
        assert_eq!(back, stream, "round trip at {level:?}");
    }
}

// ---- decoder ---------------------------------------------------------------------------

/// Feeds `data` to every decoder a received datagram can reach and checks that whatever
/// decodes re-encodes to something that decodes to the same value: the encoders and the
/// decoder must agree on the format, or a peer would misread what we send.
pub fn check_decoder(data: &[u8]) {
    let Ok((header, frames)) = parse_packet(data) else {
        // Frame-by-frame, as a debugging tool or a future parser might walk a payload:
        // malformed input must end in an error, never a panic or an endless loop.
        let mut r = Reader::new(data);
        if decode_header(&mut r).is_ok() {
            let mut n = 0;
            while !r.is_empty() && Frame::decode(&mut r).is_ok() {
                n += 1;
                assert!(n <= data.len(), "a frame decoded from zero bytes");
            }
        }
        // Any byte string is also a possible implicit-DATA body.
        for offset_len in 1..=4 {
            let _ = Frame::decode_implicit_data(&mut Reader::new(data), false, offset_len);
        }
        return;
    };
    let mut out = Vec::new();
    match &header {
        Header::Hello(h) => {
            h.encode(&mut out);
            assert_eq!(
                parse_packet(&out).expect("re-encoded HELLO decodes").0,
                header
            );
            return;
        }
        Header::Short(s) => {
            let mut plain = *s;
            // Re-encoded with typed frames only, so the payload check below covers the
            // implicit-DATA form too (its frame re-encodes as a typed DATA frame).
            plain.implicit_data = None;
            plain.encode(&mut out);
            let mut r = Reader::new(&out);
            assert_eq!(decode_header(&mut r), Ok(Header::Short(plain)));
        }
        // Handshake messages: their bodies belong to the security layer's own parser.
        _ => return,
    }
    let header_len = out.len();
    for (i, f) in frames.iter().enumerate() {
        if !reencode(f, i + 1 == frames.len(), &mut out) {
            return;
        }
        if let Frame::Data { offset, .. } = f {
            // Expansion against any reference the receiver may hold must not overflow.
            for reference in [0, 1, offset.value, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                let _ = offset.expand(reference);
            }
        }
    }
    let (_, again) = parse_packet(&out).expect("re-encoded packet decodes");
    assert_eq!(again, frames, "re-encoding changed the frames");
    assert!(out.len() >= header_len);
}

/// Appends the encoding of `f`; false for a frame whose encoding is deliberately lossy.
fn reencode(f: &Frame<'_>, last: bool, out: &mut Vec<u8>) -> bool {
    match f {
        Frame::Padding => out.push(frame::TYPE_PADDING),
        Frame::Ping => frame::encode_ping(out),
        Frame::Ack(a) => {
            let before = out.len();
            frame::encode_ack(out, a);
            assert_eq!(out.len() - before, frame::ack_len(a), "ack_len disagrees");
        }
        Frame::FlowOpen {
            flow,
            meta,
            data,
            fin,
        } => frame::encode_open(out, *flow, meta, data, *fin),
        Frame::Data {
            flow,
            offset,
            fin,
            data,
        } => {
            // A length-less DATA frame runs to the end of the packet; it can only be last.
            let explicit = *fin || !last;
            frame::encode_data(out, *flow, offset.value, offset.len, *fin, data, explicit);
        }
        Frame::FlowReset {
            flow,
            reason,
            final_offset,
        } => frame::encode_reset(out, *flow, *reason, *final_offset),
        Frame::FlowCredit { flow, max_offset } => {
            frame::encode_flow_credit(out, *flow, *max_offset)
        }
        Frame::AssocCredit { max_bytes } => frame::encode_assoc_credit(out, *max_bytes),
        Frame::Close { code, reason } => {
            // Invalid UTF-8 was replaced by U+FFFD (3 bytes each), so the text may now
            // exceed the 256 bytes the encoder keeps: that truncation is by design.
            if reason.len() > 256 {
                return false;
            }
            frame::encode_close(out, *code, reason);
        }
        Frame::StreamSnack { flow, ranges } => frame::encode_stream_snack(out, *flow, ranges),
    }
    true
}

// ---- receive -----------------------------------------------------------------------------

const EPOCH_A: u64 = 0xa11c_e000_0000_0001;
const EPOCH_B: u64 = 0xb0b0_0000_0000_0002;
/// Datagrams B sent that the fuzzer can still deliver (oldest dropped first).
const POOL_MAX: usize = 64;
/// A sender that keeps producing datagrams at one instant is stuck in a loop: at this
/// config's rate the pacer lets only a couple of packets out per instant.
const MAX_TRANSMITS_PER_POLL: usize = 1000;
const READ_MAX: usize = 1500;

pub fn fuzz_config() -> Config {
    let mut c = Config::for_rate(2_000_000);
    c.initial_rtt = Duration::from_millis(100);
    // Small windows and few flows, so the fuzzer can reach the limits with short inputs.
    c.flow_window = 32 * 1024;
    c.send_buffer = 32 * 1024;
    c.assoc_window = 96 * 1024;
    c.max_flows = 6;
    c.outage_limit = Duration::from_secs(30);
    c
}

pub fn meta(port: u16) -> FlowMeta {
    FlowMeta {
        client: std::net::SocketAddr::from(([198, 18, 0, 1], port)),
        server: std::net::SocketAddr::from(([198, 19, 0, 1], 80)),
        dscp: 10,
        compression: false,
    }
}

/// Deterministic bytes, distinct per `seed`, so a misplaced chunk is visible.
pub fn pattern(seed: u64, start: usize, len: usize) -> Vec<u8> {
    (start..start + len)
        .map(|i| {
            let x = (i as u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7);
            (x >> 24) as u8
        })
        .collect()
}

/// One side's application: what it wrote and read per flow.
#[derive(Default)]
struct App {
    written: BTreeMap<FlowId, Vec<u8>>,
    read: BTreeMap<FlowId, Vec<u8>>,
    flows: BTreeSet<FlowId>,
    total_read: u64,
}

/// A = the association under attack; B = its honest peer. The A->B direction is an honest
/// zero-delay link; the B->A direction is the attacker's: B's datagrams land in `pool` and
/// reach A only when the fuzz input delivers them (replayed, reordered, mutated or never),
/// next to datagrams it makes up.
pub struct Pair {
    pub now: Instant,
    pub a: Association,
    pub b: Association,
    /// B's datagrams, in sending order, not yet dropped from the attacker's memory.
    pub pool: VecDeque<Vec<u8>>,
    apps: [App; 2],
    /// Datagrams and bytes given to A (all from the pool or made up) and to B.
    fed: [(u64, u64); 2],
    /// A was given something B never sent, so A may hold bytes B never wrote.
    forged: bool,
    /// An association restarted on either side: flow ids may be reused with other content.
    restarted: bool,
    buf: Vec<u8>,
    /// Every datagram emitted, with its sender (0 = A), when recording for the seed corpus.
    pub record: Option<Vec<(usize, Vec<u8>)>>,
}

impl Pair {
    /// Handshakes, then A opens a flow with 4000 bytes and a FIN and B one with 6000 bytes.
    /// A's side is delivered; B's answers wait in the pool.
    pub fn new() -> Pair {
        Pair::build(false)
    }

    /// As `new`, recording every datagram either side sends from the first HELLO on.
    pub fn recording() -> Pair {
        Pair::build(true)
    }

    fn build(record: bool) -> Pair {
        let now = Instant::now();
        let cfg = fuzz_config();
        let a = Association::new(cfg.clone(), Role::Initiator, EPOCH_A, now).expect("config");
        let b = Association::new(cfg, Role::Responder, EPOCH_B, now).expect("config");
        let mut p = Pair {
            now,
            a,
            b,
            pool: VecDeque::new(),
            apps: [App::default(), App::default()],
            fed: [(0, 0); 2],
            forged: false,
            restarted: false,
            buf: Vec::new(),
            record: record.then(Vec::new),
        };
        // Handshake over a link that is honest both ways.
        for _ in 0..20 {
            p.service();
            p.deliver_all();
            if p.a.is_established() && p.b.is_established() {
                break;
            }
            p.next_timer();
        }
        assert!(
            p.a.is_established() && p.b.is_established(),
            "pair did not establish"
        );
        p.pool.clear();
        p.app_open(0, 1000, 4000, true);
        p.app_open(1, 2000, 6000, false);
        p.service();
        p
    }

    fn end(&mut self, side: usize) -> &mut Association {
        if side == 0 {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    fn app_open(&mut self, side: usize, port: u16, len: usize, fin: bool) {
        let Ok(id) = self.end(side).open_flow(meta(port)) else {
            return;
        };
        self.apps[side].flows.insert(id);
        self.app_write(side, id, len);
        if fin {
            let _ = self.end(side).finish(id);
        }
    }

    /// Writes the next `len` bytes of the flow's pattern; records what was accepted.
    fn app_write(&mut self, side: usize, id: FlowId, len: usize) {
        let start = self.apps[side].written.get(&id).map_or(0, Vec::len);
        let data = pattern(id * 2 + side as u64, start, len);
        if let Ok(n) = self.end(side).write(id, &data) {
            self.apps[side]
                .written
                .entry(id)
                .or_default()
                .extend_from_slice(&data[..n]);
        }
    }

    /// Gives A one datagram from the attacker; `forged` when B did not send it as is.
    pub fn feed_a(&mut self, d: &[u8], forged: bool) {
        self.forged |= forged;
        self.fed[0].0 += 1;
        self.fed[0].1 += d.len() as u64;
        self.a.handle_datagram(self.now, d);
        self.service();
    }

    /// Delivers the whole pool to A in order.
    pub fn deliver_all(&mut self) {
        while let Some(d) = self.pool.pop_front() {
            self.fed[0].0 += 1;
            self.fed[0].1 += d.len() as u64;
            self.a.handle_datagram(self.now, &d);
        }
        self.service();
    }

    /// Moves time to the earliest timer of either side (at least 1 ms on) and fires it.
    pub fn next_timer(&mut self) {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let floor = self.now + Duration::from_millis(1);
        self.advance_to(next.map_or(floor, |t| t.max(floor)));
    }

    pub fn advance(&mut self, by: Duration) {
        self.advance_to(self.now + by);
    }

    fn advance_to(&mut self, t: Instant) {
        self.now = self.now.max(t);
        for side in 0..2 {
            let now = self.now;
            if self.end(side).poll_timeout().is_some_and(|t| t <= now) {
                self.end(side).handle_timeout(now);
            }
        }
        self.service();
    }

    /// Both applications read and react, A's datagrams reach B, B's go to the pool, until
    /// neither side has anything more to say at this instant.
    pub fn service(&mut self) {
        for _ in 0..8 {
            self.drain(0);
            self.drain(1);
            let mut moved = false;
            let mut n = 0;
            while self.a.poll_transmit(self.now, &mut self.buf) {
                n += 1;
                assert!(n <= MAX_TRANSMITS_PER_POLL, "A's poll_transmit never stops");
                check_emitted(&self.a, &self.buf);
                if let Some(rec) = self.record.as_mut() {
                    rec.push((0, self.buf.clone()));
                }
                self.fed[1].0 += 1;
                self.fed[1].1 += self.buf.len() as u64;
                self.b.handle_datagram(self.now, &self.buf);
                moved = true;
            }
            n = 0;
            while self.b.poll_transmit(self.now, &mut self.buf) {
                n += 1;
                assert!(n <= MAX_TRANSMITS_PER_POLL, "B's poll_transmit never stops");
                check_emitted(&self.b, &self.buf);
                if let Some(rec) = self.record.as_mut() {
                    rec.push((1, self.buf.clone()));
                }
                if self.pool.len() == POOL_MAX {
                    self.pool.pop_front();
                }
                self.pool.push_back(self.buf.clone());
                moved = true;
            }
            if !moved {
                break;
            }
        }
        self.drain(0);
        self.drain(1);
        self.check_invariants();
    }

    /// Takes one side's events and reads every flow it knows until blocked.
    fn drain(&mut self, side: usize) {
        while let Some(ev) = self.end(side).poll_event() {
            match ev {
                Event::FlowOpened { flow, .. } | Event::FlowReadable { flow } => {
                    self.apps[side].flows.insert(flow);
                }
                Event::PeerRestarted | Event::AssociationLost { .. } => self.restarted = true,
                _ => {}
            }
        }
        let ids: Vec<FlowId> = self.apps[side].flows.iter().copied().collect();
        for id in ids {
            loop {
                match self.end(side).read(id, READ_MAX) {
                    Ok(ReadOutcome::Data(b)) => {
                        assert!(!b.is_empty(), "read returned an empty chunk");
                        assert!(b.len() <= READ_MAX, "read returned more than asked");
                        let app = &mut self.apps[side];
                        app.total_read += b.len() as u64;
                        app.read.entry(id).or_default().extend_from_slice(&b);
                    }
                    Ok(ReadOutcome::Finished) | Ok(ReadOutcome::Blocked) => break,
                    Err(_) => {
                        self.apps[side].flows.remove(&id);
                        break;
                    }
                }
            }
        }
    }

    fn check_invariants(&self) {
        for (side, assoc) in [(0, &self.a), (1, &self.b)] {
            let s = assoc.stats();
            let (datagrams, bytes) = self.fed[side];
            // Each received datagram lands in at most one of these.
            let accounted = s.packets_received
                + s.malformed_dropped
                + s.duplicates_dropped
                + s.unassociated_dropped;
            assert!(
                accounted <= datagrams,
                "side {side}: {accounted} datagrams accounted for, {datagrams} received"
            );
            assert!(
                s.flows_open <= s.flows_opened_total,
                "side {side}: flow counts"
            );
            assert!(
                s.stream_bytes_acked <= s.stream_bytes_sent,
                "side {side}: acked {} of {} stream bytes sent",
                s.stream_bytes_acked,
                s.stream_bytes_sent
            );
            let overhead = assoc.config().wire_overhead as u64;
            assert!(
                s.wire_bytes_received <= bytes + s.packets_received * overhead,
                "side {side}: more wire bytes counted than received"
            );
            // Every byte read must have arrived in some datagram.
            assert!(
                self.apps[side].total_read <= bytes,
                "side {side}: read {} stream bytes out of {bytes} datagram bytes",
                self.apps[side].total_read
            );
        }
        if self.restarted {
            return;
        }
        // B hears only A's own datagrams, so whatever B reads of a flow is a prefix of what
        // A's application wrote to it, however A was provoked. A likewise, while nothing
        // was forged.
        let sides: &[usize] = if self.forged { &[1] } else { &[1, 0] };
        for &side in sides {
            let peer = 1 - side;
            for (id, got) in &self.apps[side].read {
                let wrote = self.apps[peer].written.get(id).map_or(&[][..], |v| &v[..]);
                assert!(
                    got.len() <= wrote.len(),
                    "side {side} flow {id}: read {} bytes, peer wrote {}",
                    got.len(),
                    wrote.len()
                );
                assert!(
                    got[..] == wrote[..got.len()],
                    "side {side} flow {id}: read bytes differ from those written"
                );
            }
        }
    }

    /// An application action chosen by the fuzz input.
    pub fn app_action(&mut self, sel: u8, arg: u8) {
        let side = usize::from(sel & 1);
        let ids: Vec<FlowId> = self.apps[side].flows.iter().copied().collect();
        let id = ids
            .get(usize::from(arg) % ids.len().max(1))
            .copied()
            .unwrap_or(u64::from(arg));
        match (sel >> 1) % 6 {
            0 | 1 => self.app_write(side, id, 100 + usize::from(arg) * 40),
            2 => {
                let _ = self.end(side).finish(id);
            }
            3 => {
                let _ = self.end(side).reset(id, ResetReason::from_code(arg % 10));
            }
            4 => self.app_open(
                side,
                3000 + u16::from(arg),
                usize::from(arg) * 16,
                arg & 1 == 1,
            ),
            _ => {
                if arg == 0 {
                    // Rare: a deliberate close, which restarts the association (and
                    // reuses flow ids, so the prefix checks no longer apply).
                    self.end(side).close(arg, "fuzz");
                    self.restarted = true;
                } else {
                    let _ = self.end(side).send_capacity(id);
                }
            }
        }
        self.service();
    }
}

impl Default for Pair {
    fn default() -> Self {
        Pair::new()
    }
}

/// What any association sends must fit the path and parse: a state the fuzzer provoked
/// must never make it emit something its peer would drop as malformed.
fn check_emitted(assoc: &Association, d: &[u8]) {
    assert!(
        d.len() <= assoc.config().max_datagram(),
        "emitted {} bytes, path takes {}",
        d.len(),
        assoc.config().max_datagram()
    );
    if let Err(e) = parse_packet(d) {
        panic!("emitted a datagram that does not parse ({e}): {d:02x?}");
    }
}

/// Cursor over the fuzz input; running out yields zeros, so every input is a valid script.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }
}

/// Record opcodes of the `receive` target's input (the low 3 bits of a record's first byte).
pub mod op {
    /// `len: u16`, then `len` bytes: a made-up datagram.
    pub const RAW: u8 = 0;
    /// `idx`: replay pool datagram `idx % len` unchanged.
    pub const REPLAY: u8 = 1;
    /// `idx`, `n`, then `n % 8 + 1` edits of (`kind`, `pos: u16`, `val`): a mutated replay.
    pub const MUTATE: u8 = 2;
    /// `ms: u16`: let time pass.
    pub const ADVANCE: u8 = 3;
    /// Jump to the next timer of either side.
    pub const TIMER: u8 = 4;
    /// `sel`, `arg`: an application action on A or B.
    pub const APP: u8 = 5;
    /// `idx`, `len`, then `len` bytes: pool datagram `idx`'s short header with a made-up
    /// payload, so made-up frames carry a plausible packet number.
    pub const SPLICE: u8 = 6;
    /// Deliver the whole pool in order.
    pub const FLUSH: u8 = 7;
}

/// The `receive` target: runs the fuzz input as a script against a fresh pair.
pub fn run_receive(data: &[u8]) {
    let mut p = Pair::new();
    let mut input = Input { data };
    let mut steps = 0;
    while !input.data.is_empty() {
        steps += 1;
        if steps > 256 {
            // Longer scripts only slow the fuzzer down; libFuzzer's -max_len bounds them too.
            break;
        }
        let code = input.u8();
        match code & 7 {
            op::RAW => {
                let len = usize::from(input.u16() % 2048);
                let d = input.bytes(len).to_vec();
                p.feed_a(&d, true);
            }
            op::REPLAY => {
                let idx = usize::from(input.u8());
                if let Some(d) = pick(&p.pool, idx) {
                    p.feed_a(&d, false);
                }
            }
            op::MUTATE => {
                let idx = usize::from(input.u8());
                let edits = usize::from(input.u8() % 8) + 1;
                let mut d = pick(&p.pool, idx).unwrap_or_default();
                for _ in 0..edits {
                    let kind = input.u8();
                    let pos = usize::from(input.u16());
                    let val = input.u8();
                    mutate(&mut d, kind, pos, val);
                }
                p.feed_a(&d, true);
            }
            op::ADVANCE => {
                let ms = input.u16();
                p.advance(Duration::from_millis(u64::from(ms)));
            }
            op::TIMER => p.next_timer(),
            op::APP => {
                let sel = input.u8();
                let arg = input.u8();
                p.app_action(sel, arg);
            }
            op::SPLICE => {
                let idx = usize::from(input.u8());
                let len = usize::from(input.u8());
                let payload = input.bytes(len).to_vec();
                let mut d = pick(&p.pool, idx).unwrap_or_else(|| vec![0x20, 0, 0]);
                d.truncate(short_header_len(&d));
                d.extend_from_slice(&payload);
                p.feed_a(&d, true);
            }
            _ => p.deliver_all(),
        }
    }
    // Let the pair settle honestly for a while: invariants must hold after the attack too.
    for _ in 0..8 {
        p.deliver_all();
        p.next_timer();
    }
}

fn pick(pool: &VecDeque<Vec<u8>>, idx: usize) -> Option<Vec<u8>> {
    if pool.is_empty() {
        return None;
    }
    pool.get(idx % pool.len()).cloned()
}

fn mutate(d: &mut Vec<u8>, kind: u8, pos: usize, val: u8) {
    if d.is_empty() {
        d.push(val);
        return;
    }
    let at = pos % d.len();
    match kind % 6 {
        0 => d[at] ^= val,
        1 => d[at] = val,
        2 => d.truncate(at.max(1)),
        3 => d.insert(at, val),
        4 => {
            d.remove(at);
        }
        _ => {
            // A varint-sized number where frame fields live: good at hitting limits.
            let mut v = Vec::new();
            put_varint(
                &mut v,
                u64::from(val).wrapping_shl(u32::from(kind >> 3) * 7),
            );
            d.splice(at..(at + v.len()).min(d.len()), v);
        }
    }
}

/// Length of the short header at the start of `d` (1 + packet-number bytes), or of the
/// whole of `d` when it is not a short packet.
fn short_header_len(d: &[u8]) -> usize {
    match d.first() {
        Some(&b) if b & 0x80 == 0 => (1 + usize::from((b >> 5) & 3) + 1).min(d.len()),
        _ => d.len(),
    }
}

/// Whether `data` is a valid datagram by the receive path's parser (for the corpus tool).
pub fn parses(data: &[u8]) -> Result<(), DecodeError> {
    parse_packet(data).map(|_| ())
}
