use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use pep_transport::PeerId;
use tokio::sync::Notify;

use super::*;
use crate::config::{PeerSpec, Side};
use crate::control::client::{ask, Trouble};
use crate::control::protocol::{Ask, Request, VERSION};
use crate::tunnel::gateway::Gateway;
use crate::tunnel::memory::MemoryAccount;
use crate::tunnel::peer::{Peer, PeerCounters};
use crate::tunnel::peer_table::PeerTable;

fn spec(name: &str) -> PeerSpec {
    PeerSpec {
        name: name.to_owned(),
        public_key: None,
        address: None,
        subnets: Vec::new(),
        tx_bps: 20_000_000,
        rx_bps: 10_000_000,
        min_bps: 0,
        weight: 1,
        keepalive: Duration::from_secs(5),
        max_flows: 100,
    }
}

/// A hub of two peers that never associated, `t1` having relayed 1000 bytes each way.
fn source() -> Arc<StatusSource> {
    let memory = Arc::new(MemoryAccount::new(1 << 30, 0, 0));
    let wake = Arc::new(Notify::new());
    let peers: Vec<Arc<Peer>> = ["t1", "t2"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            Arc::new(Peer::new(
                PeerId(i as u32),
                n,
                None,
                1 << 20,
                memory.clone(),
                wake.clone(),
            ))
        })
        .collect();
    PeerCounters::add(&peers[0].counters.bytes_to_peer, 1000);
    PeerCounters::add(&peers[0].counters.bytes_from_peer, 1000);
    let gateway = Gateway::new(
        PeerTable::new(peers, vec![spec("t1"), spec("t2")]),
        50_000_000,
        wake,
        memory,
        10_000,
    );
    Arc::new(StatusSource {
        gateway: Arc::new(gateway),
        side: Side::Hub,
        shared_carrier: true,
        started: Instant::now(),
    })
}

struct Served {
    rt: tokio::runtime::Runtime,
    stop: watch::Sender<bool>,
    file: Option<SocketFile>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

fn served() -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("run").join("test.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (stop, stop_rx) = watch::channel(false);
    let bound = rt.block_on(async { bind(&path) }).expect("bind");
    rt.spawn(serve(bound.listener, source(), stop_rx));
    Served {
        rt,
        stop,
        file: Some(bound.file),
        path,
        _dir: dir,
    }
}

fn request(ask: Ask, peer: Option<&str>) -> Request {
    Request {
        version: VERSION,
        request: ask,
        peer: peer.map(str::to_owned),
    }
}

/// The raw answer to `line`.
fn raw(path: &Path, line: &[u8]) -> Answer {
    let mut s = std::os::unix::net::UnixStream::connect(path).expect("connect");
    s.write_all(line).expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    assert!(text.ends_with('\n'), "{text:?}");
    serde_json::from_str(&text).expect("json answer")
}

#[test]
fn answers_status_and_flows_with_the_gateway_s_figures() {
    let s = served();
    let mode = std::fs::metadata(&s.path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    let status = ask(&s.path, &request(Ask::Status, None))
        .expect("status")
        .status
        .expect("a status");
    assert_eq!(status.side, "hub");
    assert_eq!(status.carrier.tx_rate_bps, 50_000_000);
    let names: Vec<&str> = status.peers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["t1", "t2"]);
    let t1 = &status.peers[0];
    assert_eq!((t1.bytes_to_peer, t1.bytes_from_peer), (1000, 1000));
    assert_eq!((t1.state.as_str(), t1.endpoint), ("connecting", None));
    assert_eq!(
        t1.tx_rate_bps, 20_000_000,
        "from its entry, without an association"
    );
    let one = ask(&s.path, &request(Ask::Status, Some("t2")))
        .expect("status of t2")
        .status
        .expect("a status");
    assert_eq!(one.peers.len(), 1);
    assert_eq!(one.peers[0].name, "t2");
    let flows = ask(&s.path, &request(Ask::Flows, None)).expect("flows");
    assert_eq!(flows.flows, Some(Vec::new()));
    match ask(&s.path, &request(Ask::Flows, Some("t9"))) {
        Err(Trouble::Failed(why)) => {
            assert_eq!(why, "pepd answered: no peer is named \"t9\"");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_bad_request_gets_an_error_that_says_what_is_wrong() {
    let s = served();
    let err = |line: &[u8]| raw(&s.path, line).error.expect("an error");
    assert!(err(b"status\n").starts_with("malformed request: "));
    assert_eq!(
        err(b"{\"version\":7,\"request\":\"status\"}\n"),
        "this pepd speaks control protocol version 1, not 7"
    );
    assert!(err(b"{\"version\":1,\"request\":\"restart\"}\n").starts_with("malformed request"));
    let long = vec![b' '; MAX_REQUEST + 10];
    assert_eq!(err(&long), "request longer than 1024 bytes");
    // Without a newline, the end of the stream ends the request.
    let mut c = std::os::unix::net::UnixStream::connect(&s.path).expect("connect");
    c.write_all(b"{\"version\":1,\"request\":\"flows\"}")
        .expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut text = String::new();
    c.read_to_string(&mut text).expect("read");
    assert_eq!(text, "{\"version\":1,\"flows\":[]}\n");
}

#[test]
fn a_second_daemon_is_refused_the_socket_and_a_stopped_one_s_is_taken_over() {
    let mut s = served();
    let again = s.rt.block_on(async { bind(&s.path) });
    let why = format!("{:#}", again.err().expect("refused"));
    assert!(why.starts_with("another pepd answers on it"), "{why}");
    // A daemon that stopped without removing its socket: nothing answers there.
    let _ = s.stop.send(true);
    let rt = std::mem::replace(
        &mut s.rt,
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    assert!(s.path.exists());
    match ask(&s.path, &request(Ask::Status, None)) {
        Err(t @ Trouble::NotRunning { stale: true, .. }) => {
            assert_eq!(t.exit_code(), 3);
            assert_eq!(
                t.to_string(),
                format!(
                    "pepd is not running: nothing answers on {}",
                    s.path.display()
                )
            );
        }
        other => panic!("{other:?}"),
    }
    let taken =
        s.rt.block_on(async { bind(&s.path) })
            .expect("takes it over");
    // The old daemon's file guard leaves the new socket alone; the new one's removes it.
    drop(s.file.take());
    assert!(s.path.exists());
    drop(taken);
    assert!(!s.path.exists());
    match ask(&s.path, &request(Ask::Status, None)) {
        Err(t @ Trouble::NotRunning { stale: false, .. }) => {
            assert_eq!(
                t.to_string(),
                format!(
                    "pepd is not running: there is no control socket {}",
                    s.path.display()
                )
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_in_the_way_is_not_taken_for_a_socket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("x.sock");
    std::fs::write(&path, "not a socket").expect("write");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let why = format!(
        "{:#}",
        rt.block_on(async { bind(&path) }).err().expect("refused")
    );
    assert_eq!(why, "it exists and is not a socket");
    assert_eq!(
        std::fs::read_to_string(&path).expect("kept"),
        "not a socket"
    );
}
