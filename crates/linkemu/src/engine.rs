//! Moves packets between two TUN devices. Per direction, a reader thread takes packets from
//! the near TUN, lets the [`Shaper`] decide their fate and delivery time, and queues survivors
//! in a time-ordered heap; a writer thread sleeps precisely until the earliest one is due and
//! writes it to the far TUN. Delivery times are absolute, so sleep overshoot never accumulates.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
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
use crate::shaper::{Shaper, Verdict};
use crate::stats::{Counters, LinkStats};
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
    packet: Vec<u8>,
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
}

impl Emulator {
    /// Opens both TUN devices (each inside its namespace) and starts moving packets. The
    /// forward direction carries packets from `a` to `b`.
    pub fn start(cfg: &LinkConfig, a: &Endpoint, b: &Endpoint) -> Result<Emulator, Error> {
        cfg.forward.validate()?;
        cfg.ret.validate()?;
        let open = |ep: &Endpoint| {
            let dev = ep.dev.clone();
            netns::run_in(ep.netns.as_deref(), move || tun::open(&dev)).map(Arc::new)
        };
        let (fa, fb) = (open(a)?, open(b)?);
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
        };
        let dirs = [(0, fa.clone(), fb.clone(), true), (1, fb, fa, false)];
        for (idx, from, to, fwd) in dirs {
            let flight = Arc::new(Flight::default());
            let shaper = emu.shapers[idx].clone();
            let (sh, fl) = (emu.shared.clone(), flight.clone());
            let name = if fwd { "emu-fwd" } else { "emu-ret" };
            emu.spawn(format!("{name}-rx"), move || {
                reader(&sh, idx, &from, &shaper, &fl)
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

fn reader(shared: &Shared, idx: usize, from: &File, shaper: &Mutex<Shaper>, flight: &Flight) {
    let counters = &shared.counters[idx];
    let mut buf = vec![0u8; 65_536];
    let mut seq = 0u64;
    while !shared.stop.load(Relaxed) {
        let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(STOP_POLL).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // Not expected with a valid descriptor; back off rather than spin.
            Err(_) => thread::sleep(STOP_POLL),
        }
        // Drain everything readable before polling again: fewer syscalls at high rates.
        loop {
            let n = match (&*from).read(&mut buf) {
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
            let now = shared.start.elapsed();
            let verdict = {
                let mut shaper = shaper.lock().unwrap_or_else(|p| p.into_inner());
                counters.arrived(n, shaper.backlog_bytes(now) + n);
                shaper.offer(now, n)
            };
            match verdict {
                Verdict::Drop(reason) => counters.dropped(reason),
                Verdict::Deliver { at } => {
                    seq += 1;
                    let mut heap = flight.heap.lock().unwrap_or_else(|p| p.into_inner());
                    heap.push(Scheduled {
                        at,
                        seq,
                        packet: buf[..n].to_vec(),
                    });
                    counters.in_flight(heap.len());
                    // Only a new earliest packet changes how long the writer must sleep.
                    let is_head = heap.peek().is_some_and(|h| h.seq == seq);
                    drop(heap);
                    if is_head {
                        flight.due_changed.notify_one();
                    }
                }
            }
        }
    }
}

fn writer(shared: &Shared, idx: usize, to: &File, flight: &Flight) {
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
                    due.push(p.packet);
                }
            }
        }
        for p in due.drain(..) {
            // A TUN write takes the whole packet or fails; anything else is an error too.
            match (&*to).write(&p) {
                Ok(n) if n == p.len() => counters.passed(n),
                _ => counters.write_error(),
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
