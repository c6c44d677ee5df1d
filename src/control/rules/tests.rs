//! The generated rules, compared as text: what operators load must be exactly this. That the
//! rules also work is tests/rules.rs's job (network namespaces, root).

use super::*;

/// Dual-stack, every selector, fail closed; the IPv6 listener on its own address and port.
const FULL: &str = r#"[intercept]
listen = ["0.0.0.0:7000", "[fd00:198:18::1]:7001"]
own_mark = 0x2
[rules]
interfaces = ["lan0", "vlan*"]
ports = [80, 443]
bypass_subnets = ["198.18.9.0/24", "fd00:198:18:9::/64", "198.18.10.0/24"]
proxy_subnets = ["198.18.0.0/15"]
tproxy_mark = 0x10
route_table = 4242
fail = "closed"
[peer]
address = "198.18.0.1:7400"
side = "terminal"
[link]
tx_rate = "2M"
rx_rate = "10M"
"#;

/// IPv6 only: one family, so the selection names it and only IPv6 routing is set up.
const V6_ONLY: &str = r#"[intercept]
listen = ["[::]:7000"]
[rules]
ports = [22]
proxy_subnets = ["fd00:198:18::/48"]
[peer]
address = "198.18.0.1:7400"
side = "terminal"
[link]
tx_rate = "2M"
rx_rate = "10M"
"#;

fn config(text: &str) -> PepdConfig {
    PepdConfig::parse(text).expect("config")
}

#[test]
fn example_config_gives_deploy_pepd_nft() {
    // deploy/pepd.nft is what `pepd nft-rules -c config/terminal.toml` prints; regenerate it
    // with that command when either changes.
    let cfg = config(include_str!("../../../config/terminal.toml"));
    assert_eq!(nft_ruleset(&cfg), include_str!("../../../deploy/pepd.nft"));
}

#[test]
fn full_ruleset() {
    assert_eq!(
        nft_ruleset(&config(FULL)),
        r#"# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again
# replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`
# (mark 0x10 -> table 4242 -> local delivery).
table inet pepd {}
delete table inet pepd
table inet pepd {
	# rules.bypass_subnets: never intercepted, as destination or source. More can be
	# added at run time: nft add element inet pepd bypass4 { 198.18.0.0/15 }
	set bypass4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.9.0/24, 198.18.10.0/24 }
	}

	set bypass6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18:9::/64 }
	}

	# rules.proxy_subnets: only these destinations are intercepted.
	set proxy4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.0.0/15 }
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		# pepd's own sockets (tunnel, upstream connections) are never intercepted.
		meta mark 0x2 return
		# Packets for sockets pepd holds: the client side of intercepted connections and,
		# with upstream.transparent_source, the servers' replies to client addresses.
		meta l4proto tcp socket transparent 1 meta mark set 0x10 accept
		# Connections selected by rules.interfaces and rules.ports.
		iifname { "lan0", "vlan*" } tcp dport { 80, 443 } ct direction original jump intercept
	}

	chain intercept {
		# Connections to this host itself are not proxied.
		fib daddr type local return
		ip daddr @bypass4 return
		ip saddr @bypass4 return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip daddr != @proxy4 return
		meta nfproto ipv6 return
		meta l4proto tcp tproxy ip to :7000 meta mark set 0x10 accept
		meta l4proto tcp tproxy ip6 to [fd00:198:18::1]:7001 meta mark set 0x10 accept
		# fail = "closed": no pepd listener took the connection; drop it rather than
		# route it unproxied. Clients retry their SYNs until pepd is back.
		drop
	}
}
"#
    );
}

#[test]
fn single_family_ruleset() {
    assert_eq!(
        nft_ruleset(&config(V6_ONLY)),
        r#"# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again
# replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`
# (mark 0x1 -> table 100 -> local delivery).
table inet pepd {}
delete table inet pepd
table inet pepd {
	# rules.bypass_subnets: never intercepted, as destination or source. More can be
	# added at run time: nft add element inet pepd bypass6 { fd00:198:18::/48 }
	set bypass6 {
		type ipv6_addr
		flags interval
		auto-merge
	}

	# rules.proxy_subnets: only these destinations are intercepted.
	set proxy6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18::/48 }
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		# pepd's own sockets (tunnel, upstream connections) are never intercepted.
		meta mark 0x2 return
		# Packets for sockets pepd holds: the client side of intercepted connections and,
		# with upstream.transparent_source, the servers' replies to client addresses.
		meta l4proto tcp socket transparent 1 meta mark set 0x1 accept
		# Connections selected by rules.interfaces and rules.ports.
		meta nfproto ipv6 tcp dport 22 ct direction original jump intercept
	}

	chain intercept {
		# Connections to this host itself are not proxied.
		fib daddr type local return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip6 daddr != @proxy6 return
		meta l4proto tcp tproxy ip6 to :7000 meta mark set 0x1 accept
	}
}
"#
    );
}

/// `FULL` refusing QUIC with an ICMP error, with an exception in each family.
fn full_rejecting_quic() -> String {
    FULL.replace(
        "fail = \"closed\"\n",
        "fail = \"closed\"\nquic = \"reject\"\n\
         quic_exceptions = [\"198.18.20.0/24\", \"fd00:198:18:20::/64\"]\n",
    )
}

#[test]
fn quic_pass_adds_nothing_to_the_rules() {
    let pass = FULL.replace(
        "fail = \"closed\"\n",
        "fail = \"closed\"\nquic = \"pass\"\nquic_ports = [443, 8443]\n\
         quic_exceptions = [\"198.18.20.0/24\"]\n",
    );
    assert_eq!(nft_ruleset(&config(&pass)), nft_ruleset(&config(FULL)));
    assert!(!nft_ruleset(&config(FULL)).contains("udp"));
}

#[test]
fn quic_reject_ruleset() {
    assert_eq!(
        nft_ruleset(&config(&full_rejecting_quic())),
        r#"# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again
# replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`
# (mark 0x10 -> table 4242 -> local delivery).
table inet pepd {}
delete table inet pepd
table inet pepd {
	# rules.bypass_subnets: never intercepted, as destination or source. More can be
	# added at run time: nft add element inet pepd bypass4 { 198.18.0.0/15 }
	set bypass4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.9.0/24, 198.18.10.0/24 }
	}

	set bypass6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18:9::/64 }
	}

	# rules.proxy_subnets: only these destinations are intercepted.
	set proxy4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.0.0/15 }
	}

	# rules.quic_exceptions: never touched by rules.quic, as destination or source.
	set quic_exceptions4 {
		type ipv4_addr
		flags interval
		auto-merge
		elements = { 198.18.20.0/24 }
	}

	set quic_exceptions6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18:20::/64 }
	}

	# The peers' tunnel endpoints (address . port): never touched by rules.quic.
	set tunnel4 {
		type ipv4_addr . inet_service
		elements = { 198.18.0.1 . 7400 }
	}

	set tunnel6 {
		type ipv6_addr . inet_service
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		# pepd's own sockets (tunnel, upstream connections) are never intercepted.
		meta mark 0x2 return
		# Packets for sockets pepd holds: the client side of intercepted connections and,
		# with upstream.transparent_source, the servers' replies to client addresses.
		meta l4proto tcp socket transparent 1 meta mark set 0x10 accept
		# Connections selected by rules.interfaces and rules.ports.
		iifname { "lan0", "vlan*" } tcp dport { 80, 443 } ct direction original jump intercept
	}

	chain intercept {
		# Connections to this host itself are not proxied.
		fib daddr type local return
		ip daddr @bypass4 return
		ip saddr @bypass4 return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip daddr != @proxy4 return
		meta nfproto ipv6 return
		meta l4proto tcp tproxy ip to :7000 meta mark set 0x10 accept
		meta l4proto tcp tproxy ip6 to [fd00:198:18::1]:7001 meta mark set 0x10 accept
		# fail = "closed": no pepd listener took the connection; drop it rather than
		# route it unproxied. Clients retry their SYNs until pepd is back.
		drop
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		# rules.quic = "reject": the clients' QUIC (UDP to rules.quic_ports from
		# rules.interfaces) gets an ICMP port unreachable, so that they fall back at once
		# to TCP, which pepd accelerates.
		iifname { "lan0", "vlan*" } udp dport 443 ct direction original jump quic
	}

	chain quic {
		# Never the tunnel's datagrams, rules.bypass_subnets or rules.quic_exceptions.
		ip daddr . udp dport @tunnel4 return
		ip saddr . udp sport @tunnel4 return
		ip daddr @bypass4 return
		ip saddr @bypass4 return
		ip daddr @quic_exceptions4 return
		ip saddr @quic_exceptions4 return
		ip6 daddr . udp dport @tunnel6 return
		ip6 saddr . udp sport @tunnel6 return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip6 daddr @quic_exceptions6 return
		ip6 saddr @quic_exceptions6 return
		ip daddr != @proxy4 return
		meta nfproto ipv6 return
		counter reject with icmpx type port-unreachable
	}
}
"#
    );
}

#[test]
fn quic_drop_ruleset_of_one_family() {
    let v6_drop = V6_ONLY.replace(
        "proxy_subnets",
        "quic = \"drop\"\nquic_ports = [443, 8443]\nproxy_subnets",
    );
    assert_eq!(
        nft_ruleset(&config(&v6_drop)),
        r#"# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again
# replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`
# (mark 0x1 -> table 100 -> local delivery).
table inet pepd {}
delete table inet pepd
table inet pepd {
	# rules.bypass_subnets: never intercepted, as destination or source. More can be
	# added at run time: nft add element inet pepd bypass6 { fd00:198:18::/48 }
	set bypass6 {
		type ipv6_addr
		flags interval
		auto-merge
	}

	# rules.proxy_subnets: only these destinations are intercepted.
	set proxy6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18::/48 }
	}

	# rules.quic_exceptions: never touched by rules.quic, as destination or source.
	set quic_exceptions6 {
		type ipv6_addr
		flags interval
		auto-merge
	}

	# The peers' tunnel endpoints (address . port): never touched by rules.quic.
	set tunnel6 {
		type ipv6_addr . inet_service
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		# pepd's own sockets (tunnel, upstream connections) are never intercepted.
		meta mark 0x2 return
		# Packets for sockets pepd holds: the client side of intercepted connections and,
		# with upstream.transparent_source, the servers' replies to client addresses.
		meta l4proto tcp socket transparent 1 meta mark set 0x1 accept
		# Connections selected by rules.interfaces and rules.ports.
		meta nfproto ipv6 tcp dport 22 ct direction original jump intercept
	}

	chain intercept {
		# Connections to this host itself are not proxied.
		fib daddr type local return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip6 daddr != @proxy6 return
		meta l4proto tcp tproxy ip6 to :7000 meta mark set 0x1 accept
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		# rules.quic = "drop": the clients' QUIC (UDP to rules.quic_ports from
		# rules.interfaces) is dropped, so that they fall back to TCP, which pepd
		# accelerates, after their own QUIC timeout.
		meta nfproto ipv6 udp dport { 443, 8443 } ct direction original jump quic
	}

	chain quic {
		# Never the tunnel's datagrams, rules.bypass_subnets or rules.quic_exceptions.
		ip6 daddr . udp dport @tunnel6 return
		ip6 saddr . udp sport @tunnel6 return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip6 daddr @quic_exceptions6 return
		ip6 saddr @quic_exceptions6 return
		ip6 daddr != @proxy6 return
		counter drop
	}
}
"#
    );
}

#[test]
fn quic_spares_every_peer_s_tunnel_endpoint_once() {
    let hub = r#"[rules]
quic = "reject"
[tunnel]
side = "hub"
bind = "198.18.0.1:7400"
[security]
mode = "none"
[link]
tx_rate = "20M"
rx_rate = "2M"
[[peer]]
name = "t1"
address = "198.18.1.2:7400"
subnets = ["10.1.0.0/24"]
[[peer]]
name = "t2"
address = "198.18.2.2:443"
subnets = ["10.2.0.0/24"]
"#;
    let rules = nft_ruleset(&config(hub));
    assert!(
        rules.contains(
            "\tset tunnel4 {\n\t\ttype ipv4_addr . inet_service\n\
             \t\telements = { 198.18.1.2 . 7400, 198.18.2.2 . 443 }\n\t}\n"
        ),
        "{rules}"
    );
    assert!(rules.contains("\tset tunnel6 {\n\t\ttype ipv6_addr . inet_service\n\t}\n"));
}

#[test]
fn teardown_removes_only_the_table() {
    assert_eq!(
        nft_teardown(&config(FULL)),
        r#"# Removes pepd's interception rules (`pepd nft-rules --remove`).
table inet pepd {}
delete table inet pepd
"#
    );
}

#[test]
fn nft_rules_use_the_configured_table() {
    // A second instance on the same host: its own table, listener, marks and routing table.
    let cfg = config(
        &V6_ONLY
            .replace(
                "[rules]\n",
                "[rules]\ntable = \"pepd_b\"\ntproxy_mark = 0x11\nroute_table = 101\n",
            )
            .replace("[::]:7000", "[::]:7001")
            .replace("[intercept]\n", "[intercept]\nown_mark = 0x12\n"),
    );
    assert_eq!(
        nft_ruleset(&cfg),
        r#"# pepd interception rules, from `pepd nft-rules`. Load with `nft -f`; loading again
# replaces the whole table. Needs the policy routing from `pepd nft-rules --routes`
# (mark 0x11 -> table 101 -> local delivery).
table inet pepd_b {}
delete table inet pepd_b
table inet pepd_b {
	# rules.bypass_subnets: never intercepted, as destination or source. More can be
	# added at run time: nft add element inet pepd_b bypass6 { fd00:198:18::/48 }
	set bypass6 {
		type ipv6_addr
		flags interval
		auto-merge
	}

	# rules.proxy_subnets: only these destinations are intercepted.
	set proxy6 {
		type ipv6_addr
		flags interval
		auto-merge
		elements = { fd00:198:18::/48 }
	}

	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		# pepd's own sockets (tunnel, upstream connections) are never intercepted.
		meta mark 0x12 return
		# Packets for sockets pepd holds: the client side of intercepted connections and,
		# with upstream.transparent_source, the servers' replies to client addresses.
		meta l4proto tcp socket transparent 1 meta mark set 0x11 accept
		# Connections selected by rules.interfaces and rules.ports.
		meta nfproto ipv6 tcp dport 22 ct direction original jump intercept
	}

	chain intercept {
		# Connections to this host itself are not proxied.
		fib daddr type local return
		ip6 daddr @bypass6 return
		ip6 saddr @bypass6 return
		ip6 daddr != @proxy6 return
		meta l4proto tcp tproxy ip6 to :7001 meta mark set 0x11 accept
	}
}
"#
    );
    assert_eq!(
        nft_teardown(&cfg),
        r#"# Removes pepd's interception rules (`pepd nft-rules --remove`).
table inet pepd_b {}
delete table inet pepd_b
"#
    );
    // The default names the table as it always has.
    assert_eq!(config(V6_ONLY).rules.table, "pepd");
}

#[test]
fn policy_routing_per_family() {
    let cfg = config(FULL);
    let argv = |words: &str| words.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        policy_routing(&cfg),
        [
            RouteCommand::RemoveAll(argv("ip -4 rule del fwmark 0x10 lookup 4242")),
            RouteCommand::Run(argv("ip -4 rule add fwmark 0x10 lookup 4242")),
            RouteCommand::Run(argv(
                "ip -4 route replace local 0.0.0.0/0 dev lo table 4242"
            )),
            RouteCommand::RemoveAll(argv("ip -6 rule del fwmark 0x10 lookup 4242")),
            RouteCommand::Run(argv("ip -6 rule add fwmark 0x10 lookup 4242")),
            RouteCommand::Run(argv("ip -6 route replace local ::/0 dev lo table 4242")),
        ]
    );
    assert_eq!(
        routes_script(&cfg),
        r#"#!/bin/sh
# pepd policy routing, from `pepd nft-rules --routes`. Packets the nftables rules
# mark 0x10 are looked up in table 4242, whose local default route delivers them to
# this host. Safe to run again.
set -e
while ip -4 rule del fwmark 0x10 lookup 4242 2>/dev/null; do :; done
ip -4 rule add fwmark 0x10 lookup 4242
ip -4 route replace local 0.0.0.0/0 dev lo table 4242
while ip -6 rule del fwmark 0x10 lookup 4242 2>/dev/null; do :; done
ip -6 rule add fwmark 0x10 lookup 4242
ip -6 route replace local ::/0 dev lo table 4242
"#
    );
    assert_eq!(
        routes_teardown_script(&cfg),
        r#"#!/bin/sh
# Removes pepd's policy routing (`pepd nft-rules --routes --remove`).
set -e
while ip -4 rule del fwmark 0x10 lookup 4242 2>/dev/null; do :; done
while ip -4 route del local 0.0.0.0/0 dev lo table 4242 2>/dev/null; do :; done
while ip -6 rule del fwmark 0x10 lookup 4242 2>/dev/null; do :; done
while ip -6 route del local ::/0 dev lo table 4242 2>/dev/null; do :; done
"#
    );
    let v6 = config(V6_ONLY);
    assert_eq!(
        routes_script(&v6),
        r#"#!/bin/sh
# pepd policy routing, from `pepd nft-rules --routes`. Packets the nftables rules
# mark 0x1 are looked up in table 100, whose local default route delivers them to
# this host. Safe to run again.
set -e
while ip -6 rule del fwmark 0x1 lookup 100 2>/dev/null; do :; done
ip -6 rule add fwmark 0x1 lookup 100
ip -6 route replace local ::/0 dev lo table 100
"#
    );
    assert_eq!(
        routes_teardown_script(&v6),
        r#"#!/bin/sh
# Removes pepd's policy routing (`pepd nft-rules --routes --remove`).
set -e
while ip -6 rule del fwmark 0x1 lookup 100 2>/dev/null; do :; done
while ip -6 route del local ::/0 dev lo table 100 2>/dev/null; do :; done
"#
    );
}

#[test]
fn listeners_and_targets() {
    let cfg = config(FULL);
    assert_eq!(families(&cfg), [Family::V4, Family::V6]);
    assert_eq!(
        listener(&cfg, Family::V4),
        Some("0.0.0.0:7000".parse().expect("addr"))
    );
    assert_eq!(families(&config(V6_ONLY)), [Family::V6]);
    assert_eq!(listener(&config(V6_ONLY), Family::V4), None);
    assert_eq!(
        tproxy_target("0.0.0.0:7000".parse().expect("addr")),
        ":7000"
    );
    assert_eq!(tproxy_target("[::]:7000".parse().expect("addr")), ":7000");
    assert_eq!(
        tproxy_target("198.18.0.2:7000".parse().expect("addr")),
        "198.18.0.2:7000"
    );
    assert_eq!(
        tproxy_target("[fd00:198:18::2]:7000".parse().expect("addr")),
        "[fd00:198:18::2]:7000"
    );
}

#[test]
fn remove_all_loops_in_the_script() {
    let c = RouteCommand::RemoveAll(vec!["ip".into(), "-4".into(), "rule".into()]);
    assert_eq!(c.shell(), "while ip -4 rule 2>/dev/null; do :; done");
    assert_eq!(c.argv(), ["ip", "-4", "rule"]);
    assert_eq!(RouteCommand::Run(vec!["true".into()]).shell(), "true");
}
