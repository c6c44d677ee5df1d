//! SIGHUP: re-read the config, apply what can change live, and say what needs a restart.

mod changes;

use std::path::Path;

use tracing::{info, warn};

use crate::config::{Peers, PepdConfig};
use crate::daemon::{Live, LiveRef, LogReload};
use crate::gateway::Gateway;
use crate::link::{PeerLink, ShareRates};
use changes::{LiveSetting, Setting};

/// Applies `path` to the running daemon; on a bad file the running config stays.
pub fn apply(
    path: &Path,
    running: &mut PepdConfig,
    gateway: &Gateway,
    live: &LiveRef,
    log: &LogReload,
) {
    let new = match PepdConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            warn!("reload failed, keeping the running configuration: {e}");
            return;
        }
    };
    let mut changed: Vec<&str> = Vec::new();
    let mut needs_restart: Vec<&str> = Vec::new();
    for setting in changes::changed_settings(running, &new) {
        match setting {
            Setting::Live(s) => {
                if apply_live(s, &new, running, gateway, log) {
                    changed.push(s.label());
                }
            }
            Setting::Restart(s) => needs_restart.push(s.label()),
            // Applied by pepd-rules.service, not by pepd; see `Setting::RulesUnit`.
            Setting::RulesUnit => {}
        }
    }
    {
        let mut l = live.write().unwrap_or_else(|p| p.into_inner());
        let draining = l.draining;
        *l = Live::from_config(running);
        l.draining = draining;
    }

    if changed.is_empty() && needs_restart.is_empty() {
        info!(path = %path.display(), "configuration reloaded: nothing changed");
    } else {
        info!(path = %path.display(), ?changed, ?needs_restart, "configuration reloaded");
    }
    if !needs_restart.is_empty() {
        warn!(
            ?needs_restart,
            "these settings take effect only after a restart"
        );
    }
}

/// Applies one changed setting and records it in `running`; false if it could not be
/// applied, so the running value stays and the next reload tries again.
fn apply_live(
    setting: LiveSetting,
    new: &PepdConfig,
    running: &mut PepdConfig,
    gateway: &Gateway,
    log: &LogReload,
) -> bool {
    match setting {
        LiveSetting::LogLevel => match log(&new.log.level) {
            Ok(()) => running.log = new.log.clone(),
            Err(e) => {
                warn!(level = %new.log.level, "log level not applied: {e}");
                return false;
            }
        },
        LiveSetting::TxRate => {
            // Each peer's own `tx_rate` caps it; the `[peer]` table's is `link.tx_rate`.
            let specs = new.peer_specs();
            for (i, link) in gateway.links.iter().enumerate() {
                let rate = specs.get(i).map_or(new.link.tx_rate.bps(), |p| p.tx_bps);
                link.set_tx_rate(rate);
            }
            // With `[[peer]]` entries the driver shares the new carrier from its next
            // refresh of the ceilings.
            gateway
                .carrier_bps
                .store(new.link.tx_rate.bps(), std::sync::atomic::Ordering::Relaxed);
            running.link.tx_rate = new.link.tx_rate;
        }
        LiveSetting::AckPolicy => {
            let ack = new.transport().ack;
            for link in &gateway.links {
                with_assoc(link, |a| a.set_ack_policy(ack));
            }
            running.transport.ack_every_packets = new.transport.ack_every_packets;
            running.transport.ack_max_delay = new.transport.ack_max_delay;
        }
        LiveSetting::MaxFlows => {
            // Within what the open-file limit raised at start serves.
            let served = crate::fdlimit::served(new.limits.max_flows, new.limits.over_limit);
            if served < new.limits.max_flows {
                warn!(
                    max_flows = new.limits.max_flows,
                    served, "the open-file limit serves fewer flows than `limits.max_flows`"
                );
            }
            for link in &gateway.links {
                with_assoc(link, |a| a.set_max_flows(served));
            }
            running.limits.max_flows = served;
        }
        LiveSetting::MemoryBudget => {
            // The send side follows at once; the receive window was advertised at the
            // handshake and changes with the next association.
            // One budget for the gateway; each peer's share of the send side follows it.
            let budget = new.limits.memory_budget.bytes();
            gateway.memory.set_budget(budget);
            let share = crate::tunnel::peer_send_share(budget, gateway.links.len());
            for link in &gateway.links {
                link.set_send_budget(share);
            }
            running.limits.memory_budget = new.limits.memory_budget;
        }
        // Read from `Live` by connections opened from now on.
        LiveSetting::OverLimit => running.limits.over_limit = new.limits.over_limit,
        LiveSetting::Timeouts => running.timeouts = new.timeouts.clone(),
        LiveSetting::Upstream => running.upstream = new.upstream.clone(),
        // Read when SIGTERM comes.
        LiveSetting::Shutdown => running.shutdown = new.shutdown.clone(),
        LiveSetting::PeerRates => apply_peer_rates(new, running, gateway),
    }
    true
}

/// New MIR, CIR, weight and keepalive for each running peer whose entry stays the same peer (same
/// place, name and key); an entry added, removed or replaced waits for a restart.
fn apply_peer_rates(new: &PepdConfig, running: &mut PepdConfig, gateway: &Gateway) {
    let (Peers::List(entries), Peers::List(old)) = (&new.peer, &mut running.peer) else {
        return;
    };
    let specs = new.peer_specs();
    for (i, (entry, old)) in entries.iter().zip(old.iter_mut()).enumerate() {
        let same_peer = entry.name == old.name && entry.public_key == old.public_key;
        let (Some(link), Some(spec), true) = (gateway.links.get(i), specs.get(i), same_peer) else {
            continue;
        };
        link.set_tx_rate(spec.tx_bps);
        link.set_keepalive(spec.keepalive);
        link.set_share_rates(ShareRates {
            min_bps: spec.min_bps,
            weight: spec.weight,
        });
        old.tx_rate = entry.tx_rate;
        old.min_rate = entry.min_rate;
        old.weight = entry.weight;
        old.keepalive = entry.keepalive;
    }
}

/// Changes a link's association, if it has one yet, and has the driver look at it again.
fn with_assoc(link: &PeerLink, f: impl FnOnce(&mut pep_transport::Association)) {
    if let Some(a) = link.lock().assoc.as_mut() {
        f(a);
    }
    link.wake();
}
