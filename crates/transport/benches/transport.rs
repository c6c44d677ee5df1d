//! CPU cost of the transport, without any I/O: two associations joined by a lossless,
//! zero-delay in-memory path. The figures bound what one core can push through the
//! protocol logic (framing, ACK processing, reassembly, copies) before sockets and syscalls.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pep_transport::codec::Reader;
use pep_transport::frame::{self, AckFrame, Frame};
use pep_transport::security::{
    public_key, stamp_initiation_macs, AeadOffer, LocalIdentity, PacketProtection, SecurityConfig,
};
use pep_transport::{
    Association, Config, DatagramEvent, Endpoint, EndpointConfig, FlowMeta, PeerId, PeerIdentity,
    ReadOutcome, Role, ENDPOINT_HANDSHAKE_BURST,
};

fn meta() -> FlowMeta {
    FlowMeta {
        client: "198.18.0.1:40000".parse().unwrap(),
        server: "198.19.0.1:80".parse().unwrap(),
        dscp: 0,
        compression: false,
    }
}

fn security(me: u8, peer: u8, aeads: AeadOffer) -> SecurityConfig {
    SecurityConfig {
        local_private_key: [me; 32],
        peer_public_key: public_key(&[peer; 32]),
        psk: None,
        rekey_interval: Duration::from_secs(120),
        rekey_after_packets: 1 << 30,
        aeads,
    }
}

/// Established pair: 10 Gb/s pacing so the pacer never holds the CPU-bound loop back.
fn pair() -> (Association, Association, Instant) {
    let now = Instant::now();
    let cfg = Config::for_rate(10_000_000_000);
    let a = Association::new(cfg.clone(), Role::Initiator, 1, now).unwrap();
    let b = Association::new(cfg, Role::Responder, 2, now).unwrap();
    establish(a, b, now)
}

/// The same, encrypted (Noise IK, then ChaCha20-Poly1305).
fn secure_pair() -> (Association, Association, Instant) {
    secure_pair_offering(AeadOffer::auto(false))
}

/// The same under AES-256-GCM, which both sides prefer when their CPUs have AES
/// instructions.
fn aes_pair() -> (Association, Association, Instant) {
    let (a, b, now) = secure_pair_offering(AeadOffer::auto(true));
    assert_eq!(a.stats().aead, Some(PacketProtection::Aes256Gcm));
    (a, b, now)
}

fn secure_pair_offering(aeads: AeadOffer) -> (Association, Association, Instant) {
    let now = Instant::now();
    let cfg = Config::for_rate(10_000_000_000);
    let a = Association::new_secure(
        cfg.clone(),
        Role::Initiator,
        1,
        now,
        security(1, 2, aeads),
        [1; 32],
    )
    .unwrap();
    let b = Association::new_secure(cfg, Role::Responder, 2, now, security(2, 1, aeads), [2; 32])
        .unwrap();
    establish(a, b, now)
}

fn establish(
    mut a: Association,
    mut b: Association,
    now: Instant,
) -> (Association, Association, Instant) {
    let mut buf = Vec::new();
    for _ in 0..4 {
        while a.poll_transmit(now, &mut buf) {
            b.handle_datagram(now, &buf);
        }
        while b.poll_transmit(now, &mut buf) {
            a.handle_datagram(now, &buf);
        }
    }
    assert!(a.is_established() && b.is_established());
    (a, b, now)
}

/// Sends `total` bytes on one flow from a to b; returns bytes received (for a sanity check).
fn transfer(a: &mut Association, b: &mut Association, mut now: Instant, total: usize) -> usize {
    let flow = a.open_flow(meta()).unwrap();
    let chunk = vec![0x5au8; 64 * 1024];
    let mut written = 0;
    let mut received = 0;
    let mut finished = false;
    let mut buf = Vec::with_capacity(2048);
    let mut to_b: VecDeque<Vec<u8>> = VecDeque::new();
    while received < total {
        while written < total {
            let n = a
                .write(flow, &chunk[..(total - written).min(chunk.len())])
                .unwrap();
            if n == 0 {
                break;
            }
            written += n;
        }
        if written == total && !finished {
            a.finish(flow).unwrap();
            finished = true;
        }
        while a.poll_transmit(now, &mut buf) {
            to_b.push_back(buf.clone());
        }
        while let Some(d) = to_b.pop_front() {
            b.handle_datagram(now, &d);
        }
        while let Ok(ReadOutcome::Data(bytes)) = b.read(flow, usize::MAX) {
            received += bytes.len();
        }
        while b.poll_transmit(now, &mut buf) {
            a.handle_datagram(now, &buf);
        }
        while b.poll_event().is_some() {}
        while a.poll_event().is_some() {}
        // Let timers (ACK delay, pacer) move on.
        let next = [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now);
        now = now.max(next).max(now + Duration::from_micros(1));
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
    received
}

fn bench_bulk(c: &mut Criterion) {
    const TOTAL: usize = 16 << 20;
    let mut g = c.benchmark_group("association");
    g.throughput(Throughput::Bytes(TOTAL as u64));
    g.sample_size(10);
    g.bench_function("bulk_16MiB_one_flow", |bch| {
        bch.iter_batched(
            pair,
            |(mut a, mut b, now)| assert_eq!(transfer(&mut a, &mut b, now, TOTAL), TOTAL),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("bulk_16MiB_one_flow_encrypted", |bch| {
        bch.iter_batched(
            secure_pair,
            |(mut a, mut b, now)| assert_eq!(transfer(&mut a, &mut b, now, TOTAL), TOTAL),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("bulk_16MiB_one_flow_encrypted_aes", |bch| {
        bch.iter_batched(
            aes_pair,
            |(mut a, mut b, now)| assert_eq!(transfer(&mut a, &mut b, now, TOTAL), TOTAL),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// What hostile datagrams cost an established, encrypted association.
fn bench_hostile(c: &mut Criterion) {
    let mut g = c.benchmark_group("hostile");
    let junk_short: Vec<u8> = (0..1200u32).map(|i| (i * 13) as u8 & 0x7f).collect();
    g.bench_function("junk_short_packet_1200B", |bch| {
        let (_, mut b, now) = secure_pair();
        bch.iter(|| b.handle_datagram(now, &junk_short));
    });
    g.finish();
}

/// A hub endpoint (key 2, one known terminal: key 1) and a genuine INIT of that terminal.
fn hub_endpoint_and_init() -> (Endpoint, Vec<u8>, Instant) {
    let now = Instant::now();
    let local = LocalIdentity {
        private_key: [2; 32],
        psk: None,
    };
    let mut hub = Endpoint::new(EndpointConfig::new(2), Some(local), [3; 32]).unwrap();
    hub.set_peers([(
        PeerId(1),
        PeerIdentity {
            public_key: Some(public_key(&[1; 32])),
            address: None,
        },
    )]);
    let cfg = Config::for_rate(10_000_000);
    let mut t = Association::new_secure(
        cfg,
        Role::Initiator,
        1,
        now,
        security(1, 2, AeadOffer::auto(false)),
        [1; 32],
    )
    .unwrap();
    let mut init = Vec::new();
    assert!(t.poll_transmit(now, &mut init));
    (hub, init, now)
}

/// What forged initiations cost a hub's endpoint once mac1 and the cookie screen them.
fn bench_endpoint_screening(c: &mut Criterion) {
    let mut g = c.benchmark_group("hostile");
    let from = "198.19.0.1:40000".parse().unwrap();
    g.bench_function("endpoint_initiation_bad_mac1", |bch| {
        let (mut hub, mut init, now) = hub_endpoint_and_init();
        let last = init.len() - 1;
        init[last - 16] ^= 1;
        bch.iter(|| assert!(hub.handle(now, from, &init).is_none()));
    });
    g.bench_function("endpoint_initiation_forged_dh_attempt", |bch| {
        // The Noise read of a forged initiation with a valid mac1, budget permitting.
        bch.iter_batched(
            || {
                let (hub, mut init, now) = hub_endpoint_and_init();
                init[10] ^= 1;
                stamp_initiation_macs(&mut init, &public_key(&[2; 32]), None);
                (hub, init, now)
            },
            |(mut hub, init, now)| assert!(hub.handle(now, from, &init).is_none()),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("endpoint_initiation_cookie_reply", |bch| {
        let (mut hub, mut init, now) = hub_endpoint_and_init();
        // Forged with the mac1 anyone who knows the hub's key can make; enough of them
        // (each a failed Diffie-Hellman) put the endpoint under load.
        init[10] ^= 1;
        stamp_initiation_macs(&mut init, &public_key(&[2; 32]), None);
        for i in 0..ENDPOINT_HANDSHAKE_BURST {
            init[11..15].copy_from_slice(&i.to_be_bytes());
            stamp_initiation_macs(&mut init, &public_key(&[2; 32]), None);
            hub.handle(now, from, &init);
        }
        bch.iter(|| {
            assert!(matches!(
                hub.handle(now, from, &init),
                Some(DatagramEvent::Response { .. })
            ))
        });
    });
    g.finish();
}

fn bench_codec(c: &mut Criterion) {
    let ack = AckFrame {
        ranges: (0..32u64).rev().map(|i| i * 10..i * 10 + 7).collect(),
        delay_us: 1234,
        received_us: None,
    };
    let mut encoded = Vec::new();
    frame::encode_ack(&mut encoded, &ack);
    let mut g = c.benchmark_group("codec");
    g.bench_function("decode_ack_32_ranges", |bch| {
        bch.iter(|| Frame::decode(&mut Reader::new(std::hint::black_box(&encoded))).unwrap())
    });
    g.bench_function("encode_ack_32_ranges", |bch| {
        let mut out = Vec::with_capacity(256);
        bch.iter(|| {
            out.clear();
            frame::encode_ack(&mut out, std::hint::black_box(&ack));
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_bulk,
    bench_codec,
    bench_hostile,
    bench_endpoint_screening
);
criterion_main!(benches);
