//! One hub and eight terminals on an emulated satellite carrier (issue 14's first
//! acceptance point), built by `pep_testbed::hub`: every terminal's client downloads and
//! uploads 5 MB through the hub at once, and every byte of all sixteen transfers arrives
//! exact. The carrier has GEO's 300 ms one-way delay; its rate is 40 Mbit/s and each
//! return link's 5 Mbit/s (twice GEO's), so the transfers take about 10 s, not 20.

mod support;

use std::time::{Duration, Instant};

use pep_linkemu::DirectionConfig;
use pep_testbed::hub::traffic::seed;
use pep_testbed::hub::{Activities, HubLinks, HubTestbed, TerminalRates, TrafficSpec};
use pep_testbed::pepd::sample_value;
use pep_testbed::xfer::pattern::expected_digest;
use pep_testbed::xfer::Amount;
use support::{heavy, metric_value, options, scrape_metrics};

const TERMINALS: usize = 8;
const SIZE: u64 = 5_000_000;
const PORT: u16 = 5011;

/// A direction at `rate_bps` with GEO's one-way delay and a queue of one round trip's bytes.
fn geo_direction(rate_bps: f64) -> DirectionConfig {
    let delay = Duration::from_millis(300);
    DirectionConfig {
        rate_bps,
        queue_bytes: (rate_bps / 8.0 * 2.0 * delay.as_secs_f64()) as usize,
        delay,
        ..Default::default()
    }
}

/// The sum of every sample of `name` with `label` (one per peer, or one in all).
fn metric_sum(ns: &str, name: &str, label: (&str, &str)) -> f64 {
    let scrape = scrape_metrics(ns);
    let total: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && s.labels.get(label.0) == Some(label.1))
        .filter_map(|s| sample_value(&s.value))
        .sum();
    assert!(
        metric_value(&scrape, name, Some(label)).is_some(),
        "{name} missing on {ns}"
    );
    total
}

#[test]
fn eight_terminals_download_and_upload_5mb_each_at_once_through_one_hub_byte_exact() {
    if !pep_testbed::require_root() {
        return;
    }
    let _cpu = heavy();
    pep_testbed::raise_nofile_limit().expect("RLIMIT_NOFILE");
    let links = HubLinks {
        terminals: TERMINALS,
        carrier: geo_direction(40e6),
        ret: geo_direction(5e6),
        seed: 1,
    };
    let rates = vec![
        TerminalRates {
            mir_bps: 40e6,
            cir_bps: 0.0,
            weight: 1,
        };
        TERMINALS
    ];
    let tb = HubTestbed::up(&links, &rates, &options())
        .unwrap_or_else(|e| panic!("starting the hub testbed: {e}"));
    let _server = tb.xfer_server(PORT).expect("xfer server");
    let spec = TrafficSpec {
        activities: vec![
            Activities {
                download: true,
                upload: true,
                requests: false,
            };
            TERMINALS
        ],
        amount: Amount::Bytes(SIZE),
        request: (0, 0),
        request_every: Duration::from_millis(200),
        bin: Duration::from_millis(100),
        max_duration: Duration::from_secs(50),
    };
    let t0 = Instant::now();
    let got = tb.traffic(PORT, &spec);
    eprintln!("16 transfers of 5 MB done in {:?}", t0.elapsed());
    assert_eq!(got.len(), TERMINALS);
    for (k, t) in got.iter().enumerate() {
        let i = k + 1;
        let (down, bins) = t.download.as_ref().expect("a download");
        assert_eq!(down.error, None, "terminal {i} download");
        assert!(!down.capped, "terminal {i} download capped");
        assert_eq!(down.intact, Some(true), "terminal {i} download");
        assert_eq!(down.bytes, SIZE, "terminal {i} download");
        assert_eq!(bins.iter().sum::<u64>(), SIZE, "terminal {i} samples");
        assert_eq!(
            down.down_digest.as_deref(),
            Some(expected_digest(seed(i, 1), 1, SIZE).hex().as_str()),
            "terminal {i} download digest"
        );
        let up = t.upload.as_ref().expect("an upload");
        assert_eq!(up.error, None, "terminal {i} upload");
        assert!(!up.capped, "terminal {i} upload capped");
        assert_eq!(up.intact, Some(true), "terminal {i} upload");
        assert_eq!(up.bytes, SIZE, "terminal {i} upload");
        assert_eq!(
            up.up_digest.as_deref(),
            Some(expected_digest(seed(i, 2), 0, SIZE).hex().as_str()),
            "terminal {i} upload digest"
        );
        assert!(t.requests.is_none());
    }
    // Every flow came out of a terminal's tunnel at the hub: two per terminal, each
    // intercepted at its terminal.
    let hub = tb.gateways().hub().namespace();
    assert_eq!(
        metric_sum(hub, "pepd_flows_total", ("origin", "peer")),
        2.0 * TERMINALS as f64
    );
    for t in tb.gateways().terminals() {
        assert_eq!(
            metric_sum(t.namespace(), "pepd_flows_total", ("origin", "intercepted")),
            2.0,
            "{}",
            t.label()
        );
    }
}
