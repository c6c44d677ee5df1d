//! The daemon's process-level behaviour, each test in a namespace of its own with only a
//! loopback: systemd notifications, live reload seen in the metrics, running as a non-root
//! user with only CAP_NET_ADMIN and CAP_NET_RAW.

mod support;

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use support::{metric_value, scrape_metrics};

const PEPD: &str = env!("CARGO_BIN_EXE_pepd");

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// A namespace with loopback up, and a scratch directory; both removed on drop.
struct Sandbox {
    ns: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Sandbox {
    fn new() -> Sandbox {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let ns = format!("pepd-dt-{}-{n}", std::process::id());
        run("ip", &["netns", "add", &ns]);
        let sb = Sandbox {
            dir: std::env::temp_dir().join(&ns),
            ns,
            children: Vec::new(),
        };
        run("ip", &["-n", &sb.ns, "link", "set", "lo", "up"]);
        std::fs::create_dir_all(&sb.dir).expect("scratch dir");
        // Readable by an unprivileged pepd too.
        run("chmod", &["755", sb.dir.to_str().expect("utf-8 path")]);
        // Its runtime directory, for the control socket: writable by any user, as the
        // unit's `RuntimeDirectory=` is by the one it runs as.
        let runtime = sb.runtime_dir();
        std::fs::create_dir_all(&runtime).expect("runtime dir");
        run("chmod", &["1777", runtime.to_str().expect("utf-8 path")]);
        sb
    }

    /// What pepd gets as `$RUNTIME_DIRECTORY`: its control sockets go there.
    fn runtime_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// A private key made with `pepd genkey` (owned by `owner`, mode 0600, as pepd wants)
    /// and a second gateway's public key; returns the `[security]` section naming them.
    fn security_toml(&self, owner: &str) -> String {
        let key = self.dir.join("private.key");
        if !key.exists() {
            let out = Command::new(PEPD)
                .args(["genkey", key.to_str().expect("utf-8 path")])
                .output()
                .expect("pepd genkey");
            assert!(out.status.success(), "genkey: {out:?}");
            run("chown", &[owner, key.to_str().expect("utf-8 path")]);
        }
        let peer = self.dir.join("peer.key");
        if !peer.exists() {
            Command::new(PEPD)
                .args(["genkey", peer.to_str().expect("utf-8 path")])
                .output()
                .expect("pepd genkey");
        }
        let out = Command::new(PEPD)
            .args(["pubkey", peer.to_str().expect("utf-8 path")])
            .output()
            .expect("pepd pubkey");
        let peer_public = String::from_utf8(out.stdout).expect("utf-8");
        format!(
            "[security]\nprivate_key_file = {:?}\npeer_public_key = {:?}\n",
            key.display().to_string(),
            peer_public.trim()
        )
    }

    fn write_config(&self, name: &str, tx_rate: &str) -> PathBuf {
        self.write_config_owned(name, tx_rate, "root")
    }

    /// As `write_config`, with the key file owned by `owner` (the user pepd runs as).
    fn write_config_owned(&self, name: &str, tx_rate: &str, owner: &str) -> PathBuf {
        let path = self.dir.join(name);
        let security = self.security_toml(owner);
        let text = format!(
            r#"
[peer]
# Nobody answers here: these tests need no association.
address = "198.18.0.2:7400"
bind = "0.0.0.0:7400"
side = "terminal"

[link]
tx_rate = "{tx_rate}"
rx_rate = "10Mbit"

[intercept]
listen = ["127.0.0.1:7000"]

[shutdown]
grace = "2s"

{security}"#
        );
        std::fs::write(&path, text).expect("config");
        run("chmod", &["644", path.to_str().expect("utf-8 path")]);
        path
    }

    /// A hub's config on `workers` tunnel workers, with one terminal among its peers and
    /// its interception and metrics on the ports given.
    fn write_hub_config(&self, name: &str, workers: usize, ports: (u16, u16)) -> PathBuf {
        let path = self.dir.join(name);
        let key = self.dir.join("hub.key");
        let peer = self.dir.join("terminal.key");
        for k in [&key, &peer] {
            if !k.exists() {
                run(PEPD, &["genkey", k.to_str().expect("utf-8 path")]);
            }
        }
        let out = Command::new(PEPD)
            .args(["pubkey", peer.to_str().expect("utf-8 path")])
            .output()
            .expect("pepd pubkey");
        let peer_public = String::from_utf8(out.stdout).expect("utf-8");
        let (intercept, metrics) = ports;
        let text = format!(
            r#"
[tunnel]
side = "hub"
bind = "0.0.0.0:7400"
workers = {workers}

[link]
tx_rate = "10Mbit"
rx_rate = "10Mbit"

[intercept]
listen = ["127.0.0.1:{intercept}"]

[metrics]
listen = "127.0.0.1:{metrics}"

[security]
private_key_file = {:?}

[[peer]]
name = "t1"
public_key = {:?}
subnets = ["198.18.11.0/24"]
"#,
            key.display().to_string(),
            peer_public.trim()
        );
        std::fs::write(&path, text).expect("config");
        path
    }

    /// Starts a hub on two workers (interception on port 7000, metrics on 9464) and waits
    /// until it is ready.
    fn start_ready_hub(&mut self) {
        let cfg = self.write_hub_config("hub.toml", 2, (7000, 9464));
        let (sock, path) = self.notify_socket();
        self.start(&cfg, &path, &[]);
        let mut seen = Vec::new();
        assert!(
            wait_for(&sock, &mut seen, "READY=1", Duration::from_secs(10)),
            "{seen:?}"
        );
    }

    /// Runs pepd in the namespace until it exits, at most `within`: see [`end_of`].
    fn run_to_end(&self, config: &Path, within: Duration) -> Option<(ExitStatus, String)> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, PEPD])
            .args(["run", "-c", config.to_str().expect("utf-8 path")])
            .env("RUNTIME_DIRECTORY", self.runtime_dir())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pepd");
        end_of(&mut child, within)
    }

    fn notify_socket(&self) -> (UnixDatagram, PathBuf) {
        let path = self.dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("notify socket");
        run("chmod", &["777", path.to_str().expect("utf-8 path")]);
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        (sock, path)
    }

    /// Starts pepd in the namespace, optionally through a command prefix (setpriv).
    fn start(&mut self, config: &Path, notify: &Path, prefix: &[&str]) -> u32 {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).args(prefix).arg(PEPD);
        cmd.args(["run", "-c", config.to_str().expect("utf-8 path")])
            .env("NOTIFY_SOCKET", notify)
            .env("RUNTIME_DIRECTORY", self.runtime_dir())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn pepd");
        let pid = child.id();
        self.children.push(child);
        pid
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(prog: &str, args: &[&str]) {
    let out = Command::new(prog).args(args).output().expect(prog);
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How pepd (`child`, its stderr piped) ended, waiting at most `within`: its exit status and
/// what it logged; `None`, and killed, if it was still running.
fn end_of(child: &mut Child, within: Duration) -> Option<(ExitStatus, String)> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut log = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut log).expect("stderr");
            }
            return Some((status, log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Collects notification datagrams until one contains `want` or the time is up.
fn wait_for(sock: &UnixDatagram, seen: &mut Vec<String>, want: &str, within: Duration) -> bool {
    let end = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            if seen.last().is_some_and(|m| m.contains(want)) {
                return true;
            }
        }
    }
    false
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    // `ip netns exec` execs pepd, so the child's pid is pepd's.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("kill");
}

fn pacing_rate(sb: &Sandbox) -> Option<f64> {
    metric_value(
        &scrape_metrics(&sb.ns),
        "pepd_pacing_rate_bytes_per_second",
        None,
    )
}

#[test]
fn ready_status_and_stopping_reach_the_notify_socket() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut sb = Sandbox::new();
    let cfg = sb.write_config("pepd.toml", "2Mbit");
    let (sock, path) = sb.notify_socket();
    let pid = sb.start(&cfg, &path, &[]);
    let mut seen = Vec::new();
    assert!(
        wait_for(&sock, &mut seen, "READY=1", Duration::from_secs(10)),
        "{seen:?}"
    );
    let ready = seen.last().expect("ready message");
    assert!(ready.contains("STATUS=listening"), "{ready}");
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    assert!(
        wait_for(&sock, &mut seen, "STOPPING=1", Duration::from_secs(5)),
        "{seen:?}"
    );
    let child = sb.children.last_mut().expect("child");
    let status = child.wait().expect("wait");
    assert!(status.success(), "pepd exit after SIGTERM: {status}");
}

#[test]
fn sighup_changes_the_rate_live() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut sb = Sandbox::new();
    let cfg = sb.write_config("pepd.toml", "2Mbit");
    let (sock, path) = sb.notify_socket();
    let pid = sb.start(&cfg, &path, &[]);
    let mut seen = Vec::new();
    assert!(wait_for(
        &sock,
        &mut seen,
        "READY=1",
        Duration::from_secs(10)
    ));
    let before = pacing_rate(&sb);
    assert_eq!(before, Some(2_000_000.0 / 8.0));

    sb.write_config("pepd.toml", "5Mbit");
    signal(pid, nix::sys::signal::Signal::SIGHUP);
    let end = Instant::now() + Duration::from_secs(5);
    let mut after = before;
    while Instant::now() < end && after != Some(5_000_000.0 / 8.0) {
        std::thread::sleep(Duration::from_millis(50));
        after = pacing_rate(&sb);
    }
    assert_eq!(after, Some(5_000_000.0 / 8.0));
}

#[test]
fn runs_as_an_unprivileged_user_with_two_capabilities() {
    if !pep_testbed::require_root() {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        panic!("setpriv (util-linux) is required for this test");
    }
    let mut sb = Sandbox::new();
    // The key belongs to the user pepd runs as, as the package installs it.
    let cfg = sb.write_config_owned("pepd.toml", "2Mbit", "65534:65534");
    let (sock, path) = sb.notify_socket();
    let caps = "-all,+net_admin,+net_raw";
    let pid = sb.start(
        &cfg,
        &path,
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps={caps}"),
            &format!("--ambient-caps={caps}"),
            &format!("--bounding-set={caps}"),
            "--",
        ],
    );
    let mut seen = Vec::new();
    assert!(
        wait_for(&sock, &mut seen, "READY=1", Duration::from_secs(10)),
        "pepd did not get ready without root: {seen:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .expect(name)
    };
    assert!(field("Uid:").starts_with("65534"), "{}", field("Uid:"));
    // CAP_NET_ADMIN is bit 12, CAP_NET_RAW bit 13: nothing else.
    let eff = u64::from_str_radix(&field("CapEff:"), 16).expect("hex");
    assert_eq!(
        eff,
        (1 << 12) | (1 << 13),
        "effective capabilities {eff:#x}"
    );
    // It serves metrics, so it is really running, not just alive.
    assert!(metric_value(&scrape_metrics(&sb.ns), "pepd_build_info", None).is_some());
    // And its control socket, made by its user in the runtime directory it was given.
    let control = sb.runtime_dir().join("pepd.sock");
    let meta = std::fs::metadata(&control).expect("the control socket");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (65534, 0o660)
    );
    let out = Command::new(PEPD)
        .args(["status", "--socket", control.to_str().expect("utf-8 path")])
        .output()
        .expect("pepd status");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\npeer peer\n"));
}

/// SIGUSR1 logs what `pepd status` prints, a log line per line of it.
#[test]
fn sigusr1_logs_the_status_screen() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut sb = Sandbox::new();
    let cfg = sb.write_config("pepd.toml", "2Mbit");
    let (sock, path) = sb.notify_socket();
    let pid = sb.start(&cfg, &path, &[]);
    let mut seen = Vec::new();
    assert!(
        wait_for(&sock, &mut seen, "READY=1", Duration::from_secs(10)),
        "{seen:?}"
    );
    let control = sb.runtime_dir().join("pepd.sock");
    let screen = Command::new(PEPD)
        .args(["status", "--socket", control.to_str().expect("utf-8 path")])
        .output()
        .expect("pepd status");
    let screen = String::from_utf8(screen.stdout).expect("utf-8");
    signal(pid, nix::sys::signal::Signal::SIGUSR1);
    std::thread::sleep(Duration::from_millis(500));
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    let child = sb.children.last_mut().expect("child");
    let (status, log) = end_of(child, Duration::from_secs(10)).expect("pepd stopped");
    assert!(status.success(), "{status}: {log}");
    let logged: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once(" pepd::status: ").map(|(_, text)| text))
        .collect();
    // The same lines, but for the figures that moved in between (ages, counters).
    let shape = |l: &str| -> String {
        l.chars()
            .filter(|c| !c.is_ascii_digit() && *c != '.')
            .collect::<String>()
            .replace(" ms", " s")
    };
    let want: Vec<String> = screen.lines().map(shape).collect();
    let got: Vec<String> = logged.iter().map(|l| shape(l)).collect();
    assert_eq!(got, want, "{log}");
    // The daemon removed its socket as it stopped.
    assert!(!control.exists());
}

/// A second hub on the same tunnel address does not join the first's group of worker
/// sockets (and take a share of its datagrams): it fails to start, saying why.
#[test]
fn a_second_hub_on_the_tunnel_address_of_a_running_one_fails_to_start() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.start_ready_hub();
    for workers in [2, 1] {
        let second = sb.write_hub_config("second.toml", workers, (7001, 9465));
        let (status, log) = sb
            .run_to_end(&second, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("a second hub of {workers} workers kept running"));
        assert!(!status.success(), "{status}");
        assert!(
            log.contains("0.0.0.0:7400 is in use by another process"),
            "{workers} workers: {log}"
        );
    }
    // The first serves on.
    assert!(metric_value(&scrape_metrics(&sb.ns), "pepd_build_info", None).is_some());
}

/// A tunnel worker whose socket fails ends the daemon with an error (so that its service
/// manager starts it again) instead of leaving it to serve on without that worker's peers.
#[test]
fn a_hub_whose_worker_stops_exits_with_an_error() {
    if !pep_testbed::require_root() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.start_ready_hub();
    // SOCK_DESTROY: the kernel finds the socket by its addresses, which the whole group
    // shares, so it destroys one of them (ECONNABORTED), and that one receives nothing more.
    run(
        "ip",
        &[
            "netns", "exec", &sb.ns, "ss", "-K", "-u", "-a", "sport", "=", ":7400",
        ],
    );
    let child = sb.children.last_mut().expect("child");
    let (status, log) = end_of(child, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("pepd still ran without its worker"));
    assert!(!status.success(), "{status}");
    assert!(log.contains("tunnel worker"), "{log}");
    assert!(log.contains("tunnel socket failed"), "{log}");
}
