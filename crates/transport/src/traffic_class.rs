//! Traffic classes: how the flows of one association share what it may send (docs/PROTOCOL.md
//! §5.10). The application puts each flow in a class when it opens it. Priority classes are
//! served first, each up to its rate cap; the other classes take turns by weight (deficit
//! round robin over stream bytes, a turn of weight × [`SCHEDULING_QUANTUM`]), each within its
//! cap if it has one; inside a class the flows take turns of [`SCHEDULING_QUANTUM`]. With no
//! classes configured every flow is in one class, uncapped, and the turns are those of the
//! flows alone.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::ids::FlowId;
use crate::pacer::Pacer;

/// A traffic class's number: its index in [`Config::classes`](crate::Config::classes).
/// Flows start in class 0.
pub type TrafficClassId = u8;

/// Most traffic classes an association takes.
pub const MAX_TRAFFIC_CLASSES: usize = 64;

/// Stream bytes a flow may send per turn before the next flow's: a typical web object, so
/// short responses are not interleaved packet by packet with each other, while bulk flows
/// still share the link in turns of a few packets. A class's turn is its weight times this.
pub const SCHEDULING_QUANTUM: usize = 8 * 1024;

/// Write times kept per flow for the queue delay; beyond, the two closest in time merge.
const WRITE_TIMES_KEPT: usize = 32;

/// How one traffic class shares the association's sending capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafficClass {
    /// Its share, among the classes with data, of what the priority classes leave (and, among
    /// priority classes, of what their caps let them take together). At least 1.
    pub weight: u32,
    /// Served ahead of every class without it, up to `max_rate_bps` (which it requires).
    pub priority: bool,
    /// Most it sends, in bit/s of stream bytes (first transmissions and repairs); `None`:
    /// no cap.
    pub max_rate_bps: Option<u64>,
}

impl Default for TrafficClass {
    fn default() -> Self {
        TrafficClass {
            weight: 1,
            priority: false,
            max_rate_bps: None,
        }
    }
}

/// What one traffic class of an association sent and held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrafficClassStats {
    /// Stream bytes of its flows sent for the first time.
    pub bytes_sent: u64,
    /// Stream bytes of its flows sent again after a loss.
    pub bytes_retransmitted: u64,
    /// Σ over the bytes sent for the first time of how long each waited between the
    /// application's write and its first transmission, in byte-seconds: divided by
    /// `bytes_sent`, the class's mean queue delay.
    pub queue_delay_byte_seconds: f64,
    /// Flows in it now.
    pub flows_open: u64,
    /// Flows put in it.
    pub flows_total: u64,
}

#[derive(Debug)]
struct Class {
    spec: TrafficClass,
    /// Its flows with something to send, in turn order.
    queue: VecDeque<FlowId>,
    /// At `max_rate_bps`, booked with the stream bytes sent.
    cap: Option<Pacer>,
    /// Stream bytes sent in its current turn at the head of its ring.
    turn_bytes: usize,
    in_ring: bool,
    stats: TrafficClassStats,
}

/// Which flow's data goes next: the classes' queues of flows with data, and the turns
/// between the classes.
#[derive(Debug)]
pub(crate) struct FlowScheduler {
    classes: Vec<Class>,
    /// Priority classes with queued flows, in turn order.
    priority: VecDeque<TrafficClassId>,
    /// The other classes with queued flows, in turn order.
    weighted: VecDeque<TrafficClassId>,
    /// Flows queued in every class together.
    queued: usize,
    /// Classes are configured: their flows' queue delays are measured.
    configured: bool,
}

impl FlowScheduler {
    /// `classes` as configured; none: one uncapped class. `mtu` and `burst` size the caps'
    /// catch-up after an idle moment, as the association's pacer's.
    pub fn new(classes: &[TrafficClass], mtu: usize, burst: Duration) -> Self {
        let specs: Vec<TrafficClass> = if classes.is_empty() {
            vec![TrafficClass::default()]
        } else {
            classes.to_vec()
        };
        FlowScheduler {
            classes: specs
                .into_iter()
                .map(|spec| Class {
                    cap: spec
                        .max_rate_bps
                        .map(|bps| Pacer::new(bps, mtu).with_burst(burst)),
                    spec: TrafficClass {
                        weight: spec.weight.max(1),
                        ..spec
                    },
                    queue: VecDeque::new(),
                    turn_bytes: 0,
                    in_ring: false,
                    stats: TrafficClassStats::default(),
                })
                .collect(),
            priority: VecDeque::new(),
            weighted: VecDeque::new(),
            queued: 0,
            configured: !classes.is_empty(),
        }
    }

    /// Whether the queue delays are measured (classes are configured).
    pub fn measures_delay(&self) -> bool {
        self.configured
    }

    /// `class` if it names one, else class 0.
    pub fn known(&self, class: TrafficClassId) -> TrafficClassId {
        if usize::from(class) < self.classes.len() {
            class
        } else {
            0
        }
    }

    /// No flow has anything queued.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Flows queued in every class together.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Forgets every queued flow (the association restarted); counters stay.
    pub fn clear(&mut self) {
        for c in &mut self.classes {
            c.queue.clear();
            c.turn_bytes = 0;
            c.in_ring = false;
        }
        self.priority.clear();
        self.weighted.clear();
        self.queued = 0;
    }

    /// Queues `flow` of `class` at the back: it has data and waits for its turn.
    pub fn push_back(&mut self, class: TrafficClassId, flow: FlowId) {
        let class = self.known(class);
        self.classes[usize::from(class)].queue.push_back(flow);
        self.queued += 1;
        self.join_ring(class);
    }

    /// Queues `flow` of `class` at the front: its turn goes on.
    pub fn push_front(&mut self, class: TrafficClassId, flow: FlowId) {
        let class = self.known(class);
        self.classes[usize::from(class)].queue.push_front(flow);
        self.queued += 1;
        self.join_ring(class);
    }

    fn join_ring(&mut self, class: TrafficClassId) {
        let c = &mut self.classes[usize::from(class)];
        if !c.in_ring {
            c.in_ring = true;
            if c.spec.priority {
                self.priority.push_back(class);
            } else {
                self.weighted.push_back(class);
            }
        }
    }

    /// Takes `flow` out of `class`'s queue, if it is there.
    pub fn remove(&mut self, class: TrafficClassId, flow: FlowId) -> bool {
        let class = self.known(class);
        let c = &mut self.classes[usize::from(class)];
        let before = c.queue.len();
        c.queue.retain(|&f| f != flow);
        let removed = before - c.queue.len();
        self.queued -= removed;
        removed > 0
    }

    /// The next flow of the class whose turn it is at `now`, taken out of its queue: the
    /// priority classes within their caps first, then the others within theirs. `None` when
    /// no flow is queued or every class with queued flows is held by its cap.
    pub fn pop_next(&mut self, now: Instant) -> Option<(TrafficClassId, FlowId)> {
        let class = self
            .next_in(now, true)
            .or_else(|| self.next_in(now, false))?;
        let flow = self.classes[usize::from(class)].queue.pop_front()?;
        self.queued -= 1;
        Some((class, flow))
    }

    /// The class at the head of a ring that may send at `now`. Classes without queued flows
    /// leave the ring; one held by its cap loses its turn to the next.
    fn next_in(&mut self, now: Instant, priority: bool) -> Option<TrafficClassId> {
        let ring = if priority {
            &mut self.priority
        } else {
            &mut self.weighted
        };
        let mut left = ring.len();
        while left > 0 {
            left -= 1;
            let &class = ring.front()?;
            let c = &mut self.classes[usize::from(class)];
            if c.queue.is_empty() {
                c.in_ring = false;
                c.turn_bytes = 0;
                ring.pop_front();
                continue;
            }
            if c.cap.as_ref().is_some_and(|p| p.delay_until(now).is_some()) {
                c.turn_bytes = 0;
                ring.rotate_left(1);
                continue;
            }
            return Some(class);
        }
        None
    }

    /// Books `bytes` of stream data `class` sent at `now` (`first`: sent for the first time,
    /// after waiting `queued_for` since it was written, if that is known): on its cap, its
    /// counters and its turn, which ends after weight × [`SCHEDULING_QUANTUM`].
    pub fn on_sent(
        &mut self,
        class: TrafficClassId,
        now: Instant,
        bytes: usize,
        first: bool,
        queued_for: Option<Duration>,
    ) {
        let class = self.known(class);
        let c = &mut self.classes[usize::from(class)];
        if first {
            c.stats.bytes_sent += bytes as u64;
            if let Some(d) = queued_for {
                c.stats.queue_delay_byte_seconds += d.as_secs_f64() * bytes as f64;
            }
        } else {
            c.stats.bytes_retransmitted += bytes as u64;
        }
        if let Some(cap) = c.cap.as_mut() {
            cap.on_sent(now, bytes as u64);
        }
        c.turn_bytes += bytes;
        let turn = SCHEDULING_QUANTUM.saturating_mul(c.spec.weight as usize);
        if c.turn_bytes >= turn {
            c.turn_bytes = 0;
            let ring = if c.spec.priority {
                &mut self.priority
            } else {
                &mut self.weighted
            };
            if ring.front() == Some(&class) {
                ring.rotate_left(1);
            }
        }
    }

    /// Whether some queued flow may send at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.classes.iter().any(|c| {
            !c.queue.is_empty() && c.cap.as_ref().is_none_or(|p| p.delay_until(now).is_none())
        })
    }

    /// When the first class with queued flows that its cap holds at `now` may send again;
    /// `None` if none is held.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.classes
            .iter()
            .filter(|c| !c.queue.is_empty())
            .filter_map(|c| c.cap.as_ref().and_then(|p| p.delay_until(now)))
            .min()
    }

    /// A flow was put in `class` (`true`) or left it.
    pub fn count_flow(&mut self, class: TrafficClassId, joined: bool) {
        let class = self.known(class);
        let c = &mut self.classes[usize::from(class)];
        if joined {
            c.stats.flows_total += 1;
        } else {
            // Moved at once by the application that opened it in another class.
            c.stats.flows_total = c.stats.flows_total.saturating_sub(1);
        }
    }

    /// Each class's counters, `flows_open` from `open`: the number of flows in each.
    pub fn stats(&self, open: impl Iterator<Item = TrafficClassId>) -> Vec<TrafficClassStats> {
        let mut out: Vec<TrafficClassStats> =
            self.classes.iter().map(|c| c.stats.clone()).collect();
        for class in open {
            if let Some(s) = out.get_mut(usize::from(class)) {
                s.flows_open += 1;
            }
        }
        out
    }
}

/// When a flow's unsent bytes were written, as `(end offset, instant)` runs in stream
/// order: the queue delay of a byte is the time from its write to its first transmission.
#[derive(Debug, Default)]
pub(crate) struct WriteTimes {
    runs: VecDeque<(u64, Instant)>,
}

impl WriteTimes {
    /// Bytes up to `end` were written at `now`.
    pub fn written(&mut self, end: u64, now: Instant) {
        if let Some(last) = self.runs.back_mut() {
            if last.1 >= now {
                last.0 = end;
                return;
            }
        }
        if self.runs.len() == WRITE_TIMES_KEPT {
            self.merge_closest();
        }
        self.runs.push_back((end, now));
    }

    /// Merges the two neighbouring runs written closest in time, under the older time: the
    /// delays of the newer run's bytes come out longer by at most that gap.
    fn merge_closest(&mut self) {
        let closest = (0..self.runs.len().saturating_sub(1))
            .min_by_key(|&i| self.runs[i + 1].1.saturating_duration_since(self.runs[i].1));
        if let Some(i) = closest {
            let (end, _) = self.runs[i + 1];
            self.runs[i].0 = end;
            self.runs.remove(i + 1);
        }
    }

    /// When the byte at `offset` was written, forgetting the runs before it; `None` if it
    /// was not recorded.
    pub fn sent_from(&mut self, offset: u64) -> Option<Instant> {
        while let Some(&(end, _)) = self.runs.front() {
            if end > offset {
                break;
            }
            self.runs.pop_front();
        }
        self.runs.front().map(|&(_, t)| t)
    }
}

#[cfg(test)]
mod tests;
