//! The `pep-linkemu` binary between two namespaces: it creates its TUN devices, carries
//! traffic with the configured delay, prints JSON stats on SIGUSR1 and again on SIGTERM.
//! Root only; namespaces are unique per test instance and removed on drop.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pep_linkemu::netns;

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?}");
}

/// Two namespaces and the emulator process; all removed on drop, even on panic.
struct Bed {
    a: String,
    b: String,
    child: Option<Child>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn binary_carries_delayed_traffic_and_reports_stats_on_signals() {
    if !netns::require_root() {
        return;
    }
    let pid = std::process::id();
    let mut bed = Bed {
        a: format!("peple-{pid}-a"),
        b: format!("peple-{pid}-b"),
        child: None,
    };
    for ns in [&bed.a, &bed.b] {
        ip(&["netns", "add", ns]);
    }
    let child = Command::new(env!("CARGO_BIN_EXE_pep-linkemu"))
        .args(["--a-netns", &bed.a, "--b-netns", &bed.b])
        .args(["--a-dev", "emu0", "--b-dev", "emu0"])
        .args(["--delay-ms", "50", "--rate-bps", "10000000"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start pep-linkemu");
    let child = bed.child.insert(child);
    // The emulator creates the devices; configure them once they exist.
    let t0 = Instant::now();
    while !Command::new("ip")
        .args(["-n", &bed.b, "link", "show", "emu0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("ip")
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "TUN devices never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (ns, addr) in [(&bed.a, "198.19.7.1/24"), (&bed.b, "198.19.7.2/24")] {
        ip(&["-n", ns, "addr", "add", addr, "dev", "emu0"]);
        ip(&["-n", ns, "link", "set", "emu0", "up"]);
    }
    let to: SocketAddr = "198.19.7.2:7000".parse().expect("addr");
    let rx = netns::run_in(Some(&bed.b), move || {
        UdpSocket::bind(to).map_err(pep_linkemu::Error::Thread)
    })
    .expect("bind in b");
    rx.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let sent_at = netns::run_in(Some(&bed.a), move || {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(pep_linkemu::Error::Thread)?;
        let t = Instant::now();
        s.send_to(b"hello satellite", to)
            .map_err(pep_linkemu::Error::Thread)?;
        Ok(t)
    })
    .expect("send from a");
    let mut buf = [0u8; 64];
    let n = rx.recv(&mut buf).expect("datagram crossed the link");
    let one_way = sent_at.elapsed();
    assert_eq!(&buf[..n], b"hello satellite");
    assert!(one_way >= Duration::from_millis(50), "{one_way:?}");
    assert!(one_way < Duration::from_millis(60), "{one_way:?}");

    let pid = Pid::from_raw(child.id() as i32);
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    kill(pid, Signal::SIGUSR1).expect("SIGUSR1");
    out.read_line(&mut line).expect("stats line");
    let live: serde_json::Value = serde_json::from_str(&line).expect("JSON on SIGUSR1");
    assert!(live["forward"]["passed_packets"].as_u64().expect("count") >= 1);
    line.clear();
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    out.read_line(&mut line).expect("final stats line");
    let last: serde_json::Value = serde_json::from_str(&line).expect("JSON on exit");
    assert!(last["return"]["dropped"]["queue"].is_u64());
    assert!(child.wait().expect("exit").success());
}
