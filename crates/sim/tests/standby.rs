//! A hub of 8,000 terminals fails, and a standby with the same key and peers takes its
//! address: every terminal must be associated with the standby within 10 s of the failure,
//! under the handshake budgets and cookies an endpoint has. Simulated time over a fixed GEO
//! delay; the hub runs 4 shards (workers) as pepd does, each with its own endpoint, sharing
//! one replay memory. The carrier's rate is not modelled. Its own test binary, run by
//! scripts/sim-acceptance.sh (`cargo test -p pep-sim --release --test standby -- --ignored
//! --nocapture` prints the figures): it takes longer than the test suite's budget allows.

mod common;

use common::{hub_addr, terminal_key, HUB_KEY};

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::packet::shard_of;
use pep_transport::security::{public_key, LocalIdentity, SecurityConfig};
use pep_transport::{
    AssocHandle, Association, Config, DatagramEvent, Endpoint, EndpointConfig, EndpointStats,
    Event, FlowMeta, Initiate, PeerId, PeerIdentity, ReadOutcome, Role,
};

const TERMINALS: usize = 8000;
/// Terminals that send a request every [`REQUEST_EVERY`]; the others only keep alive.
const BUSY: usize = 2000;
const REQUEST_EVERY: Duration = Duration::from_secs(2);
const REQUEST_BYTES: usize = 1000;
const SHARDS: usize = 4;
const SHARD_BITS: u8 = 2;
/// One way, terminal to hub, as through a GEO satellite.
const DELAY: Duration = Duration::from_millis(300);
/// From the failure until the standby holds the address: VRRPv3 with `advert_int 0.5`.
const TAKEOVER: Duration = Duration::from_millis(1800);
const BOUND: Duration = Duration::from_secs(10);
const HUB: usize = 0;

fn terminal_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([198, 18, 16 + (i >> 8) as u8, i as u8], 7400))
}

fn security(local: [u8; 32], peer: [u8; 32]) -> SecurityConfig {
    SecurityConfig {
        local_private_key: local,
        peer_public_key: public_key(&peer),
        psk: None,
        rekey_interval: Duration::from_secs(3600),
        rekey_after_packets: 1 << 40,
        aeads: pep_transport::security::AeadOffer::auto(false),
    }
}

/// One gateway: its endpoints (one per shard) and the associations it keeps.
struct Node {
    addr: SocketAddr,
    endpoints: Vec<Endpoint>,
    assocs: BTreeMap<(usize, AssocHandle), Association>,
    key: [u8; 32],
    peer_keys: HashMap<PeerId, [u8; 32]>,
    config: Config,
    role: Role,
    epoch: u64,
    /// Where the initiations of each peer came from (a hub learns its terminals' addresses
    /// from them), so their copies go to the shard that owns the peer, as pepd hands them.
    initiators: HashMap<SocketAddr, PeerId>,
    /// Bytes this gateway sent and received.
    sent_bytes: u64,
    received_bytes: u64,
}

impl Node {
    fn hub(epoch: u64, hints: bool) -> Self {
        let identity = LocalIdentity {
            private_key: HUB_KEY,
            psk: None,
        };
        let memory = pep_transport::security::InitiationMemory::default();
        let endpoints = (0..SHARDS)
            .map(|shard| {
                let mut cfg = EndpointConfig::new(2);
                cfg.shard_bits = SHARD_BITS;
                cfg.shard = shard as u8;
                cfg.shards = SHARDS as u8;
                cfg.hints = hints;
                let mut seed = [shard as u8; 32];
                seed[..8].copy_from_slice(&epoch.to_be_bytes());
                let mut e = Endpoint::new(cfg, Some(identity.clone()), seed).unwrap();
                e.set_peers((1..=TERMINALS).map(|i| {
                    let identity = PeerIdentity {
                        public_key: Some(public_key(&terminal_key(i))),
                        address: None,
                    };
                    (PeerId(i as u32), identity)
                }));
                e.use_initiation_memory(memory.clone());
                e
            })
            .collect();
        let mut config = Config::for_rate(2_000_000);
        // Both hubs serve with one key: only the terminals start handshakes.
        config.initiate = Initiate::RekeyOnly;
        Node {
            addr: hub_addr(),
            endpoints,
            assocs: BTreeMap::new(),
            key: HUB_KEY,
            peer_keys: (1..=TERMINALS)
                .map(|i| (PeerId(i as u32), terminal_key(i)))
                .collect(),
            config,
            role: Role::Responder,
            epoch,
            initiators: HashMap::new(),
            sent_bytes: 0,
            received_bytes: 0,
        }
    }

    fn terminal(i: usize) -> Self {
        let identity = LocalIdentity {
            private_key: terminal_key(i),
            psk: None,
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let mut e = Endpoint::new(EndpointConfig::new(0), Some(identity), seed).unwrap();
        let hub = PeerIdentity {
            public_key: Some(public_key(&HUB_KEY)),
            address: Some(hub_addr()),
        };
        e.set_peers([(PeerId(0), hub)]);
        Node {
            addr: terminal_addr(i),
            endpoints: vec![e],
            assocs: BTreeMap::new(),
            key: terminal_key(i),
            peer_keys: [(PeerId(0), HUB_KEY)].into_iter().collect(),
            config: Config::for_rate(2_000_000),
            role: Role::Initiator,
            epoch: 5000 + i as u64,
            initiators: HashMap::new(),
            sent_bytes: 0,
            received_bytes: 0,
        }
    }

    fn associate(&mut self, now: Instant, shard: usize, peer: PeerId) -> Option<AssocHandle> {
        let sec = security(self.key, *self.peer_keys.get(&peer)?);
        let (h, a) = self.endpoints[shard]
            .new_association(
                now,
                peer,
                self.config.clone(),
                self.role,
                self.epoch,
                Some(sec),
            )
            .ok()?;
        self.assocs.insert((shard, h), a);
        Some(h)
    }

    fn endpoint_stats(&self) -> EndpointStats {
        let mut t = EndpointStats::default();
        for e in &self.endpoints {
            let s = e.stats();
            t.hints_sent += s.hints_sent;
            t.hints_rate_limited += s.hints_rate_limited;
            t.cookies_sent += s.cookies_sent;
            t.unknown_cid += s.unknown_cid;
            t.security.handshake_rate_limited += s.security.handshake_rate_limited;
        }
        t
    }
}

/// The shard an initiation from `from` is read by, as the kernel's reuseport hash picks a
/// socket.
fn reader_of(from: SocketAddr) -> usize {
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(from);
    (h % SHARDS as u64) as usize
}

enum Ev {
    Start(usize),
    Request(usize),
    Datagram {
        from: SocketAddr,
        to: usize,
        bytes: Vec<u8>,
    },
    Timer {
        node: usize,
        key: (usize, AssocHandle),
    },
}

type Queued = common::Queued<Ev>;

struct Sim {
    base: Instant,
    now: Instant,
    nodes: Vec<Node>,
    /// Whether the hub's address answers: false between the failure and the takeover.
    hub_up: bool,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    armed: HashMap<(usize, (usize, AssocHandle)), Instant>,
    /// When each terminal was first established: with the first hub, then after the
    /// failure with the standby (its association restarted on the standby's epoch).
    reassociated: Vec<Option<Instant>>,
    /// Terminals marked in `reassociated`.
    marked: usize,
    failed: bool,
    hints_on_standby: bool,
}

impl Sim {
    fn new(hints: bool) -> Self {
        let base = Instant::now();
        let mut nodes = vec![Node::hub(1000, hints)];
        nodes.extend((1..=TERMINALS).map(Node::terminal));
        let mut sim = Sim {
            base,
            now: base,
            nodes,
            hub_up: true,
            queue: BinaryHeap::new(),
            seq: 0,
            armed: HashMap::new(),
            reassociated: vec![None; TERMINALS + 1],
            marked: 0,
            failed: false,
            hints_on_standby: hints,
        };
        // Starts spread over 5 s, so keepalives are out of phase as in a running network.
        for i in 1..=TERMINALS {
            let at = base + Duration::from_secs(5) * i as u32 / TERMINALS as u32;
            sim.push(at, Ev::Start(i));
            if i <= BUSY {
                sim.push(at + Duration::from_secs(6), Ev::Request(i));
            }
        }
        sim
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn send(&mut self, from: usize, to: SocketAddr, bytes: Vec<u8>) {
        self.nodes[from].sent_bytes += bytes.len() as u64;
        let to = if to == hub_addr() {
            HUB
        } else {
            // Terminal addresses are dense: 198.18.16.0 + i.
            let ip = match to.ip() {
                std::net::IpAddr::V4(v4) => u32::from(v4),
                std::net::IpAddr::V6(_) => return,
            };
            (ip - u32::from(std::net::Ipv4Addr::new(198, 18, 16, 0))) as usize
        };
        let from = self.nodes[from].addr;
        self.push(self.now + DELAY, Ev::Datagram { from, to, bytes });
    }

    /// The application of one association: the hub reads each request and ends its side;
    /// a terminal reads the end.
    fn app(a: &mut Association, hub: bool) {
        let mut readable = Vec::new();
        while let Some(ev) = a.poll_event() {
            if let Event::FlowOpened { flow, .. } | Event::FlowReadable { flow } = ev {
                readable.push(flow);
            }
        }
        for flow in readable {
            loop {
                match a.read(flow, 64 * 1024) {
                    Ok(ReadOutcome::Data(_)) => {}
                    Ok(ReadOutcome::Finished) => {
                        if hub {
                            let _ = a.finish(flow);
                        }
                        break;
                    }
                    Ok(ReadOutcome::Blocked) | Err(_) => break,
                }
            }
        }
    }

    fn service(&mut self, node: usize, key: (usize, AssocHandle)) {
        let now = self.now;
        let Some(a) = self.nodes[node].assocs.get_mut(&key) else {
            return;
        };
        Self::app(a, node == HUB);
        let mut out = Vec::new();
        let mut sent = Vec::new();
        while let Some(to) = a.poll_transmit_to(now, &mut out) {
            sent.push((to, out.clone()));
        }
        Self::app(a, node == HUB);
        let timeout = a.poll_timeout();
        if node != HUB
            && self.reassociated[node].is_none()
            && a.is_established()
            && (!self.failed || a.stats().peer_restarts > 0)
        {
            self.reassociated[node] = Some(now);
            self.marked += 1;
        }
        for (to, d) in sent {
            self.send(node, to, d);
        }
        if let Some(t) = timeout {
            if self.armed.insert((node, key), t) != Some(t) {
                self.push(t.max(now), Ev::Timer { node, key });
            }
        }
    }

    fn deliver(&mut self, to: usize, from: SocketAddr, d: &[u8]) {
        if to == HUB && !self.hub_up {
            return;
        }
        let now = self.now;
        self.nodes[to].received_bytes += d.len() as u64;
        let node = &mut self.nodes[to];
        let reader = if to == HUB {
            match shard_of(d, 2, SHARD_BITS) {
                Some(shard) => shard,
                None => match node.initiators.get(&from) {
                    Some(peer) => peer.0 as usize % SHARDS,
                    None => reader_of(from),
                },
            }
        } else {
            0
        };
        let key = match node.endpoints[reader].handle(now, from, d) {
            None => return,
            Some(DatagramEvent::Routed(h)) => {
                if let Some(a) = node.assocs.get_mut(&(reader, h)) {
                    a.handle_datagram_from(now, from, d);
                }
                (reader, h)
            }
            Some(DatagramEvent::Initiation {
                peer,
                handle,
                accepted,
            }) => {
                // Handed to the shard that owns the peer, as pepd's workers do.
                let owner = if to == HUB {
                    peer.0 as usize % SHARDS
                } else {
                    0
                };
                node.initiators.insert(from, peer);
                let handle = if owner == reader {
                    handle
                } else {
                    node.endpoints[owner].adopt_initiation(peer, &accepted);
                    node.endpoints[owner].association_of(peer)
                };
                let Some(h) = handle.or_else(|| node.associate(now, owner, peer)) else {
                    return;
                };
                if let Some(a) = node.assocs.get_mut(&(owner, h)) {
                    a.accept_initiation(now, from, accepted);
                }
                (owner, h)
            }
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                self.send(to, destination, datagram);
                return;
            }
        };
        self.service(to, key);
    }

    fn step(&mut self) -> bool {
        let Some(Reverse(q)) = self.queue.pop() else {
            return false;
        };
        self.now = self.now.max(q.at);
        match q.ev {
            Ev::Start(i) => {
                let now = self.now;
                let h = self.nodes[i].associate(now, 0, PeerId(0)).unwrap();
                self.service(i, (0, h));
            }
            Ev::Request(i) => {
                let key = self.nodes[i].assocs.keys().next().copied();
                if let Some(key) = key {
                    let a = self.nodes[i].assocs.get_mut(&key).unwrap();
                    let meta = FlowMeta {
                        client: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 40000)),
                        server: "198.19.0.1:80".parse().unwrap(),
                        dscp: 0,
                        compression: false,
                    };
                    if a.is_established() {
                        if let Ok(flow) = a.open_flow(meta) {
                            let _ = a.write(flow, &[0x5a; REQUEST_BYTES]);
                            let _ = a.finish(flow);
                        }
                    }
                    self.service(i, key);
                }
                self.push(self.now + REQUEST_EVERY, Ev::Request(i));
            }
            Ev::Datagram { from, to, bytes } => self.deliver(to, from, &bytes),
            Ev::Timer { node, key } => {
                if self.armed.get(&(node, key)) != Some(&q.at) {
                    return true;
                }
                self.armed.remove(&(node, key));
                let now = self.now;
                if let Some(a) = self.nodes[node].assocs.get_mut(&key) {
                    if a.poll_timeout().is_some_and(|t| t <= now) {
                        a.handle_timeout(now);
                    }
                }
                self.service(node, key);
            }
        }
        true
    }

    fn run_until(&mut self, end: Instant, mut done: impl FnMut(&Sim) -> bool) -> bool {
        while self.now < end {
            if done(self) {
                return true;
            }
            if self.queue.peek().is_none_or(|Reverse(q)| q.at > end) {
                self.now = end;
                break;
            }
            self.step();
        }
        done(self)
    }

    fn terminal_stats(&self, i: usize) -> Option<(bool, u64)> {
        let a = self.nodes[i].assocs.values().next()?;
        Some((a.is_established(), a.stats().peer_restarts))
    }

    /// Every terminal established: with the first hub, or after the failure with the
    /// standby.
    fn all_marked(&self) -> bool {
        self.marked == TERMINALS
    }

    /// The hub fails: nothing answers at its address until the standby takes it.
    fn fail(&mut self) {
        self.hub_up = false;
        self.armed.retain(|(node, _), _| *node != HUB);
        self.nodes[HUB] = Node::hub(2000, self.hints_on_standby);
        self.reassociated = vec![None; TERMINALS + 1];
        self.marked = 0;
        self.failed = true;
    }
}

struct Outcome {
    all_within_bound: bool,
    took: Vec<Duration>,
    restarted_twice: usize,
    /// Associations the standby holds established at the end.
    held: usize,
    standby: EndpointStats,
    standby_sent: u64,
    standby_received: u64,
    acted: u64,
    /// The slowest terminal's association: what it went through.
    slowest: String,
    elapsed_wall: Duration,
}

fn run(hints: bool) -> Outcome {
    let wall = std::time::Instant::now();
    let mut sim = Sim::new(hints);
    let setup_end = sim.base + Duration::from_secs(20);
    assert!(
        sim.run_until(setup_end, Sim::all_marked),
        "{} of {TERMINALS} associated at first",
        sim.marked
    );
    // Into the steady state: requests flowing, keepalives spread.
    let t_fail = sim.now + Duration::from_secs(7);
    sim.run_until(t_fail, |_| false);
    sim.fail();
    let takeover = t_fail + TAKEOVER;
    sim.run_until(takeover, |_| false);
    sim.hub_up = true;
    let end = t_fail + BOUND;
    let all_within_bound = sim.run_until(end, Sim::all_marked);
    let standby_sent = sim.nodes[HUB].sent_bytes;
    let standby_received = sim.nodes[HUB].received_bytes;
    // What was not done by then, given more time, for the figures; then the standby's
    // side confirmed too.
    sim.run_until(t_fail + Duration::from_secs(40), Sim::all_marked);
    let confirm = sim.now + DELAY * 2;
    sim.run_until(confirm, |_| false);
    let held = sim.nodes[HUB]
        .assocs
        .values()
        .filter(|a| a.is_established())
        .count();
    let took: Vec<Duration> = (1..=TERMINALS)
        .map(|i| match sim.terminal_stats(i) {
            Some((true, 1)) => sim.reassociated[i].map_or(Duration::MAX, |t| t - t_fail),
            _ => Duration::MAX,
        })
        .collect();
    let restarted_twice = (1..=TERMINALS)
        .filter(|&i| sim.terminal_stats(i).is_some_and(|(_, r)| r > 1))
        .count();
    let acted = (1..=TERMINALS)
        .filter_map(|i| sim.nodes[i].assocs.values().next())
        .map(|a| a.stats().hints.acted)
        .sum();
    let slowest = (1..=TERMINALS)
        .max_by_key(|&i| took[i - 1])
        .and_then(|i| {
            let s = sim.nodes[i].assocs.values().next()?.stats();
            Some(format!(
                "terminal {i}{}: outages {}, hints {:?}, handshakes {}",
                if i <= BUSY { " (busy)" } else { " (idle)" },
                s.outages,
                s.hints,
                s.handshakes_completed
            ))
        })
        .unwrap_or_default();
    Outcome {
        slowest,
        all_within_bound,
        took,
        restarted_twice,
        held,
        standby: sim.nodes[HUB].endpoint_stats(),
        standby_sent,
        standby_received,
        acted,
        elapsed_wall: wall.elapsed(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The figures of one run, on one line, and its slowest re-association.
fn report(label: &str, o: &Outcome) -> (String, Duration) {
    let mut took = o.took.clone();
    took.sort();
    let (p50, p90, max) = (
        percentile(&took, 0.5),
        percentile(&took, 0.9),
        *took.last().unwrap(),
    );
    let s = &o.standby;
    let line = format!(
        "standby-sim {label}: terminals={TERMINALS} busy={BUSY} shards={SHARDS} \
         takeover_s={:.1} reassociated_p50_s={:.2} p90_s={:.2} max_s={:.2} \
         hints_sent={} hints_rate_limited={} hints_acted={} cookies_sent={} \
         handshakes_rate_limited={} standby_bytes_in={} standby_bytes_out={} wall_s={:.1}",
        TAKEOVER.as_secs_f64(),
        p50.as_secs_f64(),
        p90.as_secs_f64(),
        max.as_secs_f64(),
        s.hints_sent,
        s.hints_rate_limited,
        o.acted,
        s.cookies_sent,
        s.security.handshake_rate_limited,
        o.standby_received,
        o.standby_sent,
        o.elapsed_wall.as_secs_f64(),
    );
    (format!("{line}\n  slowest: {}", o.slowest), max)
}

#[test]
#[ignore = "45 to 100 s in release on a shared 2-core host: scripts/sim-acceptance.sh runs it"]
fn eight_thousand_terminals_move_to_a_standby_within_10_s() {
    let with = run(true);
    let (with_line, max) = report("hints", &with);
    eprintln!("{with_line}");
    let without = run(false);
    let (without_line, _) = report("no-hints", &without);
    eprintln!("{without_line}");
    assert!(
        with.all_within_bound,
        "not every terminal on the standby within {BOUND:?}: slowest {max:?}"
    );
    assert!(max <= BOUND, "{max:?}");
    assert_eq!(with.restarted_twice, 0);
    assert_eq!(with.held, TERMINALS, "the standby holds every association");
    // Until then, the standby sent less than it received.
    assert!(
        with.standby_sent < with.standby_received,
        "{} B out, {} B in",
        with.standby_sent,
        with.standby_received
    );
    // For scripts/sim-acceptance.sh, once every bound held.
    println!("{with_line}");
    println!("{without_line}");
}
