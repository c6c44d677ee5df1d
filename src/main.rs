//! The `pepd` command line: run the gateway, check a config, or print the interception
//! rules for it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter};

use pepd::config::PepdConfig;
use pepd::{daemon, rules};

#[derive(Parser)]
#[command(
    name = "pepd",
    version,
    about = "Performance-enhancing proxy for satellite links"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Run {
        /// Configuration file (TOML).
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a configuration file and print the effective settings.
    CheckConfig {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Print the nftables ruleset that sends the TCP selected by `[rules]` to pepd, for
    /// `nft -f -`; with `--routes`, the policy-routing commands as a shell script.
    NftRules {
        #[arg(short, long)]
        config: PathBuf,
        /// Print the `ip rule`/`ip route` script instead of the nftables ruleset.
        #[arg(long)]
        routes: bool,
        /// Print what removes the rules (or, with `--routes`, the policy routing) instead.
        #[arg(long)]
        remove: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => check_config(&config),
        Command::NftRules {
            config,
            routes,
            remove,
        } => nft_rules(&config, routes, remove),
        Command::Run { config } => match run(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pepd: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match PepdConfig::load(path) {
        Ok(cfg) => {
            println!("{}: ok", path.display());
            println!("{}", cfg.summary());
            for w in cfg.warnings() {
                println!("warning: {w}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pepd: {e}");
            ExitCode::from(2)
        }
    }
}

fn nft_rules(path: &std::path::Path, routes: bool, remove: bool) -> ExitCode {
    let cfg = match PepdConfig::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("pepd: {e}");
            return ExitCode::from(2);
        }
    };
    let text = match (routes, remove) {
        (false, false) => rules::nft_ruleset(&cfg),
        (false, true) => rules::nft_teardown(),
        (true, false) => rules::routes_script(&cfg),
        (true, true) => rules::routes_teardown_script(&cfg),
    };
    print!("{text}");
    ExitCode::SUCCESS
}

fn run(path: &std::path::Path) -> anyhow::Result<()> {
    // Nothing starts on a bad config.
    let cfg = PepdConfig::load(path)?;
    // RUST_LOG wins over the config at start; SIGHUP applies the config's level.
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, filter_handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    let log_reload: daemon::LogReload = Box::new(move |level: &str| {
        let f = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        filter_handle.reload(f).map_err(|e| e.to_string())
    });
    for w in cfg.warnings() {
        tracing::warn!("config: {w}");
    }
    // The usual reasons SYNs never reach pepd, said at start rather than found later.
    for w in pepd::selfcheck::startup_checks(&cfg) {
        tracing::warn!("self-check: {w}");
    }
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(
        daemon::Daemon {
            path: path.to_owned(),
            cfg,
            log_reload,
        }
        .run(),
    )
}

/// Every proxied connection holds a descriptor; the soft limit (1024 by default) is raised
/// to the hard limit, as systemd recommends for daemons that need many.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_err() {
            tracing::warn!(soft, hard, "could not raise the open-file limit");
        }
    }
}
