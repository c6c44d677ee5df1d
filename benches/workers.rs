//! The hub's workers in bulk, in one process: a hub built as `pepd run` builds it (the same
//! tunnel, sockets and workers) on loopback, and `PEPD_BENCH_TERMINALS` terminals (default
//! 8), each one encrypted association downloading over one flow, all driven by one thread
//! that only opens, acknowledges and discards, reading the hub's datagrams in GRO batches
//! (so that their side stays cheap beside the hub). Behind the hub, each flow's bytes come
//! from a task that writes into the flow from memory (`PEPD_BENCH_UPSTREAM=memory`, the
//! default: the hub's cost is its workers') or, as in `pepd run`, from a TCP server on
//! loopback through the upstream relays (`tcp`). Prints one JSON line per worker count
//! (1, then 2): the terminals' goodput and the CPU time of each kind of thread. Run with
//!
//!     cargo bench -p pepd --bench workers

use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

use pep_transport::security::{hardware_aes, public_key, AeadOffer, SecurityConfig};
use pep_transport::{Association, Config, Event, FlowMeta, ReadOutcome, Role};
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};

use pepd::proxy::acceptor::UpstreamAcceptor;
use pepd::proxy::live::Live;
use pepd::sys::notify::Notifier;
use pepd::tunnel::sockets::tunnel_sockets;
use pepd::tunnel::spawn::start_drivers;
use pepd::tunnel::udp;

/// The carrier and every association's rate unless `PEPD_BENCH_RATE` (bit/s) says
/// otherwise: far above what a core moves, so the CPU is the limit.
const RATE_BPS: u64 = 20_000_000_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds of this process's threads whose name starts with each of `prefixes` (the
/// last entry: every other thread).
fn cpu_by_thread(prefixes: &[&str]) -> Vec<f64> {
    let mut out = vec![0.0; prefixes.len() + 1];
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        // A thread that ended since the listing has nothing left to count.
        let (Ok(name), Ok(times)) = (
            std::fs::read_to_string(t.path().join("comm")),
            pep_testbed::cpu::stat_times(&t.path().join("stat")),
        ) else {
            continue;
        };
        let i = prefixes
            .iter()
            .position(|p| name.trim_end().starts_with(p))
            .unwrap_or(prefixes.len());
        out[i] += times.total_s();
    }
    out
}

/// A TCP server that sends to every connection until it closes.
fn source() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = l.local_addr().expect("addr");
    std::thread::Builder::new()
        .name("bench-srv".into())
        .spawn(move || {
            for c in l.incoming().flatten() {
                let _ = std::thread::Builder::new()
                    .name("bench-srv".into())
                    .spawn(move || {
                        let mut c = c;
                        let buf = vec![0x5a; 256 * 1024];
                        while c.write_all(&buf).is_ok() {}
                    });
            }
        })
        .expect("server thread");
    at
}

/// Sends every flow the terminals open as fast as the flow takes it, from memory.
struct MemorySource {
    runtime: tokio::runtime::Handle,
}

impl pepd::tunnel::driver::FlowAcceptor for MemorySource {
    fn accept(
        &self,
        peer: Arc<pepd::tunnel::peer::Peer>,
        flow: pepd::tunnel::peer::FlowRef,
        _: FlowMeta,
        charge: pepd::tunnel::memory::FlowCharge,
    ) {
        self.runtime.spawn(async move {
            let _charge = charge;
            let buf = vec![0x5a; 64 * 1024];
            loop {
                match peer.write_room(&flow) {
                    Err(_) => return,
                    // The driver's notify_one leaves a permit if it comes first.
                    Ok(0) => flow.signal.notify.notified().await,
                    Ok(room) => {
                        if peer.write(&flow, &buf[..room.min(buf.len())]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

struct Terminal {
    assoc: Association,
    socket: UdpSocket,
    /// The socket read through quinn-udp: with GRO, one read takes a run of the hub's
    /// datagrams, which keeps the terminals' side cheap beside the hub it measures.
    state: UdpSocketState,
    flow: Option<pep_transport::FlowId>,
    received: u64,
}

/// The terminals: open their flow once established, read and discard, for `run` after
/// every one has data flowing; the bytes they read in that time.
fn terminals(
    mut ts: Vec<Terminal>,
    server: SocketAddr,
    run: Duration,
    measuring: &AtomicBool,
    read: &Barrier,
) -> u64 {
    let mut bufs: Vec<Vec<u8>> = (0..BATCH_SIZE).map(|_| vec![0u8; 65_536]).collect();
    let mut meta = [RecvMeta::default(); BATCH_SIZE];
    let mut out = Vec::new();
    let mut start: Option<(Instant, u64)> = None;
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let now = Instant::now();
        let mut busy = false;
        for (i, t) in ts.iter_mut().enumerate() {
            while let Ok(n) = udp::recv_batch(&t.state, (&t.socket).into(), &mut bufs, &mut meta) {
                for (m, b) in meta[..n].iter().zip(&bufs) {
                    for d in udp::datagrams(m) {
                        t.assoc.handle_datagram(now, &b[d]);
                    }
                }
                busy = true;
            }
            if t.assoc.poll_timeout().is_some_and(|d| d <= now) {
                t.assoc.handle_timeout(now);
            }
            while let Some(ev) = t.assoc.poll_event() {
                if matches!(ev, Event::Established) && t.flow.is_none() {
                    let meta = FlowMeta {
                        client: SocketAddr::from(([127, 0, 1, i as u8 + 1], 40_000)),
                        server,
                        dscp: 0,
                        compression: false,
                    };
                    t.flow = t.assoc.open_flow(meta).ok();
                }
            }
            if let Some(f) = t.flow {
                while let Ok(ReadOutcome::Data(d)) = t.assoc.read(f, 1 << 20) {
                    t.received += d.len() as u64;
                    busy = true;
                }
            }
            while t.assoc.poll_transmit(now, &mut out) {
                let _ = t.socket.send(&out);
                busy = true;
            }
        }
        let total: u64 = ts.iter().map(|t| t.received).sum();
        match start {
            None if ts.iter().all(|t| t.received > 0) => {
                start = Some((now, total));
                measuring.store(true, Ordering::Release);
            }
            None if now > give_up => panic!("not every terminal received within 30 s"),
            Some((t0, b0)) if now.duration_since(t0) >= run => {
                measuring.store(false, Ordering::Release);
                // This thread's CPU time is read before it ends.
                read.wait();
                return total - b0;
            }
            _ => {}
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn hub_config(
    workers: usize,
    rate_bps: u64,
    key_file: &std::path::Path,
    keys: &[[u8; 32]],
) -> String {
    let mut c = format!(
        "[tunnel]\nside = \"hub\"\nbind = \"127.0.0.1:0\"\nworkers = {workers}\n\n\
         [link]\ntx_rate = {rate_bps}\nrx_rate = {rate_bps}\n\n\
         [intercept]\nlisten = [\"127.0.0.1:1\"]\n\n[limits]\nmemory_budget = \"2GiB\"\n\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [security]\nprivate_key_file = {key_file:?}\n"
    );
    for (i, k) in keys.iter().enumerate() {
        c.push_str(&format!(
            "\n[[peer]]\nname = \"t{i}\"\npublic_key = \"{}\"\nsubnets = [\"127.0.1.{}/32\"]\n",
            pepd::config::keys::encode_key(&public_key(k)),
            i + 1
        ));
    }
    c
}

/// One run: `workers` workers, `n` terminals for `run`.
fn bulk(workers: usize, n: usize, run: Duration, rate_bps: u64) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub_key = [0x11; 32];
    let key_file = dir.path().join("hub.key");
    pepd::config::keys::write_key_file(&key_file, &hub_key).expect("key file");
    let keys: Vec<[u8; 32]> = (0..n).map(|i| [0x20 + i as u8; 32]).collect();
    let cfg = pepd::config::PepdConfig::parse(&hub_config(workers, rate_bps, &key_file, &keys))
        .expect("cfg");
    assert_eq!(cfg.workers(), workers);
    let security = cfg.load_security().expect("security");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let seeds: Vec<[u8; 32]> = (0..workers).map(|i| [0x40 + i as u8; 32]).collect();
    let tunnel = pepd::tunnel::setup::build(&cfg, &security, 1, &seeds).expect("tunnel");
    let gateway = tunnel.gateway.clone();
    let sockets = tunnel_sockets(cfg.tunnel_bind(), 0, workers, false).expect("sockets");
    let hub = sockets[0].local_addr().expect("addr");
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let live = Arc::new(RwLock::new(Live::from_config(&cfg)));
    let tcp = std::env::var("PEPD_BENCH_UPSTREAM").is_ok_and(|u| u == "tcp");
    let acceptor: Arc<dyn pepd::tunnel::driver::FlowAcceptor> = if tcp {
        Arc::new(UpstreamAcceptor {
            live,
            gateway: gateway.clone(),
            runtime: rt.handle().clone(),
            compression: None,
        })
    } else {
        Arc::new(MemorySource {
            runtime: rt.handle().clone(),
        })
    };
    let tasks = {
        let _in_rt = rt.enter();
        start_drivers(tunnel, sockets, acceptor, Notifier, stop_rx).expect("drivers")
    };
    // The flows' destination: the TCP server, or an address only the memory source sees.
    let server = if tcp {
        source()
    } else {
        SocketAddr::from(([127, 0, 0, 1], 9))
    };
    let now = Instant::now();
    let ts: Vec<Terminal> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
            socket.connect(hub).expect("connect");
            socket.set_nonblocking(true).expect("nonblocking");
            // quinn-udp sets its own options first; the buffers are ours.
            let state = UdpSocketState::new((&socket).into()).expect("quinn-udp state");
            pepd::sys::sockopt::force_buffers(&socket, 8 << 20).expect("buffers");
            let security = SecurityConfig {
                local_private_key: *k,
                peer_public_key: public_key(&hub_key),
                psk: None,
                rekey_interval: Duration::from_secs(120),
                rekey_after_packets: 1 << 30,
                aeads: AeadOffer::auto(hardware_aes()),
            };
            let mut seed = [0x80; 32];
            seed[0] = i as u8;
            let assoc = Association::new_secure(
                Config::for_rate(rate_bps),
                Role::Initiator,
                2 + i as u64,
                now,
                security,
                seed,
            )
            .expect("association");
            Terminal {
                assoc,
                socket,
                state,
                flow: None,
                received: 0,
            }
        })
        .collect();
    let measuring = Arc::new(AtomicBool::new(false));
    let prefixes = ["pepd-worker", "tokio-rt", "bench-far", "bench-srv"];
    let read = Arc::new(Barrier::new(2));
    let (m, r) = (measuring.clone(), read.clone());
    let far = std::thread::Builder::new()
        .name("bench-far".into())
        .spawn(move || terminals(ts, server, run, &m, &r))
        .expect("far side");
    while !measuring.load(Ordering::Acquire) && !far.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = cpu_by_thread(&prefixes);
    let t0 = Instant::now();
    while measuring.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = cpu_by_thread(&prefixes);
    let elapsed = t0.elapsed().as_secs_f64();
    let stats = gateway.stats().0;
    read.wait();
    let bytes = far.join().expect("far side");
    let cpu: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let _ = stop.send(true);
    for t in tasks {
        let _ = rt.block_on(t);
    }
    let gb = bytes as f64 / 1e9;
    // The hub: its workers (or, with one, the driver on the runtime) and the relays.
    let hub_cpu = cpu[0] + cpu[1];
    format!(
        "{{\"upstream\":\"{}\",\"workers\":{workers},\"terminals\":{n},\"seconds\":{elapsed:.3},\"bytes\":{bytes},\
         \"gbit_per_s\":{:.3},\"hub_cpu_s\":{hub_cpu:.3},\"hub_cpu_s_per_gb\":{:.3},\
         \"worker_threads_cpu_s\":{:.3},\"runtime_threads_cpu_s\":{:.3},\
         \"terminals_cpu_s\":{:.3},\"server_cpu_s\":{:.3},\"other_cpu_s\":{:.3},\
         \"hub_wire_bytes_sent\":{},\"hub_retransmitted_bytes\":{},\"hub_lost\":{}}}",
        if tcp { "tcp" } else { "memory" },
        gb * 8.0 / elapsed,
        hub_cpu / gb.max(1e-9),
        cpu[0],
        cpu[1],
        cpu[2],
        cpu[3],
        cpu[4],
        stats.wire_bytes_sent,
        stats.stream_bytes_retransmitted,
        stats.lost.congestion + stats.lost.corruption + stats.lost.outage,
    )
}

fn main() {
    let n = env_or("PEPD_BENCH_TERMINALS", 8) as usize;
    let run = Duration::from_secs(env_or("PEPD_BENCH_SECONDS", 5));
    let rate = env_or("PEPD_BENCH_RATE", RATE_BPS);
    let counts = std::env::var("PEPD_BENCH_WORKERS").unwrap_or_else(|_| "1,2".into());
    for w in counts.split(',').filter_map(|w| w.trim().parse().ok()) {
        println!("{}", bulk(w, n, run, rate));
    }
}
