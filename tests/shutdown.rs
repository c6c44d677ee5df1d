//! SIGTERM drain, end to end (root only, namespaces): a gateway told to stop lets the
//! transfer it is carrying finish within `[shutdown] grace`, then exits cleanly; a transfer
//! longer than the grace period is reset at its end rather than left hanging.
//!
//! What happens to a connection that starts after the signal depends on the side. The
//! terminal (gw-a) closes its TPROXY listener, so the connection is not intercepted at all:
//! TPROXY finds no socket and the SYN falls through to forwarding, which these tests'
//! gateways drop (`forbid_routed_tcp`) — the client hears nothing and its connect times
//! out. The hub (gw-b) refuses flows the terminal opens towards it, so the terminal, which
//! completed the client's handshake locally, resets the client.

mod support;

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::ExitStatus;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pep_testbed::addr::{self, GW_B_LAN_V4};
use pep_testbed::pepd::{PepdOptions, PepdTestbed, Side};
use pep_testbed::xfer::client;
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::{Amount, Outcome, Workload};
use support::*;

/// Slow enough that the transfers below are still running when the signal goes out.
const RATE_BPS: f64 = 4e6;
const ONE_WAY_MS: u64 = 100;
/// About 8 s at 4 Mb/s.
const DRAINED_BYTES: u64 = 4_000_000;
/// When the signal goes out after the transfer started: past connection set-up and the
/// first round trips, well before the end.
const SIGNAL_AFTER: Duration = Duration::from_millis(2500);
const PORT: u16 = 5001;

/// What the watch of a signalled gateway saw.
struct Stopped {
    signalled_at: Instant,
    exited: (Instant, ExitStatus),
    transfer: Outcome,
    transfer_done_at: Instant,
}

fn with_grace(grace: &str) -> PepdOptions {
    PepdOptions {
        extra_toml: format!("[shutdown]\ngrace = \"{grace}\"\n"),
        ..options()
    }
}

fn server_addr() -> SocketAddr {
    SocketAddr::new(addr::server(false), PORT)
}

/// Runs a download from the client on a thread of its own, so the test can signal and
/// watch the gateways meanwhile; yields the outcome and when the client finished.
fn start_download(tb: &PepdTestbed, seed: u64, bytes: u64) -> JoinHandle<(Outcome, Instant)> {
    let ns = tb.names().client.clone();
    let o = opts(server_addr(), seed, Duration::from_secs(90));
    thread::spawn(move || {
        pep_testbed::in_netns(&ns, move || {
            let out = client::run(&Workload::Download(Amount::Bytes(bytes)), &o);
            (out, Instant::now())
        })
        .expect("client namespace")
    })
}

/// Sends SIGTERM to `side`'s pepd once its flow is under way, calls `meanwhile` when the
/// daemon has acknowledged the signal, then waits for both the transfer and the daemon.
fn sigterm_mid_transfer(
    tb: &mut PepdTestbed,
    side: Side,
    transfer: JoinHandle<(Outcome, Instant)>,
    meanwhile: impl FnOnce(&mut PepdTestbed),
    give_up_after: Duration,
) -> Stopped {
    thread::sleep(SIGNAL_AFTER);
    assert!(
        !transfer.is_finished(),
        "the transfer ended before the signal"
    );
    let ns = side.namespace(tb.names()).to_owned();
    let active = metric_value(&scrape_metrics(&ns), "pepd_flows_active", None);
    assert_eq!(active, Some(1.0), "the flow should be open on {side}");
    let pid = tb.gateways().pid(side).expect("pepd running");
    // `ip netns exec` execs pepd, so the child's pid is pepd's.
    let signalled_at = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM");
    tb.gateways_mut()
        .wait_for(
            side,
            "STOPPING=1",
            signalled_at,
            signalled_at + Duration::from_secs(2),
        )
        .expect("pepd acknowledges SIGTERM");
    meanwhile(tb);
    let deadline = signalled_at + give_up_after;
    let mut exited = None;
    while exited.is_none() && Instant::now() < deadline {
        exited = tb
            .gateways_mut()
            .exit_status(side)
            .map(|s| (Instant::now(), s));
        thread::sleep(Duration::from_millis(10));
    }
    let (transfer, transfer_done_at) = transfer.join().expect("client thread");
    eprintln!(
        "{side}: transfer {} after SIGTERM: {}",
        fmt_since(signalled_at, transfer_done_at),
        serde_json::to_string(&transfer).unwrap_or_default()
    );
    let exited = exited.unwrap_or_else(|| {
        panic!(
            "pepd on {side} still running {give_up_after:?} after SIGTERM; log:\n{}",
            tb.log_tail(side, 40)
        )
    });
    eprintln!(
        "{side}: pepd exited ({}) {} after SIGTERM",
        exited.1,
        fmt_since(signalled_at, exited.0)
    );
    Stopped {
        signalled_at,
        exited,
        transfer,
        transfer_done_at,
    }
}

fn fmt_since(t0: Instant, t: Instant) -> String {
    format!("{:.2} s", t.saturating_duration_since(t0).as_secs_f64())
}

/// The transfer finished byte-exact, and only then did the signalled daemon exit — cleanly
/// and well within the grace period.
fn assert_drained(s: &Stopped, seed: u64, grace: Duration) {
    let out = &s.transfer;
    assert_eq!(out.error, None, "the drained transfer failed");
    assert!(!out.capped, "the drained transfer hit its time cap");
    assert_eq!(out.intact, Some(true));
    assert_eq!(out.bytes, DRAINED_BYTES);
    assert_eq!(
        out.down_digest.as_deref(),
        Some(expected_digest(seed, 1, DRAINED_BYTES).hex().as_str()),
        "payload digest"
    );
    let (exit_at, status) = s.exited;
    assert!(status.success(), "pepd exited with {status}");
    assert!(
        exit_at >= s.transfer_done_at,
        "pepd exited {:?} before the transfer finished",
        s.transfer_done_at - exit_at
    );
    // Drained means it went once the flow was done, not when the grace period ran out.
    let after_done = exit_at - s.transfer_done_at;
    assert!(
        after_done < Duration::from_secs(3),
        "pepd exited {after_done:?} after the transfer finished"
    );
    assert!(exit_at - s.signalled_at < grace);
}

const DRAIN_GRACE: &str = "30s";

#[test]
fn sigterm_on_the_terminal_drains_the_open_transfer_and_intercepts_nothing_new() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    let mut tb = up(&link(RATE_BPS, ONE_WAY_MS), &with_grace(DRAIN_GRACE));
    let server = tb.xfer_server(false, PORT).expect("server");
    let seed = 61;
    let transfer = start_download(&tb, seed, DRAINED_BYTES);
    let stopped = sigterm_mid_transfer(
        &mut tb,
        Side::Terminal,
        transfer,
        |tb| {
            // The accept loops stop right after STOPPING=1 is sent.
            thread::sleep(Duration::from_millis(200));
            let at = server_addr();
            let t0 = Instant::now();
            let r = tb
                .in_client(move || TcpStream::connect_timeout(&at, Duration::from_secs(2)))
                .expect("client namespace");
            match r {
                Err(e) => assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}"),
                Ok(c) => panic!(
                    "a connection after SIGTERM was accepted (local {:?}) after {:?}",
                    c.local_addr(),
                    t0.elapsed()
                ),
            }
            let gw_a = scrape_metrics(&tb.names().gw_a);
            assert_eq!(
                metric_value(&gw_a, "pepd_flows_total", Some(("origin", "intercepted"))),
                Some(1.0),
                "only the transfer from before SIGTERM was intercepted"
            );
        },
        Duration::from_secs(40),
    );
    assert_drained(&stopped, seed, Duration::from_secs(30));
    // The transfer came through pepd (the hub connected), and nothing else arrived.
    let peers: Vec<IpAddr> = server.accepted().iter().map(SocketAddr::ip).collect();
    assert_eq!(peers, [IpAddr::from(GW_B_LAN_V4)]);
}

#[test]
fn sigterm_on_the_hub_drains_the_open_transfer() {
    if !pep_testbed::require_root() {
        return;
    }
    hub_drain(false);
}

/// A flow the peer opens while the hub drains is reset, and the open transfer still drains.
/// (This once deadlocked: the reset took the hub lock the driver held while dispatching.)
#[test]
fn a_draining_hub_resets_new_flows_and_still_drains() {
    if !pep_testbed::require_root() {
        return;
    }
    hub_drain(true);
}

fn hub_drain(try_a_new_connection: bool) {
    let _cpu = heavy();
    let mut tb = up(&link(RATE_BPS, ONE_WAY_MS), &with_grace(DRAIN_GRACE));
    let server = tb.xfer_server(false, PORT).expect("server");
    let seed = 62;
    let transfer = start_download(&tb, seed, DRAINED_BYTES);
    let stopped = sigterm_mid_transfer(
        &mut tb,
        Side::Hub,
        transfer,
        |tb| {
            if try_a_new_connection {
                // The terminal still intercepts, so the handshake completes at gw-a; the flow
                // it opens is refused by the draining hub and the client is reset.
                let mut c = connect_from_client(tb, server_addr()).expect("connect at gw-a");
                c.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("first bytes");
                let sent = Instant::now();
                let (end, n) = read_until_end(&mut c, sent + Duration::from_secs(5));
                assert_eq!(n, 0, "no byte may come back");
                let at = end
                    .reset_at()
                    .unwrap_or_else(|| panic!("expected a reset, got {end:?}"));
                eprintln!("new connection reset {:?} after its first bytes", at - sent);
            }
        },
        Duration::from_secs(40),
    );
    assert_drained(&stopped, seed, Duration::from_secs(30));
    // Only the drained transfer reached the server, through the hub.
    let peers: Vec<IpAddr> = server.accepted().iter().map(SocketAddr::ip).collect();
    assert_eq!(peers, [IpAddr::from(GW_B_LAN_V4)]);
}

#[test]
fn a_transfer_longer_than_the_grace_period_is_reset_when_it_ends() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    let grace = Duration::from_secs(1);
    let mut tb = up(&link(RATE_BPS, ONE_WAY_MS), &with_grace("1s"));
    let _server = tb.xfer_server(false, PORT).expect("server");
    // About 40 s at 4 Mb/s: far longer than the grace period.
    let bytes = 20_000_000;
    let transfer = start_download(&tb, 63, bytes);
    let s = sigterm_mid_transfer(
        &mut tb,
        Side::Terminal,
        transfer,
        |_| {},
        Duration::from_secs(20),
    );
    let (exit_at, status) = s.exited;
    assert!(status.success(), "pepd exited with {status}");
    // Grace, then at most a second for the resets to go out, then the exit itself.
    let took = exit_at - s.signalled_at;
    assert!(
        took >= grace && took < grace + Duration::from_secs(3),
        "pepd exited {took:?} after SIGTERM (grace {grace:?})"
    );
    let out = &s.transfer;
    assert!(!out.capped, "the client hung until its own time cap");
    assert!(out.bytes < bytes, "the transfer cannot have completed");
    assert_eq!(out.intact, Some(false));
    let error = out.error.as_deref().unwrap_or("");
    assert!(
        error.contains("reset"),
        "the client should see a reset, got {error:?}"
    );
    let reset_after = s.transfer_done_at - s.signalled_at;
    assert!(
        reset_after >= grace && reset_after < grace + Duration::from_secs(3),
        "client reset {reset_after:?} after SIGTERM"
    );
}
