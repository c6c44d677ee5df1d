//! The discrete-event simulation: pairs of transport endpoints (gateway A on the client side,
//! B on the server side) exchanging datagrams over one modelled forward link (A→B) and one
//! return link (B→A), with a bulk application on each flow that writes seeded pseudo-random
//! bytes at A and verifies every byte at B.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use pep_transport::{
    Association, Config, Event, FlowId, FlowMeta, ReadOutcome, Role, Stats, TrafficClassId,
};

use crate::competitor::CubicFlow;
use crate::link::{Link, LinkConfig, LinkStats, Offer};
use crate::timeline::{Timeline, BUCKET};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub forward: LinkConfig,
    pub ret: LinkConfig,
    /// Transport settings of the A side (sending bulk data); `rate_bps` is what A paces at.
    pub a_config: Config,
    /// Transport settings of the B side (sending ACKs).
    pub b_config: Config,
    pub associations: usize,
    pub flows_per_association: usize,
    pub workload: Workload,
    pub seed: u64,
    /// Give up after this much simulated time from the start of the transfer.
    pub time_limit: Duration,
    /// Unresponsive traffic on the forward link from other senders.
    pub cross_traffic: Option<CrossTraffic>,
    /// A loss-based TCP flow (CUBIC) on the forward link from the start, with packets of
    /// this many bytes on the wire.
    pub competing_flow: Option<u64>,
    /// An interactive flow beside the bulk ones on the first association.
    pub interactive: Option<Interactive>,
    /// Flows open this long after the association is established (a gateway that has been
    /// up for a while when traffic comes), not at once.
    pub start_after: Duration,
}

/// A constant-rate stream of packets that shares the forward link's queue and capacity
/// with the simulated senders and responds to nothing (a UDP video stream, another
/// terminal's traffic on a shared beam).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossTraffic {
    pub rate_bps: u64,
    pub packet_bytes: u64,
}

/// A message of `bytes` written every `every` on its own flow (a request, a keystroke, a
/// game update, a paced video stream); its latency is from the write at A to its last byte
/// read at B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interactive {
    pub every: Duration,
    pub bytes: usize,
    /// The traffic class of A's `Config::classes` its flow is put in; the bulk flows are in
    /// class 0.
    pub class: TrafficClassId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Each flow sends without end for this long.
    Seconds(Duration),
    /// This many bytes in total, split evenly across all flows, then FIN.
    Bytes(u64),
}

/// Per-flow outcome.
#[derive(Debug, Clone, Default)]
pub struct FlowResult {
    pub bytes_delivered: u64,
    /// Bytes delivered by the end of a `Seconds` run's window.
    pub bytes_in_window: u64,
    pub intact: bool,
    pub completed_at: Option<Duration>,
    pub reset: bool,
}

#[derive(Debug, Clone)]
pub struct Outcome {
    /// When every association had completed its handshake and flows were opened.
    pub transfer_start: Duration,
    pub sim_end: Duration,
    pub flows: Vec<FlowResult>,
    pub a_stats: Vec<Stats>,
    pub b_stats: Vec<Stats>,
    pub forward: LinkStats,
    pub ret: LinkStats,
    pub outage_events: Vec<(Duration, &'static str)>,
    pub events_processed: u64,
    /// The forward link's queue and deliveries over time.
    pub forward_timeline: Timeline,
    /// Latency of each interactive message delivered.
    pub interactive_latencies: Vec<Duration>,
    /// The first A side's capacity estimate (bit/s) at the start of each timeline bucket.
    pub estimates: Vec<u64>,
    /// The first A side's datagram size at the start of each timeline bucket.
    pub datagram_sizes: Vec<u64>,
    /// Stream bytes the B sides read in each timeline bucket.
    pub payload: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EvKind {
    /// Datagram index into the pending store, for endpoint `node`.
    Deliver {
        node: usize,
        slot: usize,
    },
    Timer {
        node: usize,
        generation: u64,
    },
    /// The next packet of cross traffic.
    Cross,
    /// The competing flow learns the fate of its packet sent at `sent_at`.
    CompetitorFeedback {
        sent_at: Duration,
        lost: bool,
    },
    /// Interactive message number `k` is written.
    Message {
        k: usize,
    },
    /// Record the estimates for the timeline.
    Sample,
    /// Open the flows of A side `node`.
    OpenFlows {
        node: usize,
    },
}

/// Client port of the interactive flow (bulk flows use 10000 + their index).
const INTERACTIVE_PORT: u16 = 9999;

/// Byte at `offset` of flow `flow`'s stream: a position-indexed generator, so writer and
/// verifier need no shared state and any chunking yields the same stream.
pub fn stream_bytes(seed: u64, flow: u64, offset: u64, out: &mut [u8]) {
    let key = seed ^ flow.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut pos = offset;
    let mut i = 0;
    while i < out.len() {
        let word = splitmix(key ^ (pos / 8));
        let bytes = word.to_le_bytes();
        let within = (pos % 8) as usize;
        let n = (8 - within).min(out.len() - i);
        out[i..i + n].copy_from_slice(&bytes[within..within + n]);
        i += n;
        pos += n as u64;
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Sender {
    flow: FlowId,
    index: usize,
    written: u64,
    total: Option<u64>,
    finished: bool,
}

struct Receiver {
    index: usize,
    received: u64,
    intact: bool,
    scratch: Vec<u8>,
    /// The interactive flow: messages are timed, not counted as bulk.
    interactive: bool,
}

struct Node {
    assoc: Association,
    /// 0 = A (bulk sender, forward link), 1 = B.
    side: usize,
    pair: usize,
    timer_generation: u64,
    timer_at: Option<Duration>,
    senders: Vec<Sender>,
    receivers: HashMap<FlowId, Receiver>,
    flows_opened: bool,
}

const WRITE_CHUNK: usize = 256 * 1024;

/// Datagrams an endpoint reads before it sends, when several reach it at the same instant:
/// the daemon's tunnel workers read their socket in batches of this many (`BATCH` in its
/// memory budget) and send only after, so a frame of a slotted link, or a bunch released
/// behind a late packet, is acknowledged by one ACK.
const RECEIVE_BATCH: usize = 64;

pub struct Simulation {
    sc: Scenario,
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<(Duration, u64, EvKind)>>,
    seq: u64,
    nodes: Vec<Node>,
    forward: Link,
    ret: Link,
    competitor: Option<CubicFlow>,
    store: Vec<Option<Vec<u8>>>,
    free_slots: Vec<usize>,
    flows: Vec<FlowResult>,
    transfer_start: Option<Duration>,
    write_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    outage_events: Vec<(Duration, &'static str)>,
    events_processed: u64,
    /// The interactive flow at A, once open.
    interactive_flow: Option<FlowId>,
    /// When each interactive message was written.
    message_written: Vec<Duration>,
    interactive_latencies: Vec<Duration>,
    interactive_corrupt: bool,
    estimates: Vec<u64>,
    datagram_sizes: Vec<u64>,
    payload: Vec<u64>,
}

/// Flow index (for its byte stream) of the interactive flow.
fn interactive_index(sc: &Scenario) -> usize {
    sc.associations * sc.flows_per_association
}

impl Simulation {
    pub fn new(sc: Scenario) -> Result<Self, pep_transport::InvalidConfig> {
        let base = Instant::now();
        let mut nodes = Vec::new();
        for pair in 0..sc.associations {
            for side in 0..2 {
                let (cfg, role) = if side == 0 {
                    (sc.a_config.clone(), Role::Initiator)
                } else {
                    (sc.b_config.clone(), Role::Responder)
                };
                let epoch = splitmix(sc.seed ^ ((pair as u64) << 8 | side as u64)) | 1;
                nodes.push(Node {
                    assoc: Association::new(cfg, role, epoch, base)?,
                    side,
                    pair,
                    timer_generation: 0,
                    timer_at: None,
                    senders: Vec::new(),
                    receivers: HashMap::new(),
                    flows_opened: false,
                });
            }
        }
        let flow_count = sc.associations * sc.flows_per_association;
        let forward = Link::new(sc.forward.clone(), splitmix(sc.seed ^ 0xf0f0));
        let ret = Link::new(sc.ret.clone(), splitmix(sc.seed ^ 0x0f0f));
        let competitor = sc
            .competing_flow
            .map(|bytes| CubicFlow::new(bytes, sc.forward.delay + sc.ret.delay));
        Ok(Simulation {
            sc,
            base,
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            nodes,
            forward,
            ret,
            competitor,
            store: Vec::new(),
            free_slots: Vec::new(),
            flows: vec![
                FlowResult {
                    intact: true,
                    ..Default::default()
                };
                flow_count
            ],
            transfer_start: None,
            write_buf: vec![0; WRITE_CHUNK],
            tx_buf: Vec::with_capacity(2048),
            outage_events: Vec::new(),
            events_processed: 0,
            interactive_flow: None,
            message_written: Vec::new(),
            interactive_latencies: Vec::new(),
            interactive_corrupt: false,
            estimates: Vec::new(),
            datagram_sizes: Vec::new(),
            payload: Vec::new(),
        })
    }

    fn push(&mut self, at: Duration, kind: EvKind) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, kind)));
    }

    fn all_done(&self) -> bool {
        match self.sc.workload {
            Workload::Seconds(s) => self.transfer_start.is_some_and(|t| self.now >= t + s),
            Workload::Bytes(_) => {
                self.transfer_start.is_some()
                    && self
                        .flows
                        .iter()
                        .all(|f| f.completed_at.is_some() || f.reset)
            }
        }
    }

    pub fn run(mut self) -> Outcome {
        for n in 0..self.nodes.len() {
            self.service(n);
        }
        if self.sc.cross_traffic.is_some() {
            self.push(Duration::ZERO, EvKind::Cross);
        }
        self.competitor_sends();
        self.push(Duration::ZERO, EvKind::Sample);
        while let Some(Reverse((at, _, kind))) = self.queue.pop() {
            if let Some(start) = self.transfer_start {
                if at > start + self.sc.time_limit {
                    break;
                }
            } else if at > self.sc.time_limit {
                break;
            }
            self.now = at;
            self.events_processed += 1;
            let now = self.base + at;
            let node = match kind {
                EvKind::Deliver { node, slot } => {
                    self.deliver(now, node, slot);
                    // Datagrams that reach an endpoint at the same instant are read as one
                    // batch before it sends, as the daemon reads its socket.
                    let mut batch = 1;
                    while batch < RECEIVE_BATCH {
                        let slot = match self.queue.peek() {
                            Some(Reverse((t, _, EvKind::Deliver { node: to, slot })))
                                if *t == at && *to == node =>
                            {
                                *slot
                            }
                            _ => break,
                        };
                        self.queue.pop();
                        self.events_processed += 1;
                        self.deliver(now, node, slot);
                        batch += 1;
                    }
                    node
                }
                EvKind::Timer { node, generation } => {
                    if generation != self.nodes[node].timer_generation {
                        continue;
                    }
                    self.nodes[node].timer_at = None;
                    self.nodes[node].assoc.handle_timeout(now);
                    node
                }
                EvKind::Cross => {
                    self.cross_packet();
                    continue;
                }
                EvKind::CompetitorFeedback { sent_at, lost } => {
                    if let Some(c) = self.competitor.as_mut() {
                        if lost {
                            c.on_loss(self.now, sent_at);
                        } else {
                            c.on_ack(self.now, sent_at);
                        }
                    }
                    self.competitor_sends();
                    continue;
                }
                EvKind::Sample => {
                    let st = self.nodes[0].assoc.stats();
                    self.estimates.push(st.capacity.estimate_bps);
                    self.datagram_sizes.push(st.datagram_size);
                    self.push(self.now + BUCKET, EvKind::Sample);
                    continue;
                }
                EvKind::Message { k } => {
                    self.write_message(k);
                    0
                }
                EvKind::OpenFlows { node } => {
                    self.open_flows(node);
                    node
                }
            };
            self.service(node);
            if self.all_done() {
                break;
            }
        }
        self.finish()
    }

    fn deliver(&mut self, now: Instant, node: usize, slot: usize) {
        let data = self.store[slot].take().unwrap_or_default();
        self.free_slots.push(slot);
        self.nodes[node].assoc.handle_datagram(now, &data);
    }

    /// Application I/O, transmission and timer re-arming for one endpoint after any input.
    fn service(&mut self, n: usize) {
        let now = self.base + self.now;
        self.drain_events(n);
        self.write_app_data(n);
        loop {
            let mut buf = std::mem::take(&mut self.tx_buf);
            let sent = self.nodes[n].assoc.poll_transmit(now, &mut buf);
            if sent {
                self.transmit(n, &buf);
            }
            self.tx_buf = buf;
            if !sent {
                break;
            }
        }
        // Sending can produce events too (none today), and reading may free credit to send.
        self.drain_events(n);
        let next = self.nodes[n].assoc.poll_timeout();
        let node = &mut self.nodes[n];
        match next {
            Some(t) => {
                let at = t
                    .saturating_duration_since(self.base)
                    .max(self.now + Duration::from_nanos(1));
                if node.timer_at != Some(at) {
                    node.timer_generation += 1;
                    node.timer_at = Some(at);
                    let generation = node.timer_generation;
                    self.push(
                        at,
                        EvKind::Timer {
                            node: n,
                            generation,
                        },
                    );
                }
            }
            None => {
                node.timer_generation += 1;
                node.timer_at = None;
            }
        }
    }

    fn cross_packet(&mut self) {
        let Some(c) = self.sc.cross_traffic else {
            return;
        };
        let _ = self.forward.offer_cross(self.now, c.packet_bytes);
        let gap = Duration::from_nanos(c.packet_bytes * 8 * 1_000_000_000 / c.rate_bps.max(1));
        self.push(self.now + gap.max(Duration::from_nanos(1)), EvKind::Cross);
    }

    /// The competing flow sends what its window allows, back to back as TCP does on ACKs.
    fn competitor_sends(&mut self) {
        while let Some(c) = self.competitor.as_mut().filter(|c| c.can_send()) {
            c.on_sent();
            let (bytes, noticed) = (c.packet_bytes, c.loss_noticed_after());
            let sent_at = self.now;
            let (at, lost) = match self.forward.offer_cross(self.now, bytes) {
                Offer::Delivered { arrival } => (arrival + self.sc.ret.delay_at(arrival), false),
                Offer::QueueDrop | Offer::Impaired(_) => (self.now + noticed, true),
            };
            self.push(at, EvKind::CompetitorFeedback { sent_at, lost });
        }
    }

    /// Writes interactive message `k` at A and schedules the next.
    fn write_message(&mut self, k: usize) {
        let Some((flow, msg)) = self.interactive_flow.zip(self.sc.interactive) else {
            return;
        };
        let index = interactive_index(&self.sc) as u64;
        let mut buf = vec![0u8; msg.bytes];
        stream_bytes(self.sc.seed, index, (k * msg.bytes) as u64, &mut buf);
        // The flow's buffer holds many messages; one that does not fit is a stalled flow,
        // which the latencies will show.
        let _ = self.nodes[0].assoc.write(flow, &buf);
        self.message_written.push(self.now);
        self.push(self.now + msg.every, EvKind::Message { k: k + 1 });
    }

    fn transmit(&mut self, n: usize, datagram: &[u8]) {
        let (side, pair) = (self.nodes[n].side, self.nodes[n].pair);
        let overhead = self.nodes[n].assoc.config().wire_overhead as u64;
        let wire = datagram.len() as u64 + overhead;
        let link = if side == 0 {
            &mut self.forward
        } else {
            &mut self.ret
        };
        if let Offer::Delivered { arrival } = link.offer(self.now, wire) {
            let slot = match self.free_slots.pop() {
                Some(s) => {
                    self.store[s] = Some(datagram.to_vec());
                    s
                }
                None => {
                    self.store.push(Some(datagram.to_vec()));
                    self.store.len() - 1
                }
            };
            let peer = pair * 2 + (1 - side);
            self.push(arrival, EvKind::Deliver { node: peer, slot });
        }
    }

    fn open_flows(&mut self, n: usize) {
        if self.nodes[n].flows_opened {
            return;
        }
        let per = self.sc.flows_per_association;
        let total_flows = (self.sc.associations * per) as u64;
        let pair = self.nodes[n].pair;
        for k in 0..per {
            let index = pair * per + k;
            let meta = FlowMeta {
                client: SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
                    10_000 + index as u16,
                ),
                server: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)), 80),
                dscp: 0,
                compression: false,
            };
            let Ok(flow) = self.nodes[n].assoc.open_flow(meta) else {
                self.flows[index].reset = true;
                continue;
            };
            let total = match self.sc.workload {
                Workload::Bytes(b) => {
                    Some(b / total_flows + u64::from((index as u64) < b % total_flows))
                }
                Workload::Seconds(_) => None,
            };
            self.nodes[n].senders.push(Sender {
                flow,
                index,
                written: 0,
                total,
                finished: false,
            });
        }
        if pair == 0 && self.sc.interactive.is_some() {
            let meta = FlowMeta {
                client: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), INTERACTIVE_PORT),
                server: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)), 80),
                dscp: 0,
                compression: false,
            };
            let class = self.sc.interactive.map_or(0, |m| m.class);
            if let Ok(flow) = self.nodes[n].assoc.open_flow_in_class(meta, class) {
                self.interactive_flow = Some(flow);
                self.push(self.now, EvKind::Message { k: 0 });
            }
        }
        self.nodes[n].flows_opened = true;
        if self
            .nodes
            .iter()
            .filter(|x| x.side == 0)
            .all(|x| x.flows_opened)
        {
            self.transfer_start = Some(self.now);
        }
    }

    fn drain_events(&mut self, n: usize) {
        while let Some(ev) = self.nodes[n].assoc.poll_event() {
            match ev {
                Event::Established => {
                    if self.nodes[n].side == 0 && !self.nodes[n].flows_opened {
                        if self.sc.start_after.is_zero() {
                            self.open_flows(n);
                        } else {
                            self.push(
                                self.now + self.sc.start_after,
                                EvKind::OpenFlows { node: n },
                            );
                        }
                    }
                }
                Event::FlowOpened { flow, meta } => {
                    let interactive = meta.client.port() == INTERACTIVE_PORT;
                    let index = if interactive {
                        interactive_index(&self.sc)
                    } else {
                        usize::from(meta.client.port().saturating_sub(10_000))
                    };
                    self.nodes[n].receivers.insert(
                        flow,
                        Receiver {
                            index,
                            received: 0,
                            intact: true,
                            scratch: Vec::new(),
                            interactive,
                        },
                    );
                    self.read_flow(n, flow);
                }
                Event::FlowReadable { flow } => self.read_flow(n, flow),
                Event::FlowReset { flow, .. } => {
                    if let Some(r) = self.nodes[n].receivers.get(&flow) {
                        self.flows[r.index].reset = true;
                    }
                    if let Some(s) = self.nodes[n].senders.iter().find(|s| s.flow == flow) {
                        self.flows[s.index].reset = true;
                    }
                }
                Event::OutageStarted => {
                    if self.nodes[n].side == 0 {
                        self.outage_events.push((self.now, "outage_started"));
                    }
                }
                Event::OutageEnded { .. } => {
                    if self.nodes[n].side == 0 {
                        self.outage_events.push((self.now, "outage_ended"));
                    }
                }
                Event::FlowWritable { .. }
                | Event::FlowClosed { .. }
                | Event::PeerRestarted
                | Event::AssociationLost { .. }
                | Event::RemoteMoved { .. }
                | Event::Handover { .. } => {}
            }
        }
    }

    fn read_flow(&mut self, n: usize, flow: FlowId) {
        let seed = self.sc.seed;
        let start = self.transfer_start.unwrap_or(self.now);
        let window_end = match self.sc.workload {
            Workload::Seconds(s) => Some(start + s),
            Workload::Bytes(_) => None,
        };
        let now = self.now;
        let node = &mut self.nodes[n];
        let Some(rx) = node.receivers.get_mut(&flow) else {
            // Data before the open's metadata: read once the FlowOpened event names it.
            return;
        };
        let message_bytes = self.sc.interactive.map_or(1, |m| m.bytes.max(1)) as u64;
        loop {
            match node.assoc.read(flow, usize::MAX) {
                Ok(ReadOutcome::Data(bytes)) => {
                    rx.scratch.resize(bytes.len(), 0);
                    stream_bytes(seed, rx.index as u64, rx.received, &mut rx.scratch);
                    if rx.scratch[..] != bytes[..] {
                        rx.intact = false;
                    }
                    let before = rx.received;
                    rx.received += bytes.len() as u64;
                    let bucket = (now.as_nanos() / BUCKET.as_nanos()) as usize;
                    if self.payload.len() <= bucket {
                        self.payload.resize(bucket + 1, 0);
                    }
                    self.payload[bucket] += bytes.len() as u64;
                    if rx.interactive {
                        // Every message whose last byte arrived with this read.
                        for k in before / message_bytes..rx.received / message_bytes {
                            if let Some(&w) = self.message_written.get(k as usize) {
                                self.interactive_latencies.push(now.saturating_sub(w));
                            }
                        }
                        if !rx.intact {
                            self.interactive_corrupt = true;
                        }
                        continue;
                    }
                    let res = &mut self.flows[rx.index];
                    res.bytes_delivered = rx.received;
                    if window_end.is_none_or(|e| now <= e) {
                        res.bytes_in_window = rx.received;
                    }
                    res.intact &= rx.intact;
                }
                Ok(ReadOutcome::Finished) => {
                    let res = &mut self.flows[rx.index];
                    res.completed_at.get_or_insert(now);
                    break;
                }
                Ok(ReadOutcome::Blocked) | Err(_) => break,
            }
        }
    }

    fn write_app_data(&mut self, n: usize) {
        let seed = self.sc.seed;
        let node = &mut self.nodes[n];
        for s in &mut node.senders {
            if s.finished {
                continue;
            }
            loop {
                let remaining = s.total.map_or(u64::MAX, |t| t - s.written);
                if remaining == 0 {
                    if node.assoc.finish(s.flow).is_ok() {
                        s.finished = true;
                    }
                    break;
                }
                let want = remaining
                    .min(WRITE_CHUNK as u64)
                    .min(node.assoc.send_capacity(s.flow) as u64)
                    as usize;
                if want == 0 {
                    break;
                }
                let buf = &mut self.write_buf[..want];
                stream_bytes(seed, s.index as u64, s.written, buf);
                match node.assoc.write(s.flow, buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => s.written += k as u64,
                }
            }
        }
    }

    fn finish(self) -> Outcome {
        let mut flows = self.flows;
        for f in &mut flows {
            if let Workload::Bytes(_) = self.sc.workload {
                f.intact &= f.completed_at.is_some() && !f.reset;
            } else {
                f.intact &= !f.reset;
            }
        }
        if self.interactive_corrupt {
            for f in &mut flows {
                f.intact = false;
            }
        }
        let start = self.transfer_start.unwrap_or(self.now);
        for f in &mut flows {
            f.completed_at = f.completed_at.map(|t| t.saturating_sub(start));
        }
        Outcome {
            transfer_start: start,
            sim_end: self.now,
            flows,
            a_stats: self
                .nodes
                .iter()
                .filter(|n| n.side == 0)
                .map(|n| n.assoc.stats())
                .collect(),
            b_stats: self
                .nodes
                .iter()
                .filter(|n| n.side == 1)
                .map(|n| n.assoc.stats())
                .collect(),
            forward: self.forward.stats().clone(),
            ret: self.ret.stats().clone(),
            outage_events: self.outage_events,
            events_processed: self.events_processed,
            forward_timeline: self.forward.timeline().clone(),
            interactive_latencies: self.interactive_latencies,
            estimates: self.estimates,
            datagram_sizes: self.datagram_sizes,
            payload: self.payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_bytes_is_position_indexed() {
        let mut whole = vec![0u8; 100];
        stream_bytes(1, 2, 5, &mut whole);
        let mut a = vec![0u8; 37];
        let mut b = vec![0u8; 63];
        stream_bytes(1, 2, 5, &mut a);
        stream_bytes(1, 2, 42, &mut b);
        assert_eq!([a, b].concat(), whole);
    }
}
