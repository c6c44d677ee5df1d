//! `pep-testbed hub`: one hub gateway, `--terminals N` terminal gateways on a shared
//! emulated forward carrier (the profile's forward direction) with a return link each (its
//! return direction), pepd everywhere, and traffic from the terminals' clients chosen per
//! terminal; one JSON object of per-terminal and overall figures.
//!
//! ```text
//! pep-testbed hub --terminals 8 --profile geo --mir-bps 8e6 --download 1 --requests 2 --seconds 30
//! pep-testbed hub --terminals 8 --weights 1,1,1,1,2,2,2,2 --download all --seconds 30
//! ```

use std::time::Duration;

use anyhow::{bail, Context};
use pep_linkemu::cli::LinkArgs;
use pep_testbed::hub::{
    self, Activities, HubLinks, HubSpec, TerminalRates, TerminalSet, TrafficSpec, Windows,
};
use pep_testbed::xfer::Amount;
use pep_testbed::Profile;

use crate::{secs, PepdArgs};

#[derive(Clone, Debug, clap::Args)]
pub struct HubArgs {
    /// Terminal gateways behind the hub.
    #[arg(long, default_value_t = 8)]
    terminals: usize,
    /// The carrier is the profile's forward direction, each return link its return.
    #[arg(long, value_enum, default_value_t = Profile::Geo)]
    profile: Profile,
    #[command(flatten)]
    link: LinkArgs,
    /// Each terminal's MIR in bit/s (its [[peer]] tx_rate at the hub); default the carrier.
    #[arg(long)]
    mir_bps: Option<f64>,
    /// Each terminal's CIR in bit/s (min_rate); default none.
    #[arg(long, default_value_t = 0.0)]
    cir_bps: f64,
    /// Weights by terminal, comma-separated; terminals past the list's end take its last
    /// (default 1 for all).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<u32>,
    /// Terminals whose client runs a bulk download: all, none, or e.g. 1,3-8.
    #[arg(long, default_value = "all")]
    download: TerminalSet,
    /// Terminals whose client runs a bulk upload.
    #[arg(long, default_value = "none")]
    upload: TerminalSet,
    /// Terminals whose client sends a request every --interval-ms for as long as any bulk
    /// transfer runs (or --seconds when none does).
    #[arg(long, default_value = "none")]
    requests: TerminalSet,
    /// Size of each bulk transfer.
    #[arg(long, conflicts_with = "seconds")]
    bytes: Option<u64>,
    /// How long each bulk sender writes (default 30 s). Through pepd a download goes on
    /// until what the hub took in has arrived, so --bytes bounds a run better.
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, default_value_t = 1000)]
    request_bytes: usize,
    #[arg(long, default_value_t = 1000)]
    response_bytes: usize,
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    /// Steady goodput leaves out each download's first this many seconds.
    #[arg(long, default_value_t = 3.0)]
    warmup_s: f64,
    /// The window whose busiest instance is held against the MIR.
    #[arg(long, default_value_t = 5.0)]
    mir_window_s: f64,
    /// Cut every transfer after this many seconds (reported as `capped`).
    #[arg(long, default_value_t = 300.0)]
    max_seconds: f64,
    /// Seconds to wait after every association is up before the traffic starts.
    #[arg(long, default_value_t = 0.0)]
    settle_s: f64,
    /// One compact JSON line (default: pretty-printed).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pepd: PepdArgs,
}

impl HubArgs {
    fn spec(&self) -> anyhow::Result<HubSpec> {
        let link = self.link.apply(self.profile.link())?;
        let links = HubLinks::from_pair(&link, self.terminals);
        let carrier = links.carrier.rate_bps;
        let rates = (0..self.terminals)
            .map(|k| TerminalRates {
                mir_bps: self.mir_bps.unwrap_or(carrier),
                cir_bps: self.cir_bps,
                weight: self
                    .weights
                    .get(k)
                    .or(self.weights.last())
                    .copied()
                    .unwrap_or(1),
            })
            .collect();
        let activities = (1..=self.terminals)
            .map(|i| Activities {
                download: self.download.contains(i),
                upload: self.upload.contains(i),
                requests: self.requests.contains(i),
            })
            .collect();
        let amount = match (self.bytes, self.seconds) {
            (Some(b), _) => Amount::Bytes(b),
            (None, s) => Amount::Seconds(s.unwrap_or(30.0)),
        };
        let bin = Duration::from_millis(100);
        if self.mir_window_s < bin.as_secs_f64() {
            bail!("--mir-window-s must cover at least one 100 ms sample");
        }
        Ok(HubSpec {
            links,
            rates,
            traffic: TrafficSpec {
                activities,
                amount,
                request: (self.request_bytes, self.response_bytes),
                request_every: Duration::from_millis(self.interval_ms),
                bin,
                max_duration: secs(self.max_seconds)?,
            },
            pepd: self.pepd.options()?,
            windows: Windows {
                bin,
                warmup: secs(self.warmup_s)?,
                mir_window: secs(self.mir_window_s)?,
            },
            settle: secs(self.settle_s)?,
        })
    }
}

pub fn run(args: &HubArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    let r = hub::run(&spec).context("hub run")?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&r)?);
    }
    if !r.summary.all_exact {
        bail!("a transfer failed or was not byte-exact");
    }
    Ok(())
}
