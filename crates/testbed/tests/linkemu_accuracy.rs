//! Acceptance tests of the emulator's accuracy, measured end to end through the testbed
//! (client → gw-a → emulator → gw-b → server). Root only; each test builds its own
//! uniquely named namespaces and removes them on drop, even on panic.

use std::net::SocketAddr;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::Duration;

use pep_linkemu::{DirectionConfig, LinkConfig, LinkStats};
use pep_sim::channel::{corruption_probability, GilbertElliott, OutageSchedule};
use pep_testbed::topology::{HostTuning, Topology};
use pep_testbed::udp::{self, Arrival, SendSpec};
use pep_testbed::{addr, in_netns, Profile};

/// The host these tests share. Its per-CPU receive backlog (`netdev_max_backlog`) takes the
/// packets every emulator writes to its TUN device, and a test sending at 100 Mb/s can fill
/// it; a loaded CPU also shifts RTTs by milliseconds. The ping test runs alone, the others
/// together.
static HOST: RwLock<()> = RwLock::new(());

fn host_shared() -> RwLockReadGuard<'static, ()> {
    HOST.read().unwrap_or_else(|p| p.into_inner())
}

fn host_alone() -> RwLockWriteGuard<'static, ()> {
    HOST.write().unwrap_or_else(|p| p.into_inner())
}

/// The receiver stops after this long without a datagram.
const IDLE: Duration = Duration::from_millis(700);

fn cubic() -> HostTuning {
    HostTuning {
        congestion_control: "cubic".into(),
    }
}

fn symmetric(d: DirectionConfig) -> LinkConfig {
    LinkConfig {
        forward: d.clone(),
        ret: d,
        seed: 42,
        ..Default::default()
    }
}

/// Sends `count` datagrams client → server (the link's return direction) at `pps` and
/// returns what was sent, what arrived and the emulator's counters.
fn probe(
    link: LinkConfig,
    payload: usize,
    count: u64,
    pps: f64,
    idle: Duration,
) -> (u64, Vec<Arrival>, LinkStats) {
    let mut topo = Topology::up(&link, &cubic()).expect("testbed up");
    let epoch = topo.emulator().expect("emulator").start_time();
    let dst = SocketAddr::new(addr::SERVER_V4.into(), 9000);
    let server = topo.names.server.clone();
    let delay = link.ret.delay;
    let rx = thread::spawn(move || {
        in_netns(&server, move || {
            udp::receive(dst, epoch, delay + idle, Duration::from_secs(60))
        })
    });
    thread::sleep(Duration::from_millis(200));
    let spec = SendSpec {
        dst,
        payload,
        count,
        pps,
        epoch,
    };
    let sent = in_netns(&topo.names.client, move || udp::send(&spec))
        .expect("netns")
        .expect("send");
    let arrivals = rx
        .join()
        .expect("rx thread")
        .expect("netns")
        .expect("receive");
    let stats = topo.stop_emulator().expect("stats");
    (sent, arrivals, stats)
}

#[test]
fn ping_rtt_through_the_lawson_profile_is_570_ms() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_alone();
    let link = Profile::Lawson.link();
    let mut topo = Topology::up(&link, &cubic()).expect("testbed up");
    let rtts = in_netns(&topo.names.client, || {
        pep_testbed::ping::ping(
            addr::SERVER_V4,
            20,
            Duration::from_millis(100),
            // Waiting stops when every ping is back; the margin is for a loaded machine,
            // where the sending thread itself may start late.
            Duration::from_secs(10),
        )
    })
    .expect("netns")
    .expect("ping");
    let stats = topo.stop_emulator().expect("stats");
    let unanswered: Vec<usize> = (0..rtts.len()).filter(|&i| rtts[i].is_none()).collect();
    assert!(
        unanswered.is_empty(),
        "pings {unanswered:?} unanswered; emulator: {stats:?}"
    );
    let mut ms: Vec<f64> = rtts
        .iter()
        .flatten()
        .map(|r| r.as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    let median = (ms[9] + ms[10]) / 2.0;
    eprintln!(
        "ping RTT median {median:.3} ms (min {:.3}, max {:.3})",
        ms[0], ms[19]
    );
    // Each direction delays the ping and serialises it at its rate (570.87 ms in all).
    let one_way_ms = |d: &DirectionConfig| {
        d.delay.as_secs_f64() * 1e3 + pep_testbed::ping::PACKET_BYTES as f64 * 8e3 / d.rate_bps
    };
    let floor = one_way_ms(&link.forward) + one_way_ms(&link.ret);
    // No echo may come back sooner than the link allows; what the host adds on top (its
    // wakeups, other work on a shared CI machine) is bounded, not zero.
    assert!(
        ms[0] >= floor - 0.01,
        "fastest RTT {} ms below {floor} ms",
        ms[0]
    );
    assert!(
        median - floor <= 2.0,
        "median RTT {median} ms, more than 2 ms above {floor} ms"
    );
}

#[test]
fn bulk_udp_at_10_mbps_measures_within_2_percent() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig {
        rate_bps: 10e6,
        queue_bytes: 200_000,
        delay: Duration::from_millis(10),
        ..Default::default()
    });
    // Offered 12 Mb/s for 3 s so the serialiser never idles; the excess is tail-dropped.
    let payload = 1472;
    let pps = 12e6 / ((payload + udp::IPV4_UDP_OVERHEAD) as f64 * 8.0);
    let (_, arrivals, stats) = probe(link, payload, (pps * 3.0) as u64, pps, IDLE);
    let rate = udp::ip_rate_bps(&arrivals);
    eprintln!("measured {rate:.0} b/s; emulator {stats:?}");
    assert!((rate / 10e6 - 1.0).abs() <= 0.02, "rate {rate}");
    assert!(
        stats.ret.dropped.queue > 0,
        "the queue should have overflowed"
    );
}

#[test]
fn ber_1e_6_loses_1_19_percent_of_1500_byte_packets() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig {
        delay: Duration::from_millis(5),
        impairments: pep_sim::channel::Impairments {
            ber: 1e-6,
            ..Default::default()
        },
        ..Default::default()
    });
    let n = 50_000;
    let (sent, arrivals, stats) = probe(link, 1472, n, 10_000.0, IDLE);
    // The link also carries the kernel's own few packets (IPv6 neighbour discovery etc.).
    assert!(
        stats.ret.packets_in >= sent,
        "everything sent reached the emulator"
    );
    assert_eq!(stats.ret.dropped.queue + stats.ret.dropped.write_error, 0);
    let p = corruption_probability(1e-6, 1500);
    let sd = (p * (1.0 - p) / sent as f64).sqrt();
    let loss = 1.0 - arrivals.len() as f64 / sent as f64;
    eprintln!("sent {sent}, loss {loss:.5}, expected {p:.5} ± {sd:.5} (1 SD); {stats:?}");
    assert!(sent >= 50_000);
    assert!((loss - p).abs() <= 4.0 * sd, "loss {loss}");
}

#[test]
fn gilbert_elliott_meets_its_analytic_mean_loss() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let ge: GilbertElliott = "0.01,0.1".parse().expect("ge");
    let link = symmetric(DirectionConfig {
        delay: Duration::from_millis(5),
        impairments: pep_sim::channel::Impairments {
            burst: Some(ge),
            ..Default::default()
        },
        ..Default::default()
    });
    let (sent, arrivals, stats) = probe(link, 200, 30_000, 10_000.0, IDLE);
    assert!(stats.ret.packets_in >= sent);
    let loss = 1.0 - arrivals.len() as f64 / sent as f64;
    eprintln!("GE loss {loss:.4}, analytic {:.4}", ge.mean_loss());
    // Bursts (mean length 10) make the estimate much noisier than Bernoulli: ±20 %.
    assert!((loss / ge.mean_loss() - 1.0).abs() < 0.2, "loss {loss}");
}

#[test]
fn nothing_passes_during_an_outage() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig {
        delay: Duration::from_millis(10),
        impairments: pep_sim::channel::Impairments {
            outages: OutageSchedule {
                windows: vec!["1+1".parse().expect("outage")],
                periodic: None,
            },
            ..Default::default()
        },
        ..Default::default()
    });
    // One datagram every 2 ms for 3 s, stamped with its send time on the emulator's clock.
    let (sent, arrivals, stats) = probe(link, 64, 1500, 500.0, Duration::from_millis(1500));
    let (lo, hi) = (Duration::from_millis(1000), Duration::from_millis(2000));
    let margin = Duration::from_millis(2);
    let inside: Vec<_> = arrivals
        .iter()
        .filter(|a| a.sent > lo + margin && a.sent < hi - margin)
        .collect();
    assert!(
        inside.is_empty(),
        "{} passed during the outage",
        inside.len()
    );
    // 500 datagrams were sent inside the window (give or take the edges and a few kernel
    // packets of its own that the outage also eats).
    assert!((490..=520).contains(&stats.ret.dropped.outage), "{stats:?}");
    let outside = arrivals
        .iter()
        .filter(|a| a.sent < lo || a.sent >= hi)
        .count() as u64;
    assert!(
        outside + 510 >= sent,
        "only {outside} of ~1000 outside the window arrived"
    );
}

#[test]
fn sustains_100_mbps_with_250_ms_delay() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    // The nasa link: 100 Mb/s, 250 ms one-way. Offer exactly the link rate in 1500-byte
    // packets for 2 s; the emulator must deliver all of it at the configured rate.
    let payload = 1472;
    let pps = 100e6 / ((payload + udp::IPV4_UDP_OVERHEAD) as f64 * 8.0);
    let (sent, arrivals, stats) =
        probe(Profile::Nasa.link(), payload, (pps * 2.0) as u64, pps, IDLE);
    let rate = udp::ip_rate_bps(&arrivals);
    eprintln!(
        "100 Mb/s: sent {sent}, received {}, {rate:.0} b/s, {} in flight at peak, emulator {:.3} CPU-s",
        arrivals.len(),
        stats.ret.in_flight_peak_packets,
        stats.cpu_s
    );
    assert_eq!(arrivals.len() as u64, sent, "{stats:?}");
    assert!((rate / 100e6 - 1.0).abs() <= 0.02, "rate {rate}");
    assert!(stats.ret.in_flight_peak_packets > 2000, "{stats:?}");
}

/// The bytes of datagram `index` of burst `burst`: numbered, then a pattern of both.
fn gso_datagram(burst: u32, index: u32, size: usize) -> Vec<u8> {
    let mut d: Vec<u8> = (0..size)
        .map(|j| (burst as usize * 31 + index as usize * 7 + j) as u8)
        .collect();
    d[..4].copy_from_slice(&burst.to_be_bytes());
    d[4..8].copy_from_slice(&index.to_be_bytes());
    d
}

/// Sends `bursts` UDP GSO bursts (`UDP_SEGMENT`) of `per_burst` datagrams of `size` bytes,
/// 2 ms apart, client → server, and returns the datagrams that arrived and the emulator's
/// counters. With `then`, the emulator started on `link` is replaced by one on `then` (the
/// same TUN devices) before anything is sent.
fn gso_probe(
    link: LinkConfig,
    then: Option<LinkConfig>,
    dst: SocketAddr,
    (bursts, per_burst, size): (u32, u32, usize),
) -> (Vec<Vec<u8>>, LinkStats) {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    let mut topo = Topology::up(&link, &cubic()).expect("testbed up");
    if let Some(then) = then {
        topo.restart_emulator(&then).expect("emulator restarts");
    }
    let server = topo.names.server.clone();
    // IPv6 neighbour discovery answers only once the new links' link-local addresses have
    // passed duplicate address detection (about a second, 2 s at most).
    let settle = Duration::from_millis(if dst.is_ipv4() { 200 } else { 2500 });
    let rx = thread::spawn(move || {
        in_netns(&server, move || {
            let sock = UdpSocket::bind(dst).expect("bind");
            sock.set_read_timeout(Some(settle + IDLE)).expect("timeout");
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65_536];
            while let Ok(n) = sock.recv(&mut buf) {
                got.push(buf[..n].to_vec());
                sock.set_read_timeout(Some(IDLE)).expect("timeout");
            }
            got
        })
    });
    thread::sleep(settle);
    in_netns(&topo.names.client, move || {
        let any: SocketAddr = if dst.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let sock = UdpSocket::bind(any).expect("bind");
        sock.connect(dst).expect("connect");
        let segment = size as nix::libc::c_int;
        // SAFETY: UDP_SEGMENT reads one int from a valid pointer; the socket is open.
        let rc = unsafe {
            nix::libc::setsockopt(
                sock.as_raw_fd(),
                nix::libc::SOL_UDP,
                nix::libc::UDP_SEGMENT,
                (&segment as *const nix::libc::c_int).cast(),
                std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
        for b in 0..bursts {
            let burst: Vec<u8> = (0..per_burst)
                .flat_map(|i| gso_datagram(b, i, size))
                .collect();
            assert_eq!(sock.send(&burst).expect("send"), burst.len());
            thread::sleep(Duration::from_millis(2));
        }
    })
    .expect("netns");
    let got = rx.join().expect("rx thread").expect("netns");
    let stats = topo.stop_emulator().expect("stats");
    (got, stats)
}

/// Checks every datagram byte for byte and returns how many of each burst arrived.
fn per_burst_counts(got: &[Vec<u8>], bursts: u32, per_burst: u32, size: usize) -> Vec<u32> {
    let mut counts = vec![0u32; bursts as usize];
    let mut seen = std::collections::HashSet::new();
    for d in got {
        assert_eq!(d.len(), size);
        let burst = u32::from_be_bytes(d[..4].try_into().expect("4 bytes"));
        let index = u32::from_be_bytes(d[4..8].try_into().expect("4 bytes"));
        assert!(burst < bursts && index < per_burst, "{burst}/{index}");
        assert_eq!(d, &gso_datagram(burst, index, size), "{burst}/{index}");
        assert!(seen.insert((burst, index)), "{burst}/{index} twice");
        counts[burst as usize] += 1;
    }
    counts
}

#[test]
fn udp_gso_bursts_cross_a_clean_fast_link_whole_and_exact() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig {
        rate_bps: 10e9,
        queue_bytes: 6_250_000,
        ..Default::default()
    });
    let dst = SocketAddr::new(addr::SERVER_V4.into(), 9001);
    let (got, stats) = gso_probe(link, None, dst, (100, 20, 1400));
    let counts = per_burst_counts(&got, 100, 20, 1400);
    assert!(counts.iter().all(|&c| c == 20), "{counts:?} {stats:?}");
    assert!(stats.udp_offload, "{stats:?}");
    eprintln!(
        "clean 10 Gb/s: {} datagrams exact; {} bursts whole, {} cut; emulator {:.4} CPU-s",
        got.len(),
        stats.ret.udp_bursts_whole,
        stats.ret.udp_bursts_cut,
        stats.cpu_s
    );
    // Each send crossed as one unit (the kernel sends nothing else as a GSO burst).
    assert_eq!(stats.ret.udp_bursts_whole, 100, "{stats:?}");
    assert_eq!(stats.ret.udp_bursts_cut, 0, "{stats:?}");
    assert_eq!(stats.ret.gso_bursts_uncut, 0, "{stats:?}");
    assert!(stats.ret.packets_in >= 2000, "{stats:?}");
}

#[test]
fn udp_gso_bursts_on_a_lossy_link_lose_single_datagrams() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig {
        rate_bps: 10e9,
        queue_bytes: 6_250_000,
        impairments: pep_sim::channel::Impairments {
            loss: 0.3,
            ..Default::default()
        },
        ..Default::default()
    });
    // IPv6 here: the cut rewrites the IPv6 payload length, IPv4 is covered above and in
    // the gso module's own tests.
    let dst = SocketAddr::new(addr::SERVER_V6.into(), 9001);
    let (got, stats) = gso_probe(link, None, dst, (100, 20, 1400));
    let counts = per_burst_counts(&got, 100, 20, 1400);
    let arrived: u32 = counts.iter().sum();
    // 2000 datagrams at loss 0.3: 1400 expected, sd 20.5.
    assert!((1300..=1500).contains(&arrived), "{arrived} {stats:?}");
    let partial = counts.iter().filter(|&&c| c > 0 && c < 20).count();
    eprintln!(
        "loss 0.3: {arrived} of 2000 datagrams arrived; {partial} of 100 bursts in part; \
         {} bursts cut",
        stats.ret.udp_bursts_cut
    );
    assert!(
        partial >= 90,
        "bursts lost whole, not datagram by datagram: {counts:?}"
    );
    assert_eq!(stats.ret.udp_bursts_whole, 0, "{stats:?}");
    assert!(stats.ret.udp_bursts_cut >= 100, "{stats:?}");
    assert_eq!(stats.ret.gso_bursts_uncut, 0, "{stats:?}");
}

#[test]
fn per_packet_emulation_gets_no_bursts() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = LinkConfig {
        per_packet: true,
        ..symmetric(DirectionConfig::default())
    };
    let dst = SocketAddr::new(addr::SERVER_V4.into(), 9001);
    let (got, stats) = gso_probe(link, None, dst, (10, 20, 1400));
    let counts = per_burst_counts(&got, 10, 20, 1400);
    assert!(counts.iter().all(|&c| c == 20), "{counts:?} {stats:?}");
    assert!(!stats.udp_offload, "{stats:?}");
    assert_eq!(stats.ret.udp_bursts_whole + stats.ret.udp_bursts_cut, 0);
    assert!(stats.ret.packets_in >= 200, "{stats:?}");
}

/// Offloads belong to the TUN device, not to the file: an emulator without them, started on
/// devices one with them had used, must still get datagrams, not whole bursts.
#[test]
fn per_packet_emulation_after_offload_on_the_same_devices_gets_datagrams() {
    if !pep_testbed::require_root() {
        return;
    }
    let _host = host_shared();
    let link = symmetric(DirectionConfig::default());
    let then = LinkConfig {
        per_packet: true,
        ..link.clone()
    };
    let dst = SocketAddr::new(addr::SERVER_V4.into(), 9001);
    let (got, stats) = gso_probe(link, Some(then), dst, (10, 20, 1400));
    let counts = per_burst_counts(&got, 10, 20, 1400);
    assert!(counts.iter().all(|&c| c == 20), "{counts:?} {stats:?}");
    assert!(!stats.udp_offload, "{stats:?}");
    assert!(stats.ret.packets_in >= 200, "{stats:?}");
    assert!(stats.ret.bytes_in < 200 * 1500 + 10_000, "{stats:?}");
}
