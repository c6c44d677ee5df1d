//! pepd's TOML configuration: the schema, its defaults, and conversion into the transport's
//! [`pep_transport::Config`]. Unknown keys are rejected; every error names the key and line.
//! docs/CONFIG.md describes every key for operators.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use pep_transport::security::{AeadOffer, PacketProtection};
use serde::Deserialize;

mod announce;
mod bounds;
pub mod budget;
mod cidr;
pub mod classes;
pub mod control;
mod error;
mod hubs;
pub mod keys;
mod messages;
mod peers;
mod security;
mod source;
pub(crate) mod units;
mod validate;
mod warnings;

pub use announce::{AnnounceConfig, RESERVED_TABLES};
pub use cidr::{parse_subnet, CidrError};
pub use classes::{ClassEntry, Dscp, TrafficClasses};
pub use control::ControlConfig;
pub use error::{ConfigError, Diagnostic};
pub use hubs::{HubAddresses, MAX_HUB_ADDRESSES};
pub use peers::{PeerEntry, PeerSpec, Peers, TunnelConfig, MAX_PEERS, MAX_WORKERS, PAIR_PEER_NAME};
pub use security::{LoadedSecurity, LocalKeys};
pub use source::SourceMap;
pub use units::{BitRate, ByteSize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PepdConfig {
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub intercept: InterceptConfig,
    /// What the generated nftables rules send to the listeners; pepd only reads it for
    /// `pepd nft-rules` and the start-up self-check.
    #[serde(default)]
    pub rules: RulesConfig,
    /// One `[peer]` table (a pair of gateways) or `[[peer]]` entries (a hub and its
    /// terminals); read through [`PepdConfig::peer_specs`].
    pub peer: Peers,
    /// Side and bind of the `[[peer]]` form; the `[peer]` table keeps its own.
    #[serde(default)]
    pub tunnel: Option<TunnelConfig>,
    pub link: LinkConfig,
    #[serde(default)]
    pub transport: TransportConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    #[serde(default)]
    pub upstream: UpstreamConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The socket `pepd status` asks through.
    #[serde(default)]
    pub control: ControlConfig,
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    /// How the tunnel is authenticated and encrypted. Key files are read by
    /// [`PepdConfig::security`], not when the config is parsed.
    #[serde(default)]
    pub security: SecuritySection,
    /// `[[class]]`: the traffic classes a peer's flows share its capacity by.
    #[serde(default)]
    pub class: Vec<ClassEntry>,
    /// `[announce]`: a hub's served terminals' subnets written into kernel routing tables
    /// for a routing daemon; off when absent.
    #[serde(default)]
    pub announce: Option<AnnounceConfig>,
    /// Where each key was written, so validation and warnings can name lines. Empty for a
    /// config built in code.
    #[serde(skip)]
    pub source_map: SourceMap,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// tracing env-filter directive, e.g. "info" or "pepd=debug,info". `RUST_LOG` overrides.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InterceptConfig {
    /// TPROXY listener addresses (one socket each; IPv6 ones are v6-only).
    pub listen: Vec<SocketAddr>,
    /// Mark carried by every socket pepd itself opens (tunnel UDP, upstream TCP), so the
    /// rules can exclude pepd's own traffic from interception.
    pub own_mark: u32,
}

impl Default for InterceptConfig {
    fn default() -> Self {
        InterceptConfig {
            listen: vec![
                SocketAddr::from(([0, 0, 0, 0], DEFAULT_TPROXY_PORT)),
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, DEFAULT_TPROXY_PORT)),
            ],
            own_mark: 0x2,
        }
    }
}

pub const DEFAULT_TPROXY_PORT: u16 = 7000;

/// What happens to TCP the rules select while no pepd listener takes it (pepd stopped or
/// restarting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// It is routed as if there were no pepd, without acceleration.
    Open,
    /// It is dropped; clients retry their SYNs until pepd is back.
    Closed,
}

/// What the rules do with QUIC (UDP to `rules.quic_ports`) from the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuicPolicy {
    /// Routed like any other UDP, unaccelerated: it competes with pepd at the bottleneck.
    Pass,
    /// Answered with an ICMP port unreachable, so the client falls back to TCP at once.
    Reject,
    /// Dropped; the client falls back to TCP after its own QUIC timeout.
    Drop,
}

impl QuicPolicy {
    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            QuicPolicy::Pass => "pass",
            QuicPolicy::Reject => "reject",
            QuicPolicy::Drop => "drop",
        }
    }
}

/// Which TCP connections the interception rules (`pepd nft-rules`) divert to the
/// `[intercept] listen` sockets, and the policy routing that delivers them locally.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    /// Interfaces whose incoming TCP is intercepted (nftables `iifname`; a trailing `*` is a
    /// wildcard). Empty: every interface.
    pub interfaces: Vec<String>,
    /// TCP destination ports to intercept. Empty: every port.
    pub ports: Vec<u16>,
    /// Destinations and sources never intercepted.
    #[serde(deserialize_with = "cidr::subnets")]
    pub bypass_subnets: Vec<IpNet>,
    /// If not empty, only connections to these destinations are intercepted.
    #[serde(deserialize_with = "cidr::subnets")]
    pub proxy_subnets: Vec<IpNet>,
    /// Firewall mark the rules put on intercepted packets; the policy-routing rule sends
    /// packets with it to `route_table`.
    pub tproxy_mark: u32,
    /// Routing table holding the `local` default route that delivers intercepted packets to
    /// this host.
    pub route_table: u32,
    pub fail: FailMode,
    /// Name of the nftables table (`table inet NAME`) the rules live in, so that two pepd
    /// instances on one host never replace each other's rules.
    pub table: String,
    /// What happens to the clients' QUIC, whose TCP fallback pepd would accelerate.
    pub quic: QuicPolicy,
    /// The UDP destination ports `quic` covers.
    pub quic_ports: Vec<u16>,
    /// Destinations and sources `quic` never touches (VPNs and WebRTC on UDP 443).
    #[serde(deserialize_with = "cidr::subnets")]
    pub quic_exceptions: Vec<IpNet>,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            interfaces: Vec::new(),
            ports: Vec::new(),
            bypass_subnets: Vec::new(),
            proxy_subnets: Vec::new(),
            tproxy_mark: DEFAULT_TPROXY_MARK,
            route_table: DEFAULT_ROUTE_TABLE,
            fail: FailMode::Open,
            table: DEFAULT_NFT_TABLE.to_owned(),
            quic: QuicPolicy::Pass,
            quic_ports: vec![DEFAULT_QUIC_PORT],
            quic_exceptions: Vec::new(),
        }
    }
}

pub const DEFAULT_TPROXY_MARK: u32 = 0x1;
pub const DEFAULT_ROUTE_TABLE: u32 = 100;
pub const DEFAULT_NFT_TABLE: &str = "pepd";
/// HTTP/3's port.
pub const DEFAULT_QUIC_PORT: u16 = 443;
pub const DEFAULT_TUNNEL_PORT: u16 = 7400;

/// Which end of the hop this gateway is. Decides the flow-id parity; the two ends of an
/// association must differ. A hub may serve several terminals (`[[peer]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Terminal,
    Hub,
}

/// The `[peer]` table of a pair of gateways.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    /// The peer gateway's tunnel address (UDP); at a terminal, several hubs' in order of
    /// preference, one peer served by one of them at a time.
    pub address: HubAddresses,
    /// Local tunnel address; defaults to the unspecified address of the peer's family on
    /// port 7400.
    pub bind: Option<SocketAddr>,
    pub side: Side,
    /// With several hub addresses: go back to the first when it answers again, at a moment
    /// with no open flow.
    #[serde(default)]
    pub return_to_preferred: bool,
    /// With `return_to_preferred`: how long on another hub before trying the first again.
    #[serde(default = "default_return_after", with = "humantime_serde")]
    pub return_after: Duration,
}

/// `peer.return_after` unless set.
pub const DEFAULT_RETURN_AFTER: Duration = Duration::from_secs(600);

/// The shortest `peer.return_after`: every move resets the terminal's flows.
pub const MIN_RETURN_AFTER: Duration = Duration::from_secs(60);

fn default_return_after() -> Duration {
    DEFAULT_RETURN_AFTER
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Rate this gateway sends at over the satellite hop.
    pub tx_rate: BitRate,
    /// Rate the peer sends at towards us; sizes the receive windows.
    pub rx_rate: BitRate,
    /// Largest IP packet on the satellite hop.
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// Bytes the link layer adds to each packet (encapsulation such as GSE); counted when
    /// the datagram size follows the error rate.
    #[serde(default)]
    pub frame_overhead: usize,
}

fn default_mtu() -> usize {
    1500
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CcModeName {
    Adaptive,
    Rate,
    Vegas,
}

/// How big the tunnel's data datagrams are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatagramSizeName {
    /// Follow the error rate: smaller on a link whose bit errors grow with size.
    Adaptive,
    /// Always as large as `link.mtu` allows.
    Mtu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossDefault {
    Corruption,
    Congestion,
}

/// Whether flows may be compressed on the link (docs/SECURITY.md, "Compression").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionMode {
    /// Nothing is compressed, and the HELLO offers nothing: the peer compresses nothing
    /// towards us either.
    Off,
    /// Offered to the peer; flows to `compression_ports` and `compression_prefixes` are
    /// compressed where their data shrinks and the link is what they wait on.
    Auto,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TransportConfig {
    pub cc: CcModeName,
    pub vegas_alpha: f64,
    pub vegas_beta: f64,
    pub vegas_gamma: f64,
    /// Cause assumed for a loss without outage or delay evidence.
    pub loss_default: LossDefault,
    pub ack_every_packets: u32,
    #[serde(with = "humantime_serde")]
    pub ack_max_delay: Duration,
    /// How long flows survive a link outage.
    #[serde(with = "humantime_serde")]
    pub outage_limit: Duration,
    #[serde(with = "humantime_serde")]
    pub keepalive: Duration,
    /// How far the pacer may fall behind (a late timer) and catch up back to back.
    #[serde(with = "humantime_serde")]
    pub pacing_burst: Duration,
    pub datagram_size: DatagramSizeName,
    pub compression: CompressionMode,
    /// Server ports whose flows `auto` compresses; empty: every port.
    pub compression_ports: Vec<u16>,
    /// Server addresses whose flows `auto` compresses; empty: every address.
    #[serde(deserialize_with = "cidr::subnets")]
    pub compression_prefixes: Vec<IpNet>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        let t = pep_transport::Config::for_rate(1_000_000);
        TransportConfig {
            cc: CcModeName::Adaptive,
            vegas_alpha: t.vegas.alpha,
            vegas_beta: t.vegas.beta,
            vegas_gamma: t.vegas.gamma,
            loss_default: LossDefault::Corruption,
            ack_every_packets: t.ack.every_packets,
            ack_max_delay: t.ack.max_delay,
            outage_limit: t.outage_limit,
            keepalive: t.keepalive_interval,
            pacing_burst: Duration::from_millis(2),
            datagram_size: DatagramSizeName::Adaptive,
            compression: CompressionMode::Off,
            compression_ports: Vec::new(),
            compression_prefixes: Vec::new(),
        }
    }
}

/// What happens to a new connection when `max_flows` are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverLimit {
    /// The client gets a reset.
    Refuse,
    /// pepd relays it as plain TCP over the routed path, without the satellite transport.
    Bypass,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_flows: usize,
    pub over_limit: OverLimit,
    /// Bytes buffered per flow and direction; `None` sizes it from the link (4.8 s of rate,
    /// at least 4 MiB).
    pub flow_buffer: Option<ByteSize>,
    /// All flow buffers together, both directions.
    pub memory_budget: ByteSize,
    /// A flow whose relay has had bytes for its local TCP side and could write none of them
    /// for this long is reset, while its peer's receive window or the budget is contended
    /// (a client that stopped reading holds what others need). 0 disables.
    #[serde(with = "humantime_serde")]
    pub stalled_flow_timeout: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_flows: 10_000,
            over_limit: OverLimit::Refuse,
            flow_buffer: None,
            memory_budget: ByteSize(512 << 20),
            stalled_flow_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    /// Upstream connect on the far side; on expiry the client gets a reset.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// A flow with no bytes either way for this long is reset. 0 disables.
    #[serde(with = "humantime_serde")]
    pub idle: Duration,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(2 * 3600),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Connect to the destination from the client's own address (`IP_TRANSPARENT` bind).
    pub transparent_source: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Prometheus scrape endpoint (HTTP).
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_METRICS_PORT)),
        }
    }
}

pub const DEFAULT_METRICS_PORT: u16 = 9464;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// On SIGTERM, open flows get this long to finish before the rest are reset.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            grace: Duration::from_secs(30),
        }
    }
}

/// Whether the tunnel is protected by pepd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecurityMode {
    /// Noise IK handshake with static keys, then an AEAD (`aead`) on every packet.
    Noise,
    /// No authentication or encryption: only for a link already encrypted below pepd.
    None,
}

/// The `[security]` section as written. Named apart from
/// `pep_transport::security::SecurityConfig`, which [`PepdConfig::security`] builds from it
/// once the key files are read.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SecuritySection {
    pub mode: SecurityMode,
    /// This gateway's X25519 private key (`pepd genkey`); required with `mode = "noise"`.
    pub private_key_file: Option<PathBuf>,
    /// The peer gateway's public key, base64 (`pepd pubkey` there); required with noise.
    pub peer_public_key: Option<String>,
    /// Optional pre-shared key (`pepd genpsk`), the same file on both gateways.
    pub psk_file: Option<PathBuf>,
    /// Session keys older than this are replaced by a new handshake.
    #[serde(with = "humantime_serde")]
    pub rekey_interval: Duration,
    /// Packets under one session key before it is replaced.
    pub rekey_after_packets: u64,
    /// Which AEAD protects packets: chosen with the peer, or pinned.
    pub aead: AeadSetting,
}

/// `security.aead`: what this gateway offers the peer in its handshake HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum AeadSetting {
    /// Both, AES-256-GCM preferred where this CPU has AES instructions; the peer's
    /// preference counts as much (docs/PROTOCOL.md §7.2).
    #[serde(rename = "auto")]
    Auto,
    /// ChaCha20-Poly1305 only.
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
    /// AES-256-GCM only.
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
}

impl AeadSetting {
    /// The offer this setting makes on a CPU with (or without) AES instructions.
    pub fn offer(self, hardware_aes: bool) -> AeadOffer {
        match self {
            AeadSetting::Auto => AeadOffer::auto(hardware_aes),
            AeadSetting::ChaCha20Poly1305 => AeadOffer::only(PacketProtection::ChaCha20Poly1305),
            AeadSetting::Aes256Gcm => AeadOffer::only(PacketProtection::Aes256Gcm),
        }
    }
}

impl Default for SecuritySection {
    fn default() -> Self {
        SecuritySection {
            mode: SecurityMode::Noise,
            private_key_file: None,
            peer_public_key: None,
            psk_file: None,
            rekey_interval: DEFAULT_REKEY_INTERVAL,
            rekey_after_packets: DEFAULT_REKEY_AFTER_PACKETS,
            aead: AeadSetting::Auto,
        }
    }
}

pub const DEFAULT_REKEY_INTERVAL: Duration = Duration::from_secs(120);
pub const DEFAULT_REKEY_AFTER_PACKETS: u64 = 1 << 30;

impl PepdConfig {
    /// Reads, parses and validates `path`; diagnostics name the file as given.
    pub fn load(path: &std::path::Path) -> Result<PepdConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        PepdConfig::parse_named(&text, &path.display().to_string())
    }

    /// Parses and validates config text that did not come from a file.
    pub fn parse(text: &str) -> Result<PepdConfig, ConfigError> {
        PepdConfig::parse_named(text, "")
    }

    /// Parses and validates `text`; `origin` (a file name) prefixes every diagnostic.
    pub fn parse_named(text: &str, origin: &str) -> Result<PepdConfig, ConfigError> {
        let root = toml::de::DeTable::parse(text).map_err(|e| {
            let (partial, _) = toml::de::DeTable::parse_recoverable(text);
            ConfigError::Parse(SourceMap::explain_syntax(
                origin,
                &e,
                text,
                partial.get_ref(),
            ))
        })?;
        let source_map = SourceMap::build(origin, text, root.get_ref());
        let mut config: PepdConfig =
            serde_path_to_error::deserialize(toml::de::Deserializer::from(root))
                .map_err(|e| ConfigError::Parse(source_map.explain(&e, text)))?;
        config.source_map = source_map;
        config.validate()?;
        Ok(config)
    }

    pub fn role(&self) -> pep_transport::Role {
        match self.side() {
            Side::Terminal => pep_transport::Role::Initiator,
            Side::Hub => pep_transport::Role::Responder,
        }
    }

    /// The transport settings this config asks for, sized from the `[link]` rates.
    pub fn transport(&self) -> pep_transport::Config {
        self.transport_with(self.link.tx_rate.bps(), self.link.rx_rate.bps())
    }

    /// The transport settings of the association with `peer`: its rates and keepalive. The
    /// same as [`PepdConfig::transport`] for the `[peer]` table, whose rates are `[link]`'s.
    pub fn transport_for(&self, peer: &PeerSpec) -> pep_transport::Config {
        let mut c = self.transport_with(peer.tx_bps, peer.rx_bps);
        c.keepalive_interval = peer.keepalive;
        // Within the gateway's, which start may have lowered to what the open-file limit serves.
        c.max_flows = peer.max_flows.min(self.limits.max_flows);
        c
    }

    fn transport_with(&self, tx_bps: u64, rx_bps: u64) -> pep_transport::Config {
        let mut c = pep_transport::Config::for_rate(tx_bps);
        let rx = pep_transport::Config::for_rate(rx_bps);
        // What we advertise as receiver is sized by what the peer sends; what we buffer
        // for sending by our own rate.
        c.flow_window = rx.flow_window;
        c.assoc_window = rx.assoc_window;
        let half_budget = self.limits.memory_budget.bytes() / 2;
        if let Some(b) = self.limits.flow_buffer {
            c.flow_window = b.bytes();
            c.send_buffer = b.bytes();
        } else {
            // Sized from a fast link, one flow's buffers could exceed the whole budget; a
            // flow may use at most half of each direction's share.
            c.flow_window = c.flow_window.min(half_budget / 2);
            c.send_buffer = c.send_buffer.min(half_budget / 2);
        }
        c.assoc_window = c.assoc_window.min(half_budget).max(c.flow_window);
        let t = &self.transport;
        c.cc = match t.cc {
            CcModeName::Adaptive => pep_transport::CcMode::Adaptive,
            CcModeName::Rate => pep_transport::CcMode::Rate,
            CcModeName::Vegas => pep_transport::CcMode::Vegas,
        };
        c.vegas = pep_transport::VegasParams {
            alpha: t.vegas_alpha,
            beta: t.vegas_beta,
            gamma: t.vegas_gamma,
        };
        c.loss_default = match t.loss_default {
            LossDefault::Corruption => pep_transport::LossCause::Corruption,
            LossDefault::Congestion => pep_transport::LossCause::Congestion,
        };
        c.ack.every_packets = t.ack_every_packets;
        c.ack.max_delay = t.ack_max_delay;
        c.outage_limit = t.outage_limit;
        c.keepalive_interval = t.keepalive;
        c.pacing_burst = t.pacing_burst;
        c.mtu = self.link.mtu;
        c.frame_overhead = self.link.frame_overhead;
        c.datagram_size = match t.datagram_size {
            DatagramSizeName::Adaptive => pep_transport::SizeMode::Adaptive,
            DatagramSizeName::Mtu => pep_transport::SizeMode::Fixed(usize::MAX),
        };
        let ip_udp = if self.tunnel_is_ipv6() {
            40 + 8
        } else {
            20 + 8
        };
        c.wire_overhead = ip_udp + 16;
        c.max_flows = self.limits.max_flows;
        c.classes = TrafficClasses::of(self).transport();
        c.compression = match t.compression {
            CompressionMode::Off => None,
            CompressionMode::Auto => Some(pep_transport::CompressionOffer::zstd(
                pep_compress::OFFERED_BLOCK_LOG,
            )),
        };
        c
    }
}

/// config/terminal.toml with its commented-out options written in, so that every key of
/// the schema is set: for tests that must see each key.
#[cfg(test)]
pub(crate) fn example_with_every_key() -> String {
    include_str!("../config/terminal.toml")
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest)
                if rest
                    .split_once(" = ")
                    .is_some_and(|(k, _)| !k.contains(' ')) =>
            {
                rest
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
