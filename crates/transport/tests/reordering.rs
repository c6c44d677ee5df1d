//! A repair that arrives after the receiver already holds its bytes and has moved far on
//! (its original came late, overtaken by the data sent after it) must be read at its own
//! offset, not at one a truncation window away.

use std::time::{Duration, Instant};

use pep_transport::{Association, Config, Event, FlowMeta, ReadOutcome, Role};

/// Everything `a` sends over the next 20 ms, its timers fired as they come due.
fn send_all(a: &mut Association, now: &mut Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for _ in 0..100 {
        *now += Duration::from_micros(200);
        if a.poll_timeout().is_some_and(|t| t <= *now) {
            a.handle_timeout(*now);
        }
        while a.poll_transmit(*now, &mut buf) {
            out.push(buf.clone());
        }
    }
    out
}

fn deliver(to: &mut Association, now: Instant, datagrams: &[Vec<u8>]) {
    for d in datagrams {
        to.handle_datagram(now, d);
    }
}

fn stream(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn a_late_repair_of_bytes_already_held_is_read_at_its_own_offset() {
    let mut now = Instant::now();
    let cfg = || Config::for_rate(100_000_000);
    let mut a = Association::new(cfg(), Role::Initiator, 1, now).unwrap();
    let mut b = Association::new(cfg(), Role::Responder, 2, now).unwrap();
    for _ in 0..4 {
        let d = send_all(&mut a, &mut now);
        deliver(&mut b, now, &d);
        let d = send_all(&mut b, &mut now);
        deliver(&mut a, now, &d);
    }
    assert!(a.is_established() && b.is_established());
    let data = stream(120_000);
    let meta = FlowMeta {
        client: "198.18.0.1:1000".parse().unwrap(),
        server: "198.19.0.1:80".parse().unwrap(),
        dscp: 0,
        compression: false,
    };
    let flow = a.open_flow(meta).unwrap();
    let mut written = 0;
    let mut write = |a: &mut Association, upto: usize| {
        while written < upto {
            written += a.write(flow, &data[written..upto]).unwrap();
        }
    };
    let exchange = |a: &mut Association, b: &mut Association, now: &mut Instant| {
        let d = send_all(a, now);
        deliver(b, *now, &d);
        let d = send_all(b, now);
        deliver(a, *now, &d);
    };
    // A first batch, all delivered and acknowledged.
    write(&mut a, 20_000);
    exchange(&mut a, &mut b, &mut now);
    exchange(&mut a, &mut b, &mut now);
    // The second batch's first packet is held back; the rest arrives and is acknowledged,
    // so the sender takes the held one for lost and repairs it.
    write(&mut a, 40_000);
    let mut batch = send_all(&mut a, &mut now);
    let original = batch.remove(0);
    deliver(&mut b, now, &batch);
    let acks = send_all(&mut b, &mut now);
    let retransmitted = a.stats().stream_bytes_retransmitted;
    deliver(&mut a, now, &acks);
    let mut repair = send_all(&mut a, &mut now);
    assert!(a.stats().stream_bytes_retransmitted > retransmitted);
    let repair = repair.remove(0);
    // The original arrives late after all, and so does everything sent next: the receiver
    // moves on by more than half a 2-byte offset's window before the repair arrives.
    deliver(&mut b, now, &[original]);
    write(&mut a, 80_000);
    for _ in 0..6 {
        exchange(&mut a, &mut b, &mut now);
    }
    deliver(&mut b, now, &[repair]);
    write(&mut a, data.len());
    for _ in 0..20 {
        exchange(&mut a, &mut b, &mut now);
    }
    let mut received = Vec::new();
    while let Some(ev) = b.poll_event() {
        if let Event::FlowOpened { flow, .. } = ev {
            while let Ok(ReadOutcome::Data(bytes)) = b.read(flow, usize::MAX) {
                received.extend_from_slice(&bytes);
            }
        }
    }
    assert_eq!(received.len(), data.len());
    let altered = received.iter().zip(&data).position(|(r, d)| r != d);
    assert_eq!(
        altered, None,
        "the stream arrived altered from this offset on"
    );
}
