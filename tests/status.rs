//! `pepd status` and `pepd flows` against a running pair (root only, netns testbed): the
//! bytes of known transfers reported exactly on both gateways, exactly the open flows
//! listed during a transfer, a user outside the socket's group refused in one sentence,
//! and a daemon that is not running said to be so. The hub's are in tests/hub.rs.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use pep_testbed::addr;
use pep_testbed::pepd::{PepdTestbed, Side};
use serde_json::Value;
use support::*;

fn server_at(port: u16) -> SocketAddr {
    SocketAddr::new(addr::server(false), port)
}

/// `pepd ARGS`, with `$RUNTIME_DIRECTORY` as the daemons were given it.
fn pepd(tb: &PepdTestbed, args: &[&str]) -> Output {
    Command::new(pepd_bin())
        .args(args)
        .env("RUNTIME_DIRECTORY", tb.gateways().dir())
        .output()
        .expect("run pepd")
}

fn socket_arg(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// `pepd ASK --socket S --json`: the daemon's answer.
fn answer(tb: &PepdTestbed, ask: &str, side: Side, extra: &[&str]) -> Value {
    let socket = socket_arg(&tb.gateways().control_socket(side));
    let mut args = vec![ask, "--socket", &socket, "--json"];
    args.extend_from_slice(extra);
    let out = pepd(tb, &args);
    assert!(
        out.status.success(),
        "pepd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
    serde_json::from_str(&text).expect("JSON")
}

/// The one peer of `side`'s status.
fn the_peer(tb: &PepdTestbed, side: Side) -> Value {
    let a = answer(tb, "status", side, &[]);
    assert_eq!(a["version"], 1);
    let peers = a["status"]["peers"].as_array().expect("peers").clone();
    assert_eq!(peers.len(), 1, "{a}");
    peers[0].clone()
}

fn bytes_each_way(p: &Value) -> (u64, u64) {
    let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
    (n("bytes_to_peer"), n("bytes_from_peer"))
}

/// Waits up to 10 s for `side`'s peer to report `want` bytes (to the peer, from it): the
/// relays finish a moment after the client saw its connection end.
fn await_bytes(tb: &PepdTestbed, side: Side, want: (u64, u64)) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = the_peer(tb, side);
        if bytes_each_way(&p) == want || Instant::now() > deadline {
            return p;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Serves each connection: an 8-byte length, then the upload until the client's FIN; the
/// answer is that many bytes, then a FIN.
fn serve_known_sizes(tb: &PepdTestbed, port: u16) {
    let l = listen_in_server(tb, server_at(port));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut len = [0u8; 8];
                if s.read_exact(&mut len).is_err() {
                    return;
                }
                if std::io::copy(&mut s, &mut std::io::sink()).is_err() {
                    return;
                }
                let _ = write_pattern(&mut s, 7, 1, u64::from_be_bytes(len));
                let _ = s.shutdown(Shutdown::Write);
            });
        }
    });
}

/// Uploads `up` bytes and downloads `down` through the gateways; returns the payload each
/// way as the client sent and received it.
fn transfer(tb: &PepdTestbed, port: u16, up: u64, down: u64) -> (u64, u64) {
    let mut s = connect_from_client(tb, server_at(port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(&down.to_be_bytes()).expect("length");
    write_pattern(&mut s, 3, 0, up).expect("upload");
    s.shutdown(Shutdown::Write).expect("FIN");
    // `io::copy` retries a read a signal interrupted, which a socket with a timeout
    // reports as EINTR even under SA_RESTART.
    let got = std::io::copy(&mut s, &mut std::io::sink()).expect("download");
    assert_eq!(got, down);
    (8 + up, down)
}

#[test]
fn a_pair_reports_the_bytes_of_known_transfers_exactly_on_both_gateways() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(20e6, 20), &options());
    serve_known_sizes(&tb, 5101);
    let mut sent = (0, 0);
    for (up, down) in [(100_000, 2_000_017), (1_234_567, 0), (0, 765_432)] {
        let (u, d) = transfer(&tb, 5101, up, down);
        sent = (sent.0 + u, sent.1 + d);
    }
    // The terminal relays the client's upload to its peer and the download from it; the
    // hub the other way round.
    let terminal = await_bytes(&tb, Side::Terminal, sent);
    assert_eq!(bytes_each_way(&terminal), sent, "{terminal}");
    let hub = await_bytes(&tb, Side::Hub, (sent.1, sent.0));
    assert_eq!(bytes_each_way(&hub), (sent.1, sent.0), "{hub}");
    for (p, side) in [(&terminal, "terminal"), (&hub, "hub")] {
        assert_eq!(p["name"], "peer", "{side}: {p}");
        assert_eq!(p["state"], "established", "{side}: {p}");
        assert_eq!(p["flows_open"], 0, "{side}: {p}");
        assert!(p["last_handshake_seconds_ago"].as_f64().is_some(), "{p}");
        assert!(
            p["last_packet_seconds_ago"]
                .as_f64()
                .is_some_and(|s| s < 10.0),
            "{p}"
        );
        assert!(p["rtt_seconds"].as_f64().is_some_and(|r| r >= 0.04), "{p}");
        assert_eq!(p["tx_rate_bps"], 20_000_000, "{side}: {p}");
        assert_eq!(
            p["share"],
            Value::Null,
            "a pair's peer has the carrier to itself"
        );
    }
    // The screen an operator reads, from the running terminal and hub.
    for side in Side::BOTH {
        let socket = socket_arg(&tb.gateways().control_socket(side));
        let out = pepd(&tb, &["status", "--socket", &socket]);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).expect("utf-8");
        eprintln!("$ pepd status   # {}\n{text}", side.gateway());
        assert!(text.contains("\npeer peer\n"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("  flows         0 open; ")),
            "{text}"
        );
    }
}

#[test]
fn flows_lists_exactly_the_open_flows_during_a_transfer() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(20e6, 20), &options());
    // Each connection's upload is read and answered with a trickle, so it stays open.
    let l = listen_in_server(&tb, server_at(5102));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s, &mut std::io::sink());
                let _ = s.shutdown(Shutdown::Write);
            });
        }
    });
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| connect_from_client(&tb, server_at(5102)).expect("connect"))
        .collect();
    for (i, s) in open.iter_mut().enumerate() {
        write_pattern(s, 40 + i as u64, 0, 10_000 * (i as u64 + 1)).expect("upload");
    }
    let clients = |open: &[TcpStream]| -> Vec<String> {
        let mut v: Vec<String> = open
            .iter()
            .map(|s| s.local_addr().expect("address").to_string())
            .collect();
        v.sort();
        v
    };
    let listed = |side: Side, what: &str| -> Vec<Value> {
        let a = answer(&tb, "flows", side, &[]);
        let mut flows = a["flows"].as_array().expect("flows").clone();
        flows.sort_by_key(|f| f[what].as_str().unwrap_or_default().to_owned());
        flows
    };
    let uploads = |flows: &[Value]| -> Vec<u64> {
        let mut v: Vec<u64> = flows
            .iter()
            .map(|f| f["bytes_to_peer"].as_u64().expect("bytes"))
            .collect();
        v.sort();
        v
    };
    let addresses = |flows: &[Value], k: &str| -> Vec<String> {
        flows
            .iter()
            .map(|f| f[k].as_str().expect("address").to_owned())
            .collect()
    };
    // Once every upload is in the tunnel and every open acknowledged: exactly these four,
    // each with its bytes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut terminal = listed(Side::Terminal, "client");
    let settled = |flows: &[Value]| {
        uploads(flows) == [10_000, 20_000, 30_000, 40_000]
            && flows.iter().all(|f| f["state"] == "open")
    };
    while !settled(&terminal) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        terminal = listed(Side::Terminal, "client");
    }
    assert_eq!(
        uploads(&terminal),
        [10_000, 20_000, 30_000, 40_000],
        "{terminal:?}"
    );
    assert_eq!(
        addresses(&terminal, "client"),
        clients(&open),
        "{terminal:?}"
    );
    assert_eq!(
        addresses(&terminal, "server"),
        vec![server_at(5102).to_string(); 4]
    );
    for f in &terminal {
        assert_eq!(f["origin"], "intercepted", "{f}");
        assert_eq!(f["state"], "open", "{f}");
        assert_eq!(f["peer"], "peer", "{f}");
    }
    let hub = listed(Side::Hub, "client");
    assert_eq!(addresses(&hub, "client"), clients(&open), "{hub:?}");
    assert!(hub.iter().all(|f| f["origin"] == "peer"), "{hub:?}");
    let text = String::from_utf8(
        pepd(
            &tb,
            &[
                "flows",
                "--socket",
                &socket_arg(&tb.gateways().control_socket(Side::Terminal)),
            ],
        )
        .stdout,
    )
    .expect("utf-8");
    eprintln!("$ pepd flows   # terminal\n{text}");
    assert_eq!(text.lines().count(), 1 + 4 + 1, "{text}");
    // Two of them end: the other two are listed, and only they.
    for s in open.drain(..2) {
        s.shutdown(Shutdown::Write).expect("FIN");
        let mut s = s;
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.read_to_end(&mut rest).expect("the server's FIN");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = listed(Side::Terminal, "client");
    while left.len() != 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = listed(Side::Terminal, "client");
    }
    assert_eq!(addresses(&left, "client"), clients(&open), "{left:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = listed(Side::Hub, "client");
    while left.len() != 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = listed(Side::Hub, "client");
    }
    assert_eq!(addresses(&left, "client"), clients(&open), "{left:?}");
}

#[test]
fn a_user_outside_the_socket_s_group_is_refused_and_a_stopped_daemon_is_said_so() {
    if !pep_testbed::require_root() {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        panic!("setpriv (util-linux) is required for this test");
    }
    let tb = up(&link(20e6, 20), &options());
    let path = tb.gateways().control_socket(Side::Terminal);
    let socket = socket_arg(&path);
    let meta = std::fs::metadata(&path).expect("the control socket");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let group = group_name(meta.gid());
    // A throwaway user of no group: refused, in one sentence, with exit code 4.
    let as_user = |groups: &str| {
        Command::new("setpriv")
            .args(["--reuid=54321", "--regid=54321", groups, "--"])
            .arg(pepd_bin())
            .args(["status", "--socket", &socket])
            .output()
            .expect("setpriv")
    };
    let out = as_user("--clear-groups");
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "pepd: permission denied on {socket}: run this as root or as a member of group \
             {group}\n"
        )
    );
    assert!(out.stdout.is_empty());
    // The same user in the socket's group is answered.
    let out = as_user(&format!("--groups={}", meta.gid()));
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\npeer peer\n"));
    // `-c FILE` finds the socket the daemon made for that config.
    let config = tb.gateways().config_path(Side::Terminal).to_owned();
    let out = pepd(
        &tb,
        &[
            "status",
            "-c",
            config.to_str().expect("utf-8 path"),
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    // No daemon there: exit code 3 and one sentence.
    let nowhere = tb.gateways().dir().join("nothing.sock");
    let out = pepd(&tb, &["flows", "--socket", &socket_arg(&nowhere)]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "pepd: pepd is not running: there is no control socket {}\n",
            nowhere.display()
        )
    );
    // An unknown peer is an error of its own.
    let out = pepd(&tb, &["status", "--socket", &socket, "--peer", "nobody"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "pepd: pepd answered: no peer is named \"nobody\"\n"
    );
    // A daemon stopped by SIGTERM removes its socket: not running, in one sentence.
    let mut tb = tb;
    let pid = tb.gateways().pid(Side::Terminal).expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = pepd(&tb, &["status", "--socket", &socket]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("pepd: pepd is not running: there is no control socket {socket}\n")
    );
    // One killed leaves its socket behind, which nothing answers on; the next start takes
    // it over.
    tb.gateways_mut().restart(Side::Terminal).expect("restart");
    tb.gateways_mut().kill(Side::Terminal).expect("SIGKILL");
    assert!(path.exists());
    let out = pepd(&tb, &["status", "--socket", &socket]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("pepd: pepd is not running: nothing answers on {socket}\n")
    );
    tb.gateways_mut().restart(Side::Terminal).expect("restart");
    let out = pepd(&tb, &["status", "--socket", &socket]);
    assert!(out.status.success(), "{out:?}");
}

fn group_name(gid: u32) -> String {
    let out = Command::new("getent")
        .args(["group", &gid.to_string()])
        .output()
        .expect("getent");
    String::from_utf8_lossy(&out.stdout)
        .split(':')
        .next()
        .filter(|n| !n.is_empty())
        .map_or_else(|| gid.to_string(), str::to_owned)
}
