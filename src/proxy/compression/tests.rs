//! The relays against a peer that sends what it likes: a real driver and acceptor on a
//! runtime, with the peer played by a bare association in the test. A bomb, a raw block
//! and real zstd frames above the agreed size (the window both sides agreed on), and a
//! payload that is not zstd each reset their own flow, counted by reason, while a flow
//! beside them carries its bytes exactly both ways; a peer that agreed on no compression
//! but marks a flow compressed has that flow reset; one that offers nothing still gets its
//! flows relayed as they are.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pep_compress::{encode_block, Decoder, Level, MAX_RATIO};
use pep_transport::{
    Association, CompressionOffer, Config, Endpoint, EndpointConfig, Event, FlowId, FlowMeta,
    PeerId, PeerIdentity, ReadOutcome, ResetReason, Role,
};
use tokio::sync::{watch, Notify};

use super::*;
use crate::config::{FailMode, OverLimit, PeerSpec};
use crate::proxy::acceptor::UpstreamAcceptor;
use crate::proxy::live::Live;
use crate::proxy::upstream::UpstreamOptions;
use crate::sys::notify::Notifier;
use crate::tunnel::driver::{AssocFactory, Driver, TunnelSocket};
use crate::tunnel::gateway::Gateway;
use crate::tunnel::memory::MemoryAccount;
use crate::tunnel::peer::{Peer, PeerCounters};
use crate::tunnel::peer_table::{PeerSettings, PeerTable};

const BLOCK: usize = 1 << pep_compress::OFFERED_BLOCK_LOG;

/// What the upstream server got, one entry per connection that ended (pepd connects from
/// its own address, so the test tells flows apart by their content).
type Received = Arc<Mutex<Vec<Vec<u8>>>>;

/// A TCP server on loopback that keeps what each connection sends and answers, once the
/// client half-closes, with `reply`.
fn upstream(reply: Vec<u8>) -> (SocketAddr, Received) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let at = l.local_addr().expect("addr");
    let got: Received = Arc::default();
    let keep = got.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let keep = keep.clone();
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                if c.read_to_end(&mut all).is_ok() {
                    let _ = c.write_all(&reply);
                }
                keep.lock().expect("lock").push(all);
            });
        }
    });
    (at, got)
}

/// The daemon's side: a driver serving one peer at `theirs`, offering `offer`, whose flows
/// the real acceptor connects and relays. Returns its address and the peer's counters.
fn daemon(
    rt: &tokio::runtime::Runtime,
    theirs: SocketAddr,
    offer: Option<CompressionOffer>,
    stop: watch::Receiver<bool>,
) -> (SocketAddr, Arc<Peer>) {
    let mut cfg = Config::for_rate(100_000_000);
    cfg.compression = offer;
    rt.block_on(async {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("udp");
        let ours = socket.local_addr().expect("addr");
        let mut endpoint = Endpoint::new(EndpointConfig::new(0), None, [7; 32]).expect("ep");
        endpoint.set_peers([(
            PeerId(0),
            PeerIdentity {
                public_key: None,
                address: Some(theirs),
            },
        )]);
        let factory = AssocFactory {
            peers: [(
                PeerId(0),
                PeerSettings {
                    config: cfg.clone(),
                    security: None,
                },
            )]
            .into_iter()
            .collect::<HashMap<_, _>>(),
            role: Role::Responder,
            epoch: 1,
            redundant: false,
            hubs: None,
        };
        let (_, assoc) = factory
            .make(&mut endpoint, Instant::now(), PeerId(0))
            .expect("association");
        let wake = Arc::new(Notify::new());
        let memory = Arc::new(MemoryAccount::new(1 << 30, 0, 0));
        let peer = Arc::new(Peer::new(
            PeerId(0),
            "peer",
            Some(assoc),
            1 << 28,
            memory.clone(),
            wake.clone(),
        ));
        let spec = PeerSpec {
            name: "peer".into(),
            public_key: None,
            address: Some(theirs),
            subnets: vec!["0.0.0.0/0".parse().expect("net")],
            tx_bps: 100_000_000,
            rx_bps: 100_000_000,
            min_bps: 0,
            weight: 1,
            keepalive: Duration::from_secs(5),
            max_flows: 100,
        };
        let gateway = Arc::new(Gateway::new(
            PeerTable::new(vec![peer.clone()], vec![spec]),
            0,
            wake,
            memory,
            100,
        ));
        let live = Live {
            over_limit: OverLimit::Refuse,
            fail: FailMode::Closed,
            upstream: UpstreamOptions {
                mark: 0,
                transparent_source: false,
                connect_timeout: Duration::from_secs(2),
            },
            idle: None,
            stalled_flow_timeout: None,
            draining: false,
        };
        let acceptor = Arc::new(UpstreamAcceptor {
            live: Arc::new(RwLock::new(live)),
            gateway: gateway.clone(),
            runtime: tokio::runtime::Handle::current(),
            compression: Some(Arc::new(Scope {
                ports: vec![],
                prefixes: vec![],
            })),
        });
        let driver = Driver::new(
            gateway,
            0,
            TunnelSocket::new(socket).expect("socket"),
            endpoint,
            factory,
            None,
            acceptor,
            Notifier,
        );
        tokio::spawn(driver.run(stop));
        (ours, peer)
    })
}

/// The test's side of the association, moved by hand over a UDP socket.
struct Remote {
    assoc: Association,
    socket: std::net::UdpSocket,
    daemon: SocketAddr,
    out: Vec<u8>,
    buf: Vec<u8>,
    received: BTreeMap<FlowId, Vec<u8>>,
    finished: BTreeMap<FlowId, bool>,
    resets: BTreeMap<FlowId, ResetReason>,
}

impl Remote {
    fn new(offer: Option<CompressionOffer>) -> Remote {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        socket
            .set_read_timeout(Some(Duration::from_millis(2)))
            .expect("timeout");
        let mut cfg = Config::for_rate(100_000_000);
        cfg.compression = offer;
        Remote {
            assoc: Association::new(cfg, Role::Initiator, 2, Instant::now()).expect("assoc"),
            socket,
            daemon: "127.0.0.1:1".parse().expect("addr"),
            out: Vec::new(),
            buf: vec![0; 65_536],
            received: BTreeMap::new(),
            finished: BTreeMap::new(),
            resets: BTreeMap::new(),
        }
    }

    fn step(&mut self) {
        let now = Instant::now();
        if self.assoc.poll_timeout().is_some_and(|t| t <= now) {
            self.assoc.handle_timeout(now);
        }
        while self.assoc.poll_transmit(now, &mut self.out) {
            let _ = self.socket.send_to(&self.out, self.daemon);
        }
        if let Ok((n, _)) = self.socket.recv_from(&mut self.buf) {
            self.assoc.handle_datagram(Instant::now(), &self.buf[..n]);
        }
        while let Some(ev) = self.assoc.poll_event() {
            if let Event::FlowReset { flow, reason } = ev {
                self.resets.insert(flow, reason);
            }
        }
        let flows: Vec<FlowId> = self.received.keys().copied().collect();
        for f in flows {
            loop {
                match self.assoc.read(f, 1 << 20) {
                    Ok(ReadOutcome::Data(b)) => {
                        self.received.entry(f).or_default().extend_from_slice(&b)
                    }
                    Ok(ReadOutcome::Finished) => {
                        self.finished.insert(f, true);
                        break;
                    }
                    _ => break,
                }
            }
        }
    }

    fn run_until(&mut self, limit: Duration, done: impl Fn(&Remote) -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            self.step();
            if done(self) {
                return true;
            }
        }
        false
    }

    /// Opens a flow to `server` and writes `stream` (all of it: the send buffer holds it),
    /// then FIN.
    fn open(&mut self, server: SocketAddr, port: u16, compression: bool, stream: &[u8]) -> FlowId {
        let meta = FlowMeta {
            client: SocketAddr::from(([198, 18, 0, 2], port)),
            server,
            dscp: 0,
            compression,
        };
        let f = self.assoc.open_flow(meta).expect("open");
        assert_eq!(self.assoc.write(f, stream), Ok(stream.len()));
        self.assoc.finish(f).expect("finish");
        self.received.insert(f, Vec::new());
        f
    }
}

fn text(len: usize, tag: &str) -> Vec<u8> {
    let mut v = format!("{tag}\n").into_bytes();
    let mut i = 0u64;
    while v.len() < len {
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let line = format!("{tag} line {} of a log that repeats {}\n", i >> 50, i >> 60);
        v.extend_from_slice(line.as_bytes());
    }
    v.truncate(len);
    v
}

fn zstd_header(length: usize, size: usize) -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend_from_slice(&(length as u32).to_be_bytes());
    b.extend_from_slice(&(size as u32).to_be_bytes());
    b
}

fn decode(stream: &[u8]) -> Vec<u8> {
    let mut d = Decoder::new(BLOCK);
    let mut out = Vec::new();
    d.feed(Bytes::copy_from_slice(stream), &mut |b: Bytes| {
        out.extend_from_slice(&b)
    })
    .expect("the daemon's blocks decode");
    d.finish().expect("on a block boundary");
    out
}

#[test]
fn a_bomb_an_oversized_block_and_garbage_reset_only_their_own_flows() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let reply = text(300_000, "reply");
    let (server, got) = upstream(reply.clone());
    let offer = Some(CompressionOffer::zstd(pep_compress::OFFERED_BLOCK_LOG));
    let mut remote = Remote::new(offer);
    let (stop, stop_rx) = watch::channel(false);
    let (ours, peer) = daemon(
        &rt,
        remote.socket.local_addr().expect("addr"),
        offer,
        stop_rx,
    );
    remote.daemon = ours;
    assert!(remote.run_until(Duration::from_secs(5), |r| r.assoc.compression().is_some()));

    // The good flow: 400 KB of text in blocks of every kind.
    let good_plain = text(400_000, "good");
    let mut good = Vec::new();
    for (i, c) in good_plain.chunks(100_000).enumerate() {
        let level = [
            None,
            Some(Level::Fast),
            Some(Level::Hard),
            Some(Level::Fast),
        ][i];
        encode_block(c, level, &mut good);
    }
    // A bomb: a real zstd frame of a whole block of zeros, announced at a block's size,
    // its payload far below a block / MAX_RATIO.
    let mut padded = Vec::new();
    encode_block(&vec![0u8; BLOCK], Some(Level::Hard), &mut padded);
    let payload = &padded[pep_compress::ZSTD_HEADER..];
    // Our encoder pads such a block to the ratio with a skippable frame: without it, the
    // zstd frame alone is the bomb.
    let skippable = payload
        .windows(4)
        .position(|w| w == 0x184D_2A50u32.to_le_bytes())
        .expect("padded");
    let frame = &payload[..skippable];
    assert!(frame.len() * MAX_RATIO < BLOCK);
    let mut bomb = zstd_header(frame.len(), BLOCK);
    bomb.extend_from_slice(frame);
    // A raw block one byte above the agreed size.
    let mut oversized = vec![0u8];
    oversized.extend_from_slice(&((BLOCK + 1) as u32).to_be_bytes());
    oversized.extend_from_slice(&vec![b'x'; BLOCK + 1]);
    // Real zstd frames of two blocks' worth of text in one block: over the agreed window,
    // however well it would decode.
    let mut frames = Vec::new();
    for part in text(2 * BLOCK, "window").chunks(BLOCK) {
        let mut b = Vec::new();
        assert_eq!(
            encode_block(part, Some(Level::Fast), &mut b),
            pep_compress::BlockKind::Zstd
        );
        frames.extend_from_slice(&b[pep_compress::ZSTD_HEADER..]);
    }
    let mut over_window = zstd_header(frames.len(), 2 * BLOCK);
    over_window.extend_from_slice(&frames);
    // A zstd block whose payload is not zstd.
    let mut garbage = zstd_header(4000, 16_000);
    garbage.extend_from_slice(&text(4000, "garbage"));

    let g = remote.open(server, 1000, true, &good);
    let bad: Vec<(FlowId, &str)> = [
        (1001, bomb, "over_ratio"),
        (1002, oversized, "over_block"),
        (1003, garbage, "corrupt"),
        (1004, over_window, "over_block"),
    ]
    .into_iter()
    .map(|(port, stream, reason)| (remote.open(server, port, true, &stream), reason))
    .collect();

    let done = remote.run_until(Duration::from_secs(20), |r| {
        r.finished.get(&g) == Some(&true) && bad.iter().all(|(f, _)| r.resets.contains_key(f))
    });
    let _ = stop.send(true);
    rt.shutdown_timeout(Duration::from_secs(1));
    assert!(
        done,
        "resets {:?}, good finished {:?}",
        remote.resets,
        remote.finished.get(&g)
    );
    for (f, reason) in &bad {
        assert_eq!(
            remote.resets.get(f),
            Some(&ResetReason::Protocol),
            "{reason}"
        );
    }
    assert!(
        !remote.resets.contains_key(&g),
        "the good flow was not reset"
    );
    // The good flow's bytes reached the server exactly, and its reply came back in blocks
    // that decode to it exactly.
    let all = got.lock().expect("lock").clone();
    assert!(
        all.contains(&good_plain),
        "the server got the good flow's bytes"
    );
    assert_eq!(decode(&remote.received[&g]), reply);
    // The first block of a direction is always a sample at the fast level; whether later
    // ones are compressed depends on what limits the flow (here the CPU, on loopback).
    let c = &peer.counters.compression;
    assert!(
        PeerCounters::get(&c.sent_fast) >= 1,
        "the sample was compressed"
    );
    assert!(
        remote.received[&g].len() < reply.len(),
        "the reply shrank: {} bytes for {}",
        remote.received[&g].len(),
        reply.len()
    );
    let refused: BTreeMap<&str, u64> = pep_compress::BlockError::REASONS
        .iter()
        .zip(&c.refused)
        .map(|(r, n)| (*r, PeerCounters::get(n)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        refused,
        [("corrupt", 1), ("over_block", 2), ("over_ratio", 1)]
            .into_iter()
            .collect()
    );
    assert_eq!(
        PeerCounters::get(&c.plain_received),
        good_plain.len() as u64
    );
    assert_eq!(PeerCounters::get(&c.plain_sent), reply.len() as u64);
    assert_eq!(
        PeerCounters::get(&c.blocks_sent),
        remote.received[&g].len() as u64
    );
}

#[test]
fn without_an_agreement_compressed_flows_are_refused_and_plain_ones_relayed() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let reply = text(50_000, "reply");
    let (server, got) = upstream(reply.clone());
    // The peer offers nothing (it predates compression, or has it off); the daemon offers.
    let mut remote = Remote::new(None);
    let (stop, stop_rx) = watch::channel(false);
    let offer = Some(CompressionOffer::zstd(pep_compress::OFFERED_BLOCK_LOG));
    let (ours, peer) = daemon(
        &rt,
        remote.socket.local_addr().expect("addr"),
        offer,
        stop_rx,
    );
    remote.daemon = ours;
    assert!(remote.run_until(Duration::from_secs(5), |r| r.assoc.is_established()));
    assert_eq!(remote.assoc.compression(), None);
    let plain = text(80_000, "plain");
    let p = remote.open(server, 2000, false, &plain);
    let mut block = Vec::new();
    encode_block(b"marked compressed", None, &mut block);
    let marked = remote.open(server, 2001, true, &block);
    let done = remote.run_until(Duration::from_secs(20), |r| {
        r.finished.get(&p) == Some(&true) && r.resets.contains_key(&marked)
    });
    let _ = stop.send(true);
    rt.shutdown_timeout(Duration::from_secs(1));
    assert!(
        done,
        "received {} of {}, finished {:?}, resets {:?}, server got {:?}",
        remote.received[&p].len(),
        reply.len(),
        remote.finished,
        remote.resets,
        got.lock()
            .expect("lock")
            .iter()
            .map(Vec::len)
            .collect::<Vec<_>>()
    );
    assert_eq!(remote.received[&p], reply, "relayed as it is, no blocks");
    assert!(got.lock().expect("lock").contains(&plain));
    assert_eq!(remote.resets.get(&marked), Some(&ResetReason::Protocol));
    let not_agreed = pep_compress::BlockError::REASONS
        .iter()
        .position(|r| *r == "not_agreed")
        .expect("reason");
    assert_eq!(
        PeerCounters::get(&peer.counters.compression.refused[not_agreed]),
        1
    );
}
