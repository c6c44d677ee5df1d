//! `pep-testbed browser`: headless chromium loads a page of 30 objects (3 MB) from caddy
//! across the emulated link, a first and a repeat visit per run, without pepd and through
//! pepd with `quic = "pass"` or `"reject"`. One JSON line per run on stdout as it ends;
//! with several runs or modes a summary line last (median and spread per mode and visit,
//! the protocol mix). Needs caddy, chromium and certutil (scripts/install-browser.sh).
//!
//! ```text
//! pep-testbed browser --mode plain --mode pass --mode reject --runs 5
//! pep-testbed browser --mode reject --keep      # keeps page, profile, NetLogs and logs
//! ```

use anyhow::{bail, Context};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::browser::{self, BrowserSpec, Mode};
use pep_testbed::Profile;

use crate::{secs, PepdArgs};

#[derive(Clone, Debug, clap::Args)]
pub struct BrowserArgs {
    #[arg(long, value_enum, default_value_t = Profile::Geo)]
    profile: Profile,
    #[command(flatten)]
    link: LinkArgs,
    /// The modes to run (repeatable); runs go round the modes in turn, so that every mode
    /// meets the same conditions of the machine.
    #[arg(long = "mode", value_enum, default_values_t = [Mode::Plain, Mode::Pass, Mode::Reject])]
    modes: Vec<Mode>,
    /// Runs per mode.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,
    /// A visit still loading after this many seconds fails the run.
    #[arg(long, default_value_t = 120.0)]
    visit_timeout_s: f64,
    /// Keep each run's directory (page, certificates, browser profile, NetLogs, logs).
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    pepd: PepdArgs,
}

pub fn run(args: &BrowserArgs) -> anyhow::Result<()> {
    for tool in ["caddy", "chromium", "certutil", "openssl"] {
        if pep_testbed::cmd::run("sh", &["-c", &format!("command -v {tool}")]).is_err() {
            bail!("{tool} is missing: run scripts/install-browser.sh as root");
        }
    }
    let link = args.link.apply(args.profile.link())?;
    let mut results = Vec::new();
    for _ in 0..args.runs {
        for &mode in &args.modes {
            let spec = BrowserSpec {
                profile: args.profile.to_string(),
                link: link.clone(),
                mode,
                pepd: args.pepd.options()?,
                visit_timeout: secs(args.visit_timeout_s)?,
                keep: args.keep,
            };
            let r = browser::run(&spec)
                .with_context(|| format!("browser run, mode {}", mode.as_str()))?;
            println!("{}", serde_json::to_string(&r)?);
            results.push(r);
        }
    }
    if results.len() > 1 {
        let s = browser::summarize_runs(&args.profile.to_string(), &results);
        println!("{}", serde_json::to_string(&s)?);
    }
    Ok(())
}
