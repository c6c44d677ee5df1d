//! The AEAD two gateways settle on in their handshake: each choice carries bytes exactly,
//! shows in the stats and stays across rekeys; gateways pinned to different AEADs never
//! associate and both count why; an offer changed on the path is refused, so nobody on it
//! can downgrade the choice.

mod support;

use std::time::Duration;

use pep_transport::security::{public_key, stamp_initiation_macs, AeadOffer, PacketProtection};
use support::{
    establish_within_20s as established, fin_at, pattern, security_pair, test_config, Faults, Net,
    INIT, REPLY,
};

const MS: Duration = Duration::from_millis(1);
const AES: PacketProtection = PacketProtection::Aes256Gcm;
const CHACHA: PacketProtection = PacketProtection::ChaCha20Poly1305;

/// A secure pair over a 600 ms round trip whose sides offer `offers`.
fn pair_offering(offers: [AeadOffer; 2], seed: u64, rekey: Duration) -> Net {
    let mut sec = security_pair(rekey);
    sec[0].aeads = offers[0];
    sec[1].aeads = offers[1];
    Net::new_secure(
        test_config(20_000_000),
        test_config(20_000_000),
        MS * 300,
        Faults::default(),
        seed,
        sec,
    )
}

#[test]
fn each_choice_carries_bytes_exactly_both_ways_across_rekeys() {
    let hardware = AeadOffer::auto(true);
    let software = AeadOffer::auto(false);
    for (seed, offers, chosen) in [
        (21, [hardware, hardware], AES),
        (22, [hardware, software], CHACHA),
        (23, [software, hardware], CHACHA),
        (24, [software, software], CHACHA),
        (25, [software, AeadOffer::only(AES)], AES),
        (26, [AeadOffer::only(CHACHA), hardware], CHACHA),
    ] {
        // A rekey every second, so the transfer crosses several.
        let mut n = pair_offering(offers, seed, Duration::from_secs(1));
        let up = pattern(seed, 8_000_000);
        let down = pattern(seed + 100, 4_000_000);
        n.apps[1].on_open = Some((down.clone(), true, None));
        let f = n.open(0, 1000, up.clone(), true);
        assert!(
            n.run_until(Duration::from_secs(60), |n| fin_at(n, 0, f)
                && fin_at(n, 1, f)),
            "{offers:?}"
        );
        assert_eq!(n.apps[1].flows[&f].received, up, "{offers:?}");
        assert_eq!(n.apps[0].flows[&f].received, down, "{offers:?}");
        for side in 0..2 {
            let s = n.ends[side].stats();
            assert_eq!(s.aead, Some(chosen), "{offers:?} side {side}");
            assert!(s.rekeys >= 2, "{offers:?} side {side}: {} rekeys", s.rekeys);
            assert_eq!(
                (s.security.aead_mismatch, s.security.unauthenticated),
                (0, 0),
                "{offers:?} side {side}"
            );
        }
    }
}

#[test]
fn gateways_pinned_to_different_aeads_never_associate_and_both_count_why() {
    let mut n = pair_offering(
        [AeadOffer::only(AES), AeadOffer::only(CHACHA)],
        27,
        Duration::from_secs(120),
    );
    n.record_b = Some(Vec::new());
    let f = n.open(0, 1003, pattern(5, 10_000), true);
    n.run_until(Duration::from_secs(20), |_| false);
    assert!(!n.ends[0].is_established() && !n.ends[1].is_established());
    assert!(n.apps[1].flows.is_empty(), "a flow was opened");
    assert!(n.apps[0].flows[&f].received.is_empty());
    // The responder still replies, so the initiator learns the responder's offer
    // (authenticated) and counts the mismatch too rather than retrying in silence.
    let replies = n
        .record_b
        .as_ref()
        .unwrap()
        .iter()
        .filter(|d| d[0] == REPLY)
        .count() as u64;
    assert!(replies > 0);
    for side in 0..2 {
        let s = n.ends[side].stats();
        assert_eq!(s.security.aead_mismatch, replies, "side {side}: {s:?}");
        assert_eq!((s.handshakes_completed, s.aead), (0, None), "side {side}");
    }
}

#[test]
fn an_aead_offer_changed_on_the_path_is_refused() {
    // Both sides prefer AES-256-GCM. An attacker on the path who wants them on another
    // AEAD edits side 0's offer: HELLO ends with it (count, then identifiers), and Noise
    // encrypts the payload with a stream cipher, so flipping ciphertext bits flips the
    // same plaintext bits without any key. What it cannot do is fix the tag after.
    let pair = || {
        let mut n = pair_offering([AeadOffer::auto(true); 2], 28, Duration::from_secs(120));
        n.record_a = Some(Vec::new());
        n.record_b = Some(Vec::new());
        n.drop_filter = Some(Box::new(|from, d| from == 0 && d[0] == INIT));
        n.run_until(MS * 10, |_| false);
        n
    };
    let init = pair().record_a.unwrap()[0].clone();
    assert_eq!(init[0], INIT);
    // Before mac1 and mac2 (32) and the payload's tag (16): `2 | AES | ChaCha20`.
    let offer = init.len() - 32 - 16 - 3;
    let responder_key = public_key(&security_pair(Duration::ZERO)[1].local_private_key);
    // Each edits the datagram `d` whose offer starts at `at`.
    let forgeries: [fn(&mut Vec<u8>, usize); 3] = [
        // ChaCha20 first: `2 | ChaCha20 | AES`.
        |d, at| {
            d[at + 1] ^= 3;
            d[at + 2] ^= 3;
        },
        // ChaCha20 alone: `1 | ChaCha20`, the AES identifier left as a reserved byte.
        |d, at| {
            d[at] ^= 3;
            d[at + 1] ^= 3;
        },
        // No offer at all, which reads as a gateway from before offers: ChaCha20 only.
        |d, at| {
            d.drain(at..at + 3);
        },
    ];
    for forge in forgeries {
        // A fresh pair each time, so that each forgery is the first the responder sees.
        let mut n = pair();
        let mut d = init.clone();
        forge(&mut d, offer);
        // mac1 needs only the responder's public key: the attacker can make it.
        stamp_initiation_macs(&mut d, &responder_key, None);
        n.inject(1, &d);
        let s = n.ends[1].stats();
        assert_eq!(s.security.handshake_invalid, 1, "{:?}", s.security);
        assert_eq!((s.handshakes_completed, s.aead), (0, None));
        assert!(!n.record_b.as_ref().unwrap().iter().any(|d| d[0] == REPLY));
        // The genuine initiation arriving after its forgery is still answered: an
        // ephemeral key is remembered only once its initiation authenticated.
        n.inject(1, &init);
        assert!(n.record_b.as_ref().unwrap().iter().any(|d| d[0] == REPLY));
        assert_eq!(n.ends[1].stats().security.handshake_replayed, 0);
        // With the choice the offers make.
        n.drop_filter = None;
        established(&mut n);
        for side in 0..2 {
            assert_eq!(n.ends[side].stats().aead, Some(AES), "side {side}");
        }
    }
}
