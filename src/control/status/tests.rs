use std::time::Duration;

use pep_transport::PeerId;
use tokio::sync::Notify;

use super::*;
use crate::config::PeerSpec;
use crate::tunnel::memory::MemoryAccount;
use crate::tunnel::peer::{Allocation, PeerCounters};
use crate::tunnel::peer_table::PeerTable;

fn spec(name: &str, tx_bps: u64) -> PeerSpec {
    PeerSpec {
        name: name.to_owned(),
        public_key: None,
        address: None,
        subnets: Vec::new(),
        tx_bps,
        rx_bps: 10_000_000,
        min_bps: 0,
        weight: 1,
        keepalive: Duration::from_secs(5),
        max_flows: 100,
    }
}

/// A hub of `t1` (allocated 5 of its 20 Mbit/s, CIR 1 Mbit/s, weight 3, in an outage) and
/// `t2` (never given a share), neither associated.
fn hub() -> StatusSource {
    let memory = Arc::new(MemoryAccount::new(1 << 30, 0, 0));
    let wake = Arc::new(Notify::new());
    let peers: Vec<Arc<Peer>> = ["t1", "t2"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            Arc::new(Peer::new(
                PeerId(i as u32),
                n,
                None,
                1 << 20,
                memory.clone(),
                wake.clone(),
            ))
        })
        .collect();
    peers[0].carrier.record(Allocation {
        allocated_bps: 5_000_000,
        cir_bps: 1_000_000,
        weight: 3,
    });
    peers[0].counters.set_state(AssociationState::Outage);
    PeerCounters::add(&peers[1].counters.bytes_to_peer, 12);
    let specs = vec![spec("t1", 20_000_000), spec("t2", 30_000_000)];
    let gateway = Gateway::new(PeerTable::new(peers, specs), 40_000_000, wake, memory, 500);
    StatusSource {
        gateway: Arc::new(gateway),
        side: Side::Hub,
        shared_carrier: true,
        started: Instant::now() - Duration::from_secs(60),
    }
}

#[test]
fn each_peer_s_share_ceiling_and_state_come_from_its_place_and_its_spec() {
    let s = hub().status(None).expect("status");
    assert_eq!(s.side, "hub");
    assert!(s.uptime_seconds >= 60.0);
    assert_eq!(
        (s.carrier.tx_rate_bps, s.carrier.shared),
        (40_000_000, true)
    );
    assert_eq!((s.gateway.peers, s.gateway.peers_established), (2, 0));
    assert_eq!(s.gateway.max_flows, 500);
    let (t1, t2) = (&s.peers[0], &s.peers[1]);
    assert_eq!(
        t1.share,
        Some(ShareStatus {
            allocated_bps: 5_000_000,
            cir_bps: 1_000_000,
            weight: 3,
            capped: true,
        })
    );
    assert_eq!((t1.tx_rate_bps, t1.ceiling_bps), (20_000_000, 5_000_000));
    // In its state since it was set, not since the daemon started; without an association
    // no outage start is known.
    assert_eq!(t1.state, "outage");
    assert!(t1.state_seconds < 10.0, "{}", t1.state_seconds);
    assert_eq!(t1.outage_seconds, None);
    assert_eq!(t2.share, None);
    assert_eq!((t2.tx_rate_bps, t2.ceiling_bps), (30_000_000, 30_000_000));
    assert_eq!((t2.state.as_str(), t2.bytes_to_peer), ("connecting", 12));
    assert!(t2.state_seconds < 10.0, "connecting since it was made");
    assert_eq!(
        (
            t2.endpoint,
            t2.last_packet_seconds_ago,
            t2.last_handshake_seconds_ago
        ),
        (None, None, None)
    );
}

#[test]
fn one_peer_is_asked_for_by_name_and_an_unknown_one_is_an_error() {
    let src = hub();
    let s = src.status(Some("t2")).expect("t2");
    assert_eq!(s.peers.len(), 1);
    assert_eq!(s.peers[0].name, "t2");
    assert_eq!(s.gateway.peers, 2, "the gateway's figures stay the whole's");
    assert_eq!(src.status(Some("t9")), Err(UnknownPeer("t9".to_owned())));
    assert_eq!(src.flows(Some("t9")), Err(UnknownPeer("t9".to_owned())));
    assert_eq!(src.flows(None), Ok(Vec::new()));
}

#[test]
fn a_status_reads_back_from_its_json() {
    let s = hub().status(None).expect("status");
    let text = serde_json::to_string(&s).expect("json");
    let back: Status = serde_json::from_str(&text).expect("read back");
    assert_eq!(back, s);
}
