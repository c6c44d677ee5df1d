//! Start-up self-check for the usual reasons intercepted connections never reach pepd: no
//! `tproxy` rule for our listener, no policy routing for the mark, forwarding off, strict
//! reverse-path filtering, no route to the peer. Every check is independent and only
//! produces warnings: pepd may run with rules it cannot see (iptables-legacy, another
//! network namespace), and a missing tool must not stop the gateway.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use crate::config::{FailMode, PepdConfig};
use crate::rules::{self, Family};

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
    check_peer_route(cfg, probe, &mut w);
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

/// A `tproxy` statement in `nft list ruleset` output.
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

/// Every `tproxy` statement in an `nft list ruleset` listing.
pub fn parse_tproxy_rules(ruleset: &str) -> Vec<TproxyRule> {
    let mut found = Vec::new();
    for line in ruleset.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "tproxy") else {
            continue;
        };
        let mut rest = words.get(at + 1..).unwrap_or_default();
        let family = match rest.first() {
            Some(&"ip") => Some(Family::V4),
            Some(&"ip6") => Some(Family::V6),
            _ => None,
        };
        if family.is_some() {
            rest = rest.get(1..).unwrap_or_default();
        }
        let Some((&"to", rest)) = rest.split_first() else {
            continue;
        };
        let Some((target, rest)) = rest.split_first() else {
            continue;
        };
        let Some((addr, port)) = parse_tproxy_target(target) else {
            continue;
        };
        let mark = rest
            .windows(3)
            .find(|w| w[0] == "mark" && w[1] == "set")
            .and_then(|w| parse_u32(w[2]));
        found.push(TproxyRule {
            family,
            addr,
            port,
            mark,
        });
    }
    found
}

/// `:7000`, `198.18.0.1:7000`, `[fd00::1]:7000`, or an address alone.
fn parse_tproxy_target(t: &str) -> Option<(Option<IpAddr>, Option<u16>)> {
    if let Some(port) = t.strip_prefix(':') {
        return Some((None, Some(port.parse().ok()?)));
    }
    if let Some(v6) = t.strip_prefix('[') {
        let (addr, rest) = v6.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None => None,
        };
        return Some((Some(addr.parse().ok()?), port));
    }
    if let Ok(addr) = t.parse::<IpAddr>() {
        return Some((Some(addr), None));
    }
    let (addr, port) = t.rsplit_once(':')?;
    Some((Some(addr.parse().ok()?), Some(port.parse().ok()?)))
}

/// Decimal or `0x` hex, as nft and ip print marks.
fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn check_nft(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let out = match probe.run("nft", &["list", "ruleset"]) {
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
    // iptables-nft shows an xt TPROXY target without its port; trust it rather than warn.
    if out.stdout.contains("xt target \"TPROXY\"") {
        return;
    }
    let found = parse_tproxy_rules(&out.stdout);
    let tmark = cfg.rules.tproxy_mark;
    for f in rules::families(cfg) {
        let Some(listener) = rules::listener(cfg, f) else {
            continue;
        };
        let ours: Vec<&TproxyRule> = found.iter().filter(|r| r.sends_to(f, listener)).collect();
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
}

/// A line of `ip -N rule show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRule {
    pub priority: u32,
    /// Value and mask (`fwmark 0x1` has mask 0xffffffff).
    pub fwmark: Option<(u32, u32)>,
    /// The table looked up, as printed (a number with `-N`).
    pub lookup: Option<String>,
}

impl IpRule {
    fn matches_mark(&self, mark: u32) -> bool {
        self.fwmark
            .is_some_and(|(value, mask)| mark & mask == value & mask)
    }
}

/// Every rule in `ip rule show` output (`32765: from all fwmark 0x1 lookup 100`, with a
/// tab after the colon).
pub fn parse_ip_rules(text: &str) -> Vec<IpRule> {
    let mut rules = Vec::new();
    for line in text.lines() {
        let Some((prio, rest)) = line.split_once(':') else {
            continue;
        };
        let Ok(priority) = prio.trim().parse() else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let after = |key: &str| {
            words
                .windows(2)
                .find(|w| w[0] == key)
                .map(|w| w[1].to_owned())
        };
        let fwmark = after("fwmark").and_then(|m| match m.split_once('/') {
            Some((v, mask)) => Some((parse_u32(v)?, parse_u32(mask)?)),
            None => Some((parse_u32(&m)?, u32::MAX)),
        });
        rules.push(IpRule {
            priority,
            fwmark,
            // `table` is iproute2's other spelling of `lookup`.
            lookup: after("lookup").or_else(|| after("table")),
        });
    }
    rules
}

/// Whether `ip route show table N` lists a `local` default route.
pub fn has_local_default(routes: &str, family: Family) -> bool {
    routes.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some("local")
            && words
                .next()
                .is_some_and(|dst| dst == "default" || dst == family.any())
    })
}

fn check_policy_routing(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let r = &cfg.rules;
    let table = r.route_table.to_string();
    let how = "run the script from `pepd nft-rules --routes`";
    for f in rules::families(cfg) {
        let fam = family_name(f);
        // -N prints table numbers, not names from rt_tables; iproute2 before 5.x lacks it.
        let listed = match probe.run("ip", &["-N", f.ip_flag(), "rule", "show"]) {
            Ok(out) if !out.success => probe.run("ip", &[f.ip_flag(), "rule", "show"]),
            other => other,
        };
        match listed {
            Ok(out) if out.success => {
                let all = parse_ip_rules(&out.stdout);
                let main_prio = all
                    .iter()
                    .find(|x| {
                        x.fwmark.is_none() && matches!(x.lookup.as_deref(), Some("254" | "main"))
                    })
                    .map(|x| x.priority);
                let ours = all.iter().find(|x| {
                    x.matches_mark(r.tproxy_mark) && x.lookup.as_deref() == Some(table.as_str())
                });
                match (ours, main_prio) {
                    (None, _) => w.push(format!(
                        "no {fam} `ip rule` looks up table {table} for mark {:#x}: intercepted \
                         connections are forwarded instead of delivered to pepd; {how}",
                        r.tproxy_mark
                    )),
                    (Some(ours), Some(main)) if ours.priority >= main => w.push(format!(
                        "the {fam} `ip rule` for mark {:#x} (priority {}) comes after the main \
                         table's (priority {main}), which routes the packets first; give it a \
                         lower priority",
                        r.tproxy_mark, ours.priority
                    )),
                    _ => {}
                }
            }
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
        // A table that does not exist makes `ip` fail; that is the same finding as an empty
        // one.
        match probe.run("ip", &[f.ip_flag(), "route", "show", "table", &table]) {
            Ok(out) if out.success && has_local_default(&out.stdout, f) => {}
            Ok(_) => w.push(format!(
                "table {table} has no {fam} `local default dev lo` route: marked packets are \
                 forwarded instead of delivered to pepd; {how}"
            )),
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

fn check_peer_route(cfg: &PepdConfig, probe: &dyn Probe, w: &mut Vec<String>) {
    let peer = cfg.peer.address.ip().to_string();
    let mark = format!("{:#x}", cfg.intercept.own_mark);
    // With pepd's mark, as the tunnel socket's packets are routed.
    let out = match probe.run("ip", &["route", "get", &peer, "mark", &mark]) {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            w.push(IP_MISSING.into());
            return;
        }
        Err(e) => {
            w.push(format!(
                "cannot run `ip` ({e}): the route to the peer was not checked"
            ));
            return;
        }
    };
    let kind = out.stdout.split_whitespace().next().unwrap_or("");
    if !out.success || matches!(kind, "unreachable" | "prohibit" | "blackhole" | "throw") {
        let why = if out.success {
            kind.to_owned()
        } else {
            first_line(&out)
        };
        w.push(format!(
            "no route to the peer {peer} (`ip route get`: {why}): the tunnel cannot reach it"
        ));
    } else if kind == "local" {
        w.push(format!(
            "`peer.address` {peer} is an address of this host: it must be the other gateway's"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Captured outputs keyed by the command line or path; anything else does not exist.
    #[derive(Default)]
    struct Fake {
        cmds: HashMap<String, Output>,
        files: HashMap<String, String>,
        dirs: HashMap<String, Vec<String>>,
        no_programs: bool,
    }

    impl Fake {
        fn ok(mut self, cmd: &str, stdout: &str) -> Self {
            self.cmds.insert(
                cmd.into(),
                Output {
                    success: true,
                    stdout: stdout.into(),
                    stderr: String::new(),
                },
            );
            self
        }

        fn fail(mut self, cmd: &str, stderr: &str) -> Self {
            self.cmds.insert(
                cmd.into(),
                Output {
                    success: false,
                    stdout: String::new(),
                    stderr: stderr.into(),
                },
            );
            self
        }

        fn file(mut self, path: &str, text: &str) -> Self {
            self.files.insert(path.into(), text.into());
            self
        }

        fn dir(mut self, path: &str, names: &[&str]) -> Self {
            self.dirs
                .insert(path.into(), names.iter().map(|n| (*n).into()).collect());
            self
        }
    }

    impl Probe for Fake {
        fn run(&self, prog: &str, args: &[&str]) -> io::Result<Output> {
            let line = format!("{prog} {}", args.join(" "));
            if self.no_programs {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            self.cmds
                .get(&line)
                .cloned()
                .ok_or_else(|| io::Error::other(format!("unexpected command {line}")))
        }

        fn read(&self, path: &str) -> io::Result<String> {
            self.files
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn list(&self, dir: &str) -> io::Result<Vec<String>> {
            self.dirs
                .get(dir)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    /// `nft list ruleset` after loading `pepd nft-rules` for a config with listeners
    /// 0.0.0.0:7000 and [fd00:198:18::1]:7001, mark 0x10 (captured on nftables 1.0.6).
    const RULESET: &str = "table inet pepd {
	set bypass4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.9.0-198.18.10.255 }
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		meta mark 0x00000002 return
		meta l4proto tcp socket transparent 1 meta mark set 0x00000010 accept
		iifname { \"lan0\", \"vlan*\" } tcp dport { 80, 443 } ct direction original jump intercept
	}

	chain intercept {
		fib daddr type local return
		ip daddr @bypass4 return
		meta l4proto tcp tproxy ip to :7000 meta mark set 0x00000010 accept
		meta l4proto tcp tproxy ip6 to [fd00:198:18::1]:7001 meta mark set 0x00000010 accept
		drop
	}
}
";

    /// `ip -N -4 rule show` with the policy routing for mark 0x1, table 100 (iproute2 6.1).
    const RULES_V4: &str = "0:\tfrom all lookup 255
32765:\tfrom all fwmark 0x1 lookup 100
32766:\tfrom all lookup 254
32767:\tfrom all lookup 253
";
    const RULES_V6: &str = "0:\tfrom all lookup 255
32765:\tfrom all fwmark 0x1 lookup 100
32766:\tfrom all lookup 254
";
    const ROUTES_V4: &str = "local default dev lo scope host \n";
    const ROUTES_V6: &str = "local default dev lo metric 1024 pref medium\n";
    const ROUTE_TO_PEER: &str =
        "198.18.0.1 via 198.18.2.1 dev wan0 src 198.18.2.2 mark 2 uid 0 \n    cache \n";

    #[test]
    fn parses_tproxy_statements() {
        assert_eq!(
            parse_tproxy_rules(RULESET),
            [
                TproxyRule {
                    family: Some(Family::V4),
                    addr: None,
                    port: Some(7000),
                    mark: Some(0x10),
                },
                TproxyRule {
                    family: Some(Family::V6),
                    addr: Some("fd00:198:18::1".parse().expect("addr")),
                    port: Some(7001),
                    mark: Some(0x10),
                },
            ]
        );
        let other = "\t\tmeta l4proto tcp tproxy to :7000
\t\ttcp dport 80 tproxy ip to 198.18.0.1:7002 accept
\t\ttproxy ip6 to fd00:198:18::1
\t\ttproxy ip to 198.18.0.1
\t\ttproxy ip to
\t\ttproxy ip to :http
";
        assert_eq!(
            parse_tproxy_rules(other),
            [
                TproxyRule {
                    family: None,
                    addr: None,
                    port: Some(7000),
                    mark: None,
                },
                TproxyRule {
                    family: Some(Family::V4),
                    addr: Some("198.18.0.1".parse().expect("addr")),
                    port: Some(7002),
                    mark: None,
                },
                TproxyRule {
                    family: Some(Family::V6),
                    addr: Some("fd00:198:18::1".parse().expect("addr")),
                    port: None,
                    mark: None,
                },
                TproxyRule {
                    family: Some(Family::V4),
                    addr: Some("198.18.0.1".parse().expect("addr")),
                    port: None,
                    mark: None,
                },
            ]
        );
    }

    #[test]
    fn parses_ip_rules() {
        let text = "0:\tfrom all lookup 255
100:\tfrom all fwmark 0x10/0xff lookup 4242
32765:\tfrom all fwmark 0x1 lookup 100
32766:\tfrom all lookup 254
garbage
32767:\tfrom all lookup default
";
        let rules = parse_ip_rules(text);
        let rule = |priority, fwmark, lookup: &str| IpRule {
            priority,
            fwmark,
            lookup: Some(lookup.to_owned()),
        };
        assert_eq!(
            rules,
            [
                rule(0, None, "255"),
                rule(100, Some((0x10, 0xff)), "4242"),
                rule(32765, Some((0x1, u32::MAX)), "100"),
                rule(32766, None, "254"),
                rule(32767, None, "default"),
            ]
        );
        assert!(rules[1].matches_mark(0x110));
        assert!(!rules[1].matches_mark(0x11));
        assert!(rules[2].matches_mark(0x1));
        assert!(!rules[2].matches_mark(0x3));
    }

    #[test]
    fn finds_the_local_default_route() {
        assert!(has_local_default(ROUTES_V4, Family::V4));
        assert!(has_local_default(ROUTES_V6, Family::V6));
        assert!(has_local_default("local 0.0.0.0/0 dev lo", Family::V4));
        assert!(!has_local_default(
            "default via 198.18.0.1 dev eth0",
            Family::V4
        ));
        assert!(!has_local_default("local 198.18.0.0/15 dev lo", Family::V4));
        assert!(!has_local_default("", Family::V6));
    }

    #[test]
    fn sysctl_values() {
        assert_eq!(parse_sysctl("1\n"), Some(1));
        assert_eq!(parse_sysctl(" 0 "), Some(0));
        assert_eq!(parse_sysctl("x"), None);
    }

    fn config(rules: &str) -> PepdConfig {
        PepdConfig::parse(&format!(
            "[intercept]\nlisten = [\"0.0.0.0:7000\", \"[::]:7000\"]\n\
             [rules]\n{rules}\n\
             [peer]\naddress = \"198.18.0.1:7400\"\nside = \"terminal\"\n\
             [link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n"
        ))
        .expect("config")
    }

    /// A gateway set up as docs/OPERATIONS.md says.
    fn healthy() -> Fake {
        Fake::default()
            .ok(
                "nft list ruleset",
                &RULESET
                    .replace("0x00000010", "0x00000001")
                    .replace("[fd00:198:18::1]:7001", ":7000"),
            )
            .ok("ip -N -4 rule show", RULES_V4)
            .ok("ip -N -6 rule show", RULES_V6)
            .ok("ip -4 route show table 100", ROUTES_V4)
            .ok("ip -6 route show table 100", ROUTES_V6)
            .ok("ip route get 198.18.0.1 mark 0x2", ROUTE_TO_PEER)
            .file("/proc/sys/net/ipv4/ip_forward", "1\n")
            .file("/proc/sys/net/ipv6/conf/all/forwarding", "1\n")
            .dir(
                "/proc/sys/net/ipv4/conf",
                &["all", "default", "lan0", "lo", "wan0"],
            )
            .file("/proc/sys/net/ipv4/conf/all/rp_filter", "0\n")
            .file("/proc/sys/net/ipv4/conf/lan0/rp_filter", "2\n")
            .file("/proc/sys/net/ipv4/conf/wan0/rp_filter", "2\n")
    }

    #[test]
    fn a_healthy_gateway_gets_no_warnings() {
        let cfg = config("interfaces = [\"lan0\"]");
        assert_eq!(startup_checks_with(&cfg, &healthy()), Vec::<String>::new());
    }

    #[test]
    fn a_bare_host_gets_every_warning() {
        let cfg = config("interfaces = [\"lan0\", \"vlan*\"]");
        let probe = Fake::default()
            .ok("nft list ruleset", "")
            .ok(
                "ip -N -4 rule show",
                "0:\tfrom all lookup 255\n32766:\tfrom all lookup 254\n",
            )
            .ok("ip -N -6 rule show", "0:\tfrom all lookup 255\n")
            .fail(
                "ip -4 route show table 100",
                "Error: ipv4: FIB table does not exist.\nDump terminated\n",
            )
            .ok("ip -6 route show table 100", "")
            .fail(
                "ip route get 198.18.0.1 mark 0x2",
                "RTNETLINK answers: Network is unreachable\n",
            )
            .file("/proc/sys/net/ipv4/ip_forward", "0\n")
            .file("/proc/sys/net/ipv6/conf/all/forwarding", "0\n")
            .dir("/proc/sys/net/ipv4/conf", &["all", "default", "lan0", "lo"])
            .file("/proc/sys/net/ipv4/conf/all/rp_filter", "0\n")
            .file("/proc/sys/net/ipv4/conf/lan0/rp_filter", "1\n");
        assert_eq!(
            startup_checks_with(&cfg, &probe),
            [
                "no nftables `tproxy` rule sends IPv4 TCP to port 7000 (`intercept.listen` \
                 0.0.0.0:7000): connections are routed past pepd; load the rules from `pepd \
                 nft-rules` (or, with iptables-legacy, check them there)",
                "no nftables `tproxy` rule sends IPv6 TCP to port 7000 (`intercept.listen` \
                 [::]:7000): connections are routed past pepd; load the rules from `pepd \
                 nft-rules` (or, with iptables-legacy, check them there)",
                "no IPv4 `ip rule` looks up table 100 for mark 0x1: intercepted connections are \
                 forwarded instead of delivered to pepd; run the script from `pepd nft-rules \
                 --routes`",
                "table 100 has no IPv4 `local default dev lo` route: marked packets are \
                 forwarded instead of delivered to pepd; run the script from `pepd nft-rules \
                 --routes`",
                "no IPv6 `ip rule` looks up table 100 for mark 0x1: intercepted connections are \
                 forwarded instead of delivered to pepd; run the script from `pepd nft-rules \
                 --routes`",
                "table 100 has no IPv6 `local default dev lo` route: marked packets are \
                 forwarded instead of delivered to pepd; run the script from `pepd nft-rules \
                 --routes`",
                "net.ipv4.ip_forward is 0: this host does not route IPv4, so what pepd does not \
                 take (other protocols, bypassed subnets, and with `rules.fail = \"open\"` all \
                 TCP while pepd is down) is dropped; set it to 1 (deploy/99-pepd.conf)",
                "net.ipv6.conf.all.forwarding is 0: this host does not route IPv6, so what pepd \
                 does not take (other protocols, bypassed subnets, and with `rules.fail = \
                 \"open\"` all TCP while pepd is down) is dropped; set it to 1 \
                 (deploy/99-pepd.conf)",
                "no interface vlan* exists (`rules.interfaces`): nothing is intercepted on it \
                 until it appears",
                "reverse-path filtering is strict on lan0 (net.ipv4.conf.lan0.rp_filter = 1, \
                 net.ipv4.conf.all.rp_filter = 0): packets from clients whose route back does \
                 not leave through lan0 are dropped before pepd sees them; use loose mode, 2 \
                 (deploy/99-pepd.conf)",
                "no route to the peer 198.18.0.1 (`ip route get`: RTNETLINK answers: Network is \
                 unreachable): the tunnel cannot reach it",
            ]
        );
    }

    #[test]
    fn mismatched_mark_late_rule_and_local_peer() {
        let cfg = config("tproxy_mark = 0x1\nfail = \"closed\"");
        let probe = healthy()
            .ok("nft list ruleset", RULESET)
            .ok(
                "ip -N -4 rule show",
                "0:\tfrom all lookup 255\n32766:\tfrom all lookup 254\n\
                 32767:\tfrom all fwmark 0x1 lookup 100\n",
            )
            .ok(
                "ip route get 198.18.0.1 mark 0x2",
                "local 198.18.0.1 dev lo table local src 198.18.0.1 mark 2 uid 0 \n",
            )
            .file("/proc/sys/net/ipv4/conf/all/rp_filter", "1\n")
            .file("/proc/sys/net/ipv4/conf/lan0/rp_filter", "0\n");
        assert_eq!(
            startup_checks_with(&cfg, &probe),
            [
                "the nftables `tproxy` rule for IPv4 port 7000 sets mark 0x10, not \
                 `rules.tproxy_mark` (0x1): the policy routing for 0x1 does not deliver those \
                 packets to pepd",
                // The listing's IPv6 rule goes to port 7001, not ours.
                "no nftables `tproxy` rule sends IPv6 TCP to port 7000 (`intercept.listen` \
                 [::]:7000): connections are routed past pepd; load the rules from `pepd \
                 nft-rules` (or, with iptables-legacy, check them there)",
                "the IPv4 `ip rule` for mark 0x1 (priority 32767) comes after the main table's \
                 (priority 32766), which routes the packets first; give it a lower priority",
                // With no `rules.interfaces` every interface is checked; `all` = 1 makes
                // lan0 (0) strict while wan0 (2) stays loose.
                "reverse-path filtering is strict on lan0 (net.ipv4.conf.lan0.rp_filter = 0, \
                 net.ipv4.conf.all.rp_filter = 1): packets from clients whose route back does \
                 not leave through lan0 are dropped before pepd sees them; use loose mode, 2 \
                 (deploy/99-pepd.conf)",
                "`peer.address` 198.18.0.1 is an address of this host: it must be the other \
                 gateway's",
            ]
        );
    }

    #[test]
    fn missing_tools_are_reported_once_and_nothing_fails() {
        let cfg = config("interfaces = [\"lan0\"]");
        let probe = Fake {
            no_programs: true,
            ..healthy()
        };
        assert_eq!(
            startup_checks_with(&cfg, &probe),
            [
                "`nft` is not installed: the interception rules were not checked (they come from \
                 `pepd nft-rules`)",
                IP_MISSING,
            ]
        );
        let probe = Fake::default()
            .fail(
                "nft list ruleset",
                "Error: Operation not permitted (you must be root)\n",
            )
            .fail(
                "ip -N -4 rule show",
                "Option \"-N\" is unknown, try \"ip -help\".\n",
            )
            .fail("ip -4 rule show", "Error: something\n")
            .ok("ip -4 route show table 100", ROUTES_V4)
            .fail("ip -N -6 rule show", "")
            .fail("ip -6 rule show", "")
            .ok("ip -6 route show table 100", ROUTES_V6)
            .ok(
                "ip route get 198.18.0.1 mark 0x2",
                "unreachable 198.18.0.1 table main mark 2\n",
            );
        assert_eq!(
            startup_checks_with(&cfg, &probe),
            [
                "`nft list ruleset` failed (Error: Operation not permitted (you must be root)): \
                 the interception rules were not checked",
                "`ip -4 rule show` failed (Error: something): the policy routing was not checked",
                "`ip -6 rule show` failed (no output): the policy routing was not checked",
                "cannot read /proc/sys/net/ipv4/ip_forward (entity not found): \
                 net.ipv4.ip_forward was not checked",
                "cannot read /proc/sys/net/ipv6/conf/all/forwarding (entity not found): \
                 net.ipv6.conf.all.forwarding was not checked",
                "cannot list /proc/sys/net/ipv4/conf (entity not found): the interfaces and \
                 their rp_filter were not checked",
                "no route to the peer 198.18.0.1 (`ip route get`: unreachable): the tunnel \
                 cannot reach it",
            ]
        );
    }

    #[test]
    fn old_iproute2_without_numeric_output() {
        let cfg = config("interfaces = [\"lan0\"]");
        let unknown = "Option \"-N\" is unknown, try \"ip -help\".\n";
        let probe = healthy()
            .fail("ip -N -4 rule show", unknown)
            .ok(
                "ip -4 rule show",
                "0:\tfrom all lookup local\n32766:\tfrom all lookup main\n\
                 32767:\tfrom all fwmark 0x1 lookup 100\n",
            )
            .fail("ip -N -6 rule show", unknown)
            .ok("ip -6 rule show", &RULES_V6.replace("254", "main"));
        assert_eq!(
            startup_checks_with(&cfg, &probe),
            [
                "the IPv4 `ip rule` for mark 0x1 (priority 32767) comes after the main table's \
              (priority 32766), which routes the packets first; give it a lower priority"
            ]
        );
    }

    #[test]
    fn iptables_tproxy_is_trusted() {
        let cfg = config("");
        let probe = healthy().ok(
            "nft list ruleset",
            "table ip mangle {\n\tchain PREROUTING {\n\t\tmeta l4proto tcp counter packets 0 \
             bytes 0 xt target \"TPROXY\"\n\t}\n}\n",
        );
        assert_eq!(startup_checks_with(&cfg, &probe), Vec::<String>::new());
    }
}
