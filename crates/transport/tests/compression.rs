//! What two gateways agree on for compression in their handshake, with security and
//! without: both offering settle on zstd and the smaller block size; a gateway that offers
//! nothing (it cannot decompress, or predates compression) associates as before and no flow
//! carries compressed blocks; a flow opened with the compression bit arrives with it.

mod support;

use std::time::Duration;

use pep_transport::compression::Algorithm;
use pep_transport::{Compression, CompressionOffer, Config, Event};
use support::{establish_within_20s, meta, security_pair, test_config, Faults, Net};

const MS: Duration = Duration::from_millis(1);

fn offering(offer: Option<CompressionOffer>) -> Config {
    let mut c = test_config(20_000_000);
    c.compression = offer;
    c
}

fn pair(offers: [Option<CompressionOffer>; 2], secure: bool, seed: u64) -> Net {
    let [a, b] = offers.map(offering);
    if secure {
        Net::new_secure(
            a,
            b,
            MS * 300,
            Faults::default(),
            seed,
            security_pair(Duration::from_secs(120)),
        )
    } else {
        Net::new(a, b, MS * 300, Faults::default(), seed)
    }
}

#[test]
fn offers_settle_on_the_same_agreement_on_both_sides_with_and_without_security() {
    let zstd = |log| Some(CompressionOffer::zstd(log));
    let agreed = |log: u32| {
        Some(Compression {
            algorithm: Algorithm::Zstd,
            max_block: 1 << log,
        })
    };
    for secure in [true, false] {
        for (seed, offers, expected) in [
            (1, [zstd(17), zstd(17)], agreed(17)),
            (2, [zstd(17), zstd(15)], agreed(15)),
            (3, [zstd(12), zstd(20)], agreed(12)),
            // A peer without an offer: no compression either way, the association forms.
            (4, [zstd(17), None], None),
            (5, [None, zstd(17)], None),
            (6, [None, None], None),
        ] {
            let mut n = pair(offers, secure, seed);
            establish_within_20s(&mut n);
            for side in 0..2 {
                assert_eq!(
                    n.ends[side].compression(),
                    expected,
                    "secure {secure}, offers {offers:?}, side {side}"
                );
            }
        }
    }
}

#[test]
fn the_compression_bit_of_a_flow_reaches_the_peer() {
    let offer = Some(CompressionOffer::zstd(17));
    let mut n = pair([offer, offer], true, 9);
    establish_within_20s(&mut n);
    for (port, bit) in [(1000, true), (1001, false)] {
        let m = pep_transport::FlowMeta {
            compression: bit,
            ..meta(port)
        };
        n.ends[0].open_flow(m).unwrap();
    }
    n.service(0);
    let mut seen = Vec::new();
    assert!(n.run_until(Duration::from_secs(5), |n| {
        n.apps[1]
            .flows
            .values()
            .filter(|f| f.meta.is_some())
            .count()
            == 2
    }));
    for f in n.apps[1].flows.values() {
        let m = f.meta.expect("meta");
        seen.push((m.client.port(), m.compression));
    }
    seen.sort();
    assert_eq!(seen, [(1000, true), (1001, false)]);
    assert!(n.apps[1]
        .events
        .iter()
        .any(|e| matches!(e, Event::FlowOpened { meta, .. } if meta.compression)));
}
