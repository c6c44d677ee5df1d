//! The `pepd` command line: run the gateway, ask a running one for its status and flows,
//! check a config, print the interception rules for it, or make and inspect the tunnel's
//! keys.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter};

use pepd::config::keys;
use pepd::config::PepdConfig;
use pepd::control::client::{Query, Trouble};
use pepd::control::protocol::Ask;
use pepd::control::screen::SortKey;
use pepd::control::{rules, run as daemon};

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
    /// Show the running daemon's peers, carrier and gateway (asked through its control
    /// socket): one screen for one peer, a table for many.
    Status {
        #[command(flatten)]
        target: Target,
        /// Only this peer (its one-screen view).
        #[arg(long, value_name = "NAME")]
        peer: Option<String>,
        /// The column a table of peers is sorted by.
        #[arg(long, value_enum, default_value_t = SortKey::Name, value_name = "FIELD")]
        sort: SortKey,
        /// Print the daemon's answer as JSON (one line) instead.
        #[arg(long)]
        json: bool,
        /// Ask again every SECONDS (default 1) until interrupted.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1")]
        watch: Option<f64>,
    },
    /// List the flows open in the running daemon: addresses, age, bytes, state.
    Flows {
        #[command(flatten)]
        target: Target,
        /// Only this peer's flows.
        #[arg(long, value_name = "NAME")]
        peer: Option<String>,
        /// Print the daemon's answer as JSON (one line) instead.
        #[arg(long)]
        json: bool,
        /// Ask again every SECONDS (default 1) until interrupted.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1")]
        watch: Option<f64>,
    },
    /// Ask the running daemon whether it serves (`GET /healthz` on its metrics endpoint):
    /// every tunnel worker answers and it is not draining. Prints one line; exit status 0
    /// when it serves, 1 otherwise (no answer included). For health checks such as
    /// keepalived's `vrrp_script`.
    Health {
        /// The daemon's configuration file (its `[metrics] listen`).
        #[arg(short, long, conflicts_with = "at")]
        config: Option<PathBuf>,
        /// The metrics endpoint's address (default 127.0.0.1:9464, or the config's).
        #[arg(long, value_name = "ADDRESS")]
        at: Option<std::net::SocketAddr>,
    },
    /// Show the routes in the `[announce]` tables, or with `--flush` empty them: for a
    /// service manager to withdraw a stopped hub's announcements however it ended
    /// (`ExecStopPost`, deploy/pepd-announce.conf).
    Announce {
        #[arg(short, long)]
        config: PathBuf,
        /// Empty the tables instead.
        #[arg(long)]
        flush: bool,
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
    /// Write a new private key to FILE (mode 0600; an existing file is never overwritten)
    /// and print its public key, for the other gateway's `security.peer_public_key`.
    Genkey {
        /// Where to write the key, e.g. /etc/pepd/private.key.
        file: PathBuf,
    },
    /// Print the public key of the private key in FILE (standard input without FILE or
    /// with "-").
    Pubkey { file: Option<PathBuf> },
    /// Write a new random pre-shared key to FILE (mode 0600) for `security.psk_file`; copy
    /// it to the other gateway over a secure channel.
    Genpsk { file: PathBuf },
}

/// Which daemon `status` and `flows` ask: the socket given, else the one of the config
/// given, else the one of /etc/pepd/pepd.toml.
#[derive(clap::Args)]
struct Target {
    /// The daemon's configuration file (its `[control] socket`, or the default for its
    /// name).
    #[arg(short, long, conflicts_with = "socket")]
    config: Option<PathBuf>,
    /// The daemon's control socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

impl Target {
    fn socket(self) -> anyhow::Result<PathBuf> {
        match (self.socket, self.config) {
            (Some(socket), _) => Ok(socket),
            (None, Some(config)) => Ok(PepdConfig::load(&config)?.control_socket()),
            (None, None) => Ok(pepd::config::control::default_socket(Path::new(
                pepd::config::control::DEFAULT_CONFIG,
            ))),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Status {
            target,
            peer,
            sort,
            json,
            watch,
        } => query(target, Ask::Status, peer, sort, json, watch),
        Command::Flows {
            target,
            peer,
            json,
            watch,
        } => query(target, Ask::Flows, peer, SortKey::Name, json, watch),
        Command::Health { config, at } => health(config.as_deref(), at),
        Command::Announce { config, flush } => report(announce(&config, flush)),
        Command::CheckConfig { config } => check_config(&config),
        Command::NftRules {
            config,
            routes,
            remove,
        } => nft_rules(&config, routes, remove),
        Command::Run { config } => report(run(&config)),
        Command::Genkey { file } => report(genkey(&file)),
        Command::Pubkey { file } => report(pubkey(file.as_deref())),
        Command::Genpsk { file } => report(genpsk(&file)),
    }
}

fn query(
    target: Target,
    ask: Ask,
    peer: Option<String>,
    sort: SortKey,
    json: bool,
    watch: Option<f64>,
) -> ExitCode {
    let socket = match target.socket() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pepd: {e:#}");
            return ExitCode::from(2);
        }
    };
    let watch = match watch.map(std::time::Duration::try_from_secs_f64) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(_)) => {
            eprintln!("pepd: --watch takes a number of seconds, e.g. 0.1");
            return ExitCode::from(2);
        }
    };
    let q = Query {
        socket,
        ask,
        peer,
        sort,
        json,
        watch,
    };
    match q.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(t) => {
            eprintln!("pepd: {t}");
            ExitCode::from(Trouble::exit_code(&t))
        }
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pepd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn health(config: Option<&Path>, at: Option<std::net::SocketAddr>) -> ExitCode {
    use pepd::control::health;
    let listen = match (at, config) {
        (Some(at), _) => at,
        (None, Some(path)) => match PepdConfig::load(path) {
            Ok(cfg) => cfg.metrics.listen,
            Err(e) => {
                println!("not serving: {e:#}");
                return ExitCode::FAILURE;
            }
        },
        (None, None) => (
            std::net::Ipv4Addr::LOCALHOST,
            pepd::config::DEFAULT_METRICS_PORT,
        )
            .into(),
    };
    match health::ask(health::local_target(listen), health::ASK_TIMEOUT) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(line) => {
            println!("{line}");
            ExitCode::FAILURE
        }
    }
}

fn announce(path: &Path, flush: bool) -> anyhow::Result<()> {
    use pepd::sys::route_table;
    let cfg = PepdConfig::load(path)?;
    let Some(a) = cfg.announce else {
        println!(
            "{}: no [announce]: no tables to show or empty",
            path.display()
        );
        return Ok(());
    };
    if flush {
        pepd::control::announce::flush(&a)?;
        let tables: Vec<String> = a.tables().iter().map(u32::to_string).collect();
        println!("emptied announcement table {}", tables.join(" and "));
        return Ok(());
    }
    for table in a.tables() {
        let nets = route_table::read(table)
            .with_context(|| format!("reading announcement table {table}"))?;
        for net in nets {
            println!("table {table}: {net}");
        }
    }
    Ok(())
}

fn genkey(file: &Path) -> anyhow::Result<()> {
    let private = keys::write_private_key(file)?;
    let public = pep_transport::security::public_key(&private);
    // Only the key on stdout, so `pepd genkey FILE > FILE.pub` works; the rest is for
    // the person at the terminal.
    println!("{}", keys::encode_key(&public));
    eprintln!(
        "pepd: wrote a private key to {} (mode 0600); the line above is its public key, for \
         `security.peer_public_key` on the other gateway",
        file.display()
    );
    Ok(())
}

fn pubkey(file: Option<&Path>) -> anyhow::Result<()> {
    let private = match file {
        Some(path) if path != Path::new("-") => keys::read_key_file(path)?,
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .take(4096)
                .read_to_string(&mut text)
                .context("cannot read a private key from standard input")?;
            keys::decode_key(&text)
                .map_err(|why| anyhow::anyhow!("standard input {why}; expected a private key"))?
        }
    };
    let public = pep_transport::security::public_key(&private);
    println!("{}", keys::encode_key(&public));
    Ok(())
}

fn genpsk(file: &Path) -> anyhow::Result<()> {
    keys::write_psk(file)?;
    eprintln!(
        "pepd: wrote a pre-shared key to {} (mode 0600); copy it to the other gateway over a \
         secure channel and set `security.psk_file` on both",
        file.display()
    );
    Ok(())
}

fn check_config(path: &std::path::Path) -> ExitCode {
    // The key files are loaded too: a config is only good if pepd could start on it.
    let loaded = PepdConfig::load(path).and_then(|cfg| {
        let security = cfg.load_security()?;
        Ok((cfg, security))
    });
    match loaded {
        Ok((cfg, security)) => {
            println!("{}: ok", path.display());
            println!("{}", cfg.summary());
            if let Some(key) = security.local_public_key() {
                println!("public key: {key} (this gateway's, for the peer's config)");
            }
            for w in cfg.warnings().iter().chain(&security.warnings) {
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
        (false, true) => rules::nft_teardown(&cfg),
        (true, false) => rules::routes_script(&cfg),
        (true, true) => rules::routes_teardown_script(&cfg),
    };
    print!("{text}");
    ExitCode::SUCCESS
}

fn run(path: &std::path::Path) -> anyhow::Result<()> {
    // Nothing starts on a bad config.
    let cfg = PepdConfig::load(path)?;
    // Keys are read here as well as where the tunnel is set up, so that a bad key file
    // stops pepd before it takes any connection, and its warnings are logged once.
    let security = cfg.load_security()?;
    // A config this version cannot serve whole stops here, before anything is logged.
    cfg.check_servable()?;
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
    let log_reload: pepd::control::reload::LogReload = Box::new(move |level: &str| {
        let f = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        filter_handle.reload(f).map_err(|e| e.to_string())
    });
    for w in cfg.warnings().iter().chain(&security.warnings) {
        tracing::warn!("config: {w}");
    }
    // The usual reasons SYNs never reach pepd, said at start rather than found later.
    for w in pepd::control::selfcheck::startup_checks(&cfg) {
        tracing::warn!("self-check: {w}");
    }
    let cfg = serve_within_fd_limit(cfg);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(
        daemon::Daemon {
            path: path.to_owned(),
            cfg,
            security,
            log_reload,
        }
        .run(),
    )
}

/// Raises the open-file limit to what `max_flows` needs; with a hard limit too low for
/// it, serves the flows the limit allows and says so.
fn serve_within_fd_limit(mut cfg: PepdConfig) -> PepdConfig {
    match pepd::control::fdlimit::raise(&cfg) {
        Ok(r) if r.flows < cfg.limits.max_flows as u64 => {
            tracing::warn!(
                "the open-file limit (hard {}) serves {} flows, not `limits.max_flows` \
                 ({}): running with {}; raise LimitNOFILE= in the unit (or the hard \
                 RLIMIT_NOFILE) to {}",
                r.hard,
                r.flows,
                cfg.limits.max_flows,
                r.flows,
                pepd::control::fdlimit::needed(cfg.limits.max_flows as u64, cfg.limits.over_limit)
            );
            cfg.limits.max_flows = usize::try_from(r.flows).unwrap_or(1).max(1);
        }
        Ok(r) => tracing::debug!(soft = r.limit, hard = r.hard, "open-file limit"),
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
    cfg
}
