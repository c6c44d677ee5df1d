//! `pep-linkemu`: emulates a satellite link between two TUN devices, each usually in its own
//! network namespace. Prints JSON stats on SIGUSR1 and on exit (SIGINT/SIGTERM).

use anyhow::Context;
use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use pep_linkemu::cli::LinkArgs;
use pep_linkemu::{Emulator, Endpoint, LinkConfig};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Namespace of side A (default: the current one).
    #[arg(long)]
    a_netns: Option<String>,
    /// TUN device of side A (attached if it exists, created otherwise).
    #[arg(long, default_value = "tun0")]
    a_dev: String,
    #[arg(long)]
    b_netns: Option<String>,
    #[arg(long, default_value = "tun0")]
    b_dev: String,
    /// Link settings: each sets both directions; `--return-*` overrides B→A.
    #[command(flatten)]
    link: LinkArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let cfg = cli.link.apply(LinkConfig::default())?;
    // Block the signals before any thread exists so they all inherit the mask and only the
    // main thread's sigwait sees them.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGUSR1, Signal::SIGINT, Signal::SIGTERM] {
        signals.add(s);
    }
    signals.thread_block().context("blocking signals")?;
    let a = Endpoint {
        netns: cli.a_netns,
        dev: cli.a_dev,
    };
    let b = Endpoint {
        netns: cli.b_netns,
        dev: cli.b_dev,
    };
    let emu = Emulator::start(&cfg, &a, &b).context("starting the emulator")?;
    eprintln!("pep-linkemu: running ({a:?} <-> {b:?}); SIGUSR1 prints stats");
    loop {
        let sig = signals.wait().context("waiting for signals")?;
        if sig == Signal::SIGUSR1 {
            println!("{}", serde_json::to_string(&emu.stats())?);
        } else {
            println!("{}", serde_json::to_string(&emu.stop())?);
            return Ok(());
        }
    }
}
