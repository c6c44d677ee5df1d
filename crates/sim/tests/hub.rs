//! One hub endpoint and 1,000 terminals, each terminal with its own endpoint and association
//! to the hub, over a fixed GEO delay in simulated time: what an idle association costs the
//! hub, how fast every terminal re-associates after a hub restart, and how fast under a
//! flood of forged initiations. The carrier's rate is not modelled (idle terminals send a
//! few small datagrams; the fair share is the scheduler's own tests'). Its own test binary,
//! so the counting allocator sees only this test.

mod common;

use common::{hub_addr, terminal_key, HUB_KEY};

use std::alloc::{GlobalAlloc, Layout, System};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use pep_transport::security::{public_key, stamp_initiation_macs, LocalIdentity, SecurityConfig};
use pep_transport::{
    AssocHandle, Association, Config, DatagramEvent, Endpoint, EndpointConfig, PeerId,
    PeerIdentity, Role,
};

struct CountingAlloc;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, AtomicOrdering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, AtomicOrdering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn live() -> isize {
    LIVE.load(AtomicOrdering::Relaxed)
}

const TERMINALS: usize = 1000;
const HUB: usize = 0;
/// One way, terminal to hub, as through a GEO satellite.
const DELAY: Duration = Duration::from_millis(300);
/// Forged initiations per 10 ms of the flood: 100,000 per second.
const FLOOD_PER_TICK: u32 = 1000;
const TICK: Duration = Duration::from_millis(10);

fn terminal_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([198, 18, 4 + (i >> 8) as u8, i as u8], 7400))
}

/// Where forged initiation `n` claims to come from: nobody receives there.
fn spoofed(n: u32) -> SocketAddr {
    SocketAddr::from(([198, 19, (n >> 8) as u8, n as u8], 1024 + (n >> 16) as u16))
}

fn config() -> Config {
    Config::for_rate(2_000_000)
}

/// One gateway: its endpoint and the associations it keeps.
struct Node {
    addr: SocketAddr,
    endpoint: Endpoint,
    assocs: BTreeMap<AssocHandle, Association>,
    key: [u8; 32],
    peer_keys: HashMap<PeerId, [u8; 32]>,
    role: Role,
    epoch: u64,
}

impl Node {
    fn new(
        addr: SocketAddr,
        cid_len: u8,
        key: [u8; 32],
        peers: Vec<(PeerId, [u8; 32], Option<SocketAddr>)>,
        role: Role,
        epoch: u64,
    ) -> Self {
        let identity = LocalIdentity {
            private_key: key,
            psk: None,
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&epoch.to_be_bytes());
        let mut endpoint = Endpoint::new(EndpointConfig::new(cid_len), Some(identity), seed)
            .expect("a valid endpoint");
        endpoint.set_peers(peers.iter().map(|&(id, k, address)| {
            (
                id,
                PeerIdentity {
                    public_key: Some(public_key(&k)),
                    address,
                },
            )
        }));
        Node {
            addr,
            endpoint,
            assocs: BTreeMap::new(),
            key,
            peer_keys: peers
                .into_iter()
                .map(|(id, k, _)| (id, public_key(&k)))
                .collect(),
            role,
            epoch,
        }
    }

    fn associate(&mut self, now: Instant, peer: PeerId) -> Option<AssocHandle> {
        let security = SecurityConfig {
            local_private_key: self.key,
            peer_public_key: *self.peer_keys.get(&peer)?,
            psk: None,
            rekey_interval: Duration::from_secs(3600),
            rekey_after_packets: 1 << 40,
            aeads: pep_transport::security::AeadOffer::auto(false),
        };
        let (h, a) = self
            .endpoint
            .new_association(now, peer, config(), self.role, self.epoch, Some(security))
            .ok()?;
        self.assocs.insert(h, a);
        Some(h)
    }

    fn established(&self) -> usize {
        self.assocs.values().filter(|a| a.is_established()).count()
    }
}

fn hub(epoch: u64) -> Node {
    let peers = (1..=TERMINALS)
        .map(|i| (PeerId(i as u32), terminal_key(i), None))
        .collect();
    Node::new(hub_addr(), 2, HUB_KEY, peers, Role::Responder, epoch)
}

enum Ev {
    Datagram {
        from: SocketAddr,
        to: usize,
        bytes: Vec<u8>,
    },
    Timer {
        node: usize,
        handle: AssocHandle,
    },
    Flood,
}

type Queued = common::Queued<Ev>;

struct Sim {
    base: Instant,
    now: Instant,
    nodes: Vec<Node>,
    by_addr: HashMap<SocketAddr, usize>,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    /// The timer each association has in the queue, so stale ones are skipped.
    armed: HashMap<(usize, AssocHandle), Instant>,
    /// A genuine INIT, the template of forged ones; flooding while set.
    flood: Option<Vec<u8>>,
    forged: u32,
    /// COOKIEs that reached a terminal.
    cookies_received: u64,
}

impl Sim {
    fn new() -> Self {
        let base = Instant::now();
        let mut nodes = vec![hub(1000)];
        for i in 1..=TERMINALS {
            let mut t = Node::new(
                terminal_addr(i),
                0,
                terminal_key(i),
                vec![(PeerId(0), HUB_KEY, Some(hub_addr()))],
                Role::Initiator,
                5000 + i as u64,
            );
            t.associate(base, PeerId(0))
                .expect("the terminal's association");
            nodes.push(t);
        }
        let by_addr = nodes.iter().enumerate().map(|(i, n)| (n.addr, i)).collect();
        let mut sim = Sim {
            base,
            now: base,
            nodes,
            by_addr,
            queue: BinaryHeap::new(),
            seq: 0,
            armed: HashMap::new(),
            flood: None,
            forged: 0,
            cookies_received: 0,
        };
        for node in 1..=TERMINALS {
            let handles: Vec<AssocHandle> = sim.nodes[node].assocs.keys().copied().collect();
            for h in handles {
                sim.service(node, h);
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

    fn send(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        // Spoofed sources receive nothing.
        if let Some(&to) = self.by_addr.get(&to) {
            self.cookies_received += u64::from(bytes[0] == 0x84);
            self.push(self.now + DELAY, Ev::Datagram { from, to, bytes });
        }
    }

    /// Transmissions of one association, its events drained and its timer armed.
    fn service(&mut self, node: usize, h: AssocHandle) {
        let now = self.now;
        let from = self.nodes[node].addr;
        let Some(a) = self.nodes[node].assocs.get_mut(&h) else {
            return;
        };
        let mut out = Vec::new();
        let mut sent = Vec::new();
        while let Some(to) = a.poll_transmit_to(now, &mut out) {
            sent.push((to, out.clone()));
        }
        while a.poll_event().is_some() {}
        let timeout = a.poll_timeout();
        for (to, d) in sent {
            self.send(from, to, d);
        }
        if let Some(t) = timeout {
            if self.armed.insert((node, h), t) != Some(t) {
                self.push(t.max(now), Ev::Timer { node, handle: h });
            }
        }
    }

    fn deliver(&mut self, to: usize, from: SocketAddr, d: &[u8]) {
        let now = self.now;
        let node = &mut self.nodes[to];
        let handle = match node.endpoint.handle(now, from, d) {
            None => return,
            Some(DatagramEvent::Routed(h)) => {
                if let Some(a) = node.assocs.get_mut(&h) {
                    a.handle_datagram_from(now, from, d);
                }
                h
            }
            Some(DatagramEvent::Initiation {
                peer,
                handle,
                accepted,
            }) => {
                let Some(h) = handle.or_else(|| node.associate(now, peer)) else {
                    return;
                };
                if let Some(a) = node.assocs.get_mut(&h) {
                    a.accept_initiation(now, from, accepted);
                }
                h
            }
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                let addr = node.addr;
                self.send(addr, destination, datagram);
                return;
            }
        };
        self.service(to, handle);
    }

    /// One tick's forged initiations: fresh ephemerals, the mac1 of the hub's public key
    /// (the worst case: the attacker knows it), each from another address.
    fn flood_tick(&mut self) {
        let Some(template) = self.flood.clone() else {
            return;
        };
        let hub_public = public_key(&HUB_KEY);
        let mut d = template;
        for _ in 0..FLOOD_PER_TICK {
            self.forged += 1;
            // type, version, scid_len 0, then the ephemeral key.
            d[6..10].copy_from_slice(&self.forged.to_be_bytes());
            stamp_initiation_macs(&mut d, &hub_public, None);
            let now = self.now;
            if let Some(DatagramEvent::Response {
                destination,
                datagram,
            }) = self.nodes[HUB]
                .endpoint
                .handle(now, spoofed(self.forged), &d)
            {
                self.send(hub_addr(), destination, datagram);
            }
        }
        self.push(self.now + TICK, Ev::Flood);
    }

    fn step(&mut self) -> bool {
        let Some(Reverse(q)) = self.queue.pop() else {
            return false;
        };
        self.now = self.now.max(q.at);
        match q.ev {
            Ev::Datagram { from, to, bytes } => self.deliver(to, from, &bytes),
            Ev::Timer { node, handle } => {
                if self.armed.get(&(node, handle)) != Some(&q.at) {
                    return true;
                }
                self.armed.remove(&(node, handle));
                let now = self.now;
                if let Some(a) = self.nodes[node].assocs.get_mut(&handle) {
                    if a.poll_timeout().is_some_and(|t| t <= now) {
                        a.handle_timeout(now);
                    }
                }
                self.service(node, handle);
            }
            Ev::Flood => self.flood_tick(),
        }
        true
    }

    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            if !self.step() {
                break;
            }
        }
        done(self)
    }

    fn run_for(&mut self, d: Duration) {
        self.run_until(d, |_| false);
    }

    /// Every terminal's association established with the hub, and the hub's with each,
    /// after `restarts` hub restarts (each one a peer restart seen by every terminal).
    fn all_associated(&self, restarts: u64) -> bool {
        self.nodes[HUB].established() == TERMINALS
            && self.nodes[1..].iter().all(|t| {
                t.assocs
                    .values()
                    .all(|a| a.is_established() && a.stats().peer_restarts == restarts)
            })
    }

    /// The hub process ends: its endpoint and associations are gone, datagrams to it keep
    /// arriving. A new one with a new epoch takes its place.
    fn restart_hub(&mut self, epoch: u64) {
        self.armed.retain(|(node, _), _| *node != HUB);
        self.nodes[HUB] = hub(epoch);
    }

    fn elapsed(&self) -> Duration {
        self.now - self.base
    }
}

#[test]
fn thousand_terminals_idle_memory_restart_and_flood() {
    let mut sim = Sim::new();
    let first_init = {
        // The first datagram terminal 1 sent is its INIT, still in the queue.
        let q = sim
            .queue
            .iter()
            .find_map(|Reverse(q)| match &q.ev {
                Ev::Datagram { from, bytes, .. } if *from == terminal_addr(1) => {
                    Some(bytes.clone())
                }
                _ => None,
            })
            .expect("terminal 1's INIT");
        assert_eq!(q[0], 0x82);
        q
    };
    assert!(
        sim.run_until(Duration::from_secs(10), |s| s.all_associated(0)),
        "{} of {TERMINALS} associated at first",
        sim.nodes[HUB].established()
    );
    let first = sim.elapsed();

    // Idle for a minute: keepalives only.
    sim.run_for(Duration::from_secs(60));
    assert!(sim.all_associated(0));
    let assocs = std::mem::take(&mut sim.nodes[HUB].assocs);
    let before = live();
    drop(assocs);
    let per_association = (before - live()) as usize / TERMINALS;
    let before = live();
    sim.restart_hub(2000);
    let whole_hub_freed = before - live();
    eprintln!(
        "{TERMINALS} terminals associated in {first:?}; idle hub association: {per_association} B \
         of heap each; the hub endpoint with its peer table (fixed): {} B more than a fresh one",
        whole_hub_freed
    );
    assert!(
        per_association <= 64 << 10,
        "{per_association} B per idle association"
    );

    // After a hub restart, every terminal notices its keepalive going unanswered and
    // initiates again.
    let restart = sim.now;
    assert!(
        sim.run_until(Duration::from_secs(10), |s| s.all_associated(1)),
        "{} of {TERMINALS} re-associated within 10 s of a hub restart",
        sim.nodes[HUB].established()
    );
    let restart_took = sim.now - restart;
    let s = sim.nodes[HUB].endpoint.stats();
    eprintln!("hub restart: all re-associated in {restart_took:?}; hub endpoint {s:?}");

    // Again, under 100,000 forged initiations per second from as many addresses.
    sim.run_for(Duration::from_secs(30));
    sim.restart_hub(3000);
    sim.flood = Some(first_init);
    sim.flood_tick();
    let restart = sim.now;
    let done = sim.run_until(Duration::from_secs(30), |s| s.all_associated(2));
    let flood_took = sim.now - restart;
    let s = sim.nodes[HUB].endpoint.stats();
    eprintln!(
        "hub restart under a flood of {} forged initiations: re-associated {done} in \
         {flood_took:?}, {} cookies to terminals; hub endpoint {s:?}",
        sim.forged, sim.cookies_received
    );
    assert!(
        done,
        "{} of {TERMINALS} re-associated within 30 s under the flood",
        sim.nodes[HUB].established()
    );
    // The terminals came in by the cookie path; the flood got cookies too, and what work
    // it did get was bounded by the budget.
    assert!(sim.cookies_received > 0 && s.cookies_sent > sim.cookies_received);
    let secs = flood_took.as_secs_f64().ceil() as u64 + 1;
    assert!(
        s.security.handshake_invalid
            <= u64::from(pep_transport::ENDPOINT_HANDSHAKE_BURST)
                + secs * u64::from(pep_transport::ENDPOINT_HANDSHAKES_PER_SECOND),
        "{s:?}"
    );
    // One line for scripts/sim-acceptance.sh, once every bound held.
    println!(
        "hub-sim: idle_association_bytes={per_association} restart_s={:.2} \
         flood_restart_s={:.2} forged={} cookies_to_terminals={}",
        restart_took.as_secs_f64(),
        flood_took.as_secs_f64(),
        sim.forged,
        sim.cookies_received
    );
}
