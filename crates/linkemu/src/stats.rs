//! Counters: updated lock-free by the engine threads, reported as JSON.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use crate::shaper::DropReason;
use pep_sim::timeline::QueueDelay;

/// Live counters of one direction.
#[derive(Default)]
pub struct Counters {
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
    passed_packets: AtomicU64,
    passed_bytes: AtomicU64,
    drops: [AtomicU64; 5],
    write_errors: AtomicU64,
    queue_peak_bytes: AtomicU64,
    in_flight_peak: AtomicU64,
    bursts_whole: AtomicU64,
    bursts_cut: AtomicU64,
    bursts_uncut: AtomicU64,
}

/// What became of a GSO burst the kernel handed over whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BurstFate {
    /// Crossed as one unit.
    Whole,
    /// Cut into its datagrams, each judged on its own.
    Cut,
    /// Not a UDP burst over plain IPv4 or IPv6 (say, IPv6 extension headers): it crossed as
    /// it came, whatever the link, and the far kernel cuts it.
    Uncut,
}

fn drop_index(r: DropReason) -> usize {
    match r {
        DropReason::Queue => 0,
        DropReason::Corrupted => 1,
        DropReason::Lost => 2,
        DropReason::BurstLost => 3,
        DropReason::Outage => 4,
    }
}

impl Counters {
    /// `packets` arrived together (a UDP GSO burst stands for its datagrams).
    pub fn arrived(&self, packets: usize, bytes: usize, backlog_bytes: usize) {
        self.packets_in.fetch_add(packets as u64, Relaxed);
        self.bytes_in.fetch_add(bytes as u64, Relaxed);
        self.queue_peak_bytes
            .fetch_max(backlog_bytes as u64, Relaxed);
    }
    /// `packets` dropped together (a burst crossing whole stands for its datagrams).
    pub fn dropped(&self, r: DropReason, packets: usize) {
        self.drops[drop_index(r)].fetch_add(packets as u64, Relaxed);
    }
    pub fn in_flight(&self, n: usize) {
        self.in_flight_peak.fetch_max(n as u64, Relaxed);
    }
    pub fn passed(&self, packets: usize, bytes: usize) {
        self.passed_packets.fetch_add(packets as u64, Relaxed);
        self.passed_bytes.fetch_add(bytes as u64, Relaxed);
    }
    pub fn burst(&self, fate: BurstFate) {
        let c = match fate {
            BurstFate::Whole => &self.bursts_whole,
            BurstFate::Cut => &self.bursts_cut,
            BurstFate::Uncut => &self.bursts_uncut,
        };
        c.fetch_add(1, Relaxed);
    }
    pub fn write_error(&self, packets: usize) {
        self.write_errors.fetch_add(packets as u64, Relaxed);
    }

    pub fn snapshot(&self) -> DirectionStats {
        let d = |r| self.drops[drop_index(r)].load(Relaxed);
        DirectionStats {
            packets_in: self.packets_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            passed_packets: self.passed_packets.load(Relaxed),
            passed_bytes: self.passed_bytes.load(Relaxed),
            dropped: DropStats {
                queue: d(DropReason::Queue),
                corrupted: d(DropReason::Corrupted),
                lost: d(DropReason::Lost),
                burst_lost: d(DropReason::BurstLost),
                outage: d(DropReason::Outage),
                write_error: self.write_errors.load(Relaxed),
            },
            queue_peak_bytes: self.queue_peak_bytes.load(Relaxed),
            in_flight_peak_packets: self.in_flight_peak.load(Relaxed),
            udp_bursts_whole: self.bursts_whole.load(Relaxed),
            udp_bursts_cut: self.bursts_cut.load(Relaxed),
            gso_bursts_uncut: self.bursts_uncut.load(Relaxed),
            queue_delay: QueueDelay::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct DropStats {
    pub queue: u64,
    pub corrupted: u64,
    pub lost: u64,
    pub burst_lost: u64,
    pub outage: u64,
    /// The far TUN refused the packet (interface down, or its queue full).
    pub write_error: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct DirectionStats {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped: DropStats,
    pub queue_peak_bytes: u64,
    /// Most packets held at once (queued, serialising or propagating).
    pub in_flight_peak_packets: u64,
    /// UDP GSO bursts that crossed as one unit (counted in packets_in by their datagrams).
    #[serde(default)]
    pub udp_bursts_whole: u64,
    /// UDP GSO bursts cut into datagrams, each judged on its own.
    #[serde(default)]
    pub udp_bursts_cut: u64,
    /// GSO bursts the emulator cannot cut (not UDP over plain IPv4 or IPv6): they crossed as
    /// they came, whatever the link, and the far kernel cut them.
    #[serde(default)]
    pub gso_bursts_uncut: u64,
    /// Queueing delay each packet that entered the queue saw, measured at the queue.
    #[serde(default)]
    pub queue_delay: QueueDelay,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct LinkStats {
    pub elapsed_s: f64,
    /// CPU time of the emulator's own threads.
    pub cpu_s: f64,
    /// `cpu_s / elapsed_s`: 1.0 is one core busy.
    pub cpu_share: f64,
    /// Whether the TUN devices hand over UDP GSO bursts whole (see `pep_linkemu::gso`).
    #[serde(default)]
    pub udp_offload: bool,
    pub forward: DirectionStats,
    #[serde(rename = "return")]
    pub ret: DirectionStats,
}
