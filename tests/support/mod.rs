//! Helpers of the end-to-end relay tests: pepd testbeds, raw sockets in the namespaces, and
//! watching how a connection ends (and when).
//!
//! Sockets belong to the namespace they were created in, whichever thread uses them later,
//! so helpers create them on a namespace thread and hand them back to the test.

#![allow(dead_code)]

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pep_linkemu::{DirectionConfig, LinkConfig};
use pep_testbed::pepd::{PepdOptions, PepdTestbed};
use pep_testbed::xfer::client::ClientOpts;
use pep_testbed::xfer::pattern::{expected_digest, Digest, Pattern};
use pep_testbed::xfer::{Outcome, Workload};

/// The daemon under test: `$PEPD_BIN` when set (another build, or a stand-in), else the
/// `pepd` Cargo built for these tests.
pub fn pepd_bin() -> PathBuf {
    std::env::var_os("PEPD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pepd")))
}

/// Both directions `rate_bps` and `one_way_ms`, drop-tail queue of one BDP (at least 64 kB).
pub fn link(rate_bps: f64, one_way_ms: u64) -> LinkConfig {
    let delay = Duration::from_millis(one_way_ms);
    let bdp = (rate_bps / 8.0 * 2.0 * delay.as_secs_f64()) as usize;
    let d = DirectionConfig {
        rate_bps,
        queue_bytes: bdp.max(64_000),
        delay,
        ..Default::default()
    };
    LinkConfig {
        forward: d.clone(),
        ret: d,
        seed: 1,
        ..Default::default()
    }
}

/// pepd as the tests run it: with routed TCP dropped on the gateways, so every byte that
/// arrives was carried by pepd.
pub fn options() -> PepdOptions {
    PepdOptions {
        binary: Some(pepd_bin()),
        forbid_routed_tcp: true,
        ..Default::default()
    }
}

pub fn up(link: &LinkConfig, opts: &PepdOptions) -> PepdTestbed {
    // The daemons inherit it; the 1,000-flow test needs it in this process too.
    pep_testbed::raise_nofile_limit().expect("RLIMIT_NOFILE");
    PepdTestbed::up(link, opts).unwrap_or_else(|e| panic!("starting the pepd testbed: {e}"))
}

static HEAVY: Mutex<()> = Mutex::new(());

/// Serialises the CPU-heavy tests (2 cores carry two daemons, the emulator and the traffic).
pub fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn opts(server: SocketAddr, seed: u64, max: Duration) -> ClientOpts {
    ClientOpts {
        server,
        cc: None,
        seed,
        max_duration: max,
    }
}

/// Runs `w` from the client and requires it complete, uncapped and without error.
pub fn xfer_ok(tb: &PepdTestbed, w: &Workload, o: &ClientOpts) -> Outcome {
    let out = tb.xfer(w, o).expect("client namespace");
    eprintln!(
        "{w:?}: {}",
        serde_json::to_string(&out).unwrap_or_else(|e| e.to_string())
    );
    assert_eq!(out.error, None, "{w:?} failed");
    assert!(!out.capped, "{w:?} hit its time cap");
    assert_eq!(out.intact, Some(true), "{w:?} corrupted");
    out
}

/// Requires a bidirectional transfer to have delivered exactly `up` and `down` bytes whose
/// digests match the ones computed here from the pattern.
pub fn assert_bidir_exact(out: &Outcome, seed: u64, up: u64, down: u64) {
    assert_eq!(out.bytes, up + down);
    assert_eq!(
        out.down_digest.as_deref(),
        Some(expected_digest(seed, 1, down).hex().as_str()),
        "download digest"
    );
    assert_eq!(
        out.up_digest.as_deref(),
        Some(expected_digest(seed, 0, up).hex().as_str()),
        "upload digest"
    );
}

pub fn listen_in_server(tb: &PepdTestbed, at: SocketAddr) -> TcpListener {
    tb.in_server(move || TcpListener::bind(at))
        .expect("server namespace")
        .unwrap_or_else(|e| panic!("listening on {at}: {e}"))
}

pub fn connect_from_client(tb: &PepdTestbed, to: SocketAddr) -> io::Result<TcpStream> {
    tb.in_client(move || TcpStream::connect_timeout(&to, Duration::from_secs(10)))
        .expect("client namespace")
}

/// Serves every connection the pattern of the seed it sends first (8 bytes), on and on,
/// until the connection fails.
pub fn serve_patterns(listener: TcpListener) {
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut seed = [0u8; 8];
                if s.read_exact(&mut seed).is_err() {
                    return;
                }
                let mut pattern = Pattern::new(u64::from_be_bytes(seed), 0);
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    pattern.fill(&mut buf);
                    if s.write_all(&buf).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// Asks the server of [`serve_patterns`] for `seed`'s pattern and reads `bytes` of it, every
/// byte checked, until `deadline`: the bytes read and checked, and what ended it short.
pub fn download_pattern(
    to: SocketAddr,
    seed: u64,
    bytes: usize,
    deadline: Instant,
) -> (usize, Option<String>) {
    let mut got = 0;
    let read = (|| -> io::Result<()> {
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        let left = deadline.saturating_duration_since(Instant::now());
        c.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        c.write_all(&seed.to_be_bytes())?;
        let mut pattern = Pattern::new(seed, 0);
        let mut buf = vec![0u8; 64 * 1024];
        while got < bytes && Instant::now() < deadline {
            let n = c.read(&mut buf[..(bytes - got).min(64 * 1024)])?;
            if n == 0 || !pattern.verify(&buf[..n]) {
                return Err(io::Error::other("ended or corrupted"));
            }
            got += n;
        }
        Ok(())
    })();
    (got, read.err().map(|e| e.to_string()))
}

/// How a connection ended for the side watching it.
#[derive(Debug)]
pub enum End {
    /// Reset (or refused/aborted/broken pipe), and when the error surfaced.
    Reset { at: Instant, error: String },
    /// A clean EOF: the peer closed normally.
    Eof { at: Instant },
    /// Still open at the deadline.
    Open,
    /// Some other error.
    Other { at: Instant, error: String },
}

impl End {
    pub fn reset_at(&self) -> Option<Instant> {
        match self {
            End::Reset { at, .. } => Some(*at),
            _ => None,
        }
    }
}

fn classify(e: io::Error) -> End {
    let at = Instant::now();
    match e.kind() {
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionRefused
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => End::Reset {
            at,
            error: e.to_string(),
        },
        _ => End::Other {
            at,
            error: e.to_string(),
        },
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Reads and counts until EOF, an error or `deadline`.
pub fn read_until_end(s: &mut TcpStream, deadline: Instant) -> (End, u64) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        if Instant::now() >= deadline {
            return (End::Open, n);
        }
        match s.read(&mut buf) {
            Ok(0) => return (End::Eof { at: Instant::now() }, n),
            Ok(k) => n += k as u64,
            Err(e) if transient(&e) => {}
            Err(e) => return (classify(e), n),
        }
    }
}

/// Writes pattern bytes until an error or `deadline` (a write never fails on a clean
/// close of the peer's side alone, so this only ends on a reset).
pub fn write_until_end(s: &mut TcpStream, seed: u64, deadline: Instant) -> (End, u64) {
    let _ = s.set_write_timeout(Some(Duration::from_millis(20)));
    let mut p = Pattern::new(seed, 1);
    let mut buf = vec![0u8; 16 * 1024];
    p.fill(&mut buf);
    let mut n = 0u64;
    loop {
        if Instant::now() >= deadline {
            return (End::Open, n);
        }
        match s.write(&buf) {
            Ok(k) => n += k as u64,
            Err(e) if transient(&e) => {}
            Err(e) => return (classify(e), n),
        }
    }
}

/// Reads exactly `len` bytes and returns their digest.
pub fn read_digest(s: &mut TcpStream, len: u64) -> io::Result<Digest> {
    let mut d = Digest::default();
    let mut left = len;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        // A socket with a timeout reports a signal as EINTR even under SA_RESTART.
        let k = match s.read(&mut buf[..want]) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => r?,
        };
        if k == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        d.update(&buf[..k]);
        left -= k as u64;
    }
    Ok(d)
}

/// Writes `len` bytes of stream `lane` of `seed`.
pub fn write_pattern(s: &mut TcpStream, seed: u64, lane: u64, len: u64) -> io::Result<()> {
    let mut p = Pattern::new(seed, lane);
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        p.fill(&mut buf[..k]);
        s.write_all(&buf[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// Scrapes pepd's /metrics (127.0.0.1:9464) inside namespace `ns` and parses the text with
/// a Prometheus parser.
pub fn scrape_metrics(ns: &str) -> prometheus_parse::Scrape {
    let body = pep_testbed::in_netns(ns, || {
        let mut s = TcpStream::connect("127.0.0.1:9464").expect("metrics connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("request");
        let mut r = String::new();
        s.read_to_string(&mut r).expect("response");
        r
    })
    .expect("namespace");
    let (_, text) = body.split_once("\r\n\r\n").expect("http body");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines).expect("metrics parse")
}

/// The value of sample `name` (with `label` = value, if given) in a scrape.
pub fn metric_value(
    s: &prometheus_parse::Scrape,
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<f64> {
    let sample = s
        .samples
        .iter()
        .find(|m| m.metric == name && label.is_none_or(|(k, v)| m.labels.get(k) == Some(v)))?;
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => Some(v),
        _ => None,
    }
}
