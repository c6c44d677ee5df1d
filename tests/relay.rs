//! pepd end to end: two daemons on the gateways of the netns testbed, intercepting with
//! TPROXY and carrying the streams over the emulated satellite hop (root only). Every
//! transfer is checked byte for byte and by digest; the gateways drop routed TCP, so
//! nothing gets through unless pepd carried it. When a test fails, the tail of both
//! daemons' logs is printed with it.
//!
//! `PEPD_BIN=/path/to/pepd` runs the tests against another build; `PEPD_LOG=debug` raises
//! the daemons' log level; `PEPTB_KEEP=1` keeps their configs and logs in /tmp.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use pep_testbed::addr::{self, CLIENT_V4, CLIENT_V6, GW_B_LAN_V4, GW_B_LAN_V6};
use pep_testbed::pepd::{Interception, PepdOptions, PepdTestbed, Side};
use pep_testbed::xfer::pattern::{expected_digest, Pattern};
use pep_testbed::xfer::proto::{Header, Op};
use pep_testbed::xfer::Workload;
use support::*;

fn server_at(ipv6: bool, port: u16) -> SocketAddr {
    SocketAddr::new(addr::server(ipv6), port)
}

fn peers(list: &[SocketAddr]) -> Vec<IpAddr> {
    list.iter().map(SocketAddr::ip).collect()
}

/// Case 1: 10 MB each way at the same time on a GEO-like hop (20 Mb/s each way, 250 ms one way).
#[test]
fn ten_megabytes_each_way_at_once_over_geo() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    let tb = up(&link(20e6, 250), &options());
    let server = tb.xfer_server(false, 5001).expect("server");
    let (seed, n) = (11, 10_000_000);
    let t = Instant::now();
    let out = xfer_ok(
        &tb,
        &Workload::Bidir { up: n, down: n },
        &opts(server_at(false, 5001), seed, Duration::from_secs(90)),
    );
    eprintln!("20 MB moved in {:?}", t.elapsed());
    assert_bidir_exact(&out, seed, n, n);
    // pepd on gw-b opened the upstream connection, from its own address by default.
    assert_eq!(peers(&server.accepted()), [IpAddr::from(GW_B_LAN_V4)]);
}

/// Case 2: An IPv6 flow, both ways.
#[test]
fn ipv6_flow_is_relayed_byte_exact() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(10e6, 100), &options());
    let server = tb.xfer_server(true, 5001).expect("server");
    let (seed, up_n, down_n) = (21, 1_500_000, 2_500_000);
    let out = xfer_ok(
        &tb,
        &Workload::Bidir {
            up: up_n,
            down: down_n,
        },
        &opts(server_at(true, 5001), seed, Duration::from_secs(30)),
    );
    assert_bidir_exact(&out, seed, up_n, down_n);
    assert_eq!(peers(&server.accepted()), [IpAddr::from(GW_B_LAN_V6)]);
}

/// Case 3a: Without `transparent_source` the server sees gw-b's address, over both families.
#[test]
fn upstream_source_is_the_hub_by_default() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(10e6, 100), &options());
    for (ipv6, hub) in [
        (false, IpAddr::from(GW_B_LAN_V4)),
        (true, GW_B_LAN_V6.into()),
    ] {
        let server = tb.xfer_server(ipv6, 5001).expect("server");
        let out = xfer_ok(
            &tb,
            &Workload::Bidir {
                up: 200_000,
                down: 300_000,
            },
            &opts(server_at(ipv6, 5001), 31, Duration::from_secs(20)),
        );
        assert_bidir_exact(&out, 31, 200_000, 300_000);
        assert_eq!(peers(&server.accepted()), [hub], "ipv6={ipv6}");
    }
}

/// Case 3b: With `transparent_source = true` the server sees the client's own address.
#[test]
fn transparent_source_shows_the_client_address() {
    if !pep_testbed::require_root() {
        return;
    }
    let o = PepdOptions {
        extra_toml: "[upstream]\ntransparent_source = true\n".into(),
        ..options()
    };
    let tb = up(&link(10e6, 100), &o);
    for (ipv6, client) in [(false, IpAddr::from(CLIENT_V4)), (true, CLIENT_V6.into())] {
        let server = tb.xfer_server(ipv6, 5001).expect("server");
        let out = xfer_ok(
            &tb,
            &Workload::Bidir {
                up: 200_000,
                down: 300_000,
            },
            &opts(server_at(ipv6, 5001), 32, Duration::from_secs(20)),
        );
        assert_bidir_exact(&out, 32, 200_000, 300_000);
        assert_eq!(peers(&server.accepted()), [client], "ipv6={ipv6}");
    }
}

/// Case 3c: the same through the rules the daemon ships (`pepd nft-rules`, `--routes`)
/// instead of the testbed's own.
#[test]
fn the_daemons_own_rules_intercept_both_families() {
    if !pep_testbed::require_root() {
        return;
    }
    let o = PepdOptions {
        interception: Interception::Pepd,
        extra_toml: "[upstream]\ntransparent_source = true\n".into(),
        ..options()
    };
    let tb = up(&link(10e6, 100), &o);
    let listed = pep_testbed::cmd::run(
        "ip",
        &["netns", "exec", &tb.names().gw_b, "nft", "list", "ruleset"],
    )
    .expect("nft");
    assert!(
        listed.contains("tproxy") && listed.contains("\"lan0\""),
        "{listed}"
    );
    for (ipv6, client) in [(false, IpAddr::from(CLIENT_V4)), (true, CLIENT_V6.into())] {
        let server = tb.xfer_server(ipv6, 5001).expect("server");
        let out = xfer_ok(
            &tb,
            &Workload::Bidir {
                up: 200_000,
                down: 300_000,
            },
            &opts(server_at(ipv6, 5001), 33, Duration::from_secs(20)),
        );
        assert_bidir_exact(&out, 33, 200_000, 300_000);
        assert_eq!(peers(&server.accepted()), [client], "ipv6={ipv6}");
    }
}

/// Case 4: Half-close either way: the client's EOF before the server's reply (the traffic
/// tool's probe), and the server's EOF while the client still has data to send.
#[test]
fn half_close_passes_in_both_directions() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(10e6, 100), &options());
    let _server = tb.xfer_server(false, 5001).expect("server");
    let (seed, up_n, down_n) = (41, 300_000, 200_000);
    let out = xfer_ok(
        &tb,
        &Workload::HalfClose {
            up: up_n,
            down: down_n,
        },
        &opts(server_at(false, 5001), seed, Duration::from_secs(20)),
    );
    // The server replies only after an intact, complete request and its EOF.
    assert_eq!(out.bytes, down_n);
    assert_eq!(
        out.down_digest,
        Some(expected_digest(seed, 1, down_n).hex())
    );

    // Now the server closes its side first and keeps reading.
    let listener = listen_in_server(&tb, server_at(false, 5002));
    let (first, then) = (150_000u64, 250_000u64);
    let srv = thread::spawn(move || -> std::io::Result<_> {
        let (mut s, _) = listener.accept()?;
        write_pattern(&mut s, 42, 1, first)?;
        s.shutdown(Shutdown::Write)?;
        let d = read_digest(&mut s, then)?;
        let mut rest = [0u8; 1];
        let eof = s.read(&mut rest)? == 0;
        Ok((d, eof))
    });
    let mut c = connect_from_client(&tb, server_at(false, 5002)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let got = read_digest(&mut c, first).expect("server's data");
    let mut probe = [0u8; 1];
    assert_eq!(
        c.read(&mut probe).expect("EOF"),
        0,
        "server's FIN not relayed"
    );
    // The client's direction is still open after the server's EOF.
    write_pattern(&mut c, 42, 0, then).expect("client sends after the server's EOF");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let (server_got, server_saw_eof) = srv.join().expect("server thread").expect("server");
    assert_eq!(got, expected_digest(42, 1, first));
    assert_eq!(server_got, expected_digest(42, 0, then));
    assert!(server_saw_eof, "client's FIN not relayed");
}

/// Case 5: A reset from the server reaches the client, and one from the client the server.
#[test]
fn resets_are_relayed_both_ways() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(10e6, 100), &options());
    let listener = listen_in_server(&tb, server_at(false, 5003));
    let request = 1_000u64;
    let (tx, rx) = mpsc::channel();
    let srv = thread::spawn(move || {
        // First connection: read the request, then abort with a reset (SO_LINGER 0).
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let d = read_digest(&mut s, request).expect("request");
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(s);
        tx.send(d).expect("report");
        // Second connection: wait for the client's reset.
        let (mut s, _) = listener.accept().expect("accept");
        read_until_end(&mut s, Instant::now() + Duration::from_secs(20))
    });
    let mut c = connect_from_client(&tb, server_at(false, 5003)).expect("connect");
    write_pattern(&mut c, 51, 0, request).expect("request");
    let (end, extra) = read_until_end(&mut c, Instant::now() + Duration::from_secs(20));
    assert_eq!(
        rx.recv().expect("server got the request"),
        expected_digest(51, 0, request)
    );
    assert_eq!(extra, 0);
    assert!(
        end.reset_at().is_some(),
        "the client should see the server's reset, got {end:?}"
    );

    let mut c = connect_from_client(&tb, server_at(false, 5003)).expect("connect");
    write_pattern(&mut c, 52, 0, 500).expect("data");
    // Give the flow time to open upstream before aborting it.
    thread::sleep(tb.rtt() + Duration::from_millis(300));
    socket2::SockRef::from(&c)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(c);
    let (end, got) = srv.join().expect("server thread");
    assert_eq!(got, 500);
    assert!(
        end.reset_at().is_some(),
        "the server should see the client's reset, got {end:?}"
    );
}

/// Case 6: A destination that refuses: the client (whose connect TPROXY completes locally) gets
/// a reset within one satellite round trip + 200 ms.
#[test]
fn refused_destination_resets_the_client_within_a_round_trip() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(20e6, 250), &options());
    let bound = tb.rtt() + Duration::from_millis(200);
    for ipv6 in [false, true] {
        // Nothing listens on port 5999 at the server.
        let t0 = Instant::now();
        let (end, sent) = match connect_from_client(&tb, server_at(ipv6, 5999)) {
            Err(e) => {
                // pepd may also refuse the handshake itself; then it must be as quick.
                assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                let took = t0.elapsed();
                eprintln!("ipv6={ipv6}: connect refused after {took:?}");
                assert!(
                    took <= bound,
                    "ipv6={ipv6}: refused after {took:?} > {bound:?}"
                );
                continue;
            }
            Ok(mut c) => {
                let sent = Instant::now();
                c.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("first bytes");
                let (end, n) = read_until_end(&mut c, sent + Duration::from_secs(15));
                assert_eq!(n, 0);
                (end, sent)
            }
        };
        let at = end
            .reset_at()
            .unwrap_or_else(|| panic!("ipv6={ipv6}: expected a reset, got {end:?}"));
        let took = at - sent;
        eprintln!("ipv6={ipv6}: reset {took:?} after the first bytes (bound {bound:?})");
        assert!(
            took <= bound,
            "ipv6={ipv6}: reset after {took:?} > {bound:?}"
        );
    }
}

/// Case 7: A thousand flows open at the same time, each byte-exact both ways.
#[test]
fn a_thousand_concurrent_flows_are_each_byte_exact() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    const FLOWS: usize = 1_000;
    const REQUEST: usize = 1_000;
    const RESPONSE: usize = 8_000;
    let tb = up(&link(20e6, 100), &options());
    let server = tb.xfer_server(false, 5001).expect("server");
    let to = server_at(false, 5001);
    let t = Instant::now();
    let results: Vec<Result<(), String>> = tb
        .in_client(move || {
            let barrier = Arc::new(Barrier::new(FLOWS));
            let handles: Vec<_> = (0..FLOWS as u64)
                .map(|i| {
                    let barrier = barrier.clone();
                    thread::Builder::new()
                        .stack_size(256 * 1024)
                        .spawn(move || one_flow(to, 1000 + i, &barrier))
                        .expect("thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                .collect()
        })
        .expect("client namespace");
    eprintln!("{FLOWS} flows in {:?}", t.elapsed());
    let failed: Vec<(usize, &String)> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {FLOWS} flows failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let accepted = server.accepted();
    assert_eq!(accepted.len(), FLOWS);
    assert!(accepted.iter().all(|a| a.ip() == IpAddr::from(GW_B_LAN_V4)));

    /// Connects, waits until every flow is connected, then one request/response exchange.
    fn one_flow(to: SocketAddr, seed: u64, all_open: &Barrier) -> Result<(), String> {
        let conn = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(20));
        all_open.wait();
        let mut s = conn.map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let h = Header {
            op: Op::Rr,
            seed,
            up: 0,
            down: 0,
            duration_ms: 0,
            pace_kbps: 0,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&(REQUEST as u32).to_be_bytes());
        msg.extend_from_slice(&(RESPONSE as u32).to_be_bytes());
        let mut body = vec![0u8; REQUEST];
        Pattern::new(seed, 0).fill(&mut body);
        msg.extend_from_slice(&body);
        s.write_all(&msg).map_err(|e| format!("request: {e}"))?;
        let d = read_digest(&mut s, RESPONSE as u64).map_err(|e| format!("response: {e}"))?;
        if d != expected_digest(seed, 1, RESPONSE as u64) {
            return Err("response corrupted".into());
        }
        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut rest = [0u8; 1];
        match s.read(&mut rest) {
            Ok(0) => Ok(()),
            Ok(_) => Err("bytes after the response".into()),
            Err(e) => Err(format!("closing: {e}")),
        }
    }
}

/// Case 8: The hop goes down for 30 s in the middle of a transfer (pepd's outage limit is 120 s
/// by default): the transfer completes intact once it is back.
#[test]
fn a_thirty_second_outage_mid_transfer_is_survived() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = Arc::new(up(&link(4e6, 100), &options()));
    let _server = tb.xfer_server(false, 5001).expect("server");
    let (seed, n) = (81, 2_000_000);
    let t0 = Instant::now();
    let xfer = {
        let tb = tb.clone();
        thread::spawn(move || {
            xfer_ok(
                &tb,
                &Workload::Bidir { up: n, down: n },
                &opts(server_at(false, 5001), seed, Duration::from_secs(120)),
            )
        })
    };
    thread::sleep(Duration::from_millis(1500));
    assert!(!xfer.is_finished(), "the transfer ended before the outage");
    tb.set_link_down(true).expect("outage");
    let down_at = Instant::now();
    thread::sleep(Duration::from_secs(30));
    tb.set_link_down(false).expect("end of outage");
    eprintln!("outage from {:?} for {:?}", down_at - t0, down_at.elapsed());
    let out = xfer.join().expect("transfer thread");
    assert_bidir_exact(&out, seed, n, n);
    assert!(
        out.completion_s > 30.0,
        "finished in {} s: the outage did not hit it",
        out.completion_s
    );
    for side in Side::BOTH {
        let notes = tb.gateways().notifications(side);
        eprintln!(
            "{side}: {:?}",
            notes.iter().map(|n| &n.text).collect::<Vec<_>>()
        );
    }
}

/// Case 9: kill -9 of one gateway, then a restart: the old flows get a reset within 2 s of the
/// restart, and new connections work at once.
#[test]
fn hub_restart_resets_old_flows_and_serves_new_ones() {
    if !pep_testbed::require_root() {
        return;
    }
    restart_resets_old_flows(Side::Hub);
}

#[test]
fn terminal_restart_resets_old_flows_and_serves_new_ones() {
    if !pep_testbed::require_root() {
        return;
    }
    restart_resets_old_flows(Side::Terminal);
}

fn restart_resets_old_flows(victim: Side) {
    let mut tb = up(&link(10e6, 100), &options());
    let _xfer = tb.xfer_server(false, 5001).expect("server");
    let listener = listen_in_server(&tb, server_at(false, 5004));
    const OLD: usize = 3;
    let watch_until = Instant::now() + Duration::from_secs(60);
    // The server's ends of the old flows: two keep sending, one only reads. pepd may open
    // them upstream in any order, so each flow starts with its number.
    let server_side = thread::spawn(move || {
        let mut ends = Vec::new();
        let mut socks = Vec::new();
        for _ in 0..OLD {
            let (mut s, _) = listener.accept().expect("accept");
            let mut id = [0u8; 1];
            s.read_exact(&mut id).expect("flow number");
            socks.push(s.try_clone().expect("clone"));
            ends.push(thread::spawn(move || {
                if id[0] < 2 {
                    write_until_end(&mut s, u64::from(id[0]), watch_until)
                } else {
                    read_until_end(&mut s, watch_until)
                }
            }));
        }
        (ends, socks)
    });
    // The client's ends: two read what the server sends, one keeps sending.
    let mut clients = Vec::new();
    let mut client_ends = Vec::new();
    for i in 0..OLD {
        let mut c = connect_from_client(&tb, server_at(false, 5004)).expect("connect");
        c.write_all(&[i as u8]).expect("flow number");
        clients.push(c.try_clone().expect("clone"));
        client_ends.push(thread::spawn(move || {
            if i < 2 {
                read_until_end(&mut c, watch_until)
            } else {
                write_until_end(&mut c, 90, watch_until)
            }
        }));
    }
    let (server_ends, server_socks) = server_side.join().expect("accepting the old flows");
    // Let data flow, then pull the plug.
    thread::sleep(Duration::from_secs(1));
    let killed = Instant::now();
    tb.kill_gateway(victim).expect("kill -9");
    thread::sleep(Duration::from_secs(2));
    let restarted = tb.restart_gateway(victim).expect("restart");
    eprintln!("{victim} back after {:?}", restarted.elapsed());

    // New connections work right away.
    let seed = 91;
    let out = xfer_ok(
        &tb,
        &Workload::Bidir {
            up: 300_000,
            down: 300_000,
        },
        &opts(server_at(false, 5001), seed, Duration::from_secs(20)),
    );
    assert_bidir_exact(&out, seed, 300_000, 300_000);

    // Whoever was talking to the surviving gateway must have been reset by now; the ends
    // at the killed gateway's side lost their connections when its process died.
    let (watched, other) = match victim {
        Side::Hub => (client_ends, server_ends),
        Side::Terminal => (server_ends, client_ends),
    };
    let deadline = restarted + Duration::from_secs(2);
    thread::sleep(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(100));
    // Unblock anything still open so the test ends; it then reports `Open`.
    for c in clients.iter().chain(&server_socks) {
        let _ = c.shutdown(Shutdown::Both);
    }
    let ends: Vec<_> = watched
        .into_iter()
        .map(|h| h.join().expect("watcher"))
        .collect();
    let others: Vec<_> = other.into_iter().map(|h| h.join()).collect();
    eprintln!("ends at the surviving side: {ends:?}");
    eprintln!("ends at the restarted side: {others:?}");
    for (i, (end, bytes)) in ends.iter().enumerate() {
        assert!(*bytes > 0, "old flow {i} never carried data");
        let at = end
            .reset_at()
            .unwrap_or_else(|| panic!("old flow {i}: expected a reset, got {end:?}"));
        assert!(
            at <= deadline,
            "old flow {i}: reset {:?} after the restart",
            at - restarted
        );
        assert!(at >= killed, "old flow {i}: reset before anything failed");
    }
}

/// Case 10: A bad config: `check-config` and `run` exit non-zero naming the key and its line.
#[test]
fn bad_configs_are_rejected_with_key_and_line() {
    let dir = std::env::temp_dir().join(format!("relay-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = |link: &str, peer_address: &str| {
        format!(
            "# pepd test config\n\
             [peer]\n\
             address = {peer_address}\n\
             side = \"terminal\"\n\
             \n\
             [link]\n\
             {link}\n\
             rx_rate = 20000000\n"
        )
    };
    let cases = [
        // (what, file, key, line)
        (
            "unknown key",
            good("tx_rat = 2000000", "\"198.18.2.2:7400\""),
            "tx_rat",
            7,
        ),
        (
            "wrong type",
            good("tx_rate = [1, 2]", "\"198.18.2.2:7400\""),
            "tx_rate",
            7,
        ),
        (
            "address without a port",
            good("tx_rate = 2000000", "\"198.18.2.2\""),
            "address",
            3,
        ),
    ];
    for (what, text, key, line) in cases {
        let path = dir.join(format!("{}.toml", key));
        std::fs::write(&path, &text).expect("write");
        for sub in ["check-config", "run"] {
            let mut child = Command::new(pepd_bin())
                .args([sub, "-c"])
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("pepd");
            let t = Instant::now();
            while child.try_wait().expect("wait").is_none() {
                if t.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    panic!("`pepd {sub}` on a bad config ({what}) still running after 10 s");
                }
                thread::sleep(Duration::from_millis(20));
            }
            let out = child.wait_with_output().expect("output");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "`pepd {sub}` accepted a config with {what}:\n{text}"
            );
            assert!(
                err.contains(key) && err.contains(&format!("line {line}")),
                "`pepd {sub}` ({what}) should name `{key}` and line {line}, said:\n{err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stand-in sanity check the other tests rely on: with routed TCP dropped and pepd
/// gone, nothing reaches the server (so a passing test means pepd carried the bytes).
#[test]
fn without_pepd_routed_tcp_is_dropped() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut tb: PepdTestbed = up(&link(10e6, 20), &options());
    let _server = tb.xfer_server(false, 5001).expect("server");
    for side in Side::BOTH {
        tb.kill_gateway(side).expect("kill");
    }
    let r = tb
        .in_client(|| {
            std::net::TcpStream::connect_timeout(
                &server_at(false, 5001),
                Duration::from_millis(1500),
            )
        })
        .expect("client namespace");
    assert!(r.is_err(), "connected with no pepd running");
}
