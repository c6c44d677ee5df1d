//! Reading the blocks a peer sends. Its bytes are hostile input: a block that is malformed,
//! bigger than the agreed block size, or that would decode to more than `MAX_RATIO` times
//! its payload is refused before anything is decompressed, and a payload that does not
//! decode to exactly the size its header announced is refused after. What it decodes is
//! bounded by the block size whatever the input; the caller resets only that flow.
//!
//! The caller takes from the flow only [`Decoder::want`] bytes at a time, so it never takes
//! more than the block in progress, and holds at most one block's payload and one block's
//! content per flow.

use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;

use crate::block::{KIND_RAW, KIND_ZSTD, MAX_RATIO, RAW_HEADER, ZSTD_HEADER};
use crate::zstd_context;

/// Why a flow's blocks were refused; each is counted under its [`reason`](Self::reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BlockError {
    #[error("unknown block kind {0}")]
    UnknownKind(u8),
    #[error("empty block")]
    Empty,
    #[error("block of {size} bytes above the agreed {max}")]
    OverBlock { size: usize, max: usize },
    #[error("block would decode to {size} bytes from {payload}: above {MAX_RATIO} times")]
    OverRatio { size: usize, payload: usize },
    #[error("zstd payload does not decode: {0}")]
    Corrupt(&'static str),
    #[error("zstd payload decodes to {got} bytes, its header said {expected}")]
    SizeMismatch { got: usize, expected: usize },
    #[error("the stream ended inside a block")]
    Truncated,
    #[error("blocks on a flow of an association that agreed on no compression")]
    NotAgreed,
}

impl BlockError {
    /// Every `reason` label, in the order the metrics list them.
    pub const REASONS: [&'static str; 7] = [
        "unknown_kind",
        "empty",
        "over_block",
        "over_ratio",
        "corrupt",
        "truncated",
        "not_agreed",
    ];

    /// The `reason` label of the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            BlockError::UnknownKind(_) => "unknown_kind",
            BlockError::Empty => "empty",
            BlockError::OverBlock { .. } => "over_block",
            BlockError::OverRatio { .. } => "over_ratio",
            BlockError::Corrupt(_) | BlockError::SizeMismatch { .. } => "corrupt",
            BlockError::Truncated => "truncated",
            BlockError::NotAgreed => "not_agreed",
        }
    }
}

#[derive(Debug)]
enum State {
    /// Gathering a header: `have` bytes of it in `header`.
    Header,
    /// Passing on the rest of a raw block.
    Raw { left: usize },
    /// Gathering a zstd payload of `length` bytes that decodes to `size`.
    Zstd { length: usize, size: usize },
}

/// One direction of one flow: the blocks the peer sends, as they come.
#[derive(Debug)]
pub struct Decoder {
    max_block: usize,
    state: State,
    header: [u8; ZSTD_HEADER],
    have: usize,
    /// The zstd payload gathered so far (capacity: the block's length, at most `max_block`).
    payload: Vec<u8>,
    decompressed: u64,
    decompress_time: Duration,
}

impl Decoder {
    /// For blocks of at most `max_block` bytes (the agreement's size).
    pub fn new(max_block: usize) -> Decoder {
        let max_block = max_block.max(1);
        Decoder {
            max_block,
            state: State::Header,
            header: [0; ZSTD_HEADER],
            have: 0,
            payload: Vec::new(),
            decompressed: 0,
            decompress_time: Duration::ZERO,
        }
    }

    /// Bytes to take from the flow next: the rest of the header, of the raw block or of the
    /// zstd payload in progress. Never 0.
    pub fn want(&self) -> usize {
        match self.state {
            State::Header => self.header_len() - self.have,
            State::Raw { left } => left,
            State::Zstd { length, .. } => length - self.payload.len(),
        }
    }

    fn header_len(&self) -> usize {
        if self.have > 0 && self.header[0] == KIND_ZSTD {
            ZSTD_HEADER
        } else if self.have > 0 {
            RAW_HEADER
        } else {
            1
        }
    }

    /// Memory the decoder holds: the zstd payload it gathers.
    pub fn held(&self) -> usize {
        self.payload.capacity()
    }

    /// Whether the stream may end here (between blocks).
    pub fn finish(&self) -> Result<(), BlockError> {
        match self.state {
            State::Header if self.have == 0 => Ok(()),
            _ => Err(BlockError::Truncated),
        }
    }

    /// Bytes decompressed and the time spent on it since the last call.
    pub fn take_decompressed(&mut self) -> (u64, Duration) {
        let r = (self.decompressed, self.decompress_time);
        self.decompressed = 0;
        self.decompress_time = Duration::ZERO;
        r
    }

    /// Takes `input` (any length: the caller should give at most [`want`](Self::want) to
    /// hold no more than one block) and hands each piece of the original stream it
    /// completes to `out`: raw bytes as they come, a zstd block once it is whole.
    pub fn feed(
        &mut self,
        mut input: Bytes,
        out: &mut impl FnMut(Bytes),
    ) -> Result<(), BlockError> {
        while !input.is_empty() {
            match self.state {
                State::Header => {
                    let n = (self.header_len() - self.have).min(input.len());
                    self.header[self.have..self.have + n].copy_from_slice(&input[..n]);
                    self.have += n;
                    let _ = input.split_to(n);
                    if self.have == self.header_len() && self.have > 1 {
                        self.start_block()?;
                    } else if self.have == 1 {
                        match self.header[0] {
                            KIND_RAW | KIND_ZSTD => {}
                            k => return Err(BlockError::UnknownKind(k)),
                        }
                    }
                }
                State::Raw { left } => {
                    let piece = input.split_to(left.min(input.len()));
                    let left = left - piece.len();
                    self.state = if left == 0 {
                        State::Header
                    } else {
                        State::Raw { left }
                    };
                    out(piece);
                }
                State::Zstd { length, size } => {
                    let n = (length - self.payload.len()).min(input.len());
                    self.payload.extend_from_slice(&input.split_to(n));
                    if self.payload.len() == length {
                        let content = self.decompress(size)?;
                        self.payload = Vec::new();
                        self.state = State::Header;
                        out(content);
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks a whole header and starts its block.
    fn start_block(&mut self) -> Result<(), BlockError> {
        let u32_at = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&self.header[i..i + 4]);
            u32::from_be_bytes(b) as usize
        };
        let length = u32_at(1);
        self.have = 0;
        if length == 0 {
            return Err(BlockError::Empty);
        }
        if length > self.max_block {
            return Err(BlockError::OverBlock {
                size: length,
                max: self.max_block,
            });
        }
        self.state = if self.header[0] == KIND_ZSTD {
            let size = u32_at(5);
            if size == 0 {
                return Err(BlockError::Empty);
            }
            if size > self.max_block {
                return Err(BlockError::OverBlock {
                    size,
                    max: self.max_block,
                });
            }
            if size > length.saturating_mul(MAX_RATIO) {
                return Err(BlockError::OverRatio {
                    size,
                    payload: length,
                });
            }
            self.payload = Vec::with_capacity(length);
            State::Zstd { length, size }
        } else {
            State::Raw { left: length }
        };
        Ok(())
    }

    fn decompress(&mut self, size: usize) -> Result<Bytes, BlockError> {
        let started = Instant::now();
        let mut content = vec![0u8; size];
        let got = zstd_context::decompress(&self.payload, &mut content)
            .map_err(|e| BlockError::Corrupt(zstd_reason(&e)))?;
        self.decompress_time += started.elapsed();
        if got != size {
            return Err(BlockError::SizeMismatch {
                got,
                expected: size,
            });
        }
        self.decompressed += size as u64;
        Ok(Bytes::from(content))
    }
}

/// zstd's error names are static strings; keep the one the context gave.
fn zstd_reason(e: &std::io::Error) -> &'static str {
    match e.get_ref().map(|inner| inner.to_string()) {
        Some(s) if s.contains("Destination buffer is too small") => {
            "decodes to more than announced"
        }
        Some(s) if s.contains("Unknown frame descriptor") => "not a zstd frame",
        _ => "zstd error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{encode_block, raw_header, Level};

    const MAX: usize = 1 << 17;

    fn feed_all(d: &mut Decoder, stream: &[u8], step: usize) -> Result<Vec<u8>, BlockError> {
        let mut got = Vec::new();
        for piece in stream.chunks(step.max(1)) {
            d.feed(Bytes::copy_from_slice(piece), &mut |b: Bytes| {
                got.extend_from_slice(&b)
            })?;
        }
        Ok(got)
    }

    fn zstd_block(header_size: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![KIND_ZSTD];
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        b.extend_from_slice(&header_size.to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn any_split_of_a_stream_of_blocks_decodes_to_the_original() {
        let mut original = Vec::new();
        let mut stream = Vec::new();
        for i in 0..20u32 {
            let part: Vec<u8> = format!("line {i} of a log that repeats itself\n")
                .repeat(1 + i as usize * 50)
                .into_bytes();
            let level = match i % 3 {
                0 => None,
                1 => Some(Level::Fast),
                _ => Some(Level::Hard),
            };
            encode_block(&part, level, &mut stream);
            original.extend_from_slice(&part);
        }
        for step in [1, 2, 5, 9, 100, 4096, stream.len()] {
            let mut d = Decoder::new(MAX);
            assert_eq!(feed_all(&mut d, &stream, step).unwrap(), original, "{step}");
            assert!(d.finish().is_ok());
            assert_eq!(d.held(), 0);
        }
        // Taking only what it wants gives the same, and never more than one block at once.
        let mut d = Decoder::new(MAX);
        let mut at = 0;
        let mut got = Vec::new();
        while at < stream.len() {
            let n = d.want().min(stream.len() - at);
            assert!(n > 0);
            d.feed(
                Bytes::copy_from_slice(&stream[at..at + n]),
                &mut |b: Bytes| {
                    assert!(b.len() <= MAX);
                    got.extend_from_slice(&b)
                },
            )
            .unwrap();
            assert!(d.held() <= MAX);
            at += n;
        }
        assert_eq!(got, original);
    }

    #[test]
    fn a_bomb_is_refused_before_anything_is_decompressed() {
        // A real zstd frame of 8 MiB of zeros: a few hundred bytes that claim little.
        let bomb = zstd::bulk::compress(&vec![0u8; 8 << 20], 19).unwrap();
        assert!(bomb.len() < 2000);
        // Announced at its real size: above the block size.
        let mut d = Decoder::new(MAX);
        assert_eq!(
            feed_all(&mut d, &zstd_block(8 << 20, &bomb), 7),
            Err(BlockError::OverBlock {
                size: 8 << 20,
                max: MAX
            })
        );
        // Announced within the block size but beyond the ratio for its payload.
        let small = zstd::bulk::compress(&vec![0u8; MAX], 19).unwrap();
        assert!(small.len() * MAX_RATIO < MAX);
        let mut d = Decoder::new(MAX);
        assert!(matches!(
            feed_all(&mut d, &zstd_block(MAX as u32, &small), 3),
            Err(BlockError::OverRatio { .. })
        ));
        // Padded up to the ratio but announcing less than it decodes to: zstd stops at the
        // end of the announced size.
        let mut padded = bomb.clone();
        padded.resize(MAX / MAX_RATIO + 1, 0);
        let mut d = Decoder::new(MAX);
        let r = feed_all(&mut d, &zstd_block(MAX as u32, &padded), 1000);
        assert!(matches!(r, Err(BlockError::Corrupt(_))), "{r:?}");
    }

    #[test]
    fn malformed_blocks_are_refused_with_their_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![7, 0, 0, 0, 1, 0], "unknown_kind"),
            (raw_header(0).to_vec(), "empty"),
            (raw_header(MAX + 1).to_vec(), "over_block"),
            (zstd_block(0, b"xx"), "empty"),
            (zstd_block(10, b"definitely not zstd"), "corrupt"),
            (zstd_block(MAX as u32 + 1, &[0; 4096]), "over_block"),
        ];
        for (stream, reason) in cases {
            let mut d = Decoder::new(MAX);
            let r = feed_all(&mut d, &stream, 3);
            assert_eq!(r.map_err(|e| e.reason()), Err(reason), "{stream:?}");
        }
        // A real frame whose content is not what the header says.
        let frame = zstd::bulk::compress(&[b'a'; 1000], 3).unwrap();
        let mut d = Decoder::new(MAX);
        assert_eq!(
            feed_all(&mut d, &zstd_block(1001, &frame), 5),
            Err(BlockError::SizeMismatch {
                got: 1000,
                expected: 1001
            })
        );
        let mut d = Decoder::new(MAX);
        assert!(matches!(
            feed_all(&mut d, &zstd_block(999, &frame), 5),
            Err(BlockError::Corrupt(_))
        ));
        // Ending inside a block.
        let mut stream = Vec::new();
        encode_block(b"hello", None, &mut stream);
        for cut in 1..stream.len() {
            let mut d = Decoder::new(MAX);
            feed_all(&mut d, &stream[..cut], 1).unwrap();
            assert_eq!(d.finish(), Err(BlockError::Truncated));
        }
    }

    #[test]
    fn a_frame_with_a_large_window_costs_no_memory_beyond_the_block() {
        // A frame written with a 1 MiB window and no content size: one-shot decoding writes
        // into the block's own buffer, so the window it declares allocates nothing.
        let mut c = zstd::bulk::Compressor::new(3).unwrap();
        c.include_contentsize(false).unwrap();
        c.window_log(20).unwrap();
        c.long_distance_matching(true).unwrap();
        let data: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
        let frame = c.compress(&data).unwrap();
        let mut d = Decoder::new(1 << 16);
        assert_eq!(feed_all(&mut d, &zstd_block(65_536, &frame), 100), Ok(data));
        assert!(
            crate::context_bytes() < 256 * 1024,
            "{}",
            crate::context_bytes()
        );
    }
}
