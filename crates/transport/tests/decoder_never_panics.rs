//! CI-sized cousin of the cargo-fuzz targets in fuzz/: arbitrary bytes, and mutations of real
//! packets, into the datagram decoder and into an established association. Nothing may
//! panic, and hostile input may only ever be dropped or applied, never lost track of. The
//! long runs (and the regression corpus) live in fuzz/; this keeps the cheap guarantees in
//! `cargo test`.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use pep_transport::codec::Reader;
use pep_transport::frame::Frame;
use pep_transport::packet::{
    decode_header, decode_header_with_cid, encode_hint, parse_hint, parse_packet,
    parse_packet_with_cid,
};
use pep_transport::security::LocalIdentity;
use pep_transport::{Endpoint, EndpointConfig, PeerId, PeerIdentity};
use proptest::prelude::*;
use support::{pattern, test_config, Faults, Net};

const MS: Duration = Duration::from_millis(1);

/// An established pair with a flow carrying data from side 0 to side 1.
fn pair() -> (Net, u64) {
    let mut n = Net::new(
        test_config(20_000_000),
        test_config(20_000_000),
        MS * 20,
        Faults::default(),
        7,
    );
    assert!(n.run_until(Duration::from_secs(5), |n| n.established()));
    n.record_a = Some(Vec::new());
    let f = n.open(0, 4000, pattern(7, 20_000), true);
    (n, f)
}

/// Real datagrams side 0 sent during a transfer (FLOW_OPEN, DATA, ACKs, FIN): mutation
/// seeds that get past the header and into the frame decoders.
fn captured() -> &'static [Vec<u8>] {
    static CAPTURED: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let (mut n, f) = pair();
        assert!(n.run_until(Duration::from_secs(10), |n| n.apps[1]
            .flows
            .get(&f)
            .is_some_and(|x| x.fin_received)));
        let mut v = n.record_a.take().unwrap();
        // Mutating 1400 bytes of payload finds little that 200 do not.
        for d in &mut v {
            d.truncate(200);
        }
        v
    })
}

/// One edit of a captured datagram.
#[derive(Debug, Clone)]
enum Edit {
    Flip { at: usize, bit: u8 },
    Set { at: usize, value: u8 },
    Truncate { at: usize },
    Insert { at: usize, value: u8 },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Edit::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Edit::Set { at, value }),
        any::<usize>().prop_map(|at| Edit::Truncate { at }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Edit::Insert { at, value }),
    ]
}

fn apply(mut d: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        if d.is_empty() {
            break;
        }
        let len = d.len();
        match *e {
            Edit::Flip { at, bit } => d[at % len] ^= 1 << bit,
            Edit::Set { at, value } => d[at % len] = value,
            Edit::Truncate { at } => d.truncate(at % len),
            Edit::Insert { at, value } => d.insert(at % len, value),
        }
    }
    d
}

/// Every way the crate decodes received bytes, for a receiver without connection IDs and for
/// one that chose them (0..=8 bytes, the longest the format carries); none may panic or loop.
/// Endpoints of both kinds route or drop the bytes without panicking either.
fn decode_everything(bytes: &[u8]) {
    let _ = parse_packet(bytes);
    let mut r = Reader::new(bytes);
    if decode_header(&mut r).is_ok() {
        while !r.is_empty() && Frame::decode(&mut r).is_ok() {}
    }
    for cid_len in 0..=9 {
        hint_round_trip(bytes, cid_len);
        let _ = parse_packet_with_cid(bytes, cid_len);
        let mut r = Reader::new(bytes);
        if decode_header_with_cid(&mut r, cid_len).is_ok() {
            while !r.is_empty() && Frame::decode(&mut r).is_ok() {}
        }
    }
    for cid_len in [0, 2] {
        for secure in [false, true] {
            let local = secure.then_some(LocalIdentity {
                private_key: [7; 32],
                psk: None,
            });
            let mut cfg = EndpointConfig::new(cid_len);
            // A hub answers what it cannot route with hints.
            cfg.hints = secure && cid_len > 0;
            let mut e = Endpoint::new(cfg, local, [1; 32]).unwrap();
            let peer = PeerIdentity {
                public_key: Some([9; 32]),
                address: Some("198.18.0.9:7400".parse().unwrap()),
            };
            e.set_peers([(PeerId(1), peer)]);
            let from = "198.18.0.9:7400".parse().unwrap();
            let _ = e.handle(std::time::Instant::now(), from, bytes);
        }
    }
    for offset_len in 1..=4 {
        let _ = Frame::decode_implicit_data(&mut Reader::new(bytes), false, offset_len);
    }
}

/// A HINT that parses is what `encode_hint` makes of a trigger with its bytes: flags,
/// connection ID and packet number, a byte of payload, and a tag ending in its tail.
fn hint_round_trip(data: &[u8], cid_len: usize) {
    let Ok(h) = parse_hint(data, cid_len) else {
        return;
    };
    let mut trigger = vec![h.trigger_flags];
    trigger.extend_from_slice(h.cid);
    trigger.extend_from_slice(h.pn);
    trigger.extend_from_slice(&[0; 13]);
    trigger.extend_from_slice(&h.tag_tail);
    let mut out = Vec::new();
    assert_eq!(encode_hint(&trigger, cid_len, 16, &mut out), cid_len > 0);
    if cid_len > 0 {
        assert_eq!(out, data, "re-encoded hint differs");
        assert!(out.len() < trigger.len());
    }
}

/// A hostile datagram: made up, or a captured one mutated.
fn hostile() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        (any::<usize>(), proptest::collection::vec(edit(), 1..6))
            .prop_map(|(i, edits)| apply(captured()[i % captured().len()].clone(), &edits)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..1500)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_packets_never_panic_the_decoder(i in any::<usize>(), edits in proptest::collection::vec(edit(), 1..8)) {
        let d = apply(captured()[i % captured().len()].clone(), &edits);
        decode_everything(&d);
    }
}

proptest! {
    // Each case builds and establishes a pair: fewer cases keep this well under a second.
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn established_association_survives_hostile_datagrams(
        junk in proptest::collection::vec((hostile(), 0u32..300), 1..40),
    ) {
        let (mut n, _) = pair();
        let before = n.ends[1].stats();
        for (d, step_ms) in &junk {
            let now = n.now;
            n.ends[1].handle_datagram(now, d);
            // Interleave output, timers and the application, as the daemon does.
            n.service(1);
            n.now += MS * *step_ms;
            let now = n.now;
            n.ends[1].handle_timeout(now);
            n.service(1);
        }
        let after = n.ends[1].stats();
        // Hostile datagrams are counted at most once each, wherever they end up.
        let counted = |s: &pep_transport::Stats| {
            s.packets_received + s.malformed_dropped + s.duplicates_dropped + s.unassociated_dropped
        };
        prop_assert!(counted(&after) - counted(&before) <= junk.len() as u64);
        prop_assert!(after.flows_open <= after.flows_opened_total);
        // And the pair keeps running on honest traffic afterwards.
        n.run_until(Duration::from_secs(2), |_| false);
    }
}
