//! The block format of a compressed flow (docs/PROTOCOL.md §9), and building blocks:
//!
//! ```text
//! raw:   u8 0 | u32 length            | length bytes, as they are
//! zstd:  u8 1 | u32 length | u32 size | length bytes of zstd frames that decode to size bytes
//! ```
//!
//! Big-endian. A zstd block's payload is no longer than its content (else it goes raw) and
//! at least `size / MAX_RATIO` bytes long, padded with a zstd skippable frame where the data
//! shrank more than that: the receiver's work and memory per byte on the wire are bounded.

use crate::zstd_context;

pub const KIND_RAW: u8 = 0;
pub const KIND_ZSTD: u8 = 1;

/// Header of a raw block: kind and length.
pub const RAW_HEADER: usize = 5;
/// Header of a zstd block: kind, length and the size it decodes to.
pub const ZSTD_HEADER: usize = 9;

/// Most bytes a zstd block may decode to per byte of its payload. A receiver refuses more
/// (a "bomb"); a sender pads the payload up to it. 256: text shrinks 3 to 10 times, logs
/// of repeated lines a few tens of times; a run of zeros (4,000 times at zstd level 1) is
/// padded to 512 bytes per 128 KiB, still a 256th of its size on the link.
pub const MAX_RATIO: usize = 256;

/// zstd's skippable frame: magic `0x184D2A50` (little-endian), a 4-byte length, that many
/// bytes the decoder skips.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;
const SKIPPABLE_HEADER: usize = 8;

/// How hard to compress a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// zstd level 1: 600 MB/s per core on text, about 4.5 times smaller in 128 KiB blocks.
    Fast,
    /// zstd level 6: 140 MB/s, about 5.1 times smaller; used while a flow waits on the link.
    Hard,
}

impl Level {
    pub const ALL: [Level; 2] = [Level::Fast, Level::Hard];

    pub fn zstd_level(self) -> i32 {
        match self {
            Level::Fast => 1,
            Level::Hard => 6,
        }
    }

    pub fn index(self) -> usize {
        match self {
            Level::Fast => 0,
            Level::Hard => 1,
        }
    }

    /// The `level` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Level::Fast => "fast",
            Level::Hard => "hard",
        }
    }
}

/// What a block built by [`encode_block`] turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Raw,
    Zstd,
}

/// Writes the header of a raw block of `len` bytes.
pub fn raw_header(len: usize) -> [u8; RAW_HEADER] {
    let mut h = [0u8; RAW_HEADER];
    h[0] = KIND_RAW;
    h[1..].copy_from_slice(&block_len(len).to_be_bytes());
    h
}

fn block_len(len: usize) -> u32 {
    debug_assert!(len <= u32::MAX as usize);
    len.min(u32::MAX as usize) as u32
}

/// Appends to `out` the block that carries `input` (1 byte to the agreed block size): zstd
/// at `level` when that comes out smaller than the raw block, raw otherwise (and always
/// with `level` `None`).
pub fn encode_block(input: &[u8], level: Option<Level>, out: &mut Vec<u8>) -> BlockKind {
    debug_assert!(!input.is_empty());
    if let Some(level) = level {
        if encode_zstd(input, level, out) {
            return BlockKind::Zstd;
        }
    }
    out.extend_from_slice(&raw_header(input.len()));
    out.extend_from_slice(input);
    BlockKind::Raw
}

/// A zstd block of `input` appended to `out`, if it is smaller than the raw block would be.
fn encode_zstd(input: &[u8], level: Level, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    // Room for the payload only up to the raw block's size: what does not fit there is not
    // worth sending compressed, and zstd stops as soon as it sees that.
    let room = (input.len() + RAW_HEADER).saturating_sub(ZSTD_HEADER);
    if room == 0 {
        return false;
    }
    out.resize(start + ZSTD_HEADER + room, 0);
    let payload_at = start + ZSTD_HEADER;
    let Ok(mut n) = zstd_context::compress(input, level.zstd_level(), &mut out[payload_at..])
    else {
        out.truncate(start);
        return false;
    };
    let least = input.len().div_ceil(MAX_RATIO);
    if n < least {
        // Pad to the least payload the receiver takes for this size, with a skippable frame.
        let pad = (least - n).max(SKIPPABLE_HEADER);
        out.truncate(payload_at + n);
        out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
        out.extend_from_slice(&((pad - SKIPPABLE_HEADER) as u32).to_le_bytes());
        out.resize(payload_at + n + pad, 0);
        n += pad;
    }
    if n >= room {
        out.truncate(start);
        return false;
    }
    out.truncate(payload_at + n);
    out[start] = KIND_ZSTD;
    out[start + 1..start + 5].copy_from_slice(&block_len(n).to_be_bytes());
    out[start + 5..start + 9].copy_from_slice(&block_len(input.len()).to_be_bytes());
    true
}

/// How much smaller `data` gets in blocks of `block` bytes, each compressed at `level` as
/// pepd compresses them (a block goes raw where that is smaller): its size over the bytes
/// of all the blocks. What the testbed prints beside a result on that data.
pub fn offline_ratio(data: &[u8], block: usize, level: Level) -> f64 {
    let mut out = Vec::with_capacity(block + ZSTD_HEADER);
    let mut total = 0usize;
    for chunk in data.chunks(block.max(1)) {
        out.clear();
        encode_block(chunk, Some(level), &mut out);
        total += out.len();
    }
    if total == 0 {
        1.0
    } else {
        data.len() as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::Decoder;
    use bytes::Bytes;

    fn decode_all(stream: &[u8], max_block: usize) -> Vec<u8> {
        let mut d = Decoder::new(max_block);
        let mut got = Vec::new();
        d.feed(Bytes::copy_from_slice(stream), &mut |b: Bytes| {
            got.extend_from_slice(&b)
        })
        .expect("decodes");
        d.finish().expect("ends on a block boundary");
        got
    }

    fn text(len: usize) -> Vec<u8> {
        let words = [
            "satellite ",
            "link ",
            "gateway ",
            "flow ",
            "block ",
            "zstd ",
        ];
        let mut x = 7u64;
        let mut v = Vec::with_capacity(len + 16);
        while v.len() < len {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            v.extend_from_slice(words[(x >> 60) as usize % words.len()].as_bytes());
        }
        v.truncate(len);
        v
    }

    #[test]
    fn text_goes_compressed_and_random_goes_raw_at_one_header_more() {
        for level in Level::ALL {
            let t = text(100_000);
            let mut out = Vec::new();
            assert_eq!(encode_block(&t, Some(level), &mut out), BlockKind::Zstd);
            assert!(out.len() * 3 < t.len(), "{level:?}: {}", out.len());
            assert_eq!(out[0], KIND_ZSTD);
            assert_eq!(decode_all(&out, 1 << 17), t);

            let mut x = 1u64;
            let random: Vec<u8> = (0..100_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut out = Vec::new();
            assert_eq!(encode_block(&random, Some(level), &mut out), BlockKind::Raw);
            assert_eq!(out.len(), random.len() + RAW_HEADER);
            assert_eq!(decode_all(&out, 1 << 17), random);
        }
        // One byte: never worth a zstd header.
        let mut out = Vec::new();
        assert_eq!(
            encode_block(b"x", Some(Level::Fast), &mut out),
            BlockKind::Raw
        );
        assert_eq!(out, [0, 0, 0, 0, 1, b'x']);
    }

    #[test]
    fn data_that_shrinks_beyond_the_ratio_is_padded_to_it() {
        let zeros = vec![0u8; 1 << 17];
        for level in Level::ALL {
            let mut out = Vec::new();
            assert_eq!(encode_block(&zeros, Some(level), &mut out), BlockKind::Zstd);
            let payload = out.len() - ZSTD_HEADER;
            assert_eq!(payload, zeros.len() / MAX_RATIO, "{level:?}");
            assert_eq!(decode_all(&out, 1 << 17), zeros);
        }
    }

    #[test]
    fn offline_ratio_counts_every_block_as_sent() {
        let t = text(300_000);
        let r = offline_ratio(&t, 1 << 17, Level::Hard);
        assert!(r > 3.0, "{r}");
        let mut total = 0;
        for c in t.chunks(1 << 17) {
            let mut out = Vec::new();
            encode_block(c, Some(Level::Hard), &mut out);
            total += out.len();
        }
        assert_eq!(r, t.len() as f64 / total as f64);
        assert_eq!(offline_ratio(&[], 1 << 17, Level::Fast), 1.0);
    }
}
