//! Writes the seed corpora of the `decoder` and `receive` targets from a real paired run:
//! `cargo run --example seed_corpus -- <fuzz dir>` (stable Rust is enough). The `config`
//! seeds are copies of config/terminal.toml and config/hub.toml.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pep_transport::frame::Frame;
use pep_transport::packet::{parse_packet, Header};
use pepd_fuzz::{op, Pair};

/// A short name for what a datagram carries, so one seed of each kind is kept.
fn kind(d: &[u8]) -> String {
    match parse_packet(d) {
        Ok((Header::Hello(h), _)) => format!("hello-{}", if h.established { "est" } else { "new" }),
        Ok((Header::Short(s), frames)) => {
            let mut k = String::from(if s.implicit_data.is_some() {
                "implicit"
            } else {
                "short"
            });
            for f in frames.iter().take(3) {
                k.push('-');
                k.push_str(match f {
                    Frame::Padding => "pad",
                    Frame::Ping => "ping",
                    Frame::Ack(a) if a.has_holes() => "snack",
                    Frame::Ack(_) => "ack",
                    Frame::FlowOpen { .. } => "open",
                    Frame::Data { fin: true, .. } => "datafin",
                    Frame::Data { .. } => "data",
                    Frame::FlowReset { .. } => "reset",
                    Frame::FlowCredit { .. } => "credit",
                    Frame::AssocCredit { .. } => "assoccredit",
                    Frame::Close { .. } => "close",
                    Frame::StreamSnack { .. } => "streamsnack",
                });
            }
            k
        }
        Ok((_, _)) => "handshake".into(),
        Err(e) => panic!("captured datagram does not parse: {e}"),
    }
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

fn main() {
    let fuzz_dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let corpus = fuzz_dir.join("corpus");

    // A run that touches most frame kinds: data both ways, a loss, a reset, a close.
    let mut p = Pair::recording();
    p.deliver_all();
    for _ in 0..6 {
        p.next_timer();
        p.deliver_all();
    }
    p.app_action(1, 255); // B writes 10 KB more on its flow: credit updates follow
    p.app_action(0, 255); // A answers on B's flow
    p.next_timer();
    // Lose one of B's datagrams in the middle: A's ACKs then name a hole.
    if p.pool.len() > 2 {
        p.pool.remove(1);
    }
    p.deliver_all();
    for _ in 0..10 {
        p.next_timer();
        p.deliver_all();
    }
    p.app_action(7, 0); // B resets its flow
    p.deliver_all();
    p.next_timer();
    p.deliver_all();
    p.app_action(10, 0); // A closes the association
    p.deliver_all();

    let mut by_kind: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (_, d) in p.record.take().unwrap() {
        // Keep the smallest of each kind: small seeds mutate faster.
        let e = by_kind.entry(kind(&d)).or_insert_with(|| d.clone());
        if d.len() < e.len() {
            *e = d;
        }
    }
    for (k, d) in &by_kind {
        // Cap big data packets: the tail adds bytes, not coverage.
        let d = if d.len() > 300 && k.starts_with("implicit") {
            &d[..300]
        } else {
            &d[..]
        };
        write(&corpus.join("decoder"), k, d);
    }

    // receive scripts; pool indices refer to the fresh pair's pool (B's first datagrams).
    let rx = corpus.join("receive");
    write(
        &rx,
        "flush-timers",
        &[op::FLUSH, op::TIMER, op::FLUSH, op::TIMER, op::FLUSH],
    );
    write(
        &rx,
        "reorder",
        &[
            op::REPLAY,
            2,
            op::REPLAY,
            0,
            op::REPLAY,
            1,
            op::TIMER,
            op::FLUSH,
        ],
    );
    write(
        &rx,
        "replay-dup",
        &[
            op::REPLAY,
            0,
            op::REPLAY,
            0,
            op::ADVANCE,
            0x03,
            0xe8,
            op::FLUSH,
        ],
    );
    write(
        &rx,
        "mutate",
        &[
            op::MUTATE,
            1,
            2,
            0,
            0,
            1,
            0xff,
            5,
            0,
            7,
            0x10,
            op::FLUSH,
            op::TIMER,
        ],
    );
    write(
        &rx,
        "app-actions",
        &[
            op::APP,
            1,
            40,
            op::APP,
            6,
            0,
            op::FLUSH,
            op::APP,
            7,
            0,
            op::TIMER,
            op::FLUSH,
        ],
    );
    write(
        &rx,
        "outage",
        &[
            op::ADVANCE,
            0x75,
            0x30,
            op::TIMER,
            op::ADVANCE,
            0xea,
            0x60,
            op::FLUSH,
        ],
    );
    // Real datagrams of other kinds, inline as made-up ones and spliced onto B's headers.
    let mut raw = Vec::new();
    for (k, d) in &by_kind {
        if k.starts_with("hello")
            || k.contains("reset")
            || k.contains("credit")
            || k.contains("close")
        {
            raw.push(op::RAW);
            raw.extend_from_slice(&(d.len() as u16).to_be_bytes());
            raw.extend_from_slice(d);
        }
    }
    raw.push(op::FLUSH);
    write(&rx, "raw-captured", &raw);
    let mut splice = Vec::new();
    for d in by_kind
        .values()
        .filter(|d| d.len() < 200 && d[0] & 0x80 == 0)
    {
        let hl = 1 + usize::from((d[0] >> 5) & 3) + 1;
        splice.extend_from_slice(&[op::SPLICE, 3, (d.len() - hl) as u8]);
        splice.extend_from_slice(&d[hl..]);
    }
    splice.push(op::FLUSH);
    write(&rx, "splice-frames", &splice);
    println!(
        "{} decoder seeds: {:?}",
        by_kind.len(),
        by_kind.keys().collect::<Vec<_>>()
    );
}
