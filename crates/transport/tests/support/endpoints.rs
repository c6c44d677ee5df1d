//! Test network of endpoints: one hub gateway and terminals, each with its own address and
//! `Endpoint`, joined by an in-memory path with a fixed one-way delay. Each gateway keeps its
//! associations itself and drives them as the daemon does: a datagram goes to its endpoint,
//! then to the association it routes to (made on an authenticated initiation when needed).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pep_transport::security::{public_key, LocalIdentity, SecurityConfig};
use pep_transport::{
    AssocHandle, Association, Config, DatagramEvent, Endpoint, EndpointConfig, FlowId, PeerId,
    PeerIdentity, Role,
};

use super::{meta, pattern, App, FlowApp};

pub const HUB: usize = 0;
const PSK: [u8; 32] = [0x33; 32];
pub const HUB_KEY: [u8; 32] = [0x11; 32];

/// One gateway: its endpoint and the associations it keeps, with a script each.
pub struct Node {
    pub addr: SocketAddr,
    pub endpoint: Endpoint,
    pub assocs: BTreeMap<AssocHandle, (Association, App)>,
    /// Private key (security on).
    pub key: Option<[u8; 32]>,
    /// The public key of each peer (security on), for the association made for it.
    pub peer_keys: BTreeMap<PeerId, [u8; 32]>,
    pub cfg: Config,
    pub role: Role,
    pub epoch: u64,
    /// Datagrams this gateway sent, with their destination.
    pub sent: Vec<(SocketAddr, Vec<u8>)>,
}

impl Node {
    fn security_for(&self, peer: PeerId) -> Option<SecurityConfig> {
        Some(SecurityConfig {
            local_private_key: self.key?,
            peer_public_key: *self.peer_keys.get(&peer)?,
            psk: Some(PSK),
            rekey_interval: Duration::from_secs(120),
            rekey_after_packets: 1 << 30,
            aeads: pep_transport::security::AeadOffer::auto(false),
        })
    }

    /// Makes the association for `peer` through the endpoint.
    pub fn associate(&mut self, now: Instant, peer: PeerId) -> AssocHandle {
        let security = self.security_for(peer);
        let (h, a) = self
            .endpoint
            .new_association(now, peer, self.cfg.clone(), self.role, self.epoch, security)
            .unwrap();
        self.assocs.insert(h, (a, App::default()));
        h
    }

    /// The association of the only peer (a terminal's).
    pub fn only(&self) -> AssocHandle {
        assert_eq!(self.assocs.len(), 1);
        *self.assocs.keys().next().unwrap()
    }

    pub fn established(&self) -> bool {
        !self.assocs.is_empty() && self.assocs.values().all(|(a, _)| a.is_established())
    }
}

/// A flow each way between a terminal and the hub, with what each should deliver.
pub struct BothWays {
    pub terminal: usize,
    pub at_terminal: AssocHandle,
    pub at_hub: AssocHandle,
    pub up: FlowId,
    pub up_bytes: Vec<u8>,
    pub down: FlowId,
    pub down_bytes: Vec<u8>,
}

/// How to build a hub and its terminals.
#[derive(Debug, Clone)]
pub struct Layout {
    pub hub_cid_len: u8,
    pub secure: bool,
    /// Terminals the hub knows (peers 1..=n at the hub).
    pub terminals: usize,
    /// Further terminals with keys the hub does not know.
    pub strangers: usize,
    pub delay: Duration,
    pub rate_bps: u64,
    /// `Config::keepalive_interval` of the hub's associations and of the terminals'.
    pub hub_keepalive: Duration,
    pub terminal_keepalive: Duration,
    /// The hub answers short packets for connection IDs it does not hold with HINTs.
    pub hints: bool,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            hub_cid_len: 2,
            secure: true,
            terminals: 1,
            strangers: 0,
            delay: Duration::from_millis(100),
            rate_bps: 20_000_000,
            hub_keepalive: Config::for_rate(1).keepalive_interval,
            terminal_keepalive: Config::for_rate(1).keepalive_interval,
            hints: false,
        }
    }
}

/// A datagram on the path: (arrival, sequence, from, to, bytes).
type InFlight = (Instant, u64, SocketAddr, SocketAddr, Vec<u8>);

/// The one-way delay of a datagram (sent at the given time since the start, from the given
/// address) over a path a test shapes, or `None` when the path loses it.
pub type PathDelay = Box<dyn FnMut(Duration, SocketAddr, &[u8]) -> Option<Duration>>;

/// Whether the path loses a datagram (sent at the given time since the start, from and to
/// the given addresses).
pub type Cut = Box<dyn FnMut(Duration, SocketAddr, SocketAddr, &[u8]) -> bool>;

pub struct Hubnet {
    pub base: Instant,
    pub now: Instant,
    /// The hub first, then the terminals in order.
    pub nodes: Vec<Node>,
    pub delay: Duration,
    /// Replaces `delay` for every datagram when set.
    pub path: Option<PathDelay>,
    /// Loses the datagrams it returns true for, when set.
    pub cut: Option<Cut>,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
}

pub fn terminal_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([198, 18, 1, i as u8], 7400))
}

pub fn hub_addr() -> SocketAddr {
    SocketAddr::from(([198, 18, 0, 1], 7400))
}

pub fn terminal_key(i: usize) -> [u8; 32] {
    [0x40 + i as u8; 32]
}

/// An endpoint of the hub as `Hubnet::new` makes it, its ephemeral keys from `seed`: a
/// hub's workers have one each, with the same key and peers.
pub fn hub_endpoint(layout: &Layout, seed: [u8; 32]) -> Endpoint {
    let identity = layout.secure.then_some(LocalIdentity {
        private_key: HUB_KEY,
        psk: Some(PSK),
    });
    let peers = (1..=layout.terminals).map(|i| {
        (
            PeerId(i as u32),
            PeerIdentity {
                public_key: layout.secure.then(|| public_key(&terminal_key(i))),
                address: (!layout.secure).then(|| terminal_addr(i)),
            },
        )
    });
    let mut cfg = EndpointConfig::new(layout.hub_cid_len);
    cfg.hints = layout.hints;
    let mut endpoint = Endpoint::new(cfg, identity, seed).unwrap();
    endpoint.set_peers(peers);
    endpoint
}

/// Terminal `i` at `addr`, with its association to the hub made.
/// `seed` feeds its endpoint's randomness (connection IDs, Noise ephemerals).
fn terminal_node(
    layout: &Layout,
    i: usize,
    addr: SocketAddr,
    (epoch, seed): (u64, [u8; 32]),
    now: Instant,
) -> Node {
    let hub = PeerId(0);
    let mut cfg = Config::for_rate(layout.rate_bps);
    cfg.initial_rtt = Duration::from_millis(200);
    let identity = layout.secure.then(|| LocalIdentity {
        private_key: terminal_key(i),
        psk: Some(PSK),
    });
    let mut endpoint = Endpoint::new(EndpointConfig::new(0), identity, seed).unwrap();
    endpoint.set_peers([(
        hub,
        PeerIdentity {
            public_key: layout.secure.then(|| public_key(&HUB_KEY)),
            address: Some(hub_addr()),
        },
    )]);
    let mut node = Node {
        addr,
        endpoint,
        assocs: BTreeMap::new(),
        key: layout.secure.then_some(terminal_key(i)),
        peer_keys: [(hub, public_key(&HUB_KEY))].into_iter().collect(),
        cfg: Config {
            keepalive_interval: layout.terminal_keepalive,
            ..cfg
        },
        role: Role::Initiator,
        epoch,
        sent: Vec::new(),
    };
    node.associate(now, hub);
    node
}

/// A hub at `addr` that knows the layout's terminals (peers 1..=n), with no association
/// yet: `epoch` and `seed` (its endpoint's randomness) tell its runs apart.
pub fn hub_node(layout: &Layout, addr: SocketAddr, epoch: u64, seed: [u8; 32]) -> Node {
    let mut cfg = Config::for_rate(layout.rate_bps);
    cfg.initial_rtt = Duration::from_millis(200);
    Node {
        addr,
        endpoint: hub_endpoint(layout, seed),
        assocs: BTreeMap::new(),
        key: layout.secure.then_some(HUB_KEY),
        peer_keys: (1..=layout.terminals)
            .map(|i| (PeerId(i as u32), public_key(&terminal_key(i))))
            .collect(),
        cfg: Config {
            keepalive_interval: layout.hub_keepalive,
            ..cfg
        },
        role: Role::Responder,
        epoch,
        sent: Vec::new(),
    }
}

impl Hubnet {
    /// The hub (peer ids 1..=terminals for the terminals it knows) and every terminal, each
    /// terminal with its association to the hub made up front. Without security the hub
    /// makes its associations up front as well (the address is the identity); with security
    /// it learns its terminals from their initiations, as behind NAT.
    pub fn new(layout: &Layout) -> Self {
        let base = Instant::now();
        let mut nodes = vec![hub_node(layout, hub_addr(), 1000, [0x5a; 32])];
        if !layout.secure {
            for i in 1..=layout.terminals {
                nodes[HUB].associate(base, PeerId(i as u32));
            }
        }
        for i in 1..=layout.terminals + layout.strangers {
            let start = (2000 + i as u64, [i as u8; 32]);
            nodes.push(terminal_node(layout, i, terminal_addr(i), start, base));
        }
        Hubnet {
            base,
            now: base,
            nodes,
            delay: layout.delay,
            path: None,
            cut: None,
            queue: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Terminal `i` starts afresh at `addr` (a restart behind NAT, which maps it to a new
    /// port): a new endpoint and association, a new epoch, fresh randomness; what was in
    /// flight to its old address is lost.
    pub fn restart_terminal(&mut self, layout: &Layout, i: usize, addr: SocketAddr) {
        let epoch = self.nodes[i].epoch + 1;
        let seed = [0xe0 | (epoch as u8 & 0x0f); 32];
        self.nodes[i] = terminal_node(layout, i, addr, (epoch, seed), self.now);
    }

    pub fn node_at(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr == addr)
    }

    /// A datagram arrives at node `to` from `from`: the endpoint says where it goes.
    pub fn deliver(&mut self, to: usize, from: SocketAddr, d: &[u8]) {
        let now = self.now;
        let node = &mut self.nodes[to];
        let handle = match node.endpoint.handle(now, from, d) {
            None => return,
            Some(DatagramEvent::Routed(h)) => {
                if let Some((a, _)) = node.assocs.get_mut(&h) {
                    a.handle_datagram_from(now, from, d);
                }
                h
            }
            Some(DatagramEvent::Initiation {
                peer,
                handle,
                accepted,
            }) => {
                let h = handle.unwrap_or_else(|| node.associate(now, peer));
                if let Some((a, _)) = node.assocs.get_mut(&h) {
                    a.accept_initiation(now, from, accepted);
                }
                h
            }
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                let addr = node.addr;
                node.sent.push((destination, datagram.clone()));
                self.send(addr, destination, datagram);
                return;
            }
        };
        self.service(to, handle);
    }

    /// Application I/O and transmission for one association.
    pub fn service(&mut self, node: usize, h: AssocHandle) {
        let now = self.now;
        let from = self.nodes[node].addr;
        let Some((a, app)) = self.nodes[node].assocs.get_mut(&h) else {
            return;
        };
        for _ in 0..4 {
            app.drain_events(a);
            app.io(a);
        }
        let mut out = Vec::new();
        let mut sent = Vec::new();
        while let Some(to) = a.poll_transmit_to(now, &mut out) {
            sent.push((to, out.clone()));
        }
        app.drain_events(a);
        for (to, d) in sent {
            self.nodes[node].sent.push((to, d.clone()));
            self.send(from, to, d);
        }
    }

    /// Puts a datagram on the path, which may delay it otherwise than `delay` or lose it.
    fn send(&mut self, from: SocketAddr, to: SocketAddr, d: Vec<u8>) {
        let since_start = self.now - self.base;
        if let Some(cut) = self.cut.as_mut() {
            if cut(since_start, from, to, &d) {
                return;
            }
        }
        let delay = match self.path.as_mut() {
            Some(path) => path(since_start, from, &d),
            None => Some(self.delay),
        };
        if let Some(delay) = delay {
            self.seq += 1;
            self.queue
                .push(Reverse((self.now + delay, self.seq, from, to, d)));
        }
    }

    fn service_all(&mut self) {
        for node in 0..self.nodes.len() {
            let handles: Vec<AssocHandle> = self.nodes[node].assocs.keys().copied().collect();
            for h in handles {
                let now = self.now;
                if let Some((a, _)) = self.nodes[node].assocs.get_mut(&h) {
                    if a.poll_timeout().is_some_and(|t| t <= now) {
                        a.handle_timeout(now);
                    }
                }
                self.service(node, h);
            }
        }
    }

    /// When the next timer fires or datagram arrives.
    fn next_event(&self) -> Option<Instant> {
        let timers = self
            .nodes
            .iter()
            .flat_map(|n| n.assocs.values().filter_map(|(a, _)| a.poll_timeout()));
        let next_dgram = self.queue.peek().map(|Reverse((t, ..))| *t);
        timers.chain(next_dgram).min()
    }

    /// Processes every event due within `d`, and leaves the clock at its end.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while self.next_event().is_some_and(|t| t <= end) {
            self.step();
        }
        self.now = self.now.max(end);
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
            let Some(Reverse((_, _, from, to, d))) = self.queue.pop() else {
                break;
            };
            // Nobody at that address: the datagram is lost.
            if let Some(node) = self.node_at(to) {
                self.deliver(node, from, &d);
            }
        }
        self.service_all();
        true
    }

    /// Steps until `done` holds or `limit` of simulated time passes; returns whether done.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Hubnet) -> bool) -> bool {
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

    /// Every gateway listed has all of its associations established.
    pub fn established(&self, nodes: impl IntoIterator<Item = usize>) -> bool {
        nodes.into_iter().all(|n| self.nodes[n].established())
    }

    /// Opens a flow on one association with a scripted payload.
    pub fn open(
        &mut self,
        node: usize,
        h: AssocHandle,
        port: u16,
        data: Vec<u8>,
        finish: bool,
    ) -> FlowId {
        let (a, app) = self.nodes[node].assocs.get_mut(&h).unwrap();
        let id = a.open_flow(meta(port)).unwrap();
        app.flows.insert(
            id,
            FlowApp {
                to_send: data,
                finish,
                meta: Some(meta(port)),
                ..Default::default()
            },
        );
        self.service(node, h);
        id
    }

    /// The script of one association.
    pub fn app(&self, node: usize, h: AssocHandle) -> &App {
        &self.nodes[node].assocs[&h].1
    }

    /// The hub's association for terminal `i` (peer `i`).
    pub fn hub_handle(&self, i: usize) -> Option<AssocHandle> {
        self.nodes[HUB].endpoint.association_of(PeerId(i as u32))
    }

    pub fn received(&self, node: usize, h: AssocHandle, f: FlowId) -> Option<&FlowApp> {
        self.nodes[node].assocs.get(&h)?.1.flows.get(&f)
    }

    /// Opens a flow each way between each listed terminal and the hub, `bytes` (and a few
    /// more downwards) of a pattern per terminal, both finished.
    pub fn open_both_ways(&mut self, terminals: &[usize], bytes: usize) -> Vec<BothWays> {
        let mut flows = Vec::new();
        for &i in terminals {
            let at_terminal = self.nodes[i].only();
            let at_hub = self.hub_handle(i).expect("the hub's association");
            let up_bytes = pattern(i as u64, bytes);
            let down_bytes = pattern(100 + i as u64, bytes + i);
            let up = self.open(i, at_terminal, 3000 + i as u16, up_bytes.clone(), true);
            let down = self.open(HUB, at_hub, 4000 + i as u16, down_bytes.clone(), true);
            flows.push(BothWays {
                terminal: i,
                at_terminal,
                at_hub,
                up,
                up_bytes,
                down,
                down_bytes,
            });
        }
        flows
    }

    /// Runs until every flow of `flows` has delivered its end, for at most `limit`; then
    /// requires each byte-exact.
    pub fn complete_both_ways(&mut self, flows: &[BothWays], limit: Duration) {
        let done = self.run_until(limit, |n| {
            flows.iter().all(|f| {
                n.received(HUB, f.at_hub, f.up)
                    .is_some_and(|x| x.fin_received)
                    && n.received(f.terminal, f.at_terminal, f.down)
                        .is_some_and(|x| x.fin_received)
            })
        });
        assert!(done, "transfers did not complete");
        for f in flows {
            let up = &self.received(HUB, f.at_hub, f.up).unwrap().received;
            assert_eq!(*up, f.up_bytes, "up {}", f.terminal);
            let down = &self
                .received(f.terminal, f.at_terminal, f.down)
                .unwrap()
                .received;
            assert_eq!(*down, f.down_bytes, "down {}", f.terminal);
        }
    }
}
