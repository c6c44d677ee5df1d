//! Byte-level encoding shared by packets and frames: QUIC-style variable-length integers and
//! truncated absolute numbers (packet numbers, stream offsets).
//!
//! Truncated numbers are absolute values with their high bits left off, recovered as the value
//! closest to a reference the receiver already holds. No field is a delta from a previous
//! packet, so any loss leaves the decoder in step.

use thiserror::Error;

/// Why bytes could not be decoded. Never a panic: every decoder returns one of these.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    #[error("packet truncated")]
    Truncated,
    #[error("unknown frame type {0:#04x}")]
    UnknownFrame(u8),
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// Largest value a varint can hold (2^62 - 1).
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// Cursor over received bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Moves past every byte equal to `byte` from here on.
    pub fn skip_run(&mut self, byte: u8) {
        self.pos += self.buf[self.pos..]
            .iter()
            .take_while(|&&b| b == byte)
            .count();
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// Big-endian unsigned integer of `n` (1..=8) bytes.
    pub fn uint(&mut self, n: usize) -> Result<u64, DecodeError> {
        let b = self.bytes(n)?;
        Ok(b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let first = self.u8()?;
        let len = 1usize << (first >> 6);
        let mut v = u64::from(first & 0x3f);
        for &b in self.bytes(len - 1)? {
            v = (v << 8) | u64::from(b);
        }
        Ok(v)
    }
}

pub fn varint_len(v: u64) -> usize {
    match v {
        0..=0x3f => 1,
        0x40..=0x3fff => 2,
        0x4000..=0x3fff_ffff => 4,
        _ => 8,
    }
}

/// Appends `v` as a varint. Values above [`VARINT_MAX`] are a caller bug and saturate.
pub fn put_varint(out: &mut Vec<u8>, v: u64) {
    let v = v.min(VARINT_MAX);
    match varint_len(v) {
        1 => out.push(v as u8),
        2 => out.extend_from_slice(&((v as u16) | 0x4000).to_be_bytes()),
        4 => out.extend_from_slice(&((v as u32) | 0x8000_0000).to_be_bytes()),
        _ => out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

/// Appends the low `n` bytes of `v`, big-endian.
pub fn put_uint(out: &mut Vec<u8>, v: u64, n: usize) {
    out.extend_from_slice(&v.to_be_bytes()[8 - n..]);
}

/// Fewest bytes (at most `max_bytes`) whose truncation of a value is unambiguous when the
/// receiver's reference can be anywhere within `span` of it: 2^(8n-1) must exceed `span`.
pub fn truncation_len(span: u64, max_bytes: usize) -> usize {
    (1..max_bytes)
        .find(|&n| span < 1u64 << (8 * n - 1))
        .unwrap_or(max_bytes)
}

/// Recovers the absolute value whose low `n` bytes are `truncated`, choosing the candidate
/// closest to `reference` (the algorithm of RFC 9000 appendix A.3, generalised to any field).
pub fn expand_truncated(truncated: u64, n: usize, reference: u64) -> u64 {
    if n >= 8 {
        return truncated;
    }
    let win = 1u64 << (8 * n);
    let half = win / 2;
    let mask = win - 1;
    let candidate = (reference & !mask) | (truncated & mask);
    if candidate.saturating_add(half) <= reference && candidate <= u64::MAX - win {
        candidate + win
    } else if candidate > reference.saturating_add(half) && candidate >= win {
        candidate - win
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn varint_boundaries() {
        for v in [0, 63, 64, 16383, 16384, (1 << 30) - 1, 1 << 30, VARINT_MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
            assert_eq!(Reader::new(&out).varint().unwrap(), v);
        }
    }

    #[test]
    fn truncated_reader_errors() {
        assert_eq!(Reader::new(&[0x40]).varint(), Err(DecodeError::Truncated));
        assert_eq!(Reader::new(&[]).u8(), Err(DecodeError::Truncated));
    }

    #[test]
    fn truncation_len_picks_the_smallest_safe_size() {
        assert_eq!(truncation_len(0, 4), 1);
        assert_eq!(truncation_len(127, 4), 1);
        assert_eq!(truncation_len(128, 4), 2);
        assert_eq!(truncation_len((1 << 23) - 1, 4), 3);
        assert_eq!(truncation_len(1 << 23, 4), 4);
    }

    #[test]
    fn rfc9000_example() {
        assert_eq!(expand_truncated(0x9b32, 2, 0xa82f30eb), 0xa82f9b32);
    }

    #[test]
    fn packet_numbers_do_not_wrap_past_32_bits() {
        // A 10 GB transfer at 1448 bytes per packet needs ~7.4 million packet numbers; cross
        // the 2^32 edge explicitly with a 1-byte truncation and a 2-byte one.
        let base: u64 = (1 << 32) - 3;
        for pn in base..base + 300 {
            let reference = pn - 50;
            let n = truncation_len(pn - reference, 4);
            assert_eq!(
                expand_truncated(pn & ((1 << (8 * n)) - 1), n, reference + 1),
                pn
            );
        }
    }

    proptest! {
        #[test]
        fn truncated_roundtrip(value in 0u64..(1 << 62), behind in 0u64..(1 << 31), ahead in 0u64..(1 << 31)) {
            // Reference anywhere within the span the sender accounted for.
            let span = behind.max(ahead);
            let n = truncation_len(span, 4);
            prop_assume!(span < 1u64 << (8 * n - 1));
            let reference = if value >= behind { value - behind } else { value + ahead };
            let t = value & ((1u64 << (8 * n)) - 1);
            prop_assert_eq!(expand_truncated(t, n, reference), value);
        }

        #[test]
        fn varint_roundtrip(v in 0u64..=VARINT_MAX) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out);
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert!(r.is_empty());
        }
    }
}
