//! A datagram size that follows the error rate (docs/PROTOCOL.md §5.8).
//!
//! When bits fail independently, a packet of `w` bytes on the link survives with
//! probability `e^(−λw)`: corruption grows with size, and below some size the header and
//! per-packet overhead cost less than the corruption saves. When the link loses whole frames
//! (DVB-S2 behind its LDPC code: bursty, hardly dependent on the IP packet's size), shrinking
//! only costs overhead. The sender tells the two apart from its own loss attribution: a few
//! packets are sent at a second size, and the corruption rates of the two sizes are
//! compared. On a size-dependent link it picks the size that carries the most payload per
//! second of link time; otherwise, and on a clean link, the largest.

use std::time::{Duration, Instant};

/// Fewest bytes a datagram is cut to (about 140 of payload): below this the per-packet
/// overhead (44 bytes of UDP/IP and tag, plus the link's) eats what corruption spares.
pub const MIN_DATAGRAM: usize = 160;
/// Bytes of our own header and frame header in a full data packet (short header with a
/// 2-byte packet number, implicit DATA frame with a 1-byte flow and 2-byte offset), besides
/// the AEAD tag: what a datagram carries that is not payload.
pub const HEADER: usize = 6;
/// Every `PROBE_EVERY`-th data packet goes at the probe size, while losses make it worth it.
const PROBE_EVERY: u64 = 8;
/// The probe size is the current one divided (near the largest) or multiplied (below half of
/// it) by this: sizes must differ enough for their loss rates to tell the models apart.
const PROBE_RATIO: usize = 3;
/// Below this corruption rate at the current size probes tell nothing worth their overhead
/// (1 in 200 packets: a BER of about 4e-7 at 1500 bytes), and the largest size is within a
/// fraction of a per cent of the best.
const PROBE_MIN_LOSS: f64 = 0.005;
/// Loss counts fade with this time constant: long enough for a few hundred packets at
/// 1.5 Mb/s, short enough that a change of weather is followed within seconds.
const MEMORY: Duration = Duration::from_secs(4);
/// A size class counts once this many of its packets (faded) were resolved, and this many
/// lost: fewer say too little about a rate.
const MIN_RESOLVED: f64 = 40.0;
const MIN_LOST: f64 = 4.0;
/// The exponent `a` in −ln(survival) ∝ size^a: 1 for independent bit errors, 0 for losses
/// that do not depend on size. Above this, the link is taken for size-dependent.
const SIZE_DEPENDENT: f64 = 0.5;
/// Decisions at most this often, and only for a change of at least `MIN_CHANGE`: the size
/// does not oscillate.
const DECISION_INTERVAL: Duration = Duration::from_secs(2);
const MIN_CHANGE: f64 = 0.1;
/// Size classes (by bytes on the link) whose loss rates are kept, up to the largest
/// datagram the association sends: a hub keeps one sizer per terminal, and classes for
/// sizes never sent would be most of an idle association's memory (40 KiB for 64 KiB).
const CLASS_BYTES: usize = 64;

/// How the datagram size is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeMode {
    /// Follow the error rate (the default).
    Adaptive,
    /// Always this many bytes (at most the MTU's): `Fixed(usize::MAX)` is "the MTU".
    Fixed(usize),
}

/// Faded counts of one size class.
#[derive(Debug, Clone, Copy, Default)]
struct Class {
    resolved: f64,
    lost: f64,
    /// Sum of link bytes of the resolved packets, for their mean size.
    bytes: f64,
    at: Option<Instant>,
}

impl Class {
    fn fade(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            let keep = (-dt / MEMORY.as_secs_f64()).exp();
            self.resolved *= keep;
            self.lost *= keep;
            self.bytes *= keep;
        }
        self.at = Some(now);
    }

    fn loss(&self) -> f64 {
        if self.resolved > 0.0 {
            self.lost / self.resolved
        } else {
            0.0
        }
    }

    fn mean_bytes(&self) -> f64 {
        self.bytes / self.resolved.max(f64::MIN_POSITIVE)
    }

    fn counts(&self) -> bool {
        self.resolved >= MIN_RESOLVED && self.lost >= MIN_LOST
    }
}

/// The corruption seen at one size class, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassLoss {
    /// Smallest link size of the class, bytes.
    pub from_bytes: usize,
    /// Faded count of packets resolved (acknowledged or lost).
    pub resolved: f64,
    /// Fraction of them lost to corruption.
    pub loss: f64,
}

#[derive(Debug, Clone)]
pub struct DatagramSizer {
    mode: SizeMode,
    /// Most bytes the transport may write in a datagram (the MTU less UDP/IP and the tag
    /// allowance).
    max: usize,
    /// Bytes of a datagram that are not payload (header, frame header, AEAD tag).
    inside: usize,
    /// Bytes each datagram costs on the link beyond what the transport writes (UDP/IP, the
    /// link layer's own encapsulation).
    outside: usize,
    current: usize,
    classes: Vec<Class>,
    data_packets: u64,
    next_decision: Option<Instant>,
    changes: u64,
}

impl DatagramSizer {
    pub fn new(mode: SizeMode, max: usize, inside: usize, outside: usize) -> DatagramSizer {
        let current = match mode {
            SizeMode::Adaptive => max,
            SizeMode::Fixed(n) => n.clamp(MIN_DATAGRAM.min(max), max),
        };
        DatagramSizer {
            mode,
            max,
            inside,
            outside,
            current,
            classes: vec![Class::default(); 1 + (max + outside) / CLASS_BYTES],
            data_packets: 0,
            next_decision: None,
            changes: 0,
        }
    }

    /// The size data packets are cut to now.
    pub fn current(&self) -> usize {
        self.current
    }

    pub fn changes(&self) -> u64 {
        self.changes
    }

    fn class_of(&self, link_bytes: usize) -> usize {
        (link_bytes / CLASS_BYTES).min(self.classes.len() - 1)
    }

    fn link_bytes(&self, datagram: usize) -> usize {
        datagram + self.outside
    }

    fn probe_size(&self) -> usize {
        if self.current * 2 > self.max {
            (self.current / PROBE_RATIO).max(MIN_DATAGRAM)
        } else {
            (self.current * PROBE_RATIO).min(self.max)
        }
    }

    /// Whether losses at the current size are frequent enough for probes to tell anything.
    fn probing(&self) -> bool {
        self.mode == SizeMode::Adaptive
            && self.classes[self.class_of(self.link_bytes(self.current))].loss() >= PROBE_MIN_LOSS
    }

    /// The most bytes the next packet may carry if it carries data, and whether it is a
    /// probe at the second size. Call [`DatagramSizer::on_data_sent`] when it did.
    pub fn next_data_size(&self) -> (usize, bool) {
        if self.probing() && self.data_packets % PROBE_EVERY == PROBE_EVERY - 1 {
            (self.probe_size(), true)
        } else {
            (self.current, false)
        }
    }

    pub fn on_data_sent(&mut self) {
        self.data_packets += 1;
    }

    /// A data packet of `link` bytes on the link was acknowledged (`lost` false) or lost to
    /// corruption (`lost` true). Losses of other causes say nothing about the bit errors.
    pub fn on_resolved(&mut self, now: Instant, link: usize, lost: bool) {
        let i = self.class_of(link);
        let c = &mut self.classes[i];
        c.fade(now);
        c.resolved += 1.0;
        c.bytes += link as f64;
        if lost {
            c.lost += 1.0;
        }
        self.maybe_decide(now);
    }

    fn maybe_decide(&mut self, now: Instant) {
        if self.mode != SizeMode::Adaptive || self.next_decision.is_some_and(|t| now < t) {
            return;
        }
        self.next_decision = Some(now + DECISION_INTERVAL);
        for c in &mut self.classes {
            if c.resolved > 0.0 {
                c.fade(now);
            }
        }
        let Some(target) = self.target() else {
            return;
        };
        let target = target.clamp(MIN_DATAGRAM.min(self.max), self.max);
        let change = (target as f64 - self.current as f64).abs() / self.current as f64;
        if change >= MIN_CHANGE {
            self.current = target;
            self.changes += 1;
        }
    }

    /// The size the evidence calls for, or `None` while it says too little.
    fn target(&self) -> Option<usize> {
        let here = self.classes[self.class_of(self.link_bytes(self.current))];
        if here.resolved >= MIN_RESOLVED && here.loss() < PROBE_MIN_LOSS {
            // Clean enough that the largest size is within a fraction of a per cent of best.
            return Some(self.max);
        }
        // The two classes with the most counted evidence, apart enough in size.
        let mut counted: Vec<&Class> = self.classes.iter().filter(|c| c.counts()).collect();
        counted.sort_by(|a, b| b.resolved.total_cmp(&a.resolved));
        let (big, small) = counted.iter().copied().find_map(|a| {
            let b = counted.iter().copied().find(|b| {
                a.mean_bytes() >= 2.0 * b.mean_bytes() || b.mean_bytes() >= 2.0 * a.mean_bytes()
            })?;
            Some(if a.mean_bytes() > b.mean_bytes() {
                (a, b)
            } else {
                (b, a)
            })
        })?;
        let decay = |c: &Class| -(1.0 - c.loss()).max(f64::MIN_POSITIVE).ln();
        let exponent =
            (decay(big) / decay(small)).ln() / (big.mean_bytes() / small.mean_bytes()).ln();
        if !exponent.is_finite() || exponent < SIZE_DEPENDENT {
            return Some(self.max);
        }
        // Bit errors: corruption per byte on the link, from the class with most evidence.
        let best = if big.resolved >= small.resolved {
            big
        } else {
            small
        };
        let per_byte = decay(best) / best.mean_bytes();
        Some(self.best_size(per_byte))
    }

    /// The datagram size that carries the most payload per second of link time when each
    /// byte on the link is corrupted with probability `per_byte`: maximises
    /// `(d − I) · e^(−per_byte·(d + W)) / (d + W)`, with `I` the bytes inside that are not
    /// payload and `W` those outside, whose derivative vanishes at
    /// `(d − I)(d + W) = (W + I) / per_byte`.
    fn best_size(&self, per_byte: f64) -> usize {
        if per_byte <= 0.0 {
            return self.max;
        }
        let (i, w) = (self.inside as f64, self.outside as f64);
        let b = w - i;
        let c = -i * w - (w + i) / per_byte;
        let d = (-b + (b * b - 4.0 * c).sqrt()) / 2.0;
        if d.is_finite() && d >= 0.0 {
            d.round().min(self.max as f64) as usize
        } else {
            self.max
        }
    }

    /// The corruption rate of every class with evidence, for metrics.
    pub fn class_losses(&self) -> Vec<ClassLoss> {
        self.classes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.resolved >= 1.0)
            .map(|(i, c)| ClassLoss {
                from_bytes: i * CLASS_BYTES,
                resolved: c.resolved,
                loss: c.loss(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` packets of datagram `size` with a deterministic loss pattern of rate `p`.
    fn feed(s: &mut DatagramSizer, now: Instant, size: usize, n: u32, p: f64) {
        let mut debt = 0.0;
        for _ in 0..n {
            debt += p;
            let lost = debt >= 1.0;
            if lost {
                debt -= 1.0;
            }
            s.on_resolved(now, size + 44, lost);
        }
    }

    /// Plain datagrams of a 1500-byte MTU: 44 bytes outside, the header inside.
    fn sizer(mode: SizeMode) -> DatagramSizer {
        DatagramSizer::new(mode, 1456, HEADER, 44)
    }

    fn survival(per_byte: f64, link: usize) -> f64 {
        (-per_byte * link as f64).exp()
    }

    #[test]
    fn the_best_size_under_bit_errors_matches_a_search() {
        let s = sizer(SizeMode::Adaptive);
        for ber in [1e-6, 1e-5, 3e-5, 1e-4] {
            let per_byte = 8.0 * ber;
            let goodput =
                |d: usize| (d - HEADER) as f64 * survival(per_byte, d + 44) / (d + 44) as f64;
            let searched = (MIN_DATAGRAM..=1456).max_by(|&a, &b| goodput(a).total_cmp(&goodput(b)));
            let chosen = s.best_size(per_byte);
            assert!(
                (goodput(chosen) - goodput(searched.unwrap())).abs() < 1e-3 * goodput(chosen),
                "ber {ber}: {chosen} vs {searched:?}"
            );
        }
        // BER 1e-4: 230–260 bytes (the "250–400 on the wire").
        assert!(
            (200..300).contains(&s.best_size(8e-4)),
            "{}",
            s.best_size(8e-4)
        );
    }

    #[test]
    fn bit_errors_shrink_the_datagram_frame_losses_do_not() {
        let t0 = Instant::now();
        let per_byte = 8e-4;
        // Size-dependent: the loss of each size follows e^(−λw).
        let mut s = sizer(SizeMode::Adaptive);
        for k in 0..3u64 {
            let now = t0 + Duration::from_secs(3 * k);
            feed(&mut s, now, 1456, 700, 1.0 - survival(per_byte, 1500));
            feed(&mut s, now, 485, 100, 1.0 - survival(per_byte, 529));
        }
        assert!((200..300).contains(&s.current()), "{}", s.current());
        // Size-independent: 10 % of packets lost whatever their size.
        let mut f = sizer(SizeMode::Adaptive);
        for k in 0..3u64 {
            let now = t0 + Duration::from_secs(3 * k);
            feed(&mut f, now, 1456, 700, 0.1);
            feed(&mut f, now, 485, 100, 0.1);
        }
        assert_eq!(f.current(), 1456);
        assert_eq!(f.changes(), 0);
    }

    #[test]
    fn probes_only_where_losses_tell_something() {
        let t0 = Instant::now();
        let mut s = sizer(SizeMode::Adaptive);
        feed(&mut s, t0, 1456, 1000, 0.0);
        assert!((0..16).all(|_| {
            let (size, probe) = s.next_data_size();
            s.on_data_sent();
            size == 1456 && !probe
        }));
        feed(&mut s, t0, 1456, 1000, 0.05);
        let probes: Vec<usize> = (0..16)
            .filter_map(|_| {
                let (size, probe) = s.next_data_size();
                s.on_data_sent();
                probe.then_some(size)
            })
            .collect();
        assert_eq!(probes, [485, 485]);
        // A fixed size never probes nor changes.
        let mut x = sizer(SizeMode::Fixed(600));
        feed(&mut x, t0, 600, 1000, 0.3);
        assert_eq!(x.next_data_size(), (600, false));
    }
}
