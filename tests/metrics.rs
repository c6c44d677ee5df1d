//! The metrics endpoint against real traffic: after one transfer through pepd, the byte and
//! flow counters both gateways serve equal what the test sent, and both name the AEAD this
//! CPU leads them to (root only, namespaces).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use pep_testbed::addr;
use pep_testbed::xfer::proto::{HEADER_LEN, REPORT_LEN};
use pep_testbed::xfer::Workload;
use support::*;

fn value(s: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    metric_value(s, name, label).unwrap_or_else(|| panic!("{name} {label:?} missing"))
}

#[test]
fn byte_and_flow_counters_match_the_traffic_sent() {
    if !pep_testbed::require_root() {
        return;
    }
    let tb = up(&link(20e6, 50), &options());
    let _server = tb.xfer_server(false, 5001).expect("server");
    let (up_n, down_n) = (300_000u64, 700_000u64);
    let out = xfer_ok(
        &tb,
        &Workload::Bidir {
            up: up_n,
            down: down_n,
        },
        &opts(
            SocketAddr::new(addr::server(false), 5001),
            7,
            Duration::from_secs(60),
        ),
    );
    assert_eq!(out.intact, Some(true), "{out:?}");
    // Let both relays see the close before reading the counters.
    std::thread::sleep(Duration::from_millis(500));
    let (a, b) = (
        scrape_metrics(&tb.names().gw_a),
        scrape_metrics(&tb.names().gw_b),
    );
    // What the client wrote (request header + payload) entered the tunnel at gw-a and left
    // it at gw-b; the server's payload and report went the other way.
    let client_sent = (HEADER_LEN as u64 + up_n) as f64;
    let server_sent = (down_n + REPORT_LEN as u64) as f64;
    let relay = "pepd_relay_bytes_total";
    assert_eq!(
        value(&a, relay, Some(("direction", "to_peer"))),
        client_sent
    );
    assert_eq!(
        value(&b, relay, Some(("direction", "from_peer"))),
        client_sent
    );
    assert_eq!(
        value(&b, relay, Some(("direction", "to_peer"))),
        server_sent
    );
    assert_eq!(
        value(&a, relay, Some(("direction", "from_peer"))),
        server_sent
    );
    let flows = "pepd_flows_total";
    assert_eq!(value(&a, flows, Some(("origin", "intercepted"))), 1.0);
    assert_eq!(value(&b, flows, Some(("origin", "peer"))), 1.0);
    assert_eq!(value(&a, "pepd_flows_active", None), 0.0);
    assert_eq!(value(&b, "pepd_flows_active", None), 0.0);
    // A pair's one worker reads every datagram its association receives.
    for s in [&a, &b] {
        let read = value(s, "pepd_worker_datagrams_total", Some(("worker", "0")));
        let received = value(
            s,
            "pepd_wire_packets_total",
            Some(("direction", "received")),
        );
        assert!(read >= received && received > 100.0, "{read} {received}");
    }
    // Both gateways run on this CPU with `aead = "auto"`: AES-256-GCM if it has AES
    // instructions, else ChaCha20-Poly1305, on both sides.
    let (chosen, other) = if pep_transport::security::hardware_aes() {
        ("aes-256-gcm", "chacha20-poly1305")
    } else {
        ("chacha20-poly1305", "aes-256-gcm")
    };
    for s in [&a, &b] {
        let aead = "pepd_association_aead";
        assert_eq!(value(s, aead, Some(("aead", chosen))), 1.0);
        assert_eq!(value(s, aead, Some(("aead", other))), 0.0);
    }
}

/// Reads `up` bytes and writes `down` back on each of `count` connections, one after the
/// other.
fn serve_exchanges(listener: std::net::TcpListener, count: usize, up: u64, down: u64) {
    std::thread::spawn(move || {
        for _ in 0..count {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            if read_digest(&mut s, up).is_err() {
                return;
            }
            let _ = write_pattern(&mut s, 3, 1, down);
        }
    });
}

#[test]
fn flows_are_classed_by_the_client_s_dscp_at_both_gateways() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut o = options();
    o.extra_toml = "[[class]]\nname = \"video\"\ndscp = [\"AF41\"]\npriority = true\n\
                    max_rate = \"5M\"\n"
        .into();
    let tb = up(&link(20e6, 50), &o);
    let server = SocketAddr::new(addr::server(false), 5003);
    serve_exchanges(listen_in_server(&tb, server), 2, 100_000, 400_000);
    // One connection marked AF41 by its client, one unmarked: the video class and the
    // default class.
    for (tos, up_n, down_n) in [
        (Some(34u32 << 2), 100_000u64, 400_000u64),
        (None, 100_000, 400_000),
    ] {
        let mut c = tb
            .in_client(move || -> std::io::Result<std::net::TcpStream> {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                if let Some(tos) = tos {
                    s.set_tos(tos)?;
                }
                s.connect_timeout(&server.into(), Duration::from_secs(10))?;
                Ok(s.into())
            })
            .expect("client namespace")
            .expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        write_pattern(&mut c, 3, 0, up_n).expect("up");
        read_digest(&mut c, down_n).expect("down");
    }
    std::thread::sleep(Duration::from_millis(500));
    let (a, b) = (
        scrape_metrics(&tb.names().gw_a),
        scrape_metrics(&tb.names().gw_b),
    );
    for class in ["video", "default"] {
        let c = Some(("class", class));
        // The terminal classed the flow it intercepted, the hub the flow the terminal
        // opened, each by the client's mark; each sent its direction's bytes in it.
        assert_eq!(
            value(&a, "pepd_class_flows_opened_total", c),
            1.0,
            "{class}"
        );
        assert_eq!(
            value(&b, "pepd_class_flows_opened_total", c),
            1.0,
            "{class}"
        );
        assert_eq!(
            value(&a, "pepd_class_sent_bytes_total", c),
            100_000.0,
            "{class}"
        );
        assert_eq!(
            value(&b, "pepd_class_sent_bytes_total", c),
            400_000.0,
            "{class}"
        );
    }
}
