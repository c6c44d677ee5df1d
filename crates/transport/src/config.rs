//! Association configuration: everything an operator can tune, with defaults suited to a
//! dedicated GEO link.

use std::time::Duration;

use thiserror::Error;

pub use crate::datagram_size::SizeMode;
use crate::traffic_class::{TrafficClass, MAX_TRAFFIC_CLASSES};

/// How the sender decides how much to put in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcMode {
    /// Capacity tracking: pace at the estimated bottleneck rate, never above the configured
    /// rate, keeping the queue small; corruption is not congestion.
    Adaptive,
    /// Pure rate ("open loop", SCPS): send at the configured rate, repair losses by SNACK.
    Rate,
    /// Delay-based Vegas, capped at the configured rate.
    Vegas,
}

/// What a loss is taken for when the delay evidence is not conclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossCause {
    Congestion,
    Corruption,
    Outage,
}

impl LossCause {
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::Congestion => "congestion",
            LossCause::Corruption => "corruption",
            LossCause::Outage => "outage",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VegasParams {
    /// Grow while fewer than `alpha` packets are queued.
    pub alpha: f64,
    /// Shrink while more than `beta` packets are queued.
    pub beta: f64,
    /// Leave slow start when more than `gamma` packets are queued.
    pub gamma: f64,
}

impl Default for VegasParams {
    fn default() -> Self {
        VegasParams {
            alpha: 2.0,
            beta: 4.0,
            gamma: 1.0,
        }
    }
}

/// When this side starts a Noise handshake (docs/PROTOCOL.md §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Initiate {
    /// At start, after a restart or a lost association, in an outage, and to rekey.
    #[default]
    Always,
    /// Only to rekey an association that is up and not in an outage: a hub among several
    /// with one static key, whose initiation with its newer epoch would otherwise take a
    /// terminal from the hub that serves it.
    RekeyOnly,
}

/// When the receiver acknowledges: every `every_packets` ack-eliciting packets or after
/// `max_delay`, whichever first; at once when a new hole appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckPolicy {
    pub every_packets: u32,
    pub max_delay: Duration,
    /// Most ranges reported in one ACK; older holes drop out after being reported many times.
    pub max_ranges: usize,
}

impl Default for AckPolicy {
    fn default() -> Self {
        AckPolicy {
            every_packets: 8,
            max_delay: Duration::from_millis(50),
            max_ranges: 32,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Rate of this gateway's sending direction in bits per second, counted on the wire
    /// (datagram + `wire_overhead`). The pacer's rate in `rate` mode, the ceiling in
    /// `adaptive` and `vegas`.
    pub rate_bps: u64,
    pub cc: CcMode,
    pub vegas: VegasParams,
    pub loss_default: LossCause,
    pub ack: AckPolicy,
    /// Largest datagram on the path including `wire_overhead` (an IP MTU).
    pub mtu: usize,
    /// How big data datagrams are (at most the MTU's; docs/PROTOCOL.md §5.8).
    pub datagram_size: SizeMode,
    /// Bytes the link layer adds to each packet beyond IP (encapsulation such as GSE),
    /// counted when the datagram size is chosen.
    pub frame_overhead: usize,
    /// Bytes each datagram costs on the wire beyond what the transport writes: IP + UDP
    /// headers and the AEAD tag the protection layer appends.
    pub wire_overhead: usize,
    /// Per-flow receive window (bytes a flow may have outstanding beyond what its consumer
    /// has read). Bounds what one slow consumer can hold.
    pub flow_window: u64,
    /// Association-wide receive budget across all flows.
    pub assoc_window: u64,
    /// Per-flow send buffer (bytes written by the application and not yet acknowledged).
    pub send_buffer: u64,
    pub max_flows: usize,
    /// Flows survive link outages shorter than this; longer, the association is lost.
    pub outage_limit: Duration,
    /// Longest gap between probes while the link is down.
    pub max_probe_interval: Duration,
    /// Probe the peer after this much silence, so outages are noticed even when idle.
    pub keepalive_interval: Duration,
    /// HELLO retransmission interval while the association is being set up.
    pub hello_interval: Duration,
    /// Packets after which an unacknowledged earlier packet is declared lost.
    pub reorder_threshold: u64,
    /// When the sender has nothing new to send, use the idle link to send a second copy of
    /// unacknowledged data, so tail losses are repaired without waiting a round trip.
    pub idle_redundancy: bool,
    /// RTT assumed before the first sample (sets the first probe timeout).
    pub initial_rtt: Duration,
    /// How far the pacer may fall behind schedule and catch up back to back (never less
    /// than two packets). An event loop whose timers fire late by up to a millisecond
    /// needs about that much; a deterministic simulator needs none.
    pub pacing_burst: Duration,
    /// When this side starts a handshake (security on; without it HELLOs go as always).
    pub initiate: Initiate,
    /// How the flows share what the association sends, by class (flows start in class 0);
    /// empty: one class, every flow alike (docs/PROTOCOL.md §5.10).
    pub classes: Vec<TrafficClass>,
    /// What this gateway can decompress, offered in its HELLO (docs/PROTOCOL.md §9); `None`
    /// offers nothing, and the association's flows then carry no compressed blocks.
    pub compression: Option<crate::compression::CompressionOffer>,
}

impl Config {
    /// Defaults for a link of `rate_bps`, with windows sized for a GEO round trip.
    pub fn for_rate(rate_bps: u64) -> Self {
        // 4.8 s at the link rate, eight GEO round trips: one in flight, the rest so the
        // window does not close while the consumer waits on a hole whose repairs are lost
        // again (at BER 1e-5, 11 % of 1500-byte packets).
        let window = (rate_bps / 8).saturating_mul(48) / 10;
        let flow_window = window.clamp(4 << 20, 512 << 20);
        Config {
            rate_bps,
            cc: CcMode::Adaptive,
            vegas: VegasParams::default(),
            loss_default: LossCause::Corruption,
            ack: AckPolicy::default(),
            mtu: 1500,
            datagram_size: SizeMode::Adaptive,
            frame_overhead: 0,
            wire_overhead: 28 + 16,
            flow_window,
            assoc_window: flow_window.saturating_mul(8).max(64 << 20),
            send_buffer: flow_window,
            max_flows: 4096,
            outage_limit: Duration::from_secs(120),
            max_probe_interval: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(5),
            hello_interval: Duration::from_secs(1),
            reorder_threshold: 3,
            idle_redundancy: true,
            initial_rtt: Duration::from_millis(600),
            pacing_burst: Duration::ZERO,
            initiate: Initiate::Always,
            classes: Vec::new(),
            compression: None,
        }
    }

    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.rate_bps < 8_000 {
            return Err(InvalidConfig::new("rate_bps", "must be at least 8000"));
        }
        if self.mtu < self.wire_overhead + 128 || self.mtu > 65_535 {
            return Err(InvalidConfig::new(
                "mtu",
                "must leave at least 128 bytes after wire_overhead and be at most 65535",
            ));
        }
        if self.frame_overhead > 1024 {
            return Err(InvalidConfig::new(
                "frame_overhead",
                "must be at most 1024 bytes",
            ));
        }
        if let SizeMode::Fixed(n) = self.datagram_size {
            if n < 128 {
                return Err(InvalidConfig::new(
                    "datagram_size",
                    "a fixed size must be at least 128 bytes",
                ));
            }
        }
        if self.flow_window < 16 * 1024 || self.flow_window > 1 << 30 {
            return Err(InvalidConfig::new("flow_window", "must be 16 KiB to 1 GiB"));
        }
        if self.assoc_window < self.flow_window {
            return Err(InvalidConfig::new(
                "assoc_window",
                "must be at least flow_window",
            ));
        }
        if self.send_buffer < 16 * 1024 {
            return Err(InvalidConfig::new("send_buffer", "must be at least 16 KiB"));
        }
        if self.ack.every_packets == 0 {
            return Err(InvalidConfig::new(
                "ack.every_packets",
                "must be at least 1",
            ));
        }
        if self.ack.max_ranges < 2 {
            return Err(InvalidConfig::new("ack.max_ranges", "must be at least 2"));
        }
        let v = self.vegas;
        if !(v.alpha > 0.0 && v.alpha <= v.beta && v.gamma > 0.0) {
            return Err(InvalidConfig::new(
                "vegas",
                "need 0 < alpha <= beta and gamma > 0",
            ));
        }
        if self.max_flows == 0 {
            return Err(InvalidConfig::new("max_flows", "must be at least 1"));
        }
        if self.classes.len() > MAX_TRAFFIC_CLASSES {
            return Err(InvalidConfig::new("classes", "at most 64 traffic classes"));
        }
        for c in &self.classes {
            if c.weight == 0 {
                return Err(InvalidConfig::new("classes", "a weight must be at least 1"));
            }
            if c.priority && c.max_rate_bps.is_none() {
                return Err(InvalidConfig::new(
                    "classes",
                    "a priority class needs a rate cap, or it could starve the others",
                ));
            }
            if c.max_rate_bps.is_some_and(|r| r < 8_000) {
                return Err(InvalidConfig::new(
                    "classes",
                    "a rate cap must be at least 8000 bit/s",
                ));
            }
        }
        Ok(())
    }

    /// Most bytes the transport writes into one datagram.
    pub fn max_datagram(&self) -> usize {
        self.mtu - self.wire_overhead
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid transport setting `{key}`: {why}")]
pub struct InvalidConfig {
    pub key: &'static str,
    pub why: &'static str,
}

impl InvalidConfig {
    pub(crate) fn new(key: &'static str, why: &'static str) -> Self {
        InvalidConfig { key, why }
    }
}
