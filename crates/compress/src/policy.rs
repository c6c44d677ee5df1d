//! What one direction of one flow does with its next block: raw, zstd fast, or zstd hard.
//!
//! - **Does it shrink?** A flow starts by compressing one block as a sample. Data that does
//!   not shrink by at least 1/16 (encrypted, already compressed) goes raw for a while and is
//!   sampled again after 1 MiB, then 2, 4 … up to 64 MiB of raw data; data that shrinks
//!   resets that to 1 MiB. A TLS record header at the start of the direction skips the first
//!   sample: TLS goes raw from its first byte. Blocks under 4 KiB that do not shrink decide
//!   nothing (a short request says nothing about what follows).
//! - **How hard?** While the flow waits on the link (more of it is buffered to send than the
//!   link carries in a round trip and 100 ms), the hardest level whose CPU time per byte is at
//!   most half the link time it saves per byte; on a fast link that is the fast level or none.
//!   While it does not wait on the link, the fast level if the application's data ran out
//!   before the block was full (the CPU has time to spare), and none if it did not: then the
//!   CPU, not the link, is what limits the flow.

use crate::block::Level;

/// Raw bytes after which data that did not shrink is sampled again, at first.
pub const FIRST_RETRY: u64 = 1 << 20;
/// The longest wait between samples of data that keeps not shrinking.
pub const LAST_RETRY: u64 = 64 << 20;
/// Blocks in a row that do not shrink after which a compressing flow goes raw.
const MISSES_TO_RAW: u32 = 4;
/// The least a block must hold to tell whether the data shrinks: a request of a few dozen
/// bytes does not shrink by 1/16 whatever it is.
pub const SAMPLE_MIN: usize = 4096;

/// What the relay sees when it builds a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signals {
    /// The flow waits on the link: more is buffered to send than the link carries in a
    /// round trip and a bit.
    pub link_bound: bool,
    /// The application's data ran out before the last block was full.
    pub source_drained: bool,
    /// What the link carries now for this association (its pacing rate), bit/s.
    pub link_bps: u64,
}

/// The relay's next block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Raw,
    Zstd(Level),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The next block is a sample (compressed at the fast level).
    Sample,
    Compress {
        misses: u32,
    },
    /// Raw until `left` more bytes went.
    Skip {
        left: u64,
    },
}

/// One direction of one flow.
#[derive(Debug, Clone)]
pub struct Policy {
    phase: Phase,
    retry: u64,
    /// CPU time per input byte at each level (nanoseconds, moving average).
    cost_ns: [f64; 2],
    /// Input over output of the compressed blocks (moving average).
    ratio: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new()
    }
}

/// Whether `data` starts with a TLS record header: content type 20–23, version 3.0–3.4, a
/// length up to 2^14 + 2048.
pub fn looks_like_tls(data: &[u8]) -> bool {
    match data {
        [kind, 3, minor, hi, lo, ..] => {
            (20..=23).contains(kind)
                && *minor <= 4
                && u16::from_be_bytes([*hi, *lo]) <= (1 << 14) + 2048
        }
        _ => false,
    }
}

impl Policy {
    pub fn new() -> Policy {
        Policy {
            phase: Phase::Sample,
            retry: FIRST_RETRY,
            // zstd on this project's 2-core test machines, 128 KiB blocks of text: level 1
            // about 600 MB/s, level 6 about 140 MB/s. Replaced by what each flow measures.
            cost_ns: [1.7, 7.0],
            ratio: 2.0,
        }
    }

    /// The first bytes of the direction: a TLS record goes raw without a sample.
    pub fn first_bytes(&mut self, data: &[u8]) {
        if matches!(self.phase, Phase::Sample) && looks_like_tls(data) {
            self.skip();
        }
    }

    /// The next block's treatment.
    pub fn choose(&self, s: Signals) -> Choice {
        match self.phase {
            Phase::Skip { .. } => Choice::Raw,
            Phase::Sample => Choice::Zstd(Level::Fast),
            Phase::Compress { .. } if s.link_bound => {
                // Link time one input byte no longer takes once compressed.
                let saved_ns = (1.0 - 1.0 / self.ratio.max(1.0)) * 8e9 / s.link_bps.max(1) as f64;
                [Level::Hard, Level::Fast]
                    .into_iter()
                    .find(|l| self.cost_ns[l.index()] * 2.0 <= saved_ns)
                    .map_or(Choice::Raw, Choice::Zstd)
            }
            Phase::Compress { .. } if s.source_drained => Choice::Zstd(Level::Fast),
            Phase::Compress { .. } => Choice::Raw,
        }
    }

    /// A block of `input` bytes was compressed at `level` in `elapsed_ns` to `output` bytes
    /// (the whole block as sent, raw when that was smaller).
    pub fn compressed(&mut self, level: Level, input: usize, output: usize, elapsed_ns: u64) {
        if input == 0 {
            return;
        }
        let cost = &mut self.cost_ns[level.index()];
        *cost = 0.75 * *cost + 0.25 * (elapsed_ns as f64 / input as f64);
        let ratio = input as f64 / output.max(1) as f64;
        self.ratio = 0.75 * self.ratio + 0.25 * ratio;
        let shrank = output * 16 <= input * 15;
        if input < SAMPLE_MIN && !shrank {
            return;
        }
        match self.phase {
            Phase::Sample if shrank => {
                self.retry = FIRST_RETRY;
                self.phase = Phase::Compress { misses: 0 };
            }
            Phase::Sample => self.skip(),
            Phase::Compress { .. } if shrank => {
                self.retry = FIRST_RETRY;
                self.phase = Phase::Compress { misses: 0 };
            }
            Phase::Compress { misses } if misses + 1 >= MISSES_TO_RAW => self.skip(),
            Phase::Compress { misses } => self.phase = Phase::Compress { misses: misses + 1 },
            Phase::Skip { .. } => {}
        }
    }

    /// `input` bytes went raw by choice.
    pub fn sent_raw(&mut self, input: usize) {
        if let Phase::Skip { left } = self.phase {
            let left = left.saturating_sub(input as u64);
            self.phase = if left == 0 {
                Phase::Sample
            } else {
                Phase::Skip { left }
            };
        }
    }

    /// Whether the direction is sending raw because its data did not shrink.
    pub fn skipping(&self) -> bool {
        matches!(self.phase, Phase::Skip { .. })
    }

    fn skip(&mut self) {
        self.phase = Phase::Skip { left: self.retry };
        self.retry = (self.retry * 2).min(LAST_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAWSON: Signals = Signals {
        link_bound: true,
        source_drained: false,
        link_bps: 1_544_000,
    };

    #[test]
    fn data_that_shrinks_is_compressed_hard_on_a_slow_link() {
        let mut p = Policy::new();
        assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Fast), "the sample");
        p.compressed(Level::Fast, 131_072, 29_000, 220_000);
        assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Hard));
        p.compressed(Level::Hard, 131_072, 25_000, 930_000);
        assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Hard));
        // Not waiting on the link: fast while the application's data runs out, none while
        // it does not (the CPU is the limit).
        let idle = Signals {
            link_bound: false,
            source_drained: true,
            ..LAWSON
        };
        assert_eq!(p.choose(idle), Choice::Zstd(Level::Fast));
        let busy = Signals {
            source_drained: false,
            ..idle
        };
        assert_eq!(p.choose(busy), Choice::Raw);
    }

    #[test]
    fn a_fast_link_gets_only_what_the_cpu_can_afford() {
        let mut p = Policy::new();
        p.compressed(Level::Fast, 131_072, 29_000, 220_000);
        // 1 Gbit/s: a byte of link time is 8 ns; at ratio 4.5 compressing saves 6.2 ns per
        // input byte, half of it 3.1: level 1 (1.7) yes, level 6 (7) no.
        let gigabit = Signals {
            link_bps: 1_000_000_000,
            ..LAWSON
        };
        assert_eq!(p.choose(gigabit), Choice::Zstd(Level::Fast));
        // 10 Gbit/s: neither.
        let ten = Signals {
            link_bps: 10_000_000_000,
            ..LAWSON
        };
        assert_eq!(p.choose(ten), Choice::Raw);
    }

    #[test]
    fn data_that_does_not_shrink_goes_raw_and_is_sampled_ever_less_often() {
        let mut p = Policy::new();
        let mut raw_between_samples = Vec::new();
        for _ in 0..10 {
            assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Fast));
            p.compressed(Level::Fast, 65_536, 65_541, 20_000);
            let mut raw = 0u64;
            while p.choose(LAWSON) == Choice::Raw {
                p.sent_raw(65_536);
                raw += 65_536;
            }
            raw_between_samples.push(raw);
        }
        assert_eq!(
            raw_between_samples,
            [1, 2, 4, 8, 16, 32, 64, 64, 64, 64].map(|m| m << 20)
        );
        // Once it shrinks again, back to compressing and to the first retry after misses.
        p.compressed(Level::Fast, 65_536, 20_000, 100_000);
        assert!(!p.skipping());
        for _ in 0..MISSES_TO_RAW {
            assert_ne!(p.choose(LAWSON), Choice::Raw);
            p.compressed(Level::Hard, 65_536, 65_000, 100_000);
        }
        assert!(p.skipping());
        let mut raw = 0;
        while p.choose(LAWSON) == Choice::Raw {
            p.sent_raw(4096);
            raw += 4096;
        }
        assert_eq!(raw, FIRST_RETRY);
    }

    #[test]
    fn short_blocks_that_do_not_shrink_decide_nothing() {
        let mut p = Policy::new();
        for _ in 0..10 {
            p.compressed(Level::Fast, 40, 45, 1_000);
            assert_eq!(
                p.choose(LAWSON),
                Choice::Zstd(Level::Fast),
                "still sampling"
            );
        }
        p.compressed(Level::Fast, 65_536, 20_000, 100_000);
        for _ in 0..10 {
            p.compressed(Level::Hard, 300, 305, 1_000);
        }
        assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Hard));
    }

    #[test]
    fn tls_goes_raw_from_the_first_byte() {
        let client_hello = [22, 3, 1, 0x02, 0x00, 1, 0, 1, 0xfc, 3, 3];
        let app_data = [23, 3, 3, 0x40, 0x11];
        assert!(looks_like_tls(&client_hello));
        assert!(looks_like_tls(&app_data));
        assert!(!looks_like_tls(b"GET / HTTP/1.1\r\n"));
        assert!(!looks_like_tls(&[22, 3, 1]));
        assert!(!looks_like_tls(&[23, 3, 3, 0xff, 0xff]));
        let mut p = Policy::new();
        p.first_bytes(&client_hello);
        assert_eq!(p.choose(LAWSON), Choice::Raw);
        let mut p = Policy::new();
        p.first_bytes(b"GET / HTTP/1.1\r\n");
        assert_eq!(p.choose(LAWSON), Choice::Zstd(Level::Fast));
    }
}
