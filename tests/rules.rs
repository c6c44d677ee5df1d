//! The interception rules of `pepd nft-rules` at work (root only): a client, a gateway and a
//! server in network namespaces, the gateway routing between them with the generated
//! nftables ruleset and policy routing loaded. A test listener with `IP_TRANSPARENT` on the
//! TPROXY port stands in for pepd, so the rules are checked on their own:
//!
//! - `fail = "closed"` without a listener: the selected connections time out (dropped),
//!   the rest is routed;
//! - `fail = "open"` without a listener: they are routed to the server unproxied;
//! - with a listener: the gateway accepts them, and the accepted socket's local address is
//!   the server the client dialled;
//! - `quic = "reject"`: a client's UDP to port 443 is answered with an ICMP port
//!   unreachable (ECONNREFUSED on its connected socket); `"drop"`: it vanishes; `"pass"`: it
//!   is forwarded; an exception, a bypassed subnet, the gateway's own address, the tunnel's
//!   datagrams and UDP from the server side are untouched under every policy.
//!
//! ```text
//! client eth0 ── lan0 gateway wan0 ── eth0 server
//! 198.18.50.2    198.18.50.1  198.18.51.1   198.18.51.2 to .5
//! fd00:198:18:50::2  ::1      fd00:198:18:51::1  ::2
//! ```

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::libc;
use nix::sched::{setns, CloneFlags};
use pepd::config::PepdConfig;
use socket2::{Domain, Socket, Type};

const CLIENT_V4: &str = "198.18.50.2";
const CLIENT_V6: &str = "fd00:198:18:50::2";
const SERVER_V4: &str = "198.18.51.2";
const SERVER_V6: &str = "fd00:198:18:51::2";
/// A second server address, listed in `bypass_subnets`.
const BYPASSED_V4: &str = "198.18.51.3";
/// A third, listed in `quic_exceptions` (a VPN server on UDP 443).
const EXCEPTION_V4: &str = "198.18.51.4";
/// A fourth: the peer gateway, whose tunnel port is 443.
const PEER_V4: &str = "198.18.51.5";
const QUIC_PORT: u16 = 443;
/// The gateway's own tunnel port, and its mark (`intercept.own_mark`'s default).
const TUNNEL_PORT: u16 = 7400;
const OWN_MARK: u32 = 0x2;
const TPROXY_PORT: u16 = 7000;
/// The port the rules select; the server also listens on an unselected one.
const SELECTED: u16 = 80;
const UNSELECTED: u16 = 8080;
/// Long enough for a routed or intercepted handshake on veth; a dropped SYN's first
/// retransmission comes after 1 s, so a timeout here means "dropped".
const CONNECT_TIMEOUT: Duration = Duration::from_millis(900);

fn pepd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pepd")
}

fn run(prog: &str, args: &[&str]) -> String {
    run_with_input(prog, args, None)
}

#[track_caller]
fn run_with_input(prog: &str, args: &[&str], input: Option<&str>) -> String {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e} (these tests need root, ip and nft)"));
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "`{prog} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace, deleted on drop (with the veth ends inside it).
struct Netns {
    name: String,
}

impl Netns {
    fn new(name: String) -> Netns {
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        // Interfaces created from now on skip duplicate address detection, also for their
        // link-local address: until that is done, neighbour discovery fails and the first
        // IPv6 SYN through the gateway is lost.
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        ns
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `prog args…` inside the namespace.
    fn exec(&self, prog: &str, args: &[&str], input: Option<&str>) -> String {
        let mut all = vec!["netns", "exec", self.name.as_str(), prog];
        all.extend_from_slice(args);
        run_with_input("ip", &all, input)
    }

    fn sysctl(&self, key: &str, value: &str) {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")], None);
    }

    /// Runs `f` on a thread that has entered the namespace; sockets it opens stay there.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        thread::spawn(move || {
            let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread panicked")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

struct Topology {
    client: Netns,
    gw: Netns,
    server: Netns,
    /// Temporary files of the test (configs, apply-script state); removed on drop.
    dir: PathBuf,
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The three namespaces, named uniquely for this process and test.
fn topology(test: &str) -> Topology {
    let base = format!(
        "pepdr-{}-{}-{test}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(&base);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let t = Topology {
        client: Netns::new(format!("{base}-cl")),
        gw: Netns::new(format!("{base}-gw")),
        server: Netns::new(format!("{base}-sv")),
        dir,
    };
    let (cl, sv) = (&t.client.name, &t.server.name);
    t.gw.ip(&[
        "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", cl,
    ]);
    t.gw.ip(&[
        "link", "add", "wan0", "type", "veth", "peer", "name", "eth0", "netns", sv,
    ]);
    let addrs: [(&Netns, &str, &[&str]); 4] = [
        (
            &t.client,
            "eth0",
            &["198.18.50.2/24", "fd00:198:18:50::2/64"],
        ),
        (&t.gw, "lan0", &["198.18.50.1/24", "fd00:198:18:50::1/64"]),
        (&t.gw, "wan0", &["198.18.51.1/24", "fd00:198:18:51::1/64"]),
        (
            &t.server,
            "eth0",
            &[
                "198.18.51.2/24",
                "198.18.51.3/24",
                "198.18.51.4/24",
                "198.18.51.5/24",
                "fd00:198:18:51::2/64",
            ],
        ),
    ];
    for (ns, dev, list) in addrs {
        for a in list {
            let mut args = vec!["addr", "add", a, "dev", dev];
            if a.contains(':') {
                args.push("nodad");
            }
            ns.ip(&args);
        }
        ns.ip(&["link", "set", dev, "up"]);
    }
    for (ns, v4, v6) in [
        (&t.client, "198.18.50.1", "fd00:198:18:50::1"),
        (&t.server, "198.18.51.1", "fd00:198:18:51::1"),
    ] {
        ns.ip(&["route", "add", "default", "via", v4]);
        ns.ip(&["-6", "route", "add", "default", "via", v6]);
    }
    // The kernel reports the carrier, and IPv6 configures the link-local address neighbour
    // discovery needs, only after a link-watch delay of up to a second: IPv6 packets sent
    // before that are lost.
    let deadline = Instant::now() + Duration::from_secs(5);
    for (ns, dev) in [
        (&t.client, "eth0"),
        (&t.gw, "lan0"),
        (&t.gw, "wan0"),
        (&t.server, "eth0"),
    ] {
        loop {
            let link = ns.ip(&["-o", "link", "show", "dev", dev]);
            let local = ns.ip(&["-o", "-6", "addr", "show", "dev", dev, "scope", "link"]);
            if link.contains("state UP") && !local.is_empty() && !local.contains("tentative") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{dev} never came up: {link}{local}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
    t.gw.sysctl("net.ipv4.ip_forward", "1");
    t.gw.sysctl("net.ipv6.conf.all.forwarding", "1");
    // Loose, as deploy/99-pepd.conf sets it; whatever a new namespace starts with.
    t.gw.sysctl("net.ipv4.conf.all.rp_filter", "0");
    t.gw.sysctl("net.ipv4.conf.lan0.rp_filter", "2");
    t.gw.sysctl("net.ipv4.conf.wan0.rp_filter", "2");
    // Room in the accept queue for `limits.max_flows`, and TIME_WAIT reuse for upstream
    // connects, as deploy/99-pepd.conf sets them.
    t.gw.sysctl("net.core.somaxconn", "16384");
    t.gw.sysctl("net.ipv4.tcp_tw_reuse", "1");
    t
}

/// A gateway config: both families on port 7000, port 80 selected on lan0, one server
/// address bypassed; the peer is the server, which the gateway can route to.
fn config(fail: &str) -> String {
    format!(
        "[intercept]
listen = [\"0.0.0.0:{TPROXY_PORT}\", \"[::]:{TPROXY_PORT}\"]
[rules]
interfaces = [\"lan0\"]
ports = [{SELECTED}]
bypass_subnets = [\"{BYPASSED_V4}/32\"]
fail = \"{fail}\"
[peer]
address = \"{SERVER_V4}:7400\"
side = \"terminal\"
[link]
tx_rate = \"2M\"
rx_rate = \"10M\"
"
    )
}

impl Topology {
    fn write_config(&self, fail: &str) -> PathBuf {
        let path = self.dir.join(format!("pepd-{fail}.toml"));
        std::fs::write(&path, config(fail)).expect("write config");
        path
    }

    /// Loads the rules into the gateway the way pepd-rules.service does.
    fn apply_rules(&self, config: &Path, verb: &str) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/pepd-apply-rules");
        let state = self.dir.join("state");
        let config = config.to_str().expect("utf-8 path");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.gw.name, script, verb, config])
            .env("PEPD", pepd_bin())
            .env("PEPD_RULES_STATE", &state)
            .output()
            .expect("run pepd-apply-rules");
        assert!(
            out.status.success(),
            "pepd-apply-rules {verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Connects from the client; `Ok` with the client's and the server's view of it.
    fn connect(&self, to: SocketAddr) -> std::io::Result<TcpStream> {
        self.client
            .run(move || TcpStream::connect_timeout(&to, CONNECT_TIMEOUT))
    }

    fn listen_server(&self, addr: SocketAddr) -> TcpListener {
        self.server.run(move || {
            let l = TcpListener::bind(addr).expect("server bind");
            l.set_nonblocking(true).expect("nonblocking");
            l
        })
    }

    /// The stand-in for pepd: a transparent listener on the TPROXY port of the gateway.
    fn listen_transparent(&self, v6: bool) -> TcpListener {
        self.gw.run(move || transparent_listener(v6))
    }
}

fn transparent_listener(v6: bool) -> TcpListener {
    let (domain, addr): (Domain, SocketAddr) = if v6 {
        (Domain::IPV6, SocketAddr::from(([0u16; 8], TPROXY_PORT)))
    } else {
        (Domain::IPV4, SocketAddr::from(([0, 0, 0, 0], TPROXY_PORT)))
    };
    let s = Socket::new(domain, Type::STREAM, None).expect("socket");
    if v6 {
        s.set_only_v6(true).expect("v6only");
    }
    s.set_reuse_address(true).expect("reuseaddr");
    let (level, name) = if v6 {
        (libc::SOL_IPV6, libc::IPV6_TRANSPARENT)
    } else {
        (libc::SOL_IP, libc::IP_TRANSPARENT)
    };
    let one: libc::c_int = 1;
    // SAFETY: a live socket, and an int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "IP_TRANSPARENT: {}", std::io::Error::last_os_error());
    s.bind(&addr.into()).expect("bind");
    s.listen(16).expect("listen");
    s.set_nonblocking(true).expect("nonblocking");
    s.into()
}

/// Closes a listener at once. Dropping it is not enough: a child another test is spawning
/// may hold a copy of the descriptor between its fork and exec, keeping the socket
/// listening a moment longer; `shutdown` ends listening whoever holds it.
fn stop_listening(l: TcpListener) {
    socket2::SockRef::from(&l)
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown listener");
}

/// The next connection `l` accepts within a second, as (stream, peer).
fn accept(l: &TcpListener) -> Option<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match l.accept() {
            Ok(c) => return Some(c),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse::<IpAddr>().expect("address"), port)
}

/// Asserts the client's connection to `to` was taken by `listener` on the gateway: the
/// accepted socket's local address is `to`, its peer the client, and bytes flow both ways
/// (later packets find the socket through the `socket transparent` rule).
#[track_caller]
fn assert_intercepted(t: &Topology, listener: &TcpListener, to: SocketAddr, client: &str) {
    let mut c = t.connect(to).expect("intercepted connect");
    let (mut s, peer) = accept(listener).expect("the gateway listener accepted nothing");
    assert_eq!(s.local_addr().expect("local_addr"), to);
    assert_eq!(peer.ip(), client.parse::<IpAddr>().expect("client"));
    assert_eq!(c.local_addr().expect("client addr"), peer);
    c.write_all(b"ping").expect("client write");
    let mut buf = [0u8; 4];
    s.set_nonblocking(false).expect("blocking");
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    s.read_exact(&mut buf).expect("gateway read");
    assert_eq!(&buf, b"ping");
    s.write_all(b"pong").expect("gateway write");
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    c.read_exact(&mut buf).expect("client read");
    assert_eq!(&buf, b"pong");
}

/// Asserts the client's connection to `to` reached `server` directly, routed.
#[track_caller]
fn assert_routed(t: &Topology, server: &TcpListener, to: SocketAddr, client: &str) {
    let c = t.connect(to).expect("routed connect");
    let (s, peer) = accept(server).expect("the server accepted nothing");
    assert_eq!(s.local_addr().expect("local_addr"), to);
    assert_eq!(peer.ip(), client.parse::<IpAddr>().expect("client"));
    assert_eq!(c.peer_addr().expect("peer"), to);
}

#[track_caller]
fn assert_dropped(t: &Topology, to: SocketAddr) {
    let started = Instant::now();
    match t.connect(to) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}"),
        Ok(c) => panic!("connected to {to} from {:?}", c.local_addr()),
    }
    assert!(started.elapsed() >= CONNECT_TIMEOUT);
}

#[test]
fn fail_closed_drops_selected_tcp_while_no_listener_exists() {
    if !pep_testbed::require_root() {
        return;
    }
    let t = topology("closed");
    let cfg = t.write_config("closed");
    t.apply_rules(&cfg, "start");
    let servers: Vec<TcpListener> = [
        sa(SERVER_V4, SELECTED),
        sa(SERVER_V4, UNSELECTED),
        sa(BYPASSED_V4, SELECTED),
        sa(SERVER_V6, SELECTED),
    ]
    .into_iter()
    .map(|a| t.listen_server(a))
    .collect();

    assert_dropped(&t, sa(SERVER_V4, SELECTED));
    assert_dropped(&t, sa(SERVER_V6, SELECTED));
    // What the rules do not select is routed as usual.
    assert_routed(&t, &servers[1], sa(SERVER_V4, UNSELECTED), CLIENT_V4);
    assert_routed(&t, &servers[2], sa(BYPASSED_V4, SELECTED), CLIENT_V4);

    // pepd starts: the same connections are intercepted, in both families.
    let v4 = t.listen_transparent(false);
    let v6 = t.listen_transparent(true);
    assert_intercepted(&t, &v4, sa(SERVER_V4, SELECTED), CLIENT_V4);
    assert_intercepted(&t, &v6, sa(SERVER_V6, SELECTED), CLIENT_V6);
    assert_routed(&t, &servers[2], sa(BYPASSED_V4, SELECTED), CLIENT_V4);

    // pepd stops: dropped again.
    stop_listening(v4);
    stop_listening(v6);
    assert_dropped(&t, sa(SERVER_V4, SELECTED));
    for (s, what) in [(&servers[0], "v4"), (&servers[3], "v6")] {
        assert!(
            accept(s).is_none(),
            "the {what} server saw a selected connection"
        );
    }
}

#[test]
fn fail_open_routes_selected_tcp_while_no_listener_exists() {
    if !pep_testbed::require_root() {
        return;
    }
    let t = topology("open");
    let cfg = t.write_config("open");
    t.apply_rules(&cfg, "start");
    let v4_server = t.listen_server(sa(SERVER_V4, SELECTED));
    let v6_server = t.listen_server(sa(SERVER_V6, SELECTED));

    assert_routed(&t, &v4_server, sa(SERVER_V4, SELECTED), CLIENT_V4);
    assert_routed(&t, &v6_server, sa(SERVER_V6, SELECTED), CLIENT_V6);

    let v4 = t.listen_transparent(false);
    assert_intercepted(&t, &v4, sa(SERVER_V4, SELECTED), CLIENT_V4);
    assert!(accept(&v4_server).is_none());
    // No IPv6 listener yet: IPv6 is still routed.
    assert_routed(&t, &v6_server, sa(SERVER_V6, SELECTED), CLIENT_V6);
}

#[test]
fn rules_apply_repeatedly_and_the_self_check_sees_them() {
    if !pep_testbed::require_root() {
        return;
    }
    let t = topology("apply");
    let path = t.write_config("closed");
    let cfg = PepdConfig::load(&path).expect("config");
    let checks = {
        let cfg = cfg.clone();
        move || {
            let cfg = cfg.clone();
            move || pepd::control::selfcheck::startup_checks(&cfg)
        }
    };
    let no_routing = |fam: &str| {
        [
            format!(
                "no {fam} `ip rule` looks up table 100 for mark 0x1: intercepted connections \
                 are forwarded instead of delivered to pepd; run the script from `pepd \
                 nft-rules --routes`"
            ),
            format!(
                "table 100 has no {fam} `local default dev lo` route: marked packets are \
                 forwarded instead of delivered to pepd; run the script from `pepd nft-rules \
                 --routes`"
            ),
        ]
    };
    let mut bare = vec![
        "no nftables `tproxy` rule sends IPv4 TCP to port 7000 (`intercept.listen` \
         0.0.0.0:7000): connections are routed past pepd; load the rules from `pepd \
         nft-rules` (or, with iptables-legacy, check them there)"
            .to_owned(),
        "no nftables `tproxy` rule sends IPv6 TCP to port 7000 (`intercept.listen` \
         [::]:7000): connections are routed past pepd; load the rules from `pepd nft-rules` \
         (or, with iptables-legacy, check them there)"
            .to_owned(),
    ];
    bare.extend(no_routing("IPv4"));
    bare.extend(no_routing("IPv6"));
    assert_eq!(t.gw.run(checks()), bare);

    for _ in 0..3 {
        t.apply_rules(&path, "start");
    }
    assert_eq!(t.gw.run(checks()), Vec::<String>::new());
    let marked = |fam: &str| {
        t.gw.ip(&[fam, "rule", "show"])
            .lines()
            .filter(|l| l.contains("fwmark 0x1 lookup 100"))
            .count()
    };
    assert_eq!((marked("-4"), marked("-6")), (1, 1));
    let listed = t.gw.exec("nft", &["list", "table", "inet", "pepd"], None);
    assert!(listed.contains("tproxy ip to :7000 meta mark set 0x00000001 accept"));

    // A new mark and table replace the old ones instead of adding to them.
    std::fs::write(
        &path,
        config("closed").replace("fail =", "tproxy_mark = 0x7\nroute_table = 77\nfail ="),
    )
    .expect("write config");
    t.apply_rules(&path, "start");
    let rules = t.gw.ip(&["-4", "rule", "show"]);
    assert!(!rules.contains("lookup 100"), "{rules}");
    assert!(rules.contains("fwmark 0x7 lookup 77"), "{rules}");
    // The emptied table is gone: `ip` says so and prints no route.
    let old_table = Command::new("ip")
        .args(["-n", &t.gw.name, "-6", "route", "show", "table", "100"])
        .output()
        .expect("ip");
    assert!(old_table.stdout.is_empty());

    t.apply_rules(&path, "stop");
    t.apply_rules(&path, "stop");
    assert!(!t.gw.ip(&["-4", "rule", "show"]).contains("fwmark"));
    assert!(!t.gw.ip(&["-6", "rule", "show"]).contains("fwmark"));
    assert!(!t.gw.exec("nft", &["list", "tables"], None).contains("pepd"));
    // Removed, the self-check names it all again (with the first config's mark and table).
    assert_eq!(t.gw.run(checks()), bare);
}

/// The CLI prints what the library generates, and a bad config changes nothing.
#[test]
fn nft_rules_cli() {
    let dir = std::env::temp_dir().join(format!("pepdr-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("pepd.toml");
    std::fs::write(&path, config("closed")).expect("write");
    let cfg = PepdConfig::load(&path).expect("config");
    let p = path.to_str().expect("utf-8");
    assert_eq!(
        run(pepd_bin(), &["nft-rules", "-c", p]),
        pepd::control::rules::nft_ruleset(&cfg)
    );
    assert_eq!(
        run(pepd_bin(), &["nft-rules", "-c", p, "--routes"]),
        pepd::control::rules::routes_script(&cfg)
    );
    // Each QUIC policy: the CLI prints the ruleset the unit tests pin, with its verdict.
    for (quic, verdict) in [
        ("pass", None),
        (
            "reject",
            Some("\t\tcounter reject with icmpx type port-unreachable\n"),
        ),
        ("drop", Some("\t\tcounter drop\n")),
    ] {
        std::fs::write(&path, quic_config(quic)).expect("write");
        let cfg = PepdConfig::load(&path).expect("config");
        let printed = run(pepd_bin(), &["nft-rules", "-c", p]);
        assert_eq!(printed, pepd::control::rules::nft_ruleset(&cfg), "{quic}");
        match verdict {
            Some(v) => assert!(
                printed.contains(v)
                    && printed.contains(
                        "\t\tiifname \"lan0\" udp dport 443 ct direction original jump quic\n"
                    ),
                "{quic}: {printed}"
            ),
            None => assert!(!printed.contains("udp"), "{printed}"),
        }
    }
    std::fs::write(&path, config("ajar")).expect("write");
    let out = Command::new(pepd_bin())
        .args(["nft-rules", "-c", p])
        .output()
        .expect("run pepd");
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "pepd: {p} line 7: `rules.fail`: unknown value `ajar`, expected `open` or `closed`\n"
        )
    );
}

/// A gateway config refusing QUIC as `quic` says, with an exception, and the peer's tunnel
/// on UDP 443.
fn quic_config(quic: &str) -> String {
    format!(
        "[intercept]
listen = [\"0.0.0.0:{TPROXY_PORT}\", \"[::]:{TPROXY_PORT}\"]
[rules]
interfaces = [\"lan0\"]
ports = [{SELECTED}, {QUIC_PORT}]
bypass_subnets = [\"{BYPASSED_V4}/32\"]
quic = \"{quic}\"
quic_exceptions = [\"{EXCEPTION_V4}/32\"]
[peer]
address = \"{PEER_V4}:{QUIC_PORT}\"
bind = \"0.0.0.0:{TUNNEL_PORT}\"
side = \"terminal\"
[link]
tx_rate = \"2M\"
rx_rate = \"10M\"
"
    )
}

/// A UDP socket bound to `addr` in the calling thread's namespace, reads timing out.
fn udp(addr: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    s
}

/// What became of one datagram a connected UDP socket sent.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The peer's reply came back.
    Reply,
    /// The socket got ECONNREFUSED: an ICMP port unreachable came back.
    Refused,
    /// Nothing within the read timeout.
    Silence,
}

/// Sends one datagram from a socket in `from` connected to `to`, and reads one answer;
/// with how long the answer took.
fn exchange_udp(from: &Netns, to: SocketAddr) -> (Answer, Duration) {
    from.run(move || {
        let local: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let s = udp(local);
        s.connect(to).expect("connect");
        let started = Instant::now();
        s.send(b"quic?").expect("send");
        let mut buf = [0u8; 64];
        let answer = match s.recv(&mut buf) {
            Ok(n) => {
                assert_eq!(&buf[..n], b"reply");
                Answer::Reply
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Answer::Refused,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Answer::Silence
            }
            Err(e) => panic!("recv from {to}: {e}"),
        };
        (answer, started.elapsed())
    })
}

/// Sockets in `ns` on `addrs` that answer every datagram with "reply" until dropped, and
/// count what they were sent.
struct Echo {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    seen: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>,
}

impl Echo {
    fn start(ns: &Netns, addrs: &[SocketAddr], mark: Option<u32>) -> Echo {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for &addr in addrs {
            let sock = ns.run(move || {
                let s = udp(addr);
                if let Some(m) = mark {
                    socket2::SockRef::from(&s).set_mark(m).expect("SO_MARK");
                }
                s.set_read_timeout(Some(Duration::from_millis(20)))
                    .expect("timeout");
                s
            });
            let (stop, seen) = (stop.clone(), seen.clone());
            threads.push(thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = sock.recv_from(&mut buf) {
                        seen.lock().expect("seen").push((addr, from));
                        let _ = sock.send_to(b"reply", from);
                    }
                }
            }));
        }
        Echo {
            stop,
            threads,
            seen,
        }
    }

    /// The datagrams `addr` was sent, by sender.
    fn seen_at(&self, addr: SocketAddr) -> Vec<SocketAddr> {
        let seen = self.seen.lock().expect("seen");
        seen.iter()
            .filter(|(a, _)| *a == addr)
            .map(|(_, f)| *f)
            .collect()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The rules unit's reload, once per policy: the clients' QUIC is refused at once with
/// `reject`, vanishes with `drop`, and is forwarded with `pass`; what the policy must not
/// touch passes under every one of them.
#[test]
fn quic_policy_refuses_the_clients_quic_and_nothing_else() {
    if !pep_testbed::require_root() {
        return;
    }
    let t = topology("quic");
    let path = t.dir.join("pepd-quic.toml");
    let server = Echo::start(
        &t.server,
        &[
            sa(SERVER_V4, QUIC_PORT),
            sa(SERVER_V6, QUIC_PORT),
            sa(SERVER_V4, 8443),
            sa(BYPASSED_V4, QUIC_PORT),
            sa(EXCEPTION_V4, QUIC_PORT),
            sa(PEER_V4, QUIC_PORT),
        ],
        None,
    );
    // On the gateway: a service on its own address, and its tunnel socket (pepd's mark).
    let gateway_own = Echo::start(&t.gw, &[sa("198.18.50.1", QUIC_PORT)], None);
    let tunnel_socket = sa("198.18.51.1", TUNNEL_PORT);
    // And a client's own UDP 443, which the server side sends to.
    let client_own = Echo::start(&t.client, &[sa(CLIENT_V4, QUIC_PORT)], None);

    for quic in ["reject", "drop", "pass", "reject"] {
        std::fs::write(&path, quic_config(quic)).expect("write config");
        t.apply_rules(&path, "start");
        let cfg = PepdConfig::load(&path).expect("config");
        // The self-check finds the policy the config names in the table the unit loaded.
        let warnings =
            t.gw.run(move || pepd::control::selfcheck::startup_checks(&cfg));
        assert_eq!(warnings, Vec::<String>::new(), "{quic}");

        for to in [sa(SERVER_V4, QUIC_PORT), sa(SERVER_V6, QUIC_PORT)] {
            let before = server.seen_at(to).len();
            let (answer, took) = exchange_udp(&t.client, to);
            let forwarded = server.seen_at(to).len() - before;
            match quic {
                "reject" => {
                    assert_eq!(answer, Answer::Refused, "{quic} {to}");
                    // The ICMP error crosses one veth hop: far below any QUIC timeout.
                    assert!(took < Duration::from_millis(250), "{to}: {took:?}");
                    eprintln!("quic = \"reject\": {to} refused after {took:?}");
                    assert_eq!(forwarded, 0);
                }
                "drop" => {
                    assert_eq!(answer, Answer::Silence, "{quic} {to}");
                    assert_eq!(forwarded, 0);
                }
                _ => {
                    assert_eq!(answer, Answer::Reply, "{quic} {to}");
                    assert_eq!(forwarded, 1);
                }
            }
        }
        // Untouched under every policy: another port, a bypassed subnet, an exception, the
        // peer's tunnel endpoint and this gateway's own address.
        for to in [
            sa(SERVER_V4, 8443),
            sa(BYPASSED_V4, QUIC_PORT),
            sa(EXCEPTION_V4, QUIC_PORT),
            sa(PEER_V4, QUIC_PORT),
            sa("198.18.50.1", QUIC_PORT),
        ] {
            assert_eq!(exchange_udp(&t.client, to).0, Answer::Reply, "{quic} {to}");
        }
        // The tunnel's own datagrams: from the gateway's marked socket to the peer's 443
        // and back.
        let tunnel = t.gw.run(move || {
            let s = udp(tunnel_socket);
            socket2::SockRef::from(&s)
                .set_mark(OWN_MARK)
                .expect("SO_MARK");
            s.send_to(b"tunnel", sa(PEER_V4, QUIC_PORT)).expect("send");
            let mut buf = [0u8; 64];
            s.recv_from(&mut buf)
                .map(|(n, from)| (buf[..n].to_vec(), from))
        });
        let (reply, from) = tunnel.expect("the tunnel's datagram was answered");
        assert_eq!(
            (reply.as_slice(), from),
            (&b"reply"[..], sa(PEER_V4, QUIC_PORT))
        );
        // UDP 443 from the server side to a client is not the clients' QUIC.
        let back = t.server.run(|| {
            let s = udp("0.0.0.0:0".parse().expect("addr"));
            s.send_to(b"quic?", sa(CLIENT_V4, QUIC_PORT)).expect("send");
            let mut buf = [0u8; 64];
            s.recv(&mut buf).map(|n| buf[..n].to_vec())
        });
        assert_eq!(back.expect("the client answered"), b"reply", "{quic}");
    }
    assert!(!gateway_own.seen_at(sa("198.18.50.1", QUIC_PORT)).is_empty());
    assert!(!client_own.seen_at(sa(CLIENT_V4, QUIC_PORT)).is_empty());
    // The counter on the refusing rule saw the refused datagrams (2 of the last round).
    let listed =
        t.gw.exec("nft", &["list", "chain", "inet", "pepd", "quic"], None);
    assert!(listed.contains("counter packets 2 "), "{listed}");
    t.apply_rules(&path, "stop");
}
