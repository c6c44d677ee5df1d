//! `pep-testbed failover`: every terminal's client probes a server behind the hub through
//! pepd (a new connection every --interval-ms, one request and response each) while the
//! scenario makes a hub fail; one JSON object per run with each terminal's recovery time,
//! the flows reset or left hanging, and whether every answer was exact.
//!
//! ```text
//! pep-testbed failover --scenario restart --terminals 8 --profile geo --control
//! pep-testbed failover --scenario standby-pepd --advert-int 0.5
//! pep-testbed failover --scenario standby-hub
//! pep-testbed failover --scenario handover
//! pep-testbed failover --scenario active-set --hubs 3 --terminals 12 --hub-tx-share 0.3333
//! ```

use std::time::Duration;

use anyhow::{bail, Context};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::failover::active::ActiveSet;
use pep_testbed::failover::{self, FailoverSpec, Scenario};
use pep_testbed::hub::HubLinks;
use pep_testbed::Profile;

use crate::{secs, PepdArgs};

#[derive(Clone, Debug, clap::Args)]
pub struct FailoverArgs {
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Terminal gateways, each with a client that probes.
    #[arg(long, default_value_t = 8)]
    terminals: usize,
    /// The carrier is the profile's forward direction, each return link its return.
    #[arg(long, value_enum, default_value_t = Profile::Geo)]
    profile: Profile,
    #[command(flatten)]
    link: LinkArgs,
    /// Seconds of probing before the failure.
    #[arg(long, default_value_t = 20.0)]
    fail_at_s: f64,
    /// Seconds of probing after the failure.
    #[arg(long, default_value_t = 25.0)]
    after_s: f64,
    /// restart, standby-pepd: seconds between the kill and pepd's new start (systemd's
    /// RestartSec).
    #[arg(long, default_value_t = 2.0)]
    restart_after_s: f64,
    /// standby-*: keepalived's advertisement interval in seconds (VRRPv3).
    #[arg(long, default_value_t = 0.5)]
    advert_int: f64,
    /// active-set: hubs serving at once.
    #[arg(long, default_value_t = 3)]
    hubs: usize,
    /// active-set: each hub's link.tx_rate as a part of the carrier's rate (default 1/hubs:
    /// never more than the carrier while every hub is up).
    #[arg(long)]
    hub_tx_share: Option<f64>,
    /// A new probe connection this often, per terminal.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    #[arg(long, default_value_t = 1000)]
    request_bytes: usize,
    #[arg(long, default_value_t = 1000)]
    response_bytes: usize,
    /// Run the same topology and probes without the failure first, and report each
    /// terminal's request p99 around the failure beside the control run's.
    #[arg(long)]
    control: bool,
    /// One compact JSON line (default: pretty-printed).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pepd: PepdArgs,
}

impl FailoverArgs {
    fn spec(&self) -> anyhow::Result<FailoverSpec> {
        let link = self.link.apply(self.profile.link())?;
        if self.interval_ms == 0 {
            bail!("--interval-ms must be at least 1");
        }
        Ok(FailoverSpec {
            scenario: self.scenario,
            profile: self.profile.to_string(),
            links: HubLinks::from_pair(&link, self.terminals),
            pepd: self.pepd.options()?,
            fail_at: secs(self.fail_at_s)?,
            after: secs(self.after_s)?,
            restart_after: secs(self.restart_after_s)?,
            advert_int: secs(self.advert_int)?,
            every: Duration::from_millis(self.interval_ms),
            sizes: (self.request_bytes, self.response_bytes),
            control: self.control,
            active_set: ActiveSet {
                hubs: self.hubs,
                hub_tx_share: self.hub_tx_share.unwrap_or(1.0 / self.hubs.max(1) as f64),
            },
        })
    }
}

pub fn run(args: &FailoverArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    let r = failover::run(&spec).context("failover run")?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&r)?);
    }
    if !r.summary.all_exact {
        bail!("a response was not byte-exact");
    }
    Ok(())
}
