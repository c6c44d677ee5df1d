//! The seeded pseudo-random byte stream every transfer carries, so receivers can verify every
//! byte without the sender shipping checksums. Generated in fixed blocks, so the stream is the
//! same however reads and writes split it.

use pep_sim::channel::{seeded_rng, SeededRng};
use rand::RngCore;

const BLOCK: usize = 16 * 1024;

pub struct Pattern {
    rng: SeededRng,
    block: Box<[u8; BLOCK]>,
    pos: usize,
}

impl Pattern {
    /// Stream `lane` (e.g. 0 upstream, 1 downstream) of connection seed `seed`.
    pub fn new(seed: u64, lane: u64) -> Pattern {
        Pattern {
            rng: seeded_rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ lane),
            block: Box::new([0; BLOCK]),
            pos: BLOCK,
        }
    }

    /// Next bytes of the stream into `out`.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            if self.pos == BLOCK {
                self.rng.fill_bytes(&mut self.block[..]);
                self.pos = 0;
            }
            let n = (BLOCK - self.pos).min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.block[self.pos..self.pos + n]);
            self.pos += n;
            done += n;
        }
    }

    /// Whether `got` is the next part of the stream (consumes it either way).
    pub fn verify(&mut self, got: &[u8]) -> bool {
        let mut ok = true;
        let mut done = 0;
        while done < got.len() {
            if self.pos == BLOCK {
                self.rng.fill_bytes(&mut self.block[..]);
                self.pos = 0;
            }
            let n = (BLOCK - self.pos).min(got.len() - done);
            ok &= got[done..done + n] == self.block[self.pos..self.pos + n];
            self.pos += n;
            done += n;
        }
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
}
