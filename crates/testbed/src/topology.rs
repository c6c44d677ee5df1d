//! The four-namespace topology `client — gw-a ═[linkemu]═ gw-b — server`, or with
//! [`LinkKind::Veth`] `client — gw-a ═[veth]═ gw-b — server`. Everything lives in
//! namespaces created here (nothing touches the root namespace), named per process and
//! instance so parallel runs never collide, and removed again on drop — also when a test
//! panics — together with every process inside them.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};

use pep_linkemu::{Emulator, Endpoint, LinkConfig, LinkStats};

use crate::addr::*;
use crate::cmd::{ip_in, nft_in, run, sysctl_in};
use crate::Error;

/// Every namespace this tool creates starts with this.
pub const PREFIX: &str = "peptb-";

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// Namespace names of one testbed instance: `peptb-PID-N-ROLE`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Names {
    pub client: String,
    pub gw_a: String,
    pub gw_b: String,
    pub server: String,
}

/// `peptb-PID-N`, unique to this process and instance: the start of every name an
/// instance gives its namespaces, so [`down`] can find what a dead process left.
pub fn fresh_base() -> String {
    let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}{}-{n}", std::process::id())
}

impl Names {
    fn fresh() -> Names {
        let base = fresh_base();
        Names {
            client: format!("{base}-cl"),
            gw_a: format!("{base}-ga"),
            gw_b: format!("{base}-gb"),
            server: format!("{base}-sv"),
        }
    }

    pub fn all(&self) -> [&str; 4] {
        [&self.client, &self.gw_a, &self.gw_b, &self.server]
    }

    /// `peptb-PID-N`: the part the four names share, for naming the instance's other
    /// resources (e.g. its temporary directory).
    pub fn base(&self) -> &str {
        self.client.strip_suffix("-cl").unwrap_or(&self.client)
    }
}

/// `ip netns exec NS program`, to be completed with arguments, environment and stdio. The
/// child execs `program` directly (no extra process), so its pid is the program's.
pub fn command_in(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Table that blackholes the satellite hop (see [`Topology::set_link_down`]).
const OUTAGE_TABLE: &str = "peptb_outage";

/// Interface names inside the namespaces (namespace-local, so they can be fixed).
pub const LAN_DEV: &str = "lan0";
pub const HOST_DEV: &str = "eth0";
pub const SAT_DEV: &str = "sat0";

/// What joins the two gateways' `sat0` interfaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// A TUN device on each gateway with pep-linkemu between them: rate, delay, queue and
    /// impairments as the link config says.
    #[default]
    Emulated,
    /// A veth pair straight from one gateway to the other: no emulator, whose own CPU
    /// would otherwise hide the gateways' (rate, delay and impairments are not applied;
    /// the link config still tells pepd what it is provisioned for).
    Veth,
}

/// Endpoint settings for the plain (end-to-end TCP) modes.
#[derive(Clone, Debug)]
pub struct HostTuning {
    /// Congestion control of client and server.
    pub congestion_control: String,
}

pub struct Topology {
    pub names: Names,
    created: Vec<String>,
    emulator: Option<Emulator>,
    children: Vec<Child>,
}

/// Creates TUN device `dev` in `ns` for the emulator to attach to, and brings it up.
pub fn add_tun(ns: &str, dev: &str) -> Result<(), Error> {
    ip_in(ns, &["tuntap", "add", "dev", dev, "mode", "tun"])?;
    // A long device queue so bursts wait for the emulator instead of being dropped
    // before it: the emulated queue is the only one that should drop.
    ip_in(ns, &["link", "set", dev, "txqueuelen", "10000", "up"]).map(drop)
}

/// Raises the ceiling of TCP buffer autotuning in namespace `ns`. Autotuning stays on;
/// only its ceiling is raised so a window can cover the bandwidth-delay product of a
/// 100 Mb/s, 500 ms path (6.25 MB), as any LFN host would be configured.
pub fn raise_tcp_buffers(ns: &str) -> Result<(), Error> {
    sysctl_in(
        ns,
        &[
            "net.ipv4.tcp_rmem=4096 131072 67108864",
            "net.ipv4.tcp_wmem=4096 16384 67108864",
        ],
    )
}

/// The TCP settings of an end host (client or server) in namespace `host`.
pub fn tune_host(host: &str, hosts: &HostTuning) -> Result<(), Error> {
    raise_tcp_buffers(host)?;
    // A child namespace may only default to algorithms the host lists in
    // tcp_allowed_congestion_control, so when the host does not allow it the
    // traffic tool's per-socket TCP_CONGESTION (root may pick any) still applies.
    let cc = format!(
        "net.ipv4.tcp_congestion_control={}",
        hosts.congestion_control
    );
    let _ = sysctl_in(host, &[&cc]);
    Ok(())
}

impl Topology {
    /// Builds the namespaces, links, addresses and routes and starts the emulator between the
    /// gateways. The link's forward direction is gw-b → gw-a (towards the client).
    pub fn up(link: &LinkConfig, hosts: &HostTuning) -> Result<Topology, Error> {
        Topology::up_over(LinkKind::Emulated, link, hosts)
    }

    /// [`Topology::up`] with the gateways joined by `kind`: over a veth pair nothing of
    /// `link` applies and no emulator runs.
    pub fn up_over(
        kind: LinkKind,
        link: &LinkConfig,
        hosts: &HostTuning,
    ) -> Result<Topology, Error> {
        let mut t = Topology {
            names: Names::fresh(),
            created: Vec::new(),
            emulator: None,
            children: Vec::new(),
        };
        // On error `t` drops here and removes whatever was already built.
        t.build(kind, hosts)?;
        if kind == LinkKind::Veth {
            return Ok(t);
        }
        t.start_emulator(link)?;
        Ok(t)
    }

    fn build(&mut self, kind: LinkKind, hosts: &HostTuning) -> Result<(), Error> {
        let n = self.names.clone();
        for ns in n.all() {
            run("ip", &["netns", "add", ns])?;
            self.created.push(ns.to_owned());
            ip_in(ns, &["link", "set", "lo", "up"])?;
        }
        if kind == LinkKind::Veth {
            ip_in(
                &n.gw_a,
                &[
                    "link", "add", SAT_DEV, "type", "veth", "peer", "name", SAT_DEV, "netns",
                    &n.gw_b,
                ],
            )?;
        }
        for (host, gw) in [(&n.client, &n.gw_a), (&n.server, &n.gw_b)] {
            ip_in(
                host,
                &[
                    "link", "add", HOST_DEV, "type", "veth", "peer", "name", LAN_DEV, "netns", gw,
                ],
            )?;
            ip_in(host, &["link", "set", HOST_DEV, "up"])?;
            ip_in(gw, &["link", "set", LAN_DEV, "up"])?;
            match kind {
                LinkKind::Emulated => add_tun(gw, SAT_DEV)?,
                LinkKind::Veth => ip_in(gw, &["link", "set", SAT_DEV, "up"]).map(drop)?,
            }
            // As deploy/99-pepd.conf sets them on a gateway: the listeners' accept queue
            // must hold a burst of `limits.max_flows` connections, and upstream connects may
            // reuse ports in TIME_WAIT (tests/uptime.rs makes 32,000 to one server in 100 s).
            sysctl_in(
                gw,
                &[
                    "net.ipv4.ip_forward=1",
                    "net.ipv6.conf.all.forwarding=1",
                    "net.core.somaxconn=16384",
                    "net.ipv4.tcp_tw_reuse=1",
                ],
            )?;
            tune_host(host, hosts)?;
        }
        let addr = |ns: &str, dev: &str, a: String| -> Result<(), Error> {
            ip_in(ns, &["addr", "add", &a, "dev", dev, "nodad"]).map(drop)
        };
        addr(&n.client, HOST_DEV, format!("{CLIENT_V4}/24"))?;
        addr(&n.client, HOST_DEV, format!("{CLIENT_V6}/64"))?;
        addr(&n.gw_a, LAN_DEV, format!("{GW_A_LAN_V4}/24"))?;
        addr(&n.gw_a, LAN_DEV, format!("{GW_A_LAN_V6}/64"))?;
        addr(&n.gw_a, SAT_DEV, format!("{GW_A_SAT_V4}/24"))?;
        addr(&n.gw_a, SAT_DEV, format!("{GW_A_SAT_V6}/64"))?;
        addr(&n.gw_b, SAT_DEV, format!("{GW_B_SAT_V4}/24"))?;
        addr(&n.gw_b, SAT_DEV, format!("{GW_B_SAT_V6}/64"))?;
        addr(&n.gw_b, LAN_DEV, format!("{GW_B_LAN_V4}/24"))?;
        addr(&n.gw_b, LAN_DEV, format!("{GW_B_LAN_V6}/64"))?;
        addr(&n.server, HOST_DEV, format!("{SERVER_V4}/24"))?;
        addr(&n.server, HOST_DEV, format!("{SERVER_V6}/64"))?;
        let route = |ns: &str, args: &[&str]| ip_in(ns, args).map(drop);
        route(
            &n.client,
            &["route", "add", "default", "via", &GW_A_LAN_V4.to_string()],
        )?;
        route(
            &n.client,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &GW_A_LAN_V6.to_string(),
            ],
        )?;
        route(
            &n.server,
            &["route", "add", "default", "via", &GW_B_LAN_V4.to_string()],
        )?;
        route(
            &n.server,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &GW_B_LAN_V6.to_string(),
            ],
        )?;
        // TUN is point-to-point, so a route through it needs no next hop; a veth is
        // Ethernet, where the far subnet is reached through the peer gateway's address.
        let far_subnets = [
            (
                &n.gw_a,
                "198.18.3.0/24",
                "fd00:198:18:3::/64",
                GW_B_SAT_V4,
                GW_B_SAT_V6,
            ),
            (
                &n.gw_b,
                "198.18.1.0/24",
                "fd00:198:18:1::/64",
                GW_A_SAT_V4,
                GW_A_SAT_V6,
            ),
        ];
        for (gw, v4, v6, peer_v4, peer_v6) in far_subnets {
            for (family, subnet, peer) in [
                ("-4", v4, peer_v4.to_string()),
                ("-6", v6, peer_v6.to_string()),
            ] {
                let mut args = vec![family, "route", "add", subnet];
                if kind == LinkKind::Veth {
                    args.extend(["via", &peer]);
                }
                args.extend(["dev", SAT_DEV]);
                route(gw, &args)?;
            }
        }
        Ok(())
    }

    pub fn emulator(&self) -> Option<&Emulator> {
        self.emulator.as_ref()
    }

    /// Time since the emulator started (its schedules and outages count from there).
    pub fn emulator_elapsed(&self) -> std::time::Duration {
        self.emulator
            .as_ref()
            .map_or(std::time::Duration::ZERO, |e| e.start_time().elapsed())
    }

    /// The emulator's forward and return timelines so far.
    pub fn emulator_timelines(&self) -> Option<[pep_sim::timeline::Timeline; 2]> {
        self.emulator.as_ref().map(Emulator::timelines)
    }

    /// Stops the emulator and returns its final counters.
    pub fn stop_emulator(&mut self) -> Option<LinkStats> {
        self.emulator.take().map(Emulator::stop)
    }

    /// Stops the emulator and starts another with `link` on the same TUN devices.
    pub fn restart_emulator(&mut self, link: &LinkConfig) -> Result<(), Error> {
        self.stop_emulator();
        self.start_emulator(link)
    }

    /// The emulator between the gateways' TUN devices: gw-b's side is its A end, so the
    /// link's forward direction carries the download.
    fn start_emulator(&mut self, link: &LinkConfig) -> Result<(), Error> {
        let ep = |ns: &str| Endpoint {
            netns: Some(ns.to_owned()),
            dev: SAT_DEV.to_owned(),
        };
        self.emulator = Some(Emulator::start(
            link,
            &ep(&self.names.gw_b),
            &ep(&self.names.gw_a),
        )?);
        Ok(())
    }

    /// Starts `program args…` inside namespace `ns`; it is killed on teardown. For daemons
    /// such as pepd on the gateways.
    pub fn spawn_in(&mut self, ns: &str, program: &str, args: &[&str]) -> Result<(), Error> {
        self.spawn_in_env(ns, program, args, &[])
    }

    /// [`Topology::spawn_in`] with extra environment variables.
    pub fn spawn_in_env(
        &mut self,
        ns: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(), Error> {
        let child = command_in(ns, program)
            .args(args)
            .envs(env.iter().copied())
            .spawn()
            .map_err(|source| Error::Spawn {
                cmd: format!("{program} {}", args.join(" ")),
                source,
            })?;
        self.children.push(child);
        Ok(())
    }

    /// Takes the satellite hop down (nothing passes either way) or brings it back, at once
    /// and for as long as the caller likes, unlike the emulator's outage windows, which are
    /// fixed when it starts. Each gateway drops whatever arrives on its satellite interface
    /// before anything else sees it, so senders get no error: as on a real link, packets
    /// simply vanish.
    pub fn set_link_down(&self, down: bool) -> Result<(), Error> {
        for ns in [&self.names.gw_a, &self.names.gw_b] {
            // Declaring the table first makes both directions idempotent (this nft has no
            // `destroy`, and `delete` of a missing table fails).
            let mut rules =
                format!("table inet {OUTAGE_TABLE} {{}}\ndelete table inet {OUTAGE_TABLE}\n");
            if down {
                rules.push_str(&format!(
                    "table inet {OUTAGE_TABLE} {{\n\
                     \tchain prerouting {{\n\
                     \t\ttype filter hook prerouting priority raw - 10; policy accept;\n\
                     \t\tiifname \"{SAT_DEV}\" drop\n\
                     \t}}\n\
                     }}\n"
                ));
            }
            nft_in(ns, &rules)?;
        }
        Ok(())
    }

    fn teardown(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Stop the emulator before its TUN devices go away.
        drop(self.emulator.take());
        for ns in self.created.drain(..) {
            remove_namespace(&ns);
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Kills every process whose network namespace is `ns` (except this one) and deletes it.
pub fn remove_namespace(ns: &str) {
    if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
        let me = std::process::id().to_string();
        for pid in pids.split_whitespace().filter(|p| *p != me) {
            if let Ok(p) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = run("ip", &["netns", "del", ns]);
}

/// Whether the process that created testbed resource `name` (`peptb-PID-…`) still runs.
fn owner_alive(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes testbed namespaces left behind (e.g. by a killed process), and the pepd
/// temporary directories with them: those whose creating process is gone, or all of them
/// with `all`. Returns the names removed.
pub fn down(all: bool) -> Result<Vec<String>, Error> {
    let list = run("ip", &["netns", "list"])?;
    let mut removed = Vec::new();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if name.starts_with(PREFIX) && (all || !owner_alive(name)) {
            remove_namespace(name);
            removed.push(name.to_owned());
        }
    }
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PREFIX)
            && name.ends_with("-pepd")
            && (all || !owner_alive(&name))
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            removed.push(tmp.join(&name).display().to_string());
        }
    }
    Ok(removed)
}

/// Namespaces of this tool that currently exist.
pub fn existing() -> Result<Vec<String>, Error> {
    Ok(run("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_owned)
        .collect())
}
