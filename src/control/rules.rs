//! The interception rules `pepd nft-rules` prints: an nftables table that hands the TCP
//! selected by `[rules]` to the TPROXY listeners of `[intercept]`, and the policy routing
//! that delivers the marked packets to this host.
//!
//! How a connection is diverted: in prerouting, `tproxy` assigns the SYN to pepd's listener
//! and the rule marks it; the `fwmark` routing rule looks the packet up in a table whose only
//! route is `local default`, so it is delivered here instead of forwarded. Later packets of
//! the connection find pepd's socket through `socket transparent 1` and take the same path.
//!
//! `quic = "reject"` or `"drop"`: a forward chain refuses the clients' UDP to `quic_ports`,
//! selected as the TCP is (interfaces, families, bypass and proxy subnets), so that a browser
//! falls back to TCP, which pepd accelerates. Forward, not prerouting: only traffic routed
//! through this host is a client's on its way out; what is addressed to the host itself, and
//! the tunnel's own datagrams (sent and received by this host), never pass there. The peers'
//! tunnel endpoints are exempt all the same, for a pepd in a namespace or VM behind this
//! host.
//!
//! `fail = "closed"`: when no listener exists, `tproxy` matches nothing and evaluation goes
//! on with the next rule, which drops the packet. Doing this in prerouting, right after the
//! `tproxy` rule, needs no second copy of the selectors in a forward chain and also holds
//! when forwarding is off or another table accepts the packet in forward.

use std::fmt::Write as _;
use std::net::SocketAddr;

use ipnet::IpNet;

use crate::config::{FailMode, PepdConfig, QuicPolicy};

/// An address family pepd intercepts, i.e. one it has a listener for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// `ip`'s family flag.
    pub fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// The address keyword of nftables expressions (`ip daddr`, `tproxy ip6 to`).
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    fn nfproto(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    fn set_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "4",
            Family::V6 => "6",
        }
    }

    /// The default route's destination, as `ip route` takes it.
    pub fn any(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }

    fn holds(self, subnet: &IpNet) -> bool {
        subnet.addr().is_ipv4() == (self == Family::V4)
    }
}

/// The listener the rules send `family`'s connections to: the first of that family in
/// `intercept.listen`. `None`: that family is not intercepted.
pub fn listener(cfg: &PepdConfig, family: Family) -> Option<SocketAddr> {
    cfg.intercept
        .listen
        .iter()
        .copied()
        .find(|a| a.is_ipv4() == (family == Family::V4))
}

/// The families with a listener, IPv4 first.
pub fn families(cfg: &PepdConfig) -> Vec<Family> {
    [Family::V4, Family::V6]
        .into_iter()
        .filter(|f| listener(cfg, *f).is_some())
        .collect()
}

/// The `tproxy … to` target: the port alone for a wildcard listener, so the kernel looks the
/// listener up on the address of the interface the packet came in on.
fn tproxy_target(addr: SocketAddr) -> String {
    match addr {
        a if a.ip().is_unspecified() => format!(":{}", a.port()),
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// A set of subnets: `{ a, b }`, or the bare element when there is one (nftables prints
/// it that way too).
fn nft_list(items: &[String]) -> String {
    match items {
        [one] => one.clone(),
        many => format!("{{ {} }}", many.join(", ")),
    }
}

fn mark(m: u32) -> String {
    format!("{m:#x}")
}

/// Declaring the table before deleting it makes the delete succeed on a host that does not
/// have it yet; both happen in the same transaction as the new table, so there is no moment
/// without rules.
fn replace_table(table: &str) -> String {
    format!("table inet {table} {{}}\ndelete table inet {table}\n")
}

/// The complete nftables ruleset for `cfg`, for `nft -f`. Applying it again replaces the
/// table as a whole; nothing outside `table inet NAME` (`rules.table`) is touched.
pub fn nft_ruleset(cfg: &PepdConfig) -> String {
    let r = &cfg.rules;
    let table = &r.table;
    let fams = families(cfg);
    let tmark = mark(r.tproxy_mark);
    let mut s = String::new();
    // Writing to a String cannot fail; the results are discarded for that reason.
    let _ = writeln!(
        s,
        "# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again\n\
         # replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`\n\
         # (mark {tmark} -> table {} -> local delivery).",
        r.route_table
    );
    s.push_str(&replace_table(table));
    let _ = writeln!(s, "table inet {table} {{");

    if let Some(first) = fams.first() {
        let _ = writeln!(
            s,
            "\t# rules.bypass_subnets: never intercepted, as destination or source. More can be\n\
             \t# added at run time: nft add element inet {table} bypass{} {{ {} }}",
            first.suffix(),
            match first {
                Family::V4 => "198.18.0.0/15",
                Family::V6 => "fd00:198:18::/48",
            }
        );
    }
    for f in &fams {
        let elements: Vec<String> = r
            .bypass_subnets
            .iter()
            .filter(|c| f.holds(c))
            .map(ToString::to_string)
            .collect();
        write_set(&mut s, &format!("bypass{}", f.suffix()), *f, &elements);
    }
    // Only the families proxy_subnets names get a set: a family it leaves out is not
    // intercepted at all (the `return` below).
    let proxy: Vec<(Family, Vec<String>)> = if r.proxy_subnets.is_empty() {
        Vec::new()
    } else {
        fams.iter()
            .map(|f| {
                let elements = r
                    .proxy_subnets
                    .iter()
                    .filter(|c| f.holds(c))
                    .map(ToString::to_string)
                    .collect();
                (*f, elements)
            })
            .collect()
    };
    if proxy.iter().any(|(_, e)| !e.is_empty()) {
        s.push_str("\t# rules.proxy_subnets: only these destinations are intercepted.\n");
    }
    for (f, elements) in proxy.iter().filter(|(_, e)| !e.is_empty()) {
        write_set(&mut s, &format!("proxy{}", f.suffix()), *f, elements);
    }
    if r.quic != QuicPolicy::Pass {
        write_quic_sets(&mut s, cfg, &fams);
    }

    let _ = write!(
        s,
        "\tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority mangle; policy accept;\n\
         \t\t# pepd's own sockets (tunnel, upstream connections) are never intercepted.\n\
         \t\tmeta mark {} return\n\
         \t\t# Packets for sockets pepd holds: the client side of intercepted connections and,\n\
         \t\t# with upstream.transparent_source, the servers' replies to client addresses.\n\
         \t\tmeta l4proto tcp socket transparent 1 meta mark set {tmark} accept\n",
        mark(cfg.intercept.own_mark)
    );
    let mut select = Vec::new();
    if let [only] = fams.as_slice() {
        select.push(format!("meta nfproto {}", only.nfproto()));
    }
    match r.interfaces.as_slice() {
        [] => {}
        names => {
            let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
            select.push(format!("iifname {}", nft_list(&quoted)));
        }
    }
    match r.ports.as_slice() {
        [] => select.push("meta l4proto tcp".to_owned()),
        ports => {
            let ports: Vec<String> = ports.iter().map(ToString::to_string).collect();
            select.push(format!("tcp dport {}", nft_list(&ports)));
        }
    }
    // Only the client's direction: replies of connections that are not intercepted (to a
    // server behind an intercepting interface, or bypassed) must pass untouched.
    select.push("ct direction original".to_owned());
    let _ = write!(
        s,
        "\t\t# Connections selected by rules.interfaces and rules.ports.\n\
         \t\t{} jump intercept\n\
         \t}}\n\n",
        select.join(" ")
    );

    s.push_str(
        "\tchain intercept {\n\
         \t\t# Connections to this host itself are not proxied.\n\
         \t\tfib daddr type local return\n",
    );
    for f in &fams {
        let (nft, suffix) = (f.nft(), f.suffix());
        let _ = write!(
            s,
            "\t\t{nft} daddr @bypass{suffix} return\n\t\t{nft} saddr @bypass{suffix} return\n"
        );
    }
    for (f, elements) in &proxy {
        if elements.is_empty() {
            let _ = writeln!(s, "\t\tmeta nfproto {} return", f.nfproto());
        } else {
            let _ = writeln!(s, "\t\t{} daddr != @proxy{} return", f.nft(), f.suffix());
        }
    }
    for f in &fams {
        if let Some(addr) = listener(cfg, *f) {
            let _ = writeln!(
                s,
                "\t\tmeta l4proto tcp tproxy {} to {} meta mark set {tmark} accept",
                f.nft(),
                tproxy_target(addr)
            );
        }
    }
    if r.fail == FailMode::Closed {
        s.push_str(
            "\t\t# fail = \"closed\": no pepd listener took the connection; drop it rather than\n\
             \t\t# route it unproxied. Clients retry their SYNs until pepd is back.\n\
             \t\tdrop\n",
        );
    }
    s.push_str("\t}\n");
    if r.quic != QuicPolicy::Pass {
        write_quic_chains(&mut s, cfg, &fams, &proxy);
    }
    s.push_str("}\n");
    s
}

/// The name of the chain that decides about one client's QUIC datagram; the self-check
/// looks for its verdict.
pub const QUIC_CHAIN: &str = "quic";

/// The peers' tunnel endpoints of `family`, as `address . port` elements.
fn tunnel_endpoints(cfg: &PepdConfig, family: Family) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for peer in cfg.peer_specs() {
        let Some(a) = peer.address else { continue };
        if a.is_ipv4() != (family == Family::V4) {
            continue;
        }
        let element = format!("{} . {}", a.ip(), a.port());
        if !out.contains(&element) {
            out.push(element);
        }
    }
    out
}

fn write_quic_sets(s: &mut String, cfg: &PepdConfig, fams: &[Family]) {
    let r = &cfg.rules;
    let _ = writeln!(
        s,
        "\t# rules.quic_exceptions: never touched by rules.quic, as destination or source."
    );
    for f in fams {
        let elements: Vec<String> = r
            .quic_exceptions
            .iter()
            .filter(|c| f.holds(c))
            .map(ToString::to_string)
            .collect();
        write_set(s, &format!("quic_exceptions{}", f.suffix()), *f, &elements);
    }
    s.push_str("\t# The peers' tunnel endpoints (address . port): never touched by rules.quic.\n");
    for f in fams {
        let _ = write!(
            s,
            "\tset tunnel{} {{\n\t\ttype {} . inet_service\n",
            f.suffix(),
            f.set_type()
        );
        let elements = tunnel_endpoints(cfg, *f);
        if !elements.is_empty() {
            let _ = writeln!(s, "\t\telements = {{ {} }}", elements.join(", "));
        }
        s.push_str("\t}\n\n");
    }
}

/// The forward chain that selects the clients' QUIC as the prerouting chain selects their
/// TCP, and the chain that refuses it unless an exception holds.
fn write_quic_chains(
    s: &mut String,
    cfg: &PepdConfig,
    fams: &[Family],
    proxy: &[(Family, Vec<String>)],
) {
    let r = &cfg.rules;
    let mut select = Vec::new();
    if let [only] = fams {
        select.push(format!("meta nfproto {}", only.nfproto()));
    }
    if !r.interfaces.is_empty() {
        let quoted: Vec<String> = r.interfaces.iter().map(|n| format!("\"{n}\"")).collect();
        select.push(format!("iifname {}", nft_list(&quoted)));
    }
    let ports: Vec<String> = r.quic_ports.iter().map(ToString::to_string).collect();
    select.push(format!("udp dport {}", nft_list(&ports)));
    select.push("ct direction original".to_owned());
    let why = match r.quic {
        QuicPolicy::Reject => {
            "gets an ICMP port unreachable, so that they fall back at once\n\
             \t\t# to TCP, which pepd accelerates."
        }
        _ => {
            "is dropped, so that they fall back to TCP, which pepd\n\
             \t\t# accelerates, after their own QUIC timeout."
        }
    };
    let _ = write!(
        s,
        "\n\tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\t# rules.quic = \"{}\": the clients' QUIC (UDP to rules.quic_ports from\n\
         \t\t# rules.interfaces) {why}\n\
         \t\t{} jump {QUIC_CHAIN}\n\
         \t}}\n\n\
         \tchain {QUIC_CHAIN} {{\n\
         \t\t# Never the tunnel's datagrams, rules.bypass_subnets or rules.quic_exceptions.\n",
        r.quic.name(),
        select.join(" ")
    );
    for f in fams {
        let (nft, suffix) = (f.nft(), f.suffix());
        let _ = write!(
            s,
            "\t\t{nft} daddr . udp dport @tunnel{suffix} return\n\
             \t\t{nft} saddr . udp sport @tunnel{suffix} return\n\
             \t\t{nft} daddr @bypass{suffix} return\n\
             \t\t{nft} saddr @bypass{suffix} return\n\
             \t\t{nft} daddr @quic_exceptions{suffix} return\n\
             \t\t{nft} saddr @quic_exceptions{suffix} return\n"
        );
    }
    for (f, elements) in proxy {
        if elements.is_empty() {
            let _ = writeln!(s, "\t\tmeta nfproto {} return", f.nfproto());
        } else {
            let _ = writeln!(s, "\t\t{} daddr != @proxy{} return", f.nft(), f.suffix());
        }
    }
    let verdict = match r.quic {
        QuicPolicy::Reject => "reject with icmpx type port-unreachable",
        _ => "drop",
    };
    let _ = writeln!(s, "\t\tcounter {verdict}\n\t}}");
}

fn write_set(s: &mut String, name: &str, family: Family, elements: &[String]) {
    let _ = write!(
        s,
        "\tset {name} {{\n\
         \t\ttype {}\n\
         \t\tflags interval\n\
         \t\tauto-merge\n",
        family.set_type()
    );
    if !elements.is_empty() {
        let _ = writeln!(s, "\t\telements = {{ {} }}", elements.join(", "));
    }
    s.push_str("\t}\n\n");
}

/// Removes pepd's table (`rules.table`), for `nft -f`; harmless when it is not there.
pub fn nft_teardown(cfg: &PepdConfig) -> String {
    format!(
        "# Removes pepd's interception rules (`pepd nft-rules --remove`).\n{}",
        replace_table(&cfg.rules.table)
    )
}

/// One `ip` invocation of the policy routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteCommand {
    /// Must succeed.
    Run(Vec<String>),
    /// Repeated until it fails: deletes every copy of a rule or route, none being fine.
    /// Rules are not unique in the kernel, so re-adding without this would pile them up.
    RemoveAll(Vec<String>),
}

impl RouteCommand {
    pub fn argv(&self) -> &[String] {
        match self {
            RouteCommand::Run(a) | RouteCommand::RemoveAll(a) => a,
        }
    }

    /// The command as a line of `sh`.
    pub fn shell(&self) -> String {
        let line = self.argv().join(" ");
        match self {
            RouteCommand::Run(_) => line,
            RouteCommand::RemoveAll(_) => format!("while {line} 2>/dev/null; do :; done"),
        }
    }
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn fwmark_rule(cfg: &PepdConfig, f: Family, verb: &str) -> Vec<String> {
    let (m, table) = (
        mark(cfg.rules.tproxy_mark),
        cfg.rules.route_table.to_string(),
    );
    argv(&[
        "ip",
        f.ip_flag(),
        "rule",
        verb,
        "fwmark",
        &m,
        "lookup",
        &table,
    ])
}

fn local_route(cfg: &PepdConfig, f: Family, verb: &str) -> Vec<String> {
    let table = cfg.rules.route_table.to_string();
    argv(&[
        "ip",
        f.ip_flag(),
        "route",
        verb,
        "local",
        f.any(),
        "dev",
        "lo",
        "table",
        &table,
    ])
}

/// The policy routing that delivers marked packets to this host, per intercepted family:
/// packets with `tproxy_mark` are looked up in `route_table`, whose `local` default route
/// makes every destination local. Safe to run again.
pub fn policy_routing(cfg: &PepdConfig) -> Vec<RouteCommand> {
    let mut cmds = Vec::new();
    for f in families(cfg) {
        cmds.push(RouteCommand::RemoveAll(fwmark_rule(cfg, f, "del")));
        cmds.push(RouteCommand::Run(fwmark_rule(cfg, f, "add")));
        cmds.push(RouteCommand::Run(local_route(cfg, f, "replace")));
    }
    cmds
}

/// Undoes [`policy_routing`]; harmless when nothing is installed.
pub fn policy_routing_teardown(cfg: &PepdConfig) -> Vec<RouteCommand> {
    let mut cmds = Vec::new();
    for f in families(cfg) {
        cmds.push(RouteCommand::RemoveAll(fwmark_rule(cfg, f, "del")));
        cmds.push(RouteCommand::RemoveAll(local_route(cfg, f, "del")));
    }
    cmds
}

/// `cmds` as a POSIX shell script that stops at the first failing command.
pub fn shell_script(header: &str, cmds: &[RouteCommand]) -> String {
    let mut s = String::from("#!/bin/sh\n");
    for line in header.lines() {
        let _ = writeln!(s, "# {line}");
    }
    s.push_str("set -e\n");
    for c in cmds {
        let _ = writeln!(s, "{}", c.shell());
    }
    s
}

/// What `pepd nft-rules --routes` prints.
pub fn routes_script(cfg: &PepdConfig) -> String {
    let r = &cfg.rules;
    shell_script(
        &format!(
            "pepd policy routing, from `pepd nft-rules --routes`. Packets the nftables rules\n\
             mark {} are looked up in table {}, whose local default route delivers them to\n\
             this host. Safe to run again.",
            mark(r.tproxy_mark),
            r.route_table
        ),
        &policy_routing(cfg),
    )
}

/// What `pepd nft-rules --routes --remove` prints.
pub fn routes_teardown_script(cfg: &PepdConfig) -> String {
    shell_script(
        "Removes pepd's policy routing (`pepd nft-rules --routes --remove`).",
        &policy_routing_teardown(cfg),
    )
}

#[cfg(test)]
mod tests;
