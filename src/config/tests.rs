//! Config parsing and validation as an operator meets it: the example files, defaults,
//! and one test per rule asserting the exact key and line reported.

use std::net::SocketAddr;
use std::time::Duration;

use super::error::Position;
use super::units::approx;
use super::*;

const TERMINAL: &str = include_str!("../../config/terminal.toml");
const HUB: &str = include_str!("../../config/hub.toml");
const HUB_SPOKE: &str = include_str!("../../config/hub-spoke.toml");

/// The `[peer]` table of a config in the pair form.
#[track_caller]
fn pair(c: &PepdConfig) -> &PairConfig {
    match &c.peer {
        Peers::Pair(p) => p,
        Peers::List(_) => panic!("not the pair form"),
    }
}

/// The smallest valid config: six lines, so an appended section starts on line 7.
const MIN: &str = "[peer]
address = \"198.18.0.1:7400\"
side = \"terminal\"
[link]
tx_rate = \"2M\"
rx_rate = \"10M\"
";

fn parse_err(text: &str) -> Diagnostic {
    match PepdConfig::parse_named(text, "test.toml") {
        Err(ConfigError::Parse(d)) => d,
        other => panic!("expected a parse error, got {other:?}"),
    }
}

fn invalid(text: &str) -> Vec<Diagnostic> {
    match PepdConfig::parse_named(text, "test.toml") {
        Err(ConfigError::Invalid(ds)) => ds,
        other => panic!("expected validation errors, got {other:?}"),
    }
}

fn at(line: usize) -> Option<usize> {
    Some(line)
}

/// Exactly one problem, at `key` on `line` (`None`: left at its default).
#[track_caller]
fn assert_only(problems: &[Diagnostic], key: &str, line: Option<usize>) {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one(&problems[0], key, line);
}

#[track_caller]
fn assert_one(d: &Diagnostic, key: &str, line: Option<usize>) {
    assert_eq!(d.key.as_deref(), Some(key), "{d}");
    assert_eq!(d.position.line(), line, "{d}");
    let text = d.to_string();
    assert!(text.contains(&format!("`{key}`")), "{text}");
    match line {
        Some(n) => assert!(text.starts_with(&format!("test.toml line {n}: ")), "{text}"),
        None => assert!(text.starts_with("test.toml (default): "), "{text}"),
    }
}

/// `MIN` plus `extra`, which starts on line 7.
fn min_with(extra: &str) -> String {
    format!("{MIN}{extra}")
}

#[test]
fn example_configs_parse_validate_and_are_quiet() {
    let t = PepdConfig::parse_named(TERMINAL, "terminal.toml").expect("terminal.toml");
    let h = PepdConfig::parse_named(HUB, "hub.toml").expect("hub.toml");
    assert_eq!(pair(&t).side, Side::Terminal);
    assert_eq!(pair(&h).side, Side::Hub);
    assert_eq!(t.role(), pep_transport::Role::Initiator);
    assert_eq!(h.role(), pep_transport::Role::Responder);
    // Mirror images: each side's rx is the other's tx, and each names the other's bind.
    assert_eq!(t.link.tx_rate, h.link.rx_rate);
    assert_eq!(t.link.rx_rate, h.link.tx_rate);
    assert_eq!(h.link.tx_rate, BitRate(10_000_000));
    assert_eq!(t.link.tx_rate, BitRate(2_000_000));
    assert_eq!(Some(pair(&t).address.first()), pair(&h).bind);
    assert_eq!(Some(pair(&h).address.first()), pair(&t).bind);
    for c in [&t, &h] {
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        c.transport().validate().expect("transport config");
        let in_test_net = |a: SocketAddr| match a {
            SocketAddr::V4(v4) => (v4.ip().octets()[0], v4.ip().octets()[1] & 0xfe) == (198, 18),
            SocketAddr::V6(_) => false,
        };
        assert!(in_test_net(pair(c).address.first()) && in_test_net(c.tunnel_bind()));
    }
}

#[test]
fn load_names_the_file() {
    let path = std::env::temp_dir().join(format!("pepd-config-{}.toml", std::process::id()));
    std::fs::write(&path, min_with("[link.x]\n")).expect("write temp file");
    let e = PepdConfig::load(&path).unwrap_err();
    std::fs::remove_file(&path).expect("remove temp file");
    assert!(
        e.to_string()
            .starts_with(&format!("{} line 7: unknown key `link.x`", path.display())),
        "{e}"
    );
    let missing = PepdConfig::load(std::path::Path::new("/nonexistent/pepd.toml")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }), "{missing}");
}

#[test]
fn defaults() {
    let c = PepdConfig::parse(MIN).expect("minimal config");
    assert_eq!(c.log.level, "info");
    assert_eq!(
        c.intercept.listen,
        vec![
            "0.0.0.0:7000".parse::<SocketAddr>().expect("addr"),
            "[::]:7000".parse().expect("addr")
        ]
    );
    assert_eq!(c.intercept.own_mark, 0x2);
    assert_eq!(pair(&c).bind, None);
    assert_eq!(c.tunnel_bind(), "0.0.0.0:7400".parse().expect("addr"));
    assert_eq!(c.link.mtu, 1500);
    let t = &c.transport;
    assert_eq!(t.cc, CcModeName::Adaptive);
    assert_eq!(t.loss_default, LossDefault::Corruption);
    assert_eq!(
        (t.vegas_alpha, t.vegas_beta, t.vegas_gamma),
        (2.0, 4.0, 1.0)
    );
    assert_eq!(t.ack_every_packets, 8);
    assert_eq!(t.ack_max_delay, Duration::from_millis(50));
    assert_eq!(t.outage_limit, Duration::from_secs(120));
    assert_eq!(t.keepalive, Duration::from_secs(5));
    assert_eq!(t.pacing_burst, Duration::from_millis(2));
    assert_eq!(c.limits.max_flows, 10_000);
    assert_eq!(c.limits.over_limit, OverLimit::Refuse);
    assert_eq!(c.limits.flow_buffer, None);
    assert_eq!(c.limits.memory_budget, ByteSize(512 << 20));
    assert_eq!(c.limits.stalled_flow_timeout, Duration::from_secs(60));
    assert_eq!(c.timeouts.connect, Duration::from_secs(10));
    assert_eq!(c.timeouts.idle, Duration::from_secs(7200));
    assert!(!c.upstream.transparent_source);
    assert_eq!(c.metrics.listen, "127.0.0.1:9464".parse().expect("addr"));
    let sec = &c.security;
    assert_eq!(sec.mode, SecurityMode::Noise);
    assert_eq!(
        (&sec.private_key_file, &sec.peer_public_key),
        (&None, &None)
    );
    assert_eq!(sec.psk_file, None);
    assert_eq!(sec.rekey_interval, Duration::from_secs(120));
    assert_eq!(sec.rekey_after_packets, 1 << 30);
    assert_eq!(sec.aead, AeadSetting::Auto);
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
}

#[test]
fn aead_settings_make_their_offers() {
    use pep_transport::security::{AeadOffer, PacketProtection};
    for (text, setting) in [
        ("auto", AeadSetting::Auto),
        ("chacha20-poly1305", AeadSetting::ChaCha20Poly1305),
        ("aes-256-gcm", AeadSetting::Aes256Gcm),
    ] {
        let c = PepdConfig::parse(&with_security(&format!("aead = \"{text}\"\n"))).expect(text);
        assert_eq!(c.security.aead, setting);
    }
    // With AES instructions "auto" puts AES-256-GCM first; without, ChaCha20-Poly1305.
    for hardware_aes in [true, false] {
        assert_eq!(
            AeadSetting::Auto.offer(hardware_aes),
            AeadOffer::auto(hardware_aes)
        );
        assert_eq!(
            AeadSetting::Aes256Gcm.offer(hardware_aes),
            AeadOffer::only(PacketProtection::Aes256Gcm)
        );
        assert_eq!(
            AeadSetting::ChaCha20Poly1305.offer(hardware_aes),
            AeadOffer::only(PacketProtection::ChaCha20Poly1305)
        );
    }
}

#[test]
fn ipv6_peer_binds_v6_by_default() {
    let c = PepdConfig::parse(
        "[peer]\naddress = \"[2001:db8::1]:7400\"\nside = \"hub\"\n\
         [link]\ntx_rate = 2000000\nrx_rate = 2000000\n",
    )
    .expect("v6 config");
    assert_eq!(c.tunnel_bind(), "[::]:7400".parse().expect("addr"));
    assert_eq!(c.transport().wire_overhead, 40 + 8 + 16);
}

#[test]
fn transport_conversion() {
    let c = PepdConfig::parse(&min_with(
        "[transport]\ncc = \"vegas\"\nvegas_alpha = 1.5\nloss_default = \"congestion\"\n\
         [limits]\nflow_buffer = \"8MiB\"\nmemory_budget = \"64MiB\"\nmax_flows = 10\n",
    ))
    .expect("config");
    let t = c.transport();
    assert_eq!(t.rate_bps, 2_000_000);
    assert_eq!(t.cc, pep_transport::CcMode::Vegas);
    assert_eq!(t.vegas.alpha, 1.5);
    assert_eq!(t.loss_default, pep_transport::LossCause::Congestion);
    assert_eq!((t.flow_window, t.send_buffer), (8 << 20, 8 << 20));
    assert_eq!(t.assoc_window, 32 << 20);
    assert_eq!(t.max_flows, 10);
    assert_eq!(t.pacing_burst, Duration::from_millis(2));
}

// ---- errors from the parser and the schema: key, line and the whole message ------------
//
// Every message here is asserted in full: part of each one is serde's or toml's wording
// (src/config/messages.rs reads it), and a release that rewords it must fail a test rather
// than quietly change what an operator reads.

/// The one error parsing `text` gives: the key it names and the line an operator reads.
#[track_caller]
fn assert_parse_error(text: &str, key: Option<&str>, rendered: &str) {
    let d = parse_err(text);
    assert_eq!(d.key.as_deref(), key, "{d}");
    assert_eq!(d.to_string(), rendered);
}

#[test]
fn unknown_key_names_key_and_exact_line() {
    let d = parse_err(&min_with("[transport]\ncc = \"rate\"\nfoo = 1\n"));
    assert_one(&d, "transport.foo", at(9));
    assert_eq!(
        d.to_string(),
        "test.toml line 9: unknown key `transport.foo` (expected one of `cc`, `vegas_alpha`, \
         `vegas_beta`, `vegas_gamma`, `loss_default`, `ack_every_packets`, `ack_max_delay`, \
         `outage_limit`, `keepalive`, `pacing_burst`, `datagram_size`, `compression`, \
         `compression_ports`, `compression_prefixes`)"
    );
    // A section with a single key: serde words the list differently.
    assert_parse_error(
        &min_with("[upstream]\nx = 1\n"),
        Some("upstream.x"),
        "test.toml line 8: unknown key `upstream.x` (expected `transparent_source`)",
    );
}

#[test]
fn unknown_section_and_nested_keys() {
    const SECTIONS: &str = "(expected one of `log`, `intercept`, `rules`, `peer`, `tunnel`, \
                            `link`, `transport`, `limits`, `timeouts`, `upstream`, \
                            `metrics`, `control`, `shutdown`, `security`, `class`, `announce`)";
    assert_parse_error(
        &min_with("\n\n[tuning]\n"),
        Some("tuning"),
        &format!("test.toml line 9: unknown key `tuning` {SECTIONS}"),
    );
    assert_parse_error(
        &min_with("[limits]\nmax_flows = 3\n[limits.per_ip]\nx = 1\n"),
        Some("limits.per_ip"),
        "test.toml line 9: unknown key `limits.per_ip` (expected one of `max_flows`, \
         `over_limit`, `flow_buffer`, `memory_budget`, `stalled_flow_timeout`)",
    );
    // Dotted keys and inline tables are found too.
    assert_parse_error(
        &format!("log.colour = true\n{MIN}"),
        Some("log.colour"),
        "test.toml line 1: unknown key `log.colour` (expected `level`)",
    );
    // After a header, a dotted key belongs to that table.
    assert_parse_error(
        &min_with("log.colour = true\n"),
        Some("link.log"),
        "test.toml line 7: unknown key `link.log` (expected one of `tx_rate`, `rx_rate`, `mtu`, \
         `frame_overhead`)",
    );
    let inline = "peer = { address = \"198.18.0.1:7400\", side = \"hub\",\n\
                  prot = 1 }\n[link]\ntx_rate = 1\nrx_rate = 1\n";
    assert_parse_error(
        inline,
        Some("peer.prot"),
        "test.toml line 2: unknown key `peer.prot` (expected one of `address`, `bind`, `side`, \
         `return_to_preferred`, `return_after`)",
    );
    assert_parse_error(
        &format!("colour = \"x\"\n{MIN}"),
        Some("colour"),
        &format!("test.toml line 1: unknown key `colour` {SECTIONS}"),
    );
    assert_parse_error(
        &with_security("private_key = \"x\"\n"),
        Some("security.private_key"),
        "test.toml line 8: unknown key `security.private_key` (expected one of `mode`, \
         `private_key_file`, `peer_public_key`, `psk_file`, `rekey_interval`, \
         `rekey_after_packets`, `aead`)",
    );
}

#[test]
fn missing_keys_and_sections() {
    // A missing key points at its section's header.
    let d = parse_err(&MIN.replace("side = \"terminal\"\n", ""));
    assert_one(&d, "peer.side", at(1));
    assert_eq!(
        d.to_string(),
        "test.toml line 1: missing required key `peer.side` in `[peer]`"
    );
    assert_parse_error(
        "peer = { address = \"198.18.0.1:7400\" }\n[link]\ntx_rate = 1\nrx_rate = 1\n",
        Some("peer.side"),
        "test.toml line 1: missing required key `peer.side` in `[peer]`",
    );
    // A missing section has no line to point at.
    let d = parse_err("[peer]\naddress = \"198.18.0.1:7400\"\nside = \"hub\"\n");
    assert_eq!(d.key.as_deref(), Some("link"));
    assert_eq!(d.position, Position::Document);
    assert_eq!(
        d.to_string(),
        "test.toml: missing required section `[link]`"
    );
}

#[test]
fn duplicate_key_names_the_key_at_its_second_line() {
    let d = parse_err(&min_with("[limits]\nmax_flows = 1\nmax_flows = 2\n"));
    assert_one(&d, "limits.max_flows", at(9));
    assert_eq!(
        d.to_string(),
        "test.toml line 9: duplicate key `limits.max_flows`"
    );
    // A section written twice has no key of its own: toml's words, line and column.
    assert_parse_error(
        &min_with("[limits]\nmax_flows = 1\n[limits]\n"),
        None,
        "test.toml line 9, column 2: invalid TOML: duplicate key",
    );
}

#[test]
fn syntax_errors_give_line_and_column() {
    let d = parse_err(&min_with("[transport\ncc = \"rate\"\n"));
    assert_eq!(d.key, None);
    assert_eq!(
        d.position,
        Position::At {
            line: 7,
            column: 11
        }
    );
    assert_eq!(
        d.to_string(),
        "test.toml line 7, column 11: invalid TOML: unclosed table, expected `]`"
    );
}

#[test]
fn wrong_type_names_key_and_line() {
    let d = parse_err(&MIN.replace("[link]\n", "[link]\nmtu = \"big\"\n"));
    assert_one(&d, "link.mtu", at(5));
    assert_eq!(
        d.to_string(),
        "test.toml line 5: `link.mtu`: invalid type: string \"big\", expected a non-negative \
         integer"
    );
    assert_parse_error(
        &min_with("[timeouts]\nidle = 3600\n"),
        Some("timeouts.idle"),
        "test.toml line 8: `timeouts.idle`: invalid type: integer `3600`, expected a duration",
    );
    assert_parse_error(
        &min_with("[upstream]\ntransparent_source = \"yes\"\n"),
        Some("upstream.transparent_source"),
        "test.toml line 8: `upstream.transparent_source`: invalid type: string \"yes\", \
         expected true or false",
    );
    assert_parse_error(
        &min_with("[intercept]\nlisten = \"0.0.0.0:7000\"\n"),
        Some("intercept.listen"),
        "test.toml line 8: `intercept.listen`: invalid type: string \"0.0.0.0:7000\", expected \
         a sequence",
    );
    assert_parse_error(
        &format!("\ntransport = 5\n{MIN}"),
        Some("transport"),
        "test.toml line 2: `transport`: invalid type: integer `5`, expected struct \
         TransportConfig",
    );
    assert_parse_error(
        &min_with("[transport]\nvegas_alpha = \"x\"\n"),
        Some("transport.vegas_alpha"),
        "test.toml line 8: `transport.vegas_alpha`: invalid type: string \"x\", expected a number",
    );
    assert_parse_error(
        &min_with("[transport]\nack_every_packets = \"x\"\n"),
        Some("transport.ack_every_packets"),
        "test.toml line 8: `transport.ack_every_packets`: invalid type: string \"x\", expected \
         an integer from 0 to 4294967295",
    );
    assert_parse_error(
        &min_with("[transport]\ncc = [1]\n"),
        Some("transport.cc"),
        "test.toml line 8: `transport.cc`: wanted string or table",
    );
}

#[test]
fn out_of_type_range_names_key_and_line() {
    let d = parse_err(&min_with("[intercept]\nown_mark = 4294967296\n"));
    assert_one(&d, "intercept.own_mark", at(8));
    assert_eq!(
        d.to_string(),
        "test.toml line 8: `intercept.own_mark`: invalid value: integer `4294967296`, expected \
         an integer from 0 to 4294967295"
    );
    assert_parse_error(
        &min_with("[limits]\nmax_flows = -1\n"),
        Some("limits.max_flows"),
        "test.toml line 8: `limits.max_flows`: invalid value: integer `-1`, expected a \
         non-negative integer",
    );
    assert_parse_error(
        &MIN.replace("[link]\n", "[link]\nmtu = -1500\n"),
        Some("link.mtu"),
        "test.toml line 5: `link.mtu`: invalid value: integer `-1500`, expected a non-negative \
         integer",
    );
    assert_parse_error(
        &with_security("rekey_after_packets = -1\n"),
        Some("security.rekey_after_packets"),
        "test.toml line 8: `security.rekey_after_packets`: invalid value: integer `-1`, \
         expected a non-negative integer",
    );
}

#[test]
fn bad_units_name_key_and_line() {
    let d = parse_err(&MIN.replace("\"2M\"", "\"2 MB/s\""));
    assert_one(&d, "link.tx_rate", at(5));
    assert_eq!(
        d.to_string(),
        "test.toml line 5: `link.tx_rate`: `MB/s` is a byte unit; rates are in bits per second \
         (1 MB/s = \"8Mbit\"); expected a bit rate like \"1.544Mbit\" or an integer of bits per \
         second"
    );
    assert_parse_error(
        &MIN.replace("\"2M\"", "-5"),
        Some("link.tx_rate"),
        "test.toml line 5: `link.tx_rate`: negative value -5; expected a bit rate like \
         \"1.544Mbit\" or an integer of bits per second",
    );
    let d = parse_err(&min_with("[limits]\nmemory_budget = \"1 lot\"\n"));
    assert_one(&d, "limits.memory_budget", at(8));
    assert_eq!(
        d.to_string(),
        "test.toml line 8: `limits.memory_budget`: unknown unit `lot` (use B, k, M, G, T \
         (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), optionally followed by B); \
         expected a byte size like \"64MiB\" or an integer of bytes"
    );
    assert_parse_error(
        &min_with("[limits]\nmemory_budget = \"4Mbit\"\n"),
        Some("limits.memory_budget"),
        "test.toml line 8: `limits.memory_budget`: `Mbit` is a bit unit; sizes are in bytes, \
         e.g. \"4MB\" or \"4MiB\"; expected a byte size like \"64MiB\" or an integer of bytes",
    );
    // Durations are parsed by humantime: its wording.
    assert_parse_error(
        &min_with("[transport]\nkeepalive = \"5 parsecs\"\n"),
        Some("transport.keepalive"),
        "test.toml line 8: `transport.keepalive`: invalid value: string \"5 parsecs\", expected \
         a duration",
    );
}

#[test]
fn bad_values_name_key_and_line() {
    let d = parse_err(&MIN.replace("\"terminal\"", "\"satellite\""));
    assert_one(&d, "peer.side", at(3));
    assert_eq!(
        d.to_string(),
        "test.toml line 3: `peer.side`: unknown value `satellite`, expected `terminal` or `hub`"
    );
    assert_parse_error(
        &min_with("[transport]\ncc = \"cubic\"\n"),
        Some("transport.cc"),
        "test.toml line 8: `transport.cc`: unknown value `cubic`, expected one of `adaptive`, `rate`, `vegas`",
    );
    assert_parse_error(
        &with_security("mode = \"tls\"\n"),
        Some("security.mode"),
        "test.toml line 8: `security.mode`: unknown value `tls`, expected `noise` or `none`",
    );
    assert_parse_error(
        &with_security("mode = \"noise\"\naead = \"aes-128-gcm\"\n"),
        Some("security.aead"),
        "test.toml line 9: `security.aead`: unknown value `aes-128-gcm`, expected one of \
         `auto`, `chacha20-poly1305`, `aes-256-gcm`",
    );
    assert_parse_error(
        &MIN.replace("198.18.0.1:7400", "198.18.0.1"),
        Some("peer.address"),
        "test.toml line 2: `peer.address`: invalid socket address syntax",
    );
}

#[test]
fn bad_array_element_names_index_and_its_line() {
    let d = parse_err(&min_with(
        "[intercept]\nlisten = [\n  \"0.0.0.0:7000\",\n  \"localhost:7000\",\n]\n",
    ));
    assert_one(&d, "intercept.listen[1]", at(10));
    assert_eq!(
        d.to_string(),
        "test.toml line 10: `intercept.listen[1]`: invalid socket address syntax"
    );
}

#[test]
fn parsing_stops_at_the_first_schema_error() {
    // Unlike validation, which lists every problem, deserialization gives up at the first.
    assert_parse_error(
        &min_with("[limits]\nmax_flows = -1\n[transport]\ncc = \"cubic\"\nfoo = 1\n"),
        Some("limits.max_flows"),
        "test.toml line 8: `limits.max_flows`: invalid value: integer `-1`, expected a \
         non-negative integer",
    );
}

// ---- semantic validation: one test per rule ---------------------------------------------

#[test]
fn rates_must_be_8k_to_100g() {
    assert_only(
        &invalid(&MIN.replace("\"2M\"", "7999")),
        "link.tx_rate",
        at(5),
    );
    assert_only(
        &invalid(&MIN.replace("\"10M\"", "\"100.000000001G\"")),
        "link.rx_rate",
        at(6),
    );
    let bounds = MIN.replace("\"2M\"", "8000").replace("\"10M\"", "\"100G\"");
    PepdConfig::parse(&format!("{bounds}[limits]\nmemory_budget = \"2GiB\"\n"))
        .expect("bounds are inclusive");
}

#[test]
fn mtu_range_and_ipv6_minimum() {
    let with_mtu = |mtu: &str| MIN.replace("[link]\n", &format!("[link]\nmtu = {mtu}\n"));
    assert_only(&invalid(&with_mtu("575")), "link.mtu", at(5));
    assert_only(&invalid(&with_mtu("9001")), "link.mtu", at(5));
    PepdConfig::parse(&with_mtu("576")).expect("576 is the IPv4 minimum");
    PepdConfig::parse(&with_mtu("9000")).expect("jumbo");
    let v6 = with_mtu("1000").replace("198.18.0.1:7400", "[2001:db8::1]:7400");
    let problems = invalid(&v6);
    assert_only(&problems, "link.mtu", at(5));
    assert!(problems[0].message.contains("1280"), "{}", problems[0]);
}

#[test]
fn frame_overhead_bounded_and_datagram_size_named() {
    let with_frame = |n: &str| MIN.replace("[link]\n", &format!("[link]\nframe_overhead = {n}\n"));
    let problems = invalid(&with_frame("1025"));
    assert_only(&problems, "link.frame_overhead", at(5));
    assert!(problems[0].message.contains("1024"), "{}", problems[0]);
    let c = PepdConfig::parse(&with_frame("1024")).expect("the bound is inclusive");
    assert_eq!(c.transport().frame_overhead, 1024);
    let mtu = PepdConfig::parse(&min_with("[transport]\ndatagram_size = \"mtu\"\n")).expect("mtu");
    assert_eq!(
        mtu.transport().datagram_size,
        pep_transport::SizeMode::Fixed(usize::MAX)
    );
    assert_eq!(
        PepdConfig::parse(MIN)
            .expect("min")
            .transport()
            .datagram_size,
        pep_transport::SizeMode::Adaptive
    );
    let d = parse_err(&min_with("[transport]\ndatagram_size = \"small\"\n"));
    assert_one(&d, "transport.datagram_size", at(8));
}

#[test]
fn ack_every_packets_at_least_one() {
    let p = invalid(&min_with("[transport]\nack_every_packets = 0\n"));
    assert_only(&p, "transport.ack_every_packets", at(8));
}

#[test]
fn ack_max_delay_at_most_1s() {
    let p = invalid(&min_with("[transport]\nack_max_delay = \"1s 1ms\"\n"));
    assert_only(&p, "transport.ack_max_delay", at(8));
    PepdConfig::parse(&min_with("[transport]\nack_max_delay = \"1s\"\n")).expect("1s is allowed");
}

#[test]
fn outage_limit_at_least_1s() {
    let p = invalid(&min_with(
        "[transport]\nkeepalive = \"100ms\"\noutage_limit = \"999ms\"\n",
    ));
    assert_only(&p, "transport.outage_limit", at(9));
}

#[test]
fn keepalive_positive_and_below_outage_limit() {
    let p = invalid(&min_with("[transport]\nkeepalive = \"0s\"\n"));
    assert_only(&p, "transport.keepalive", at(8));
    let p = invalid(&min_with(
        "[transport]\noutage_limit = \"10s\"\nkeepalive = \"10s\"\n",
    ));
    assert_only(&p, "transport.keepalive", at(9));
    assert!(p[0].message.contains("(10s, line 8)"), "{}", p[0]);
    // Against the default outage limit (2m) the message says so.
    let p = invalid(&min_with("[transport]\nkeepalive = \"3m\"\n"));
    assert_only(&p, "transport.keepalive", at(8));
    assert!(p[0].message.contains("(2m, default)"), "{}", p[0]);
}

#[test]
fn pacing_burst_at_most_100ms() {
    let p = invalid(&min_with("[transport]\npacing_burst = \"101ms\"\n"));
    assert_only(&p, "transport.pacing_burst", at(8));
}

#[test]
fn vegas_parameters() {
    let p = invalid(&min_with(
        "[transport]\ncc = \"vegas\"\nvegas_alpha = 4.0\nvegas_beta = 3.0\n",
    ));
    assert_only(&p, "transport.vegas_beta", at(10));
    assert!(p[0].message.contains("(4, line 9)"), "{}", p[0]);
    // Only alpha written: alpha is blamed, not the default beta.
    let p = invalid(&min_with("[transport]\nvegas_alpha = 4.0\n"));
    assert_only(&p, "transport.vegas_alpha", at(8));
    let p = invalid(&min_with("[transport]\nvegas_gamma = 0.0\n"));
    assert_only(&p, "transport.vegas_gamma", at(8));
    let p = invalid(&min_with("[transport]\nvegas_alpha = nan\n"));
    assert_only(&p, "transport.vegas_alpha", at(8));
    let p = invalid(&min_with("[transport]\nvegas_beta = inf\n"));
    assert_only(&p, "transport.vegas_beta", at(8));
}

#[test]
fn max_flows_range() {
    assert_only(
        &invalid(&min_with("[limits]\nmax_flows = 0\n")),
        "limits.max_flows",
        at(8),
    );
    assert_only(
        &invalid(&min_with("[limits]\nmax_flows = 1_000_001\n")),
        "limits.max_flows",
        at(8),
    );
    PepdConfig::parse(&min_with("[limits]\nmax_flows = 1_000_000\n")).expect("upper bound");
}

#[test]
fn flow_buffer_range() {
    assert_only(
        &invalid(&min_with("[limits]\nflow_buffer = \"63KiB\"\n")),
        "limits.flow_buffer",
        at(8),
    );
    assert_only(
        &invalid(&min_with(
            "[limits]\nflow_buffer = \"1025MiB\"\nmemory_budget = \"4GiB\"\n",
        )),
        "limits.flow_buffer",
        at(8),
    );
}

#[test]
fn memory_budget_minimum_and_room_for_one_flow() {
    let p = invalid(&min_with(
        "[limits]\nflow_buffer = \"64KiB\"\nmemory_budget = \"1023KiB\"\n",
    ));
    assert_only(&p, "limits.memory_budget", at(9));
    let p = invalid(&min_with(
        "[limits]\nflow_buffer = \"8MiB\"\nmemory_budget = \"15MiB\"\n",
    ));
    assert_only(&p, "limits.memory_budget", at(9));
    assert!(
        p[0].message
            .contains("2 × `limits.flow_buffer` (8 MiB, line 8)"),
        "{}",
        p[0]
    );
    // Without flow_buffer the link-sized buffers shrink to fit: a quarter of the budget
    // each way at most, so a small budget or a fast link is never rejected for them.
    let small =
        PepdConfig::parse(&min_with("[limits]\nmemory_budget = \"9MiB\"\n")).expect("small budget");
    let t = small.transport();
    assert_eq!(
        (t.flow_window, t.send_buffer),
        ((9 << 20) / 4, (9 << 20) / 4)
    );
    let fast = MIN
        .replace("\"2M\"", "\"100G\"")
        .replace("\"10M\"", "\"100G\"");
    let t = PepdConfig::parse(&fast).expect("fast link").transport();
    assert_eq!(t.flow_window, 128 << 20);
}

#[test]
fn connect_timeout_at_least_100ms() {
    let p = invalid(&min_with("[timeouts]\nconnect = \"99ms\"\n"));
    assert_only(&p, "timeouts.connect", at(8));
}

#[test]
fn intercept_listen_nonempty_unique_with_ports() {
    let p = invalid(&min_with("[intercept]\nlisten = []\n"));
    assert_only(&p, "intercept.listen", at(8));
    let p = invalid(&min_with(
        "[intercept]\nlisten = [\n  \"0.0.0.0:7000\",\n  \"[::]:7000\",\n  \"0.0.0.0:7000\",\n]\n",
    ));
    assert_only(&p, "intercept.listen[2]", at(11));
    let p = invalid(&min_with("[intercept]\nlisten = [\"0.0.0.0:0\"]\n"));
    assert_only(&p, "intercept.listen[0]", at(8));
}

#[test]
fn own_mark_nonzero() {
    let p = invalid(&min_with("[intercept]\nown_mark = 0\n"));
    assert_only(&p, "intercept.own_mark", at(8));
}

#[test]
fn peer_address_must_be_a_real_peer() {
    for bad in [
        "198.18.0.1:0",
        "0.0.0.0:7400",
        "[::]:7400",
        "224.0.0.1:7400",
    ] {
        let p = invalid(&MIN.replace("198.18.0.1:7400", bad));
        assert_only(&p, "peer.address", at(2));
    }
}

#[test]
fn bind_family_matches_peer() {
    let text = MIN.replace("side = ", "bind = \"[::]:7400\"\nside = ");
    assert_only(&invalid(&text), "peer.bind", at(3));
}

#[test]
fn log_level_must_be_a_filter() {
    let p = invalid(&min_with("[log]\nlevel = \"pepd=loud\"\n"));
    assert_only(&p, "log.level", at(8));
    let p = invalid(&min_with("[log]\nlevel = \" \"\n"));
    assert_only(&p, "log.level", at(8));
    PepdConfig::parse(&min_with("[log]\nlevel = \"pepd=debug,info\"\n")).expect("filter");
}

#[test]
fn all_problems_are_reported_in_file_order_defaults_last() {
    let text = "[transport]
keepalive = \"0s\"
[peer]
address = \"198.18.0.1:0\"
side = \"terminal\"
[link]
tx_rate = 1
rx_rate = \"10M\"
[limits]
flow_buffer = \"1GiB\"
";
    let e = PepdConfig::parse_named(text, "test.toml").unwrap_err();
    let ConfigError::Invalid(problems) = &e else {
        panic!("expected validation errors, got {e:?}");
    };
    let keys: Vec<_> = problems
        .iter()
        .map(|d| (d.key.clone().unwrap_or_default(), d.position.line()))
        .collect();
    assert_eq!(
        keys,
        [
            ("transport.keepalive".to_owned(), at(2)),
            ("peer.address".to_owned(), at(4)),
            ("link.tx_rate".to_owned(), at(7)),
            ("limits.memory_budget".to_owned(), None),
        ]
    );
    assert_eq!(
        e.to_string(),
        "test.toml line 2: `transport.keepalive` must be more than 0\n\
         test.toml line 4: `peer.address` (198.18.0.1:0) needs a port other than 0\n\
         test.toml line 7: `link.tx_rate` must be 8 kbit/s to 100 Gbit/s, not 1 bit/s\n\
         test.toml (default): `limits.memory_budget` (512 MiB) must hold at least 2 × \
         `limits.flow_buffer` (1 GiB, line 10)"
    );
}

// ---- check-config output ---------------------------------------------------------------

#[test]
fn summary_shows_effective_settings() {
    let c = PepdConfig::parse_named(TERMINAL, "terminal.toml").expect("terminal.toml");
    let s = c.summary();
    for want in [
        "side:       terminal (initiator)",
        "peer:       198.18.0.1:7400 over UDP, tunnel bound to 198.19.0.1:7400",
        "intercept:  0.0.0.0:7000, [::]:7000 (own mark 0x2)",
        "link:       tx 2 Mbit/s, rx 10 Mbit/s, MTU 1500 (1456-byte datagrams)",
        "transport:  cc adaptive, unexplained loss = corruption, pacing burst 2ms",
        "acks:       every 8 packets or 50ms",
        "windows:    flow 5.7 MiB, association 64 MiB, send buffer 4 MiB, sized from the link rates",
        "limits:     10000 flows (then refuse), memory budget 512 MiB",
        "timeouts:   connect 10s, idle 2h, stalled under contention 1m, outage 2m, keepalive 5s",
        "log:        info",
        "metrics:    127.0.0.1:9464",
        "security:   noise IK (peer key REPLACE+with+output+of+pepd+pubkey+on+peer0=), no psk; \
         rekey every 2m or 1073741824 packets; AEAD chosen with the peer",
    ] {
        assert!(s.lines().any(|l| l == want), "missing {want:?} in\n{s}");
    }
    // The fixed part counts a read buffer per CPU of the host the check runs on.
    let m = c.memory_implied();
    let fixed = crate::config::budget::fixed(1500, crate::config::budget::runtime_threads());
    assert_eq!(m.fixed, fixed);
    assert_eq!(m.receive_reserve, 64 << 20);
    assert_eq!(m.max_idle_flows, ((512 << 20) - (64 << 20) - fixed) / 4096);
    assert_eq!(
        m.worst_case,
        fixed + (64 << 20) + (256 << 20) + 10_000 * 4096
    );
    let want = format!(
        "memory:     fixed {} + 4 KiB per flow + payload (receive reserve 64 MiB, send up to \
         256 MiB): the budget carries {} idle flows; at most {} in use with 10000 flows, plus \
         the process itself",
        approx(fixed),
        m.max_idle_flows,
        approx(m.worst_case)
    );
    assert!(s.lines().any(|l| l == want), "missing {want:?} in\n{s}");
}

#[test]
fn a_budget_too_small_for_max_flows_is_warned_about() {
    let c = PepdConfig::parse_named(
        &min_with("[limits]\nmemory_budget = \"16MiB\"\nmax_flows = 5000\n"),
        "test.toml",
    )
    .expect("legal config");
    let m = c.memory_implied();
    // 16 MiB less the 8 MiB receive window and the fixed costs, in 4 KiB flows.
    assert_eq!(m.receive_reserve, 8 << 20);
    assert_eq!(m.max_idle_flows, ((8 << 20) - m.fixed) / 4096);
    assert_eq!(
        c.warnings(),
        [format!(
            "test.toml line 9: `limits.max_flows` (5000) is more than `limits.memory_budget` \
             (16 MiB) carries: {} flows with nothing buffered; past that, new connections get \
             the `over_limit` treatment. Raise the budget, or lower `limits.max_flows` to \
             match",
            m.max_idle_flows
        )]
    );
    let enough = PepdConfig::parse(&min_with(
        "[limits]\nmemory_budget = \"16MiB\"\nmax_flows = 500\n",
    ))
    .expect("legal config");
    assert_eq!(enough.warnings(), Vec::<String>::new());
}

#[test]
fn warnings_for_suspicious_settings() {
    let c = PepdConfig::parse_named(
        &min_with(
            "[timeouts]
idle = \"0s\"
[transport]
loss_default = \"congestion\"
vegas_beta = 5.0
pacing_burst = \"0s\"
keepalive = \"1m\"
[limits]
flow_buffer = \"64KiB\"
[metrics]
listen = \"0.0.0.0:9464\"
",
        ),
        "test.toml",
    )
    .expect("legal config");
    let w = c.warnings();
    // In file order, like errors.
    let starts = [
        "test.toml line 8: `timeouts.idle` = 0 never",
        "test.toml line 10: `transport.loss_default`",
        "test.toml line 11: `transport.vegas_beta` has no effect",
        "test.toml line 12: `transport.pacing_burst`",
        "test.toml line 13: `transport.keepalive`",
        "test.toml line 15: `limits.flow_buffer` (64 KiB) is less than one bandwidth-delay \
         product",
        "test.toml line 17: `metrics.listen`",
    ];
    assert_eq!(w.len(), starts.len(), "{w:#?}");
    for (w, start) in w.iter().zip(starts) {
        assert!(w.starts_with(start), "{w:?} does not start with {start:?}");
    }
    // 2 Mbit/s for 600 ms is 150 kB: a buffer above that is quiet.
    let c = PepdConfig::parse(&min_with("[limits]\nflow_buffer = \"150kB\"\n")).expect("ok");
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    let c = PepdConfig::parse(&min_with("[timeouts]\nidle = \"30s\"\n")).expect("ok");
    assert_eq!(c.warnings().len(), 1);
    let c = PepdConfig::parse(&MIN.replace("[link]\n", "[link]\nmtu = 9000\n")).expect("ok");
    assert_eq!(c.warnings().len(), 1);
}

#[test]
fn truncated_or_mangled_files_are_errors_not_panics() {
    for (i, _) in TERMINAL.char_indices() {
        let _ = PepdConfig::parse(&TERMINAL[..i]);
    }
    let lines: Vec<&str> = TERMINAL.lines().collect();
    for junk in ["=", "[", "x = ", "\"", "[[link]]", "link = 1", "a.b.c = {"] {
        for i in 0..lines.len() {
            let mut mangled = lines.clone();
            mangled[i] = junk;
            let e = PepdConfig::parse(&mangled.join("\n"));
            assert!(e.is_err() || lines[i].trim_start().starts_with('#') || lines[i].is_empty());
        }
    }
}

#[test]
fn every_key_in_the_example_is_documented() {
    const DOC: &str = include_str!("../../docs/CONFIG.md");
    // Commented-out keys ("# flow_buffer = ...") count too: they are documented options.
    let uncommented = example_with_every_key();
    let c = PepdConfig::parse(&uncommented).expect("uncommented example");
    assert!(c.limits.flow_buffer.is_some() && c.source_map.contains("transport.vegas_gamma"));
    let root = toml::de::DeTable::parse(&uncommented).expect("toml");
    let mut count = 0;
    for (section, table) in root.get_ref() {
        assert!(
            DOC.contains(&format!("### `[{}]`", section.get_ref())),
            "section {} undocumented",
            section.get_ref()
        );
        let table = table.get_ref().as_table().expect("sections only");
        for key in table.keys() {
            let row = format!("| `{}` |", key.get_ref());
            assert!(
                DOC.contains(&row),
                "{}.{} undocumented",
                section.get_ref(),
                key.get_ref()
            );
            count += 1;
        }
    }
    assert_eq!(count, 55, "every key of the schema");
    // The `[[peer]]` form's keys, in config/hub-spoke.toml, which sets every one.
    let root = toml::de::DeTable::parse(HUB_SPOKE).expect("toml");
    let mut list_keys = std::collections::BTreeSet::new();
    for (section, value) in root.get_ref() {
        let section = section.get_ref();
        let tables: Vec<_> = match value.get_ref() {
            toml::de::DeValue::Array(entries) => entries.iter().map(|e| e.get_ref()).collect(),
            table => vec![table],
        };
        let heading = match value.get_ref() {
            toml::de::DeValue::Array(_) => format!("### `[[{section}]]`"),
            _ => format!("### `[{section}]`"),
        };
        assert!(DOC.contains(&heading), "{heading} undocumented");
        for table in tables {
            for key in table.as_table().expect("sections only").keys() {
                let row = format!("| `{}` |", key.get_ref());
                assert!(
                    DOC.contains(&row),
                    "{section}.{} undocumented",
                    key.get_ref()
                );
                list_keys.insert(format!("{section}.{}", key.get_ref()));
            }
        }
    }
    let new: Vec<&str> = list_keys
        .iter()
        .map(String::as_str)
        .filter(|k| k.starts_with("peer.") || k.starts_with("tunnel."))
        .collect();
    assert_eq!(
        new,
        [
            "peer.address",
            "peer.keepalive",
            "peer.max_flows",
            "peer.min_rate",
            "peer.name",
            "peer.public_key",
            "peer.rx_rate",
            "peer.subnets",
            "peer.tx_rate",
            "peer.weight",
            "tunnel.bind",
            "tunnel.hints",
            "tunnel.redundant",
            "tunnel.side",
            "tunnel.workers",
        ],
        "every key of the `[[peer]]` form"
    );
}

// ---- [rules] ---------------------------------------------------------------------------

#[test]
fn rules_defaults_and_example() {
    let c = PepdConfig::parse(MIN).expect("minimal config");
    let r = &c.rules;
    assert!(r.interfaces.is_empty() && r.ports.is_empty());
    assert!(r.bypass_subnets.is_empty() && r.proxy_subnets.is_empty());
    assert_eq!(
        (r.tproxy_mark, r.route_table, r.fail),
        (0x1, 100, FailMode::Open)
    );
    let t = PepdConfig::parse(TERMINAL).expect("terminal.toml");
    assert_eq!(t.rules.interfaces, ["lan0"]);
    assert_eq!(
        t.rules.bypass_subnets,
        ["198.19.255.0/24".parse::<ipnet::IpNet>().expect("subnet")]
    );
    let c = PepdConfig::parse(&min_with(
        "[rules]\ninterfaces = [\"lan0\", \"vlan*\"]\nports = [80, 443]\n\
         bypass_subnets = [\"fd00:198:18::/48\", \"198.18.0.7\"]\n\
         proxy_subnets = [\"198.18.0.0/15\"]\ntproxy_mark = 0x10\nroute_table = 4242\n\
         fail = \"closed\"\n",
    ))
    .expect("full [rules]");
    assert_eq!(c.rules.ports, [80, 443]);
    assert_eq!(c.rules.bypass_subnets[1].to_string(), "198.18.0.7/32");
    assert_eq!(c.rules.fail, FailMode::Closed);
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    assert!(
        c.summary().lines().any(|l| l
            == "rules:      TCP from lan0, vlan* to ports 80, 443 in 198.18.0.0/15; bypass 2 \
                subnets; mark 0x10, table 4242; fail closed"),
        "{}",
        c.summary()
    );
    let s = PepdConfig::parse(&min_with("[rules]\nports = [22]\n")).expect("ok");
    assert!(s
        .summary()
        .lines()
        .any(|l| l
            == "rules:      TCP from any interface to port 22; mark 0x1, table 100; fail open"));
}

#[test]
fn rules_parse_errors_name_the_element() {
    let d = parse_err(&min_with(
        "[rules]\nbypass_subnets = [\n  \"198.18.0.0/15\",\n  \"198.18.0.0/33\",\n]\n",
    ));
    assert_one(&d, "rules.bypass_subnets[1]", at(10));
    assert_eq!(
        d.to_string(),
        "test.toml line 10: `rules.bypass_subnets[1]`: prefix length 33 is longer than the 32 \
         bits of the address; expected a subnet like \"198.18.0.0/15\" or \"fd00:198:18::/48\""
    );
    assert_parse_error(
        &min_with("[rules]\nproxy_subnets = [\"lan\"]\n"),
        Some("rules.proxy_subnets[0]"),
        "test.toml line 8: `rules.proxy_subnets[0]`: `lan` is not an IPv4 or IPv6 address; \
         expected a subnet like \"198.18.0.0/15\" or \"fd00:198:18::/48\"",
    );
    assert_parse_error(
        &min_with("[rules]\nports = [70000]\n"),
        Some("rules.ports[0]"),
        "test.toml line 8: `rules.ports[0]`: invalid value: integer `70000`, expected an \
         integer from 0 to 65535",
    );
    assert_parse_error(
        &min_with("[rules]\nfail = \"shut\"\n"),
        Some("rules.fail"),
        "test.toml line 8: `rules.fail`: unknown value `shut`, expected `open` or `closed`",
    );
}

#[test]
fn rules_validation() {
    let p = invalid(&min_with(
        "[rules]
interfaces = [\"lan0\", \"lan0\", \"a very long name\", \"*\", \"l\\\"n\", \"a*b\"]
ports = [0, 80, 80]
bypass_subnets = [\"198.18.0.1/15\", \"fd00:198:18::1/48\"]
proxy_subnets = [\"198.18.0.0/15\", \"198.18.0.1/31\"]
tproxy_mark = 2
route_table = 254
",
    ));
    let got: Vec<String> = p.iter().map(ToString::to_string).collect();
    // All on line 8 to 13, reported in the order found within a line.
    assert_eq!(
        got,
        [
            "test.toml line 8: `rules.interfaces[1]` (\"lan0\") is listed twice",
            "test.toml line 8: `rules.interfaces[2]` (\"a very long name\") is longer than the \
             15 bytes of an interface name",
            "test.toml line 8: `rules.interfaces[3]` (\"*\") must name an interface (a trailing \
             `*` matches several)",
            "test.toml line 8: `rules.interfaces[4]` (\"l\\\"n\") must not contain white space, \
             quotes, '/', ':', '\\' or a '*' before the end",
            "test.toml line 8: `rules.interfaces[5]` (\"a*b\") must not contain white space, \
             quotes, '/', ':', '\\' or a '*' before the end",
            "test.toml line 9: `rules.ports[0]` must be a port from 1 to 65535, not 0",
            "test.toml line 9: `rules.ports[2]` (80) is listed twice",
            "test.toml line 10: `rules.bypass_subnets[0]` (198.18.0.1/15) has bits set after \
             the prefix: write 198.18.0.0/15",
            "test.toml line 10: `rules.bypass_subnets[1]` (fd00:198:18::1/48) has bits set \
             after the prefix: write fd00:198:18::/48",
            "test.toml line 11: `rules.proxy_subnets[1]` (198.18.0.1/31) has bits set after the \
             prefix: write 198.18.0.0/31",
            "test.toml line 12: `rules.tproxy_mark` (0x2) must differ from `intercept.own_mark` \
             (0x2, default): pepd's own packets would be delivered to itself",
            "test.toml line 13: `rules.route_table` must not be 0 or a system table (253 \
             default, 254 main, 255 local), not 254",
        ]
    );
    assert_only(
        &invalid(&min_with("[rules]\ntproxy_mark = 0\n")),
        "rules.tproxy_mark",
        at(8),
    );
    assert_only(
        &invalid(&min_with("[rules]\nroute_table = 0\n")),
        "rules.route_table",
        at(8),
    );
    // Only IPv6 subnets to proxy, and only an IPv4 listener: nothing would be intercepted.
    let p = invalid(&min_with(
        "[intercept]\nlisten = [\"0.0.0.0:7000\"]\n\
         [rules]\nproxy_subnets = [\"fd00:198:18::/48\"]\n",
    ));
    assert_only(&p, "rules.proxy_subnets", at(10));
    PepdConfig::parse(&min_with(
        "[rules]\nproxy_subnets = [\"fd00:198:18::/48\"]\ninterfaces = [\"vlan*\"]\n",
    ))
    .expect("an IPv6 subnet with the default dual-stack listeners");
}

// ---- [security] ------------------------------------------------------------------------

/// A fresh directory for key files, removed on drop.
struct KeyDir(tempfile::TempDir);

impl KeyDir {
    fn new(name: &str) -> KeyDir {
        let prefix = format!("pepd-config-{name}-");
        KeyDir(
            tempfile::Builder::new()
                .prefix(&prefix)
                .tempdir()
                .expect("temp dir"),
        )
    }

    fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.path().join(name)
    }

    /// A new private key file with `mode`; returns its path and public key (base64).
    fn private_key(&self, name: &str, mode: u32) -> (std::path::PathBuf, String) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.join(name);
        let key = crate::config::keys::write_private_key(&path).expect("write key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let public = pep_transport::security::public_key(&key);
        (path, crate::config::keys::encode_key(&public))
    }
}

/// A peer's public key that is none of ours.
fn peer_key() -> String {
    crate::config::keys::encode_key(&pep_transport::security::public_key(&[7; 32]))
}

/// `MIN` plus a `[security]` section (line 7) with `body` from line 8.
fn with_security(body: &str) -> String {
    min_with(&format!("[security]\n{body}"))
}

fn security_err(text: &str) -> Vec<Diagnostic> {
    let c = PepdConfig::parse_named(text, "test.toml").expect("parses");
    match c.load_security() {
        Err(ConfigError::Invalid(ds)) => ds,
        other => panic!("expected key errors, got {other:?}"),
    }
}

#[test]
fn security_loads_keys_and_psk() {
    let dir = KeyDir::new("load");
    let (key, public) = dir.private_key("private.key", 0o600);
    let psk = dir.join("psk");
    crate::config::keys::write_psk(&psk).expect("psk");
    let c = PepdConfig::parse_named(
        &with_security(&format!(
            "private_key_file = {key:?}\npeer_public_key = \"{}\"\npsk_file = {psk:?}\n\
             rekey_interval = \"30s\"\nrekey_after_packets = 5000\naead = \"aes-256-gcm\"\n",
            peer_key()
        )),
        "test.toml",
    )
    .expect("config");
    let loaded = c.load_security().expect("keys");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.local_public_key(), Some(public));
    let sec = c.security().expect("keys").expect("noise");
    assert_eq!(
        sec.local_private_key,
        crate::config::keys::read_key_file(&key).expect("key")
    );
    assert_eq!(
        sec.peer_public_key,
        pep_transport::security::public_key(&[7; 32])
    );
    assert_eq!(
        sec.psk,
        Some(crate::config::keys::read_key_file(&psk).expect("psk"))
    );
    assert_eq!(sec.rekey_interval, Duration::from_secs(30));
    assert_eq!(sec.rekey_after_packets, 5000);
    assert_eq!(
        sec.aeads,
        pep_transport::security::AeadOffer::only(
            pep_transport::security::PacketProtection::Aes256Gcm
        )
    );
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    let want = format!(
        "security:   noise IK (peer key {}), psk from {}; rekey every 30s or 5000 packets; \
         AEAD pinned to aes-256-gcm",
        peer_key(),
        psk.display()
    );
    assert!(c.summary().lines().any(|l| l == want), "{}", c.summary());
}

#[test]
fn security_is_required_unless_mode_none() {
    // No [security] at all: parsing succeeds (nft-rules needs no keys), loading names
    // both keys without a line.
    let c = PepdConfig::parse_named(MIN, "test.toml").expect("parses");
    let Err(ConfigError::Invalid(p)) = c.load_security() else {
        panic!("keys are required");
    };
    let keys: Vec<_> = p
        .iter()
        .map(|d| d.key.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        ["security.private_key_file", "security.peer_public_key"]
    );
    assert!(p.iter().all(|d| d.position == Position::Document));
    let text = p[0].to_string();
    assert!(
        text.starts_with("test.toml: `security.private_key_file` is required with"),
        "{text}"
    );
    assert!(text.contains("pepd genkey"), "{text}");
    // With the section present, they point at its header.
    let p = security_err(&with_security("rekey_interval = \"1m\"\n"));
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(p.iter().all(|d| d.position.line() == Some(7)), "{p:#?}");
    // mode = "none" needs nothing and gives nothing.
    let c = PepdConfig::parse(&with_security("mode = \"none\"\n")).expect("none");
    assert_eq!(c.security().expect("no keys needed"), None);
}

#[test]
fn key_file_problems_name_key_line_and_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = KeyDir::new("problems");
    let peer = peer_key();
    let config = |path: &std::path::Path| {
        with_security(&format!(
            "private_key_file = {path:?}\npeer_public_key = \"{peer}\"\n"
        ))
    };
    // Missing: says how to make one.
    let missing = dir.join("missing.key");
    let p = security_err(&config(&missing));
    assert_only(&p, "security.private_key_file", at(8));
    assert_eq!(
        p[0].to_string(),
        format!(
            "test.toml line 8: `security.private_key_file`: {0} does not exist; create it \
             with `pepd genkey {0}`",
            missing.display()
        )
    );
    // Readable by others: refused, with the fix.
    let (open, _) = dir.private_key("open.key", 0o644);
    let p = security_err(&config(&open));
    assert_only(&p, "security.private_key_file", at(8));
    let text = p[0].to_string();
    assert!(
        text.contains("readable by other users (mode 0644)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("chmod 600 {}", open.display())),
        "{text}"
    );
    // Not a key.
    let garbage = dir.join("garbage.key");
    std::fs::write(&garbage, "-----BEGIN PRIVATE KEY-----\n").expect("write");
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let p = security_err(&config(&garbage));
    assert_only(&p, "security.private_key_file", at(8));
    assert!(p[0].message.contains("is not a key file"), "{}", p[0]);
    // Group-readable: loads, with a warning naming the key.
    let (group, _) = dir.private_key("group.key", 0o640);
    let c = PepdConfig::parse_named(&config(&group), "test.toml").expect("config");
    let loaded = c.load_security().expect("group-readable is allowed");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0].starts_with("test.toml line 8: `security.private_key_file`: ")
            && loaded.warnings[0].contains("readable by its group (mode 0640)"),
        "{:?}",
        loaded.warnings
    );
    // A psk file is held to the same rules and named as such; problems are all listed.
    let (ok, _) = dir.private_key("ok.key", 0o600);
    let p = security_err(&with_security(&format!(
        "private_key_file = {ok:?}\npsk_file = {:?}\npeer_public_key = \"{}\"\n",
        dir.join("no.psk"),
        crate::config::keys::PLACEHOLDER_PUBLIC_KEY
    )));
    let got: Vec<_> = p
        .iter()
        .map(|d| (d.key.clone().unwrap_or_default(), d.position.line()))
        .collect();
    assert_eq!(
        got,
        [
            ("security.psk_file".to_owned(), at(9)),
            ("security.peer_public_key".to_owned(), at(10)),
        ]
    );
    assert!(p[0].message.contains("pepd genpsk"), "{}", p[0]);
    assert!(p[1].message.contains("placeholder"), "{}", p[1]);
}

#[test]
fn peer_key_must_be_base64_of_32_bytes_and_not_our_own() {
    let p = invalid(&with_security("peer_public_key = \"abc\"\n"));
    assert_only(&p, "security.peer_public_key", at(8));
    assert!(p[0].message.contains("is not base64"), "{}", p[0]);
    let short = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg==";
    let p = invalid(&with_security(&format!("peer_public_key = \"{short}\"\n")));
    assert_only(&p, "security.peer_public_key", at(8));
    assert!(
        p[0].message.contains("decodes to 31 bytes, not 32"),
        "{}",
        p[0]
    );
    let zeros = crate::config::keys::encode_key(&[0; 32]);
    let p = invalid(&with_security(&format!("peer_public_key = \"{zeros}\"\n")));
    assert_only(&p, "security.peer_public_key", at(8));
    let dir = KeyDir::new("own");
    let (key, public) = dir.private_key("private.key", 0o600);
    let p = security_err(&with_security(&format!(
        "private_key_file = {key:?}\npeer_public_key = \"{public}\"\n"
    )));
    assert_only(&p, "security.peer_public_key", at(9));
    assert!(p[0].message.contains("own public key"), "{}", p[0]);
}

#[test]
fn security_ranges_and_paths() {
    let p = invalid(&with_security("rekey_interval = \"999ms\"\n"));
    assert_only(&p, "security.rekey_interval", at(8));
    let p = invalid(&with_security("rekey_interval = \"24h 1s\"\n"));
    assert_only(&p, "security.rekey_interval", at(8));
    PepdConfig::parse(&with_security("rekey_interval = \"24h\"\n")).expect("upper bound");
    let p = invalid(&with_security("rekey_after_packets = 999\n"));
    assert_only(&p, "security.rekey_after_packets", at(8));
    let p = invalid(&with_security(
        "private_key_file = \"private.key\"\npsk_file = \"./psk\"\n",
    ));
    let keys: Vec<_> = p
        .iter()
        .map(|d| d.key.clone().unwrap_or_default())
        .collect();
    assert_eq!(keys, ["security.private_key_file", "security.psk_file"]);
    assert!(
        p[0].message.contains("must be an absolute path"),
        "{}",
        p[0]
    );
}

#[test]
fn security_warnings() {
    let c = PepdConfig::parse_named(
        &with_security("mode = \"none\"\npeer_public_key = \"x\"\n").replace(
            "peer_public_key = \"x\"",
            &format!("peer_public_key = \"{}\"", peer_key()),
        ),
        "test.toml",
    )
    .expect("legal");
    let w = c.warnings();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(
        w[0].starts_with("test.toml line 8: `security.mode` = \"none\" leaves the tunnel")
            && w[0].contains("`peer.address`"),
        "{w:?}"
    );
    assert!(
        w[1].starts_with("test.toml line 9: `security.peer_public_key` has no effect"),
        "{w:?}"
    );
    assert!(c
        .summary()
        .lines()
        .any(|l| l.starts_with("security:   none")));
    let c = PepdConfig::parse_named(&with_security("rekey_interval = \"5s\"\n"), "test.toml")
        .expect("legal");
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(
        w[0].starts_with("test.toml line 8: `security.rekey_interval` (5s) is below 10s"),
        "{w:?}"
    );
}

#[test]
fn example_configs_name_the_installed_key_and_a_placeholder() {
    for text in [TERMINAL, HUB] {
        let c = PepdConfig::parse(text).expect("example");
        let sec = &c.security;
        assert_eq!(sec.mode, SecurityMode::Noise);
        assert_eq!(
            sec.private_key_file.as_deref(),
            Some(std::path::Path::new("/etc/pepd/private.key"))
        );
        assert_eq!(
            sec.peer_public_key.as_deref(),
            Some(crate::config::keys::PLACEHOLDER_PUBLIC_KEY)
        );
        assert_eq!(
            (sec.rekey_interval, sec.rekey_after_packets),
            (DEFAULT_REKEY_INTERVAL, DEFAULT_REKEY_AFTER_PACKETS)
        );
    }
}

#[test]
fn tunnel_workers_are_counted_clamped_and_printed() {
    let with = |workers: &str| HUB_SPOKE.replace("workers = 2", workers);
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    assert_eq!(c.workers(), 2);
    assert!(
        c.summary()
            .lines()
            .any(|l| l == "workers:    2 threads, the associations spread over them by peer"),
        "{}",
        c.summary()
    );
    assert!(c.warnings().iter().all(|w| !w.contains("tunnel.workers")));
    // Beyond what a connection ID names: 8, with a warning naming the key.
    let c = PepdConfig::parse(&with("workers = 20")).expect("20 workers");
    assert_eq!(c.workers(), MAX_WORKERS);
    let warnings = c.warnings();
    let warned: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("`tunnel.workers` = 20"))
        .collect();
    assert_eq!(warned.len(), 1, "{warnings:?}");
    assert!(warned[0].contains("running 8"), "{}", warned[0]);
    // Left out: one per core, at most 8.
    let c = PepdConfig::parse(&with("")).expect("default workers");
    assert_eq!(
        c.workers(),
        crate::config::budget::runtime_threads().clamp(1, MAX_WORKERS)
    );
    // 0 is refused, naming the key and its line.
    let e = PepdConfig::parse(&with("workers = 0")).unwrap_err();
    let ConfigError::Invalid(problems) = &e else {
        panic!("expected validation errors, got {e:?}");
    };
    let keys: Vec<_> = problems
        .iter()
        .map(|d| d.key.clone().unwrap_or_default())
        .collect();
    assert_eq!(keys, ["tunnel.workers"]);
    assert!(
        e.to_string()
            .contains("`tunnel.workers` must be at least 1"),
        "{e}"
    );
}

/// The 1-based line of the first line of `text` that starts with `start`.
fn line_of(text: &str, start: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(start))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no line starts with {start:?}"))
}

#[test]
fn a_redundant_hub_binds_a_specific_address_with_noise() {
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    assert!(!c.redundant());
    let redundant = HUB_SPOKE.replace("redundant = false", "redundant = true");
    let c = PepdConfig::parse(&redundant).expect("redundant hub");
    assert!(c.redundant());
    // Its entries' addresses start nothing: each is pointed out.
    let warnings = c.warnings();
    let pointed: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("starts no association at a redundant hub"))
        .collect();
    assert_eq!(pointed.len(), 2, "{warnings:?}");
    assert!(pointed[0].contains("`peer[0].address`"), "{}", pointed[0]);
    let line = line_of(&redundant, "redundant = true");
    // A wildcard bind: its replies could leave from another address.
    let wildcard = redundant.replace("bind = \"198.18.0.1:7400\"", "bind = \"0.0.0.0:7400\"");
    let ds = invalid(&wildcard);
    assert_only(&ds, "tunnel.redundant", at(line));
    assert!(ds[0].message.contains("not a wildcard"), "{}", ds[0]);
    // No bind at all is the same.
    let ds = invalid(&redundant.replace("bind = \"198.18.0.1:7400\"\n", ""));
    assert_only(&ds, "tunnel.redundant", at(line - 1));
    // A terminal is never redundant.
    let terminal = "[tunnel]\nside = \"terminal\"\nbind = \"198.18.1.2:7400\"\nredundant = true\n\
                    [[peer]]\nname = \"hub\"\naddress = \"198.18.0.1:7400\"\n\
                    public_key = \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"\n\
                    subnets = [\"0.0.0.0/0\"]\n[link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n\
                    [security]\nprivate_key_file = \"/nonexistent\"\n";
    let ds = invalid(terminal);
    assert_only(&ds, "tunnel.redundant", at(4));
    assert!(ds[0].message.contains("is for hubs"), "{}", ds[0]);
    // Not a boolean: a parse error at its line and column.
    let d = parse_err(&redundant.replace("redundant = true", "redundant = \"yes\""));
    assert_eq!(d.key.as_deref(), Some("tunnel.redundant"), "{d}");
    assert_eq!(
        d.position,
        crate::config::error::Position::At { line, column: 13 },
        "{d}"
    );
}

#[test]
fn tunnel_hints_are_on_at_a_secure_hub_and_refused_where_they_cannot_work() {
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    assert!(c.hints());
    let without = HUB_SPOKE.replace("hints = true\n", "");
    assert!(PepdConfig::parse(&without).expect("default hints").hints());
    let off = HUB_SPOKE.replace("hints = true", "hints = false");
    assert!(!PepdConfig::parse(&off).expect("hints off").hints());
    let refused = |text: &str| {
        let e = PepdConfig::parse(text).unwrap_err();
        let ConfigError::Invalid(problems) = &e else {
            panic!("expected validation errors, got {e:?}");
        };
        let hints: Vec<String> = problems
            .iter()
            .filter(|d| d.key.as_deref() == Some("tunnel.hints"))
            .map(|d| d.message.clone())
            .collect();
        assert_eq!(hints.len(), 1, "{e}");
        hints[0].clone()
    };
    let none = refused(&HUB_SPOKE.replace("mode = \"noise\"", "mode = \"none\""));
    assert!(none.contains("needs `security.mode = \"noise\"`"), "{none}");
    let terminal = refused(&HUB_SPOKE.replace("side = \"hub\"", "side = \"terminal\""));
    assert!(terminal.contains("is for a hub"), "{terminal}");
}

#[test]
fn a_pair_runs_one_worker_whatever_the_cores() {
    let c = PepdConfig::parse(&example_with_every_key()).expect("example");
    assert_eq!(c.workers(), 1);
}

// ---- [control] -------------------------------------------------------------------------

#[test]
fn control_socket_is_named_after_the_config_file_unless_set() {
    use super::control::runtime_dir;
    let c = PepdConfig::parse_named(MIN, "/etc/pepd/hub-east.toml").expect("valid");
    assert_eq!(c.control_socket(), runtime_dir().join("hub-east.sock"));
    let c = PepdConfig::parse(MIN).expect("valid");
    assert_eq!(c.control_socket(), runtime_dir().join("pepd.sock"));
    let set = min_with("[control]\nsocket = \"/run/pepd/east.sock\"\n");
    let c = PepdConfig::parse_named(&set, "/etc/pepd/hub-east.toml").expect("valid");
    assert_eq!(
        c.control_socket(),
        std::path::Path::new("/run/pepd/east.sock")
    );
    let want = "control:    /run/pepd/east.sock (`pepd status`, `pepd flows`)";
    assert!(c.summary().lines().any(|l| l == want), "{}", c.summary());
}

#[test]
fn control_socket_must_be_an_absolute_file_path_a_socket_address_holds() {
    let relative = invalid(&min_with("[control]\nsocket = \"pepd.sock\"\n"));
    assert_only(&relative, "control.socket", at(8));
    assert!(
        relative[0].to_string().contains("absolute"),
        "{}",
        relative[0]
    );
    let dir = invalid(&min_with("[control]\nsocket = \"/run/pepd/\"\n"));
    assert_only(&dir, "control.socket", at(8));
    let long = format!("/run/pepd/{}.sock", "x".repeat(100));
    let too_long = invalid(&min_with(&format!("[control]\nsocket = {long:?}\n")));
    assert_only(&too_long, "control.socket", at(8));
    assert!(
        too_long[0].to_string().contains("115 bytes long"),
        "{}",
        too_long[0]
    );
    let unknown = parse_err(&min_with("[control]\npath = \"/run/pepd/x.sock\"\n"));
    assert_eq!(unknown.key.as_deref(), Some("control.path"), "{unknown}");
}

#[test]
fn quic_validation() {
    let p = invalid(&min_with(
        "[rules]
quic = \"reject\"
quic_ports = [443, 0, 443]
quic_exceptions = [\"198.18.7.1/24\"]
",
    ));
    let got: Vec<String> = p.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "test.toml line 9: `rules.quic_ports[1]` must be a port from 1 to 65535, not 0",
            "test.toml line 9: `rules.quic_ports[2]` (443) is listed twice",
            "test.toml line 10: `rules.quic_exceptions[0]` (198.18.7.1/24) has bits set after \
             the prefix: write 198.18.7.0/24",
        ]
    );
    assert_only(
        &invalid(&min_with("[rules]\nquic_ports = []\n")),
        "rules.quic_ports",
        at(8),
    );
    assert_eq!(
        parse_err(&min_with("[rules]\nquic = \"block\"\n")).to_string(),
        "test.toml line 8: `rules.quic`: unknown value `block`, expected one of `pass`, \
         `reject`, `drop`"
    );
    let c = PepdConfig::parse(&min_with("[rules]\nquic = \"drop\"\n")).expect("ok");
    assert_eq!(c.rules.quic, QuicPolicy::Drop);
    assert_eq!(c.rules.quic_ports, [443]);
    assert_eq!(
        PepdConfig::parse(MIN).expect("ok").rules.quic,
        QuicPolicy::Pass
    );
}

#[test]
fn quic_warnings() {
    let warnings = |extra: &str| {
        PepdConfig::parse_named(&min_with(extra), "test.toml")
            .expect("legal config")
            .warnings()
    };
    // Refusing on ports whose TCP fallback is not intercepted.
    assert_eq!(
        warnings("[rules]\nports = [80]\nquic = \"reject\"\nquic_ports = [443, 80]\n"),
        [
            "test.toml line 9: `rules.quic` = \"reject\" sends clients to TCP port 443 that \
             `rules.ports` does not intercept: their fallback is not accelerated either"
        ]
    );
    assert!(warnings("[rules]\nquic = \"reject\"\n").is_empty());
    assert!(warnings("[rules]\nports = [443]\nquic = \"drop\"\n").is_empty());
    // Settings a "pass" ignores.
    assert_eq!(
        warnings("[rules]\nquic_ports = [8443]\nquic_exceptions = [\"198.18.7.0/24\"]\n"),
        [
            "test.toml line 8: `rules.quic_ports` has no effect with `rules.quic = \"pass\"`",
            "test.toml line 9: `rules.quic_exceptions` has no effect with `rules.quic = \
             \"pass\"`",
        ]
    );
    // At a hub.
    let hub = PepdConfig::parse_named(
        &HUB.replace("# quic = \"pass\"", "quic = \"reject\""),
        "hub.toml",
    )
    .expect("hub");
    let w = hub.warnings();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(
        w[0].ends_with(
            "`rules.quic` = \"reject\" at a hub refuses QUIC from the hub's own client side \
             only; the terminals' clients are best refused at each terminal, since a refusal \
             at the hub costs them a satellite round trip per attempt"
        ),
        "{}",
        w[0]
    );
}

#[test]
fn classes_parse_and_convert() {
    let c = PepdConfig::parse(&min_with(
        "[[class]]
name = \"video\"
dscp = [\"AF41\", 36]
priority = true
max_rate = \"5M\"
[[class]]
name = \"web\"
ports = [80, 443]
subnets = [\"198.18.3.0/24\"]
weight = 3
",
    ))
    .expect("legal config");
    assert_eq!(c.class.len(), 2);
    assert_eq!(c.class[0].dscp, [Dscp(34), Dscp(36)]);
    let t = c.transport().classes;
    assert_eq!(
        t,
        [
            pep_transport::TrafficClass::default(),
            pep_transport::TrafficClass {
                weight: 1,
                priority: true,
                max_rate_bps: Some(5_000_000),
            },
            pep_transport::TrafficClass {
                weight: 3,
                priority: false,
                max_rate_bps: None,
            },
        ]
    );
    // Without `[[class]]` the transport has no classes: every flow alike.
    assert!(PepdConfig::parse(MIN)
        .expect("ok")
        .transport()
        .classes
        .is_empty());
}

#[test]
fn classes_validation() {
    let p = invalid(&min_with(
        "[[class]]
name = \"all\"
[[class]]
name = \"all\"
dscp = [\"CS1\", 8]
ports = [0]
priority = true
[[class]]
name = \"default\"
weight = 0
",
    ));
    let got: Vec<String> = p.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "test.toml line 9: `class[1]` never takes a flow: `class[0]` (line 8) has no \
             `dscp`, `ports` or `subnets` and takes every flow that reaches it; put it last",
            "test.toml line 9: `class[1].max_rate` is required with `class[1].priority = true` \
             (line 13): a priority class without a cap could starve every other class",
            "test.toml line 10: `class[1].name` is also `class[0].name` (line 8): each class \
             needs its own name",
            "test.toml line 11: `class[1].dscp[1]` (CS1) is listed twice",
            "test.toml line 12: `class[1].ports[0]` must be a port from 1 to 65535, not 0",
            "test.toml line 14: `class[2]` never takes a flow: `class[0]` (line 8) has no \
             `dscp`, `ports` or `subnets` and takes every flow that reaches it; put it last",
            "test.toml line 15: `class[2].name` (\"default\") is the name of the class of the \
             flows no `[[class]]` takes: give this one another",
            "test.toml line 16: `class[2].weight` must be 1 to 1000, not 0",
        ]
    );
    assert_eq!(
        parse_err(&min_with("[[class]]\nname = \"x\"\ndscp = [\"AF44\"]\n")).to_string(),
        "test.toml line 9: `class[0].dscp[0]`: invalid value: string \"AF44\", expected a \
         DSCP: 0 to 63, or a name like \"AF41\", \"EF\" or \"CS1\""
    );
    // A cap above the link's rate, and priority caps that take all of it.
    let c = PepdConfig::parse_named(
        &min_with(
            "[[class]]\nname = \"a\"\ndscp = [\"EF\"]\npriority = true\nmax_rate = \"3M\"\n\
             [[class]]\nname = \"b\"\n",
        ),
        "test.toml",
    )
    .expect("legal config");
    assert_eq!(
        c.warnings(),
        [
            "test.toml line 7: `class` the priority classes' `max_rate`s add up to 3 Mbit/s, all of \
             `link.tx_rate` (2 Mbit/s): while they send at their caps the other classes get \
             nothing",
            "test.toml line 11: `class[0].max_rate` (3 Mbit/s) is above `link.tx_rate` (2 \
             Mbit/s): it caps nothing",
        ]
    );
}

// ---- [announce] ------------------------------------------------------------------------

/// config/hub-spoke.toml with its commented `[announce]` section set.
fn hub_announcing() -> String {
    HUB_SPOKE
        .lines()
        .map(|l| match l {
            "# [announce]" | "# table = 200" | "# outage_table = 201" => &l[2..],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn announce_is_off_unless_set_and_its_example_is_documented() {
    const DOC: &str = include_str!("../../docs/CONFIG.md");
    assert_eq!(PepdConfig::parse(HUB_SPOKE).expect("hub").announce, None);
    let text = hub_announcing();
    let c = PepdConfig::parse(&text).expect("announcing hub");
    let a = c.announce.expect("[announce]");
    assert_eq!(
        (a.table, a.outage_table(), a.tables()),
        (200, 201, vec![200, 201])
    );
    assert!(DOC.contains("### `[announce]`"));
    let root = toml::de::DeTable::parse(&text).expect("toml");
    let section = root.get_ref().get("announce").expect("section");
    let keys: Vec<String> = section
        .get_ref()
        .as_table()
        .expect("table")
        .keys()
        .map(|k| k.get_ref().to_string())
        .collect();
    assert_eq!(keys, ["outage_table", "table"]);
    for key in keys {
        assert!(DOC.contains(&format!("| `{key}` |")), "announce.{key}");
    }
    // Without `outage_table` a terminal's routes stay in `table` through an outage.
    let one = PepdConfig::parse(&text.replace("outage_table = 201\n", "")).expect("one table");
    let a = one.announce.expect("[announce]");
    assert_eq!((a.outage_table(), a.tables()), (200, vec![200]));
}

#[test]
fn announce_refuses_the_kernel_s_tables_and_the_interception_s() {
    let text = hub_announcing();
    let line = line_of(&text, "table = 200");
    for reserved in ["0", "253", "254", "255"] {
        let ds = invalid(&text.replace("table = 200", &format!("table = {reserved}")));
        assert_only(&ds, "announce.table", at(line));
        assert!(ds[0].to_string().contains("reserves"), "{}", ds[0]);
    }
    let outage = line_of(&text, "outage_table = 201");
    let ds = invalid(&text.replace("outage_table = 201", "outage_table = 255"));
    assert_only(&ds, "announce.outage_table", at(outage));
    // rules.route_table (100 by default) holds the interception's `local` route.
    let ds = invalid(&text.replace("outage_table = 201", "outage_table = 100"));
    assert_only(&ds, "announce.outage_table", at(outage));
    assert!(ds[0].to_string().contains("rules.route_table"), "{}", ds[0]);
    // `table` is required; unknown keys and negative numbers are refused where written.
    let d = parse_err(&text.replace("table = 200\n", ""));
    assert!(d.to_string().contains("table"), "{d}");
    let d = parse_err(&text.replace("outage_table = 201", "outage = 201"));
    assert_eq!(d.position.line(), at(outage), "{d}");
    let d = parse_err(&text.replace("table = 200", "table = -1"));
    assert_eq!(d.position.line(), at(line), "{d}");
}

#[test]
fn announce_is_for_a_hub() {
    let terminal = "[tunnel]\nside = \"terminal\"\nbind = \"198.18.1.2:7400\"\n\
                    [link]\ntx_rate = \"5Mbit\"\nrx_rate = \"50Mbit\"\n\
                    [security]\nmode = \"none\"\n\
                    [[peer]]\nname = \"hub\"\naddress = \"198.18.1.1:7400\"\n\
                    subnets = [\"0.0.0.0/0\"]\n\
                    [announce]\ntable = 200\n";
    let ds = invalid(terminal);
    assert_eq!(ds.len(), 1, "{ds:#?}");
    assert_eq!(ds[0].key.as_deref(), Some("announce"), "{}", ds[0]);
}
