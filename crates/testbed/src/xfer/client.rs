//! The traffic tool's client: runs one workload against a server and measures it.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::libc;
use socket2::{Domain, Protocol, Socket, Type};

use super::io::{self as xio, Limit};
use super::pattern::{Digest, Pattern};
use super::proto::{decode_report, Header, Op, REPORT_LEN};
use super::server::send;
use super::{Amount, ClassesOutcome, ClassesSpec, Outcome, Workload};
use super::{PAGE_FIRST_BYTES, PAGE_REQUEST_BYTES};
use super::{PAGE_OBJECTS, PAGE_OBJECT_BYTES, PAGE_PARALLEL};

const CHUNK: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct ClientOpts {
    pub server: SocketAddr,
    /// Congestion control for the client's sockets (None: the namespace default).
    pub cc: Option<String>,
    pub seed: u64,
    /// Give up (and report what was delivered so far) after this long.
    pub max_duration: Duration,
}

/// Runs `w` and measures it. Never panics on network trouble: failures end up in `error`.
pub fn run(w: &Workload, o: &ClientOpts) -> Outcome {
    let deadline = Instant::now() + o.max_duration;
    let mut out = match w {
        Workload::Download(a) => download(o, *a, o.seed, deadline),
        Workload::Upload(a) => upload(o, *a, deadline),
        Workload::Rr {
            request,
            response,
            repeat,
        } => rr(o, *request, *response, *repeat, deadline),
        Workload::Page => page(o, deadline),
        Workload::Flows { count, amount } => flows(o, *count, *amount, deadline),
        Workload::HalfClose { up, down } => half_close(o, *up, *down, deadline),
        Workload::Bidir { up, down } => bidir(o, *up, *down, deadline),
        Workload::Classes(c) => classes(o, c, deadline),
        Workload::Interactive {
            download: amount,
            request,
            response,
            every_ms,
        } => interactive(
            o,
            *amount,
            (*request, *response),
            Duration::from_millis(*every_ms),
            deadline,
        ),
    };
    if out.completion_s > 0.0 {
        out.goodput_bps = out.bytes as f64 * 8.0 / out.completion_s;
    }
    out
}

fn connect(o: &ClientOpts, deadline: Instant) -> io::Result<TcpStream> {
    connect_marked(o, None, deadline)
}

/// Connects with `dscp` in the IP header of every packet, the SYN included (where a
/// gateway reads the client's marking).
fn connect_marked(o: &ClientOpts, dscp: Option<u8>, deadline: Instant) -> io::Result<TcpStream> {
    let sock = Socket::new(
        Domain::for_address(o.server),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    if let Some(dscp) = dscp {
        let tos = u32::from(dscp) << 2;
        match o.server {
            SocketAddr::V4(_) => sock.set_tos(tos)?,
            SocketAddr::V6(_) => sock.set_tclass_v6(tos)?,
        }
    }
    if let Some(cc) = &o.cc {
        sock.set_tcp_congestion(cc.as_bytes())?;
    }
    sock.set_nodelay(true)?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(xio::capped());
    }
    sock.connect_timeout(&o.server.into(), left)?;
    let s: TcpStream = sock.into();
    xio::prepare(&s)?;
    Ok(s)
}

/// Stamps the completion time and folds the transfer's error, if any, into the outcome.
fn conclude(out: &mut Outcome, t0: Instant, r: io::Result<()>) {
    out.completion_s = t0.elapsed().as_secs_f64();
    if let Err(e) = r {
        fail(out, &e);
    }
}

fn fail(out: &mut Outcome, e: &io::Error) {
    if xio::is_capped(e) {
        out.capped = true;
    } else {
        out.error = Some(e.to_string());
        out.intact = Some(false);
    }
}

fn limit(deadline: Instant) -> Limit<'static> {
    Limit {
        deadline: Some(deadline),
        stop: None,
    }
}

fn download(o: &ClientOpts, a: Amount, seed: u64, deadline: Instant) -> Outcome {
    download_counting(o, a, seed, deadline, Marking::default(), |_| {})
}

/// How a download is asked for: the DSCP the client marks it with, and the rate the
/// server paces it at (0: unpaced).
#[derive(Clone, Copy, Debug, Default)]
struct Marking {
    dscp: Option<u8>,
    pace_kbps: u32,
}

/// A download of `a` (verified as any), and the bytes that arrived in each `bin` from its
/// start: how its rate moved.
pub fn download_sampled(o: &ClientOpts, a: Amount, bin: Duration) -> (Outcome, Vec<u64>) {
    let t0 = Instant::now();
    let mut bins = Vec::new();
    let mut out = download_counting(o, a, o.seed, t0 + o.max_duration, Marking::default(), |n| {
        let at = (t0.elapsed().as_nanos() / bin.as_nanos().max(1)) as usize;
        if bins.len() <= at {
            bins.resize(at + 1, 0);
        }
        bins[at] += n as u64;
    });
    if out.completion_s > 0.0 {
        out.goodput_bps = out.bytes as f64 * 8.0 / out.completion_s;
    }
    (out, bins)
}

/// A download, telling `arrived` the size of every read.
fn download_counting(
    o: &ClientOpts,
    a: Amount,
    seed: u64,
    deadline: Instant,
    how: Marking,
    mut arrived: impl FnMut(usize),
) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let mut ok = true;
    let mut digest = Digest::default();
    let r = (|| -> io::Result<()> {
        let mut s = connect_marked(o, how.dscp, deadline)?;
        let (down, duration_ms) = match a {
            Amount::Bytes(n) => (n, 0),
            Amount::Seconds(secs) => (0, (secs * 1000.0).round() as u32),
        };
        let h = Header {
            op: Op::Download,
            seed,
            up: 0,
            down,
            duration_ms,
            pace_kbps: how.pace_kbps,
        };
        xio::write_all(&mut s, &h.encode(), limit(deadline))?;
        let mut p = Pattern::new(seed, 1);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = xio::read_some(&mut s, &mut buf, limit(deadline))?;
            if n == 0 {
                break;
            }
            arrived(n);
            ok &= p.verify(&buf[..n]);
            digest.update(&buf[..n]);
            out.bytes += n as u64;
        }
        if let Amount::Bytes(n) = a {
            ok &= out.bytes == n;
        }
        Ok(())
    })();
    out.intact = Some(ok);
    out.down_digest = Some(digest.hex());
    conclude(&mut out, t0, r);
    out
}

/// Bytes handed to the socket that the peer has not acknowledged yet.
fn unacked(s: &TcpStream) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int; the socket is open.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if rc < 0 {
        0
    } else {
        n.max(0) as u64
    }
}

fn upload(o: &ClientOpts, a: Amount, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let mut written = 0u64;
    let mut stream = None;
    let r = (|| -> io::Result<()> {
        let s = stream.insert(connect(o, deadline)?);
        let (total, send_until) = match a {
            Amount::Bytes(n) => (n, deadline),
            Amount::Seconds(secs) => (u64::MAX, deadline.min(t0 + Duration::from_secs_f64(secs))),
        };
        let h = Header {
            op: Op::Upload,
            seed: o.seed,
            up: if total == u64::MAX { 0 } else { total },
            down: 0,
            duration_ms: 0,
            pace_kbps: 0,
        };
        xio::write_all(s, &h.encode(), limit(deadline))?;
        let mut p = Pattern::new(o.seed, 0);
        let mut buf = vec![0u8; CHUNK];
        while written < total {
            if Instant::now() >= send_until {
                if send_until < deadline {
                    break;
                }
                return Err(xio::capped());
            }
            let n = (total - written).min(CHUNK as u64) as usize;
            p.fill(&mut buf[..n]);
            match xio::write_all(s, &buf[..n], limit(send_until)) {
                Ok(()) => written += n as u64,
                // The time-based end can fall mid-chunk: count what the socket took.
                Err(e) if xio::is_capped(&e) && send_until < deadline => break,
                Err(e) => return Err(e),
            }
        }
        s.shutdown(Shutdown::Write)?;
        let mut rep = [0u8; REPORT_LEN];
        xio::read_exact(s, &mut rep, limit(deadline))?;
        let report = decode_report(&rep);
        out.bytes = report.received;
        out.intact = Some(report.intact);
        out.up_digest = Some(report.digest.hex());
        Ok(())
    })();
    out.completion_s = t0.elapsed().as_secs_f64();
    if let Err(e) = r {
        fail(&mut out, &e);
        if out.capped {
            // No report from the server: count what TCP says it delivered.
            out.bytes = written.saturating_sub(stream.as_ref().map_or(0, unacked));
            out.intact = None;
        }
    }
    out
}

/// One request/response exchange on an open Rr connection; returns its latency and whether
/// the response was intact.
pub fn exchange(
    s: &mut TcpStream,
    up: &mut Pattern,
    down: &mut Pattern,
    request: usize,
    response: usize,
    deadline: Instant,
) -> io::Result<(Duration, bool)> {
    let t = Instant::now();
    let mut msg = vec![0u8; 8 + request];
    msg[..4].copy_from_slice(&(request as u32).to_be_bytes());
    msg[4..8].copy_from_slice(&(response as u32).to_be_bytes());
    up.fill(&mut msg[8..]);
    xio::write_all(s, &msg, limit(deadline))?;
    let mut buf = vec![0u8; response];
    xio::read_exact(s, &mut buf, limit(deadline))?;
    Ok((t.elapsed(), down.verify(&buf)))
}

/// Connects and asks for request/response exchanges with stream `seed`.
pub fn rr_open(o: &ClientOpts, seed: u64, deadline: Instant) -> io::Result<TcpStream> {
    let mut s = connect(o, deadline)?;
    let h = Header {
        op: Op::Rr,
        seed,
        up: 0,
        down: 0,
        duration_ms: 0,
        pace_kbps: 0,
    };
    xio::write_all(&mut s, &h.encode(), limit(deadline))?;
    Ok(s)
}

fn rr(
    o: &ClientOpts,
    request: usize,
    response: usize,
    repeat: usize,
    deadline: Instant,
) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome {
        intact: Some(true),
        ..Default::default()
    };
    let r = (|| -> io::Result<()> {
        let mut s = rr_open(o, o.seed, deadline)?;
        let (mut up, mut down) = (Pattern::new(o.seed, 0), Pattern::new(o.seed, 1));
        for _ in 0..repeat {
            let (lat, ok) = exchange(&mut s, &mut up, &mut down, request, response, deadline)?;
            out.latencies_s.push(lat.as_secs_f64());
            out.bytes += response as u64;
            if !ok {
                out.intact = Some(false);
            }
        }
        Ok(())
    })();
    conclude(&mut out, t0, r);
    out
}

/// A download with requests beside it on a second connection: a request leaves every
/// `every` whether or not the earlier ones were answered (a second thread reads the
/// responses in order), from once the download's connection is asked for until it ends.
/// The outcome is the download's, with the requests' latencies.
fn interactive(
    o: &ClientOpts,
    a: Amount,
    (request, response): (usize, usize),
    every: Duration,
    deadline: Instant,
) -> Outcome {
    let done = Arc::new(AtomicBool::new(false));
    let bulk = {
        let (o, done) = (o.clone(), done.clone());
        thread::spawn(move || {
            let r = download(&o, a, o.seed, deadline);
            done.store(true, Ordering::Relaxed);
            r
        })
    };
    // A different seed: the two connections' byte streams must not be confused.
    let seed = o.seed.wrapping_add(1_000);
    let r = paced_requests(o, seed, (request, response), every, &done, deadline);
    let mut out = bulk.join().unwrap_or_else(|_| Outcome {
        error: Some("download thread panicked".into()),
        intact: Some(false),
        ..Default::default()
    });
    match r {
        Ok((lat, ok)) => {
            out.latencies_s = lat;
            if !ok {
                out.intact = Some(false);
            }
        }
        Err(e) => {
            if out.error.is_none() {
                fail(&mut out, &e);
            }
        }
    }
    out
}

/// Requests on one connection, one leaving every `every` whether or not the earlier ones
/// were answered (a second thread reads the responses in order), until `done`: each one's
/// latency, and whether every response was intact.
fn paced_requests(
    o: &ClientOpts,
    seed: u64,
    (request, response): (usize, usize),
    every: Duration,
    done: &AtomicBool,
    deadline: Instant,
) -> io::Result<(Vec<f64>, bool)> {
    let mut s = rr_open(o, seed, deadline)?;
    let mut reader = s.try_clone()?;
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let responses = thread::spawn(move || -> io::Result<(Vec<f64>, bool)> {
        let mut down = Pattern::new(seed, 1);
        let mut buf = vec![0u8; response];
        let (mut lat, mut ok) = (Vec::new(), true);
        for sent in rx {
            xio::read_exact(&mut reader, &mut buf, limit(deadline))?;
            lat.push(sent.elapsed().as_secs_f64());
            ok &= down.verify(&buf);
        }
        Ok((lat, ok))
    });
    let mut up = Pattern::new(seed, 0);
    let mut msg = vec![0u8; 8 + request];
    msg[..4].copy_from_slice(&(request as u32).to_be_bytes());
    msg[4..8].copy_from_slice(&(response as u32).to_be_bytes());
    let mut next = Instant::now();
    let sent = (|| -> io::Result<()> {
        while !done.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                thread::sleep((next - now).min(xio::TICK));
                continue;
            }
            next += every;
            up.fill(&mut msg[8..]);
            let t = Instant::now();
            xio::write_all(&mut s, &msg, limit(deadline))?;
            if tx.send(t).is_err() {
                break;
            }
        }
        Ok(())
    })();
    drop(tx);
    let answered = responses
        .join()
        .map_err(|_| io::Error::other("response reader panicked"))?;
    sent?;
    answered
}

/// Requests of `request` bytes, each answered by `response` bytes, one every `every` until
/// `done` is set (or `o.max_duration` passes): their latencies, as the interactive
/// workload measures them beside a download.
pub fn requests_until(
    o: &ClientOpts,
    (request, response): (usize, usize),
    every: Duration,
    done: &AtomicBool,
) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let r = paced_requests(
        o,
        o.seed,
        (request, response),
        every,
        done,
        t0 + o.max_duration,
    );
    out.completion_s = t0.elapsed().as_secs_f64();
    match r {
        Ok((lat, ok)) => {
            out.bytes = (lat.len() * response) as u64;
            out.latencies_s = lat;
            out.intact = Some(ok);
        }
        Err(e) => fail(&mut out, &e),
    }
    out
}

/// A browser-like page load: the HTML on one connection, then the objects over up to
/// `PAGE_PARALLEL` connections (the first one reused).
fn page(o: &ClientOpts, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let results = Arc::new(Mutex::new(Outcome {
        intact: Some(true),
        ..Default::default()
    }));
    let next = Arc::new(AtomicUsize::new(0));
    let record = |res: &Mutex<Outcome>, r: io::Result<(Duration, bool)>, bytes: usize| {
        let mut out = res.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Ok((lat, ok)) => {
                out.latencies_s.push(lat.as_secs_f64());
                out.bytes += bytes as u64;
                if !ok {
                    out.intact = Some(false);
                }
            }
            Err(e) => fail(&mut out, &e),
        }
    };
    // Each connection pulls the next object until none are left.
    let worker = {
        let (results, next) = (results.clone(), next.clone());
        move |mut conn: TcpStream, mut up: Pattern, mut down: Pattern| {
            while next.fetch_add(1, Ordering::Relaxed) < PAGE_OBJECTS {
                let r = exchange(
                    &mut conn,
                    &mut up,
                    &mut down,
                    PAGE_REQUEST_BYTES,
                    PAGE_OBJECT_BYTES,
                    deadline,
                );
                let failed = r.is_err();
                record(&results, r, PAGE_OBJECT_BYTES);
                if failed {
                    return;
                }
            }
        }
    };
    match rr_open(o, o.seed, deadline) {
        Err(e) => fail(&mut results.lock().unwrap_or_else(|p| p.into_inner()), &e),
        Ok(mut first) => {
            let (mut up, mut down) = (Pattern::new(o.seed, 0), Pattern::new(o.seed, 1));
            let r = exchange(
                &mut first,
                &mut up,
                &mut down,
                PAGE_REQUEST_BYTES,
                PAGE_FIRST_BYTES,
                deadline,
            );
            let ok = r.is_ok();
            record(&results, r, PAGE_FIRST_BYTES);
            if ok {
                let mut handles = Vec::new();
                for i in 1..PAGE_PARALLEL as u64 {
                    let (w, o2, results) = (worker.clone(), o.clone(), results.clone());
                    handles.push(thread::spawn(move || {
                        let seed = o2.seed + i;
                        match rr_open(&o2, seed, deadline) {
                            Ok(c) => w(c, Pattern::new(seed, 0), Pattern::new(seed, 1)),
                            Err(e) => {
                                fail(&mut results.lock().unwrap_or_else(|p| p.into_inner()), &e)
                            }
                        }
                    }));
                }
                worker(first, up, down);
                for h in handles {
                    let _ = h.join();
                }
            }
        }
    }
    let mut out = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
    out.completion_s = t0.elapsed().as_secs_f64();
    if out.latencies_s.len() != PAGE_OBJECTS + 1 && out.error.is_none() && !out.capped {
        out.error = Some("not every object arrived".into());
        out.intact = Some(false);
    }
    out
}

fn flows(o: &ClientOpts, count: usize, a: Amount, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..count as u64)
        .map(|i| {
            let o = o.clone();
            thread::spawn(move || {
                let mut r = download(&o, a, o.seed + i, deadline);
                if r.completion_s > 0.0 {
                    r.goodput_bps = r.bytes as f64 * 8.0 / r.completion_s;
                }
                r
            })
        })
        .collect();
    let mut out = Outcome {
        intact: Some(true),
        ..Default::default()
    };
    for h in handles {
        let r = h.join().unwrap_or_else(|_| Outcome {
            error: Some("flow thread panicked".into()),
            intact: Some(false),
            ..Default::default()
        });
        out.bytes += r.bytes;
        out.flows_bps.push(r.goodput_bps);
        out.capped |= r.capped;
        // Any corrupted flow fails the run; otherwise any unverifiable one makes it unknown.
        out.intact = match (out.intact, r.intact) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (None, _) | (_, None) => None,
            _ => Some(true),
        };
        if out.error.is_none() {
            out.error = r.error;
        }
    }
    out.completion_s = t0.elapsed().as_secs_f64();
    out.jain_fairness = Some(pep_sim::channel::jain_fairness(&out.flows_bps));
    out
}

/// A paced stream beside bulk downloads, each marked as `c` says, read for `c.seconds`
/// (what a gateway still holds then is not waited for); the rates over the run's last five
/// sixths (the first sixth is the start-up of every flow) in [`Outcome::classes`].
fn classes(o: &ClientOpts, c: &ClassesSpec, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let window_from = t0 + Duration::from_secs_f64(c.seconds / 6.0);
    let end = t0 + Duration::from_secs_f64(c.seconds);
    let planned = end <= deadline;
    let deadline = deadline.min(end);
    let amount = Amount::Seconds(c.seconds);
    let stream = Marking {
        dscp: Some(c.stream_dscp),
        pace_kbps: (c.stream_bps / 1e3).round() as u32,
    };
    let bulk = Marking {
        dscp: Some(c.bulk_dscp),
        pace_kbps: 0,
    };
    let hows: Vec<Marking> = std::iter::once(stream)
        .chain(std::iter::repeat_n(bulk, c.bulk))
        .collect();
    let results: Vec<(Outcome, u64)> = thread::scope(|sc| {
        let handles: Vec<_> = hows
            .iter()
            .enumerate()
            .map(|(i, how)| {
                sc.spawn(move || {
                    let mut in_window = 0u64;
                    let mut r =
                        download_counting(o, amount, o.seed + i as u64, deadline, *how, |n| {
                            if Instant::now() >= window_from {
                                in_window += n as u64;
                            }
                        });
                    if r.completion_s > 0.0 {
                        r.goodput_bps = r.bytes as f64 * 8.0 / r.completion_s;
                    }
                    (r, in_window)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let failed = Outcome {
                        error: Some("flow thread panicked".into()),
                        intact: Some(false),
                        ..Default::default()
                    };
                    (failed, 0)
                })
            })
            .collect()
    });
    let window_s = (Instant::now() - window_from).as_secs_f64();
    let mut out = Outcome {
        intact: Some(true),
        ..Default::default()
    };
    for (r, _) in &results {
        out.bytes += r.bytes;
        out.flows_bps.push(r.goodput_bps);
        // Every flow is cut at the end: only the run's cap coming first is a cut short.
        out.capped |= r.capped && !planned;
        if r.intact != Some(true) {
            out.intact = Some(false);
        }
        if out.error.is_none() {
            out.error.clone_from(&r.error);
        }
    }
    out.completion_s = t0.elapsed().as_secs_f64();
    let rate = |bytes: u64| bytes as f64 * 8.0 / window_s.max(1e-9);
    out.classes = Some(ClassesOutcome {
        window_s,
        stream_bps: rate(results[0].1),
        bulk_bps: rate(results[1..].iter().map(|(_, b)| b).sum()),
    });
    out
}

fn half_close(o: &ClientOpts, up: u64, down: u64, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let mut ok = true;
    let mut digest = Digest::default();
    let r = (|| -> io::Result<()> {
        let mut s = connect(o, deadline)?;
        let h = Header {
            op: Op::HalfClose,
            seed: o.seed,
            up,
            down,
            duration_ms: 0,
            pace_kbps: 0,
        };
        xio::write_all(&mut s, &h.encode(), limit(deadline))?;
        let mut buf = vec![0u8; CHUNK];
        send(
            &mut s,
            &mut Pattern::new(o.seed, 0),
            up,
            &mut buf,
            limit(deadline),
        )?;
        s.shutdown(Shutdown::Write)?;
        let mut p = Pattern::new(o.seed, 1);
        loop {
            let n = xio::read_some(&mut s, &mut buf, limit(deadline))?;
            if n == 0 {
                break;
            }
            ok &= p.verify(&buf[..n]);
            digest.update(&buf[..n]);
            out.bytes += n as u64;
        }
        ok &= out.bytes == down;
        Ok(())
    })();
    out.intact = Some(ok);
    out.down_digest = Some(digest.hex());
    conclude(&mut out, t0, r);
    out
}

/// `up` bytes to the server while `down` bytes come back on the same connection.
fn bidir(o: &ClientOpts, up: u64, down: u64, deadline: Instant) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let mut ok = true;
    let mut digest = Digest::default();
    let mut received = 0u64;
    let r = (|| -> io::Result<()> {
        let mut s = connect(o, deadline)?;
        let h = Header {
            op: Op::Bidir,
            seed: o.seed,
            up,
            down,
            duration_ms: 0,
            pace_kbps: 0,
        };
        xio::write_all(&mut s, &h.encode(), limit(deadline))?;
        let mut tx = s.try_clone()?;
        let seed = o.seed;
        thread::scope(|sc| -> io::Result<()> {
            let sender = sc.spawn(move || -> io::Result<()> {
                let mut buf = vec![0u8; CHUNK];
                send(
                    &mut tx,
                    &mut Pattern::new(seed, 0),
                    up,
                    &mut buf,
                    limit(deadline),
                )?;
                tx.shutdown(Shutdown::Write)
            });
            let mut p = Pattern::new(seed, 1);
            let mut buf = vec![0u8; CHUNK];
            // The download, then the server's report on the upload, then EOF.
            while received < down {
                let want = (down - received).min(CHUNK as u64) as usize;
                let n = xio::read_some(&mut s, &mut buf[..want], limit(deadline))?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                ok &= p.verify(&buf[..n]);
                digest.update(&buf[..n]);
                received += n as u64;
            }
            sender
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("sender panicked")))?;
            let mut rep = [0u8; REPORT_LEN];
            xio::read_exact(&mut s, &mut rep, limit(deadline))?;
            let report = decode_report(&rep);
            ok &= report.intact && report.received == up;
            out.up_digest = Some(report.digest.hex());
            out.bytes = received + report.received;
            if xio::read_some(&mut s, &mut buf, limit(deadline))? != 0 {
                ok = false;
            }
            Ok(())
        })
    })();
    if out.up_digest.is_none() {
        out.bytes = received;
    }
    out.intact = Some(ok);
    out.down_digest = Some(digest.hex());
    conclude(&mut out, t0, r);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xfer::server::Server;

    #[test]
    fn the_classes_mix_delivers_every_flow_exactly_over_loopback() {
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), None).expect("binds");
        let o = ClientOpts {
            server: server.local_addr(),
            cc: None,
            seed: 7,
            max_duration: Duration::from_secs(20),
        };
        let w = Workload::Classes(ClassesSpec {
            stream_bps: 2e6,
            stream_dscp: 34,
            bulk: 2,
            bulk_dscp: 8,
            seconds: 1.2,
        });
        let out = run(&w, &o);
        assert_eq!(out.error, None);
        assert_eq!(out.intact, Some(true));
        assert!(!out.capped);
        assert_eq!(out.flows_bps.len(), 3);
        let c = out.classes.expect("the window's figures");
        assert!(c.stream_bps > 0.0 && c.bulk_bps > 0.0, "{c:?}");
    }
}
