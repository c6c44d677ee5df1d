//! Command-line link settings shared by `pep-linkemu` and `pep-testbed`: each option sets both
//! directions, and its `--return-` form overrides the return direction (B to A).

use std::time::Duration;

use pep_sim::channel::{GilbertElliott, Outage, PeriodicOutage};
use pep_sim::jitter::JitterKind;
use pep_sim::schedule::{BerSchedule, DelaySchedule, RateSchedule};

use crate::config::{DirectionConfig, LinkConfig};

#[derive(Clone, Debug, Default, clap::Args)]
pub struct LinkArgs {
    /// Serialisation rate in bit/s (0: unlimited).
    #[arg(long)]
    pub rate_bps: Option<f64>,
    /// --rate-bps for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_rate_bps: Option<f64>,
    /// One-way delay in milliseconds.
    #[arg(long)]
    pub delay_ms: Option<f64>,
    /// --delay-ms for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_delay_ms: Option<f64>,
    /// Each packet's one-way delay varies within ±this many ms of --delay-ms; how it varies
    /// is --jitter-kind.
    #[arg(long)]
    pub jitter_ms: Option<f64>,
    /// --jitter-ms for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_jitter_ms: Option<f64>,
    /// How the delay varies within ±--jitter-ms: `uniform` (each packet on its own; in
    /// order, the delay stays near the top of the bound and packets leave in bunches),
    /// `wander` (a smooth curve over seconds, as a LEO path changes) or `slotted` (packets
    /// leave at slot boundaries 2 × --jitter-ms apart, as on an MF-TDMA return link)
    /// [default: uniform].
    #[arg(long)]
    pub jitter_kind: Option<JitterKind>,
    /// --jitter-kind for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_jitter_kind: Option<JitterKind>,
    /// Let jitter reorder packets (the uniform kind); otherwise a packet never overtakes
    /// the one before it.
    #[arg(long)]
    pub reorder: bool,
    /// Drop-tail queue limit in bytes.
    #[arg(long)]
    pub queue_bytes: Option<usize>,
    /// --queue-bytes for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_queue_bytes: Option<usize>,
    /// Bit error rate, applied per packet by its length.
    #[arg(long)]
    pub ber: Option<f64>,
    /// --ber for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_ber: Option<f64>,
    /// Independent packet loss probability.
    #[arg(long)]
    pub loss: Option<f64>,
    /// --loss for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_loss: Option<f64>,
    /// Gilbert-Elliott bursts: p,r[,h[,k]].
    #[arg(long)]
    pub ge: Option<GilbertElliott>,
    /// --ge for the return direction only (B → A; gw-a → gw-b in the testbed).
    #[arg(long)]
    pub return_ge: Option<GilbertElliott>,
    /// Outage window START_S+DURATION_S (both directions; repeatable).
    #[arg(long)]
    pub outage: Vec<Outage>,
    /// Periodic outage PERIOD_S+DURATION_S, first one at PERIOD_S.
    #[arg(long)]
    pub outage_every: Option<PeriodicOutage>,
    /// Forward rate over time, SECONDS:BITS[,…] from the emulator's start (ACM steps),
    /// e.g. 0:20M,30:10M,60:5M,90:20M; --rate-bps before the first step. Forward only.
    #[arg(long)]
    pub rate_schedule: Option<RateSchedule>,
    /// --rate-schedule for the return direction only.
    #[arg(long)]
    pub return_rate_schedule: Option<RateSchedule>,
    /// One-way delay over time, SECONDS:MS[,…] (LEO path changes), both directions.
    #[arg(long)]
    pub delay_schedule: Option<DelaySchedule>,
    /// Bit error rate over time, SECONDS:BER[,…], both directions.
    #[arg(long)]
    pub ber_schedule: Option<BerSchedule>,
    /// --ber-schedule for the return direction only.
    #[arg(long)]
    pub return_ber_schedule: Option<BerSchedule>,
    /// Bytes the link layer adds to each packet (encapsulation), both directions.
    #[arg(long)]
    pub frame_overhead: Option<usize>,
    /// Seed of the impairment generators.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Read and write the emulator's TUN devices packet by packet, without UDP segmentation
    /// offload (the sending kernel cuts every UDP GSO burst first), as before the offload.
    #[arg(long)]
    pub per_packet_emulation: bool,
}

fn ms(v: f64) -> Result<Duration, crate::Error> {
    Duration::try_from_secs_f64(v / 1000.0)
        .map_err(|_| crate::Error::Config(format!("{v} ms is not a valid duration")))
}

impl LinkArgs {
    /// `base` with these options applied on top.
    pub fn apply(&self, mut base: LinkConfig) -> Result<LinkConfig, crate::Error> {
        let set = |d: &mut DirectionConfig, both: bool| -> Result<(), crate::Error> {
            let pick = |all: Option<f64>, ret: Option<f64>| if both { all } else { ret.or(all) };
            if let Some(v) = pick(self.rate_bps, self.return_rate_bps) {
                d.rate_bps = v;
            }
            if let Some(v) = pick(self.delay_ms, self.return_delay_ms) {
                d.delay = ms(v)?;
            }
            if let Some(v) = pick(self.jitter_ms, self.return_jitter_ms) {
                d.jitter.bound = ms(v)?;
            }
            let kind = if both {
                self.jitter_kind
            } else {
                self.return_jitter_kind.or(self.jitter_kind)
            };
            if let Some(k) = kind {
                d.jitter.kind = k;
            }
            if let Some(v) = pick(self.ber, self.return_ber) {
                d.impairments.ber = v;
            }
            if let Some(v) = pick(self.loss, self.return_loss) {
                d.impairments.loss = v;
            }
            let q = if both {
                self.queue_bytes
            } else {
                self.return_queue_bytes.or(self.queue_bytes)
            };
            if let Some(v) = q {
                d.queue_bytes = v;
            }
            let ge = if both {
                self.ge
            } else {
                self.return_ge.or(self.ge)
            };
            if ge.is_some() {
                d.impairments.burst = ge;
            }
            if self.reorder {
                d.jitter.reorder = true;
            }
            if let Some(f) = self.frame_overhead {
                d.frame_overhead = f;
            }
            let rate = if both {
                self.rate_schedule.as_ref()
            } else {
                self.return_rate_schedule.as_ref()
            };
            if let Some(s) = rate {
                d.rate_schedule = s.0.clone();
            }
            if let Some(s) = &self.delay_schedule {
                d.delay_schedule = s.0.clone();
            }
            let ber = if both {
                self.ber_schedule.as_ref()
            } else {
                self.return_ber_schedule
                    .as_ref()
                    .or(self.ber_schedule.as_ref())
            };
            if let Some(s) = ber {
                d.impairments.ber_schedule = s.0.clone();
            }
            d.impairments
                .outages
                .windows
                .extend(self.outage.iter().copied());
            if self.outage_every.is_some() {
                d.impairments.outages.periodic = self.outage_every;
            }
            Ok(())
        };
        set(&mut base.forward, true)?;
        set(&mut base.ret, false)?;
        if let Some(s) = self.seed {
            base.seed = s;
        }
        base.per_packet |= self.per_packet_emulation;
        base.forward.validate()?;
        base.ret.validate()?;
        Ok(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        link: LinkArgs,
    }

    #[test]
    fn plain_options_set_both_directions_return_ones_override() {
        let t = T::parse_from([
            "t",
            "--rate-bps",
            "20e6",
            "--return-rate-bps",
            "2e6",
            "--ber",
            "1e-6",
            "--delay-ms",
            "300",
            "--outage",
            "1+2",
        ]);
        let c = t.link.apply(LinkConfig::default()).unwrap();
        assert_eq!(c.forward.rate_bps, 20e6);
        assert_eq!(c.ret.rate_bps, 2e6);
        assert_eq!(c.ret.impairments.ber, 1e-6);
        assert_eq!(c.ret.delay, Duration::from_millis(300));
        assert_eq!(c.forward.impairments.outages.windows.len(), 1);
        assert_eq!(c.ret.impairments.outages.windows.len(), 1);
    }

    #[test]
    fn jitter_kind_and_bound_per_direction() {
        let t = T::parse_from([
            "t",
            "--jitter-ms",
            "20",
            "--jitter-kind",
            "wander",
            "--return-jitter-kind",
            "slotted",
        ]);
        let c = t.link.apply(LinkConfig::default()).unwrap();
        assert_eq!(c.forward.jitter.kind, JitterKind::Wander);
        assert_eq!(c.ret.jitter.kind, JitterKind::Slotted);
        assert_eq!(c.ret.jitter.bound, Duration::from_millis(20));
        assert!(!c.ret.jitter.reorder);
        // Without a kind, the bound keeps its uniform meaning.
        let t = T::parse_from(["t", "--jitter-ms", "5", "--reorder"]);
        let c = t.link.apply(LinkConfig::default()).unwrap();
        assert_eq!(c.forward.jitter.kind, JitterKind::Uniform);
        assert!(c.forward.jitter.reorder);
    }
}
