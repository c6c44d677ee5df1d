//! Start-up self-check for the usual reasons intercepted connections never reach pepd: no
//! `tproxy` rule for our listener, no policy routing for the mark, forwarding off, strict
//! reverse-path filtering, no route to the peer; and loaded rules that refuse the clients'
//! QUIC otherwise than `rules.quic` says. Every check is independent and only produces
//! warnings: pepd may run with rules it cannot see (iptables-legacy, another network
//! namespace), and a missing tool must not stop the gateway.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use serde::Deserialize;

use crate::config::{FailMode, Peers, PepdConfig, QuicPolicy};
use crate::control::rules::{self, Family};

/// What a command printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The system as the checks see it; tests substitute captured outputs.
pub trait Probe {
    /// Runs `prog args…`. `Err` only when it cannot be started (`NotFound`: not installed).
    fn run(&self, prog: &str, args: &[&str]) -> io::Result<Output>;
    fn read(&self, path: &str) -> io::Result<String>;
    /// Names in a directory.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
}

/// The running system: programs from `PATH`, files as they are.
pub struct System;

impl Probe for System {
    fn run(&self, prog: &str, args: &[&str]) -> io::Result<Output> {
        let out = Command::new(prog).args(args).output()?;
        Ok(Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn read(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

/// Warnings about this host's interception setup for `cfg`, one sentence each; empty when
/// everything checked looks right. Runs `nft` and `ip` and reads `/proc/sys`, in the
/// caller's network namespace. Takes a few milliseconds; blocking.
pub fn startup_checks(cfg: &PepdConfig) -> Vec<String> {
    startup_checks_with(cfg, &System)
}

/// [`startup_checks`] against any [`Probe`].
pub fn startup_checks_with(cfg: &PepdConfig, probe: &dyn Probe) -> Vec<String> {
    let mut w = Vec::new();
    check_nft(cfg, probe, &mut w);
    check_policy_routing(cfg, probe, &mut w);
    check_forwarding(cfg, probe, &mut w);
    check_rp_filter(cfg, probe, &mut w);
    check_peer_routes(cfg, probe, &mut w);
    check_kernel_limits(cfg, probe, &mut w);
    // A missing tool is reported by every check that needs it; once is enough.
    let mut seen = HashSet::new();
    w.retain(|m| seen.insert(m.clone()));
    w
}

const IP_MISSING: &str =
    "`ip` (iproute2) is not installed: the policy routing and the route to the peer were not \
     checked";

fn family_name(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The first line of a command's complaint, for a message.
fn first_line(out: &Output) -> String {
    let text = if out.stderr.trim().is_empty() {
        &out.stdout
    } else {
        &out.stderr
    };
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_owned()
}

/// A `tproxy` statement in `nft -j list ruleset` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TproxyRule {
    /// `None`: `tproxy to` in an inet table, both families.
    pub family: Option<Family>,
    pub addr: Option<IpAddr>,
    /// `None`: the packet's own destination port.
    pub port: Option<u16>,
    /// The mark the same rule sets, if it sets one.
    pub mark: Option<u32>,
}

impl TproxyRule {
    fn sends_to(&self, family: Family, listener: SocketAddr) -> bool {
        self.family.is_none_or(|f| f == family)
            && self.port == Some(listener.port())
            && (self.addr.is_none()
                || listener.ip().is_unspecified()
                || self.addr == Some(listener.ip()))
    }
}

/// What an nftables ruleset does about interception.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Every `tproxy` statement whose target is a literal address and port.
    pub tproxy: Vec<TproxyRule>,
    /// Whether a rule uses iptables-nft's TPROXY target, whose port nft does not show.
    pub xt_tproxy: bool,
    /// The names of the `inet` tables, where `pepd nft-rules` puts its rules.
    pub inet_tables: Vec<String>,
    /// What the `quic` chain of each `inet` table that has one does in the end, by table.
    pub quic: Vec<(String, QuicVerdict)>,
}

/// How a loaded `quic` chain ([`rules::QUIC_CHAIN`]) refuses the clients' QUIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuicVerdict {
    Reject,
    Drop,
    /// The chain is there but neither rejects nor drops: it refuses nothing.
    Neither,
}

impl QuicVerdict {
    fn policy(self) -> Option<QuicPolicy> {
        match self {
            QuicVerdict::Reject => Some(QuicPolicy::Reject),
            QuicVerdict::Drop => Some(QuicPolicy::Drop),
            QuicVerdict::Neither => None,
        }
    }
}

impl Ruleset {
    /// From `nft -j list ruleset` (libnftables-json(5)).
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        let listing: NftListing = serde_json::from_str(json)?;
        let mut ruleset = Ruleset::default();
        for object in &listing.nftables {
            if let Some(table) = object.table.as_ref().filter(|t| t.family == "inet") {
                ruleset.inet_tables.push(table.name.clone());
            }
        }
        for object in &listing.nftables {
            let Some(chain) = object.chain.as_ref() else {
                continue;
            };
            if chain.family == "inet" && chain.name == rules::QUIC_CHAIN {
                ruleset
                    .quic
                    .push((chain.table.clone(), QuicVerdict::Neither));
            }
        }
        for rule in listing.nftables.into_iter().filter_map(|o| o.rule) {
            if rule.family == "inet" && rule.chain == rules::QUIC_CHAIN {
                let verdict = if rule.expr.iter().any(|s| s.reject) {
                    Some(QuicVerdict::Reject)
                } else if rule.expr.iter().any(|s| s.drop) {
                    Some(QuicVerdict::Drop)
                } else {
                    None
                };
                if let Some(v) = verdict {
                    for (table, seen) in ruleset.quic.iter_mut() {
                        if *table == rule.table && *seen == QuicVerdict::Neither {
                            *seen = v;
                        }
                    }
                }
            }
            let mark = rule
                .expr
                .iter()
                .filter_map(|s| s.mangle.as_ref())
                .find(|m| m.key.meta.as_ref().is_some_and(|k| k.key == "mark"))
                .and_then(|m| m.value.as_u64())
                .and_then(|v| u32::try_from(v).ok());
            for stmt in &rule.expr {
                if stmt.xt.as_ref().is_some_and(is_tproxy_target) {
                    ruleset.xt_tproxy = true;
                }
                let Some(t) = &stmt.tproxy else {
                    continue;
                };
                // An address or port from a map is known only per packet.
                let Some(addr) = literal(&t.addr, |v| v.as_str()?.parse().ok()) else {
                    continue;
                };
                let Some(port) = literal(&t.port, |v| u16::try_from(v.as_u64()?).ok()) else {
                    continue;
                };
                // In an ip or ip6 table the statement names no family: the table's applies.
                let family = family_of(t.family.as_deref().unwrap_or(&rule.family));
                ruleset.tproxy.push(TproxyRule {
                    family,
                    addr,
                    port,
                    mark,
                });
            }
        }
        Ok(ruleset)
    }
}

#[derive(Deserialize)]
struct NftListing {
    nftables: Vec<NftObject>,
}

/// One of a listing's tables, chains, sets, rules…; only tables, chains and rules are read.
#[derive(Deserialize)]
struct NftObject {
    table: Option<NftTable>,
    chain: Option<NftChain>,
    rule: Option<NftRule>,
}

#[derive(Deserialize)]
struct NftChain {
    family: String,
    table: String,
    name: String,
}

#[derive(Deserialize)]
struct NftTable {
    family: String,
    name: String,
}

#[derive(Deserialize)]
struct NftRule {
    family: String,
    #[serde(default)]
    table: String,
    #[serde(default)]
    chain: String,
    #[serde(default)]
    expr: Vec<NftStatement>,
}

/// A statement is an object with one key naming its kind.
#[derive(Deserialize)]
struct NftStatement {
    tproxy: Option<NftTproxy>,
    mangle: Option<NftMangle>,
    xt: Option<serde_json::Value>,
    /// `{"reject": {...}}`, or `{"reject": null}` for the default type.
    #[serde(default, deserialize_with = "present")]
    reject: bool,
    /// `{"drop": null}`.
    #[serde(default, deserialize_with = "present")]
    drop: bool,
}

/// True for a key that is there, whatever its value (`null` too).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d)?;
    Ok(true)
}

/// `addr` and `port` are expressions: a literal, or a map looked up per packet.
#[derive(Deserialize)]
struct NftTproxy {
    family: Option<String>,
    addr: Option<serde_json::Value>,
    port: Option<serde_json::Value>,
}

/// `meta mark set 0x10` is `{"mangle": {"key": {"meta": {"key": "mark"}}, "value": 16}}`.
#[derive(Deserialize)]
struct NftMangle {
    key: NftMangleKey,
    value: serde_json::Value,
}

#[derive(Deserialize)]
struct NftMangleKey {
    meta: Option<NftMeta>,
}

#[derive(Deserialize)]
struct NftMeta {
    key: String,
}

/// A part of a `tproxy` target: `Some(None)` when the statement leaves it out, `Some(Some(_))`
/// for a literal `read` understands, `None` for anything else.
fn literal<T>(
    v: &Option<serde_json::Value>,
    read: impl FnOnce(&serde_json::Value) -> Option<T>,
) -> Option<Option<T>> {
    match v {
        None => Some(None),
        Some(v) => read(v).map(Some),
    }
}

fn family_of(nft_family: &str) -> Option<Family> {
    match nft_family {
        "ip" => Some(Family::V4),
        "ip6" => Some(Family::V6),
        _ => None,
    }
}

/// nft 1.0.6 prints `{"type": "target", "name": "TPROXY"}`; a release that prints the
/// statement as text instead still names the target in it.
fn is_tproxy_target(xt: &serde_json::Value) -> bool {
    match xt {
        serde_json::Value::Object(o) => o.get("name").and_then(|n| n.as_str()) == Some("TPROXY"),
        serde_json::Value::String(s) => s.contains("TPROXY"),
        _ => false,
    }
}

fn check_nft(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let out = match probe.run("nft", &["-j", "list", "ruleset"]) {
        Ok(out) if out.success => out,
        Ok(out) => {
            w.push(format!(
                "`nft list ruleset` failed ({}): the interception rules were not checked",
                first_line(&out)
            ));
            return;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            w.push(
                "`nft` is not installed: the interception rules were not checked (they come \
                 from `pepd nft-rules`)"
                    .into(),
            );
            return;
        }
        Err(e) => {
            w.push(format!(
                "cannot run `nft list ruleset` ({e}): the interception rules were not checked"
            ));
            return;
        }
    };
    let ruleset = match Ruleset::from_json(&out.stdout) {
        Ok(ruleset) => ruleset,
        Err(e) => {
            w.push(format!(
                "`nft list ruleset` printed output this check does not understand ({e}): the \
                 interception rules were not checked"
            ));
            return;
        }
    };
    // iptables-nft shows an xt TPROXY target without its port; trust it rather than warn.
    if ruleset.xt_tproxy {
        return;
    }
    let found = ruleset.tproxy;
    let tmark = cfg.rules.tproxy_mark;
    let mut served = false;
    for f in rules::families(cfg) {
        let Some(listener) = rules::listener(cfg, f) else {
            continue;
        };
        let ours: Vec<&TproxyRule> = found.iter().filter(|r| r.sends_to(f, listener)).collect();
        served |= !ours.is_empty();
        if ours.is_empty() {
            w.push(format!(
                "no nftables `tproxy` rule sends {} TCP to port {} (`intercept.listen` {listener}): \
                 connections are routed past pepd; load the rules from `pepd nft-rules` (or, with \
                 iptables-legacy, check them there)",
                family_name(f),
                listener.port()
            ));
            continue;
        }
        // A rule without a mark may rely on another rule marking the packets; only marks
        // that are all wrong are certainly a problem.
        let marks: Option<Vec<u32>> = ours.iter().map(|r| r.mark).collect();
        if let Some(other) = marks
            .as_deref()
            .and_then(|m| m.first().filter(|_| !m.contains(&tmark)))
        {
            w.push(format!(
                "the nftables `tproxy` rule for {} port {} sets mark {other:#x}, not \
                 `rules.tproxy_mark` ({tmark:#x}): the policy routing for {tmark:#x} does not \
                 deliver those packets to pepd",
                family_name(f),
                listener.port()
            ));
        }
    }
    // Our table is there but sends to none of our listeners: what is left when a second
    // instance with the same `rules.table` loaded its rules over ours.
    let table = &cfg.rules.table;
    if !served && ruleset.inet_tables.contains(table) {
        w.push(format!(
            "table inet {table} (`rules.table`) is loaded but none of its rules sends to \
             this gateway's listeners: another pepd instance on this host with the same \
             `rules.table` may have replaced them; give each instance its own table"
        ));
    }
    if ruleset.inet_tables.contains(table) {
        check_quic(cfg, &ruleset.quic, w);
    }
}

/// Whether the loaded table refuses QUIC as `rules.quic` says; a table loaded before the
/// setting changed does not.
fn check_quic(cfg: &PepdConfig, loaded: &[(String, QuicVerdict)], w: &mut Vec<String>) {
    let table = &cfg.rules.table;
    let want = cfg.rules.quic;
    // `None`: no `quic` chain (rules of `quic = "pass"`, or from before the setting).
    let loaded = loaded
        .iter()
        .find(|(t, _)| t == table)
        .and_then(|(_, v)| v.policy());
    const RELOAD: &str = "the rules loaded are not the config's; `systemctl reload pepd-rules` \
                          (or load `pepd nft-rules`)";
    let message = match (want, loaded) {
        (QuicPolicy::Pass, Some(loaded)) => format!(
            "table inet {table} refuses the clients' QUIC (\"{}\") while `rules.quic` is \
             \"pass\": {RELOAD}",
            loaded.name()
        ),
        (QuicPolicy::Pass, _) => return,
        (want, Some(loaded)) if loaded == want => return,
        (want, Some(loaded)) => format!(
            "`rules.quic` is \"{}\" but table inet {table} refuses the clients' QUIC with \
             \"{}\": {RELOAD}",
            want.name(),
            loaded.name()
        ),
        (want, _) => format!(
            "`rules.quic` is \"{}\" but table inet {table} does not refuse the clients' QUIC: \
             {RELOAD}",
            want.name()
        ),
    };
    w.push(message);
}

/// A rule of `ip -j -N rule show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRule {
    pub priority: u32,
    /// Value and mask (`fwmark 0x1` has mask 0xffffffff).
    pub fwmark: Option<(u32, u32)>,
    /// The table looked up, as printed (a number with `-N`).
    pub lookup: Option<String>,
}

impl IpRule {
    /// Every rule in `ip -j rule show` output.
    pub fn list_from_json(json: &str) -> serde_json::Result<Vec<Self>> {
        let raw: Vec<RawIpRule> = serde_json::from_str(json)?;
        Ok(raw
            .into_iter()
            .map(|r| IpRule {
                priority: r.priority,
                fwmark: r.fwmark.and_then(|m| {
                    let mask = match r.fwmask {
                        Some(mask) => mask.as_u32()?,
                        None => u32::MAX,
                    };
                    Some((m.as_u32()?, mask))
                }),
                lookup: r.table.map(NumberOrText::into_string),
            })
            .collect())
    }

    fn matches_mark(&self, mark: u32) -> bool {
        self.fwmark
            .is_some_and(|(value, mask)| mark & mask == value & mask)
    }
}

/// iproute2 prints `{"priority": 32765, "src": "all", "fwmark": "0x1", "table": "100"}`,
/// with `"fwmask": "0xff"` when the mask is not all ones.
#[derive(Deserialize)]
struct RawIpRule {
    priority: u32,
    fwmark: Option<NumberOrText>,
    fwmask: Option<NumberOrText>,
    table: Option<NumberOrText>,
}

/// iproute2 6.1 prints marks as `"0x10"` and tables as `"100"`; a number is taken too.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl NumberOrText {
    /// Decimal or `0x` hex.
    fn as_u32(&self) -> Option<u32> {
        match self {
            NumberOrText::Number(n) => u32::try_from(*n).ok(),
            NumberOrText::Text(s) => match s.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => s.parse().ok(),
            },
        }
    }

    fn into_string(self) -> String {
        match self {
            NumberOrText::Number(n) => n.to_string(),
            NumberOrText::Text(s) => s,
        }
    }
}

/// A route of `ip -j route show` or `ip -j route get`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Route {
    /// `local`, `unreachable`, `prohibit`…; `None` for unicast, which iproute2 leaves out.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `default` for the whole address space.
    pub dst: Option<String>,
}

impl Route {
    pub fn list_from_json(json: &str) -> serde_json::Result<Vec<Self>> {
        serde_json::from_str(json)
    }

    fn is_local_default(&self, family: Family) -> bool {
        self.kind.as_deref() == Some("local")
            && matches!(self.dst.as_deref(), Some(d) if d == "default" || d == family.any())
    }
}

fn check_policy_routing(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let table = cfg.rules.route_table.to_string();
    for f in rules::families(cfg) {
        // -N prints table numbers, not names from rt_tables; iproute2 before 5.x lacks it.
        let listed = match probe.run("ip", &["-j", "-N", f.ip_flag(), "rule", "show"]) {
            Ok(out) if !out.success => probe.run("ip", &["-j", f.ip_flag(), "rule", "show"]),
            other => other,
        };
        match listed {
            Ok(out) if out.success => match IpRule::list_from_json(&out.stdout) {
                Ok(all) => check_mark_rule(cfg, f, &all, w),
                Err(e) => w.push(format!(
                    "`ip {} rule show` printed output this check does not understand ({e}): the \
                     policy routing was not checked",
                    f.ip_flag()
                )),
            },
            Ok(out) => w.push(format!(
                "`ip {} rule show` failed ({}): the policy routing was not checked",
                f.ip_flag(),
                first_line(&out)
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                w.push(IP_MISSING.into());
                return;
            }
            Err(e) => w.push(format!(
                "cannot run `ip` ({e}): the policy routing was not checked"
            )),
        }
        let no_local_default = || {
            format!(
                "table {table} has no {} `local default dev lo` route: marked packets are \
                 forwarded instead of delivered to pepd; {HOW_TO_ROUTE}",
                family_name(f)
            )
        };
        // Without -N: with it, iproute2 prints route types as numbers.
        match probe.run("ip", &["-j", f.ip_flag(), "route", "show", "table", &table]) {
            // A table that does not exist makes `ip` fail; that is the same finding as an
            // empty one.
            Ok(out) if !out.success => w.push(no_local_default()),
            Ok(out) => match Route::list_from_json(&out.stdout) {
                Ok(routes) if routes.iter().any(|r| r.is_local_default(f)) => {}
                Ok(_) => w.push(no_local_default()),
                Err(e) => w.push(format!(
                    "`ip {} route show table {table}` printed output this check does not \
                     understand ({e}): the policy routing was not checked",
                    f.ip_flag()
                )),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                w.push(IP_MISSING.into());
                return;
            }
            Err(e) => w.push(format!(
                "cannot run `ip` ({e}): the policy routing was not checked"
            )),
        }
    }
}

const HOW_TO_ROUTE: &str = "run the script from `pepd nft-rules --routes`";

/// Whether `rules` send packets with `rules.tproxy_mark` to `rules.route_table` before the
/// main table routes them.
fn check_mark_rule(cfg: &PepdConfig, f: Family, rules: &[IpRule], w: &mut Vec<String>) {
    let mark = cfg.rules.tproxy_mark;
    let table = cfg.rules.route_table.to_string();
    let fam = family_name(f);
    let main_prio = rules
        .iter()
        .find(|x| x.fwmark.is_none() && matches!(x.lookup.as_deref(), Some("254" | "main")))
        .map(|x| x.priority);
    let ours = rules
        .iter()
        .find(|x| x.matches_mark(mark) && x.lookup.as_deref() == Some(table.as_str()));
    match (ours, main_prio) {
        (None, _) => w.push(format!(
            "no {fam} `ip rule` looks up table {table} for mark {mark:#x}: intercepted \
             connections are forwarded instead of delivered to pepd; {HOW_TO_ROUTE}"
        )),
        (Some(ours), Some(main)) if ours.priority >= main => w.push(format!(
            "the {fam} `ip rule` for mark {mark:#x} (priority {}) comes after the main table's \
             (priority {main}), which routes the packets first; give it a lower priority",
            ours.priority
        )),
        _ => {}
    }
}

/// A sysctl file's integer value.
pub fn parse_sysctl(text: &str) -> Option<i64> {
    text.trim().parse().ok()
}

fn check_forwarding(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let open = match cfg.rules.fail {
        FailMode::Open => ", and with `rules.fail = \"open\"` all TCP while pepd is down",
        FailMode::Closed => "",
    };
    for f in rules::families(cfg) {
        let (name, path) = match f {
            Family::V4 => ("net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
            Family::V6 => (
                "net.ipv6.conf.all.forwarding",
                "/proc/sys/net/ipv6/conf/all/forwarding",
            ),
        };
        match probe.read(path).map(|t| parse_sysctl(&t)) {
            Ok(Some(0)) => w.push(format!(
                "{name} is 0: this host does not route {}, so what pepd does not take (other \
                 protocols, bypassed subnets{open}) is dropped; set it to 1 \
                 (deploy/99-pepd.conf)",
                family_name(f)
            )),
            Ok(_) => {}
            Err(e) => w.push(format!("cannot read {path} ({e}): {name} was not checked")),
        }
    }
}

/// Connection-tracking entries `max_flows` needs: one per open flow, and as many again for
/// connections closing (conntrack keeps a closed TCP connection for 2 minutes in
/// TIME_WAIT) and the traffic the gateway routes.
pub fn conntrack_needed(max_flows: usize) -> u64 {
    2 * max_flows as u64
}

/// The kernel limits a busy gateway meets before `limits.max_flows`: the connection-tracking
/// table, the ephemeral ports of the upstream connects (and their reuse out of TIME_WAIT)
/// and the listeners' accept queue.
/// A limit that cannot be read is not checked (conntrack's is absent while the module is
/// not loaded, and then there is no table to fill).
fn check_kernel_limits(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let flows = cfg.limits.max_flows;
    let read = |path: &str| probe.read(path).ok();
    if let Some(max) =
        read("/proc/sys/net/netfilter/nf_conntrack_max").and_then(|t| parse_sysctl(&t))
    {
        let need = conntrack_needed(flows);
        if max < need as i64 {
            w.push(format!(
                "net.netfilter.nf_conntrack_max is {max}: `limits.max_flows` ({flows}) needs \
                 {need} connection-tracking entries (one per flow, as many again for \
                 connections closing and routed traffic); once the table is full the kernel \
                 drops new connections' SYNs; raise it: sysctl -w \
                 net.netfilter.nf_conntrack_max={need} (and in /etc/sysctl.d)"
            ));
        }
    }
    // Upstream connects from this gateway's own address take a port each per destination;
    // transparent ones use the clients' addresses, a range each.
    if !cfg.upstream.transparent_source {
        let range =
            read("/proc/sys/net/ipv4/ip_local_port_range").and_then(|t| parse_port_range(&t));
        if let Some((lo, hi)) = range {
            let ports = (hi - lo + 1).max(0) as u64;
            if ports < flows as u64 {
                w.push(format!(
                    "net.ipv4.ip_local_port_range is {lo} {hi}, {ports} ports: \
                     `limits.max_flows` ({flows}) connections to one destination need {flows} \
                     (upstream connects from this gateway's address fail with \
                     EADDRNOTAVAIL past that); widen it: sysctl -w \
                     net.ipv4.ip_local_port_range=\"1024 65535\" (and in /etc/sysctl.d)"
                ));
            }
        }
        check_time_wait_reuse(range, read("/proc/sys/net/ipv4/tcp_tw_reuse"), w);
    }
    if let Some(max) = read("/proc/sys/net/core/somaxconn").and_then(|t| parse_sysctl(&t)) {
        if max < flows as i64 {
            w.push(format!(
                "net.core.somaxconn is {max}: the listeners' accept queue holds at most that \
                 many new connections, fewer than `limits.max_flows` ({flows}); in a burst the \
                 rest lose their SYN and wait a second or more for the client to resend it; \
                 raise it: sysctl -w net.core.somaxconn={flows} (and in /etc/sysctl.d)"
            ));
        }
    }
}

/// How long a connection closed here holds its port in TIME_WAIT (the kernel's fixed
/// TCP_TIMEWAIT_LEN).
const TIME_WAIT_SECONDS: i64 = 60;

/// Without TIME_WAIT reuse for outgoing connects, every upstream connection this gateway
/// closes first keeps its ephemeral port for a minute: the port range then caps the rate of
/// new connections to one destination, not only how many are open (commit 689f520).
fn check_time_wait_reuse(range: Option<(i64, i64)>, reuse: Option<String>, w: &mut Vec<String>) {
    let Some(reuse) = reuse.as_deref().and_then(parse_sysctl) else {
        return;
    };
    if reuse == 1 {
        return;
    }
    let what = match reuse {
        0 => "is 0 (off)".to_owned(),
        2 => "is 2 (loopback connections only)".to_owned(),
        v => format!("is {v}"),
    };
    let ports = match range {
        Some((lo, hi)) => {
            let ports = (hi - lo + 1).max(0);
            format!(
                "net.ipv4.ip_local_port_range ({lo} {hi}) gives {ports} ports, so past about \
                 {} new connections a second to one destination",
                ports / TIME_WAIT_SECONDS
            )
        }
        None => "past what net.ipv4.ip_local_port_range gives in a minute, new connections \
                 to one destination"
            .to_owned(),
    };
    w.push(format!(
        "net.ipv4.tcp_tw_reuse {what}: each upstream connection this gateway closes first \
         holds its ephemeral port in TIME_WAIT for {TIME_WAIT_SECONDS} s; \
         {ports} fail with EADDRNOTAVAIL (the clients get a reset, reason resource_limit); \
         let connects reuse TIME_WAIT ports: sysctl -w net.ipv4.tcp_tw_reuse=1 (and in \
         /etc/sysctl.d, as deploy/99-pepd.conf does)"
    ));
}

/// `net.ipv4.ip_local_port_range`: two integers, the first and last port.
pub fn parse_port_range(text: &str) -> Option<(i64, i64)> {
    let mut it = text.split_whitespace().map(str::parse::<i64>);
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi)), None) => Some((lo, hi)),
        _ => None,
    }
}

/// The interfaces `rules.interfaces` names that exist (wildcards expanded), and a warning
/// for each name or pattern that matches none.
fn intercepting_interfaces(
    cfg: &PepdConfig,
    existing: &[String],
    w: &mut Vec<String>,
) -> Vec<String> {
    let system = |n: &str| matches!(n, "all" | "default" | "lo");
    if cfg.rules.interfaces.is_empty() {
        return existing.iter().filter(|n| !system(n)).cloned().collect();
    }
    let mut out: Vec<String> = Vec::new();
    for pattern in &cfg.rules.interfaces {
        let matched: Vec<&String> = match pattern.strip_suffix('*') {
            Some(prefix) => existing
                .iter()
                .filter(|n| !system(n) && n.starts_with(prefix))
                .collect(),
            None => existing.iter().filter(|n| *n == pattern).collect(),
        };
        if matched.is_empty() {
            w.push(format!(
                "no interface {pattern} exists (`rules.interfaces`): nothing is intercepted on it \
                 until it appears"
            ));
        }
        for n in matched {
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
    }
    out
}

fn check_rp_filter(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    const CONF: &str = "/proc/sys/net/ipv4/conf";
    let existing = match probe.list(CONF) {
        Ok(names) => names,
        Err(e) => {
            w.push(format!(
                "cannot list {CONF} ({e}): the interfaces and their rp_filter were not checked"
            ));
            return;
        }
    };
    let interfaces = intercepting_interfaces(cfg, &existing, w);
    // Only IPv4 has reverse-path filtering in the routing code.
    if rules::listener(cfg, Family::V4).is_none() {
        return;
    }
    let read = |iface: &str| {
        probe
            .read(&format!("{CONF}/{iface}/rp_filter"))
            .ok()
            .and_then(|t| parse_sysctl(&t))
    };
    let all = read("all").unwrap_or(0);
    for iface in interfaces {
        let Some(own) = read(&iface) else {
            continue;
        };
        // The kernel applies the larger of the two (so `all` = 2 makes every interface loose).
        if own.max(all) == 1 {
            w.push(format!(
                "reverse-path filtering is strict on {iface} (net.ipv4.conf.{iface}.rp_filter = \
                 {own}, net.ipv4.conf.all.rp_filter = {all}): packets from clients whose route \
                 back does not leave through {iface} are dropped before pepd sees them; use \
                 loose mode, 2 (deploy/99-pepd.conf)"
            ));
        }
    }
}

/// A route to every peer with a known address, with pepd's mark.
fn check_peer_routes(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let pair = matches!(cfg.peer, Peers::Pair(_));
    for (i, peer) in cfg.peer_specs().iter().enumerate() {
        let Some(address) = peer.address else {
            continue;
        };
        let target = PeerTarget {
            ip: address.ip().to_string(),
            // The pair's messages read as they always have.
            whom: if pair {
                "the peer".to_owned()
            } else {
                format!("peer {}", peer.name)
            },
            key: cfg.peer.address_key(i),
            pair,
        };
        if !check_peer_route(cfg, probe, &target, w) {
            return;
        }
    }
}

/// A peer as the route check names it.
struct PeerTarget {
    ip: String,
    /// "the peer", or "peer ship-7".
    whom: String,
    /// Its address key: `peer.address` or `peer[2].address`.
    key: String,
    pair: bool,
}

/// False when `ip` cannot be run, so the other peers are not tried.
fn check_peer_route(
    cfg: &PepdConfig,
    probe: &dyn Probe,
    peer: &PeerTarget,
    w: &mut Vec<String>,
) -> bool {
    let PeerTarget {
        ip,
        whom,
        key,
        pair,
    } = peer;
    let mark = format!("{:#x}", cfg.intercept.own_mark);
    // With pepd's mark, as the tunnel socket's packets are routed.
    let out = match probe.run("ip", &["-j", "route", "get", ip, "mark", &mark]) {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            w.push(IP_MISSING.into());
            return false;
        }
        Err(e) => {
            w.push(format!(
                "cannot run `ip` ({e}): the route to {whom} was not checked"
            ));
            return false;
        }
    };
    let no_route = |why: &str| {
        let at = if *pair {
            format!("{whom} {ip}")
        } else {
            format!("{whom} ({ip})")
        };
        format!("no route to {at} (`ip route get`: {why}): the tunnel cannot reach it")
    };
    if !out.success {
        w.push(no_route(&first_line(&out)));
        return true;
    }
    let kind = match Route::list_from_json(&out.stdout) {
        Ok(routes) => routes.into_iter().next().and_then(|r| r.kind),
        Err(e) => {
            w.push(format!(
                "`ip route get` printed output this check does not understand ({e}): the route \
                 to {whom} was not checked"
            ));
            return true;
        }
    };
    let theirs = if *pair {
        "the other gateway's"
    } else {
        "that peer's"
    };
    match kind.as_deref() {
        Some(k @ ("unreachable" | "prohibit" | "blackhole" | "throw")) => w.push(no_route(k)),
        Some("local") => w.push(format!(
            "`{key}` {ip} is an address of this host: it must be {theirs}"
        )),
        _ => {}
    }
    true
}

#[cfg(test)]
mod tests;
