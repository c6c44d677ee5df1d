//! The checks against outputs captured from nftables 1.0.6 and iproute2 6.1 in a network
//! namespace, after loading what `pepd nft-rules` and `pepd nft-rules --routes` print. Where
//! a case cannot be produced on this system, a captured output is edited as little as
//! possible, and the comment says so.

use std::collections::HashMap;

use super::*;

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

/// `nft -j list ruleset` after loading `pepd nft-rules` for a config with listeners
/// 0.0.0.0:7000 and [fd00:198:18::1]:7001, mark 0x10, fail closed (src/rules/tests.rs's
/// `FULL`).
const RULESET: &str = include_str!("captured/nft-ruleset.json");
/// The same for the `config("interfaces = [\"lan0\"]")` below: listeners 0.0.0.0:7000 and
/// [::]:7000, mark 0x1, fail open.
const RULESET_HEALTHY: &str = include_str!("captured/nft-ruleset-healthy.json");
/// `RULESET_HEALTHY`'s config with `quic = "reject"`.
const RULESET_HEALTHY_QUIC: &str = include_str!("captured/nft-ruleset-healthy-quic.json");
/// `RULESET`'s config (src/rules/tests.rs's `FULL`) with `quic = "reject"` and an exception
/// in each family, and with `quic = "drop"`.
const RULESET_QUIC_REJECT: &str = include_str!("captured/nft-ruleset-quic-reject.json");
const RULESET_QUIC_DROP: &str = include_str!("captured/nft-ruleset-quic-drop.json");
/// A namespace without rules.
const RULESET_EMPTY: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}]}
"#;

/// `ip -j -N -4 rule show` with the policy routing for mark 0x1, table 100.
const RULES_V4: &str = r#"[{"priority":0,"src":"all","table":"255"},{"priority":32765,"src":"all","fwmark":"0x1","table":"100"},{"priority":32766,"src":"all","table":"254"},{"priority":32767,"src":"all","table":"253"}]"#;
const RULES_V6: &str = r#"[{"priority":0,"src":"all","table":"255"},{"priority":32765,"src":"all","fwmark":"0x1","table":"100"},{"priority":32766,"src":"all","table":"254"}]"#;
/// `ip -j -4 route show table 100` (and -6): `local default dev lo`.
const ROUTES_V4: &str =
    r#"[{"type":"local","dst":"default","dev":"lo","scope":"host","flags":[]}]"#;
const ROUTES_V6: &str =
    r#"[{"type":"local","dst":"default","dev":"lo","metric":1024,"flags":[],"pref":"medium"}]"#;
/// `ip -j route get 198.18.0.1 mark 0x2` via a gateway; unicast routes have no "type".
const ROUTE_TO_PEER: &str = r#"[{"dst":"198.18.0.1","gateway":"198.18.2.1","dev":"wan0","prefsrc":"198.18.2.2","flags":[],"mark":2,"uid":0,"cache":[]}]"#;

#[test]
fn parses_tproxy_statements() {
    let ruleset = Ruleset::from_json(RULESET).expect("json");
    assert!(!ruleset.xt_tproxy);
    assert_eq!(
        ruleset.tproxy,
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
    // `tproxy to :7000` (inet, no family), `tcp dport 80 tproxy ip to 198.18.0.1:7002
    // accept`, `tproxy ip6 to fd00:198:18::1`, `tproxy ip to 198.18.0.1`, and one whose
    // address comes from a map (`tproxy ip to ip saddr map { … }`), which is skipped.
    let other =
        Ruleset::from_json(include_str!("captured/nft-tproxy-variants.json")).expect("json");
    assert_eq!(
        other.tproxy,
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
    // `tproxy to :7003` in an ip table names no family; the table's is the one.
    let ip_table =
        Ruleset::from_json(include_str!("captured/nft-tproxy-ip-table.json")).expect("json");
    assert_eq!(
        ip_table.tproxy,
        [TproxyRule {
            family: Some(Family::V4),
            addr: None,
            port: Some(7003),
            mark: None,
        }]
    );
    assert_eq!(
        Ruleset::from_json(RULESET_EMPTY).expect("json"),
        Ruleset::default()
    );
    assert!(Ruleset::from_json("table inet pepd {\n}\n").is_err());
}

#[test]
fn parses_the_quic_chain_s_verdict() {
    let verdict = |json: &str| Ruleset::from_json(json).expect("json").quic;
    let pepd = |v| vec![("pepd".to_owned(), v)];
    assert_eq!(verdict(RULESET_QUIC_REJECT), pepd(QuicVerdict::Reject));
    assert_eq!(verdict(RULESET_QUIC_DROP), pepd(QuicVerdict::Drop));
    assert_eq!(verdict(RULESET_HEALTHY_QUIC), pepd(QuicVerdict::Reject));
    assert_eq!(verdict(RULESET), []);
    assert_eq!(verdict(RULESET_EMPTY), []);
    // Edited from RULESET_QUIC_DROP: the chain holds no verdict any more.
    let emptied = RULESET_QUIC_DROP.replace(r#"{"drop": null}"#, r#"{"accept": null}"#);
    assert_eq!(verdict(&emptied), pepd(QuicVerdict::Neither));
}

#[test]
fn parses_ip_rules() {
    // `ip -j -N -4 rule show` with `fwmark 0x10/0xff lookup 4242` at priority 100 added;
    // edited: the last rule's table is "default", as iproute2 prints it without -N (with
    // it, "253").
    let json = r#"[{"priority":0,"src":"all","table":"255"},{"priority":100,"src":"all","fwmark":"0x10","fwmask":"0xff","table":"4242"},{"priority":32765,"src":"all","fwmark":"0x1","table":"100"},{"priority":32766,"src":"all","table":"254"},{"priority":32767,"src":"all","table":"default"}]"#;
    let rules = IpRule::list_from_json(json).expect("json");
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
    assert!(IpRule::list_from_json("0:\tfrom all lookup local\n").is_err());
}

#[test]
fn finds_the_local_default_route() {
    let has_local_default = |json: &str, family| {
        Route::list_from_json(json)
            .expect("json")
            .iter()
            .any(|r| r.is_local_default(family))
    };
    assert!(has_local_default(ROUTES_V4, Family::V4));
    assert!(has_local_default(ROUTES_V6, Family::V6));
    // Edited from ROUTES_V4: iproute2 6.1 prints a /0 destination as "default".
    assert!(has_local_default(
        r#"[{"type":"local","dst":"0.0.0.0/0","dev":"lo","scope":"host","flags":[]}]"#,
        Family::V4
    ));
    // `default via 198.18.2.1 dev wan0`.
    assert!(!has_local_default(
        r#"[{"dst":"default","gateway":"198.18.2.1","dev":"wan0","flags":[]}]"#,
        Family::V4
    ));
    // `local 198.18.0.0/15 dev lo`.
    assert!(!has_local_default(
        r#"[{"type":"local","dst":"198.18.0.0/15","dev":"lo","scope":"host","flags":[]}]"#,
        Family::V4
    ));
    // A listing with nothing in it.
    assert!(!has_local_default("[]", Family::V6));
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
        .ok("nft -j list ruleset", RULESET_HEALTHY)
        .ok("ip -j -N -4 rule show", RULES_V4)
        .ok("ip -j -N -6 rule show", RULES_V6)
        .ok("ip -j -4 route show table 100", ROUTES_V4)
        .ok("ip -j -6 route show table 100", ROUTES_V6)
        .ok("ip -j route get 198.18.0.1 mark 0x2", ROUTE_TO_PEER)
        .file("/proc/sys/net/ipv4/ip_forward", "1\n")
        .file("/proc/sys/net/ipv6/conf/all/forwarding", "1\n")
        .dir(
            "/proc/sys/net/ipv4/conf",
            &["all", "default", "lan0", "lo", "wan0"],
        )
        .file("/proc/sys/net/ipv4/conf/all/rp_filter", "0\n")
        .file("/proc/sys/net/ipv4/conf/lan0/rp_filter", "2\n")
        .file("/proc/sys/net/ipv4/conf/wan0/rp_filter", "2\n")
        // A 4 GiB host's conntrack default, the kernel's port range, deploy/99-pepd.conf's
        // accept queue and TIME_WAIT reuse.
        .file("/proc/sys/net/netfilter/nf_conntrack_max", "262144\n")
        .file("/proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n")
        .file("/proc/sys/net/core/somaxconn", "16384\n")
        .file("/proc/sys/net/ipv4/tcp_tw_reuse", "1\n")
}

#[test]
fn a_healthy_gateway_gets_no_warnings() {
    let cfg = config("interfaces = [\"lan0\"]");
    assert_eq!(startup_checks_with(&cfg, &healthy()), Vec::<String>::new());
}

#[test]
fn the_loaded_quic_policy_is_the_configured_one() {
    let with = |ruleset: &str| healthy().ok("nft -j list ruleset", ruleset);
    let lan0 = "interfaces = [\"lan0\"]";
    let reject = config(&format!("{lan0}\nquic = \"reject\""));
    assert_eq!(
        startup_checks_with(&reject, &with(RULESET_HEALTHY_QUIC)),
        Vec::<String>::new()
    );
    // The rules were loaded before the setting changed.
    assert_eq!(
        startup_checks_with(&reject, &with(RULESET_HEALTHY)),
        [
            "`rules.quic` is \"reject\" but table inet pepd does not refuse the clients' QUIC: \
          the rules loaded are not the config's; `systemctl reload pepd-rules` (or load `pepd \
          nft-rules`)"
        ]
    );
    let drop = config(&format!("{lan0}\nquic = \"drop\""));
    assert_eq!(
        startup_checks_with(&drop, &with(RULESET_HEALTHY_QUIC)),
        [
            "`rules.quic` is \"drop\" but table inet pepd refuses the clients' QUIC with \
          \"reject\": the rules loaded are not the config's; `systemctl reload pepd-rules` (or \
          load `pepd nft-rules`)"
        ]
    );
    let pass = config(lan0);
    assert_eq!(
        startup_checks_with(&pass, &with(RULESET_HEALTHY_QUIC)),
        [
            "table inet pepd refuses the clients' QUIC (\"reject\") while `rules.quic` is \
          \"pass\": the rules loaded are not the config's; `systemctl reload pepd-rules` (or \
          load `pepd nft-rules`)"
        ]
    );
}

#[test]
fn a_bare_host_gets_every_warning() {
    let cfg = config("interfaces = [\"lan0\", \"vlan*\"]");
    // A fresh network namespace.
    let probe = Fake::default()
        .ok("nft -j list ruleset", RULESET_EMPTY)
        .ok(
            "ip -j -N -4 rule show",
            r#"[{"priority":0,"src":"all","table":"255"},{"priority":32766,"src":"all","table":"254"},{"priority":32767,"src":"all","table":"253"}]"#,
        )
        .ok(
            "ip -j -N -6 rule show",
            r#"[{"priority":0,"src":"all","table":"255"},{"priority":32766,"src":"all","table":"254"}]"#,
        )
        .fail(
            "ip -j -4 route show table 100",
            "Error: ipv4: FIB table does not exist.\nDump terminated\n",
        )
        .fail(
            "ip -j -6 route show table 100",
            "Error: ipv6: FIB table does not exist.\nDump terminated\n",
        )
        .fail(
            "ip -j route get 198.18.0.1 mark 0x2",
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
        .ok("nft -j list ruleset", RULESET)
        // The mark's rule added at priority 32767, after the main table's.
        .ok(
            "ip -j -N -4 rule show",
            r#"[{"priority":0,"src":"all","table":"255"},{"priority":32766,"src":"all","table":"254"},{"priority":32767,"src":"all","table":"253"},{"priority":32767,"src":"all","fwmark":"0x1","table":"100"}]"#,
        )
        // With 198.18.0.1 on lo.
        .ok(
            "ip -j route get 198.18.0.1 mark 0x2",
            r#"[{"type":"local","dst":"198.18.0.1","dev":"lo","table":"local","prefsrc":"198.18.0.1","flags":[],"mark":2,"uid":0,"cache":["local"]}]"#,
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
            "nft -j list ruleset",
            "Error: Operation not permitted (you must be root)\n",
        )
        .fail(
            "ip -j -N -4 rule show",
            "Option \"-N\" is unknown, try \"ip -help\".\n",
        )
        .fail("ip -j -4 rule show", "Error: something\n")
        .ok("ip -j -4 route show table 100", ROUTES_V4)
        .fail("ip -j -N -6 rule show", "")
        .fail("ip -j -6 rule show", "")
        .ok("ip -j -6 route show table 100", ROUTES_V6)
        // Edited from a captured `local` answer: Linux 6.x fails `route get` through an
        // unreachable route ("No route to host") rather than answering with its type.
        .ok(
            "ip -j route get 198.18.0.1 mark 0x2",
            r#"[{"type":"unreachable","dst":"198.18.0.1","table":"main","flags":[],"mark":2,"uid":0,"cache":[]}]"#,
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
        // Without -N, table names from rt_tables.
        .fail("ip -j -N -4 rule show", unknown)
        .ok(
            "ip -j -4 rule show",
            r#"[{"priority":0,"src":"all","table":"local"},{"priority":32766,"src":"all","table":"main"},{"priority":32767,"src":"all","table":"default"},{"priority":32767,"src":"all","fwmark":"0x1","table":"100"}]"#,
        )
        .fail("ip -j -N -6 rule show", unknown)
        .ok(
            "ip -j -6 rule show",
            r#"[{"priority":0,"src":"all","table":"local"},{"priority":32765,"src":"all","fwmark":"0x1","table":"100"},{"priority":32766,"src":"all","table":"main"}]"#,
        );
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
    // Only `iptables-nft -t mangle -A PREROUTING -p tcp -j TPROXY --on-port 7000
    // --tproxy-mark 0x1/0x1`.
    let probe = healthy().ok(
        "nft -j list ruleset",
        include_str!("captured/nft-iptables-tproxy.json"),
    );
    assert_eq!(startup_checks_with(&cfg, &probe), Vec::<String>::new());
}

#[test]
fn output_that_is_not_the_json_expected() {
    let cfg = config("interfaces = [\"lan0\"]");
    // Text where JSON was asked for, as from a release that ignores -j for a listing.
    let probe = healthy()
        .ok("nft -j list ruleset", "table inet pepd {\n}\n")
        .ok("ip -j -N -4 rule show", "0:\tfrom all lookup 255\n")
        .ok(
            "ip -j -6 route show table 100",
            "local default dev lo metric 1024 pref medium\n",
        )
        .ok(
            "ip -j route get 198.18.0.1 mark 0x2",
            "198.18.0.1 via 198.18.2.1 dev wan0 src 198.18.2.2 mark 2 uid 0 \n    cache \n",
        );
    assert_eq!(
        startup_checks_with(&cfg, &probe),
        [
            "`nft list ruleset` printed output this check does not understand (expected ident \
             at line 1 column 2): the interception rules were not checked",
            "`ip -4 rule show` printed output this check does not understand (invalid type: \
             integer `0`, expected a sequence at line 1 column 1): the policy routing was not \
             checked",
            "`ip -6 route show table 100` printed output this check does not understand \
             (expected value at line 1 column 1): the policy routing was not checked",
            "`ip route get` printed output this check does not understand (invalid type: \
             floating point `198.18`, expected a sequence at line 1 column 6): the route to the \
             peer was not checked",
        ]
    );
}

/// A hub with four terminals, three with an address.
fn hub_config() -> PepdConfig {
    let key =
        |n: u8| crate::config::keys::encode_key(&pep_transport::security::public_key(&[n; 32]));
    let entry = |n: u8, name: &str, address: &str| {
        format!(
            "[[peer]]\nname = \"{name}\"\npublic_key = \"{}\"\n{address}subnets = [\"10.{n}.0.0/24\"]\n",
            key(n)
        )
    };
    PepdConfig::parse(&format!(
        "[intercept]\nlisten = [\"0.0.0.0:7000\", \"[::]:7000\"]\n\
         [rules]\ninterfaces = [\"lan0\"]\n\
         [tunnel]\nside = \"hub\"\n\
         [link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n{}{}{}{}",
        entry(1, "rig-3", "address = \"198.18.0.1:7400\"\n"),
        entry(2, "van-1", ""),
        entry(3, "ship-7", "address = \"198.19.0.7:7400\"\n"),
        entry(4, "cell-12", "address = \"198.19.0.12:7400\"\n"),
    ))
    .expect("hub config")
}

#[test]
fn self_check_names_each_peer_without_route() {
    let probe = healthy()
        .fail(
            "ip -j route get 198.19.0.7 mark 0x2",
            "RTNETLINK answers: Network is unreachable\n",
        )
        .ok(
            "ip -j route get 198.19.0.12 mark 0x2",
            r#"[{"type":"local","dst":"198.19.0.12","dev":"lo","table":"local","prefsrc":"198.19.0.12","flags":[],"mark":2,"uid":0,"cache":["local"]}]"#,
        );
    // rig-3 has a route; van-1 has no address to check.
    assert_eq!(
        startup_checks_with(&hub_config(), &probe),
        [
            "no route to peer ship-7 (198.19.0.7) (`ip route get`: RTNETLINK answers: Network \
             is unreachable): the tunnel cannot reach it",
            "`peer[3].address` 198.19.0.12 is an address of this host: it must be that peer's",
        ]
    );
    // Without `ip`, said once for all peers.
    let probe = Fake {
        no_programs: true,
        ..healthy()
    };
    let w = startup_checks_with(&hub_config(), &probe);
    assert_eq!(w.iter().filter(|m| *m == IP_MISSING).count(), 1, "{w:#?}");
}

#[test]
fn a_table_with_rules_for_other_listeners_is_named() {
    // The healthy listing's rules go to port 7000; this instance listens on 7001.
    let cfg = |table: &str| {
        PepdConfig::parse(&format!(
            "[intercept]\nlisten = [\"0.0.0.0:7001\"]\n\
             [rules]\ninterfaces = [\"lan0\"]\ntable = \"{table}\"\n\
             [peer]\naddress = \"198.18.0.1:7400\"\nside = \"terminal\"\n\
             [link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n"
        ))
        .expect("config")
    };
    let no_rule = "no nftables `tproxy` rule sends IPv4 TCP to port 7001 (`intercept.listen` \
                   0.0.0.0:7001): connections are routed past pepd; load the rules from `pepd \
                   nft-rules` (or, with iptables-legacy, check them there)";
    assert_eq!(
        startup_checks_with(&cfg("pepd"), &healthy()),
        [
            no_rule,
            "table inet pepd (`rules.table`) is loaded but none of its rules sends to this \
             gateway's listeners: another pepd instance on this host with the same \
             `rules.table` may have replaced them; give each instance its own table",
        ]
    );
    // With a table of its own that is not loaded, only the missing rule.
    assert_eq!(startup_checks_with(&cfg("pepd_b"), &healthy()), [no_rule]);
}

#[test]
fn kernel_limits_below_max_flows_are_named() {
    let cfg = config("interfaces = [\"lan0\"]");
    assert_eq!(cfg.limits.max_flows, 10_000);
    assert_eq!(conntrack_needed(10_000), 20_000);
    let probe = healthy()
        .file("/proc/sys/net/netfilter/nf_conntrack_max", "16384\n")
        .file("/proc/sys/net/ipv4/ip_local_port_range", "50000\t59000\n")
        .file("/proc/sys/net/core/somaxconn", "4096\n");
    assert_eq!(
        startup_checks_with(&cfg, &probe),
        [
            "net.netfilter.nf_conntrack_max is 16384: `limits.max_flows` (10000) needs 20000 \
             connection-tracking entries (one per flow, as many again for connections closing \
             and routed traffic); once the table is full the kernel drops new connections' \
             SYNs; raise it: sysctl -w net.netfilter.nf_conntrack_max=20000 (and in \
             /etc/sysctl.d)",
            "net.ipv4.ip_local_port_range is 50000 59000, 9001 ports: `limits.max_flows` \
             (10000) connections to one destination need 10000 (upstream connects from this \
             gateway's address fail with EADDRNOTAVAIL past that); widen it: sysctl -w \
             net.ipv4.ip_local_port_range=\"1024 65535\" (and in /etc/sysctl.d)",
            "net.core.somaxconn is 4096: the listeners' accept queue holds at most that many \
             new connections, fewer than `limits.max_flows` (10000); in a burst the rest lose \
             their SYN and wait a second or more for the client to resend it; raise it: \
             sysctl -w net.core.somaxconn=10000 (and in /etc/sysctl.d)",
        ]
    );
    // Exactly enough is enough.
    let probe = healthy()
        .file("/proc/sys/net/netfilter/nf_conntrack_max", "20000\n")
        .file("/proc/sys/net/ipv4/ip_local_port_range", "50000 59999\n")
        .file("/proc/sys/net/core/somaxconn", "10000\n");
    assert_eq!(startup_checks_with(&cfg, &probe), Vec::<String>::new());
}

#[test]
fn time_wait_reuse_off_is_named_with_the_port_range() {
    let cfg = config("interfaces = [\"lan0\"]");
    let warning = |reuse: &str| {
        startup_checks_with(
            &cfg,
            &healthy().file("/proc/sys/net/ipv4/tcp_tw_reuse", reuse),
        )
    };
    assert_eq!(
        warning("0\n"),
        [
            "net.ipv4.tcp_tw_reuse is 0 (off): each upstream connection this gateway closes \
             first holds its ephemeral port in TIME_WAIT for 60 s; \
             net.ipv4.ip_local_port_range (32768 60999) gives 28232 ports, so past about 470 \
             new connections a second to one destination fail with EADDRNOTAVAIL (the \
             clients get a reset, reason resource_limit); let connects reuse TIME_WAIT ports: \
             sysctl -w net.ipv4.tcp_tw_reuse=1 (and in /etc/sysctl.d, as deploy/99-pepd.conf \
             does)"
        ]
    );
    // The kernel's default reuses ports for loopback connections only, not a server's.
    let w = warning("2\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("net.ipv4.tcp_tw_reuse is 2 (loopback connections only): "));
    // Without a readable port range, the warning still stands.
    let mut probe = healthy().file("/proc/sys/net/ipv4/tcp_tw_reuse", "0\n");
    probe.files.remove("/proc/sys/net/ipv4/ip_local_port_range");
    let w = startup_checks_with(&cfg, &probe);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("past what net.ipv4.ip_local_port_range gives in a minute, new"),
        "{w:?}"
    );
}

#[test]
fn kernel_limits_not_there_are_not_checked() {
    let cfg = config("interfaces = [\"lan0\"]");
    // Without the conntrack module its sysctl does not exist, and there is no table.
    let mut probe = healthy()
        .file("/proc/sys/net/ipv4/ip_local_port_range", "1024 2047\n")
        .file("/proc/sys/net/ipv4/tcp_tw_reuse", "0\n");
    probe
        .files
        .remove("/proc/sys/net/netfilter/nf_conntrack_max");
    probe.files.remove("/proc/sys/net/core/somaxconn");
    let w = startup_checks_with(&cfg, &probe);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("net.ipv4.ip_local_port_range is 1024 2047, 1024 ports"));
    assert!(w[1].starts_with("net.ipv4.tcp_tw_reuse is 0 (off)"));
    // Transparent connects come from the clients' addresses, each with its own ports.
    let transparent = PepdConfig::parse(
        "[upstream]\ntransparent_source = true\n\
         [intercept]\nlisten = [\"0.0.0.0:7000\", \"[::]:7000\"]\n\
         [rules]\ninterfaces = [\"lan0\"]\n\
         [peer]\naddress = \"198.18.0.1:7400\"\nside = \"terminal\"\n\
         [link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n",
    )
    .expect("config");
    assert_eq!(
        startup_checks_with(&transparent, &probe),
        Vec::<String>::new()
    );
}

#[test]
fn port_ranges() {
    assert_eq!(parse_port_range("32768\t60999\n"), Some((32768, 60999)));
    assert_eq!(parse_port_range("1024 65535"), Some((1024, 65535)));
    assert_eq!(parse_port_range("1024"), None);
    assert_eq!(parse_port_range("1024 x"), None);
    assert_eq!(parse_port_range("1 2 3"), None);
}
