use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pep_transport::{LossCounts, Stats};
use prometheus_parse::{Scrape, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::http::{serve_with, Limits};
use super::*;
use crate::tunnel::peer::AssociationState;

/// Every field distinct, so a value read from the wrong field cannot pass by accident.
fn sample() -> Snapshot {
    Snapshot {
        stats: Stats {
            rtt_min: Duration::from_millis(550),
            rtt_smoothed: Duration::from_micros(612_500),
            pacing_rate_bps: 20_000_000,
            cwnd_bytes: 1_500_000,
            bytes_in_flight: 750_001,
            capacity: pep_transport::cc::CapacityStats {
                estimate_bps: 16_000_008,
                queue_delay: Duration::from_micros(12_500),
                limited_by_estimate: Duration::from_millis(153_250),
                limited_by_ceiling: Duration::from_millis(154_500),
                drains: 155,
                probes: 156,
                rebases: 157,
                competes: 160,
                jitter: Duration::from_micros(16_500),
                needless_drains: 166,
            },
            datagram_size: 158,
            datagram_size_changes: 159,
            corruption_by_size: vec![
                pep_transport::datagram_size::ClassLoss {
                    from_bytes: 256,
                    resolved: 100.0,
                    loss: 0.25,
                },
                pep_transport::datagram_size::ClassLoss {
                    from_bytes: 320,
                    resolved: 300.0,
                    loss: 0.5,
                },
                pep_transport::datagram_size::ClassLoss {
                    from_bytes: 1472,
                    resolved: 10.0,
                    loss: 0.75,
                },
            ],
            packets_sent: 101,
            wire_bytes_sent: 123_456_789_012_345,
            packets_received: 102,
            wire_bytes_received: 103,
            stream_bytes_sent: 104,
            stream_bytes_acked: 105,
            stream_bytes_retransmitted: 106,
            stream_bytes_redundant: 107,
            lost: LossCounts {
                congestion: 108,
                corruption: 109,
                outage: 110,
            },
            spurious_losses: 167,
            reorder_window: Duration::from_micros(16_800),
            congestion_events: 111,
            acks_sent: 112,
            acks_received: 113,
            snacks_sent: 114,
            snacks_received: 115,
            probes_sent: 116,
            outages: 117,
            flows_open: 118,
            flows_waiting_for_quota: 164,
            flows_opened_total: 119,
            // Only in the per-peer series, where it names whose `max_flows` was full.
            flows_over_limit: 0,
            flows_reset: 120,
            peer_restarts: 121,
            associations_taken_over: 302,
            malformed_dropped: 122,
            unassociated_dropped: 123,
            duplicates_dropped: 124,
            protocol_violations: 125,
            security: pep_transport::SecurityCounts {
                unauthenticated: 143,
                replayed: 144,
                wrong_mode: 145,
                handshake_invalid: 146,
                handshake_unknown_peer: 147,
                handshake_rate_limited: 148,
                handshake_replayed: 149,
                nonce_refused: 150,
                handshake_bad_mac: 161,
                cookie_invalid: 162,
                aead_mismatch: 164,
                handshake_collision: 301,
            },
            hints: pep_transport::security::HintCounts {
                acted: 303,
                rate_limited: 304,
                unmatched: 305,
                elsewhere: 306,
                ignored: 307,
            },
            handshakes_completed: 151,
            rekeys: 152,
            // Reported per peer only.
            remote_moves: 161,
            handovers: 310,
            handover_trials: pep_transport::TrialCounts {
                moved: 311,
                stayed: 312,
                unanswered: 313,
            },
            // Counted from the peers, whatever the sum holds.
            aead: Some(pep_transport::security::PacketProtection::ChaCha20Poly1305),
            // The third class ("bulk") has no association figures: it reports zeros.
            traffic_classes: vec![
                pep_transport::TrafficClassStats {
                    bytes_sent: 401,
                    bytes_retransmitted: 402,
                    queue_delay_byte_seconds: 403.5,
                    flows_open: 404,
                    flows_total: 405,
                },
                pep_transport::TrafficClassStats {
                    bytes_sent: 411,
                    bytes_retransmitted: 412,
                    queue_delay_byte_seconds: 0.25,
                    flows_open: 414,
                    flows_total: 415,
                },
            ],
        },
        associations: vec![AssociationState::Outage],
        association_restarts: 126,
        relay: RelaySnapshot {
            flows_active: 127,
            flows_open: 190,
            flows_intercepted_total: 128,
            flows_from_peer_total: 129,
            flows_refused_total: 130,
            flows_bypassed_total: 131,
            flows_unrouted_total: 153,
            flows_isolated_total: 154,
            bytes_to_peer_total: 132,
            bytes_from_peer_total: 133,
            connect_errors: vec![("refused", 134), ("unreachable", 135), ("timeout", 0)],
            intercept_errors: vec![("accept", 136), ("inspect", 137)],
            flow_resets: vec![("aborted", 138), ("peer_restart", 139), ("handover", 314)],
            flows_reset_stalled_total: 191,
            compression: CompressionSnapshot {
                plain_sent: 201,
                blocks_sent: 202,
                blocks_received: 203,
                plain_received: 204,
                blocks_by_level: vec![("raw", 205), ("fast", 206), ("hard", 207)],
                over_budget: 208,
                compress_ns: 2_500_000_000,
                decompress_ns: 125_000_000,
                refused: vec![("over_ratio", 209), ("corrupt", 210)],
            },
        },
        memory_in_use_bytes: 140,
        memory_accounted_bytes: 160,
        memory_budget_bytes: 141,
        tunnel_foreign_datagrams: 142,
        cookies_sent: 163,
        hints_sent: 308,
        hints_rate_limited: 309,
        workers: vec![
            WorkerSnapshot {
                associations: 192,
                datagrams: 193,
                handed_off: 194,
                inbox_dropped: 198,
            },
            WorkerSnapshot {
                associations: 195,
                datagrams: 196,
                handed_off: 197,
                inbox_dropped: 199,
            },
        ],
        build_info: ("0.1.0", 1),
        traffic_classes: vec!["default".into(), "video".into(), "bulk".into()],
        announce: Some(AnnounceSnapshot {
            serving: 310,
            outage: 311,
            errors: 312,
        }),
        peers: vec![
            PeerSnapshot {
                name: "ship-7".into(),
                state: AssociationState::Established,
                endpoint: Some("198.19.0.7:40123".parse().expect("address")),
                hub_rank: Some(2),
                stats: Stats {
                    wire_bytes_sent: 201,
                    wire_bytes_received: 202,
                    flows_opened_total: 203,
                    flows_over_limit: 215,
                    lost: LossCounts {
                        congestion: 204,
                        corruption: 205,
                        outage: 206,
                    },
                    malformed_dropped: 207,
                    remote_moves: 208,
                    aead: Some(pep_transport::security::PacketProtection::Aes256Gcm),
                    security: pep_transport::SecurityCounts {
                        unauthenticated: 209,
                        ..Default::default()
                    },
                    ..Stats::default()
                },
                flows_active: 210,
                bytes_to_peer_total: 211,
                bytes_from_peer_total: 212,
                flow_resets: vec![("aborted", 213), ("refused", 214), ("aborted", 1)],
                flows_over_budget: 216,
                flows_over_gateway: 217,
                flows_reset_stalled: 218,
            },
            // Not associated yet: no endpoint series, zeros elsewhere.
            PeerSnapshot {
                name: "rig-3".into(),
                ..PeerSnapshot::default()
            },
        ],
    }
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("scrape parses")
}

/// The one sample named `name` whose labels are exactly `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let hits: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && *s.labels == want)
        .collect();
    assert_eq!(hits.len(), 1, "{name}{labels:?}: {hits:?}");
    // The parser only types a sample whose name equals its family's; OpenMetrics counter
    // samples carry `_total` on top, so they come back untyped. Types are checked apart.
    match hits[0].value {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => x,
        ref other => panic!("{name}: unexpected {other:?}"),
    }
}

/// Family name -> type, from the `# TYPE` lines.
fn types(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, ty) = l.split_once(' ').expect("TYPE line has a type");
            (name.to_owned(), ty.to_owned())
        })
        .collect()
}

/// (sample name, its labels, its value).
type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], u64);

#[test]
fn encode_reports_every_value_exactly() {
    let text = encode(&sample()).expect("encodes");
    let s = parse(&text);
    let v = |name: &str, labels: &[(&str, &str)]| value(&s, name, labels);

    // Counters.
    let counters: &[Expected] = &[
        ("pepd_association_restarts_total", &[], 126),
        ("pepd_peer_restarts_total", &[], 121),
        ("pepd_outages_total", &[], 117),
        ("pepd_congestion_events_total", &[], 111),
        ("pepd_packets_lost_total", &[("cause", "congestion")], 108),
        ("pepd_packets_lost_total", &[("cause", "corruption")], 109),
        ("pepd_packets_lost_total", &[("cause", "outage")], 110),
        ("pepd_wire_bytes_total", &[("direction", "received")], 103),
        ("pepd_wire_packets_total", &[("direction", "sent")], 101),
        ("pepd_wire_packets_total", &[("direction", "received")], 102),
        ("pepd_acks_total", &[("direction", "sent")], 112),
        ("pepd_acks_total", &[("direction", "received")], 113),
        ("pepd_snacks_total", &[("direction", "sent")], 114),
        ("pepd_snacks_total", &[("direction", "received")], 115),
        ("pepd_probes_sent_total", &[], 116),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "malformed")],
            122,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "unassociated")],
            123,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "duplicate")],
            124,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "foreign")],
            142,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "unauthenticated")],
            143,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "replayed")],
            144,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "wrong_mode")],
            145,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_invalid")],
            146,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_unknown_peer")],
            147,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_rate_limited")],
            148,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_replayed")],
            149,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_bad_mac")],
            161,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "cookie_invalid")],
            162,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "aead_mismatch")],
            164,
        ),
        (
            "pepd_datagrams_dropped_total",
            &[("reason", "handshake_collision")],
            301,
        ),
        ("pepd_handshakes_total", &[], 151),
        ("pepd_rekeys_total", &[], 152),
        ("pepd_nonce_refusals_total", &[], 150),
        ("pepd_cookies_sent_total", &[], 163),
        ("pepd_associations_taken_over_total", &[], 302),
        ("pepd_hints_sent_total", &[], 308),
        ("pepd_hints_rate_limited_total", &[], 309),
        ("pepd_hints_received_total", &[("result", "acted")], 303),
        (
            "pepd_hints_received_total",
            &[("result", "rate_limited")],
            304,
        ),
        ("pepd_hints_received_total", &[("result", "unmatched")], 305),
        ("pepd_hints_received_total", &[("result", "elsewhere")], 306),
        ("pepd_hints_received_total", &[("result", "ignored")], 307),
        ("pepd_handovers_total", &[], 310),
        ("pepd_handover_trials_total", &[("result", "moved")], 311),
        ("pepd_handover_trials_total", &[("result", "stayed")], 312),
        (
            "pepd_handover_trials_total",
            &[("result", "unanswered")],
            313,
        ),
        ("pepd_worker_datagrams_total", &[("worker", "0")], 193),
        ("pepd_worker_datagrams_total", &[("worker", "1")], 196),
        ("pepd_worker_handoffs_total", &[("worker", "0")], 194),
        ("pepd_worker_handoffs_total", &[("worker", "1")], 197),
        ("pepd_worker_inbox_drops_total", &[("worker", "0")], 198),
        ("pepd_worker_inbox_drops_total", &[("worker", "1")], 199),
        ("pepd_protocol_violations_total", &[], 125),
        ("pepd_stream_sent_bytes_total", &[], 104),
        ("pepd_stream_acked_bytes_total", &[], 105),
        ("pepd_stream_retransmitted_bytes_total", &[], 106),
        ("pepd_stream_redundant_bytes_total", &[], 107),
        ("pepd_flows_total", &[("origin", "intercepted")], 128),
        ("pepd_flows_total", &[("origin", "peer")], 129),
        ("pepd_flows_refused_total", &[], 130),
        ("pepd_flows_bypassed_total", &[], 131),
        ("pepd_flows_unrouted_total", &[], 153),
        ("pepd_flows_isolated_total", &[], 154),
        ("pepd_relay_bytes_total", &[("direction", "to_peer")], 132),
        ("pepd_relay_bytes_total", &[("direction", "from_peer")], 133),
        ("pepd_connect_errors_total", &[("reason", "refused")], 134),
        (
            "pepd_connect_errors_total",
            &[("reason", "unreachable")],
            135,
        ),
        ("pepd_connect_errors_total", &[("reason", "timeout")], 0),
        ("pepd_intercept_errors_total", &[("reason", "accept")], 136),
        ("pepd_intercept_errors_total", &[("reason", "inspect")], 137),
        ("pepd_flow_resets_total", &[("reason", "aborted")], 138),
        ("pepd_flow_resets_total", &[("reason", "peer_restart")], 139),
        ("pepd_flow_resets_total", &[("reason", "handover")], 314),
        ("pepd_flows_reset_stalled_total", &[], 191),
        (
            "pepd_compression_plain_bytes_total",
            &[("direction", "to_peer")],
            201,
        ),
        (
            "pepd_compression_block_bytes_total",
            &[("direction", "to_peer")],
            202,
        ),
        (
            "pepd_compression_block_bytes_total",
            &[("direction", "from_peer")],
            203,
        ),
        (
            "pepd_compression_plain_bytes_total",
            &[("direction", "from_peer")],
            204,
        ),
        (
            "pepd_compression_blocks_sent_total",
            &[("level", "raw")],
            205,
        ),
        (
            "pepd_compression_blocks_sent_total",
            &[("level", "fast")],
            206,
        ),
        (
            "pepd_compression_blocks_sent_total",
            &[("level", "hard")],
            207,
        ),
        ("pepd_compression_over_budget_total", &[], 208),
        (
            "pepd_compression_refused_total",
            &[("reason", "over_ratio")],
            209,
        ),
        (
            "pepd_compression_refused_total",
            &[("reason", "corrupt")],
            210,
        ),
        ("pepd_association_flows_opened_total", &[], 119),
        ("pepd_association_flows_reset_total", &[], 120),
    ];
    for &(name, labels, want) in counters {
        assert_eq!(v(name, labels), want as f64, "{name}{labels:?}");
    }
    for (kind, want) in [
        ("drain", 155.0),
        ("probe", 156.0),
        ("rebase", 157.0),
        ("compete", 160.0),
    ] {
        assert_eq!(v("pepd_capacity_events_total", &[("kind", kind)]), want);
    }
    assert_eq!(
        v("pepd_send_limited_seconds_total", &[("by", "estimate")]),
        153.25
    );
    assert_eq!(
        v("pepd_send_limited_seconds_total", &[("by", "ceiling")]),
        154.5
    );
    // Past f64's exact range the text must still carry the integer as it is.
    assert!(
        text.contains("pepd_wire_bytes_total{direction=\"sent\"} 123456789012345\n"),
        "{text}"
    );

    // Gauges.
    assert_eq!(
        v(
            "pepd_compression_cpu_seconds_total",
            &[("work", "compress")]
        ),
        2.5
    );
    assert_eq!(
        v(
            "pepd_compression_cpu_seconds_total",
            &[("work", "decompress")]
        ),
        0.125
    );
    assert_eq!(v("pepd_rtt_seconds", &[("kind", "min")]), 0.55);
    assert_eq!(v("pepd_rtt_seconds", &[("kind", "smoothed")]), 0.6125);
    assert_eq!(v("pepd_pacing_rate_bytes_per_second", &[]), 2_500_000.0);
    assert_eq!(
        v("pepd_capacity_estimate_bytes_per_second", &[]),
        2_000_001.0
    );
    assert_eq!(v("pepd_queue_delay_seconds", &[]), 0.0125);
    assert_eq!(v("pepd_path_jitter_seconds", &[]), 0.0165);
    assert_eq!(v("pepd_needless_drains_total", &[]), 166.0);
    assert_eq!(v("pepd_spurious_losses_total", &[]), 167.0);
    assert_eq!(v("pepd_reorder_window_seconds", &[]), 0.0168);
    assert_eq!(v("pepd_datagram_size_bytes", &[]), 158.0);
    assert_eq!(v("pepd_datagram_size_changes_total", &[]), 159.0);
    // 256–511: (100 × 0.25 + 300 × 0.5) / 400.
    assert_eq!(
        v("pepd_corruption_loss_ratio", &[("size", "256-511")]),
        0.4375
    );
    assert_eq!(
        v("pepd_corruption_loss_ratio", &[("size", "1280-1535")]),
        0.75
    );
    assert_eq!(v("pepd_cwnd_bytes", &[]), 1_500_000.0);
    assert_eq!(v("pepd_in_flight_bytes", &[]), 750_001.0);
    assert_eq!(v("pepd_flows_active", &[]), 127.0);
    assert_eq!(v("pepd_flows_open", &[]), 190.0);
    assert_eq!(v("pepd_association_flows_open", &[]), 118.0);
    assert_eq!(v("pepd_memory_in_use_bytes", &[]), 140.0);
    assert_eq!(v("pepd_memory_accounted_bytes", &[]), 160.0);
    assert_eq!(v("pepd_memory_budget_bytes", &[]), 141.0);
    assert_eq!(v("pepd_flows_at_share", &[]), 164.0);
    for (class, sent, again, delay, open, total) in [
        ("default", 401.0, 402.0, 403.5, 404.0, 405.0),
        ("video", 411.0, 412.0, 0.25, 414.0, 415.0),
        ("bulk", 0.0, 0.0, 0.0, 0.0, 0.0),
    ] {
        let c = [("class", class)];
        assert_eq!(v("pepd_class_sent_bytes_total", &c), sent);
        assert_eq!(v("pepd_class_retransmitted_bytes_total", &c), again);
        assert_eq!(v("pepd_class_queue_delay_byte_seconds_total", &c), delay);
        assert_eq!(v("pepd_class_flows", &c), open);
        assert_eq!(v("pepd_class_flows_opened_total", &c), total);
    }
    assert_eq!(v("pepd_worker_associations", &[("worker", "0")]), 192.0);
    assert_eq!(v("pepd_worker_associations", &[("worker", "1")]), 195.0);
    for (state, want) in [
        ("connecting", 0.0),
        ("established", 0.0),
        ("outage", 1.0),
        ("closed", 0.0),
    ] {
        assert_eq!(v("pepd_association_state", &[("state", state)]), want);
    }
    // Counted from the peers: ship-7 uses AES-256-GCM, rig-3 has no keys yet.
    for (aead, want) in [("chacha20-poly1305", 0.0), ("aes-256-gcm", 1.0)] {
        assert_eq!(v("pepd_association_aead", &[("aead", aead)]), want);
    }
    assert_eq!(
        v(
            "pepd_build_info",
            &[("version", "0.1.0"), ("protocol_version", "1")]
        ),
        1.0
    );
}

#[test]
fn names_follow_the_conventions() {
    let text = encode(&sample()).expect("encodes");
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics needs the EOF marker"
    );
    let types = types(&text);
    let s = parse(&text);

    let expect = [
        ("pepd_association_state", "gauge"),
        ("pepd_rtt_seconds", "gauge"),
        ("pepd_pacing_rate_bytes_per_second", "gauge"),
        ("pepd_capacity_estimate_bytes_per_second", "gauge"),
        ("pepd_queue_delay_seconds", "gauge"),
        ("pepd_send_limited_seconds", "counter"),
        ("pepd_capacity_events", "counter"),
        ("pepd_needless_drains", "counter"),
        ("pepd_path_jitter_seconds", "gauge"),
        ("pepd_spurious_losses", "counter"),
        ("pepd_reorder_window_seconds", "gauge"),
        ("pepd_cwnd_bytes", "gauge"),
        ("pepd_memory_in_use_bytes", "gauge"),
        ("pepd_memory_accounted_bytes", "gauge"),
        ("pepd_packets_lost", "counter"),
        ("pepd_wire_bytes", "counter"),
        ("pepd_relay_bytes", "counter"),
        ("pepd_snacks", "counter"),
        ("pepd_connect_errors", "counter"),
        ("pepd_build", "info"),
    ];
    for (family, ty) in expect {
        assert_eq!(types.get(family).map(String::as_str), Some(ty), "{family}");
    }

    for sample in &s.samples {
        let name = sample.metric.as_str();
        assert!(name.starts_with("pepd_"), "{name}");
        // The family a sample belongs to: counters and infos add a suffix to it.
        let family = types
            .keys()
            .filter(|f| name.starts_with(f.as_str()))
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("{name} has no # TYPE"));
        match types[family].as_str() {
            "counter" => assert_eq!(name, format!("{family}_total")),
            "info" => assert_eq!(name, format!("{family}_info")),
            _ => assert_eq!(name, family),
        }
        // Base units only: no milli-anything, no bits.
        for bad in ["_ms", "_milliseconds", "_bits", "_kb", "_mb"] {
            assert!(!name.contains(bad), "{name}");
        }
    }

    // Families are unique: a repeated family is an invalid exposition.
    let mut seen = std::collections::HashSet::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        assert!(seen.insert(l.to_owned()), "duplicate family {l}");
    }
}

#[test]
fn per_peer_series_have_exact_labels() {
    let text = encode(&sample()).expect("encodes");
    let s = parse(&text);
    let v = |name: &str, labels: &[(&str, &str)]| value(&s, name, labels);
    let ship = ("peer", "ship-7");
    let rig = ("peer", "rig-3");
    let expected: &[Expected<'_>] = &[
        (
            "pepd_peer_association_state",
            &[ship, ("state", "established")],
            1,
        ),
        (
            "pepd_peer_association_state",
            &[ship, ("state", "connecting")],
            0,
        ),
        (
            "pepd_peer_association_state",
            &[ship, ("state", "outage")],
            0,
        ),
        (
            "pepd_peer_association_state",
            &[ship, ("state", "closed")],
            0,
        ),
        (
            "pepd_peer_association_state",
            &[rig, ("state", "connecting")],
            1,
        ),
        (
            "pepd_peer_association_state",
            &[rig, ("state", "established")],
            0,
        ),
        (
            "pepd_peer_endpoint",
            &[ship, ("address", "198.19.0.7:40123")],
            1,
        ),
        ("pepd_peer_aead", &[ship, ("aead", "aes-256-gcm")], 1),
        ("pepd_peer_hub_rank", &[ship], 2),
        ("pepd_peer_endpoint_moves_total", &[ship], 208),
        ("pepd_peer_endpoint_moves_total", &[rig], 0),
        (
            "pepd_peer_wire_bytes_total",
            &[ship, ("direction", "sent")],
            201,
        ),
        (
            "pepd_peer_wire_bytes_total",
            &[ship, ("direction", "received")],
            202,
        ),
        (
            "pepd_peer_relay_bytes_total",
            &[ship, ("direction", "to_peer")],
            211,
        ),
        (
            "pepd_peer_relay_bytes_total",
            &[ship, ("direction", "from_peer")],
            212,
        ),
        ("pepd_peer_flows_active", &[ship], 210),
        ("pepd_peer_flows_active", &[rig], 0),
        ("pepd_peer_flows_opened_total", &[ship], 203),
        ("pepd_peer_flows_reset_stalled_total", &[ship], 218),
        ("pepd_peer_flows_reset_stalled_total", &[rig], 0),
        (
            "pepd_peer_flow_resets_total",
            &[ship, ("reason", "aborted")],
            214,
        ),
        (
            "pepd_peer_flow_resets_total",
            &[ship, ("reason", "refused")],
            214,
        ),
        (
            "pepd_peer_flows_over_limit_total",
            &[ship, ("reason", "peer_max_flows")],
            215,
        ),
        (
            "pepd_peer_flows_over_limit_total",
            &[ship, ("reason", "memory_budget")],
            216,
        ),
        (
            "pepd_peer_flows_over_limit_total",
            &[ship, ("reason", "gateway_max_flows")],
            217,
        ),
        (
            "pepd_peer_flows_over_limit_total",
            &[rig, ("reason", "peer_max_flows")],
            0,
        ),
        (
            "pepd_peer_packets_lost_total",
            &[ship, ("cause", "congestion")],
            204,
        ),
        (
            "pepd_peer_packets_lost_total",
            &[ship, ("cause", "corruption")],
            205,
        ),
        (
            "pepd_peer_packets_lost_total",
            &[ship, ("cause", "outage")],
            206,
        ),
        (
            "pepd_peer_datagrams_dropped_total",
            &[ship, ("reason", "malformed")],
            207,
        ),
        (
            "pepd_peer_datagrams_dropped_total",
            &[ship, ("reason", "unauthenticated")],
            209,
        ),
        (
            "pepd_peer_datagrams_dropped_total",
            &[rig, ("reason", "replayed")],
            0,
        ),
    ];
    for &(name, labels, want) in expected {
        assert_eq!(v(name, labels), want as f64, "{name}{labels:?}");
    }
    // One endpoint series per peer that has one, never one per address it was seen at.
    let endpoints: Vec<_> = s
        .samples
        .iter()
        .filter(|m| m.metric == "pepd_peer_endpoint")
        .collect();
    assert_eq!(endpoints.len(), 1);
    // One AEAD series per peer with keys; none for a peer without.
    let aeads: Vec<_> = s
        .samples
        .iter()
        .filter(|m| m.metric == "pepd_peer_aead")
        .collect();
    assert_eq!(aeads.len(), 1);
    // A hub rank only for a terminal with a list of hubs.
    let ranks = s
        .samples
        .iter()
        .filter(|m| m.metric == "pepd_peer_hub_rank")
        .count();
    assert_eq!(ranks, 1);
    // Foreign datagrams belong to no peer.
    assert!(!s
        .samples
        .iter()
        .any(|m| m.metric == "pepd_peer_datagrams_dropped_total"
            && m.labels.get("reason") == Some("foreign")));
    // The gateway-wide series stay as they were.
    assert_eq!(
        v("pepd_wire_bytes_total", &[("direction", "received")]),
        103.0
    );
    let types = types(&text);
    for (family, ty) in [
        ("pepd_peer_association_state", "gauge"),
        ("pepd_peer_endpoint", "gauge"),
        ("pepd_peer_endpoint_moves", "counter"),
        ("pepd_peer_hub_rank", "gauge"),
        ("pepd_peer_wire_bytes", "counter"),
        ("pepd_peer_datagrams_dropped", "counter"),
    ] {
        assert_eq!(types.get(family).map(String::as_str), Some(ty), "{family}");
    }
}

#[test]
fn no_window_in_rate_mode_means_no_cwnd_series() {
    let mut snap = sample();
    snap.stats.cwnd_bytes = u64::MAX;
    let text = encode(&snap).expect("encodes");
    assert!(!text.contains("pepd_cwnd"), "{text}");
    assert!(!text.contains("18446744073709551615"), "{text}");
}

#[test]
fn state_gauge_is_one_hot() {
    for current in AssociationState::ALL {
        let snap = Snapshot {
            associations: vec![current],
            ..Snapshot::default()
        };
        let s = parse(&encode(&snap).expect("encodes"));
        for st in AssociationState::ALL {
            let want = if st == current { 1.0 } else { 0.0 };
            assert_eq!(
                value(&s, "pepd_association_state", &[("state", st.label())]),
                want
            );
        }
    }
}

#[test]
fn repeated_reason_labels_are_summed_into_one_series() {
    let mut snap = sample();
    snap.relay.connect_errors = vec![("refused", 2), ("timeout", 3), ("refused", 5)];
    let text = encode(&snap).expect("encodes");
    let s = parse(&text);
    assert_eq!(
        value(&s, "pepd_connect_errors_total", &[("reason", "refused")]),
        7.0
    );
    assert_eq!(
        value(&s, "pepd_connect_errors_total", &[("reason", "timeout")]),
        3.0
    );
}

#[test]
fn encoding_is_a_pure_function_of_the_snapshot() {
    // Scraping twice must not count anything twice.
    let snap = sample();
    assert_eq!(
        encode(&snap).expect("encodes"),
        encode(&snap).expect("encodes")
    );
}

#[test]
fn announcements_are_reported_as_written_and_only_with_announce() {
    let text = encode(&sample()).expect("encodes");
    let want =
        "# HELP pepd_announced_prefixes Prefixes this hub announces: of terminals it serves \
                (table=\"serving\") and of terminals in an outage (table=\"outage\")\n\
                # TYPE pepd_announced_prefixes gauge\n\
                pepd_announced_prefixes{table=\"serving\"} 310\n\
                pepd_announced_prefixes{table=\"outage\"} 311\n\
                # HELP pepd_announce_errors Changes to the announcement tables that failed (an \
                `ip` batch or read)\n\
                # TYPE pepd_announce_errors counter\n\
                pepd_announce_errors_total 312\n";
    assert!(text.contains(want), "{text}");
    let without = Snapshot {
        announce: None,
        ..sample()
    };
    let text = encode(&without).expect("encodes");
    assert!(!text.contains("pepd_announce"), "{text}");
}

#[test]
fn empty_reason_lists_still_encode() {
    let text = encode(&Snapshot::default()).expect("encodes");
    let s = parse(&text);
    assert!(!s
        .samples
        .iter()
        .any(|x| x.metric == "pepd_connect_errors_total"));
    assert_eq!(value(&s, "pepd_flows_refused_total", &[]), 0.0);
    // Without `[[class]]`, no class series.
    assert!(!s
        .samples
        .iter()
        .any(|x| x.metric.starts_with("pepd_class_")));
}

// ---- HTTP ------------------------------------------------------------------------------

struct Server {
    addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let source: SnapshotSource = Arc::new(sample);
    let task = tokio::spawn(serve_with(listener, source, healthy(), rx, limits));
    Server { addr, stop, task }
}

/// Sends `request` raw, half-closes, and returns the whole response.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).await.expect("connect");
    c.write_all(request).await.expect("write");
    read_all(&mut c).await
}

async fn read_all(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
        .await
        .expect("server answers in time")
        .expect("read");
    String::from_utf8(out).expect("UTF-8 response")
}

fn split(response: &str) -> (&str, &str) {
    response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {response:?}"))
}

fn status(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

async fn shut(server: Server) {
    server.stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(2), server.task)
        .await
        .expect("serve returns on stop")
        .expect("serve did not panic");
}

#[tokio::test]
async fn get_metrics_serves_the_snapshot() {
    let server = start(Limits::default()).await;
    let r = exchange(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n",
    )
    .await;
    let (head, body) = split(&r);
    assert_eq!(status(head), "HTTP/1.1 200 OK");
    assert!(
        head.contains(&format!("\r\nContent-Type: {CONTENT_TYPE}")),
        "{head}"
    );
    assert!(head.contains("\r\nConnection: close"), "{head}");
    assert!(
        head.contains(&format!("\r\nContent-Length: {}", body.len())),
        "{head}"
    );
    assert_eq!(body, encode(&sample()).expect("encodes"));
    let s = parse(body);
    assert_eq!(
        value(&s, "pepd_snacks_total", &[("direction", "received")]),
        115.0
    );
    shut(server).await;
}

#[tokio::test]
async fn head_and_query_strings_and_bare_lf() {
    let server = start(Limits::default()).await;
    let r = exchange(server.addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
    let (head, body) = split(&r);
    assert_eq!(status(head), "HTTP/1.1 200 OK");
    assert!(body.is_empty());
    assert!(!head.contains("Content-Length: 0"), "{head}");

    let r = exchange(server.addr, b"GET /metrics?x=1 HTTP/1.0\n\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    shut(server).await;
}

#[tokio::test]
async fn other_paths_and_methods_are_refused() {
    let server = start(Limits::default()).await;
    for path in ["/", "/metricsx", "/metrics/", "/favicon.ico"] {
        let req = format!("GET {path} HTTP/1.1\r\n\r\n");
        let r = exchange(server.addr, req.as_bytes()).await;
        assert_eq!(status(&r), "HTTP/1.1 404 Not Found", "{path}");
    }
    let r = exchange(
        server.addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(status(&r), "HTTP/1.1 405 Method Not Allowed");
    assert!(r.contains("\r\nAllow: GET, HEAD\r\n"), "{r}");
    shut(server).await;
}

#[tokio::test]
async fn garbage_gets_400_and_the_server_lives_on() {
    let server = start(Limits::default()).await;
    let garbage: [&[u8]; 6] = [
        b"garbage\r\n\r\n",
        b"\x00\x01\x02\xff\xfe\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\n",
    ];
    for g in garbage {
        let r = exchange(server.addr, g).await;
        assert_eq!(status(&r), "HTTP/1.1 400 Bad Request", "{g:?}");
    }
    // Cut off mid-head: the client half-closes before the blank line.
    let mut c = TcpStream::connect(server.addr).await.expect("connect");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost:")
        .await
        .expect("write");
    c.shutdown().await.expect("half-close");
    assert_eq!(status(&read_all(&mut c).await), "HTTP/1.1 400 Bad Request");
    // Connected and gone without a word: no response, no harm.
    drop(TcpStream::connect(server.addr).await.expect("connect"));

    let r = exchange(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    shut(server).await;
}

#[tokio::test]
async fn oversized_head_gets_431() {
    let server = start(Limits::default()).await;
    let mut req = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while req.len() <= 9 * 1024 {
        req.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    req.extend_from_slice(b"\r\n");
    let r = exchange(server.addr, &req).await;
    assert_eq!(status(&r), "HTTP/1.1 431 Request Header Fields Too Large");

    // Never-ending head, no terminator at all: cut off at the cap, not read forever.
    let mut c = TcpStream::connect(server.addr).await.expect("connect");
    let filler = vec![b'a'; 64 * 1024];
    // The server stops reading at the cap, so this write may fail once it closes: fine.
    let _ = c.write_all(&filler).await;
    assert_eq!(
        status(&read_all(&mut c).await),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    shut(server).await;
}

#[tokio::test]
async fn a_silent_client_times_out_without_blocking_others() {
    let limits = Limits {
        read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = start(limits).await;
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    // Served while the silent one is still waiting.
    let r = exchange(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    assert_eq!(
        status(&read_all(&mut silent).await),
        "HTTP/1.1 408 Request Timeout"
    );
    shut(server).await;
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_their_turn() {
    let limits = Limits {
        read_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..Limits::default()
    };
    let server = start(limits).await;
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    // Give the server time to take the silent connection first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = tokio::time::Instant::now();
    let r = exchange(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        status(&read_all(&mut silent).await),
        "HTTP/1.1 408 Request Timeout"
    );
    shut(server).await;
}

#[tokio::test]
async fn serve_returns_when_the_stop_sender_goes() {
    let server = start(Limits::default()).await;
    drop(server.stop);
    tokio::time::timeout(Duration::from_secs(2), server.task)
        .await
        .expect("serve returns")
        .expect("no panic");
}

#[tokio::test]
async fn stop_already_set_returns_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (_tx, rx) = watch::channel(true);
    let source: SnapshotSource = Arc::new(Snapshot::default);
    tokio::time::timeout(
        Duration::from_secs(2),
        serve(listener, source, healthy(), rx),
    )
    .await
    .expect("serve returns");
}

#[tokio::test]
async fn a_panicking_source_costs_one_scrape_only() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    let source: SnapshotSource = Arc::new(move || {
        if c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            panic!("first scrape fails");
        }
        Snapshot::default()
    });
    let task = tokio::spawn(serve_with(
        listener,
        source,
        healthy(),
        rx,
        Limits::default(),
    ));
    let r = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 500 Internal Server Error");
    let r = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    shut(Server { addr, stop, task }).await;
}

/// A daemon that always serves.
fn healthy() -> HealthSource {
    Arc::new(|| Box::pin(async { Ok(()) }))
}

#[tokio::test]
async fn healthz_says_serving_or_why_not_in_one_line() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    // Serving at first, then draining.
    let health: HealthSource = Arc::new(move || {
        let first = c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
        Box::pin(async move {
            match first {
                true => Ok(()),
                false => Err("draining".to_owned()),
            }
        })
    });
    let source: SnapshotSource = Arc::new(Snapshot::default);
    let task = tokio::spawn(serve_with(listener, source, health, rx, Limits::default()));
    let r = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    assert!(r.ends_with("\r\n\r\nserving\n"), "{r}");
    let r = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 503 Service Unavailable");
    assert!(r.ends_with("\r\n\r\nnot serving: draining\n"), "{r}");
    let r = exchange(addr, b"POST /healthz HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&r), "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    shut(Server { addr, stop, task }).await;
}
