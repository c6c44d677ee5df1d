//! What a reload changes and how each change takes effect: the half of SIGHUP that needs
//! no running daemon.
//!
//! Every key of the schema is listed once, in [`compare`], with the setting it belongs
//! to. Both configs are destructured there without `..`, so a new config field does not
//! compile until it is given a setting, and the tests check that the keys listed are
//! exactly those of a config that sets every key.

use std::collections::BTreeSet;

use crate::config::{
    AnnounceConfig, ClassEntry, ControlConfig, InterceptConfig, LimitsConfig, LinkConfig,
    LogConfig, MetricsConfig, PairConfig, PeerEntry, Peers, PepdConfig, RulesConfig,
    SecuritySection, ShutdownConfig, TimeoutsConfig, TransportConfig, TunnelConfig, UpstreamConfig,
};

/// Keys a reload applies to the running daemon, grouped as they are applied; in the
/// order the reload applies and logs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LiveSetting {
    LogLevel,
    TxRate,
    /// `transport.ack_every_packets` and `transport.ack_max_delay`, one ACK policy.
    AckPolicy,
    MaxFlows,
    /// The send side at once; the receive window was advertised at the handshake.
    MemoryBudget,
    OverLimit,
    StalledFlowTimeout,
    Timeouts,
    Upstream,
    Shutdown,
    /// `peer[].tx_rate`, `min_rate`, `weight` and `keepalive` of an entry that stays: its
    /// MIR, CIR, share of the carrier and keepalive follow without touching its flows.
    PeerRates,
    /// `peer[].max_flows` of an entry that stays: new flows count against it at once; the
    /// flows open above a lower one stay.
    PeerMaxFlows,
    /// `[[peer]]` entries added, removed or replaced (another key, address, subnets or
    /// `rx_rate`): the peers that stay keep their flows.
    Peers,
}

/// Keys read once at start: they wait for `systemctl restart pepd`. In log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RestartSetting {
    RxRateOrMtu,
    FlowBuffer,
    /// Every `[transport]` key but the ACK policy.
    Transport,
    /// `[peer]`, or a change between `[peer]` and `[[peer]]`: the pair's one peer is set
    /// up once, at start.
    Peer,
    Tunnel,
    Intercept,
    Metrics,
    /// The control socket is bound once, at start.
    Control,
    /// Keys are read once at start; a changed file at the same path needs a restart too,
    /// which no comparison of configs can see.
    Security,
    /// `[[class]]`: every association's class table is set when it is made.
    Classes,
    /// `[announce]`: the tables are emptied and taken at start.
    Announce,
}

/// How a changed key takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    Live(LiveSetting),
    Restart(RestartSetting),
    /// `[rules]` is not the daemon's: it feeds `pepd nft-rules`, which pepd-rules.service
    /// applies (`systemctl reload pepd-rules`). The daemon reads it only for the start-up
    /// self-check, so neither a reload nor a restart of pepd changes what is intercepted.
    RulesUnit,
}

impl LiveSetting {
    /// How the reload log names it.
    pub fn label(self) -> &'static str {
        match self {
            LiveSetting::LogLevel => "log.level",
            LiveSetting::TxRate => "link.tx_rate",
            LiveSetting::AckPolicy => "transport.ack_*",
            LiveSetting::MaxFlows => "limits.max_flows",
            LiveSetting::MemoryBudget => {
                "limits.memory_budget (send side; receive side after a restart)"
            }
            LiveSetting::OverLimit => "limits.over_limit",
            LiveSetting::StalledFlowTimeout => "limits.stalled_flow_timeout",
            LiveSetting::Timeouts => "timeouts",
            LiveSetting::Upstream => "upstream",
            LiveSetting::Shutdown => "shutdown",
            LiveSetting::PeerRates => "peer[].tx_rate/min_rate/weight/keepalive",
            LiveSetting::PeerMaxFlows => "peer[].max_flows",
            LiveSetting::Peers => "peer[] entries added/removed/replaced",
        }
    }
}

impl RestartSetting {
    /// How the reload log names it.
    pub fn label(self) -> &'static str {
        match self {
            RestartSetting::RxRateOrMtu => "link.rx_rate/mtu/frame_overhead",
            RestartSetting::FlowBuffer => "limits.flow_buffer",
            RestartSetting::Transport => {
                "transport (cc, vegas, loss_default, outage_limit, keepalive, pacing_burst, \
                 datagram_size, compression)"
            }
            RestartSetting::Peer => "peer",
            RestartSetting::Tunnel => "tunnel",
            RestartSetting::Intercept => "intercept",
            RestartSetting::Metrics => "metrics",
            RestartSetting::Control => "control",
            RestartSetting::Security => "security",
            RestartSetting::Classes => "class",
            RestartSetting::Announce => "announce",
        }
    }
}

/// One key of the schema, compared between the running config and a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Dotted, as written in the file: `transport.ack_max_delay`.
    pub name: &'static str,
    pub setting: Setting,
    pub changed: bool,
}

/// The settings with at least one changed key, live ones first, each group in log order.
pub fn changed_settings(running: &PepdConfig, new: &PepdConfig) -> BTreeSet<Setting> {
    compare(running, new)
        .into_iter()
        .filter(|k| k.changed)
        .map(|k| k.setting)
        .collect()
}

/// Every key of the schema with its setting and whether `new` changes it.
pub fn compare(running: &PepdConfig, new: &PepdConfig) -> Vec<Key> {
    use LiveSetting as L;
    use RestartSetting as R;
    use Setting::{Live, Restart, RulesUnit};

    let PepdConfig {
        log: LogConfig { level },
        intercept: InterceptConfig { listen, own_mark },
        rules:
            RulesConfig {
                interfaces,
                ports,
                bypass_subnets,
                proxy_subnets,
                tproxy_mark,
                route_table,
                fail,
                table,
                quic,
                quic_ports,
                quic_exceptions,
            },
        peer,
        tunnel,
        link:
            LinkConfig {
                tx_rate,
                rx_rate,
                mtu,
                frame_overhead,
            },
        transport:
            TransportConfig {
                cc,
                vegas_alpha,
                vegas_beta,
                vegas_gamma,
                loss_default,
                ack_every_packets,
                ack_max_delay,
                outage_limit,
                keepalive,
                pacing_burst,
                datagram_size,
                compression,
                compression_ports,
                compression_prefixes,
            },
        limits:
            LimitsConfig {
                max_flows,
                over_limit,
                flow_buffer,
                memory_budget,
                stalled_flow_timeout,
            },
        timeouts: TimeoutsConfig { connect, idle },
        upstream: UpstreamConfig { transparent_source },
        metrics: MetricsConfig {
            listen: metrics_listen,
        },
        control: ControlConfig {
            socket: control_socket,
        },
        shutdown: ShutdownConfig { grace },
        security:
            SecuritySection {
                mode,
                private_key_file,
                peer_public_key,
                psk_file,
                rekey_interval,
                rekey_after_packets,
                aead,
            },
        class,
        announce,
        // Where keys were written, not a setting.
        source_map: _,
    } = new;
    let r = running;
    let mut keys = vec![
        key("log.level", Live(L::LogLevel), *level != r.log.level),
        key(
            "intercept.listen",
            Restart(R::Intercept),
            *listen != r.intercept.listen,
        ),
        key(
            "intercept.own_mark",
            Restart(R::Intercept),
            *own_mark != r.intercept.own_mark,
        ),
        key(
            "rules.interfaces",
            RulesUnit,
            *interfaces != r.rules.interfaces,
        ),
        key("rules.ports", RulesUnit, *ports != r.rules.ports),
        key(
            "rules.bypass_subnets",
            RulesUnit,
            *bypass_subnets != r.rules.bypass_subnets,
        ),
        key(
            "rules.proxy_subnets",
            RulesUnit,
            *proxy_subnets != r.rules.proxy_subnets,
        ),
        key(
            "rules.tproxy_mark",
            RulesUnit,
            *tproxy_mark != r.rules.tproxy_mark,
        ),
        key(
            "rules.route_table",
            RulesUnit,
            *route_table != r.rules.route_table,
        ),
        key("rules.fail", RulesUnit, *fail != r.rules.fail),
        key("rules.table", RulesUnit, *table != r.rules.table),
        key("rules.quic", RulesUnit, *quic != r.rules.quic),
        key(
            "rules.quic_ports",
            RulesUnit,
            *quic_ports != r.rules.quic_ports,
        ),
        key(
            "rules.quic_exceptions",
            RulesUnit,
            *quic_exceptions != r.rules.quic_exceptions,
        ),
    ];
    keys.extend(peer_keys(peer, &r.peer));
    keys.extend(tunnel_keys(tunnel.as_ref(), r.tunnel.as_ref()));
    keys.extend([
        key("link.tx_rate", Live(L::TxRate), *tx_rate != r.link.tx_rate),
        key(
            "link.rx_rate",
            Restart(R::RxRateOrMtu),
            *rx_rate != r.link.rx_rate,
        ),
        key("link.mtu", Restart(R::RxRateOrMtu), *mtu != r.link.mtu),
        key(
            "link.frame_overhead",
            Restart(R::RxRateOrMtu),
            *frame_overhead != r.link.frame_overhead,
        ),
        key("transport.cc", Restart(R::Transport), *cc != r.transport.cc),
        key(
            "transport.vegas_alpha",
            Restart(R::Transport),
            *vegas_alpha != r.transport.vegas_alpha,
        ),
        key(
            "transport.vegas_beta",
            Restart(R::Transport),
            *vegas_beta != r.transport.vegas_beta,
        ),
        key(
            "transport.vegas_gamma",
            Restart(R::Transport),
            *vegas_gamma != r.transport.vegas_gamma,
        ),
        key(
            "transport.loss_default",
            Restart(R::Transport),
            *loss_default != r.transport.loss_default,
        ),
        key(
            "transport.ack_every_packets",
            Live(L::AckPolicy),
            *ack_every_packets != r.transport.ack_every_packets,
        ),
        key(
            "transport.ack_max_delay",
            Live(L::AckPolicy),
            *ack_max_delay != r.transport.ack_max_delay,
        ),
        key(
            "transport.outage_limit",
            Restart(R::Transport),
            *outage_limit != r.transport.outage_limit,
        ),
        key(
            "transport.keepalive",
            Restart(R::Transport),
            *keepalive != r.transport.keepalive,
        ),
        key(
            "transport.pacing_burst",
            Restart(R::Transport),
            *pacing_burst != r.transport.pacing_burst,
        ),
        key(
            "transport.datagram_size",
            Restart(R::Transport),
            *datagram_size != r.transport.datagram_size,
        ),
        key(
            "transport.compression",
            Restart(R::Transport),
            *compression != r.transport.compression,
        ),
        key(
            "transport.compression_ports",
            Restart(R::Transport),
            *compression_ports != r.transport.compression_ports,
        ),
        key(
            "transport.compression_prefixes",
            Restart(R::Transport),
            *compression_prefixes != r.transport.compression_prefixes,
        ),
        key(
            "limits.max_flows",
            Live(L::MaxFlows),
            *max_flows != r.limits.max_flows,
        ),
        key(
            "limits.over_limit",
            Live(L::OverLimit),
            *over_limit != r.limits.over_limit,
        ),
        key(
            "limits.flow_buffer",
            Restart(R::FlowBuffer),
            *flow_buffer != r.limits.flow_buffer,
        ),
        key(
            "limits.memory_budget",
            Live(L::MemoryBudget),
            *memory_budget != r.limits.memory_budget,
        ),
        key(
            "limits.stalled_flow_timeout",
            Live(L::StalledFlowTimeout),
            *stalled_flow_timeout != r.limits.stalled_flow_timeout,
        ),
        key(
            "timeouts.connect",
            Live(L::Timeouts),
            *connect != r.timeouts.connect,
        ),
        key("timeouts.idle", Live(L::Timeouts), *idle != r.timeouts.idle),
        key(
            "upstream.transparent_source",
            Live(L::Upstream),
            *transparent_source != r.upstream.transparent_source,
        ),
        key(
            "metrics.listen",
            Restart(R::Metrics),
            *metrics_listen != r.metrics.listen,
        ),
        key(
            "control.socket",
            Restart(R::Control),
            *control_socket != r.control.socket,
        ),
        key(
            "shutdown.grace",
            Live(L::Shutdown),
            *grace != r.shutdown.grace,
        ),
        key(
            "security.mode",
            Restart(R::Security),
            *mode != r.security.mode,
        ),
        key(
            "security.private_key_file",
            Restart(R::Security),
            *private_key_file != r.security.private_key_file,
        ),
        key(
            "security.peer_public_key",
            Restart(R::Security),
            *peer_public_key != r.security.peer_public_key,
        ),
        key(
            "security.psk_file",
            Restart(R::Security),
            *psk_file != r.security.psk_file,
        ),
        key(
            "security.rekey_interval",
            Restart(R::Security),
            *rekey_interval != r.security.rekey_interval,
        ),
        key(
            "security.rekey_after_packets",
            Restart(R::Security),
            *rekey_after_packets != r.security.rekey_after_packets,
        ),
        key(
            "security.aead",
            Restart(R::Security),
            *aead != r.security.aead,
        ),
    ]);
    keys.extend(class_keys(class, &r.class));
    keys.extend(announce_keys(announce.as_ref(), r.announce.as_ref()));
    keys
}

/// The `[[class]]` fields, when either config has entries: `class[].weight` is changed when
/// any entry's weight is, or an entry came or went. Every association's class table is made
/// with them, so all wait for a restart.
fn class_keys(new: &[ClassEntry], running: &[ClassEntry]) -> Vec<Key> {
    if new.is_empty() && running.is_empty() {
        return Vec::new();
    }
    let new: Vec<_> = new.iter().map(class_fields).collect();
    let running: Vec<_> = running.iter().map(class_fields).collect();
    let names = class_fields(&ClassEntry::default()).map(|(name, _)| name);
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let changed = new.len() != running.len()
                || new.iter().zip(&running).any(|(a, b)| a[i].1 != b[i].1);
            key(name, Setting::Restart(RestartSetting::Classes), changed)
        })
        .collect()
}

/// Each field of an entry, by key, as text to compare. Taken apart without `..`: a field
/// the schema gains does not compile here until it is listed.
fn class_fields(c: &ClassEntry) -> [(&'static str, String); 7] {
    let ClassEntry {
        name,
        dscp,
        ports,
        subnets,
        weight,
        priority,
        max_rate,
    } = c;
    [
        ("class[].name", name.clone()),
        ("class[].dscp", format!("{dscp:?}")),
        ("class[].ports", format!("{ports:?}")),
        ("class[].subnets", format!("{subnets:?}")),
        ("class[].weight", weight.to_string()),
        ("class[].priority", priority.to_string()),
        ("class[].max_rate", format!("{max_rate:?}")),
    ]
}

fn key(name: &'static str, setting: Setting, changed: bool) -> Key {
    Key {
        name,
        setting,
        changed,
    }
}

/// The `[peer]` table's keys, or the `[[peer]]` fields: `peer[].name` is changed when any
/// entry's name is, or an entry came or went. Compared with the running config's form;
/// a change of form changes every key, and waits for a restart.
fn peer_keys(new: &Peers, running: &Peers) -> Vec<Key> {
    let peer = Setting::Restart(RestartSetting::Peer);
    match new {
        Peers::Pair(PairConfig {
            address,
            bind,
            side,
            return_to_preferred,
            return_after,
        }) => {
            let r = match running {
                Peers::Pair(r) => Some(r),
                Peers::List(_) => None,
            };
            vec![
                key(
                    "peer.address",
                    peer,
                    r.is_none_or(|r| *address != r.address),
                ),
                key("peer.bind", peer, r.is_none_or(|r| *bind != r.bind)),
                key("peer.side", peer, r.is_none_or(|r| *side != r.side)),
                key(
                    "peer.return_to_preferred",
                    peer,
                    r.is_none_or(|r| *return_to_preferred != r.return_to_preferred),
                ),
                key(
                    "peer.return_after",
                    peer,
                    r.is_none_or(|r| *return_after != r.return_after),
                ),
            ]
        }
        Peers::List(entries) => {
            let (old, same_form): (&[PeerEntry], bool) = match running {
                Peers::List(r) => (r, true),
                Peers::Pair(_) => (&[], false),
            };
            let setting = |name| match same_form {
                true => entry_setting(name),
                false => peer,
            };
            let removed = old.len() > entries.len();
            let mut keys: Vec<Key> = Vec::new();
            for (i, entry) in entries.iter().enumerate() {
                let changes = entry_changes(entry, old.get(i));
                if keys.is_empty() {
                    keys = changes
                        .iter()
                        .map(|&(name, changed)| key(name, setting(name), changed || removed))
                        .collect();
                } else {
                    for (k, (_, changed)) in keys.iter_mut().zip(changes) {
                        k.changed |= changed;
                    }
                }
            }
            keys
        }
    }
}

/// How a changed `[[peer]]` field takes effect: the rates on the running association; any
/// other field makes the entry another peer, which replaces the running one (its flows
/// reset) while the other peers carry on.
fn entry_setting(name: &str) -> Setting {
    match name {
        "peer[].tx_rate" | "peer[].min_rate" | "peer[].weight" | "peer[].keepalive" => {
            Setting::Live(LiveSetting::PeerRates)
        }
        "peer[].max_flows" => Setting::Live(LiveSetting::PeerMaxFlows),
        _ => Setting::Live(LiveSetting::Peers),
    }
}

/// Each field of a `[[peer]]` entry and whether it differs from the running entry at the
/// same place (every field, for an entry that is new there).
fn entry_changes(new: &PeerEntry, old: Option<&PeerEntry>) -> [(&'static str, bool); 10] {
    let PeerEntry {
        name,
        public_key,
        address,
        subnets,
        tx_rate,
        rx_rate,
        min_rate,
        weight,
        keepalive,
        max_flows,
    } = new;
    [
        ("peer[].name", old.is_none_or(|o| *name != o.name)),
        (
            "peer[].public_key",
            old.is_none_or(|o| *public_key != o.public_key),
        ),
        ("peer[].address", old.is_none_or(|o| *address != o.address)),
        ("peer[].subnets", old.is_none_or(|o| *subnets != o.subnets)),
        ("peer[].tx_rate", old.is_none_or(|o| *tx_rate != o.tx_rate)),
        ("peer[].rx_rate", old.is_none_or(|o| *rx_rate != o.rx_rate)),
        (
            "peer[].min_rate",
            old.is_none_or(|o| *min_rate != o.min_rate),
        ),
        ("peer[].weight", old.is_none_or(|o| *weight != o.weight)),
        (
            "peer[].keepalive",
            old.is_none_or(|o| *keepalive != o.keepalive),
        ),
        (
            "peer[].max_flows",
            old.is_none_or(|o| *max_flows != o.max_flows),
        ),
    ]
}

/// `[tunnel]`'s keys, when the new config has the section.
fn tunnel_keys(new: Option<&TunnelConfig>, running: Option<&TunnelConfig>) -> Vec<Key> {
    let tunnel = Setting::Restart(RestartSetting::Tunnel);
    let Some(TunnelConfig {
        side,
        bind,
        workers,
        hints,
        redundant,
    }) = new
    else {
        return Vec::new();
    };
    vec![
        key(
            "tunnel.side",
            tunnel,
            running.is_none_or(|r| *side != r.side),
        ),
        key(
            "tunnel.bind",
            tunnel,
            running.is_none_or(|r| *bind != r.bind),
        ),
        key(
            "tunnel.workers",
            tunnel,
            running.is_none_or(|r| *workers != r.workers),
        ),
        key(
            "tunnel.hints",
            tunnel,
            running.is_none_or(|r| *hints != r.hints),
        ),
        key(
            "tunnel.redundant",
            tunnel,
            running.is_none_or(|r| *redundant != r.redundant),
        ),
    ]
}

/// `[announce]`'s keys, when either config has the section: adding, changing or removing
/// it waits for a restart, which empties the old tables and takes the new ones.
fn announce_keys(new: Option<&AnnounceConfig>, running: Option<&AnnounceConfig>) -> Vec<Key> {
    if new.is_none() && running.is_none() {
        return Vec::new();
    }
    let announce = Setting::Restart(RestartSetting::Announce);
    let table = |a: Option<&AnnounceConfig>| a.map(|a| a.table);
    let outage = |a: Option<&AnnounceConfig>| a.map(AnnounceConfig::outage_table);
    vec![
        key("announce.table", announce, table(new) != table(running)),
        key(
            "announce.outage_table",
            announce,
            outage(new) != outage(running),
        ),
    ]
}

#[cfg(test)]
mod tests;
