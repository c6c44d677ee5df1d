//! The byte stream every transfer carries, so receivers can verify every byte without the
//! sender shipping checksums: seeded pseudo-random bytes generated in fixed blocks (the same
//! however reads and writes split it), or a corpus of real text (`corpus`) from a seeded
//! offset. The top two bits of a seed name the content ([`Content::seed`]), so the seed in
//! a transfer's header tells the server what to send.

use std::sync::Arc;

use pep_sim::channel::{seeded_rng, SeededRng};
use rand::RngCore;

use crate::corpus::{self, Content};

const BLOCK: usize = 16 * 1024;
const CONTENT_SHIFT: u32 = 62;

impl Content {
    /// `seed` marked as carrying this content (its low 62 bits stay the seed).
    pub fn seed(self, seed: u64) -> u64 {
        let tag = match self {
            Content::Random => 0,
            Content::Text => 1,
            Content::Compressed => 2,
        };
        (seed & ((1 << CONTENT_SHIFT) - 1)) | (tag << CONTENT_SHIFT)
    }

    /// The content a seed names.
    pub fn of_seed(seed: u64) -> Content {
        match seed >> CONTENT_SHIFT {
            1 => Content::Text,
            2 => Content::Compressed,
            _ => Content::Random,
        }
    }
}

pub struct Pattern {
    source: Source,
}

enum Source {
    Random {
        rng: SeededRng,
        block: Box<[u8; BLOCK]>,
        pos: usize,
    },
    Corpus {
        bytes: Arc<[u8]>,
        pos: usize,
    },
}

impl Pattern {
    /// Stream `lane` (e.g. 0 upstream, 1 downstream) of connection seed `seed`. Panics if
    /// the seed names a corpus this machine cannot build (the runner builds it first and
    /// reports why).
    pub fn new(seed: u64, lane: u64) -> Pattern {
        let mix = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ lane;
        let source = match corpus::get(Content::of_seed(seed)) {
            Ok(Some(c)) => Source::Corpus {
                bytes: c.bytes.clone(),
                pos: (mix.wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 16) as usize
                    % c.bytes.len().max(1),
            },
            Ok(None) => Source::Random {
                rng: seeded_rng(mix),
                block: Box::new([0; BLOCK]),
                pos: BLOCK,
            },
            Err(e) => panic!("{e}"),
        };
        Pattern { source }
    }

    /// The next `n` bytes of the stream, given to `f` piece by piece.
    fn next(&mut self, mut n: usize, mut f: impl FnMut(&[u8])) {
        while n > 0 {
            match &mut self.source {
                Source::Random { rng, block, pos } => {
                    if *pos == BLOCK {
                        rng.fill_bytes(&mut block[..]);
                        *pos = 0;
                    }
                    let k = (BLOCK - *pos).min(n);
                    f(&block[*pos..*pos + k]);
                    *pos += k;
                    n -= k;
                }
                Source::Corpus { bytes, pos } => {
                    if *pos >= bytes.len() {
                        *pos = 0;
                    }
                    let k = (bytes.len() - *pos).min(n);
                    f(&bytes[*pos..*pos + k]);
                    *pos += k;
                    n -= k;
                }
            }
        }
    }

    /// Next bytes of the stream into `out`.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut done = 0;
        self.next(out.len(), |piece| {
            out[done..done + piece.len()].copy_from_slice(piece);
            done += piece.len();
        });
    }

    /// Whether `got` is the next part of the stream (consumes it either way).
    pub fn verify(&mut self, got: &[u8]) -> bool {
        let mut ok = true;
        let mut done = 0;
        self.next(got.len(), |piece| {
            ok &= got[done..done + piece.len()] == *piece;
            done += piece.len();
        });
        ok
    }
}

/// FNV-1a (64 bit) over a byte stream: a digest both ends can compare, and one a test can
/// recompute from the pattern on its own, independently of the receiver's verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn value(self) -> u64 {
        self.0
    }

    pub fn from_value(v: u64) -> Digest {
        Digest(v)
    }

    /// 16 lowercase hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Digest of the first `len` bytes of stream `lane` of `seed`: what an intact transfer of
/// that stream must produce.
pub fn expected_digest(seed: u64, lane: u64, len: u64) -> Digest {
    let mut p = Pattern::new(seed, lane);
    let mut d = Digest::default();
    let mut buf = vec![0u8; BLOCK];
    let mut left = len;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        p.fill(&mut buf[..n]);
        d.update(&buf[..n]);
        left -= n as u64;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_independent_of_chunking_and_detects_changes() {
        let mut whole = vec![0u8; 50_000];
        Pattern::new(5, 1).fill(&mut whole);
        let mut v = Pattern::new(5, 1);
        for chunk in whole.chunks(777) {
            assert!(v.verify(chunk));
        }
        whole[33_333] ^= 1;
        let mut v = Pattern::new(5, 1);
        assert!(!v.verify(&whole));
        let mut other = vec![0u8; 64];
        Pattern::new(5, 0).fill(&mut other);
        assert_ne!(&other[..], &whole[..64]);
    }

    #[test]
    fn digest_is_fnv1a_and_matches_the_stream() {
        // FNV-1a 64 test vector: "a" -> af63dc4c8601ec8c.
        let mut d = Digest::default();
        d.update(b"a");
        assert_eq!(d.hex(), "af63dc4c8601ec8c");
        let mut whole = vec![0u8; 40_000];
        Pattern::new(9, 0).fill(&mut whole);
        let mut d = Digest::default();
        for c in whole.chunks(1000) {
            d.update(c);
        }
        assert_eq!(d, expected_digest(9, 0, 40_000));
        assert_ne!(d, expected_digest(9, 0, 39_999));
    }

    #[test]
    fn a_text_seed_streams_the_corpus_and_verifies_in_any_split() {
        let seed = Content::Text.seed(5);
        assert_eq!(Content::of_seed(seed), Content::Text);
        assert_eq!(Content::of_seed(5), Content::Random);
        assert_eq!(Content::Random.seed(5), 5);
        if corpus::get(Content::Text).is_err() {
            eprintln!("no Debian text corpus here: skipped");
            return;
        }
        // Longer than the corpus, so it wraps.
        let mut whole = vec![0u8; 3_000_000 + 77];
        Pattern::new(seed, 1).fill(&mut whole);
        assert!(whole.iter().all(|&b| b != 0));
        let mut v = Pattern::new(seed, 1);
        for chunk in whole.chunks(65_521) {
            assert!(v.verify(chunk));
        }
        whole[2_999_999] ^= 1;
        assert!(!Pattern::new(seed, 1).verify(&whole));
        let mut other = vec![0u8; 64];
        Pattern::new(seed, 0).fill(&mut other);
        assert_ne!(&other[..], &whole[..64], "lanes start elsewhere");
    }
}
