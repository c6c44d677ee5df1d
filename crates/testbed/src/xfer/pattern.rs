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
}
