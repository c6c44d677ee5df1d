//! Both forms of `peer` as an operator meets them: the resolved view, and every rule of the
//! `[[peer]]` form with the exact message, key and line.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::config::error::Position;
use crate::config::{ConfigError, Diagnostic, PepdConfig, Side};

use super::{PeerSpec, Peers};

const TERMINAL: &str = include_str!("../../../config/terminal.toml");
const HUB: &str = include_str!("../../../config/hub.toml");
const HUB_SPOKE: &str = include_str!("../../../config/hub-spoke.toml");

/// The public key of the private key `[n; 32]`, base64.
fn key(n: u8) -> String {
    crate::config::keys::encode_key(&pep_transport::security::public_key(&[n; 32]))
}

/// A hub with two terminals, 14 lines: what a test appends starts on line 15.
fn two_peers() -> String {
    format!(
        "[tunnel]
side = \"hub\"
[link]
tx_rate = \"100M\"
rx_rate = \"5M\"
[[peer]]
name = \"a\"
public_key = \"{}\"
address = \"198.19.0.1:7400\"
subnets = [\"10.1.0.0/24\"]
[[peer]]
name = \"b\"
public_key = \"{}\"
subnets = [\"10.2.0.0/24\"]
",
        key(1),
        key(2)
    )
}

/// `two_peers()` plus `extra` from line 15.
fn with(extra: &str) -> String {
    format!("{}{extra}", two_peers())
}

/// A third entry, lines 15 to 18 and `more` from line 19.
fn third(more: &str) -> String {
    with(&format!(
        "[[peer]]\nname = \"c\"\npublic_key = \"{}\"\nsubnets = [\"10.3.0.0/24\"]\n{more}",
        key(3)
    ))
}

fn parse_err(text: &str) -> Diagnostic {
    match PepdConfig::parse_named(text, "test.toml") {
        Err(ConfigError::Parse(d)) => d,
        other => panic!("expected a parse error, got {other:?}"),
    }
}

/// Every validation error, rendered.
fn invalid(text: &str) -> Vec<String> {
    match PepdConfig::parse_named(text, "test.toml") {
        Err(ConfigError::Invalid(ds)) => ds.iter().map(ToString::to_string).collect(),
        other => panic!("expected validation errors, got {other:?}"),
    }
}

/// Keys and lines of every validation error.
fn blamed(text: &str) -> Vec<(String, Option<usize>)> {
    match PepdConfig::parse_named(text, "test.toml") {
        Err(ConfigError::Invalid(ds)) => ds
            .iter()
            .map(|d| (d.key.clone().unwrap_or_default(), d.position.line()))
            .collect(),
        other => panic!("expected validation errors, got {other:?}"),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().expect(s)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect(s)
}

#[test]
fn pair_form_normalises_to_one_peer_spec() {
    let t = PepdConfig::parse(TERMINAL).expect("terminal.toml");
    let placeholder =
        crate::config::keys::decode_key(crate::config::keys::PLACEHOLDER_PUBLIC_KEY).ok();
    assert_eq!(
        t.peer_specs(),
        [PeerSpec {
            name: "peer".into(),
            public_key: placeholder,
            address: Some(addr("198.18.0.1:7400")),
            subnets: vec![net("0.0.0.0/0"), net("::/0")],
            tx_bps: 2_000_000,
            rx_bps: 10_000_000,
            min_bps: 0,
            weight: 1,
            keepalive: Duration::from_secs(5),
            max_flows: 10_000,
        }]
    );
    let h = PepdConfig::parse(HUB).expect("hub.toml");
    assert_eq!(
        h.peer_specs(),
        [PeerSpec {
            name: "peer".into(),
            public_key: placeholder,
            address: Some(addr("198.19.0.1:7400")),
            subnets: vec![net("0.0.0.0/0"), net("::/0")],
            tx_bps: 10_000_000,
            rx_bps: 2_000_000,
            min_bps: 0,
            weight: 1,
            keepalive: Duration::from_secs(5),
            max_flows: 10_000,
        }]
    );
    assert_eq!((t.side(), h.side()), (Side::Terminal, Side::Hub));
    assert_eq!(t.tunnel, None);
    // The transport of the one peer is the config's, as it always was.
    assert_eq!(t.transport_for(&t.peer_specs()[0]), t.transport());
    assert_eq!(h.transport_for(&h.peer_specs()[0]), h.transport());
}

#[test]
fn peer_list_parses_every_field() {
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    let Peers::List(entries) = &c.peer else {
        panic!("the list form");
    };
    assert_eq!(entries.len(), 3);
    assert_eq!(c.side(), Side::Hub);
    assert_eq!(c.tunnel_bind(), addr("198.18.0.1:7400"));
    assert_eq!(c.rules.table, "pepd");
    let decode = |text: &str| crate::config::keys::decode_key(text).ok();
    assert_eq!(
        c.peer_specs(),
        [
            PeerSpec {
                name: "rig-3".into(),
                public_key: decode("REPLACE+with+output+of+pepd+pubkey+on+rig00="),
                address: Some(addr("198.19.0.3:7400")),
                subnets: vec![net("10.3.0.0/24"), net("fd00:198:19:3::/64")],
                tx_bps: 20_000_000,
                rx_bps: 4_000_000,
                min_bps: 5_000_000,
                weight: 2,
                keepalive: Duration::from_secs(10),
                max_flows: 2000,
            },
            PeerSpec {
                name: "ship-7".into(),
                public_key: decode("REPLACE+with+output+of+pepd+pubkey+on+ship0="),
                address: None,
                subnets: vec![net("10.7.0.0/24")],
                tx_bps: 10_000_000,
                rx_bps: 2_000_000,
                min_bps: 0,
                weight: 1,
                keepalive: Duration::from_secs(25),
                max_flows: 10_000,
            },
            PeerSpec {
                name: "cell-12".into(),
                public_key: decode("REPLACE+with+output+of+pepd+pubkey+on+cell0="),
                address: Some(addr("198.19.0.12:7400")),
                subnets: vec![net("10.12.0.0/22")],
                tx_bps: 100_000_000,
                rx_bps: 5_000_000,
                min_bps: 10_000_000,
                weight: 1,
                keepalive: Duration::from_secs(5),
                max_flows: 10_000,
            },
        ]
    );
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    // A peer's transport: its rates and keepalive.
    let rig = c.transport_for(&c.peer_specs()[0]);
    assert_eq!(rig.rate_bps, 20_000_000);
    assert_eq!(rig.keepalive_interval, Duration::from_secs(10));
    assert_eq!(rig.max_flows, 2000);
    assert_eq!(
        rig.flow_window,
        c.transport_with(20_000_000, 4_000_000).flow_window
    );
    // A bare list entry takes the defaults; the bind follows the first address given.
    let bare = PepdConfig::parse(
        "[tunnel]\nside = \"terminal\"\n[link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n\
         [security]\nmode = \"none\"\n\
         [[peer]]\nname = \"hub\"\naddress = \"[2001:db8::1]:7400\"\nsubnets = [\"0.0.0.0/0\", \"::/0\"]\n",
    )
    .expect("a terminal's one entry");
    let spec = &bare.peer_specs()[0];
    assert_eq!(
        (
            spec.tx_bps,
            spec.rx_bps,
            spec.min_bps,
            spec.weight,
            spec.public_key
        ),
        (2_000_000, 10_000_000, 0, 1, None)
    );
    assert_eq!(bare.tunnel_bind(), addr("[::]:7400"));
    assert_eq!(bare.transport().wire_overhead, 40 + 8 + 16);
    assert_eq!(bare.role(), pep_transport::Role::Initiator);
}

#[test]
fn peer_list_no_longer_says_expected_socket_address() {
    // What a `[[peer]]` entry gave before the list form existed.
    let c = PepdConfig::parse(&two_peers()).expect("two peers");
    assert_eq!(c.peer.len(), 2);
    // A value that is neither form says what `peer` may be.
    let d = parse_err("peer = 5\n[link]\ntx_rate = 1\nrx_rate = 1\n");
    assert_eq!(
        d.to_string(),
        "test.toml line 1: `peer`: invalid type: integer `5`, expected a `[peer]` table (one \
         peer) or `[[peer]]` entries"
    );
    assert!(!d.message.contains("socket address"), "{d}");
}

#[test]
fn error_in_second_entry_names_peer_1_subnets_0_and_its_line() {
    let d = parse_err(&two_peers().replace("10.2.0.0/24", "10.2.0.0/33"));
    assert_eq!(d.key.as_deref(), Some("peer[1].subnets[0]"));
    assert_eq!(
        d.to_string(),
        "test.toml line 14: `peer[1].subnets[0]`: prefix length 33 is longer than the 32 bits \
         of the address; expected a subnet like \"198.18.0.0/15\" or \"fd00:198:18::/48\""
    );
    let d = parse_err(&two_peers().replace("address = \"198.19.0.1:7400\"", "address = \"x\""));
    assert_eq!(
        d.to_string(),
        "test.toml line 9: `peer[0].address`: invalid socket address syntax"
    );
    // A missing key points at the entry's header.
    let d = parse_err(&two_peers().replace("subnets = [\"10.2.0.0/24\"]\n", ""));
    assert_eq!(d.key.as_deref(), Some("peer[1].subnets"));
    assert_eq!(
        d.to_string(),
        "test.toml line 11: missing required key `peer[1].subnets` in `[[peer]]`"
    );
}

#[test]
fn unknown_key_line_in_both_forms() {
    let d = parse_err(&two_peers().replace("name = \"b\"\n", "name = \"b\"\ncolour = 1\n"));
    assert_eq!(d.key.as_deref(), Some("peer[1].colour"));
    assert_eq!(
        d.to_string(),
        "test.toml line 13: unknown key `peer[1].colour` (expected one of `name`, \
         `public_key`, `address`, `subnets`, `tx_rate`, `rx_rate`, `min_rate`, `weight`, \
         `keepalive`, `max_flows`)"
    );
    // The `[peer]` table through the same visitor: the key's own line, not the header's.
    let d = parse_err(
        "[link]\ntx_rate = 1\nrx_rate = 1\n[peer]\naddress = \"198.18.0.1:7400\"\n\
         side = \"hub\"\ncolour = 1\n",
    );
    assert_eq!(
        d.to_string(),
        "test.toml line 7: unknown key `peer.colour` (expected one of `address`, `bind`, \
         `side`, `return_to_preferred`, `return_after`)"
    );
    assert_eq!(d.position.line(), Some(7));
}

#[test]
fn side_in_an_entry_points_to_tunnel_side() {
    let d = parse_err(&two_peers().replace("name = \"a\"\n", "name = \"a\"\nside = \"hub\"\n"));
    assert_eq!(d.key.as_deref(), Some("peer[0].side"));
    assert_eq!(
        d.to_string(),
        "test.toml line 8: unknown key `peer[0].side` (expected one of `name`, `public_key`, \
         `address`, `subnets`, `tx_rate`, `rx_rate`, `min_rate`, `weight`, `keepalive`, \
         `max_flows`); with \
         `[[peer]]` entries it goes in `[tunnel]`, as `tunnel.side`"
    );
    let d = parse_err(&two_peers().replace("name = \"b\"\n", "name = \"b\"\nbind = \"x\"\n"));
    assert!(
        d.to_string()
            .ends_with("; with `[[peer]]` entries it goes in `[tunnel]`, as `tunnel.bind`"),
        "{d}"
    );
}

#[test]
fn overlapping_and_nested_subnets_name_both_lines() {
    // Equal across peers, nested both ways, and nested within one peer (allowed).
    let text = third("").replace(
        "subnets = [\"10.3.0.0/24\"]",
        "subnets = [\"10.1.0.0/24\", \"10.0.0.0/8\", \"10.3.0.0/16\", \"10.3.1.0/24\"]",
    );
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 18: `peer[2].subnets[0]` (10.1.0.0/24) overlaps \
             `peer[0].subnets[0]` (10.1.0.0/24, line 10): each destination must belong to one \
             peer",
            "test.toml line 18: `peer[2].subnets[1]` (10.0.0.0/8) overlaps \
             `peer[0].subnets[0]` (10.1.0.0/24, line 10): each destination must belong to one \
             peer",
            "test.toml line 18: `peer[2].subnets[1]` (10.0.0.0/8) overlaps \
             `peer[1].subnets[0]` (10.2.0.0/24, line 14): each destination must belong to one \
             peer",
        ]
    );
    // IPv6, nested in an earlier entry: the later one is blamed.
    let text = third("")
        .replace("\"10.3.0.0/24\"", "\"fd00:1:2::/48\"")
        .replace("\"10.1.0.0/24\"", "\"10.1.0.0/24\", \"fd00:1:2:3::/64\"");
    assert_eq!(blamed(&text), [("peer[2].subnets[0]".to_owned(), Some(18))]);
    // Different families never overlap.
    PepdConfig::parse(&third("").replace("\"10.3.0.0/24\"", "\"::/0\"")).expect("disjoint");
}

#[test]
fn duplicate_names_and_keys_name_both_lines() {
    let text = third("")
        .replace("name = \"c\"", "name = \"a\"")
        .replace(&key(3), &key(1))
        .replace(
            "name = \"b\"\n",
            "name = \"b\"\naddress = \"198.19.0.1:7400\"\n",
        );
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 13: `peer[1].address` is also `peer[0].address` (line 9): each \
             peer has its own tunnel address",
            "test.toml line 17: `peer[2].name` is also `peer[0].name` (line 7): each peer \
             needs its own name",
            "test.toml line 18: `peer[2].public_key` is also `peer[0].public_key` (line 8): \
             each peer has its own key pair",
        ]
    );
}

#[test]
fn cir_sum_above_carrier_lists_each_entry() {
    let text = third("min_rate = \"50M\"\n")
        .replace("name = \"a\"\n", "name = \"a\"\nmin_rate = \"40M\"\n")
        .replace("\"100M\"", "\"80M\"");
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 4: `link.tx_rate` (80 Mbit/s) is less than the `min_rate` of the \
          peers together (90 Mbit/s): a 40 Mbit/s (line 8), c 50 Mbit/s (line 20)"
        ]
    );
    PepdConfig::parse(&text.replace("\"80M\"", "\"90M\"")).expect("exactly the carrier");
}

#[test]
fn peer_public_key_with_list_form_names_the_change() {
    let text = with(&format!("[security]\npeer_public_key = \"{}\"\n", key(4)));
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 16: `security.peer_public_key` is for a single `[peer]` table; with \
          `[[peer]]` entries each has `public_key`: move it into the entry of that peer"
        ]
    );
}

#[test]
fn list_form_requires_tunnel_side() {
    let text = two_peers().replace("[tunnel]\nside = \"hub\"\n", "");
    let e = PepdConfig::parse_named(&text, "test.toml").unwrap_err();
    let ConfigError::Invalid(ds) = &e else {
        panic!("{e}");
    };
    assert_eq!(ds.len(), 1, "{e}");
    assert_eq!(ds[0].key.as_deref(), Some("tunnel"));
    assert_eq!(ds[0].position, Position::Document);
    assert_eq!(
        e.to_string(),
        "test.toml: `tunnel` is required with `[[peer]]` entries: add a `[tunnel]` section \
         with this gateway's `side` (\"hub\" or \"terminal\") and, optionally, its `bind` \
         address"
    );
    // `[tunnel]` without its side is a schema error, at the section.
    let d = parse_err(&two_peers().replace("side = \"hub\"\n", ""));
    assert_eq!(
        d.to_string(),
        "test.toml line 1: missing required key `tunnel.side` in `[tunnel]`"
    );
    // And the pair form refuses `[tunnel]`, naming where it is.
    let pair = "[tunnel]\nside = \"hub\"\n[peer]\naddress = \"198.18.0.1:7400\"\nside = \"hub\"\n\
                [link]\ntx_rate = \"2M\"\nrx_rate = \"2M\"\n";
    assert_eq!(
        invalid(pair),
        [
            "test.toml line 3: `peer` is a single `[peer]` table, which keeps its own `side` and \
          `bind`: `[tunnel]` (line 1) is only for `[[peer]]` entries; move its keys into \
          `[peer]`, or write the peers as `[[peer]]` entries"
        ]
    );
}

#[test]
fn none_mode_list_requires_addresses() {
    let text = with("[security]\nmode = \"none\"\n");
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 11: `peer[1].address` is required with `security.mode = \"none\"`: \
          without keys, a peer is known by its address"
        ]
    );
    // With noise, a key is what is required instead.
    let text = two_peers().replace(&format!("public_key = \"{}\"\n", key(2)), "");
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 11: `peer[1].public_key` is required with `security.mode = \"noise\"` \
          (the default): that peer's public key, as `pepd pubkey` prints it there"
        ]
    );
    // Keys set with none are warned about, like `security.peer_public_key`.
    let text = with("[security]\nmode = \"none\"\n").replace(
        "name = \"b\"\n",
        "name = \"b\"\naddress = \"198.19.0.2:7400\"\n",
    );
    let c = PepdConfig::parse_named(&text, "test.toml").expect("addresses given");
    let w = c.warnings();
    assert_eq!(w.len(), 3, "{w:#?}");
    assert!(
        w[0].starts_with("test.toml line 8: `peer[0].public_key` has no effect"),
        "{w:?}"
    );
    assert!(
        w[1].starts_with("test.toml line 14: `peer[1].public_key` has no effect"),
        "{w:?}"
    );
    assert!(
        w[2].starts_with("test.toml line 17: `security.mode` = \"none\"")
            && w[2].contains("a peer's `address`"),
        "{w:?}"
    );
}

#[test]
fn entry_values_in_range() {
    let text = two_peers()
        .replace("name = \"a\"", "name = \"a b\"")
        .replace(
            "subnets = [\"10.2.0.0/24\"]",
            "subnets = [\"10.2.0.1/24\", \"10.9.0.0/24\", \"10.9.0.0/24\"]\ntx_rate = \"200M\"\n\
             rx_rate = 1\nmin_rate = \"300M\"\nweight = 0\nkeepalive = \"2m\"\n\
             max_flows = 0",
        )
        .replace(
            "address = \"198.19.0.1:7400\"",
            "address = \"198.19.0.1:0\"",
        );
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 4: `link.tx_rate` (100 Mbit/s) is less than the `min_rate` of the \
             peers together (300 Mbit/s): b 300 Mbit/s (line 17)",
            "test.toml line 7: `peer[0].name` (\"a b\") must be 1 to 32 letters, digits, '.', \
             '_' or '-'",
            "test.toml line 9: `peer[0].address` (198.19.0.1:0) needs a port other than 0",
            "test.toml line 14: `peer[1].subnets[0]` (10.2.0.1/24) has bits set after the \
             prefix: write 10.2.0.0/24",
            "test.toml line 14: `peer[1].subnets[2]` (10.9.0.0/24) is listed twice",
            "test.toml line 15: `peer[1].tx_rate` (200 Mbit/s) must be at most `link.tx_rate` \
             (100 Mbit/s, line 4), the carrier it shares",
            "test.toml line 16: `peer[1].rx_rate` must be 8 kbit/s to 100 Gbit/s, not 1 bit/s",
            "test.toml line 17: `peer[1].min_rate` (300 Mbit/s) must be at most \
             `peer[1].tx_rate` (200 Mbit/s, line 15): a peer is never sent more than its \
             `tx_rate`",
            "test.toml line 18: `peer[1].weight` must be 1 to 1000, not 0",
            "test.toml line 19: `peer[1].keepalive` (2m) must be shorter than \
             `transport.outage_limit` (2m, default), or idle outages go unnoticed",
            "test.toml line 20: `peer[1].max_flows` must be 1 to `limits.max_flows` (10000, \
             default), not 0",
        ]
    );
    let text = two_peers()
        .replace(
            "subnets = [\"10.2.0.0/24\"]",
            "subnets = []\nkeepalive = \"0s\"\nmax_flows = 10001",
        )
        .replace(
            "name = \"a\"",
            "name = \"a123456789012345678901234567890123\"",
        );
    assert_eq!(
        blamed(&text),
        [
            ("peer[0].name".to_owned(), Some(7)),
            ("peer[1].subnets".to_owned(), Some(14)),
            ("peer[1].keepalive".to_owned(), Some(15)),
            ("peer[1].max_flows".to_owned(), Some(16)),
        ]
    );
    // Exactly 32 characters of every allowed kind is a name.
    PepdConfig::parse(&two_peers().replace(
        "name = \"a\"",
        "name = \"Az09._-a123456789012345678901234\"",
    ))
    .expect("32 characters");
}

#[test]
fn count_side_and_family_of_the_list() {
    assert_eq!(
        invalid(&two_peers().replace("side = \"hub\"", "side = \"terminal\"")),
        [
            "test.toml line 6: `peer` has 2 entries, but a terminal (`tunnel.side = \
          \"terminal\"`, line 2) has one peer, its hub: only a hub serves several"
        ]
    );
    assert_eq!(
        blamed(
            "peer = []\n[tunnel]\nside = \"hub\"\n[link]\ntx_rate = 1000000\nrx_rate = 1000000\n"
        ),
        [("peer".to_owned(), Some(1))]
    );
    let text = two_peers().replace("side = \"hub\"\n", "side = \"hub\"\nbind = \"[::]:7400\"\n");
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 10: `peer[0].address` (198.19.0.1:7400) must be of the same address \
          family as the tunnel's ([::]:7400, `tunnel.bind`, line 3)"
        ]
    );
    let text = third("address = \"[2001:db8::3]:7400\"\n");
    assert_eq!(
        invalid(&text),
        [
            "test.toml line 19: `peer[2].address` ([2001:db8::3]:7400) must be of the same \
          address family as the tunnel's (0.0.0.0:7400, the default bind address)"
        ]
    );
}

#[test]
fn rules_table_is_a_plain_name() {
    for bad in ["", "1pepd", "pep-d", "a123456789012345678901234567890123"] {
        let text = with(&format!("[rules]\ntable = \"{bad}\"\n"));
        assert_eq!(
            blamed(&text),
            [("rules.table".to_owned(), Some(16))],
            "{bad}"
        );
    }
    assert_eq!(
        invalid(&with("[rules]\ntable = \"pep d\"\n")),
        [
            "test.toml line 16: `rules.table` (\"pep d\") must be a letter followed by at most 31 \
          letters, digits or '_'"
        ]
    );
    let c = PepdConfig::parse(&with("[rules]\ntable = \"pepd_B2\"\n")).expect("a plain name");
    assert_eq!(c.rules.table, "pepd_B2");
    assert!(
        c.summary()
            .lines()
            .any(|l| l.ends_with("; fail open; nftables table inet pepd_B2")),
        "{}",
        c.summary()
    );
}

#[test]
fn check_config_reports_every_peer() {
    let c = PepdConfig::parse_named(HUB_SPOKE, "hub-spoke.toml").expect("hub-spoke.toml");
    let s = c.summary();
    for want in [
        "side:       hub (responder)",
        "peers:      3 `[[peer]]` entries over UDP, tunnel bound to 198.18.0.1:7400",
        "  rig-3: 198.19.0.3:7400; subnets 10.3.0.0/24, fd00:198:19:3::/64; tx 20 Mbit/s (min \
         5 Mbit/s, weight 2), rx 4 Mbit/s; keepalive 10s; max 2000 flows",
        "  ship-7: address learned from its packets; subnets 10.7.0.0/24; tx 10 Mbit/s \
         (weight 1), rx 2 Mbit/s; keepalive 25s; max 10000 flows",
        "  cell-12: 198.19.0.12:7400; subnets 10.12.0.0/22; tx 100 Mbit/s (min 10 Mbit/s, \
         weight 1), rx 5 Mbit/s; keepalive 5s; max 10000 flows",
        "security:   noise IK (3 peer keys, one per `[[peer]]` entry), no psk; rekey every 2m \
         or 1073741824 packets; AEAD chosen with the peer",
    ] {
        assert!(s.lines().any(|l| l == want), "missing {want:?} in\n{s}");
    }
    assert!(!s.lines().any(|l| l.starts_with("peer: ")), "{s}");
}

#[test]
fn keys_of_the_list_are_checked_when_loaded() {
    let dir = tempfile::Builder::new()
        .prefix("pepd-peers-keys-")
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join("private.key");
    let private = crate::config::keys::write_private_key(&path).expect("write key");
    let own = crate::config::keys::encode_key(&pep_transport::security::public_key(&private));
    let text = with(&format!("[security]\nprivate_key_file = {path:?}\n")).replace(&key(2), &own);
    let c = PepdConfig::parse_named(&text, "test.toml").expect("parses");
    let Err(ConfigError::Invalid(ds)) = c.load_security() else {
        panic!("our own key is refused");
    };
    let got: Vec<String> = ds.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "test.toml line 13: `peer[1].public_key` is this gateway's own public key; it must \
          be that peer's (`pepd pubkey` there)"
        ]
    );
    // The examples' placeholders are refused at the same time, for every entry.
    let example = HUB_SPOKE.replace(
        "private_key_file = \"/etc/pepd/private.key\"",
        &format!("private_key_file = {path:?}"),
    );
    let c = PepdConfig::parse_named(&example, "hub-spoke.toml").expect("parses");
    let Err(ConfigError::Invalid(ds)) = c.load_security() else {
        panic!("placeholders are refused");
    };
    let keys: Vec<_> = ds
        .iter()
        .map(|d| d.key.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        [
            "peer[0].public_key",
            "peer[1].public_key",
            "peer[2].public_key"
        ]
    );
    assert!(
        ds[0].message.ends_with(
            "is still the example's placeholder: replace it with the output of `pepd pubkey \
             /etc/pepd/private.key` on that peer"
        ),
        "{}",
        ds[0]
    );
    // Real keys load; each peer's security names its own key.
    let good = with(&format!("[security]\nprivate_key_file = {path:?}\n"));
    let c = PepdConfig::parse(&good).expect("parses");
    let loaded = c.load_security().expect("keys");
    assert_eq!(loaded.local_public_key(), Some(own));
    let specs = c.peer_specs();
    let towards_b = loaded.towards(&specs[1]).expect("noise");
    assert_eq!(
        towards_b.peer_public_key,
        pep_transport::security::public_key(&[2; 32])
    );
    assert_eq!(towards_b.local_private_key, private);
}

#[test]
fn run_serves_every_peer_of_a_hub_and_needs_the_hubs_address_at_a_terminal() {
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    c.check_servable()
        .expect("a hub with three peers, one without address");
    assert_eq!(c.cid_len(), 2);
    let c = PepdConfig::parse(&two_peers()).expect("two peers");
    c.check_servable().expect("b has no address: learned");
    assert_eq!(c.cid_len(), 2);
    // A terminal in the list form: one entry, which must say where the hub is.
    let one = two_peers()
        .replace(
            &format!(
                "[[peer]]\nname = \"b\"\npublic_key = \"{}\"\nsubnets = [\"10.2.0.0/24\"]\n",
                key(2)
            ),
            "",
        )
        .replace("side = \"hub\"", "side = \"terminal\"");
    let c = PepdConfig::parse(&one).expect("one entry");
    c.check_servable().expect("with its address");
    assert_eq!(c.cid_len(), 0);
    let c = PepdConfig::parse(&one.replace("address = \"198.19.0.1:7400\"\n", "")).expect("ok");
    assert_eq!(
        c.check_servable().unwrap_err().to_string(),
        "`peer[0].address` of peer a is not set: a terminal starts the association, so it \
         needs its hub's tunnel address (only a hub learns its peers' addresses)"
    );
    // The pair form, as always: no connection IDs at either end.
    for text in [TERMINAL, HUB] {
        let c = PepdConfig::parse(text).expect("pair");
        c.check_servable().expect("served");
        assert_eq!(c.cid_len(), 0);
    }
}

#[test]
fn overlap_sweep_finds_each_nested_subnet_once() {
    let at = |peer, index, s: &str| super::SubnetAt {
        peer,
        index,
        net: net(s),
    };
    let subnets = [
        at(0, 0, "10.0.0.0/8"),
        at(1, 0, "10.1.0.0/16"),
        at(0, 1, "10.1.2.0/24"),
        at(2, 0, "192.0.2.0/24"),
        at(3, 0, "::/0"),
        at(4, 0, "fd00::/8"),
    ];
    let found: Vec<(String, String)> = super::overlaps(&subnets)
        .iter()
        .map(|(o, i)| (o.net.to_string(), i.net.to_string()))
        .collect();
    assert_eq!(
        found,
        [
            ("10.0.0.0/8".to_owned(), "10.1.0.0/16".to_owned()),
            ("10.1.0.0/16".to_owned(), "10.1.2.0/24".to_owned()),
            ("::/0".to_owned(), "fd00::/8".to_owned()),
        ]
    );
    // 8192 peers with a /24 each, sorted in well under a second.
    let many: Vec<super::SubnetAt> = (0..8192u32)
        .map(|i| super::SubnetAt {
            peer: i as usize,
            index: 0,
            net: IpNet::V4(
                ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0a00_0000 | (i << 8)), 24)
                    .expect("prefix"),
            ),
        })
        .collect();
    assert!(super::overlaps(&many).is_empty());
}

/// A pair-form terminal whose `[peer] address` is `address` (line 2), with `more` of
/// `[peer]` from line 4.
fn terminal_with(address: &str, more: &str) -> String {
    format!(
        "[peer]\naddress = {address}\nside = \"terminal\"\n{more}[link]\ntx_rate = \"2M\"\n\
         rx_rate = \"10M\"\n"
    )
}

const TWO_HUBS: &str = "[\"198.18.0.1:7400\", \"198.18.0.2:7400\"]";

#[test]
fn a_terminal_lists_its_hubs_in_order_of_preference() {
    let text = terminal_with(
        TWO_HUBS,
        "return_to_preferred = true\nreturn_after = \"2min\"\n",
    );
    let c = PepdConfig::parse_named(&text, "test.toml").expect("a list of hubs");
    let hubs = [addr("198.18.0.1:7400"), addr("198.18.0.2:7400")];
    assert_eq!(
        c.hubs(),
        Some(pep_transport::Hubs {
            addresses: hubs.to_vec(),
            return_after: Some(Duration::from_secs(120)),
        })
    );
    assert_eq!(c.peer_specs()[0].address, Some(hubs[0]));
    assert_eq!(c.peer_addresses(), hubs);
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    // Without return_to_preferred the terminal stays where it moved.
    let c = PepdConfig::parse(&terminal_with(TWO_HUBS, "")).expect("a list of hubs");
    assert_eq!(c.hubs().and_then(|h| h.return_after), None);
    // One address, as a string or a list of one: nothing to move among.
    for one in ["\"198.18.0.1:7400\"", "[\"198.18.0.1:7400\"]"] {
        let c = PepdConfig::parse(&terminal_with(one, "")).expect(one);
        assert_eq!((c.hubs(), c.peer_addresses()), (None, vec![hubs[0]]));
        let Peers::Pair(pair) = &c.peer else {
            panic!("the pair form")
        };
        assert_eq!(pair.return_after, Duration::from_secs(600));
    }
}

#[test]
fn a_list_of_hubs_that_cannot_be_read_names_the_key_and_line() {
    for (address, key, why) in [
        (
            "[\"198.18.0.1:7400\", \"198.18.0.1:7400\"]",
            "peer.address",
            "lists 198.18.0.1:7400 twice",
        ),
        ("[]", "peer.address", "lists no address"),
        (
            "[\"198.18.0.1:1\", \"198.18.0.1:2\", \"198.18.0.1:3\", \"198.18.0.1:4\", \
             \"198.18.0.1:5\", \"198.18.0.1:6\", \"198.18.0.1:7\", \"198.18.0.1:8\", \
             \"198.18.0.1:9\"]",
            "peer.address",
            "lists more than 8 hubs",
        ),
        (
            "[\"198.18.0.1:7400\", \"hub-b\"]",
            "peer.address[1]",
            "invalid socket address syntax",
        ),
        ("\"hub-a\"", "peer.address", "invalid socket address syntax"),
    ] {
        let d = parse_err(&terminal_with(address, ""));
        assert_eq!(d.key.as_deref(), Some(key), "{d}");
        assert_eq!(d.position.line(), Some(2), "{d}");
        assert_eq!(d.to_string(), format!("test.toml line 2: `{key}`: {why}"));
    }
    let d = parse_err(&terminal_with("7400", ""));
    assert_eq!(
        (d.key.as_deref(), d.position.line()),
        (Some("peer.address"), Some(2)),
        "{d}"
    );
}

#[test]
fn a_list_of_hubs_is_checked_against_the_rest_of_the_config() {
    let family = terminal_with("[\"198.18.0.1:7400\", \"[fd00:198:18::2]:7400\"]", "");
    assert_eq!(
        invalid(&family),
        [
            "test.toml line 2: `peer.address` lists [fd00:198:18::2]:7400 and 198.18.0.1:7400: \
          every hub must be of one address family"
        ]
    );
    let at_a_hub = terminal_with(TWO_HUBS, "").replace("\"terminal\"", "\"hub\"");
    assert_eq!(blamed(&at_a_hub), [("peer.address".to_owned(), Some(2))]);
    let plain = format!(
        "{}[security]\nmode = \"none\"\n",
        terminal_with(TWO_HUBS, "")
    );
    assert_eq!(blamed(&plain), [("peer.address".to_owned(), Some(2))]);
    let unspecified = terminal_with("[\"198.18.0.1:7400\", \"0.0.0.0:7400\"]", "");
    assert_eq!(blamed(&unspecified), [("peer.address".to_owned(), Some(2))]);
    let soon = terminal_with(
        TWO_HUBS,
        "return_to_preferred = true\nreturn_after = \"30s\"\n",
    );
    assert_eq!(
        invalid(&soon),
        [
            "test.toml line 5: `peer.return_after` (30s) must be at least 1m: every move \
          resets the terminal's flows"
        ]
    );
}

#[test]
fn return_to_preferred_with_one_hub_is_a_warning() {
    let c = PepdConfig::parse_named(
        &terminal_with("\"198.18.0.1:7400\"", "return_to_preferred = true\n"),
        "test.toml",
    )
    .expect("legal");
    assert_eq!(
        c.warnings(),
        [
            "test.toml line 4: `peer.return_to_preferred` has no effect with one hub address: \
          there is no other hub to return from"
        ]
    );
}

#[test]
fn check_config_reports_the_list_of_hubs() {
    let text = terminal_with(
        TWO_HUBS,
        "return_to_preferred = true\nreturn_after = \"15min\"\n",
    );
    let c = PepdConfig::parse(&text).expect("a list of hubs");
    let s = c.summary();
    let lines: Vec<&str> = s
        .lines()
        .filter(|l| l.starts_with("peer:") || l.starts_with("hubs:"))
        .collect();
    assert_eq!(
        lines,
        [
            "peer:       [198.18.0.1:7400, 198.18.0.2:7400] over UDP, tunnel bound to 0.0.0.0:7400",
            "hubs:       2 in order of preference, one at a time; another is tried while the \
             one serving is silent, back to the first when idle after 15m",
        ],
        "{s}"
    );
    let one = PepdConfig::parse(&terminal_with("\"198.18.0.1:7400\"", "")).expect("one hub");
    assert!(!one.summary().contains("hubs:"));
}
