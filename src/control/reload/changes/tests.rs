use std::time::Duration;

use super::*;
use crate::config::{
    example_with_every_key, AeadSetting, BitRate, ByteSize, CcModeName, CompressionMode,
    DatagramSizeName, FailMode, LossDefault, OverLimit, QuicPolicy, SecurityMode, Side,
};

const HUB_SPOKE: &str = include_str!("../../../../config/hub-spoke.toml");

fn every_key() -> PepdConfig {
    PepdConfig::parse(&example_with_every_key()).expect("example with every key")
}

/// The `[peer]` table of a config in the pair form.
fn pair(c: &mut PepdConfig) -> &mut PairConfig {
    match &mut c.peer {
        Peers::Pair(p) => p,
        Peers::List(_) => panic!("not the pair form"),
    }
}

/// The first `[[peer]]` entry of a config in the list form.
fn entry(c: &mut PepdConfig) -> &mut PeerEntry {
    match &mut c.peer {
        Peers::List(entries) => &mut entries[0],
        Peers::Pair(_) => panic!("not the list form"),
    }
}

/// "section.key" for every key `text` sets; "peer[].key" for the keys of `[[peer]]`
/// entries.
fn keys_in(text: &str) -> BTreeSet<String> {
    let root = toml::de::DeTable::parse(text).expect("toml");
    let mut keys = BTreeSet::new();
    for (section, value) in root.get_ref() {
        let tables = match value.get_ref() {
            toml::de::DeValue::Array(entries) => entries
                .iter()
                .map(|e| (format!("{}[]", section.get_ref()), e.get_ref()))
                .collect(),
            table => vec![(section.get_ref().to_string(), table)],
        };
        for (name, table) in tables {
            let table = table.as_table().expect("sections only");
            for key in table.keys() {
                keys.insert(format!("{name}.{}", key.get_ref()));
            }
        }
    }
    keys
}

fn names(keys: &[Key], pick: impl Fn(&Key) -> bool) -> Vec<&'static str> {
    keys.iter().filter(|k| pick(k)).map(|k| k.name).collect()
}

#[test]
fn every_key_of_the_schema_is_listed_once() {
    let c = every_key();
    let keys = compare(&c, &c);
    let listed = names(&keys, |_| true);
    let unique: BTreeSet<String> = listed.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(unique.len(), listed.len(), "a key listed twice: {listed:?}");
    assert_eq!(unique, keys_in(&example_with_every_key()));
    assert_eq!(names(&keys, |k| k.changed), Vec::<&str>::new());
    assert!(changed_settings(&c, &c).is_empty());
}

#[test]
fn live_restart_and_rules_keys_as_documented() {
    // docs/OPERATIONS.md, "Reload: SIGHUP", tells operators the same.
    let c = every_key();
    let keys = compare(&c, &c);
    assert_eq!(
        names(&keys, |k| matches!(k.setting, Setting::Live(_))),
        [
            "log.level",
            "link.tx_rate",
            "transport.ack_every_packets",
            "transport.ack_max_delay",
            "limits.max_flows",
            "limits.over_limit",
            "limits.memory_budget",
            "limits.stalled_flow_timeout",
            "timeouts.connect",
            "timeouts.idle",
            "upstream.transparent_source",
            "shutdown.grace",
        ]
    );
    assert_eq!(
        names(&keys, |k| matches!(k.setting, Setting::Restart(_))),
        [
            "intercept.listen",
            "intercept.own_mark",
            "peer.address",
            "peer.bind",
            "peer.side",
            "peer.return_to_preferred",
            "peer.return_after",
            "link.rx_rate",
            "link.mtu",
            "link.frame_overhead",
            "transport.cc",
            "transport.vegas_alpha",
            "transport.vegas_beta",
            "transport.vegas_gamma",
            "transport.loss_default",
            "transport.outage_limit",
            "transport.keepalive",
            "transport.pacing_burst",
            "transport.datagram_size",
            "transport.compression",
            "transport.compression_ports",
            "transport.compression_prefixes",
            "limits.flow_buffer",
            "metrics.listen",
            "control.socket",
            "security.mode",
            "security.private_key_file",
            "security.peer_public_key",
            "security.psk_file",
            "security.rekey_interval",
            "security.rekey_after_packets",
            "security.aead",
        ]
    );
    assert_eq!(
        names(&keys, |k| k.setting == Setting::RulesUnit),
        [
            "rules.interfaces",
            "rules.ports",
            "rules.bypass_subnets",
            "rules.proxy_subnets",
            "rules.tproxy_mark",
            "rules.route_table",
            "rules.fail",
            "rules.table",
            "rules.quic",
            "rules.quic_ports",
            "rules.quic_exceptions",
        ]
    );
}

#[test]
fn every_key_of_the_list_form_is_listed_once_and_every_entry_key_applies_live() {
    let c = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    let keys = compare(&c, &c);
    let listed = names(&keys, |_| true);
    let unique: BTreeSet<String> = listed.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(unique.len(), listed.len(), "a key listed twice: {listed:?}");
    // The schema's keys, with the `[peer]` table's replaced by the entries' and `[tunnel]`.
    let mut expected: BTreeSet<String> = keys_in(&example_with_every_key())
        .into_iter()
        .filter(|k| !k.starts_with("peer."))
        .collect();
    expected.extend(
        keys_in(HUB_SPOKE)
            .into_iter()
            .filter(|k| k.starts_with("peer[].") || k.starts_with("tunnel.")),
    );
    assert_eq!(unique, expected);
    assert_eq!(names(&keys, |k| k.changed), Vec::<&str>::new());
    let peer = |k: &Key| k.name.starts_with("peer") || k.name.starts_with("tunnel");
    assert_eq!(
        names(&keys, peer),
        [
            "peer[].name",
            "peer[].public_key",
            "peer[].address",
            "peer[].subnets",
            "peer[].tx_rate",
            "peer[].rx_rate",
            "peer[].min_rate",
            "peer[].weight",
            "peer[].keepalive",
            "peer[].max_flows",
            "tunnel.side",
            "tunnel.bind",
            "tunnel.workers",
            "tunnel.hints",
            "tunnel.redundant",
        ]
    );
    let settings: BTreeSet<Setting> = keys.iter().filter(|k| peer(k)).map(|k| k.setting).collect();
    assert_eq!(
        settings.into_iter().collect::<Vec<_>>(),
        [
            Setting::Live(LiveSetting::PeerRates),
            Setting::Live(LiveSetting::PeerMaxFlows),
            Setting::Live(LiveSetting::Peers),
            Setting::Restart(RestartSetting::Tunnel),
        ]
    );
    assert_eq!(RestartSetting::Tunnel.label(), "tunnel");
    assert_eq!(
        LiveSetting::Peers.label(),
        "peer[] entries added/removed/replaced"
    );
}

#[test]
fn an_entry_s_rates_apply_live_and_another_identity_replaces_the_peer() {
    type Mutation = (&'static str, fn(&mut PepdConfig), Setting);
    let live = Setting::Live(LiveSetting::PeerRates);
    let replaced = Setting::Live(LiveSetting::Peers);
    let mutations: Vec<Mutation> = vec![
        ("peer[].tx_rate", |c| entry(c).tx_rate = None, live),
        ("peer[].min_rate", |c| entry(c).min_rate = None, live),
        ("peer[].weight", |c| entry(c).weight += 1, live),
        ("peer[].name", |c| entry(c).name.push('x'), replaced),
        (
            "peer[].public_key",
            |c| entry(c).public_key = None,
            replaced,
        ),
        (
            "peer[].subnets",
            |c| {
                entry(c).subnets.pop();
            },
            replaced,
        ),
        ("peer[].rx_rate", |c| entry(c).rx_rate = None, replaced),
        ("peer[].keepalive", |c| entry(c).keepalive = None, live),
        (
            "peer[].max_flows",
            |c| entry(c).max_flows = None,
            Setting::Live(LiveSetting::PeerMaxFlows),
        ),
    ];
    let base = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    for (name, mutate, setting) in mutations {
        let mut new = base.clone();
        mutate(&mut new);
        assert_eq!(
            changed_settings(&base, &new)
                .into_iter()
                .collect::<Vec<_>>(),
            [setting],
            "{name}"
        );
    }
    // The pair's one peer, or a change between the forms, waits for a restart.
    let pair = every_key();
    assert!(changed_settings(&pair, &base).contains(&Setting::Restart(RestartSetting::Peer)));
    assert!(changed_settings(&base, &pair).contains(&Setting::Restart(RestartSetting::Peer)));
    assert!(!changed_settings(&pair, &base).contains(&Setting::Live(LiveSetting::Peers)));
}

#[test]
fn a_change_to_one_entry_field_is_seen_as_that_key_alone() {
    type Mutation = (&'static str, fn(&mut PepdConfig));
    let mutations: Vec<Mutation> = vec![
        ("peer[].name", |c| entry(c).name.push('x')),
        ("peer[].public_key", |c| entry(c).public_key = None),
        ("peer[].address", |c| entry(c).address = None),
        ("peer[].subnets", |c| {
            entry(c).subnets.pop();
        }),
        ("peer[].tx_rate", |c| entry(c).tx_rate = None),
        ("peer[].rx_rate", |c| entry(c).rx_rate = None),
        ("peer[].min_rate", |c| entry(c).min_rate = None),
        ("peer[].weight", |c| entry(c).weight += 1),
        ("peer[].keepalive", |c| entry(c).keepalive = None),
        ("peer[].max_flows", |c| entry(c).max_flows = None),
        ("tunnel.side", |c| {
            if let Some(t) = &mut c.tunnel {
                t.side = Side::Terminal;
            }
        }),
        ("tunnel.bind", |c| {
            if let Some(t) = &mut c.tunnel {
                t.bind = None;
            }
        }),
    ];
    let base = PepdConfig::parse(HUB_SPOKE).expect("hub-spoke.toml");
    for (name, mutate) in mutations {
        let mut new = base.clone();
        mutate(&mut new);
        assert!(
            new.peer != base.peer || new.tunnel != base.tunnel,
            "{name}: the example must set it"
        );
        assert_eq!(names(&compare(&base, &new), |k| k.changed), [name]);
    }
    // An entry more or less changes every entry key; so does a change of form.
    let mut fewer = base.clone();
    if let Peers::List(entries) = &mut fewer.peer {
        entries.pop();
    }
    let all_entry_keys = names(&compare(&base, &base), |k| k.name.starts_with("peer["));
    assert_eq!(
        names(&compare(&base, &fewer), |k| k.changed),
        all_entry_keys
    );
    assert_eq!(
        names(&compare(&fewer, &base), |k| k.changed),
        [
            "peer[].name",
            "peer[].public_key",
            "peer[].address",
            "peer[].subnets",
            "peer[].tx_rate",
            "peer[].rx_rate",
            "peer[].min_rate",
            "peer[].weight",
            "peer[].keepalive",
            "peer[].max_flows"
        ]
    );
    let pair = every_key();
    assert_eq!(
        names(&compare(&base, &pair), |k| k.name.starts_with("peer")),
        [
            "peer.address",
            "peer.bind",
            "peer.side",
            "peer.return_to_preferred",
            "peer.return_after"
        ]
    );
    assert!(compare(&base, &pair)
        .iter()
        .filter(|k| k.name.starts_with("peer"))
        .all(|k| k.changed));
    assert!(compare(&pair, &base)
        .iter()
        .filter(|k| k.name.starts_with("peer") || k.name.starts_with("tunnel"))
        .all(|k| k.changed));
}

#[test]
fn a_change_to_one_key_is_seen_as_that_key_alone() {
    type Mutation = (&'static str, fn(&mut PepdConfig));
    let mutations: Vec<Mutation> = vec![
        ("log.level", |c| c.log.level.push_str(",pepd=debug")),
        ("intercept.listen", |c| {
            c.intercept.listen.pop();
        }),
        ("intercept.own_mark", |c| c.intercept.own_mark += 1),
        ("rules.interfaces", |c| {
            c.rules.interfaces.push("lan1".into())
        }),
        ("rules.ports", |c| c.rules.ports.push(22)),
        ("rules.bypass_subnets", |c| c.rules.bypass_subnets.clear()),
        ("rules.proxy_subnets", |c| c.rules.proxy_subnets.clear()),
        ("rules.tproxy_mark", |c| c.rules.tproxy_mark += 1),
        ("rules.route_table", |c| c.rules.route_table += 1),
        ("rules.fail", |c| c.rules.fail = FailMode::Closed),
        ("rules.table", |c| c.rules.table.push_str("_b")),
        ("rules.quic", |c| c.rules.quic = QuicPolicy::Reject),
        ("rules.quic_ports", |c| c.rules.quic_ports.push(8443)),
        ("rules.quic_exceptions", |c| {
            c.rules
                .quic_exceptions
                .push("198.18.7.0/24".parse().expect("subnet"))
        }),
        ("peer.address", |c| pair(c).address.set_port(7401)),
        ("peer.bind", |c| pair(c).bind = None),
        ("peer.side", |c| pair(c).side = Side::Hub),
        ("peer.return_to_preferred", |c| {
            pair(c).return_to_preferred = true
        }),
        ("peer.return_after", |c| {
            pair(c).return_after += std::time::Duration::from_secs(60)
        }),
        ("link.tx_rate", |c| {
            c.link.tx_rate = BitRate(c.link.tx_rate.0 + 1)
        }),
        ("link.rx_rate", |c| {
            c.link.rx_rate = BitRate(c.link.rx_rate.0 + 1)
        }),
        ("link.mtu", |c| c.link.mtu -= 1),
        ("link.frame_overhead", |c| c.link.frame_overhead += 1),
        ("transport.cc", |c| c.transport.cc = CcModeName::Vegas),
        ("transport.vegas_alpha", |c| c.transport.vegas_alpha += 0.5),
        ("transport.vegas_beta", |c| c.transport.vegas_beta += 0.5),
        ("transport.vegas_gamma", |c| c.transport.vegas_gamma += 0.5),
        ("transport.loss_default", |c| {
            c.transport.loss_default = LossDefault::Congestion
        }),
        ("transport.ack_every_packets", |c| {
            c.transport.ack_every_packets += 1
        }),
        ("transport.ack_max_delay", |c| {
            c.transport.ack_max_delay += Duration::from_millis(1)
        }),
        ("transport.outage_limit", |c| {
            c.transport.outage_limit += Duration::from_millis(1)
        }),
        ("transport.keepalive", |c| {
            c.transport.keepalive += Duration::from_millis(1)
        }),
        ("transport.pacing_burst", |c| {
            c.transport.pacing_burst += Duration::from_millis(1)
        }),
        ("transport.datagram_size", |c| {
            c.transport.datagram_size = DatagramSizeName::Mtu
        }),
        ("transport.compression", |c| {
            c.transport.compression = CompressionMode::Auto
        }),
        ("transport.compression_ports", |c| {
            c.transport.compression_ports.push(80)
        }),
        ("transport.compression_prefixes", |c| {
            c.transport
                .compression_prefixes
                .push("198.18.0.0/15".parse().expect("prefix"))
        }),
        ("limits.max_flows", |c| c.limits.max_flows += 1),
        ("limits.over_limit", |c| {
            c.limits.over_limit = OverLimit::Bypass
        }),
        ("limits.flow_buffer", |c| c.limits.flow_buffer = None),
        ("limits.memory_budget", |c| {
            c.limits.memory_budget = ByteSize(c.limits.memory_budget.0 + 1)
        }),
        ("limits.stalled_flow_timeout", |c| {
            c.limits.stalled_flow_timeout += Duration::from_secs(1)
        }),
        ("timeouts.connect", |c| {
            c.timeouts.connect += Duration::from_secs(1)
        }),
        ("timeouts.idle", |c| {
            c.timeouts.idle += Duration::from_secs(1)
        }),
        ("upstream.transparent_source", |c| {
            c.upstream.transparent_source = !c.upstream.transparent_source
        }),
        ("metrics.listen", |c| c.metrics.listen.set_port(9465)),
        ("control.socket", |c| {
            c.control.socket = Some("/run/pepd/other.sock".into())
        }),
        ("shutdown.grace", |c| {
            c.shutdown.grace += Duration::from_secs(1)
        }),
        ("security.mode", |c| c.security.mode = SecurityMode::None),
        ("security.private_key_file", |c| {
            c.security.private_key_file = None
        }),
        ("security.peer_public_key", |c| {
            c.security.peer_public_key = None
        }),
        ("security.psk_file", |c| c.security.psk_file = None),
        ("security.rekey_interval", |c| {
            c.security.rekey_interval += Duration::from_secs(1)
        }),
        ("security.rekey_after_packets", |c| {
            c.security.rekey_after_packets += 1
        }),
        ("security.aead", |c| {
            c.security.aead = AeadSetting::Aes256Gcm
        }),
    ];
    let base = every_key();
    let all = compare(&base, &base);
    assert_eq!(
        mutations.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        names(&all, |_| true),
        "one mutation per key"
    );
    for (name, mutate) in mutations {
        let mut new = base.clone();
        mutate(&mut new);
        assert_eq!(names(&compare(&base, &new), |k| k.changed), [name]);
    }
}

#[test]
fn changes_come_grouped_as_applied_and_in_log_order() {
    let base = every_key();
    let mut new = base.clone();
    new.rules.ports.push(22);
    pair(&mut new).side = Side::Hub;
    new.shutdown.grace += Duration::from_secs(1);
    new.transport.ack_max_delay += Duration::from_millis(1);
    new.transport.ack_every_packets += 1;
    new.link.mtu -= 1;
    new.link.rx_rate = BitRate(new.link.rx_rate.0 + 1);
    new.log.level = "debug".into();
    assert_eq!(
        changed_settings(&base, &new)
            .into_iter()
            .collect::<Vec<_>>(),
        [
            Setting::Live(LiveSetting::LogLevel),
            Setting::Live(LiveSetting::AckPolicy),
            Setting::Live(LiveSetting::Shutdown),
            Setting::Restart(RestartSetting::RxRateOrMtu),
            Setting::Restart(RestartSetting::Peer),
            Setting::RulesUnit,
        ]
    );
}

#[test]
fn labels_in_the_reload_log() {
    let c = every_key();
    let settings: BTreeSet<Setting> = compare(&c, &c).iter().map(|k| k.setting).collect();
    let live: Vec<&str> = settings
        .iter()
        .filter_map(|s| match s {
            Setting::Live(l) => Some(l.label()),
            _ => None,
        })
        .collect();
    assert_eq!(
        live,
        [
            "log.level",
            "link.tx_rate",
            "transport.ack_*",
            "limits.max_flows",
            "limits.memory_budget (send side; receive side after a restart)",
            "limits.over_limit",
            "limits.stalled_flow_timeout",
            "timeouts",
            "upstream",
            "shutdown",
        ]
    );
    let restart: Vec<&str> = settings
        .iter()
        .filter_map(|s| match s {
            Setting::Restart(r) => Some(r.label()),
            _ => None,
        })
        .collect();
    assert_eq!(
        restart,
        [
            "link.rx_rate/mtu/frame_overhead",
            "limits.flow_buffer",
            "transport (cc, vegas, loss_default, outage_limit, keepalive, pacing_burst, \
             datagram_size, compression)",
            "peer",
            "intercept",
            "metrics",
            "control",
            "security",
        ]
    );
}
