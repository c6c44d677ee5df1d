//! Test network: two associations joined by an in-memory path with configurable faults, and
//! a small application on each side that sends scripted bytes and records what arrives.
#![allow(dead_code)]

pub mod endpoints;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use pep_transport::packet::{LONG_HEADER_BIT, LONG_TYPE_HANDSHAKE_INIT, LONG_TYPE_HANDSHAKE_REPLY};
use pep_transport::security::{public_key, SecurityConfig};
use pep_transport::{Association, Config, Event, FlowId, FlowMeta, ReadOutcome, ResetReason, Role};

#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    /// Probability a datagram is held back by up to `reorder_by`.
    pub reorder: f64,
    pub reorder_by: Duration,
    /// Probability a datagram loses a random-length tail.
    pub truncate: f64,
}

/// Scripted application state of one flow at one end.
#[derive(Debug, Default, Clone)]
pub struct FlowApp {
    pub to_send: Vec<u8>,
    pub written: usize,
    /// Half-close after `to_send` is written.
    pub finish: bool,
    pub finished: bool,
    /// Bytes to send only once the peer's FIN has arrived (the half-close probe).
    pub reply_after_fin: Option<Vec<u8>>,
    pub received: Vec<u8>,
    pub fin_received: bool,
    pub reset: Option<ResetReason>,
    pub closed: bool,
    /// Stop reading (a slow consumer).
    pub paused: bool,
    pub meta: Option<FlowMeta>,
}

#[derive(Default)]
pub struct App {
    pub flows: BTreeMap<FlowId, FlowApp>,
    pub events: Vec<Event>,
    /// Reply script for flows the peer opens: (bytes to send, finish).
    pub on_open: Option<(Vec<u8>, bool, Option<Vec<u8>>)>,
}

impl App {
    /// Takes the association's events into the script's state.
    pub fn drain_events(&mut self, assoc: &mut Association) {
        while let Some(ev) = assoc.poll_event() {
            let app = &mut *self;
            match &ev {
                Event::FlowOpened { flow, meta } => {
                    let (to_send, finish, reply) = app.on_open.clone().unwrap_or_default();
                    // Ids restart with a new association: a FlowOpened is always a new flow.
                    app.flows.insert(
                        *flow,
                        FlowApp {
                            meta: Some(*meta),
                            to_send,
                            finish,
                            reply_after_fin: reply,
                            ..Default::default()
                        },
                    );
                }
                Event::FlowReset { flow, reason } => {
                    app.flows.entry(*flow).or_default().reset = Some(*reason);
                }
                Event::FlowClosed { flow } => {
                    app.flows.entry(*flow).or_default().closed = true;
                }
                _ => {}
            }
            app.events.push(ev);
        }
    }

    /// Writes what the script has to write and reads what there is to read.
    pub fn io(&mut self, assoc: &mut Association) {
        let ids: Vec<FlowId> = self.flows.keys().copied().collect();
        for id in ids {
            let f = self.flows.get_mut(&id).unwrap();
            if f.reset.is_some() || f.closed {
                continue;
            }
            while f.written < f.to_send.len() {
                match assoc.write(id, &f.to_send[f.written..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => f.written += n,
                }
            }
            if f.written == f.to_send.len() && f.finish && !f.finished && assoc.finish(id).is_ok() {
                f.finished = true;
            }
            if f.paused {
                continue;
            }
            loop {
                match assoc.read(id, 64 * 1024) {
                    Ok(ReadOutcome::Data(b)) => f.received.extend_from_slice(&b),
                    Ok(ReadOutcome::Finished) => {
                        if !f.fin_received {
                            f.fin_received = true;
                            if let Some(reply) = f.reply_after_fin.take() {
                                f.to_send.extend_from_slice(&reply);
                                f.finish = true;
                            }
                        }
                        break;
                    }
                    Ok(ReadOutcome::Blocked) | Err(_) => break,
                }
            }
        }
    }
}

/// Decides whether the path loses a datagram: (sending side, bytes) -> drop it.
pub type DropFilter = Box<dyn FnMut(usize, &[u8]) -> bool>;

/// A datagram on the path: (arrival, sequence, destination side, bytes).
type InFlight = (Instant, u64, usize, Vec<u8>);

pub struct Net {
    pub base: Instant,
    pub now: Instant,
    pub ends: [Association; 2],
    pub apps: [App; 2],
    pub delay: Duration,
    pub faults: Faults,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: u64,
    /// Every datagram side 0 sent, if recording.
    pub record_a: Option<Vec<Vec<u8>>>,
    /// Links down until this time.
    pub down_until: Option<Instant>,
    /// Every datagram side 1 sent, if recording.
    pub record_b: Option<Vec<Vec<u8>>>,
    /// Drops a datagram on the path when it returns true: (sending side, bytes).
    pub drop_filter: Option<DropFilter>,
    /// Per-side security settings when the ends are secure (used again on restart).
    pub security: Option<[SecurityConfig; 2]>,
}

/// Matching security settings for the two ends (side 0's key, side 1's key).
pub fn security_pair(rekey_interval: Duration) -> [SecurityConfig; 2] {
    let keys = [[0x11u8; 32], [0x22u8; 32]];
    let cfg = |me: usize| SecurityConfig {
        local_private_key: keys[me],
        peer_public_key: public_key(&keys[1 - me]),
        psk: Some([0x33; 32]),
        rekey_interval,
        rekey_after_packets: 1 << 30,
        aeads: pep_transport::security::AeadOffer::auto(false),
    };
    [cfg(0), cfg(1)]
}

pub fn meta(port: u16) -> FlowMeta {
    FlowMeta {
        client: format!("198.18.0.1:{port}").parse().unwrap(),
        server: "198.19.0.1:80".parse().unwrap(),
        dscp: 0,
        compression: false,
    }
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn test_config(rate_bps: u64) -> Config {
    let mut c = Config::for_rate(rate_bps);
    c.initial_rtt = Duration::from_millis(200);
    c
}

impl Net {
    pub fn new(cfg_a: Config, cfg_b: Config, delay: Duration, faults: Faults, seed: u64) -> Self {
        let base = Instant::now();
        Net {
            base,
            now: base,
            ends: [
                Association::new(cfg_a, Role::Initiator, seed.wrapping_mul(31) | 1, base).unwrap(),
                Association::new(cfg_b, Role::Responder, seed.wrapping_mul(37) | 2, base).unwrap(),
            ],
            apps: [App::default(), App::default()],
            delay,
            faults,
            queue: BinaryHeap::new(),
            seq: 0,
            rng: seed | 1,
            record_a: None,
            down_until: None,
            record_b: None,
            drop_filter: None,
            security: None,
        }
    }

    /// Like `new`, with Noise security on both ends.
    pub fn new_secure(
        cfg_a: Config,
        cfg_b: Config,
        delay: Duration,
        faults: Faults,
        seed: u64,
        security: [SecurityConfig; 2],
    ) -> Self {
        let mut n = Net::new(cfg_a.clone(), cfg_b.clone(), delay, faults, seed);
        let base = n.base;
        n.ends = [
            Association::new_secure(
                cfg_a,
                Role::Initiator,
                seed.wrapping_mul(31) | 1,
                base,
                security[0].clone(),
                [seed as u8; 32],
            )
            .unwrap(),
            Association::new_secure(
                cfg_b,
                Role::Responder,
                seed.wrapping_mul(37) | 2,
                base,
                security[1].clone(),
                [seed as u8 ^ 0xff; 32],
            )
            .unwrap(),
        ];
        n.security = Some(security);
        n
    }

    /// Hands a datagram straight to one end, as if it had just arrived.
    pub fn inject(&mut self, to: usize, datagram: &[u8]) {
        self.ends[to].handle_datagram(self.now, datagram);
        self.service(to);
    }

    fn rand(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }

    /// Replaces one end with a fresh association (a gateway restart).
    pub fn restart(&mut self, side: usize, cfg: Config, epoch: u64) {
        let role = if side == 0 {
            Role::Initiator
        } else {
            Role::Responder
        };
        self.ends[side] = match &self.security {
            Some(sec) => Association::new_secure(
                cfg,
                role,
                epoch,
                self.now,
                sec[side].clone(),
                [epoch as u8; 32],
            )
            .unwrap(),
            None => Association::new(cfg, role, epoch, self.now).unwrap(),
        };
        self.apps[side].flows.clear();
    }

    pub fn open(&mut self, side: usize, port: u16, data: Vec<u8>, finish: bool) -> FlowId {
        let id = self.ends[side].open_flow(meta(port)).unwrap();
        self.apps[side].flows.insert(
            id,
            FlowApp {
                to_send: data,
                finish,
                meta: Some(meta(port)),
                ..Default::default()
            },
        );
        self.service(side);
        id
    }

    fn send_datagram(&mut self, from: usize, d: Vec<u8>) {
        if let Some(rec) = self.record_a.as_mut().filter(|_| from == 0) {
            rec.push(d.clone());
        }
        if let Some(rec) = self.record_b.as_mut().filter(|_| from == 1) {
            rec.push(d.clone());
        }
        if self.down_until.is_some_and(|t| self.now < t) {
            return;
        }
        if let Some(f) = self.drop_filter.as_mut() {
            if f(from, &d) {
                return;
            }
        }
        if self.rand() < self.faults.loss {
            return;
        }
        let copies = if self.rand() < self.faults.duplicate {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut d = d.clone();
            if self.rand() < self.faults.truncate && d.len() > 1 {
                let keep = 1 + (self.rand() * (d.len() - 1) as f64) as usize;
                d.truncate(keep);
            }
            let mut at = self.now + self.delay;
            if self.rand() < self.faults.reorder {
                at += self.faults.reorder_by.mul_f64(self.rand());
            }
            self.seq += 1;
            self.queue.push(Reverse((at, self.seq, 1 - from, d)));
        }
    }

    /// Application I/O and transmission for one side.
    pub fn service(&mut self, side: usize) {
        for _ in 0..4 {
            self.drain_events(side);
            self.app_io(side);
        }
        let mut buf = Vec::new();
        while self.ends[side].poll_transmit(self.now, &mut buf) {
            let d = buf.clone();
            self.send_datagram(side, d);
        }
        self.drain_events(side);
    }

    fn drain_events(&mut self, side: usize) {
        self.apps[side].drain_events(&mut self.ends[side]);
    }

    fn app_io(&mut self, side: usize) {
        self.apps[side].io(&mut self.ends[side]);
    }

    /// Advances to the next event and processes it. Returns false when nothing is pending.
    pub fn step(&mut self) -> bool {
        let Some(next) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(next);
        while let Some(Reverse((t, ..))) = self.queue.peek() {
            if *t > self.now {
                break;
            }
            let Reverse((_, _, to, d)) = self.queue.pop().unwrap();
            self.ends[to].handle_datagram(self.now, &d);
            self.service(to);
        }
        for side in 0..2 {
            if self.ends[side]
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.ends[side].handle_timeout(self.now);
            }
            self.service(side);
        }
        true
    }

    /// Processes every event due by `at`, then stands at `at` (a step may overshoot a limit
    /// when the next event is a timer far ahead).
    pub fn run_to(&mut self, at: Instant) {
        while self.next_event().is_some_and(|t| t <= at) && self.step() {}
        self.now = self.now.max(at);
    }

    /// When the next timer fires or datagram arrives.
    fn next_event(&self) -> Option<Instant> {
        let timers = [self.ends[0].poll_timeout(), self.ends[1].poll_timeout()];
        let next_dgram = self.queue.peek().map(|Reverse((t, ..))| *t);
        timers.iter().flatten().copied().chain(next_dgram).min()
    }

    /// Steps until `done` holds or `limit` of simulated time passes; returns whether done.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    pub fn established(&self) -> bool {
        self.ends[0].is_established() && self.ends[1].is_established()
    }
}

pub fn fin_at(n: &Net, side: usize, f: FlowId) -> bool {
    n.apps[side].flows.get(&f).is_some_and(|x| x.fin_received)
}

/// Simulated times at which side 1's received byte count grew, during one bulk flow.
pub fn bulk_with_progress(n: &mut Net, bytes: usize) -> (Vec<(Duration, usize)>, Vec<u8>) {
    let data = pattern(4, bytes);
    let f = n.open(0, 1002, data.clone(), true);
    let mut progress = Vec::new();
    let mut last = 0;
    let end = n.now + Duration::from_secs(120);
    while n.now < end && !fin_at(n, 1, f) {
        if !n.step() {
            break;
        }
        let got = n.apps[1].flows.get(&f).map_or(0, |x| x.received.len());
        if got != last {
            progress.push((n.elapsed(), got));
            last = got;
        }
    }
    assert!(fin_at(n, 1, f), "bulk transfer did not finish");
    assert_eq!(n.apps[1].flows[&f].received, data);
    (progress, data)
}

/// A secure pair over a 600 ms round trip (GEO), 20 Mb/s.
pub fn geo_secure(faults: Faults, seed: u64, rekey: Duration) -> Net {
    Net::new_secure(
        test_config(20_000_000),
        test_config(20_000_000),
        Duration::from_millis(300),
        faults,
        seed,
        security_pair(rekey),
    )
}

pub fn establish_within_20s(n: &mut Net) {
    assert!(
        n.run_until(Duration::from_secs(20), |n| n.established()),
        "no association"
    );
}

/// First byte of a Noise handshake initiation and reply.
pub const INIT: u8 = LONG_HEADER_BIT | LONG_TYPE_HANDSHAKE_INIT;
pub const REPLY: u8 = LONG_HEADER_BIT | LONG_TYPE_HANDSHAKE_REPLY;
