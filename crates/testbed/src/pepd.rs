//! pepd on the two gateways, for `--mode pepd` and the relay tests: a config file per
//! gateway, TPROXY interception with policy routing, the daemons themselves, and their
//! readiness reported over the systemd notify protocol.
//!
//! How a flow reaches pepd, per gateway namespace (the same recipe as a deployment):
//!
//! * nftables, table `inet pepd`, chain `prerouting` (hook prerouting, priority mangle):
//!   1. `meta l4proto tcp socket transparent 1 meta mark set 0x1 accept` — a packet that
//!      belongs to a socket with IP_TRANSPARENT (an intercepted connection pepd accepted, or
//!      an upstream connection pepd opened from the client's address) gets mark 1;
//!   2. `iifname "lan0" tcp dport 5801 accept` — the cross-traffic port ([`crate::cross`]):
//!      a plain TCP flow that competes with pepd's on the link is routed, not intercepted;
//!   3. `iifname "lan0" meta l4proto tcp ct direction original tproxy to :7000 meta mark
//!      set 0x1 accept` — any other TCP a LAN host originates is handed to pepd's listener
//!      on port 7000 (one rule in an `inet` table covers IPv4 and IPv6), its destination
//!      left untouched, mark 1. `ct direction original` keeps the *replies* of TCP that
//!      crosses the gateway on the routed path (pepd's `over_limit = "bypass"`, connections
//!      older than pepd) away from the listener: without it the server's SYN-ACK to such a
//!      connection is diverted to port 7000 and answered with a reset.
//! * Policy routing: `ip rule add fwmark 0x1 lookup 100` and `ip route add local 0.0.0.0/0
//!   dev lo table 100` (and the same with `ip -6`, `local ::/0`): a marked packet is
//!   delivered locally whatever its destination address, instead of being forwarded.
//!
//! Rule 1 is what makes `transparent_source = true` work on the hub: pepd connects to the
//! server *from* the client's address (198.18.1.2), so the server's SYN-ACK, addressed to
//! the client, arrives on gw-b's lan0 and would be routed on over the satellite interface;
//! the socket lookup finds pepd's transparent socket, the mark routes it to `lo`, and the
//! connection completes locally. No sysctl is needed for it: reverse-path filtering checks
//! the *source* (the server, reached through lan0, the interface the reply came in on), so
//! it passes with rp_filter 0, 1 (strict) or 2, and `accept_local` only concerns packets
//! whose source is a local address, which never happens here. pepd's own sockets carry
//! `own_mark = 2`, which must differ from the interception mark: `fwmark 0x1` matches mark
//! 1 exactly, so pepd's own packets are never diverted to `lo`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::thread;
use std::time::{Duration, Instant};

use pep_linkemu::LinkConfig;

use crate::addr::{GW_A_SAT_V4, GW_B_SAT_V4};
use crate::cmd::{ip_in, nft_in};
use crate::cross::CROSS_TCP_PORT;
pub use crate::daemon::Notification;
use crate::daemon::{Daemon, Launch};
use crate::topology::{HostTuning, Names, Topology, LAN_DEV};
use crate::xfer::{client, server::Server, Outcome, Workload};
use crate::{addr, in_netns, Error};

/// pepd's TPROXY listener port on both gateways.
pub const TPROXY_PORT: u16 = 7000;
/// pepd's tunnel (UDP) port on both gateways.
pub const TUNNEL_PORT: u16 = 7400;
/// Mark the interception rules give packets that are to be delivered to pepd.
pub const INTERCEPT_MARK: u32 = 0x1;
/// Mark pepd puts on its own sockets (`[intercept] own_mark`).
pub const OWN_MARK: u32 = 0x2;
/// Routing table holding the `local` routes for intercepted packets.
pub const INTERCEPT_TABLE: &str = "100";

/// What pepd sends on the notify socket once its listeners are bound.
pub const READY: &str = "READY=1";
/// What pepd sends when its tunnel association with the peer is up.
pub const ASSOCIATION_ESTABLISHED: &str = "STATUS=association established";
/// What pepd sends when it loses the association.
pub const ASSOCIATION_DOWN: &str = "STATUS=association down";

/// Keeps the temporary directory (configs, logs) after teardown when set.
pub const KEEP_ENV: &str = "PEPTB_KEEP";
/// Overrides `[log] level` of the generated configs.
pub const LOG_ENV: &str = "PEPD_LOG";
/// Where the pepd executable is, unless given explicitly.
pub const BIN_ENV: &str = "PEPD_BIN";

/// Lines of each gateway's log printed when a test panics with the gateways up.
const TAIL_ON_PANIC: usize = 60;

/// Which gateway: gw-a is the terminal (client side), gw-b the hub (server side).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Terminal,
    Hub,
}

impl Side {
    pub const BOTH: [Side; 2] = [Side::Terminal, Side::Hub];

    /// The `[peer] side` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Terminal => "terminal",
            Side::Hub => "hub",
        }
    }

    /// The gateway's name in the topology.
    pub fn gateway(self) -> &'static str {
        match self {
            Side::Terminal => "gw-a",
            Side::Hub => "gw-b",
        }
    }

    pub fn namespace(self, names: &Names) -> &str {
        match self {
            Side::Terminal => &names.gw_a,
            Side::Hub => &names.gw_b,
        }
    }

    fn index(self) -> usize {
        match self {
            Side::Terminal => 0,
            Side::Hub => 1,
        }
    }

    /// (own satellite address, peer's) — tunnels run over IPv4 on the hop.
    fn sat_addrs(self) -> (SocketAddr, SocketAddr) {
        let a = SocketAddr::from((GW_A_SAT_V4, TUNNEL_PORT));
        let b = SocketAddr::from((GW_B_SAT_V4, TUNNEL_PORT));
        match self {
            Side::Terminal => (a, b),
            Side::Hub => (b, a),
        }
    }

    /// (tx, rx) rates in bit/s: the link's forward direction is gw-b → gw-a.
    fn rates(self, link: &LinkConfig) -> (f64, f64) {
        match self {
            Side::Terminal => (link.ret.rate_bps, link.forward.rate_bps),
            Side::Hub => (link.forward.rate_bps, link.ret.rate_bps),
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.gateway(), self.as_str())
    }
}

/// Which interception rules and policy routing the gateways get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interception {
    /// The testbed's own (see the module comment and [`intercept_ruleset`]).
    #[default]
    Testbed,
    /// What the daemon prints for its config: `pepd nft-rules -c FILE` and `--routes`,
    /// with `[rules] interfaces = ["lan0"]` put in the config (under any overrides) — the
    /// rules a deployment would load.
    Pepd,
}

/// How to run pepd on the gateways.
#[derive(Clone, Debug, Default)]
pub struct PepdOptions {
    /// The executable; otherwise `$PEPD_BIN`, otherwise `pepd` beside the running
    /// executable (or one directory up, for test and bench executables in `target/*/deps`).
    pub binary: Option<PathBuf>,
    /// Arguments put before `run -c FILE` (for stand-ins such as `pep-testbed fake-pepd`).
    pub binary_args: Vec<String>,
    /// TOML merged over both generated configs, table by table and key by key, e.g.
    /// `"[upstream]\ntransparent_source = true"`.
    pub extra_toml: String,
    /// TOML merged over gw-a's (terminal) config only, after `extra_toml`.
    pub terminal_toml: String,
    /// TOML merged over gw-b's (hub) config only, after `extra_toml`.
    pub hub_toml: String,
    /// Extra environment for the daemons.
    pub env: Vec<(String, String)>,
    /// Drop TCP the gateways would forward, so nothing reaches the far side unless pepd
    /// carried it: a test then cannot pass on the routed path by accident. Leave it off
    /// with `over_limit = "bypass"`, which relays over the routed path by design.
    pub forbid_routed_tcp: bool,
    pub interception: Interception,
    /// How long both gateways get to report the association; default 10 s + 4 RTT.
    pub ready_timeout: Option<Duration>,
    /// The tunnel's security; `$PEPTB_SECURITY` (`noise`, `none`) overrides the default.
    pub security: TunnelSecurity,
    /// Start without waiting for the association (for gateways that must not associate).
    pub skip_association_wait: bool,
}

/// How the testbed keys the two gateways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TunnelSecurity {
    /// Noise with a fresh key pair per gateway, each naming the other's public key.
    #[default]
    Noise,
    /// Noise, but the hub expects a public key the terminal does not hold.
    NoiseWrongPeerKey,
    /// `security.mode = "none"`.
    None,
}

/// Environment variable that picks the tunnel security when the options leave the default.
pub const SECURITY_ENV: &str = "PEPTB_SECURITY";

impl TunnelSecurity {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "noise" => Ok(TunnelSecurity::Noise),
            "none" => Ok(TunnelSecurity::None),
            other => Err(Error::Invalid(format!(
                "tunnel security {other:?}: expected \"noise\" or \"none\""
            ))),
        }
    }

    /// The security in force: `$PEPTB_SECURITY` stands in for the default.
    pub fn effective(self) -> Result<Self, Error> {
        match (self, std::env::var(SECURITY_ENV)) {
            (TunnelSecurity::Noise, Ok(v)) => TunnelSecurity::parse(&v),
            (s, _) => Ok(s),
        }
    }
}

fn random_key() -> Result<[u8; 32], Error> {
    let mut k = [0u8; 32];
    getrandom::fill(&mut k).map_err(|e| Error::Invalid(format!("no OS randomness: {e}")))?;
    Ok(k)
}

/// Writes a fresh private key for each gateway (mode 0600, as `pepd genkey` does) and
/// returns the `[security]` TOML for each side.
fn security_toml(dir: &Path, security: TunnelSecurity) -> Result<[String; 2], Error> {
    use pep_transport::security::{private_key_from_random, public_key};
    if security == TunnelSecurity::None {
        let none = "[security]\nmode = \"none\"\n".to_owned();
        return Ok([none.clone(), none]);
    }
    let mut keys = Vec::new();
    for side in Side::BOTH {
        keys.push(write_key(dir, side.gateway())?);
    }
    if security == TunnelSecurity::NoiseWrongPeerKey {
        keys[Side::Terminal.index()].public =
            base64_key(&public_key(&private_key_from_random(random_key()?)));
    }
    let toml_for = |side: Side| {
        let peer = match side {
            Side::Terminal => Side::Hub,
            Side::Hub => Side::Terminal,
        };
        format!(
            "[security]\nprivate_key_file = {:?}\npeer_public_key = {:?}\n",
            keys[side.index()].file.display().to_string(),
            keys[peer.index()].public
        )
    };
    Ok([toml_for(Side::Terminal), toml_for(Side::Hub)])
}

/// A gateway's key pair: where its private key is, and the public key in base64.
#[derive(Clone, Debug)]
pub struct KeyFile {
    pub file: PathBuf,
    pub public: String,
}

fn base64_key(k: &[u8; 32]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, k)
}

/// Writes a fresh private key to `DIR/NAME.key` (mode 0600, as `pepd genkey` does).
pub fn write_key(dir: &Path, name: &str) -> Result<KeyFile, Error> {
    use pep_transport::security::{private_key_from_random, public_key};
    use std::os::unix::fs::OpenOptionsExt;
    let private = private_key_from_random(random_key()?);
    let file = dir.join(format!("{name}.key"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)?;
    writeln!(f, "{}", base64_key(&private))?;
    Ok(KeyFile {
        file,
        public: base64_key(&public_key(&private)),
    })
}

impl PepdOptions {
    fn side_toml(&self, side: Side) -> &str {
        match side {
            Side::Terminal => &self.terminal_toml,
            Side::Hub => &self.hub_toml,
        }
    }
}

/// Finds pepd: `explicit`, else `$PEPD_BIN`, else beside the current executable.
pub fn locate_pepd(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let check = |p: PathBuf, how: &str| {
        if p.is_file() {
            Ok(p)
        } else {
            Err(Error::Pepd(format!("{how} {} is not a file", p.display())))
        }
    };
    if let Some(p) = explicit {
        return check(p.to_owned(), "pepd binary");
    }
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return check(PathBuf::from(p), BIN_ENV);
    }
    let exe = std::env::current_exe()?;
    let mut tried = Vec::new();
    if let Some(dir) = exe.parent() {
        let mut dirs = vec![dir.to_owned()];
        if dir.file_name().is_some_and(|n| n == "deps") {
            dirs.extend(dir.parent().map(Path::to_owned));
        }
        for d in dirs {
            let p = d.join("pepd");
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    Err(Error::Pepd(format!(
        "cannot find the pepd executable (looked at {}); build it with `cargo build --release \
         --bin pepd`, or pass --pepd PATH or set {BIN_ENV}",
        tried.join(", ")
    )))
}

fn rate_bps(v: f64, what: &str) -> Result<i64, Error> {
    if (1.0..9.0e18).contains(&v) {
        Ok(v.round() as i64)
    } else {
        Err(Error::Invalid(format!(
            "pepd needs a finite, positive {what} rate; the link has {v} bit/s"
        )))
    }
}

/// Merges `over` into `base`: tables recursively, anything else replaced.
/// The Prometheus text a gateway's pepd serves on its metrics address (the default,
/// 127.0.0.1:9464, inside the gateway's namespace).
pub fn fetch_metrics(ns: &str) -> Result<String, Error> {
    use std::io::Read;
    let body = crate::in_netns(ns, || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect("127.0.0.1:9464")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: pepd\r\nConnection: close\r\n\r\n")?;
        let mut r = String::new();
        s.read_to_string(&mut r)?;
        Ok(r)
    })??;
    body.split_once("\r\n\r\n")
        .map(|(_, text)| text.to_owned())
        .ok_or_else(|| Error::Invalid("metrics answer without a body".into()))
}

/// A counter's, gauge's or untyped sample's value (histograms and summaries have none).
pub fn sample_value(v: &prometheus_parse::Value) -> Option<f64> {
    match v {
        prometheus_parse::Value::Counter(x)
        | prometheus_parse::Value::Gauge(x)
        | prometheus_parse::Value::Untyped(x) => Some(*x),
        _ => None,
    }
}

/// What a gateway's congestion control reported at the end of a run (from its metrics).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CapacityReport {
    pub estimate_bps: f64,
    pub pacing_bps: f64,
    pub queue_delay_ms: f64,
    pub drains: f64,
    pub probes: f64,
    pub rebases: f64,
    pub competes: f64,
    pub limited_by_estimate_s: f64,
    pub limited_by_ceiling_s: f64,
    /// The datagram size the sender uses now, and how often it changed.
    pub datagram_size: f64,
    pub datagram_size_changes: f64,
}

impl CapacityReport {
    pub fn from_metrics(text: &str) -> Result<CapacityReport, Error> {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines)
            .map_err(|e| Error::Invalid(format!("pepd metrics: {e}")))?;
        let get = |name: &str, label: Option<(&str, &str)>| {
            scrape
                .samples
                .iter()
                .find(|m| m.metric == name && label.is_none_or(|(k, v)| m.labels.get(k) == Some(v)))
                .and_then(|m| sample_value(&m.value))
                .unwrap_or(0.0)
        };
        let events = |kind| get("pepd_capacity_events_total", Some(("kind", kind)));
        let limited = |by| get("pepd_send_limited_seconds_total", Some(("by", by)));
        Ok(CapacityReport {
            estimate_bps: get("pepd_capacity_estimate_bytes_per_second", None) * 8.0,
            pacing_bps: get("pepd_pacing_rate_bytes_per_second", None) * 8.0,
            queue_delay_ms: get("pepd_queue_delay_seconds", None) * 1e3,
            drains: events("drain"),
            probes: events("probe"),
            rebases: events("rebase"),
            competes: events("compete"),
            limited_by_estimate_s: limited("estimate"),
            limited_by_ceiling_s: limited("ceiling"),
            datagram_size: get("pepd_datagram_size_bytes", None),
            datagram_size_changes: get("pepd_datagram_size_changes_total", None),
        })
    }
}

/// What a gateway sent on the hop and what its compression did, from its metrics.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CompressionReport {
    /// Datagram bytes sent on the hop, UDP/IP headers included.
    pub wire_bytes_sent: f64,
    /// Application bytes read into blocks and the bytes of those blocks (sent side).
    pub plain_sent: f64,
    pub blocks_sent: f64,
    /// Blocks sent raw, at the fast and at the hard level.
    pub blocks_raw: f64,
    pub blocks_fast: f64,
    pub blocks_hard: f64,
    pub compress_cpu_s: f64,
    pub decompress_cpu_s: f64,
    /// Flows reset for refused blocks, all reasons.
    pub refused: f64,
}

impl CompressionReport {
    pub fn from_metrics(text: &str) -> Result<CompressionReport, Error> {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines)
            .map_err(|e| Error::Invalid(format!("pepd metrics: {e}")))?;
        let sum = |name: &str, label: Option<(&str, &str)>| -> f64 {
            scrape
                .samples
                .iter()
                .filter(|m| {
                    m.metric == name && label.is_none_or(|(k, v)| m.labels.get(k) == Some(v))
                })
                .filter_map(|m| sample_value(&m.value))
                .sum()
        };
        let level = |l| sum("pepd_compression_blocks_sent_total", Some(("level", l)));
        let cpu = |w| sum("pepd_compression_cpu_seconds_total", Some(("work", w)));
        Ok(CompressionReport {
            wire_bytes_sent: sum("pepd_wire_bytes_total", Some(("direction", "sent"))),
            plain_sent: sum(
                "pepd_compression_plain_bytes_total",
                Some(("direction", "to_peer")),
            ),
            blocks_sent: sum(
                "pepd_compression_block_bytes_total",
                Some(("direction", "to_peer")),
            ),
            blocks_raw: level("raw"),
            blocks_fast: level("fast"),
            blocks_hard: level("hard"),
            compress_cpu_s: cpu("compress"),
            decompress_cpu_s: cpu("decompress"),
            refused: sum("pepd_compression_refused_total", None),
        })
    }
}

/// TOML snippets merged into one document in order (later keys win), so two snippets may
/// both set keys of one table.
pub fn merge_toml(snippets: &[&str]) -> Result<String, Error> {
    finish_config(toml::Table::new(), snippets)
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The config the testbed gives the pepd of `side`, with `overrides` (TOML texts) merged
/// over it in order.
pub fn config_toml(
    side: Side,
    link: &LinkConfig,
    log_level: &str,
    overrides: &[&str],
) -> Result<String, Error> {
    let (bind, peer) = side.sat_addrs();
    let mut t = toml::Table::new();
    t.insert(
        "peer".into(),
        table(vec![
            ("address", peer.to_string().into()),
            ("bind", bind.to_string().into()),
            ("side", side.as_str().into()),
        ]),
    );
    gateway_tables(
        &mut t,
        side.rates(link),
        link.forward.frame_overhead,
        log_level,
    )?;
    finish_config(t, overrides)
}

/// A TOML table of `entries`.
pub fn table(entries: Vec<(&str, toml::Value)>) -> toml::Value {
    toml::Value::Table(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

/// What every gateway's config holds whatever its form: `[link]` at `(tx, rx)` bit/s (and
/// the bytes the emulated link layer adds to each packet), the TPROXY listeners and mark,
/// the log level.
pub fn gateway_tables(
    t: &mut toml::Table,
    (tx, rx): (f64, f64),
    frame_overhead: usize,
    log_level: &str,
) -> Result<(), Error> {
    let mut link_keys = vec![
        ("tx_rate", rate_bps(tx, "transmit")?.into()),
        ("rx_rate", rate_bps(rx, "receive")?.into()),
    ];
    // pepd is told what the emulated link layer adds to each packet, as an operator would.
    if frame_overhead > 0 {
        link_keys.push(("frame_overhead", (frame_overhead as i64).into()));
    }
    t.insert("link".into(), table(link_keys));
    t.insert(
        "intercept".into(),
        table(vec![
            (
                "listen",
                toml::Value::Array(vec![
                    format!("0.0.0.0:{TPROXY_PORT}").into(),
                    format!("[::]:{TPROXY_PORT}").into(),
                ]),
            ),
            ("own_mark", i64::from(OWN_MARK).into()),
        ]),
    );
    t.insert("log".into(), table(vec![("level", log_level.into())]));
    Ok(())
}

/// `t` with `overrides` (TOML texts) merged over it in order, as a document.
pub fn finish_config(mut t: toml::Table, overrides: &[&str]) -> Result<String, Error> {
    for text in overrides.iter().filter(|t| !t.trim().is_empty()) {
        let over: toml::Table = text
            .parse()
            .map_err(|e| Error::Invalid(format!("pepd config override {text:?}: {e}")))?;
        merge(&mut t, over);
    }
    toml::to_string(&t).map_err(|e| Error::Invalid(format!("writing the pepd config: {e}")))
}

/// A rate in bit/s as pepd's config takes it.
pub fn rate_value(bps: f64, what: &str) -> Result<toml::Value, Error> {
    rate_bps(bps, what).map(toml::Value::from)
}

/// The testbed's nftables ruleset for a gateway (see the module comment).
pub fn intercept_ruleset() -> String {
    let mark = format!("{INTERCEPT_MARK:#x}");
    // Declaring the table and deleting it first replaces any earlier version at once.
    format!(
        "table inet pepd {{}}\n\
         delete table inet pepd\n\
         table inet pepd {{\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority mangle; policy accept;\n\
         \t\tmeta l4proto tcp socket transparent 1 meta mark set {mark} accept\n\
         \t\tiifname \"{LAN_DEV}\" tcp dport {CROSS_TCP_PORT} accept\n\
         \t\tiifname \"{LAN_DEV}\" meta l4proto tcp ct direction original \
         tproxy to :{TPROXY_PORT} meta mark set {mark} accept\n\
         \t}}\n\
         }}\n"
    )
}

/// A table of its own, so it goes with either kind of interception rules.
const FORBID_ROUTED_TCP: &str = "table inet peptb_forward {}\n\
     delete table inet peptb_forward\n\
     table inet peptb_forward {\n\
     \tchain forward {\n\
     \t\ttype filter hook forward priority filter; policy accept;\n\
     \t\tmeta l4proto tcp drop\n\
     \t}\n\
     }\n";

/// Installs the testbed's interception rules and policy routing in gateway namespace `ns`.
pub fn install_interception(ns: &str) -> Result<(), Error> {
    nft_in(ns, &intercept_ruleset())?;
    let mark = format!("{INTERCEPT_MARK:#x}");
    for (fam, local) in [("-4", "0.0.0.0/0"), ("-6", "::/0")] {
        ip_in(
            ns,
            &[
                fam,
                "rule",
                "add",
                "fwmark",
                &mark,
                "lookup",
                INTERCEPT_TABLE,
            ],
        )?;
        ip_in(
            ns,
            &[
                fam,
                "route",
                "add",
                "local",
                local,
                "dev",
                "lo",
                "table",
                INTERCEPT_TABLE,
            ],
        )?;
    }
    Ok(())
}

/// What the testbed adds to the config when pepd writes the rules: only the LAN is
/// intercepted, as with the testbed's own rules.
const PEPD_RULES_TOML: &str = "[rules]\ninterfaces = [\"lan0\"]\n";

/// Loads what `pepd nft-rules` prints for `config` (ruleset, then the `--routes` script)
/// into gateway namespace `ns`.
fn install_pepd_rules(ns: &str, program: &Path, config: &Path) -> Result<(), Error> {
    let print = |extra: &[&str]| -> Result<String, Error> {
        let mut args = vec!["nft-rules", "-c"];
        let c = config
            .to_str()
            .ok_or_else(|| Error::Invalid(format!("{} is not UTF-8", config.display())))?;
        args.push(c);
        args.extend_from_slice(extra);
        let prog = program
            .to_str()
            .ok_or_else(|| Error::Invalid(format!("{} is not UTF-8", program.display())))?;
        crate::cmd::run(prog, &args)
    };
    nft_in(ns, &print(&[])?)?;
    let routes = print(&["--routes"])?;
    crate::cmd::run_with_input("ip", &["netns", "exec", ns, "sh", "-s"], &routes).map(drop)
}

/// pepd running on both gateways of a topology. Dropping it kills the daemons and removes
/// the temporary directory (kept when `PEPTB_KEEP` is set); when that happens during a
/// panic, it first prints the tail of both daemons' logs.
pub struct Gateways {
    dir: PathBuf,
    keep: bool,
    /// By [`Side::index`].
    gws: Vec<Daemon>,
    launch: Launch,
    ready_timeout: Duration,
}

/// A fresh directory for an instance's configs, keys, logs and notify sockets.
pub fn fresh_dir(names_base: &str) -> Result<PathBuf, Error> {
    let dir = std::env::temp_dir().join(format!("{names_base}-pepd"));
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The log level the generated configs get.
pub fn log_level() -> String {
    std::env::var(LOG_ENV).unwrap_or_else(|_| "info".into())
}

impl PepdOptions {
    /// How the daemons are started.
    pub fn launch(&self) -> Result<Launch, Error> {
        Ok(Launch {
            program: locate_pepd(self.binary.as_deref())?,
            args: self.binary_args.clone(),
            env: self.env.clone(),
        })
    }

    /// Installs the interception rules this asks for (and the routed-TCP ban) in gateway
    /// namespace `ns`, whose pepd reads `config`.
    pub fn install_rules(&self, ns: &str, program: &Path, config: &Path) -> Result<(), Error> {
        match self.interception {
            Interception::Testbed => install_interception(ns)?,
            Interception::Pepd => install_pepd_rules(ns, program, config)?,
        }
        if self.forbid_routed_tcp {
            nft_in(ns, FORBID_ROUTED_TCP)?;
        }
        Ok(())
    }

    /// What goes under every generated config: the rules pepd is told to print.
    pub fn rules_base(&self) -> &'static str {
        match self.interception {
            Interception::Testbed => "",
            Interception::Pepd => PEPD_RULES_TOML,
        }
    }
}

impl Gateways {
    /// Writes the configs, installs interception in both gateway namespaces, starts pepd on
    /// both and waits until both report the association established.
    pub fn start(names: &Names, link: &LinkConfig, opts: &PepdOptions) -> Result<Gateways, Error> {
        let launch = opts.launch()?;
        let rtt = link.forward.delay + link.ret.delay;
        let mut g = Gateways {
            dir: fresh_dir(names.base())?,
            keep: std::env::var_os(KEEP_ENV).is_some(),
            gws: Vec::new(),
            launch,
            ready_timeout: opts
                .ready_timeout
                .unwrap_or(Duration::from_secs(10) + 4 * rtt),
        };
        // From here on an error drops `g`, which kills what started and removes the dir.
        let level = log_level();
        let security = security_toml(&g.dir, opts.security.effective()?)?;
        for side in Side::BOTH {
            let ns = side.namespace(names);
            let text = config_toml(
                side,
                link,
                &level,
                &[
                    opts.rules_base(),
                    &security[side.index()],
                    &opts.extra_toml,
                    opts.side_toml(side),
                ],
            )?;
            let d = Daemon::prepare(&g.dir, side.gateway(), &side.to_string(), ns, &text)?;
            opts.install_rules(ns, &g.launch.program, d.config_path())?;
            g.gws.push(d);
        }
        let mut since = Vec::new();
        for side in Side::BOTH {
            since.push(g.gws[side.index()].spawn(&g.launch)?);
        }
        let deadline = Instant::now() + g.ready_timeout;
        for (side, t) in Side::BOTH.into_iter().zip(since) {
            g.wait_for(side, READY, t, deadline)?;
            if !opts.skip_association_wait {
                g.wait_for(side, ASSOCIATION_ESTABLISHED, t, deadline)?;
            }
        }
        Ok(g)
    }

    fn gw(&self, side: Side) -> &Daemon {
        &self.gws[side.index()]
    }

    fn gw_mut(&mut self, side: Side) -> &mut Daemon {
        &mut self.gws[side.index()]
    }

    /// Waits until `side` sent a notification with a line starting with `needle`, at or
    /// after `since`. Fails when the deadline passes or pepd exits first, quoting its log.
    pub fn wait_for(
        &mut self,
        side: Side,
        needle: &str,
        since: Instant,
        deadline: Instant,
    ) -> Result<Notification, Error> {
        let allowed = self.ready_timeout;
        self.gw_mut(side).wait_for(needle, since, deadline, allowed)
    }

    /// Exit status of `side`'s pepd if it has exited (None while running or never started).
    pub fn exit_status(&mut self, side: Side) -> Option<ExitStatus> {
        self.gw_mut(side).exit_status()
    }

    pub fn pid(&self, side: Side) -> Option<u32> {
        self.gw(side).pid()
    }

    /// Kills `side`'s pepd with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill(&mut self, side: Side) -> Result<ExitStatus, Error> {
        self.gw_mut(side).kill()
    }

    /// Starts `side`'s pepd again with the same config and waits for `READY=1` and the
    /// association; returns when the new process was started.
    pub fn restart(&mut self, side: Side) -> Result<Instant, Error> {
        self.gw_mut(side).reap();
        if self.gw(side).is_started() {
            return Err(Error::Pepd(format!("pepd on {side} is still running")));
        }
        let started = self.gws[side.index()].spawn(&self.launch)?;
        let deadline = started + self.ready_timeout;
        self.wait_for(side, READY, started, deadline)?;
        self.wait_for(side, ASSOCIATION_ESTABLISHED, started, deadline)?;
        Ok(started)
    }

    /// Every notification `side` has sent so far, oldest first.
    pub fn notifications(&self, side: Side) -> Vec<Notification> {
        self.gw(side).notifications()
    }

    /// The daemon's stdout and stderr (with the testbed's `===` lines between runs).
    pub fn log_path(&self, side: Side) -> &Path {
        self.gw(side).log_path()
    }

    pub fn config_path(&self, side: Side) -> &Path {
        self.gw(side).config_path()
    }

    /// Where `side`'s pepd answers `pepd status` and `pepd flows`.
    pub fn control_socket(&self, side: Side) -> PathBuf {
        self.gw(side).control_socket()
    }

    /// The temporary directory with configs, logs and notify sockets.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of `side`'s log.
    pub fn log_tail(&self, side: Side, lines: usize) -> String {
        self.gw(side).log_tail(lines)
    }

    /// Each gateway's congestion-control figures, keyed by gateway name; a gateway whose
    /// metrics cannot be read is left out.
    pub fn capacity_reports(&self) -> BTreeMap<String, CapacityReport> {
        self.gws
            .iter()
            .zip(Side::BOTH)
            .filter_map(|(g, side)| {
                let text = fetch_metrics(g.namespace()).ok()?;
                Some((
                    side.gateway().to_owned(),
                    CapacityReport::from_metrics(&text).ok()?,
                ))
            })
            .collect()
    }

    /// The tails of both logs, keyed by gateway name.
    /// Each gateway's [`CompressionReport`] now; a gateway whose metrics cannot be read is
    /// left out.
    pub fn compression_reports(&self) -> BTreeMap<String, CompressionReport> {
        Side::BOTH
            .into_iter()
            .filter_map(|s| {
                let g = self.gw(s);
                let text = fetch_metrics(g.namespace()).ok()?;
                Some((
                    s.gateway().to_owned(),
                    CompressionReport::from_metrics(&text).ok()?,
                ))
            })
            .collect()
    }

    pub fn log_tails(&self, lines: usize) -> BTreeMap<String, String> {
        Side::BOTH
            .into_iter()
            .map(|s| (s.gateway().to_owned(), self.log_tail(s, lines)))
            .collect()
    }
}

impl Drop for Gateways {
    fn drop(&mut self) {
        if thread::panicking() {
            for d in &self.gws {
                d.dump_tail(TAIL_ON_PANIC);
            }
        }
        // The daemons stop (and their readers end) before their directory goes.
        self.gws.clear();
        remove_dir(&self.dir, self.keep);
    }
}

/// Removes an instance's directory, or says where it was kept.
pub fn remove_dir(dir: &Path, keep: bool) {
    if keep {
        eprintln!("pep-testbed: kept {}", dir.display());
    } else {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A topology with pepd up on both gateways, for tests: end hosts on the kernel default
/// (CUBIC), both daemons reporting the association before `up` returns.
pub struct PepdTestbed {
    // Declared first so it drops first: the daemons stop before their namespaces go.
    gateways: Gateways,
    topo: Topology,
    link: LinkConfig,
}

impl PepdTestbed {
    pub fn up(link: &LinkConfig, opts: &PepdOptions) -> Result<PepdTestbed, Error> {
        let topo = Topology::up(
            link,
            &HostTuning {
                congestion_control: "cubic".into(),
            },
        )?;
        let gateways = Gateways::start(&topo.names, link, opts)?;
        Ok(PepdTestbed {
            gateways,
            topo,
            link: link.clone(),
        })
    }

    pub fn names(&self) -> &Names {
        &self.topo.names
    }

    pub fn link(&self) -> &LinkConfig {
        &self.link
    }

    /// Propagation round trip of the satellite hop.
    pub fn rtt(&self) -> Duration {
        self.link.forward.delay + self.link.ret.delay
    }

    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    pub fn gateways(&self) -> &Gateways {
        &self.gateways
    }

    pub fn gateways_mut(&mut self) -> &mut Gateways {
        &mut self.gateways
    }

    /// Runs `f` on a thread in the client's namespace.
    pub fn in_client<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        in_netns(&self.topo.names.client, f)
    }

    /// Runs `f` on a thread in the server's namespace.
    pub fn in_server<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        in_netns(&self.topo.names.server, f)
    }

    /// An xfer server on the server at `port` (IPv4 or IPv6 address of the server).
    pub fn xfer_server(&self, ipv6: bool, port: u16) -> Result<Server, Error> {
        let at = SocketAddr::new(addr::server(ipv6), port);
        Ok(self.in_server(move || Server::bind(at, None))??)
    }

    /// Runs workload `w` from the client (blocking).
    pub fn xfer(&self, w: &Workload, opts: &client::ClientOpts) -> Result<Outcome, Error> {
        let (w, o) = (w.clone(), opts.clone());
        self.in_client(move || client::run(&w, &o))
    }

    /// SIGKILLs the pepd of `side`.
    pub fn kill_gateway(&mut self, side: Side) -> Result<ExitStatus, Error> {
        self.gateways.kill(side)
    }

    /// Starts the pepd of `side` again (after [`PepdTestbed::kill_gateway`]), waits for it
    /// to be ready and associated, and returns when it was started.
    pub fn restart_gateway(&mut self, side: Side) -> Result<Instant, Error> {
        self.gateways.restart(side)
    }

    /// Takes the satellite hop down or up at once (see [`Topology::set_link_down`]).
    pub fn set_link_down(&self, down: bool) -> Result<(), Error> {
        self.topo.set_link_down(down)
    }

    pub fn log_tail(&self, side: Side, lines: usize) -> String {
        self.gateways.log_tail(side, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_report_reads_the_daemons_metric_names() {
        let text = "\
# TYPE pepd_capacity_estimate_bytes_per_second gauge
pepd_capacity_estimate_bytes_per_second 1250000
# TYPE pepd_queue_delay_seconds gauge
pepd_queue_delay_seconds 0.012
# TYPE pepd_capacity_events_total counter
pepd_capacity_events_total{kind=\"drain\"} 3
pepd_capacity_events_total{kind=\"probe\"} 7
pepd_capacity_events_total{kind=\"rebase\"} 1
pepd_capacity_events_total{kind=\"compete\"} 2
# TYPE pepd_send_limited_seconds_total counter
pepd_send_limited_seconds_total{by=\"estimate\"} 40.5
pepd_send_limited_seconds_total{by=\"ceiling\"} 2
# TYPE pepd_datagram_size_bytes gauge
pepd_datagram_size_bytes 230
# TYPE pepd_datagram_size_changes_total counter
pepd_datagram_size_changes_total 2
";
        let r = CapacityReport::from_metrics(text).expect("parses");
        assert_eq!(r.estimate_bps, 10_000_000.0);
        assert_eq!(r.queue_delay_ms, 12.0);
        assert_eq!(
            (r.drains, r.probes, r.rebases, r.competes),
            (3.0, 7.0, 1.0, 2.0)
        );
        assert_eq!(
            (r.limited_by_estimate_s, r.limited_by_ceiling_s),
            (40.5, 2.0)
        );
        assert_eq!((r.datagram_size, r.datagram_size_changes), (230.0, 2.0));
        // An absent series reads as zero.
        assert_eq!(r.pacing_bps, 0.0);
    }
}
