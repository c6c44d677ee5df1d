//! Frames: the units inside a packet's payload. Layout: docs/PROTOCOL.md.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;

use crate::codec::{expand_truncated, put_uint, put_varint, varint_len, DecodeError, Reader};

pub const TYPE_PADDING: u8 = 0x00;
pub const TYPE_PING: u8 = 0x01;
pub const TYPE_ACK: u8 = 0x02;
pub const TYPE_FLOW_OPEN: u8 = 0x03;
pub const TYPE_FLOW_RESET: u8 = 0x04;
pub const TYPE_FLOW_CREDIT: u8 = 0x05;
pub const TYPE_ASSOC_CREDIT: u8 = 0x06;
pub const TYPE_CLOSE: u8 = 0x07;
pub const TYPE_STREAM_SNACK: u8 = 0x08;
pub const TYPE_ACK_TIMED: u8 = 0x09;
/// Most byte ranges one STREAM_SNACK names.
pub const MAX_STREAM_SNACK_RANGES: usize = 16;
/// DATA occupies 0x10..=0x1f: bit 0 FIN, bit 1 LEN present, bits 2-3 offset length - 1.
pub const TYPE_DATA_BASE: u8 = 0x10;
const DATA_FIN: u8 = 0x01;
const DATA_LEN: u8 = 0x02;

/// More ranges than this in one ACK is treated as malformed (bounds decoder memory).
pub const MAX_ACK_RANGES_DECODED: usize = 256;
const MAX_CLOSE_REASON: usize = 256;

const OPEN_IPV6: u8 = 0x01;
const OPEN_HAS_DATA: u8 = 0x02;
const OPEN_FIN: u8 = 0x04;
const OPEN_COMPRESSION: u8 = 0x08;

/// Why a flow was reset; carried on the wire as one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResetReason {
    /// An end host sent RST, or the application aborted.
    Aborted,
    /// The destination refused the connection.
    Refused,
    /// The destination could not be reached (no route, host unreachable, connect timeout).
    Unreachable,
    /// An idle or connect timeout expired.
    Timeout,
    /// The peer gateway restarted; the flow's state is gone.
    PeerRestart,
    /// The link was down for longer than the configured limit.
    OutageLimit,
    /// A limit (flows, memory) was reached.
    ResourceLimit,
    /// The peer violated the protocol on this flow.
    Protocol,
    /// The sender holds no state for this flow (it was closed or never seen). Sent in
    /// answer to a RESET so the peer can release its side; never answered itself.
    Closed,
    /// The terminal moved to another hub of its address list (docs/PROTOCOL.md §10): the
    /// flow's state was at the hub it left. Local: the hub it left learns of the move from
    /// the CLOSE that goes with it.
    Handover,
    /// A reason this version does not know.
    Other(u8),
}

impl ResetReason {
    pub fn code(self) -> u8 {
        match self {
            ResetReason::Aborted => 0,
            ResetReason::Refused => 1,
            ResetReason::Unreachable => 2,
            ResetReason::Timeout => 3,
            ResetReason::PeerRestart => 4,
            ResetReason::OutageLimit => 5,
            ResetReason::ResourceLimit => 6,
            ResetReason::Protocol => 7,
            ResetReason::Closed => 8,
            ResetReason::Handover => 9,
            ResetReason::Other(c) => c,
        }
    }

    pub fn from_code(c: u8) -> Self {
        match c {
            0 => ResetReason::Aborted,
            1 => ResetReason::Refused,
            2 => ResetReason::Unreachable,
            3 => ResetReason::Timeout,
            4 => ResetReason::PeerRestart,
            5 => ResetReason::OutageLimit,
            6 => ResetReason::ResourceLimit,
            7 => ResetReason::Protocol,
            8 => ResetReason::Closed,
            9 => ResetReason::Handover,
            c => ResetReason::Other(c),
        }
    }
}

/// The original TCP connection a flow carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowMeta {
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// DSCP of the client's packets (6 bits).
    pub dscp: u8,
    /// Both streams of the flow are sequences of compression blocks (docs/PROTOCOL.md §9),
    /// which only an association that agreed on compression carries.
    pub compression: bool,
}

/// Stream offset as sent: its low `len` bytes. Expanded against the receiver's contiguous end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TruncatedOffset {
    pub value: u64,
    pub len: usize,
}

impl TruncatedOffset {
    pub fn expand(self, reference: u64) -> u64 {
        expand_truncated(self.value, self.len, reference)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckFrame {
    /// Received packet-number ranges, highest first, disjoint and non-adjacent.
    pub ranges: Vec<Range<u64>>,
    /// Time between receiving the largest packet and sending this ACK, in microseconds.
    pub delay_us: u64,
    /// When the receiver received the largest packet, in microseconds of its own clock
    /// (whose origin only the receiver knows): only the differences between two ACKs'
    /// times mean anything to the sender.
    pub received_us: Option<u64>,
}

impl AckFrame {
    pub fn largest(&self) -> Option<u64> {
        self.ranges.first().map(|r| r.end - 1)
    }

    /// A SNACK is an ACK that names at least one hole.
    pub fn has_holes(&self) -> bool {
        self.ranges.len() > 1
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// One or more PADDING bytes in a row.
    Padding,
    Ping,
    Ack(AckFrame),
    FlowOpen {
        flow: u64,
        meta: FlowMeta,
        /// First bytes of the client's stream, at offset 0.
        data: &'a [u8],
        fin: bool,
    },
    Data {
        flow: u64,
        offset: TruncatedOffset,
        fin: bool,
        data: &'a [u8],
    },
    FlowReset {
        flow: u64,
        reason: ResetReason,
        /// Bytes the resetting side had sent on the flow (absolute).
        final_offset: u64,
    },
    /// The receiver allows stream bytes below `max_offset` on `flow`.
    FlowCredit {
        flow: u64,
        max_offset: u64,
    },
    /// The receiver allows `max_bytes` stream bytes in total across all flows.
    AssocCredit {
        max_bytes: u64,
    },
    Close {
        code: u8,
        reason: String,
    },
    /// Stream-level SNACK: byte ranges of `flow` missing below data the receiver holds, after
    /// its cumulative point stalled. A safety net under the packet-level ACK ranges.
    StreamSnack {
        flow: u64,
        ranges: Vec<Range<u64>>,
    },
}

impl Frame<'_> {
    /// Whether receiving this frame obliges the receiver to acknowledge the packet.
    pub fn is_ack_eliciting(&self) -> bool {
        !matches!(self, Frame::Padding | Frame::Ack(_))
    }

    /// Decodes one frame. DATA without a LEN bit runs to the end of the packet.
    pub fn decode<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, DecodeError> {
        let ty = r.u8()?;
        Ok(match ty {
            TYPE_PADDING => {
                // A run of PADDING is one frame: a full-size padded packet would otherwise
                // be a thousand of them for the receive path to collect and walk.
                r.skip_run(TYPE_PADDING);
                Frame::Padding
            }
            TYPE_PING => Frame::Ping,
            TYPE_ACK => Frame::Ack(decode_ack(r, false)?),
            TYPE_ACK_TIMED => Frame::Ack(decode_ack(r, true)?),
            TYPE_FLOW_OPEN => decode_open(r)?,
            TYPE_FLOW_RESET => Frame::FlowReset {
                flow: r.varint()?,
                reason: ResetReason::from_code(r.u8()?),
                final_offset: r.varint()?,
            },
            TYPE_FLOW_CREDIT => Frame::FlowCredit {
                flow: r.varint()?,
                max_offset: r.varint()?,
            },
            TYPE_ASSOC_CREDIT => Frame::AssocCredit {
                max_bytes: r.varint()?,
            },
            TYPE_CLOSE => {
                let code = r.u8()?;
                let len = r.varint()?;
                if len > MAX_CLOSE_REASON as u64 {
                    return Err(DecodeError::Invalid("close reason too long"));
                }
                let reason = String::from_utf8_lossy(r.bytes(len as usize)?).into_owned();
                Frame::Close { code, reason }
            }
            TYPE_STREAM_SNACK => {
                let flow = r.varint()?;
                let count = r.varint()?;
                if count == 0 || count > MAX_STREAM_SNACK_RANGES as u64 {
                    return Err(DecodeError::Invalid("stream snack range count"));
                }
                let mut ranges = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    let start = r.varint()?;
                    let len = r.varint()?;
                    let end = start
                        .checked_add(len)
                        .ok_or(DecodeError::Invalid("stream snack range overflow"))?;
                    ranges.push(start..end);
                }
                Frame::StreamSnack { flow, ranges }
            }
            t if t & 0xf0 == TYPE_DATA_BASE => {
                let offset_len = usize::from((t >> 2) & 0x03) + 1;
                let flow = r.varint()?;
                let offset = TruncatedOffset {
                    value: r.uint(offset_len)?,
                    len: offset_len,
                };
                if t & DATA_FIN != 0 && t & DATA_LEN == 0 {
                    return Err(DecodeError::Invalid("FIN without explicit length"));
                }
                let data = if t & DATA_LEN != 0 {
                    let len = r.varint()?;
                    r.bytes(usize::try_from(len).map_err(|_| DecodeError::Truncated)?)?
                } else {
                    r.rest()
                };
                Frame::Data {
                    flow,
                    offset,
                    fin: t & DATA_FIN != 0,
                    data,
                }
            }
            t => return Err(DecodeError::UnknownFrame(t)),
        })
    }

    /// Decodes the body of a DATA frame whose flags came in the packet header.
    pub fn decode_implicit_data<'a>(
        r: &mut Reader<'a>,
        fin: bool,
        offset_len: usize,
    ) -> Result<Frame<'a>, DecodeError> {
        if fin {
            return Err(DecodeError::Invalid("FIN without explicit length"));
        }
        let flow = r.varint()?;
        let offset = TruncatedOffset {
            value: r.uint(offset_len)?,
            len: offset_len,
        };
        Ok(Frame::Data {
            flow,
            offset,
            fin,
            data: r.rest(),
        })
    }
}

/// A packet whose payload is exactly one DATA frame carries that frame's flags in the header
/// byte and omits the frame type and length: the "compressed" data packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImplicitData {
    pub fin: bool,
    /// Bytes of the truncated stream offset, 1..=4.
    pub offset_len: usize,
}

/// Decodes a short packet's whole (already unprotected) payload with the receive path's
/// rules: implicit data from the header means the payload is that one DATA frame; otherwise
/// at least one frame, each complete. Everything is parsed before anything is applied, so a
/// packet that fails here changes no state. Public so fuzzers and tests reach exactly the
/// parser hostile datagrams reach.
pub fn decode_payload<'a>(
    payload: &'a [u8],
    implicit_data: Option<ImplicitData>,
) -> Result<Vec<Frame<'a>>, DecodeError> {
    let mut r = Reader::new(payload);
    if let Some(d) = implicit_data {
        return Ok(vec![Frame::decode_implicit_data(
            &mut r,
            d.fin,
            d.offset_len,
        )?]);
    }
    let mut frames = Vec::new();
    while !r.is_empty() {
        frames.push(Frame::decode(&mut r)?);
    }
    if frames.is_empty() {
        return Err(DecodeError::Invalid("empty packet"));
    }
    Ok(frames)
}

fn decode_ack(r: &mut Reader<'_>, timed: bool) -> Result<AckFrame, DecodeError> {
    let largest = r.varint()?;
    let delay_us = r.varint()?;
    let received_us = if timed { Some(r.varint()?) } else { None };
    let extra = r.varint()?;
    if extra >= MAX_ACK_RANGES_DECODED as u64 {
        return Err(DecodeError::Invalid("too many ack ranges"));
    }
    let first_len = r.varint()?;
    let smallest = largest
        .checked_sub(first_len)
        .ok_or(DecodeError::Invalid("ack range below zero"))?;
    let mut ranges = Vec::with_capacity(extra as usize + 1);
    ranges.push(smallest..largest + 1);
    let mut prev_smallest = smallest;
    for _ in 0..extra {
        let gap = r.varint()?;
        let len = r.varint()?;
        let hi = prev_smallest
            .checked_sub(gap)
            .and_then(|v| v.checked_sub(2))
            .ok_or(DecodeError::Invalid("ack gap below zero"))?;
        let lo = hi
            .checked_sub(len)
            .ok_or(DecodeError::Invalid("ack range below zero"))?;
        ranges.push(lo..hi + 1);
        prev_smallest = lo;
    }
    Ok(AckFrame {
        ranges,
        delay_us,
        received_us,
    })
}

fn put_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
    }
}

fn read_addr(r: &mut Reader<'_>, v6: bool) -> Result<SocketAddr, DecodeError> {
    let ip: IpAddr = if v6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(r.bytes(16)?);
        Ipv6Addr::from(a).into()
    } else {
        let mut a = [0u8; 4];
        a.copy_from_slice(r.bytes(4)?);
        Ipv4Addr::from(a).into()
    };
    Ok(SocketAddr::new(ip, r.u16()?))
}

fn decode_open<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, DecodeError> {
    let flow = r.varint()?;
    let flags = r.u8()?;
    let dscp = r.u8()?;
    if dscp > 63 {
        return Err(DecodeError::Invalid("dscp above 63"));
    }
    let v6 = flags & OPEN_IPV6 != 0;
    let client = read_addr(r, v6)?;
    let server = read_addr(r, v6)?;
    let data = if flags & OPEN_HAS_DATA != 0 {
        let len = r.varint()?;
        r.bytes(usize::try_from(len).map_err(|_| DecodeError::Truncated)?)?
    } else {
        &[]
    };
    Ok(Frame::FlowOpen {
        flow,
        meta: FlowMeta {
            client,
            server,
            dscp,
            compression: flags & OPEN_COMPRESSION != 0,
        },
        data,
        fin: flags & OPEN_FIN != 0,
    })
}

// ---- encoders -------------------------------------------------------------------------

pub fn encode_ping(out: &mut Vec<u8>) {
    out.push(TYPE_PING);
}

/// Encodes `ack`; the caller guarantees the ranges are ordered and disjoint.
pub fn encode_ack(out: &mut Vec<u8>, ack: &AckFrame) {
    let Some(first) = ack.ranges.first() else {
        return;
    };
    out.push(if ack.received_us.is_some() {
        TYPE_ACK_TIMED
    } else {
        TYPE_ACK
    });
    put_varint(out, first.end - 1);
    put_varint(out, ack.delay_us);
    if let Some(t) = ack.received_us {
        put_varint(out, t);
    }
    put_varint(out, ack.ranges.len() as u64 - 1);
    put_varint(out, first.end - 1 - first.start);
    let mut prev_smallest = first.start;
    for r in &ack.ranges[1..] {
        put_varint(out, prev_smallest - r.end - 1);
        put_varint(out, r.end - 1 - r.start);
        prev_smallest = r.start;
    }
}

/// Encoded size of an ACK frame.
pub fn ack_len(ack: &AckFrame) -> usize {
    let Some(first) = ack.ranges.first() else {
        return 0;
    };
    let mut n = 1
        + varint_len(first.end - 1)
        + varint_len(ack.delay_us)
        + ack.received_us.map_or(0, varint_len)
        + varint_len(ack.ranges.len() as u64 - 1)
        + varint_len(first.end - 1 - first.start);
    let mut prev_smallest = first.start;
    for r in &ack.ranges[1..] {
        n += varint_len(prev_smallest - r.end - 1) + varint_len(r.end - 1 - r.start);
        prev_smallest = r.start;
    }
    n
}

/// Bytes a FLOW_OPEN needs before its data.
pub fn open_header_len(flow: u64, meta: &FlowMeta, data_len: usize) -> usize {
    let v6 = meta.client.is_ipv6() || meta.server.is_ipv6();
    let addr = if v6 { 18 } else { 6 };
    let data = if data_len > 0 {
        varint_len(data_len as u64)
    } else {
        0
    };
    1 + varint_len(flow) + 2 + 2 * addr + data
}

pub fn encode_open(out: &mut Vec<u8>, flow: u64, meta: &FlowMeta, data: &[u8], fin: bool) {
    out.push(TYPE_FLOW_OPEN);
    put_varint(out, flow);
    // Both ends of a TCP connection share a family; a mixed pair is mapped to v6.
    let v6 = meta.client.is_ipv6() || meta.server.is_ipv6();
    let mut flags = 0;
    if v6 {
        flags |= OPEN_IPV6;
    }
    if !data.is_empty() {
        flags |= OPEN_HAS_DATA;
    }
    if fin {
        flags |= OPEN_FIN;
    }
    if meta.compression {
        flags |= OPEN_COMPRESSION;
    }
    out.push(flags);
    out.push(meta.dscp & 0x3f);
    for a in [meta.client, meta.server] {
        let ip = match (v6, a.ip()) {
            (true, IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
            (_, ip) => ip,
        };
        put_ip(out, ip);
        out.extend_from_slice(&a.port().to_be_bytes());
    }
    if !data.is_empty() {
        put_varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }
}

/// Bytes a DATA frame needs before its payload.
pub fn data_header_len(flow: u64, offset_len: usize, len: Option<usize>) -> usize {
    1 + varint_len(flow) + offset_len + len.map_or(0, |l| varint_len(l as u64))
}

/// Encodes a typed DATA frame; with `explicit_len` false it must be the packet's last frame
/// (and must not carry FIN).
pub fn encode_data(
    out: &mut Vec<u8>,
    flow: u64,
    offset: u64,
    offset_len: usize,
    fin: bool,
    data: &[u8],
    explicit_len: bool,
) {
    encode_data_header(
        out,
        flow,
        offset,
        offset_len,
        fin,
        explicit_len.then_some(data.len()),
    );
    out.extend_from_slice(data);
}

/// Writes a typed DATA frame up to its payload, which the caller appends: `len` is written
/// when given (always with FIN). `offset` is truncated to its low `offset_len` bytes.
pub fn encode_data_header(
    out: &mut Vec<u8>,
    flow: u64,
    offset: u64,
    offset_len: usize,
    fin: bool,
    len: Option<usize>,
) {
    let mut ty = TYPE_DATA_BASE | ((offset_len as u8 - 1) << 2);
    if fin {
        ty |= DATA_FIN;
    }
    if len.is_some() {
        ty |= DATA_LEN;
    }
    out.push(ty);
    encode_implicit_data_header(out, flow, offset, offset_len);
    if let Some(len) = len {
        put_varint(out, len as u64);
    }
}

/// Writes the start of a DATA frame whose flags travel in the packet header (flow and
/// truncated offset); the payload follows to the end of the packet.
pub fn encode_implicit_data_header(out: &mut Vec<u8>, flow: u64, offset: u64, offset_len: usize) {
    put_varint(out, flow);
    put_uint(out, offset, offset_len);
}

pub fn encode_reset(out: &mut Vec<u8>, flow: u64, reason: ResetReason, final_offset: u64) {
    out.push(TYPE_FLOW_RESET);
    put_varint(out, flow);
    out.push(reason.code());
    put_varint(out, final_offset);
}

pub fn encode_flow_credit(out: &mut Vec<u8>, flow: u64, max_offset: u64) {
    out.push(TYPE_FLOW_CREDIT);
    put_varint(out, flow);
    put_varint(out, max_offset);
}

pub fn encode_assoc_credit(out: &mut Vec<u8>, max_bytes: u64) {
    out.push(TYPE_ASSOC_CREDIT);
    put_varint(out, max_bytes);
}

pub fn encode_stream_snack(out: &mut Vec<u8>, flow: u64, ranges: &[Range<u64>]) {
    let ranges = &ranges[..ranges.len().min(MAX_STREAM_SNACK_RANGES)];
    if ranges.is_empty() {
        return;
    }
    out.push(TYPE_STREAM_SNACK);
    put_varint(out, flow);
    put_varint(out, ranges.len() as u64);
    for r in ranges {
        put_varint(out, r.start);
        put_varint(out, r.end - r.start);
    }
}

pub fn encode_close(out: &mut Vec<u8>, code: u8, reason: &str) {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    out.push(TYPE_CLOSE);
    out.push(code);
    put_varint(out, end as u64);
    out.extend_from_slice(&reason.as_bytes()[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(buf: &[u8]) -> Result<Vec<Frame<'_>>, DecodeError> {
        let mut r = Reader::new(buf);
        let mut v = Vec::new();
        while !r.is_empty() {
            v.push(Frame::decode(&mut r)?);
        }
        Ok(v)
    }

    fn meta(v6: bool) -> FlowMeta {
        if v6 {
            FlowMeta {
                client: "[fd00:198:18::1]:40000".parse().unwrap(),
                server: "[fd00:198:18:1::2]:80".parse().unwrap(),
                dscp: 46,
                compression: true,
            }
        } else {
            FlowMeta {
                client: "198.18.0.1:40000".parse().unwrap(),
                server: "198.19.0.2:443".parse().unwrap(),
                dscp: 10,
                compression: false,
            }
        }
    }

    #[test]
    fn a_run_of_padding_is_one_frame() {
        let mut out = Vec::new();
        encode_ping(&mut out);
        out.resize(1200, TYPE_PADDING);
        encode_ping(&mut out);
        out.push(TYPE_PADDING);
        assert_eq!(
            decode_all(&out).unwrap(),
            vec![Frame::Ping, Frame::Padding, Frame::Ping, Frame::Padding]
        );
    }

    #[test]
    fn every_frame_roundtrips() {
        let mut out = Vec::new();
        encode_ping(&mut out);
        let ack = AckFrame {
            ranges: vec![90..101, 50..80, 0..10],
            delay_us: 1234,
            received_us: None,
        };
        encode_ack(&mut out, &ack);
        for v6 in [false, true] {
            encode_open(&mut out, 4, &meta(v6), b"GET / HTTP/1.1\r\n", true);
            encode_open(&mut out, 6, &meta(v6), b"", false);
        }
        encode_data(&mut out, 4, 0x123456, 3, true, b"hello", true);
        encode_reset(&mut out, 9, ResetReason::Refused, 77);
        encode_flow_credit(&mut out, 9, 1 << 40);
        encode_assoc_credit(&mut out, 1 << 50);
        encode_close(&mut out, 3, "bye");
        encode_stream_snack(&mut out, 5, &[10..20, 30..31]);
        encode_data(&mut out, 300, 0xab, 1, false, b"tail to end", false);
        let mut bad = Vec::new();
        encode_data(&mut bad, 1, 0, 1, true, b"fin needs a length", false);
        assert!(decode_all(&bad).is_err());
        let frames = decode_all(&out).unwrap();
        assert_eq!(frames[0], Frame::Ping);
        assert_eq!(frames[1], Frame::Ack(ack.clone()));
        assert_eq!(
            frames[2],
            Frame::FlowOpen {
                flow: 4,
                meta: meta(false),
                data: b"GET / HTTP/1.1\r\n",
                fin: true
            }
        );
        assert_eq!(
            frames[5],
            Frame::FlowOpen {
                flow: 6,
                meta: meta(true),
                data: b"",
                fin: false
            }
        );
        assert_eq!(
            frames[6],
            Frame::Data {
                flow: 4,
                offset: TruncatedOffset {
                    value: 0x123456,
                    len: 3
                },
                fin: true,
                data: b"hello"
            }
        );
        assert_eq!(
            frames[7],
            Frame::FlowReset {
                flow: 9,
                reason: ResetReason::Refused,
                final_offset: 77
            }
        );
        assert_eq!(
            frames[8],
            Frame::FlowCredit {
                flow: 9,
                max_offset: 1 << 40
            }
        );
        assert_eq!(frames[9], Frame::AssocCredit { max_bytes: 1 << 50 });
        assert_eq!(
            frames[10],
            Frame::Close {
                code: 3,
                reason: "bye".into()
            }
        );
        assert_eq!(
            frames[11],
            Frame::StreamSnack {
                flow: 5,
                ranges: vec![10..20, 30..31]
            }
        );
        assert_eq!(
            frames[12],
            Frame::Data {
                flow: 300,
                offset: TruncatedOffset {
                    value: 0xab,
                    len: 1
                },
                fin: false,
                data: b"tail to end"
            }
        );
        assert_eq!(frames.len(), 13);
    }

    #[test]
    fn header_length_helpers_match_the_encoders() {
        for v6 in [false, true] {
            let mut out = Vec::new();
            encode_open(&mut out, 70, &meta(v6), b"abc", false);
            assert_eq!(out.len(), open_header_len(70, &meta(v6), 3) + 3);
        }
        let mut out = Vec::new();
        encode_data(&mut out, 70, 5, 2, false, &[0; 300], true);
        assert_eq!(out.len(), data_header_len(70, 2, Some(300)) + 300);
    }

    #[test]
    fn ack_decoder_rejects_underflow() {
        // largest 5, first range 10: below zero.
        assert!(decode_all(&[TYPE_ACK, 5, 0, 0, 10]).is_err());
        // gap reaching below zero.
        assert!(decode_all(&[TYPE_ACK, 5, 0, 1, 0, 9, 0]).is_err());
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_all(&bytes);
        }

        #[test]
        fn ack_roundtrip(mut points in proptest::collection::btree_set(0u64..1_000_000, 1..200), delay in 0u64..1_000_000, received in proptest::option::of(0u64..(1 << 62))) {
            // Build disjoint non-adjacent ranges from sorted points.
            let mut ranges: Vec<Range<u64>> = Vec::new();
            let pts: Vec<u64> = std::mem::take(&mut points).into_iter().collect();
            for p in pts {
                match ranges.last_mut() {
                    Some(r) if r.end >= p => r.end = p + 1,
                    _ => ranges.push(p..p + 1),
                }
            }
            ranges.reverse();
            prop_assume!(ranges.len() < MAX_ACK_RANGES_DECODED);
            let ack = AckFrame { ranges, delay_us: delay, received_us: received };
            let mut out = Vec::new();
            encode_ack(&mut out, &ack);
            prop_assert_eq!(out[0], if received.is_some() { TYPE_ACK_TIMED } else { TYPE_ACK });
            prop_assert_eq!(ack_len(&ack), out.len());
            prop_assert_eq!(decode_all(&out).unwrap(), vec![Frame::Ack(ack)]);
        }

        #[test]
        fn data_roundtrip(flow in 0u64..(1 << 40), offset in 0u64..(1 << 32), len in 1usize..4, fin: bool, data in proptest::collection::vec(any::<u8>(), 0..64), explicit: bool) {
            let explicit = explicit || fin;
            let mut out = Vec::new();
            let masked = offset & ((1u64 << (8 * len)) - 1);
            encode_data(&mut out, flow, masked, len, fin, &data, explicit);
            let f = decode_all(&out).unwrap();
            prop_assert_eq!(f, vec![Frame::Data { flow, offset: TruncatedOffset { value: masked, len }, fin, data: &data }]);
        }
    }
}
