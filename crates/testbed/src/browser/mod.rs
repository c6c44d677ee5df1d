//! `pep-testbed browser`: a real browser (headless chromium) loads a page from a real
//! HTTP/1.1, HTTP/2 and HTTP/3 server (caddy) across the emulated satellite link, without
//! pepd or through pepd with a QUIC policy ([`Mode`]); each run is a first visit and a
//! repeat visit, with the load time and the protocol each object came over.
//!
//! A visit is one browser process with a profile kept across the run's visits: before the
//! repeat visit the browser is closed (it writes what it learned, Alt-Svc included, into
//! the profile) and its HTTP cache removed, so the repeat visit starts with new
//! connections, an empty cache and the server's HTTP/3 advertisement known.
//!
//! Chromium refuses QUIC to a server whose certificate chains to a root it did not ship
//! with (the handshake fails with `ERR_QUIC_CERT_ROOT_NOT_KNOWN`, QUIC is marked broken and
//! the browser stays on TCP), whatever the user's trust store says; the only exemption is
//! an origin forced onto QUIC with `--origin-to-force-quic-on`. The repeat visit of the
//! modes where QUIC can work (plain and `quic = "pass"`) therefore forces QUIC for the
//! page's origin, standing for a browser that learned Alt-Svc from a publicly trusted
//! server; under `quic = "reject"` nothing is forced (a forced origin never falls back to
//! TCP), and the browser's own QUIC attempts meet the gateway's ICMP error. Each visit
//! says whether QUIC was forced, and lists the browser's QUIC attempts from its NetLog.

pub mod cdp;
pub mod netlog;
pub mod site;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use pep_linkemu::LinkConfig;
use serde::Serialize;
use serde_json::{json, Value};

use crate::addr::SERVER_V4;
use crate::pepd::{merge_toml, Gateways, Interception, PepdOptions};
use crate::topology::{command_in, HostTuning, Topology};
use crate::{in_netns, Error};

use cdp::{method_of, Browser, Launch};

/// How the gateways treat the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No pepd: the gateways route everything.
    Plain,
    /// pepd with `[rules] quic = "pass"`: TCP accelerated, QUIC routed untouched.
    Pass,
    /// pepd with `[rules] quic = "reject"`: the clients' QUIC answered with an ICMP error.
    Reject,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Pass => "pass",
            Mode::Reject => "reject",
        }
    }

    /// The `[rules] quic` value of pepd in this mode.
    fn quic_policy(self) -> Option<&'static str> {
        match self {
            Mode::Plain => None,
            Mode::Pass => Some("pass"),
            Mode::Reject => Some("reject"),
        }
    }

    /// Whether the repeat visit forces QUIC for the page's origin (see the module comment).
    fn forces_quic_on_repeat(self) -> bool {
        self != Mode::Reject
    }
}

/// One run of the workload.
#[derive(Clone, Debug)]
pub struct BrowserSpec {
    pub profile: String,
    pub link: LinkConfig,
    pub mode: Mode,
    /// How pepd runs in the pepd modes; the mode sets `[rules] quic` and has pepd write the
    /// interception rules (`pepd nft-rules`), where the QUIC policy lives.
    pub pepd: PepdOptions,
    /// A visit still loading after this long fails the run.
    pub visit_timeout: Duration,
    /// Keep the run's directory (page, certificates, profile, NetLogs, logs).
    pub keep: bool,
}

/// What one visit measured.
#[derive(Clone, Debug, Serialize)]
pub struct Visit {
    /// "first" or "repeat".
    pub visit: &'static str,
    /// Whether the browser was told `--origin-to-force-quic-on` for the page's origin.
    pub quic_forced: bool,
    /// Navigation start to the load event (the page's Navigation Timing).
    pub load_ms: f64,
    /// Navigation start to the end of the last response (Resource Timing).
    pub last_object_ms: f64,
    /// Responses received (the page and its objects).
    pub responses: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Responses by the protocol the browser reports for them (h3, h2, http/1.1).
    pub protocols: BTreeMap<String, usize>,
    /// Bytes of the response bodies, the page's and the objects' (Resource Timing's
    /// encodedBodySize).
    pub body_bytes: f64,
    /// Each response: its path, protocol and when it ended.
    pub objects: Vec<ObjectLoad>,
    /// The browser's QUIC connection attempts to the page's server, from its NetLog.
    pub quic_attempts: Vec<netlog::QuicAttempt>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObjectLoad {
    pub path: String,
    pub protocol: String,
    pub status: u64,
    /// Navigation start to the end of its response, when Resource Timing lists it.
    pub end_ms: Option<f64>,
}

/// One run: both visits.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub profile: String,
    pub mode: Mode,
    pub objects: usize,
    pub page_bytes: usize,
    pub visits: Vec<Visit>,
    /// Where the run's files are, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

/// Caddy in the server's namespace, killed on drop.
struct Caddy(Child);

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The run's directory, removed on drop unless kept.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

fn start_caddy(ns: &str, s: &site::Site) -> Result<Caddy, Error> {
    let data = s.dir.join("caddy-home");
    fs::create_dir_all(&data)?;
    let child = command_in(ns, "caddy")
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&s.caddyfile)
        .env("HOME", &data)
        .env("XDG_DATA_HOME", &data)
        .env("XDG_CONFIG_HOME", &data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(s.dir.join("caddy.log"))?)
        .spawn()
        .map_err(|source| Error::Spawn {
            cmd: "caddy run".into(),
            source,
        })?;
    let caddy = Caddy(child);
    let ready = in_netns(ns, || {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let tcp = std::net::TcpStream::connect(("127.0.0.1", 443)).is_ok();
            // Caddy opens its HTTP/3 socket after the TCP listener; a UDP bind on the
            // same port fails while it is held.
            let udp_held = std::net::UdpSocket::bind(("0.0.0.0", 443)).is_err();
            if tcp && udp_held {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })?;
    if !ready {
        let log = fs::read_to_string(s.dir.join("caddy.log")).unwrap_or_default();
        return Err(Error::Invalid(format!(
            "caddy did not listen on TCP and UDP 443 within 15 s; its log:\n{log}"
        )));
    }
    Ok(caddy)
}

/// The pepd options of `mode`: pepd writes the rules, with the mode's QUIC policy.
fn pepd_options(base: &PepdOptions, policy: &str) -> Result<PepdOptions, Error> {
    let mut o = base.clone();
    o.interception = Interception::Pepd;
    let quic = format!("[rules]\nquic = {policy:?}\n");
    o.extra_toml = merge_toml(&[&o.extra_toml, &quic])?;
    Ok(o)
}

pub fn run(spec: &BrowserSpec) -> Result<RunResult, Error> {
    let mut topo = Topology::up(
        &spec.link,
        &HostTuning {
            congestion_control: "cubic".into(),
        },
    )?;
    let gateways = match spec.mode.quic_policy() {
        Some(policy) => Some(Gateways::start(
            &topo.names,
            &spec.link,
            &pepd_options(&spec.pepd, policy)?,
        )?),
        None => None,
    };
    let dir = RunDir {
        path: std::env::temp_dir().join(format!("{}-browser", topo.names.base())),
        keep: spec.keep,
    };
    if dir.path.exists() {
        fs::remove_dir_all(&dir.path)?;
    }
    fs::create_dir_all(&dir.path)?;
    let site = site::build(&dir.path.join("site"))?;
    let caddy = start_caddy(&topo.names.server, &site)?;
    settle_addresses(&topo.names.client)?;
    let home = dir.path.join("home");
    cdp::trust_ca(&home, &site.ca_cert)?;
    let profile = dir.path.join("profile");
    let mut visits = Vec::new();
    for (i, name) in ["first", "repeat"].into_iter().enumerate() {
        if i > 0 {
            // The HTTP cache and the compiled-script cache; the rest of the profile (the
            // learned Alt-Svc, QUIC's broken marks) stays.
            for cache in ["Cache", "Code Cache"] {
                let p = profile.join("Default").join(cache);
                if p.exists() {
                    fs::remove_dir_all(&p)?;
                }
            }
        }
        let forced = i > 0 && spec.mode.forces_quic_on_repeat();
        visits.push(visit(
            name,
            &topo.names.client,
            &dir.path,
            &profile,
            &home,
            forced,
            spec.visit_timeout,
        )?);
    }
    drop(caddy);
    drop(gateways);
    topo.stop_emulator();
    Ok(RunResult {
        profile: spec.profile.clone(),
        mode: spec.mode,
        objects: site::OBJECTS,
        page_bytes: site::PAGE_BYTES,
        visits,
        dir: spec.keep.then(|| dir.path.clone()),
    })
}

/// Waits until no address in namespace `ns` is tentative (IPv6 duplicate address
/// detection of the link-local addresses): chromium aborts a load with
/// ERR_NETWORK_CHANGED when the addresses change under it.
fn settle_addresses(ns: &str) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tentative = crate::cmd::ip_in(ns, &["-6", "addr", "show", "tentative"])?;
        if tentative.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Invalid(format!(
                "addresses in {ns} still tentative after 10 s: {tentative}"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The page's Navigation and Resource Timing entries.
const TIMING_JS: &str = "JSON.stringify({\
    nav: performance.getEntriesByType('navigation').map(e => [e.loadEventStart, e.encodedBodySize]),\
    res: performance.getEntriesByType('resource').map(e => [e.name, e.responseEnd, e.encodedBodySize])})";

fn visit(
    name: &'static str,
    client_ns: &str,
    dir: &Path,
    profile: &Path,
    home: &Path,
    quic_forced: bool,
    timeout: Duration,
) -> Result<Visit, Error> {
    let netlog_file = dir.join(format!("{name}.netlog.json"));
    let mut switches = vec![
        // The page's name resolves to the server and nothing else resolves at all.
        format!(
            "--host-resolver-rules=MAP {} {SERVER_V4}, MAP * ~NOTFOUND",
            site::HOST
        ),
        format!("--log-net-log={}", netlog_file.display()),
    ];
    if quic_forced {
        switches.push(format!("--origin-to-force-quic-on={}:443", site::HOST));
    }
    let mut browser = Browser::start(&Launch {
        netns: client_ns.to_owned(),
        profile: profile.to_owned(),
        home: home.to_owned(),
        switches,
        log: dir.join(format!("{name}.chromium.log")),
    })?;
    let url = format!("https://{}/", site::HOST);
    let events = browser.load(&url, timeout)?;
    let timing = browser.page_call(
        "Runtime.evaluate",
        json!({"expression": TIMING_JS, "returnByValue": true}),
    )?;
    browser.close()?;
    let timing: Value = timing
        .pointer("/result/value")
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| Error::Invalid(format!("the page's timing entries: {timing}")))?;
    let mut v = summarize(name, quic_forced, &events, &timing)?;
    v.quic_attempts = netlog::quic_attempts(&netlog_file, site::HOST)?;
    Ok(v)
}

/// A visit's figures from its DevTools events and the page's timing entries.
fn summarize(
    name: &'static str,
    quic_forced: bool,
    events: &[Value],
    timing: &Value,
) -> Result<Visit, Error> {
    let load_ms = timing
        .pointer("/nav/0/0")
        .and_then(Value::as_f64)
        .ok_or_else(|| Error::Invalid(format!("no navigation timing entry: {timing}")))?;
    let entries: Vec<&Value> = timing
        .get("res")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let ends: BTreeMap<String, f64> = entries
        .iter()
        .filter_map(|e| Some((e.get(0)?.as_str()?.to_owned(), e.get(1)?.as_f64()?)))
        .collect();
    let body_bytes = timing
        .pointer("/nav/0/1")
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
        + entries
            .iter()
            .filter_map(|e| e.get(2).and_then(Value::as_f64))
            .sum::<f64>();
    let mut objects = Vec::new();
    let mut protocols = BTreeMap::new();
    let mut failed = 0;
    for e in events {
        let p = e.get("params").unwrap_or(&Value::Null);
        match method_of(e) {
            "Network.responseReceived" => {
                let r = &p["response"];
                let url = r["url"].as_str().unwrap_or_default();
                let protocol = r["protocol"].as_str().unwrap_or("unknown").to_owned();
                *protocols.entry(protocol.clone()).or_insert(0) += 1;
                objects.push(ObjectLoad {
                    path: url
                        .strip_prefix(&format!("https://{}", site::HOST))
                        .unwrap_or(url)
                        .to_owned(),
                    protocol,
                    status: r["status"].as_u64().unwrap_or(0),
                    end_ms: ends.get(url).copied(),
                });
            }
            "Network.loadingFailed" => failed += 1,
            _ => {}
        }
    }
    let last_object_ms = ends.values().copied().fold(load_ms.min(0.0), f64::max);
    Ok(Visit {
        visit: name,
        quic_forced,
        load_ms,
        last_object_ms,
        responses: objects.len(),
        failed,
        protocols,
        body_bytes,
        objects,
        quic_attempts: Vec::new(),
    })
}

/// Median, smallest and largest of a set of samples.
#[derive(Clone, Debug, Serialize)]
pub struct Spread {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        Spread {
            n: v.len(),
            median: crate::stats::percentile(v, 0.5),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One mode's visit over all runs.
#[derive(Clone, Debug, Serialize)]
pub struct VisitSummary {
    pub load_ms: Spread,
    pub last_object_ms: Spread,
    /// Responses by protocol, all runs together.
    pub protocols: BTreeMap<String, usize>,
    pub failed: usize,
    /// QUIC attempts over all runs, and how many got an answer from the server.
    pub quic_attempts: usize,
    pub quic_handshakes_completed: usize,
    /// How the QUIC sessions ended, by error, all runs together.
    pub quic_session_ends: BTreeMap<String, usize>,
}

/// The runs of every mode side by side.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub profile: String,
    pub runs: usize,
    /// mode → visit ("first", "repeat") → figures.
    pub modes: BTreeMap<String, BTreeMap<String, VisitSummary>>,
    /// The median load times of "reject" over "pass", by visit, when both ran.
    pub reject_over_pass: BTreeMap<String, f64>,
    /// Whether every response under "reject" came over TCP (h2 or http/1.1).
    pub reject_all_tcp: Option<bool>,
}

pub fn summarize_runs(profile: &str, runs: &[RunResult]) -> Summary {
    let mut modes: BTreeMap<String, BTreeMap<String, VisitSummary>> = BTreeMap::new();
    let mut by_mode: BTreeMap<Mode, Vec<&RunResult>> = BTreeMap::new();
    for r in runs {
        by_mode.entry(r.mode).or_default().push(r);
    }
    for (mode, rs) in &by_mode {
        let mut visits = BTreeMap::new();
        for name in ["first", "repeat"] {
            let vs: Vec<&Visit> = rs
                .iter()
                .flat_map(|r| r.visits.iter().filter(|v| v.visit == name))
                .collect();
            let mut protocols = BTreeMap::new();
            for v in &vs {
                for (p, n) in &v.protocols {
                    *protocols.entry(p.clone()).or_insert(0) += n;
                }
            }
            let attempts = vs.iter().flat_map(|v| &v.quic_attempts);
            let mut quic_session_ends = BTreeMap::new();
            for a in attempts.clone().filter(|a| a.kind == "session") {
                *quic_session_ends.entry(a.end()).or_insert(0) += 1;
            }
            visits.insert(
                name.to_owned(),
                VisitSummary {
                    load_ms: Spread::of(&vs.iter().map(|v| v.load_ms).collect::<Vec<_>>()),
                    last_object_ms: Spread::of(
                        &vs.iter().map(|v| v.last_object_ms).collect::<Vec<_>>(),
                    ),
                    protocols,
                    failed: vs.iter().map(|v| v.failed).sum(),
                    quic_attempts: attempts.clone().count(),
                    quic_handshakes_completed: attempts.filter(|a| a.handshake_completed).count(),
                    quic_session_ends,
                },
            );
        }
        modes.insert(mode.as_str().to_owned(), visits);
    }
    let mut reject_over_pass = BTreeMap::new();
    if let (Some(rej), Some(pass)) = (modes.get("reject"), modes.get("pass")) {
        for name in ["first", "repeat"] {
            if let (Some(a), Some(b)) = (rej.get(name), pass.get(name)) {
                reject_over_pass.insert(name.to_owned(), a.load_ms.median / b.load_ms.median);
            }
        }
    }
    let reject_all_tcp = modes.get("reject").map(|v| {
        v.values()
            .all(|s| s.protocols.keys().all(|p| p == "h2" || p == "http/1.1"))
    });
    Summary {
        profile: profile.to_owned(),
        runs: runs.len(),
        modes,
        reject_over_pass,
        reject_all_tcp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_visit_counts_protocols_and_ends_from_its_events() {
        let url = |p: &str| format!("https://{}{p}", site::HOST);
        let resp = |p: &str, proto: &str| {
            json!({"method": "Network.responseReceived",
                   "params": {"response": {"url": url(p), "protocol": proto, "status": 200}}})
        };
        let events = vec![
            resp("/", "h2"),
            resp("/obj00.css", "h3"),
            resp("/obj01.css", "h3"),
            json!({"method": "Network.loadingFailed", "params": {}}),
        ];
        let timing = json!({"nav": [[1500.5, 100.0]],
            "res": [[url("/obj00.css"), 900.0, 1000.0], [url("/obj01.css"), 1400.0, 500.0]]});
        let v = summarize("first", false, &events, &timing).expect("summary");
        assert_eq!(v.load_ms, 1500.5);
        assert_eq!(v.last_object_ms, 1400.0);
        assert_eq!(v.responses, 3);
        assert_eq!(v.failed, 1);
        assert_eq!(v.body_bytes, 1600.0);
        assert_eq!(v.protocols.get("h3"), Some(&2));
        assert_eq!(v.protocols.get("h2"), Some(&1));
        assert_eq!(v.objects[1].path, "/obj00.css");
        assert_eq!(v.objects[1].end_ms, Some(900.0));
        assert_eq!(v.objects[0].end_ms, None);
    }

    #[test]
    fn the_summary_compares_reject_with_pass() {
        let run = |mode, first: f64, repeat: f64, proto: &str| RunResult {
            profile: "geo".into(),
            mode,
            objects: 30,
            page_bytes: 3_000_000,
            dir: None,
            visits: [("first", first), ("repeat", repeat)]
                .into_iter()
                .map(|(visit, load_ms)| Visit {
                    visit,
                    quic_forced: false,
                    load_ms,
                    last_object_ms: load_ms,
                    responses: 31,
                    failed: 0,
                    protocols: BTreeMap::from([(proto.to_owned(), 31)]),
                    body_bytes: 0.0,
                    objects: Vec::new(),
                    quic_attempts: Vec::new(),
                })
                .collect(),
        };
        let runs = [
            run(Mode::Pass, 4000.0, 6000.0, "h3"),
            run(Mode::Reject, 4000.0, 3000.0, "h2"),
            run(Mode::Pass, 5000.0, 8000.0, "h3"),
            run(Mode::Reject, 5000.0, 3000.0, "h2"),
            run(Mode::Pass, 4500.0, 7000.0, "h3"),
            run(Mode::Reject, 3500.0, 3500.0, "h2"),
        ];
        let s = summarize_runs("geo", &runs);
        assert_eq!(s.reject_over_pass["repeat"], 3000.0 / 7000.0);
        assert_eq!(s.reject_over_pass["first"], 4000.0 / 4500.0);
        assert_eq!(s.reject_all_tcp, Some(true));
        let pass_repeat = &s.modes["pass"]["repeat"];
        assert_eq!(
            (pass_repeat.load_ms.min, pass_repeat.load_ms.max),
            (6000.0, 8000.0)
        );
        assert_eq!(pass_repeat.protocols["h3"], 93);
    }
}
