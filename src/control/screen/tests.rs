use super::*;
use crate::control::status::{CarrierStatus, GatewayStatus, LostStatus, ShareStatus, WorkerStatus};

fn peer(name: &str) -> PeerStatus {
    PeerStatus {
        name: name.to_owned(),
        state: "established".to_owned(),
        state_seconds: 190.4,
        endpoint: Some("198.19.1.2:7400".parse().expect("address")),
        endpoint_moves: 0,
        endpoint_moved_seconds_ago: None,
        last_handshake_seconds_ago: Some(68.2),
        last_packet_seconds_ago: Some(0.012),
        outage_seconds: None,
        rtt_seconds: 0.6123,
        rtt_min_seconds: 0.6,
        queue_delay_seconds: 0.012,
        datagram_size: 1380,
        pacing_bps: 48_123_456,
        capacity_estimate_bps: 49_000_000,
        ceiling_bps: 50_000_000,
        tx_rate_bps: 50_000_000,
        share: None,
        packets_sent: 120_000,
        lost: LostStatus {
            congestion: 12,
            corruption: 132,
            outage: 0,
        },
        flows_open: 2,
        bytes_to_peer: 1_204_000_000,
        bytes_from_peer: 14_300_000_000,
    }
}

fn status(side: &str, peers: Vec<PeerStatus>) -> Status {
    Status {
        pepd: "0.1.0".to_owned(),
        protocol: 2,
        side: side.to_owned(),
        uptime_seconds: 192.0,
        carrier: CarrierStatus {
            tx_rate_bps: 50_000_000,
            shared: side == "hub",
            pacing_bps: peers.iter().map(|p| p.pacing_bps).sum(),
        },
        gateway: GatewayStatus {
            peers: peers.len() as u64,
            peers_established: peers.iter().filter(|p| p.state == "established").count() as u64,
            flows_open: 2,
            max_flows: 10_000,
            memory_accounted_bytes: 9_300_000,
            memory_budget_bytes: 512 << 20,
            workers: vec![WorkerStatus {
                associations: 1,
                datagrams: 5,
                handed_off: 0,
                inbox_dropped: 0,
            }],
        },
        peers,
    }
}

#[test]
fn one_peer_gets_a_screen_of_its_own() {
    let text = status_text(&status("terminal", vec![peer("pair")]), SortKey::Name);
    assert_eq!(
        text,
        "pepd 0.1.0 (protocol 2), terminal, up 3m 12s\n\
         carrier   tx_rate 50 Mbit/s, pacing 48.1 Mbit/s\n\
         gateway   2 of 10000 flows open, memory 8.9 MiB of 512 MiB accounted (1.7 %), 1 worker\n\
         \n\
         peer pair\n  \
         endpoint      198.19.1.2:7400, never moved\n  \
         association   established for 3m 10s, last handshake 1m 8s ago, last packet 12.0 ms ago\n  \
         path          RTT 612 ms (min 600 ms), queue delay 12.0 ms, datagrams of 1380 bytes\n  \
         rate          pacing 48.1 Mbit/s, capacity estimate 49.0 Mbit/s, ceiling 50 Mbit/s\n  \
         loss          0.12 % of 120000 packets sent: congestion 12, corruption 132, outage 0\n  \
         flows         2 open; 1.20 GB to the peer, 14.3 GB from it\n"
    );
}

#[test]
fn an_outage_a_move_and_a_capped_share_are_said() {
    let mut p = peer("t1");
    p.state = "outage".to_owned();
    p.outage_seconds = Some(12.5);
    p.endpoint_moves = 2;
    p.endpoint_moved_seconds_ago = Some(4000.0);
    p.share = Some(ShareStatus {
        allocated_bps: 12_500_000,
        cir_bps: 5_000_000,
        weight: 2,
        capped: true,
    });
    let text = status_text(&status("hub", vec![p]), SortKey::Name);
    for want in [
        "  endpoint      198.19.1.2:7400, moved 2 times, last 1h 6m ago",
        "  association   outage for 12.5 s (no answer from the peer), last handshake 1m 8s ago, \
         last packet 12.0 ms ago",
        "  share         allocated 12.5 Mbit/s of its MIR 50 Mbit/s, CIR 5 Mbit/s, weight 2, \
         capped by the others' shares",
        "carrier   tx_rate 50 Mbit/s shared by 1 peer (0 established), pacing 48.1 Mbit/s",
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "missing {want:?} in\n{text}"
        );
    }
}

#[test]
fn many_peers_make_a_table_sorted_by_the_column_asked() {
    let mut a = peer("a");
    a.rtt_seconds = 0.7;
    a.bytes_from_peer = 1;
    let mut b = peer("b");
    b.state = "connecting".to_owned();
    b.endpoint = None;
    b.last_handshake_seconds_ago = None;
    b.bytes_from_peer = 3;
    let mut c = peer("c");
    c.rtt_seconds = 0.65;
    c.bytes_from_peer = 2;
    let s = status("hub", vec![c, a, b]);
    let order = |sort| -> Vec<String> {
        status_text(&s, sort)
            .lines()
            .skip_while(|l| !l.starts_with("PEER"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|n| n.len() == 1)
            .collect()
    };
    assert_eq!(order(SortKey::Name), ["a", "b", "c"]);
    assert_eq!(order(SortKey::Rtt), ["a", "c", "b"]);
    assert_eq!(order(SortKey::FromPeer), ["b", "c", "a"]);
    assert_eq!(order(SortKey::State), ["b", "a", "c"]);
    let text = status_text(&s, SortKey::Name);
    let row_b = text
        .lines()
        .find(|l| l.starts_with("b "))
        .expect("row of b");
    assert!(
        row_b.split_whitespace().collect::<Vec<_>>()[..6]
            == ["b", "connecting", "3m10s", "-", "-", "12.0ms"],
        "{row_b}"
    );
    let head = text.lines().find(|l| l.starts_with("PEER")).expect("head");
    assert_eq!(head.split_whitespace().count(), PEER_COLUMNS.len());
}

#[test]
fn flows_are_listed_one_a_row() {
    let f = FlowStatus {
        peer: "t1".to_owned(),
        origin: "intercepted".to_owned(),
        client: Some("198.18.11.2:40000".parse().expect("address")),
        server: Some("198.18.200.2:5001".parse().expect("address")),
        age_seconds: 75.0,
        bytes_to_peer: 5_000_000,
        bytes_from_peer: 1_250,
        state: "reset".to_owned(),
        reset_reason: Some("refused".to_owned()),
    };
    assert_eq!(
        flows_text(std::slice::from_ref(&f)),
        "PEER  ORIGIN       CLIENT             SERVER             AGE    TO-PEER  FROM-PEER  STATE\n\
         t1    intercepted  198.18.11.2:40000  198.18.200.2:5001  1m15s  5.00M    1.25k      reset (refused)\n\
         1 flow (sizes in bytes)\n"
    );
    assert_eq!(flows_text(&[]), "no flows open\n");
}

#[test]
fn figures_read_with_three_digits_and_durations_in_their_largest_units() {
    assert_eq!(rate(0), "0 bit/s");
    assert_eq!(rate(999), "999 bit/s");
    assert_eq!(rate(1_000), "1.00 kbit/s");
    assert_eq!(rate(48_150_000), "48.1 Mbit/s");
    assert_eq!(rate(999_900_000), "1.00 Gbit/s");
    assert_eq!(bytes(123_456_789_012), "123 GB");
    assert_eq!(short(1_500.0), "1.50k");
    assert_eq!(age(0.0), "0 ms");
    assert_eq!(age(0.000_25), "0.25 ms");
    assert_eq!(age(0.0004), "0.40 ms");
    assert_eq!(age(0.6126), "613 ms");
    assert_eq!(age(4.2), "4.20 s");
    assert_eq!(age(59.99), "60.0 s");
    assert_eq!(age(3725.0), "1h 2m");
    assert_eq!(age(3.0 * 86_400.0 + 7200.0), "3d 2h");
    assert_eq!(short_age(190.0), "3m10s");
    assert_eq!(percent(0, 0), "0.00 %");
    assert_eq!(percent(1, 3), "33.33 %");
}
