//! `pep-testbed`: build the satellite testbed, move verified traffic through it, run scenarios.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::runner::{self, Mode, RunSpec};
use pep_testbed::topology::{self, HostTuning, Topology};
use pep_testbed::xfer::{client, server::Server, WorkloadArgs};
use pep_testbed::Profile;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the topology and keep it (and the emulator) up until SIGINT/SIGTERM.
    Up {
        #[arg(long, value_enum)]
        profile: Profile,
        #[command(flatten)]
        link: LinkArgs,
        /// Congestion control of client and server.
        #[arg(long, default_value = "cubic")]
        cc: String,
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
        Cmd::Up { profile, link, cc } => {
            let cfg = link.apply(profile.link())?;
            let mut signals = SigSet::empty();
            signals.add(Signal::SIGINT);
            signals.add(Signal::SIGTERM);
            signals.thread_block()?;
            let mut topo = Topology::up(
                &cfg,
                &HostTuning {
                    congestion_control: cc,
                },
            )?;
            println!("{}", serde_json::to_string(&topo.names)?);
            eprintln!("pep-testbed: up; SIGINT or SIGTERM tears it down");
            signals.wait()?;
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
                let opts = client::ClientOpts {
                    server: connect,
                    cc,
                    seed,
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
            mode,
            workload,
            max_seconds,
            traffic_seed,
            ipv6,
            json,
        } => {
            let spec = RunSpec {
                profile,
                link: link.apply(profile.link())?,
                mode,
                workload: workload.workload(),
                max_duration: secs(max_seconds)?,
                seed: traffic_seed,
                ipv6,
            };
            let r = runner::run(&spec)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&r)?);
            }
        }
    }
    Ok(())
}
