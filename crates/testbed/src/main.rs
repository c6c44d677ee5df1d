//! `pep-testbed`: build the satellite testbed, move verified traffic through it, run scenarios.

mod browser_cmd;
mod demo;
mod failover_cmd;
mod hub_cmd;
mod soak;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::pepd::{Gateways, Interception, PepdOptions, TunnelSecurity};
use pep_testbed::runner::{self, Mode, RunSpec};
use pep_testbed::split::SplitOptions;
use pep_testbed::topology::{self, HostTuning, LinkKind, Topology};
use pep_testbed::xfer::{client, server::Server, WorkloadArgs};
use pep_testbed::Profile;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// How pepd is run in pepd mode.
#[derive(Clone, Debug, Default, clap::Args)]
struct PepdArgs {
    /// The pepd executable (default: $PEPD_BIN, else `pepd` beside this program).
    #[arg(long = "pepd", value_name = "PATH")]
    binary: Option<std::path::PathBuf>,
    /// TOML merged over both gateways' generated configs, e.g.
    /// '[upstream] transparent_source = true' (repeatable).
    #[arg(long = "pepd-toml", value_name = "TOML")]
    toml: Vec<String>,
    /// Load the rules `pepd nft-rules` prints for the config instead of the testbed's own.
    #[arg(long)]
    pepd_own_rules: bool,
    /// TOML merged over the hub's (gw-b) config only, after --pepd-toml (repeatable).
    #[arg(long = "pepd-hub-toml", value_name = "TOML")]
    hub_toml: Vec<String>,
    /// TOML merged over the terminal's (gw-a) config only, after --pepd-toml (repeatable).
    #[arg(long = "pepd-terminal-toml", value_name = "TOML")]
    terminal_toml: Vec<String>,
    /// The forward rate pepd is provisioned for (the hub's tx_rate and the terminal's
    /// rx_rate, e.g. "20Mbit"), when it differs from the emulated link's: a link in a rain
    /// fade below what the gateways were set up for.
    #[arg(long, value_name = "RATE")]
    pepd_forward_rate: Option<String>,
    /// The tunnel's security: "noise" (keys generated per run) or "none"
    /// (`security.mode = "none"`). Default: noise, or what $PEPTB_SECURITY says.
    #[arg(long, value_name = "MODE")]
    pepd_security: Option<String>,
}

impl PepdArgs {
    fn options(&self) -> anyhow::Result<PepdOptions> {
        Ok(PepdOptions {
            binary: self.binary.clone(),
            // A table header and a key on one line is handy on the command line but not
            // TOML: split them.
            extra_toml: joined(&self.toml)?,
            hub_toml: joined(
                &self
                    .hub_toml
                    .iter()
                    .cloned()
                    .chain(
                        self.pepd_forward_rate
                            .iter()
                            .map(|r| format!("[link] tx_rate = {r:?}")),
                    )
                    .collect::<Vec<_>>(),
            )?,
            terminal_toml: joined(
                &self
                    .terminal_toml
                    .iter()
                    .cloned()
                    .chain(
                        self.pepd_forward_rate
                            .iter()
                            .map(|r| format!("[link] rx_rate = {r:?}")),
                    )
                    .collect::<Vec<_>>(),
            )?,
            interception: if self.pepd_own_rules {
                Interception::Pepd
            } else {
                Interception::Testbed
            },
            security: match &self.pepd_security {
                Some(s) => TunnelSecurity::parse(s)?,
                None => TunnelSecurity::default(),
            },
            ..Default::default()
        })
    }
}

/// Command-line TOML snippets as one document.
fn joined(snippets: &[String]) -> anyhow::Result<String> {
    let texts: Vec<String> = snippets.iter().map(|t| one_line_table(t)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    Ok(pep_testbed::pepd::merge_toml(&refs)?)
}

/// `[a] k = v` → `[a]\nk = v`.
fn one_line_table(t: &str) -> String {
    let t = t.trim();
    match t.strip_prefix('[').and_then(|r| r.split_once(']')) {
        Some((table, rest)) if !rest.trim().is_empty() && !table.contains('[') => {
            format!("[{table}]\n{}", rest.trim())
        }
        _ => t.to_owned(),
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the topology and keep it (and the emulator) up until SIGINT/SIGTERM.
    Up {
        #[arg(long, value_enum)]
        profile: Profile,
        #[command(flatten)]
        link: LinkArgs,
        /// What joins the gateways: the emulator, or a bare veth pair (no rate, delay or
        /// impairments; the link options then only provision pepd).
        #[arg(long = "link", value_enum, default_value_t = LinkKind::Emulated)]
        link_kind: LinkKind,
        /// Congestion control of client and server.
        #[arg(long, default_value = "cubic")]
        cc: String,
        /// Also run pepd on both gateways (TPROXY interception), as `run --mode pepd` does.
        #[arg(long)]
        with_pepd: bool,
        #[command(flatten)]
        pepd: PepdArgs,
    },
    /// Remove testbed namespaces whose creator is gone (all of them with --all).
    Down {
        #[arg(long)]
        all: bool,
    },
    /// The traffic tool (run it inside the namespaces with `ip netns exec`).
    Xfer {
        #[command(subcommand)]
        side: XferSide,
    },
    /// Run one scenario and print one JSON object.
    Run {
        #[arg(long, value_enum)]
        profile: Profile,
        #[command(flatten)]
        link: LinkArgs,
        /// What joins the gateways: the emulator, or a bare veth pair (no rate, delay or
        /// impairments; the link options then only provision pepd and set the reference).
        #[arg(long = "link", value_enum, default_value_t = LinkKind::Emulated)]
        link_kind: LinkKind,
        #[arg(long, value_enum)]
        mode: Mode,
        #[command(flatten)]
        workload: WorkloadArgs,
        /// Cut the run after this many seconds (reported as `capped`).
        #[arg(long, default_value_t = 300.0)]
        max_seconds: f64,
        /// Seed of the traffic pattern.
        #[arg(long, default_value_t = 1)]
        traffic_seed: u64,
        /// Use IPv6 end to end.
        #[arg(long)]
        ipv6: bool,
        /// One compact JSON line (default: pretty-printed).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pepd: PepdArgs,
        /// In split-tcp mode: the congestion control of the relays' sockets (cubic, bbr, …).
        #[arg(long, default_value = "cubic")]
        split_cc: String,
        /// Beside the workload, an unresponsive UDP stream from the server to the client at
        /// this rate (bit/s of IP bytes), not through pepd.
        #[arg(long)]
        cross_udp_bps: Option<f64>,
        /// Beside the workload, a plain CUBIC download for this many seconds on a port pepd
        /// does not intercept.
        #[arg(long)]
        cross_tcp_seconds: Option<f64>,
        /// Include the forward link's timeline (100 ms buckets: queueing delay, bytes
        /// delivered) in the result.
        #[arg(long)]
        timeline: bool,
        /// Seconds to wait after the gateways are up before the workload starts.
        #[arg(long, default_value_t = 0.0)]
        settle_s: f64,
    },
    /// Plain TCP against pepd on an emulated GEO link: downloads and a page load, timed
    /// side by side (table on stdout, demo.json and demo.svg in --out).
    Demo(demo::DemoArgs),
    /// Mixed traffic through the pepd pair for a set time, the gateways' resident size,
    /// descriptors, flows and accounted memory sampled into soak.csv and soak.svg in
    /// --out; fails unless every transfer was byte-exact, the flow counters equal the
    /// connections made and the descriptors are back to their count before.
    Soak(soak::SoakArgs),
    /// One hub gateway and --terminals N terminal gateways on a shared emulated forward
    /// carrier, each terminal with its own return link and client network, pepd on every
    /// gateway; per-terminal downloads, uploads and paced requests, reported as one JSON
    /// object (goodput, byte-exactness, request latency percentiles, Jain's index of
    /// goodput per weight, the busiest 5 s against each MIR).
    Hub(hub_cmd::HubArgs),
    /// Terminals probing a server through pepd while a hub fails (--scenario): per
    /// terminal the seconds until a new request is answered again, the flows reset or left
    /// hanging, and whether every answer was exact, as one JSON object.
    Failover(failover_cmd::FailoverArgs),
    /// The kernel split-TCP relay `run --mode split-tcp` starts on each gateway (TPROXY
    /// interception, one kernel TCP connection per flow across the link, splice(2)):
    /// `split-relay run -c FILE`.
    SplitRelay {
        #[command(subcommand)]
        cmd: SplitRelayCmd,
    },
    /// Headless chromium loads a page of 30 objects (3 MB) from caddy (HTTP/1.1, 2 and 3)
    /// across the emulated link, a first and a repeat visit, without pepd and through pepd
    /// with `quic = "pass"` or `"reject"`: load times and each object's protocol as JSON.
    Browser(browser_cmd::BrowserArgs),
    /// A stand-in for pepd that relays intercepted TCP over the routed path (tests the
    /// testbed's interception plumbing): `fake-pepd run -c FILE`.
    #[command(hide = true)]
    FakePepd {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum SplitRelayCmd {
    /// Serve until killed.
    Run {
        /// The relay's TOML config (written by the runner).
        #[arg(short = 'c', long = "config")]
        config: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum XferSide {
    Server {
        #[arg(long, default_value = "[::]:5001")]
        listen: SocketAddr,
        #[arg(long)]
        cc: Option<String>,
    },
    Client {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        cc: Option<String>,
        #[command(flatten)]
        workload: WorkloadArgs,
        #[arg(long, default_value_t = 300.0)]
        max_seconds: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn secs(v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("{v} is not a valid duration"))
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Up {
            profile,
            link,
            link_kind,
            cc,
            with_pepd,
            pepd,
        } => {
            let cfg = link.apply(profile.link())?;
            let mut signals = SigSet::empty();
            signals.add(Signal::SIGINT);
            signals.add(Signal::SIGTERM);
            signals.thread_block()?;
            let mut topo = Topology::up_over(
                link_kind,
                &cfg,
                &HostTuning {
                    congestion_control: cc,
                },
            )?;
            let gateways = if with_pepd {
                Some(Gateways::start(&topo.names, &cfg, &pepd.options()?)?)
            } else {
                None
            };
            println!("{}", serde_json::to_string(&topo.names)?);
            if let Some(g) = &gateways {
                eprintln!(
                    "pep-testbed: pepd up on both gateways; configs and logs in {}",
                    g.dir().display()
                );
            }
            eprintln!("pep-testbed: up; SIGINT or SIGTERM tears it down");
            signals.wait()?;
            drop(gateways);
            if let Some(stats) = topo.stop_emulator() {
                println!("{}", serde_json::to_string(&stats)?);
            }
        }
        Cmd::Down { all } => {
            for ns in topology::down(all)? {
                println!("removed {ns}");
            }
        }
        Cmd::Xfer { side } => match side {
            XferSide::Server { listen, cc } => {
                let s = Server::bind(listen, cc.as_deref())
                    .with_context(|| format!("listening on {listen}"))?;
                eprintln!("pep-testbed xfer: serving on {}", s.local_addr());
                s.wait();
            }
            XferSide::Client {
                connect,
                cc,
                workload,
                max_seconds,
                seed,
            } => {
                pep_testbed::corpus::get(workload.content)?;
                let opts = client::ClientOpts {
                    server: connect,
                    cc,
                    seed: workload.content.seed(seed),
                    max_duration: secs(max_seconds)?,
                };
                let out = client::run(&workload.workload(), &opts);
                println!("{}", serde_json::to_string(&out)?);
                if out.intact == Some(false) || out.error.is_some() {
                    anyhow::bail!("transfer failed or corrupted");
                }
            }
        },
        Cmd::Run {
            profile,
            link,
            link_kind,
            mode,
            workload,
            max_seconds,
            traffic_seed,
            ipv6,
            json,
            pepd,
            split_cc,
            cross_udp_bps,
            cross_tcp_seconds,
            timeline,
            settle_s,
        } => {
            let spec = RunSpec {
                profile,
                link: link.apply(profile.link())?,
                link_kind,
                mode,
                workload: workload.workload(),
                max_duration: secs(max_seconds)?,
                seed: traffic_seed,
                ipv6,
                pepd: pepd.options()?,
                split: SplitOptions {
                    binary: None,
                    congestion_control: split_cc,
                },
                cross: pep_testbed::cross::CrossSpec {
                    udp_bps: cross_udp_bps,
                    tcp_seconds: cross_tcp_seconds,
                },
                timeline,
                settle: secs(settle_s)?,
                content: workload.content,
            };
            let r = runner::run(&spec)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&r)?);
            }
        }
        Cmd::Demo(args) => demo::run(&args)?,
        Cmd::Soak(args) => soak::run(&args)?,
        Cmd::Hub(args) => hub_cmd::run(&args)?,
        Cmd::Failover(args) => failover_cmd::run(&args)?,
        Cmd::Browser(args) => browser_cmd::run(&args)?,
        Cmd::SplitRelay {
            cmd: SplitRelayCmd::Run { config },
        } => pep_testbed::split::relay::main(&config)?,
        Cmd::FakePepd { args } => pep_testbed::fakepepd::main(&args)?,
    }
    Ok(())
}
