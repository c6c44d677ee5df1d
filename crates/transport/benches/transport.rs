//! CPU cost of the transport, without any I/O: two associations joined by a lossless,
//! zero-delay in-memory path. The figures bound what one core can push through the
//! protocol logic (framing, ACK processing, reassembly, copies) before sockets and syscalls.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pep_transport::codec::Reader;
use pep_transport::frame::{self, AckFrame, Frame};
use pep_transport::{Association, Config, FlowMeta, ReadOutcome, Role};

fn meta() -> FlowMeta {
    FlowMeta {
        client: "198.18.0.1:40000".parse().unwrap(),
        server: "198.19.0.1:80".parse().unwrap(),
        dscp: 0,
    }
}

/// Established pair: 10 Gb/s pacing so the pacer never holds the CPU-bound loop back.
fn pair() -> (Association, Association, Instant) {
    let now = Instant::now();
    let cfg = Config::for_rate(10_000_000_000);
    let mut a = Association::new(cfg.clone(), Role::Initiator, 1, now).unwrap();
    let mut b = Association::new(cfg, Role::Responder, 2, now).unwrap();
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
    g.finish();
}

fn bench_codec(c: &mut Criterion) {
    let ack = AckFrame {
        ranges: (0..32u64).rev().map(|i| i * 10..i * 10 + 7).collect(),
        delay_us: 1234,
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

criterion_group!(benches, bench_bulk, bench_codec);
criterion_main!(benches);
