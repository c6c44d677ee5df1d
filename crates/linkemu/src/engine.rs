//! Moves packets between two TUN devices. Per direction, a reader thread takes packets from
//! the near TUN, lets the [`Shaper`] decide their fate and delivery time, and queues survivors
//! in a time-ordered heap; a writer thread sleeps precisely until the earliest one is due and
//! writes it to the far TUN. Delivery times are absolute, so sleep overshoot never accumulates.
//! UDP GSO bursts arrive whole where the kernel offers it; [`crate::gso`] says when they cross
//! as one unit and when they are cut into datagrams first.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::config::LinkConfig;
use crate::gso::{UdpBurst, VnetHdr, GSO_NONE, VNET_HDR_LEN};
use crate::shaper::{Shaper, Verdict};
use crate::stats::{BurstFate, Counters, LinkStats};
use crate::tun::Tun;
use crate::{netns, tun, Error};
use pep_sim::timeline::Timeline;

/// One side of the link: a TUN device, in a named network namespace or the current one.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub netns: Option<String>,
    pub dev: String,
}

/// How often blocked threads look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

struct Scheduled {
    at: Duration,
    seq: u64,
    /// What is written to the far TUN (behind its `virtio_net_hdr` with the offload on).
    packet: Vec<u8>,
    /// The IP packets it stands for, and their bytes.
    packets: usize,
    ip_bytes: usize,
}

impl Scheduled {
    /// A unit to offer; its delivery time and sequence number are set once it is accepted.
    fn new(packet: Vec<u8>, packets: usize, ip_bytes: usize) -> Scheduled {
        Scheduled {
            at: Duration::ZERO,
            seq: 0,
            packet,
            packets,
            ip_bytes,
        }
    }
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    /// Reversed so the std max-heap pops the earliest delivery first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Packets in flight in one direction, shared by its reader and writer.
#[derive(Default)]
struct Flight {
    heap: Mutex<BinaryHeap<Scheduled>>,
    due_changed: Condvar,
}

struct Shared {
    start: Instant,
    stop: AtomicBool,
    counters: [Counters; 2],
}

/// A running emulator. Dropping it stops the threads.
pub struct Emulator {
    shared: Arc<Shared>,
    /// Each direction's shaper, shared with its reader thread (the one that offers it
    /// packets), so its timeline can be read while the link runs.
    shapers: [Arc<Mutex<Shaper>>; 2],
    threads: Vec<JoinHandle<Duration>>,
    finished_cpu: Duration,
    udp_offload: bool,
}

impl Emulator {
    /// Opens both TUN devices (each inside its namespace) and starts moving packets. The
    /// forward direction carries packets from `a` to `b`.
    pub fn start(cfg: &LinkConfig, a: &Endpoint, b: &Endpoint) -> Result<Emulator, Error> {
        cfg.forward.validate()?;
        cfg.ret.validate()?;
        let open = |ep: &Endpoint, offload: bool| {
            let dev = ep.dev.clone();
            netns::run_in(ep.netns.as_deref(), move || tun::open(&dev, offload))
        };
        let (mut ta, mut tb) = (open(a, !cfg.per_packet)?, open(b, !cfg.per_packet)?);
        // A burst read whole on one side must be written whole on the other: both or neither.
        if ta.vnet != tb.vnet {
            drop((ta, tb));
            (ta, tb) = (open(a, false)?, open(b, false)?);
        }
        let udp_offload = ta.vnet;
        let (fa, fb) = (Arc::new(ta), Arc::new(tb));
        let shared = Arc::new(Shared {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            counters: Default::default(),
        });
        let shaper = |d: &crate::config::DirectionConfig, fwd: bool| {
            Arc::new(Mutex::new(Shaper::new(d.clone(), cfg.direction_seed(fwd))))
        };
        let mut emu = Emulator {
            shared,
            shapers: [shaper(&cfg.forward, true), shaper(&cfg.ret, false)],
            threads: Vec::new(),
            finished_cpu: Duration::ZERO,
            udp_offload,
        };
        let dirs = [(0, fa.clone(), fb.clone(), true), (1, fb, fa, false)];
        for (idx, from, to, fwd) in dirs {
            let whole = if fwd { &cfg.forward } else { &cfg.ret }.passes_bursts_whole();
            let flight = Arc::new(Flight::default());
            let shaper = emu.shapers[idx].clone();
            let (sh, fl) = (emu.shared.clone(), flight.clone());
            let name = if fwd { "emu-fwd" } else { "emu-ret" };
            emu.spawn(format!("{name}-rx"), move || {
                reader(&sh, idx, &from, &shaper, &fl, whole)
            })?;
            let sh = emu.shared.clone();
            emu.spawn(format!("{name}-tx"), move || writer(&sh, idx, &to, &flight))?;
        }
        Ok(emu)
    }

    fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> Result<(), Error> {
        let h = thread::Builder::new()
            .name(name)
            .spawn(move || {
                f();
                thread_cpu()
            })
            .map_err(Error::Thread)?;
        self.threads.push(h);
        Ok(())
    }

    /// When the link started: outage windows count from here.
    pub fn start_time(&self) -> Instant {
        self.shared.start
    }

    /// The forward and return directions' timelines so far.
    pub fn timelines(&self) -> [Timeline; 2] {
        self.shapers.each_ref().map(|s| {
            s.lock()
                .unwrap_or_else(|p| p.into_inner())
                .timeline()
                .clone()
        })
    }

    /// Counters so far, including the CPU time the emulator threads have used.
    pub fn stats(&self) -> LinkStats {
        let live: Duration = self
            .threads
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| cpu_of(h.as_pthread_t()))
            .sum();
        let elapsed = self.shared.start.elapsed().as_secs_f64();
        let cpu = (live + self.finished_cpu).as_secs_f64();
        let [fwd, ret] = self.timelines();
        let mut forward = self.shared.counters[0].snapshot();
        forward.queue_delay = fwd.queue_delay();
        let mut ret_stats = self.shared.counters[1].snapshot();
        ret_stats.queue_delay = ret.queue_delay();
        LinkStats {
            elapsed_s: elapsed,
            cpu_s: cpu,
            cpu_share: if elapsed > 0.0 { cpu / elapsed } else { 0.0 },
            udp_offload: self.udp_offload,
            forward,
            ret: ret_stats,
        }
    }

    /// Stops the threads (packets still in flight are discarded) and returns the final stats.
    pub fn stop(mut self) -> LinkStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Relaxed);
        for h in self.threads.drain(..) {
            // A thread that panicked has no CPU figure left to add.
            self.finished_cpu += h.join().unwrap_or_default();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Largest read: a 64 KiB GSO burst behind its header, with room to spare.
const READ_BUFFER: usize = 1 << 17;

fn reader(
    shared: &Shared,
    idx: usize,
    from: &Tun,
    shaper: &Mutex<Shaper>,
    flight: &Flight,
    bursts_whole: bool,
) {
    let counters = &shared.counters[idx];
    let mut buf = vec![0u8; READ_BUFFER];
    let mut seq = 0u64;
    while !shared.stop.load(Relaxed) {
        let mut fds = [PollFd::new(from.file.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(STOP_POLL).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // Not expected with a valid descriptor; back off rather than spin.
            Err(_) => thread::sleep(STOP_POLL),
        }
        // Drain everything readable before polling again: fewer syscalls at high rates.
        loop {
            let n = match (&from.file).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // The device went away (its namespace was deleted): back off rather than
                // spin on an fd that polls readable forever.
                Err(_) => {
                    thread::sleep(STOP_POLL);
                    break;
                }
            };
            let read = &buf[..n];
            let now = shared.start.elapsed();
            let lock = || shaper.lock().unwrap_or_else(|p| p.into_inner());
            let hdr = if from.vnet {
                VnetHdr::parse(read)
            } else {
                None
            };
            let burst = hdr.and_then(|h| UdpBurst::parse(&h, &read[VNET_HDR_LEN..]));
            let Some(burst) = burst else {
                if hdr.is_some_and(|h| h.gso_type != GSO_NONE) {
                    counters.burst(BurstFate::Uncut);
                }
                let ip_bytes = n - if from.vnet { VNET_HDR_LEN.min(n) } else { 0 };
                let unit = Scheduled::new(read.to_vec(), 1, ip_bytes);
                offer(counters, &mut lock(), flight, &mut seq, now, unit);
                continue;
            };
            if bursts_whole {
                let mut shaper = lock();
                // A burst that would overflow the queue is cut: drop-tail takes datagrams.
                if shaper.has_room(now, burst.wire_bytes()) {
                    counters.burst(BurstFate::Whole);
                    let unit = Scheduled::new(read.to_vec(), burst.segments(), burst.wire_bytes());
                    offer(counters, &mut shaper, flight, &mut seq, now, unit);
                    continue;
                }
            }
            counters.burst(BurstFate::Cut);
            // Cut before taking the lock: stats() waits on it.
            let datagrams = burst.cut(&read[VNET_HDR_LEN..]);
            let mut shaper = lock();
            for datagram in datagrams {
                let ip_bytes = datagram.len() - VNET_HDR_LEN;
                let unit = Scheduled::new(datagram, 1, ip_bytes);
                offer(counters, &mut shaper, flight, &mut seq, now, unit);
            }
        }
    }
}

/// Lets the shaper judge one unit (a packet, or a burst crossing whole) and schedules it.
fn offer(
    counters: &Counters,
    shaper: &mut Shaper,
    flight: &Flight,
    seq: &mut u64,
    now: Duration,
    mut unit: Scheduled,
) {
    counters.arrived(
        unit.packets,
        unit.ip_bytes,
        shaper.backlog_bytes(now) + unit.ip_bytes,
    );
    match shaper.offer(now, unit.ip_bytes) {
        Verdict::Drop(reason) => counters.dropped(reason, unit.packets),
        Verdict::Deliver { at } => {
            *seq += 1;
            (unit.at, unit.seq) = (at, *seq);
            let mut heap = flight.heap.lock().unwrap_or_else(|p| p.into_inner());
            heap.push(unit);
            counters.in_flight(heap.len());
            // Only a new earliest packet changes how long the writer must sleep.
            let is_head = heap.peek().is_some_and(|h| h.seq == *seq);
            drop(heap);
            if is_head {
                flight.due_changed.notify_one();
            }
        }
    }
}

fn writer(shared: &Shared, idx: usize, to: &Tun, flight: &Flight) {
    // Default timer slack (50 us) would blur delivery times; ask for the tightest wakeups.
    let _ = nix::sys::prctl::set_timerslack(1);
    let counters = &shared.counters[idx];
    let mut due = Vec::new();
    while !shared.stop.load(Relaxed) {
        {
            let mut heap = flight.heap.lock().unwrap_or_else(|p| p.into_inner());
            let now = shared.start.elapsed();
            let wait = match heap.peek() {
                None => STOP_POLL,
                Some(h) if h.at > now => (h.at - now).min(STOP_POLL),
                Some(_) => Duration::ZERO,
            };
            if !wait.is_zero() {
                drop(
                    flight
                        .due_changed
                        .wait_timeout(heap, wait)
                        .unwrap_or_else(|p| p.into_inner()),
                );
                continue;
            }
            while heap.peek().is_some_and(|h| h.at <= now) {
                if let Some(p) = heap.pop() {
                    due.push(p);
                }
            }
        }
        for p in due.drain(..) {
            // A TUN write takes the whole packet or fails; anything else is an error too.
            match (&to.file).write(&p.packet) {
                Ok(n) if n == p.packet.len() => counters.passed(p.packets, p.ip_bytes),
                _ => counters.write_error(p.packets),
            }
        }
    }
}

fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// CPU time of another live thread of this process.
fn cpu_of(thread: libc::pthread_t) -> Duration {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` is a joinable thread we own and have not joined, so the id is valid;
    // `clock` is a valid out-pointer.
    if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 {
        return Duration::ZERO;
    }
    nix::time::clock_gettime(nix::time::ClockId::from_raw(clock))
        .map(Duration::from)
        .unwrap_or_default()
}
