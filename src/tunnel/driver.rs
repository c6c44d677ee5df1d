//! Drives the sans-IO associations: owns the tunnel socket and the endpoint in front of every
//! association, feeds each datagram to the peer the endpoint routes it to (locking only that
//! peer), runs the timers, sends what the associations produce in turn, and hands their
//! events to the relays.

mod reconfigure;

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use pep_transport::security::AcceptedInitiation;
use pep_transport::{
    AssocHandle, Association, Config, DatagramEvent, Endpoint, Event, FlowId, FlowMeta,
    InvalidConfig, PeerId, ResetReason, Role,
};
use quinn_udp::RecvMeta;
use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

use crate::sys::notify::Notifier;
use crate::tunnel::carrier::CarrierShare;
use crate::tunnel::droplog::DropLog;
use crate::tunnel::gateway::Gateway;
use crate::tunnel::memory::FlowCharge;
use crate::tunnel::peer::AssociationState;
use crate::tunnel::peer::{Allocation, FlowRef, Peer, PeerCounters, PeerState};
use crate::tunnel::peer_table::{PeerSettings, PeerTable};
use crate::tunnel::workers::{owner, Handoff, Initiators, Place};

use super::outbox::Outbox;
use super::udp;
pub use udp::TunnelSocket;

pub use crate::config::budget::{BATCH, RECV_BUF};

/// Opens the local end of a flow the peer started (connect upstream and relay). Called with
/// no lock held, so it may use the peer (reset the flow) right away.
pub trait FlowAcceptor: Send + Sync + 'static {
    /// `charge` counts the flow against the memory budget; the relay keeps it to its end.
    fn accept(&self, peer: Arc<Peer>, flow: FlowRef, meta: FlowMeta, charge: FlowCharge);
}

/// Flows the peer opened, collected under the peer lock (charged there, so that the next
/// one is admitted against them) and accepted once it is released.
type Accepts = Vec<(FlowRef, FlowMeta, FlowCharge)>;

/// How a peer's association is made: at start for a peer whose address is configured (but
/// at a redundant hub), else by the driver on the peer's first authenticated initiation.
#[derive(Clone)]
pub struct AssocFactory {
    /// Every configured peer's.
    pub peers: HashMap<PeerId, PeerSettings>,
    pub role: Role,
    pub epoch: u64,
    /// `[tunnel] redundant`: another hub with the same key may be serving the peer, so
    /// this one waits for the peer's initiation instead of starting one.
    pub redundant: bool,
    /// A terminal's hubs when its `[peer] address` lists several: its association may move
    /// among them (docs/PROTOCOL.md §10).
    pub hubs: Option<pep_transport::Hubs>,
}

impl AssocFactory {
    /// Whether the association with a peer whose address is `address` is made before the
    /// peer initiates: only when this gateway knows where to start it, and no other hub may
    /// be serving the peer (an initiation with this start's newer epoch would take the peer
    /// away from it).
    pub fn makes_up_front(&self, address: Option<SocketAddr>) -> bool {
        address.is_some() && !self.redundant
    }

    pub fn make(
        &self,
        endpoint: &mut Endpoint,
        now: Instant,
        peer: PeerId,
    ) -> Result<(AssocHandle, Association), InvalidConfig> {
        let Some(s) = self.peers.get(&peer) else {
            return Err(InvalidConfig {
                key: "peer",
                why: "no settings for this peer",
            });
        };
        // Another hub with the same key may serve the peer: an initiation of ours, with its
        // newer epoch, would take the terminal from it. Only rekeys of an association that is
        // up (docs/PROTOCOL.md §7.1).
        let mut config = s.config.clone();
        if self.redundant {
            config.initiate = pep_transport::Initiate::RekeyOnly;
        }
        let (handle, mut assoc) = endpoint.new_association(
            now,
            peer,
            config,
            self.role,
            self.epoch,
            s.security.clone(),
        )?;
        if let Some(hubs) = &self.hubs {
            if let Err(e) = assoc.set_hubs(hubs.clone()) {
                endpoint.forget(handle);
                return Err(e);
            }
        }
        Ok((handle, assoc))
    }

    /// Every peer's transport settings.
    pub fn configs(&self) -> impl Iterator<Item = &Config> + Clone {
        self.peers.values().map(|s| &s.config)
    }
}

/// A received datagram: `at` in buffer `buf`.
struct ReceivedDatagram {
    buf: usize,
    /// Where in the buffer (one buffer may hold several coalesced datagrams).
    at: Range<usize>,
    from: SocketAddr,
    /// When the kernel received it (see [`udp::ReceiveClock`]).
    arrived: Instant,
}

/// A received datagram on its way to a peer.
enum Input {
    Datagram(ReceivedDatagram),
    /// One another worker read and handed over.
    Copied {
        from: SocketAddr,
        bytes: Vec<u8>,
        arrived: Instant,
    },
    Initiation {
        from: SocketAddr,
        accepted: AcceptedInitiation,
    },
}

pub struct Driver {
    gateway: Arc<Gateway>,
    /// Which of the gateway's workers this driver is.
    worker: usize,
    /// The peers this driver serves (the ones its worker owns): of the gateway's table as
    /// of the last change it applied. The vectors below go by place in it.
    table: Arc<PeerTable>,
    /// Every peer, as of the same change.
    all: Arc<PeerTable>,
    /// Where the initiations this worker handed to another came from: that worker's too.
    initiators: Initiators,
    socket: TunnelSocket,
    endpoint: Endpoint,
    factory: AssocFactory,
    /// Addresses datagrams may come from; `None`: any, connection IDs and authentication
    /// gate them.
    allowed: Option<HashSet<SocketAddr>>,
    acceptor: Arc<dyn FlowAcceptor>,
    notifier: Notifier,
    /// The peer of each association.
    by_handle: HashMap<AssocHandle, PeerId>,
    /// Each peer's next timer, as of its last service.
    deadlines: Vec<Option<Instant>>,
    /// Where the next pass starts, so no peer is always served first.
    cursor: usize,
    /// With `[[peer]]` entries: whose datagram goes next on the shared carrier. Without
    /// (the pair), peers take turns within each pass.
    share: Option<CarrierShare>,
}

impl Driver {
    /// Worker `worker`'s driver; the associations of its peers made so far must come from
    /// `endpoint`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gateway: Arc<Gateway>,
        worker: usize,
        socket: TunnelSocket,
        endpoint: Endpoint,
        factory: AssocFactory,
        allowed: Option<HashSet<SocketAddr>>,
        acceptor: Arc<dyn FlowAcceptor>,
        notifier: Notifier,
    ) -> Driver {
        let all = gateway.peers.table();
        let table = own_view(&all, worker, gateway.workers.count());
        let by_handle = table
            .peers
            .iter()
            .filter_map(|l| Some((endpoint.association_of(l.id)?, l.id)))
            .collect();
        let deadlines = table
            .peers
            .iter()
            .map(|l| l.lock().assoc.as_ref().and_then(Association::poll_timeout))
            .collect();
        Driver {
            initiators: Initiators::default(),
            gateway,
            worker,
            table,
            all,
            socket,
            endpoint,
            factory,
            allowed,
            acceptor,
            notifier,
            by_handle,
            deadlines,
            cursor: 0,
            share: None,
        }
    }

    /// Shares the carrier between the peers by `share` instead of turns within a pass.
    pub fn with_share(mut self, share: Option<CarrierShare>) -> Driver {
        self.share = share;
        self
    }

    /// Runs until `stop` turns true, then closes every association with one CLOSE. Each
    /// pass: wait, receive a batch, route it to the peers, service the peers that have
    /// something to do, send what they made.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> io::Result<()> {
        let mut b = self.pass_buffers();
        let wake = self.own_wake();
        loop {
            if self.wait(&wake, &mut stop).await? {
                self.close(&mut b.tx).await;
                return Ok(());
            }
            if let Some(w) = self.gateway.workers.get(self.worker) {
                w.answer();
            }
            if self.apply_peer_changes(Instant::now(), &mut b.tx) {
                b.peers_changed(self.table.peers.len());
            }
            let batch = self.receive(&mut b)?;
            let clock = udp::ReceiveClock::now();
            let now = clock.now_instant();
            let handed_more = self.route_received(now, &clock, &mut b);
            self.log_drops(now, &mut b.drop_log);
            self.choose_serviced(now, &mut b);
            let mut again = handed_more || batch.datagrams >= BATCH || batch.filled == b.rx.len();
            let send_buffered = self.gateway.memory.send_buffered();
            again |= self.service_chosen(now, &mut b);
            if self.share.is_some() {
                again |= self.send_shared(&b.rx, &mut b.tx, &mut b.spare, &mut b.accepts);
            }
            if self.gateway.memory.send_buffered() < send_buffered {
                self.wake_budget_waiters();
            }
            self.socket.send(&b.tx).await?;
            b.tx.clear();
            if again {
                wake.notify_one();
            }
        }
    }

    /// The buffers a pass works in, made once for the driver's life.
    fn pass_buffers(&self) -> PassBuffers {
        let peers = self.table.peers.len();
        let (buffers, size) = udp::receive_buffers(
            BATCH,
            RECV_BUF,
            self.socket.gro_segments(),
            self.endpoint.config().max_datagram,
        );
        PassBuffers {
            rx: (0..buffers).map(|_| vec![0u8; size]).collect(),
            meta: vec![RecvMeta::default(); quinn_udp::BATCH_SIZE],
            received: Vec::with_capacity(buffers),
            inputs: (0..peers).map(|_| Vec::new()).collect(),
            more: vec![false; peers],
            serviced: Vec::with_capacity(peers),
            tx: Outbox::default(),
            spare: Vec::new(),
            accepts: Vec::new(),
            handed: Vec::new(),
            drop_log: DropLog::default(),
        }
    }

    /// This worker's wake-up. A driver serves a worker that exists; the first's wake-up is
    /// only a fallback.
    fn own_wake(&self) -> Arc<Notify> {
        let workers = &self.gateway.workers;
        workers.get(self.worker).map_or_else(
            || workers.wake_of(pep_transport::PeerId(0)),
            |w| w.wake.clone(),
        )
    }

    /// Waits for a datagram, a wake-up, the next deadline or `stop`. True once `stop` has
    /// turned true.
    async fn wait(&mut self, wake: &Notify, stop: &mut watch::Receiver<bool>) -> io::Result<bool> {
        let deadline = self.next_deadline(Instant::now());
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = self.socket.readable() => r?,
            _ = wake.notified() => {}
            _ = sleep => {}
            _ = stop.changed() => return Ok(*stop.borrow()),
        }
        Ok(false)
    }

    /// Reads up to a batch of datagrams into the receive buffers; those from an address no
    /// peer may send from are dropped and counted.
    fn receive(&mut self, b: &mut PassBuffers) -> io::Result<Batch> {
        b.received.clear();
        let (mut filled, mut datagrams) = (0, 0);
        while datagrams < BATCH && filled < b.rx.len() {
            let n = match self.socket.try_recv(&mut b.rx[filled..], &mut b.meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ICMP errors (peer port unreachable) surface here; the transport's
                // own timers deal with an unreachable peer.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e),
            };
            for m in &b.meta[..n] {
                let count = udp::datagrams(m).count();
                if self.allowed.as_ref().is_none_or(|a| a.contains(&m.addr)) {
                    b.received.push((filled, *m));
                    datagrams += count;
                } else {
                    PeerCounters::add(&self.gateway.counters.foreign_datagrams, count as u64);
                    debug!(from = %m.addr, "datagram from an address that is not a peer's dropped");
                }
                filled += 1;
            }
        }
        if let Some(w) = self.gateway.workers.get(self.worker) {
            PeerCounters::add(&w.datagrams, datagrams as u64);
        }
        Ok(Batch { filled, datagrams })
    }

    /// Routes what other workers handed over and the batch just read to the peers' inputs.
    /// True if more handoffs wait than a batch took.
    fn route_received(
        &mut self,
        now: Instant,
        clock: &udp::ReceiveClock,
        b: &mut PassBuffers,
    ) -> bool {
        let (mut handed_more, mut screened) = (false, !b.received.is_empty());
        if self.gateway.workers.count() > 1 {
            handed_more = self
                .gateway
                .workers
                .take_inbox(self.worker, &mut b.handed, BATCH);
            screened |= !b.handed.is_empty();
            for h in b.handed.drain(..) {
                self.take_handed(now, h, &mut b.inputs, &mut b.tx);
            }
        }
        for &(i, m) in &b.received {
            let arrived = clock.arrival(&m);
            for at in udp::datagrams(&m) {
                let d = ReceivedDatagram {
                    from: m.addr,
                    buf: i,
                    at: at.clone(),
                    arrived,
                };
                self.route(now, d, &b.rx[i][at], &mut b.inputs, &mut b.tx);
            }
        }
        // What another worker handed over counts here as well (an initiation from where
        // one of this worker's peers is known: its drops are this endpoint's).
        if screened {
            self.gateway
                .counters
                .set_endpoint(self.worker, self.endpoint.stats());
        }
        handed_more
    }

    /// A summary of the datagrams dropped, when one is due.
    fn log_drops(&self, now: Instant, drop_log: &mut DropLog) {
        if !drop_log.is_due(now) {
            return;
        }
        let foreign = self
            .gateway
            .counters
            .foreign_datagrams
            .load(Ordering::Relaxed);
        if let Some(s) = drop_log.summary(now, &self.gateway.stats().0, foreign) {
            warn!("dropped datagrams: {s}");
        }
    }

    /// The peers this pass services, from the cursor on: woken, due, with input, or with
    /// more to send since the last pass.
    fn choose_serviced(&mut self, now: Instant, b: &mut PassBuffers) {
        let peers = self.table.peers.len();
        b.serviced.clear();
        for k in 0..peers {
            let i = (self.cursor + k) % peers;
            let queued = self.table.peers[i].take_queued();
            let due = self.deadlines[i].is_some_and(|t| t <= now);
            if queued || due || b.more[i] || !b.inputs[i].is_empty() {
                b.serviced.push(i);
            }
        }
        self.cursor = (self.cursor + 1) % peers.max(1);
    }

    /// Services the chosen peers. Sending takes turns: each peer gets its share of a pass,
    /// and one with more to send is serviced again on the next. True if one has more.
    fn service_chosen(&mut self, now: Instant, b: &mut PassBuffers) -> bool {
        let quota = (BATCH / b.serviced.len().max(1)).max(1);
        let mut again = false;
        for &i in &b.serviced {
            let r = Received {
                rx: &b.rx,
                inputs: &mut b.inputs[i],
            };
            b.more[i] = self.service(i, now, r, quota, &mut b.tx, &mut b.spare, &mut b.accepts);
            again |= b.more[i];
            self.accept_all(i, &mut b.accepts);
        }
        again
    }

    /// The budget is the gateway's: acknowledgements from one peer may free what relays of
    /// another wait for, whichever worker serves it.
    fn wake_budget_waiters(&self) {
        for l in self.all.peers.iter().filter(|l| l.waits_for_budget()) {
            l.wake();
        }
    }

    /// When the loop must look again without a datagram or a wake-up. A peer whose datagram
    /// waits for the carrier is overdue while it has more to send (its pacer allows it):
    /// its turn on the carrier is what it waits for, and the peer is serviced when its
    /// datagram leaves.
    fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let Some(share) = self.share.as_ref() else {
            return self.deadlines.iter().flatten().min().copied();
        };
        let peers = self
            .deadlines
            .iter()
            .zip(&self.table.peers)
            .filter_map(|(d, l)| d.filter(|&d| d > now || !share.is_staged(l.id)));
        peers.chain(share.poll_timeout(now)).min()
    }

    /// Where a datagram goes: to the worker whose shard its connection ID names if that is
    /// another, else to the peer the endpoint routes it to (see [`place`](Self::place)).
    /// `datagram` is the contents of `d`.
    fn route(
        &mut self,
        now: Instant,
        d: ReceivedDatagram,
        datagram: &[u8],
        inputs: &mut [Vec<Input>],
        tx: &mut Outbox,
    ) {
        if let Some(to) = self.elsewhere(datagram, d.from) {
            let h = || Handoff::Datagram {
                from: d.from,
                bytes: datagram.to_vec(),
                arrived: d.arrived,
            };
            self.gateway.workers.hand_off(self.worker, to, h);
            return;
        }
        let event = self.endpoint.handle(now, d.from, datagram);
        self.place(now, d.from, event, Input::Datagram(d), inputs, tx);
    }

    /// The other worker a datagram belongs to, if any (see [`crate::tunnel::workers::elsewhere`]).
    fn elsewhere(&self, datagram: &[u8], from: SocketAddr) -> Option<usize> {
        let cfg = self.endpoint.config();
        let here = Place {
            worker: self.worker,
            workers: self.gateway.workers.count(),
            cid_len: cfg.cid_len,
            shard_bits: cfg.shard_bits,
            max_datagram: cfg.max_datagram,
        };
        // The sender's peer: the one configured at its address, else the one of an
        // initiation from it that this worker handed on.
        here.elsewhere(datagram, from, |a| {
            self.endpoint.peer_at(a).or_else(|| self.initiators.get(a))
        })
    }

    /// What the endpoint made of a datagram from `from`: `routed` goes to the peer it names;
    /// an initiation to its peer, made now if it has no association yet, or to the
    /// worker that owns the peer; a cookie the endpoint answers with joins `tx`.
    fn place(
        &mut self,
        now: Instant,
        from: SocketAddr,
        event: Option<DatagramEvent>,
        routed: Input,
        inputs: &mut [Vec<Input>],
        tx: &mut Outbox,
    ) {
        let peer = match event {
            None => return,
            Some(DatagramEvent::Routed(h)) => {
                let Some(peer) = self.by_handle.get(&h).and_then(|&p| self.table.position(p))
                else {
                    return;
                };
                peer
            }
            Some(DatagramEvent::Initiation {
                peer,
                handle,
                accepted,
            }) => {
                let to = owner(peer, self.gateway.workers.count());
                if to != self.worker {
                    self.initiators.learn(from, peer);
                    let h = || Handoff::Initiation {
                        from,
                        peer,
                        accepted,
                    };
                    self.gateway.workers.hand_off(self.worker, to, h);
                } else {
                    self.initiation(now, from, peer, handle.is_some(), accepted, inputs);
                }
                return;
            }
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                tx.push(destination, &datagram, now);
                return;
            }
        };
        if let Some(queue) = inputs.get_mut(peer) {
            queue.push(routed);
        }
    }

    /// An authenticated initiation of `peer`: its association is made now if
    /// it has none (`associated` false).
    fn initiation(
        &mut self,
        now: Instant,
        from: SocketAddr,
        peer: PeerId,
        associated: bool,
        accepted: AcceptedInitiation,
        inputs: &mut [Vec<Input>],
    ) {
        let Some(peer) = self.table.position(peer) else {
            return;
        };
        if !associated && !self.associate(now, peer, from) {
            return;
        }
        if let Some(queue) = inputs.get_mut(peer) {
            queue.push(Input::Initiation { from, accepted });
        }
    }

    /// What another worker handed over: a datagram for this worker's endpoint, or an
    /// initiation it authenticated for a peer this worker owns.
    fn take_handed(
        &mut self,
        now: Instant,
        h: Handoff,
        inputs: &mut [Vec<Input>],
        tx: &mut Outbox,
    ) {
        match h {
            Handoff::Datagram {
                from,
                bytes,
                arrived,
            } => {
                let event = self.endpoint.handle(now, from, &bytes);
                let copied = Input::Copied {
                    from,
                    bytes,
                    arrived,
                };
                self.place(now, from, event, copied, inputs, tx);
            }
            Handoff::Initiation {
                from,
                peer,
                accepted,
            } => {
                self.endpoint.adopt_initiation(peer, &accepted);
                let associated = self.endpoint.association_of(peer).is_some();
                self.initiation(now, from, peer, associated, accepted, inputs);
            }
        }
    }

    /// Makes the association of a peer whose address was not configured, on its first
    /// authenticated initiation.
    fn associate(&mut self, now: Instant, peer: usize, from: SocketAddr) -> bool {
        let Some(l) = self.table.peers.get(peer).cloned() else {
            return false;
        };
        match self.factory.make(&mut self.endpoint, now, l.id) {
            Ok((handle, mut assoc)) => {
                l.apply_reloaded(&mut assoc);
                self.deadlines[peer] = assoc.poll_timeout();
                l.lock().assoc = Some(assoc);
                self.by_handle.insert(handle, l.id);
                info!(peer = %l.name, %from, "association made on the peer's initiation");
                true
            }
            Err(e) => {
                warn!(peer = %l.name, %from, key = e.key, why = e.why, "cannot make the association");
                false
            }
        }
    }

    /// One peer's pass under its lock: its datagrams, its timer, up to `quota` datagrams
    /// out, its events. True if it has more to send.
    #[allow(clippy::too_many_arguments)]
    fn service(
        &mut self,
        peer: usize,
        now: Instant,
        received: Received<'_>,
        quota: usize,
        tx: &mut Outbox,
        spare: &mut Vec<Vec<u8>>,
        accepts: &mut Accepts,
    ) -> bool {
        let l = self.table.peers[peer].clone();
        let mut st = l.lock();
        let Some(assoc) = st.assoc.as_mut() else {
            received.inputs.clear();
            return false;
        };
        for input in received.inputs.drain(..) {
            match input {
                Input::Datagram(d) => {
                    if let Some(bytes) = received.rx.get(d.buf).and_then(|b| b.get(d.at)) {
                        assoc.handle_datagram_from(d.arrived, d.from, bytes);
                    }
                }
                Input::Copied {
                    from,
                    bytes,
                    arrived,
                } => assoc.handle_datagram_from(arrived, from, &bytes),
                Input::Initiation { from, accepted } => {
                    assoc.accept_initiation(now, from, accepted)
                }
            }
        }
        if assoc.poll_timeout().is_some_and(|t| t <= now) {
            assoc.handle_timeout(now);
        }
        let mut more = false;
        if let Some(share) = self.share.as_mut() {
            // One datagram waits for the carrier; the next is made once it has left, so
            // the association's pacing sees the share it gets.
            if !share.is_staged(l.id) {
                if let Some((to, buf)) = next_datagram(assoc, now, spare) {
                    share.stage(now, l.id, to, buf);
                }
            }
        } else {
            // All at one `now`: what the pacer lets go at once, which may leave as one
            // segmented send (see `outbox`).
            let mut buf = spare.pop().unwrap_or_default();
            let mut sent = 0;
            loop {
                if sent == quota {
                    more = true;
                    break;
                }
                let Some(to) = assoc.poll_transmit_to(now, &mut buf) else {
                    break;
                };
                tx.push(to, &buf, now);
                sent += 1;
            }
            spare.push(buf);
        }
        st.lift_quotas(&l);
        while let Some(ev) = st.assoc.as_mut().and_then(Association::poll_event) {
            self.dispatch(&l, &mut st, ev, accepts);
        }
        st.wake_budget_waiters(&l, crate::config::budget::CHUNK as u64);
        st.wake_stalled(&l);
        self.deadlines[peer] = st.assoc.as_ref().and_then(Association::poll_timeout);
        more
    }

    /// Up to a batch of datagrams the carrier lets leave now, each peer's next one made as
    /// its previous leaves; and every [`crate::tunnel::carrier::REFRESH`] each association capped at
    /// its allocation. True if more may leave at once.
    fn send_shared(
        &mut self,
        rx: &[Vec<u8>],
        tx: &mut Outbox,
        spare: &mut Vec<Vec<u8>>,
        accepts: &mut Accepts,
    ) -> bool {
        let now = Instant::now();
        if self.share.as_ref().is_some_and(|s| s.refresh_due(now)) {
            self.refresh_ceilings(now);
        }
        let mut none = Vec::new();
        // One instant for the batch: what the carrier's and the peers' schedules let go at
        // it (their burst allowance) leaves now, and a peer's turn, datagrams back to back to
        // it, joins in one segmented send.
        while tx.len() < BATCH {
            let Some((peer, to, buf)) = self.share.as_mut().and_then(|s| s.next(now)) else {
                return false;
            };
            tx.push(to, &buf, now);
            spare.push(buf);
            let Some(peer) = self.table.position(peer) else {
                continue;
            };
            let r = Received {
                rx,
                inputs: &mut none,
            };
            self.service(peer, now, r, 1, tx, spare, accepts);
            self.accept_all(peer, accepts);
        }
        true
    }

    /// Each association's rate ceiling becomes its share of the carrier, at most its own
    /// configured rate.
    fn refresh_ceilings(&mut self, now: Instant) {
        let Some(share) = self.share.as_mut() else {
            return;
        };
        share.set_carrier(now, self.gateway.carrier_bps.load(Ordering::Relaxed));
        for (i, l) in self.table.peers.iter().enumerate() {
            if let Some(r) = l.take_share_rates() {
                share.set_share_rates(l.id, r.min_bps, r.weight);
            }
            let mut st = l.lock();
            let Some(assoc) = st.assoc.as_mut() else {
                continue;
            };
            let ceiling = share.ceiling(l.id, assoc.config().rate_bps);
            assoc.set_rate_ceiling(ceiling);
            if let Some(r) = share.rates(l.id) {
                l.carrier.record(Allocation {
                    allocated_bps: ceiling,
                    cir_bps: r.cir_bps,
                    weight: r.weight,
                });
            }
            self.deadlines[i] = assoc.poll_timeout();
        }
        share.refreshed(now);
    }

    fn accept_all(&self, peer: usize, accepts: &mut Accepts) {
        for (flow, meta, charge) in accepts.drain(..) {
            self.acceptor
                .accept(self.table.peers[peer].clone(), flow, meta, charge);
        }
    }

    /// Records the peer's new state for the metrics and tells the state feed.
    fn set_state(&self, peer: &Peer, state: AssociationState) {
        peer.counters.set_state(state);
        self.gateway.states.changed(peer.id, state);
    }

    fn dispatch(&self, peer: &Peer, st: &mut PeerState, ev: Event, accepts: &mut Accepts) {
        let remote = st.assoc.as_ref().and_then(Association::remote);
        // The address while known (the pair form always knows it), else the name.
        let at = remote.map_or_else(|| peer.name.to_string(), |r| r.to_string());
        let c = &peer.counters;
        match ev {
            Event::Established => {
                PeerCounters::add(&c.associations_established, 1);
                self.set_state(peer, AssociationState::Established);
                let rtt = st.assoc.as_ref().map(|a| a.stats().rtt_smoothed);
                info!(peer = %at, name = %peer.name, ?rtt, "association established");
                self.notifier
                    .status(&format!("association established with {at}"));
            }
            Event::PeerRestarted => {
                self.set_state(peer, AssociationState::Connecting);
                warn!(peer = %at, name = %peer.name, "peer gateway restarted; its flows were reset");
            }
            Event::FlowOpened { flow, meta } => {
                debug!(flow, client = %meta.client, server = %meta.server, "flow opened by peer");
                PeerCounters::add(&c.flows_from_peer, 1);
                if !st.admits_peer_flow(peer) {
                    // The peer's client gets the reset, as it would from a full `max_flows`.
                    debug!(flow, "memory budget reached; flow refused");
                    PeerCounters::add(&c.flows_over_budget, 1);
                    Self::refuse_peer_flow(peer, st, flow);
                    return;
                }
                let Some(slot) = self.gateway.take_flow_slot() else {
                    debug!(flow, "limits.max_flows open across the peers; flow refused");
                    PeerCounters::add(&c.flows_over_gateway, 1);
                    Self::refuse_peer_flow(peer, st, flow);
                    return;
                };
                // Before the acceptor writes to it: its data is queued in its class.
                let classes = &self.gateway.classes;
                if !classes.is_empty() {
                    if let Some(a) = st.assoc.as_mut() {
                        a.set_flow_class(flow, classes.class_of(&meta));
                    }
                }
                accepts.push((
                    st.insert_slot(flow),
                    meta,
                    peer.charge_flow().with_slot(slot),
                ));
            }
            Event::FlowReadable { flow } | Event::FlowWritable { flow } => st.signal_flow(flow),
            Event::FlowReset { flow, reason } => {
                debug!(flow, ?reason, "flow reset");
                c.flow_resets.add(reason);
                st.flow_reset(flow, reason);
            }
            Event::FlowClosed { flow } => st.flow_closed(flow),
            Event::OutageStarted => {
                self.set_state(peer, AssociationState::Outage);
                warn!(peer = %at, name = %peer.name, "satellite link outage: no answer from the peer");
                self.notifier.status("link outage");
            }
            Event::OutageEnded { duration } => {
                self.set_state(peer, AssociationState::Established);
                info!(?duration, name = %peer.name, "satellite link back");
                self.notifier
                    .status(&format!("association established with {at}"));
            }
            Event::RemoteMoved { from, to } => {
                info!(name = %peer.name, %from, %to, "peer now sends from a new address; following it");
            }
            Event::Handover { from, to } => {
                c.set_state(AssociationState::Connecting);
                info!(
                    name = %peer.name,
                    "handover: hub {from} stopped answering, now served by {to}; {} flows reset",
                    st.flows_reset_by_handover()
                );
                self.notifier.status(&format!("served by hub {to}"));
            }
            Event::AssociationLost { reason } => {
                self.set_state(peer, AssociationState::Connecting);
                warn!(
                    ?reason,
                    name = %peer.name,
                    "association lost; every flow was reset; re-establishing"
                );
                self.notifier
                    .status(&format!("association down ({reason:?}), re-establishing"));
            }
        }
    }

    /// Resets a flow the peer opened that a limit has no room for: its client gets the reset
    /// it would from the peer's own full `max_flows`.
    fn refuse_peer_flow(peer: &Peer, st: &mut PeerState, flow: FlowId) {
        let reset = st
            .assoc
            .as_mut()
            .is_some_and(|a| a.reset(flow, ResetReason::ResourceLimit).is_ok());
        if reset {
            peer.counters.flow_resets.add(ResetReason::ResourceLimit);
        }
    }

    /// Tells every peer we are going (one best-effort CLOSE each).
    async fn close(&mut self, tx: &mut Outbox) {
        let now = Instant::now();
        let mut accepts = Accepts::new();
        for (i, l) in self.table.clone().peers.iter().enumerate() {
            {
                let mut st = l.lock();
                let Some(assoc) = st.assoc.as_mut() else {
                    continue;
                };
                assoc.close(0, "gateway shutting down");
                // Only the CLOSE: the HELLO of the fresh epoch that would follow it must
                // not reach the peer from a gateway that is going away.
                let mut buf = Vec::new();
                if let Some(to) = assoc.poll_transmit_to(now, &mut buf) {
                    tx.push(to, &buf, now);
                }
                while let Some(ev) = st.assoc.as_mut().and_then(Association::poll_event) {
                    self.dispatch(l, &mut st, ev, &mut accepts);
                }
            }
            self.accept_all(i, &mut accepts);
        }
        let _ = self.socket.send(tx).await;
    }
}

/// The peers of `all` worker `worker` of `workers` serves.
fn own_view(all: &Arc<PeerTable>, worker: usize, workers: usize) -> Arc<PeerTable> {
    if workers == 1 {
        return all.clone();
    }
    Arc::new(all.of_worker(worker, workers))
}

/// The association's next datagram and where it goes, written into a spare buffer (one is
/// made when none is left; an unused one goes back).
fn next_datagram(
    assoc: &mut Association,
    now: Instant,
    spare: &mut Vec<Vec<u8>>,
) -> Option<(SocketAddr, Vec<u8>)> {
    let mut buf = spare.pop().unwrap_or_default();
    match assoc.poll_transmit_to(now, &mut buf) {
        Some(to) => Some((to, buf)),
        None => {
            spare.push(buf);
            None
        }
    }
}

/// What a pass works in, kept from one pass to the next.
struct PassBuffers {
    /// The receive buffers.
    rx: Vec<Vec<u8>>,
    /// What the kernel says of each buffer a read fills.
    meta: Vec<RecvMeta>,
    /// The filled buffers (by place in `rx`) with what the kernel said of them.
    received: Vec<(usize, RecvMeta)>,
    /// Each peer's datagrams and initiations to handle, by place in the driver's table.
    inputs: Vec<Vec<Input>>,
    /// Each peer had more to send at the end of its last service.
    more: Vec<bool>,
    /// The peers this pass services, in order.
    serviced: Vec<usize>,
    tx: Outbox,
    /// Send buffers to reuse.
    spare: Vec<Vec<u8>>,
    accepts: Accepts,
    /// What other workers handed over.
    handed: Vec<Handoff>,
    drop_log: DropLog,
}

impl PassBuffers {
    /// The driver's table now has `peers` peers, in a new order.
    fn peers_changed(&mut self, peers: usize) {
        self.inputs = (0..peers).map(|_| Vec::new()).collect();
        // A peer's first pass, or a pass more for the others: harmless.
        self.more = vec![true; peers];
    }
}

/// How much a read took: buffers filled and datagrams in them.
struct Batch {
    filled: usize,
    datagrams: usize,
}

/// The pass's receive buffers and one peer's share of them.
struct Received<'a> {
    rx: &'a [Vec<u8>],
    inputs: &'a mut Vec<Input>,
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use pep_transport::{EndpointConfig, PeerIdentity, ResetReason};
    use tokio::sync::Notify;

    use super::*;
    use std::sync::Mutex;

    /// Resets every flow the peer opens from inside `accept`, which takes the peer lock.
    struct ResettingAcceptor {
        accepted: Mutex<mpsc::Sender<FlowMeta>>,
    }

    impl FlowAcceptor for ResettingAcceptor {
        fn accept(&self, peer: Arc<Peer>, flow: FlowRef, meta: FlowMeta, _: FlowCharge) {
            peer.reset(&flow, ResetReason::Refused);
            let _ = self
                .accepted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(meta);
        }
    }

    fn meta() -> FlowMeta {
        FlowMeta {
            client: SocketAddr::from(([198, 18, 0, 2], 40000)),
            server: SocketAddr::from(([198, 18, 1, 2], 80)),
            dscp: 0,
            compression: false,
        }
    }

    #[test]
    fn accept_may_take_the_link_lock() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let theirs = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        theirs
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let (accepted_tx, accepted) = mpsc::channel();
        let (stop, stop_rx) = watch::channel(false);
        let cfg = Config::for_rate(10_000_000);
        let ours = rt.block_on(async {
            let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let ours = socket.local_addr().unwrap();
            let mut endpoint = Endpoint::new(EndpointConfig::new(0), None, [7; 32]).unwrap();
            let identity = PeerIdentity {
                public_key: None,
                address: Some(theirs.local_addr().unwrap()),
            };
            endpoint.set_peers([(PeerId(0), identity)]);
            let settings = PeerSettings {
                config: cfg.clone(),
                security: None,
            };
            let factory = AssocFactory {
                peers: [(PeerId(0), settings)].into_iter().collect(),
                role: Role::Responder,
                epoch: 1,
                redundant: false,
                hubs: None,
            };
            let (_, assoc) = factory
                .make(&mut endpoint, Instant::now(), PeerId(0))
                .unwrap();
            let wake = Arc::new(Notify::new());
            let memory = Arc::new(crate::tunnel::memory::MemoryAccount::new(1 << 30, 0, 0));
            let peer = Peer::new(
                PeerId(0),
                "peer",
                Some(assoc),
                1 << 20,
                memory.clone(),
                wake.clone(),
            );
            let gateway = Gateway::new(
                PeerTable::new(vec![Arc::new(peer)], Vec::new()),
                0,
                wake,
                memory,
                10_000,
            );
            let acceptor = Arc::new(ResettingAcceptor {
                accepted: Mutex::new(accepted_tx),
            });
            let driver = Driver::new(
                Arc::new(gateway),
                0,
                TunnelSocket::new(socket).unwrap(),
                endpoint,
                factory,
                None,
                acceptor,
                Notifier,
            );
            tokio::spawn(driver.run(stop_rx));
            ours
        });

        let mut peer = Association::new(cfg, Role::Initiator, 2, Instant::now()).unwrap();
        let flow = peer.open_flow(meta()).unwrap();
        peer.write(flow, b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = vec![0u8; 65_536];
        let mut out = Vec::new();
        let mut got = None;
        let mut reset = None;
        while Instant::now() < deadline && (got.is_none() || reset.is_none()) {
            let now = Instant::now();
            if peer.poll_timeout().is_some_and(|t| t <= now) {
                peer.handle_timeout(now);
            }
            while peer.poll_transmit(now, &mut out) {
                theirs.send_to(&out, ours).unwrap();
            }
            if let Ok((n, _)) = theirs.recv_from(&mut buf) {
                peer.handle_datagram(Instant::now(), &buf[..n]);
            }
            while let Some(ev) = peer.poll_event() {
                if let Event::FlowReset { flow: f, reason } = ev {
                    assert_eq!(f, flow);
                    reset = Some(reason);
                }
            }
            if let Ok(m) = accepted.try_recv() {
                got = Some(m);
            }
        }
        let _ = stop.send(true);
        rt.shutdown_timeout(Duration::from_secs(1));
        assert_eq!(got, Some(meta()), "the acceptor ran within 5 s");
        assert_eq!(
            reset,
            Some(ResetReason::Refused),
            "its reset reached the peer"
        );
    }
}
