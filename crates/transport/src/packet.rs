//! Packet headers. A short header carries one byte of flags, the receiver's connection ID and
//! a truncated packet number; a long header carries the association handshake (HELLO).
//! Layout: docs/PROTOCOL.md.

use crate::codec::{put_uint, put_varint, DecodeError, Reader};
use crate::compression::CompressionOffer;
use crate::frame::{decode_payload, Frame, ImplicitData};
use crate::ids::ConnectionId;

/// First-byte flag: long header (handshake) when set.
pub const LONG_HEADER_BIT: u8 = 0x80;
/// Long-header packet type: HELLO (only when security is off).
pub const LONG_TYPE_HELLO: u8 = 0x01;
/// Long-header packet type: Noise handshake initiation (security on).
pub const LONG_TYPE_HANDSHAKE_INIT: u8 = 0x02;
/// Long-header packet type: Noise handshake reply (security on).
pub const LONG_TYPE_HANDSHAKE_REPLY: u8 = 0x03;
/// Long-header packet type: a busy responder's cookie, instead of a reply (security on).
pub const LONG_TYPE_COOKIE: u8 = 0x04;
/// Long-header packet type: a hub's "I do not know you", in answer to a short packet for a
/// connection ID it does not hold (security on).
pub const LONG_TYPE_HINT: u8 = 0x05;
/// Bytes of the end of a sealed packet a HINT echoes: the end of its AEAD tag.
pub const HINT_TAG_TAIL_LEN: usize = 4;
/// Type byte and version in front of the rest of a handshake datagram: a REPLY's or a
/// COOKIE's DCID starts here, so a hub can place them by it before reading further.
pub const HANDSHAKE_HEADER_LEN: usize = 5;

const PN_LEN_SHIFT: u8 = 5;
const PN_LEN_MASK: u8 = 0x60;
const KEY_PHASE_BIT: u8 = 0x10;
const IMPLICIT_DATA_BIT: u8 = 0x08;
const IMPLICIT_OFFSET_LEN_SHIFT: u8 = 1;
const IMPLICIT_OFFSET_LEN_MASK: u8 = 0x06;
const IMPLICIT_FIN_BIT: u8 = 0x01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortHeader {
    /// The receiver's connection ID, of the length the receiver chose.
    pub dcid: ConnectionId,
    /// Low `pn_len` bytes of the packet number.
    pub pn_truncated: u64,
    /// 1..=4.
    pub pn_len: usize,
    pub key_phase: bool,
    pub implicit_data: Option<ImplicitData>,
}

impl ShortHeader {
    pub fn encoded_len(&self) -> usize {
        1 + self.dcid.len() + self.pn_len
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!((1..=4).contains(&self.pn_len));
        let mut b = ((self.pn_len as u8 - 1) << PN_LEN_SHIFT) & PN_LEN_MASK;
        if self.key_phase {
            b |= KEY_PHASE_BIT;
        }
        if let Some(d) = self.implicit_data {
            debug_assert!((1..=4).contains(&d.offset_len));
            b |= IMPLICIT_DATA_BIT;
            b |= ((d.offset_len as u8 - 1) << IMPLICIT_OFFSET_LEN_SHIFT) & IMPLICIT_OFFSET_LEN_MASK;
            if d.fin {
                b |= IMPLICIT_FIN_BIT;
            }
        }
        out.push(b);
        out.extend_from_slice(self.dcid.as_slice());
        put_uint(out, self.pn_truncated, self.pn_len);
    }

    fn decode(first: u8, r: &mut Reader<'_>, cid_len: usize) -> Result<Self, DecodeError> {
        let pn_len = usize::from((first & PN_LEN_MASK) >> PN_LEN_SHIFT) + 1;
        let implicit_data = if first & IMPLICIT_DATA_BIT != 0 {
            Some(ImplicitData {
                fin: first & IMPLICIT_FIN_BIT != 0,
                offset_len: usize::from((first & IMPLICIT_OFFSET_LEN_MASK) >> 1) + 1,
            })
        } else if first & (IMPLICIT_OFFSET_LEN_MASK | IMPLICIT_FIN_BIT) != 0 {
            return Err(DecodeError::Invalid("data flags without implicit data bit"));
        } else {
            None
        };
        Ok(ShortHeader {
            dcid: ConnectionId::read(r, cid_len)?,
            pn_truncated: r.uint(pn_len)?,
            pn_len,
            key_phase: first & KEY_PHASE_BIT != 0,
            implicit_data,
        })
    }
}

/// Parameters a gateway announces in its HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloParams {
    /// Credit each new flow starts with, in bytes, in each direction.
    pub initial_flow_window: u64,
    /// Association-wide receive budget the sender may fill before further credit.
    pub initial_assoc_window: u64,
    /// Longest the sender of this HELLO delays an ACK, in microseconds.
    pub max_ack_delay_us: u64,
    /// The sender reads ACKs that carry the receiver's time (flags bit 1; section 4's
    /// ACK_TIMED): only then may its peer send them.
    pub reads_ack_times: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    /// The sender has completed the handshake; a HELLO without it must be answered.
    pub established: bool,
    /// Random per-start identifier of the sending gateway; a new value means it restarted.
    pub epoch: u64,
    /// The peer epoch the sender has seen, or 0 if none yet.
    pub echo: u64,
    pub params: HelloParams,
    /// The connection ID the sender wants in the short packets it receives.
    pub cid: ConnectionId,
    /// The AEADs the sender accepts, most preferred first: sent with security on, inside
    /// the handshake. `None` from a peer that sends none (before the offer existed).
    pub aeads: Option<AeadOffer>,
    /// What the sender can decompress, if anything (docs/PROTOCOL.md §9). `None` from a
    /// peer that sends none: its flows carry no compressed blocks.
    pub compression: Option<CompressionOffer>,
}

/// HELLO flags bit 1: the sender reads ACK_TIMED frames.
const HELLO_READS_ACK_TIMES: u8 = 0x02;

impl Hello {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(LONG_HEADER_BIT | LONG_TYPE_HELLO);
        out.extend_from_slice(&self.version.to_be_bytes());
        let mut flags = u8::from(self.established);
        if self.params.reads_ack_times {
            flags |= HELLO_READS_ACK_TIMES;
        }
        out.push(flags);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.echo.to_be_bytes());
        put_varint(out, self.params.initial_flow_window);
        put_varint(out, self.params.initial_assoc_window);
        put_varint(out, self.params.max_ack_delay_us);
        self.cid.write_prefixed(out);
        // The compression offer comes after the AEAD offer; a HELLO without security
        // carries the AEAD offer of a gateway without one, which it ignores.
        match (&self.aeads, &self.compression) {
            (Some(aeads), _) => aeads.encode(out),
            (None, Some(_)) => AeadOffer::implied().encode(out),
            (None, None) => {}
        }
        if let Some(compression) = &self.compression {
            compression.encode(out);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let version = r.u32()?;
        let flags = r.u8()?;
        let hello = Hello {
            version,
            established: flags & 0x01 != 0,
            epoch: r.u64()?,
            echo: r.u64()?,
            params: HelloParams {
                initial_flow_window: r.varint()?,
                initial_assoc_window: r.varint()?,
                max_ack_delay_us: r.varint()?,
                reads_ack_times: flags & HELLO_READS_ACK_TIMES != 0,
            },
            cid: ConnectionId::read_prefixed(r)?,
            aeads: if r.is_empty() {
                None
            } else {
                Some(AeadOffer::decode(r)?)
            },
            compression: if r.is_empty() {
                None
            } else {
                Some(CompressionOffer::decode(r)?)
            },
        };
        if hello.epoch == 0 {
            return Err(DecodeError::Invalid("zero epoch"));
        }
        // Trailing bytes are reserved for future parameters and ignored.
        r.rest();
        Ok(hello)
    }
}

/// Most AEAD identifiers an offer carries; longer offers are refused as malformed.
pub const MAX_OFFERED: usize = 8;

/// The AEADs a HELLO's sender accepts, as identifiers, most preferred first. Identifiers
/// this build does not know are kept (a newer peer may offer them). What each one names and
/// which AEAD two offers settle on is the security layer's (`security::negotiate`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AeadOffer {
    ids: [u8; MAX_OFFERED],
    len: u8,
}

impl AeadOffer {
    /// `ids`: 1..=[`MAX_OFFERED`] identifiers, most preferred first.
    pub(crate) fn from_ids(ids: &[u8]) -> Self {
        debug_assert!((1..=MAX_OFFERED).contains(&ids.len()));
        let len = ids.len().min(MAX_OFFERED);
        let mut offer = AeadOffer {
            ids: [0; MAX_OFFERED],
            len: len as u8,
        };
        offer.ids[..len].copy_from_slice(&ids[..len]);
        offer
    }

    pub(crate) fn ids(&self) -> &[u8] {
        &self.ids[..usize::from(self.len)]
    }

    /// `u8 count | count × u8 identifier`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.len);
        out.extend_from_slice(self.ids());
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.u8()?);
        if len == 0 || len > MAX_OFFERED {
            return Err(DecodeError::Invalid("AEAD offer length"));
        }
        let mut ids = [0u8; MAX_OFFERED];
        for slot in &mut ids[..len] {
            *slot = r.u8()?;
        }
        Ok(AeadOffer {
            ids,
            len: len as u8,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    Short(ShortHeader),
    Hello(Hello),
    /// A Noise handshake message follows (`r` is left at the version field; the rest of
    /// the layout belongs to the security layer).
    HandshakeInit,
    HandshakeReply,
    Cookie,
    /// A HINT (`r` is left at the version field; [`parse_hint`] reads the layout, which
    /// depends on the receiver's knowledge of the sender's connection ID length).
    Hint,
}

/// Parses the header at the start of a datagram sent to a receiver without connection IDs;
/// `r` is left at the payload.
pub fn decode_header(r: &mut Reader<'_>) -> Result<Header, DecodeError> {
    decode_header_with_cid(r, 0)
}

/// Parses the header at the start of a datagram whose short header carries a connection ID
/// of `local_cid_len` bytes (the length this receiver chose).
pub fn decode_header_with_cid(
    r: &mut Reader<'_>,
    local_cid_len: usize,
) -> Result<Header, DecodeError> {
    let first = r.u8()?;
    if first & LONG_HEADER_BIT == 0 {
        return ShortHeader::decode(first, r, local_cid_len).map(Header::Short);
    }
    match first & !LONG_HEADER_BIT {
        LONG_TYPE_HELLO => Hello::decode(r).map(Header::Hello),
        LONG_TYPE_HANDSHAKE_INIT => Ok(Header::HandshakeInit),
        LONG_TYPE_HANDSHAKE_REPLY => Ok(Header::HandshakeReply),
        LONG_TYPE_COOKIE => Ok(Header::Cookie),
        LONG_TYPE_HINT => Ok(Header::Hint),
        _ => Err(DecodeError::Invalid("unknown long header type")),
    }
}

/// Decodes a whole datagram sent without packet protection (`security = "none"`): its
/// header and, for a short packet, every frame of its payload. A HELLO carries no frames.
/// This is the decoding `Association::handle_datagram` does before it touches any state,
/// exposed so fuzzers and property tests can drive it directly.
pub fn parse_packet(datagram: &[u8]) -> Result<(Header, Vec<Frame<'_>>), DecodeError> {
    parse_packet_with_cid(datagram, 0)
}

/// [`parse_packet`] for a receiver whose connection IDs are `local_cid_len` bytes long.
pub fn parse_packet_with_cid(
    datagram: &[u8],
    local_cid_len: usize,
) -> Result<(Header, Vec<Frame<'_>>), DecodeError> {
    let mut r = Reader::new(datagram);
    let header = decode_header_with_cid(&mut r, local_cid_len)?;
    let frames = match &header {
        Header::Hello(_)
        | Header::HandshakeInit
        | Header::HandshakeReply
        | Header::Cookie
        | Header::Hint => Vec::new(),
        Header::Short(s) => decode_payload(r.rest(), s.implicit_data)?,
    };
    Ok((header, frames))
}

/// What a HINT echoes of the short packet that triggered it (docs/PROTOCOL.md §3.3): every
/// byte is one the trigger carried in clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint<'a> {
    /// The trigger's first byte, as received.
    pub trigger_flags: u8,
    /// The trigger's connection ID.
    pub cid: &'a [u8],
    /// The trigger's truncated packet number, as many bytes as its flags say.
    pub pn: &'a [u8],
    /// The trigger's last bytes: the end of its AEAD tag.
    pub tag_tail: [u8; HINT_TAG_TAIL_LEN],
}

impl Hint<'_> {
    /// The truncated packet number and its length in bytes.
    pub fn packet_number(&self) -> (u64, usize) {
        let value = self.pn.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
        (value, self.pn.len())
    }
}

/// Bytes of a HINT for a trigger with a connection ID of `cid_len` bytes and a packet
/// number of `pn_len`.
pub fn hint_len(cid_len: usize, pn_len: usize) -> usize {
    HANDSHAKE_HEADER_LEN + 1 + cid_len + pn_len + HINT_TAG_TAIL_LEN
}

/// The packet-number length a short header's first byte names.
fn short_pn_len(first: u8) -> usize {
    usize::from((first & PN_LEN_MASK) >> PN_LEN_SHIFT) + 1
}

/// Writes into `out` the HINT answering `trigger`, a short packet whose connection ID is
/// `cid_len` bytes. False (and nothing written) unless the trigger is a short packet long
/// enough to be sealed: a header, one byte of payload and an AEAD tag of `tag_len`. The
/// hint is then always smaller than its trigger.
pub fn encode_hint(trigger: &[u8], cid_len: usize, tag_len: usize, out: &mut Vec<u8>) -> bool {
    out.clear();
    let Some(&first) = trigger.first() else {
        return false;
    };
    if first & LONG_HEADER_BIT != 0 || cid_len == 0 {
        return false;
    }
    let pn_len = short_pn_len(first);
    let header = 1 + cid_len + pn_len;
    if trigger.len() < header + 1 + tag_len.max(HINT_TAG_TAIL_LEN) {
        return false;
    }
    out.push(LONG_HEADER_BIT | LONG_TYPE_HINT);
    out.extend_from_slice(&crate::PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&trigger[..header]);
    out.extend_from_slice(&trigger[trigger.len() - HINT_TAG_TAIL_LEN..]);
    if out.len() >= trigger.len() {
        out.clear();
        return false;
    }
    true
}

/// Reads a HINT sent by a gateway whose connection IDs are `cid_len` bytes long (the
/// length of the one we send it). Anything but exactly that layout is an error.
pub fn parse_hint(datagram: &[u8], cid_len: usize) -> Result<Hint<'_>, DecodeError> {
    let mut r = Reader::new(datagram);
    if r.u8()? != LONG_HEADER_BIT | LONG_TYPE_HINT {
        return Err(DecodeError::Invalid("not a hint"));
    }
    if r.u32()? != crate::PROTOCOL_VERSION {
        return Err(DecodeError::Invalid("hint of another version"));
    }
    let trigger_flags = r.u8()?;
    if trigger_flags & LONG_HEADER_BIT != 0 {
        return Err(DecodeError::Invalid("hint of a long header"));
    }
    let pn_len = short_pn_len(trigger_flags);
    if datagram.len() != hint_len(cid_len, pn_len) {
        return Err(DecodeError::Invalid("hint length"));
    }
    let cid = r.bytes(cid_len)?;
    let pn = r.bytes(pn_len)?;
    let mut tag_tail = [0u8; HINT_TAG_TAIL_LEN];
    tag_tail.copy_from_slice(r.bytes(HINT_TAG_TAIL_LEN)?);
    Ok(Hint {
        trigger_flags,
        cid,
        pn,
        tag_tail,
    })
}

/// The shard (a hub's worker, docs/PROTOCOL.md §8) a datagram's connection ID names: a
/// short packet's (byte 1 on), or a REPLY's or COOKIE's (after the version), both a
/// connection ID of this hub's choosing; an INIT carries the initiator's and a HELLO none,
/// so they are placed by their contents. The same bits `EndpointConfig::shard` sets.
pub fn shard_of(datagram: &[u8], cid_len: u8, shard_bits: u8) -> Option<usize> {
    if cid_len != 2 || shard_bits == 0 {
        return None;
    }
    let at = cid_at(*datagram.first()?)?;
    let cid: [u8; 2] = datagram.get(at..at + 2)?.try_into().ok()?;
    Some(usize::from(u16::from_be_bytes(cid) >> (16 - shard_bits)))
}

/// Where the connection ID of this hub's choosing starts in a datagram of first byte
/// `first`, if it carries one.
fn cid_at(first: u8) -> Option<usize> {
    if first & LONG_HEADER_BIT == 0 {
        return Some(1);
    }
    match first & !LONG_HEADER_BIT {
        LONG_TYPE_HANDSHAKE_REPLY | LONG_TYPE_COOKIE => Some(HANDSHAKE_HEADER_LEN),
        _ => None,
    }
}

/// Whether `datagram` is placed by its source address: a HELLO (security off: the address
/// is the peer's identity), or an INIT (from where its peer is known to be, its owner
/// screens it and answers a retransmitted copy with the same reply).
pub fn placed_by_address(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|&b| {
        b & LONG_HEADER_BIT != 0
            && matches!(
                b & !LONG_HEADER_BIT,
                LONG_TYPE_HELLO | LONG_TYPE_HANDSHAKE_INIT
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_packet_goes_to_the_shard_its_connection_id_names() {
        // Short header, CID 0xA0_01: top bit of 1 shard bit = 1, top 3 of 3 = 0b101.
        let short = [0x40, 0xA0, 0x01, 0xFF, 0xFF];
        assert_eq!(shard_of(&short, 2, 1), Some(1));
        assert_eq!(shard_of(&short, 2, 3), Some(5));
        let low = [0x40, 0x1F, 0xFF, 0x00];
        assert_eq!(shard_of(&low, 2, 1), Some(0));
        assert_eq!(shard_of(&low, 2, 3), Some(0));
        // One worker, no connection IDs, or too short to hold one: the reader keeps it.
        assert_eq!(shard_of(&short, 2, 0), None);
        assert_eq!(shard_of(&short, 0, 0), None);
        assert_eq!(shard_of(&[0x40, 0xA0], 2, 1), None);
        assert_eq!(shard_of(&[], 2, 1), None);
        // An INIT (the initiator's connection ID) and a HELLO are not placed by one.
        let init = [LONG_HEADER_BIT | 0x02, 0xFF, 0xFF, 0x00];
        assert_eq!(shard_of(&init, 2, 1), None);
        assert_eq!(
            shard_of(&[LONG_HEADER_BIT | LONG_TYPE_HELLO, 0xFF, 0xFF], 2, 1),
            None
        );
        // A REPLY or COOKIE to a hub-led handshake names the hub's connection ID after
        // the type byte and the version.
        for kind in [LONG_TYPE_HANDSHAKE_REPLY, LONG_TYPE_COOKIE] {
            let reply = [LONG_HEADER_BIT | kind, 0, 0, 0, 2, 0xA0, 0x01, 0xFF];
            assert_eq!(shard_of(&reply, 2, 1), Some(1));
            assert_eq!(shard_of(&reply, 2, 3), Some(5));
            assert_eq!(shard_of(&reply[..7], 2, 1), Some(1));
            assert_eq!(shard_of(&reply[..6], 2, 1), None, "too short for the CID");
            assert_eq!(shard_of(&reply, 2, 0), None);
        }
        assert!(placed_by_address(&[LONG_HEADER_BIT | LONG_TYPE_HELLO, 0]));
        assert!(placed_by_address(&init));
        assert!(!placed_by_address(&short));
        assert!(!placed_by_address(&[
            LONG_HEADER_BIT | LONG_TYPE_HANDSHAKE_REPLY,
            0
        ]));
    }

    #[test]
    fn short_header_roundtrip() {
        for cid in [
            ConnectionId::EMPTY,
            ConnectionId::new(&[0xa5, 0x01]).unwrap(),
        ] {
            short_header_roundtrip_with(cid);
        }
    }

    fn short_header_roundtrip_with(dcid: ConnectionId) {
        for pn_len in 1..=4 {
            for implicit_data in [
                None,
                Some(ImplicitData {
                    fin: true,
                    offset_len: 3,
                }),
            ] {
                let h = ShortHeader {
                    dcid,
                    pn_truncated: 0x0102_0304 & ((1u64 << (8 * pn_len)) - 1),
                    pn_len,
                    key_phase: pn_len % 2 == 0,
                    implicit_data,
                };
                let mut out = Vec::new();
                h.encode(&mut out);
                assert_eq!(out.len(), 1 + dcid.len() + pn_len);
                assert_eq!(out.len(), h.encoded_len());
                assert_eq!(&out[1..1 + dcid.len()], dcid.as_slice());
                let mut r = Reader::new(&out);
                assert_eq!(
                    decode_header_with_cid(&mut r, dcid.len()).unwrap(),
                    Header::Short(h)
                );
                assert!(r.is_empty());
            }
        }
    }

    #[test]
    fn hello_roundtrip_and_rejects_zero_epoch() {
        let h = Hello {
            version: 1,
            established: true,
            epoch: 42,
            echo: 7,
            params: HelloParams {
                initial_flow_window: 1 << 20,
                initial_assoc_window: 1 << 26,
                max_ack_delay_us: 50_000,
                reads_ack_times: true,
            },
            cid: ConnectionId::new(&[7, 9]).unwrap(),
            aeads: None,
            compression: None,
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(out[5], 0x03, "established and reads ACK times");
        assert_eq!(
            decode_header(&mut Reader::new(&out)).unwrap(),
            Header::Hello(h)
        );
        // A gateway that predates ACK times leaves flags bit 1 clear.
        let mut from_older = out.clone();
        from_older[5] = 0x01;
        let Header::Hello(older) = decode_header(&mut Reader::new(&from_older)).unwrap() else {
            panic!("not a HELLO");
        };
        assert!(!older.params.reads_ack_times);
        // The AEAD offer follows the CID; then the compression offer, and bytes after it
        // stay reserved and are ignored.
        let offered = Hello {
            aeads: Some(AeadOffer::auto(true)),
            ..h
        };
        let mut with_offer = Vec::new();
        offered.encode(&mut with_offer);
        assert_eq!(with_offer.len(), out.len() + 3);
        assert_eq!(with_offer[..out.len()], out[..]);
        assert_eq!(
            decode_header(&mut Reader::new(&with_offer)).unwrap(),
            Header::Hello(offered)
        );
        // The compression offer follows the AEAD offer: without security, after the AEAD
        // offer of a gateway without one.
        let compressing = Hello {
            compression: Some(CompressionOffer::zstd(17)),
            ..offered
        };
        let mut with_compression = Vec::new();
        compressing.encode(&mut with_compression);
        assert_eq!(with_compression[..with_offer.len()], with_offer[..]);
        assert_eq!(with_compression[with_offer.len()..], [1, 1, 17]);
        with_compression.extend_from_slice(&[0xEE, 0xEE]);
        assert_eq!(
            decode_header(&mut Reader::new(&with_compression)).unwrap(),
            Header::Hello(compressing)
        );
        let plain = Hello {
            compression: Some(CompressionOffer::zstd(16)),
            ..h
        };
        let mut plain_out = Vec::new();
        plain.encode(&mut plain_out);
        assert_eq!(plain_out[out.len()..], [1, 1, 1, 1, 16]);
        assert_eq!(
            decode_header(&mut Reader::new(&plain_out)).unwrap(),
            Header::Hello(Hello {
                aeads: Some(AeadOffer::implied()),
                ..plain
            })
        );
        let mut malformed = out.clone();
        malformed.push(0);
        assert!(decode_header(&mut Reader::new(&malformed)).is_err());
        let mut malformed = with_offer.clone();
        malformed.extend_from_slice(&[1, 1, 3]);
        assert!(decode_header(&mut Reader::new(&malformed)).is_err());
        let mut zero = h;
        zero.epoch = 0;
        out.clear();
        zero.encode(&mut out);
        assert!(decode_header(&mut Reader::new(&out)).is_err());
    }

    #[test]
    fn parse_packet_decodes_header_and_every_frame() {
        let h = ShortHeader {
            dcid: ConnectionId::EMPTY,
            pn_truncated: 7,
            pn_len: 2,
            key_phase: false,
            implicit_data: None,
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        // A header alone is an empty packet, which the receive path drops.
        assert!(parse_packet(&out).is_err());
        crate::frame::encode_ping(&mut out);
        crate::frame::encode_assoc_credit(&mut out, 99);
        let (header, frames) = parse_packet(&out).unwrap();
        assert_eq!(header, Header::Short(h));
        assert_eq!(
            frames,
            vec![Frame::Ping, Frame::AssocCredit { max_bytes: 99 }]
        );
    }

    #[test]
    fn stray_data_flags_are_rejected() {
        assert!(decode_header(&mut Reader::new(&[0x01, 0x00])).is_err());
    }
}
