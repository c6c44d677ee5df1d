//! SIGHUP: re-read the config, apply what can change live, and say what needs a restart.

mod changes;

use std::path::Path;

use tracing::{info, warn};

use crate::config::PepdConfig;
use crate::daemon::{Live, LiveRef, LogReload};
use crate::hub::Hub;
use changes::{LiveSetting, Setting};

/// Applies `path` to the running daemon; on a bad file the running config stays.
pub fn apply(path: &Path, running: &mut PepdConfig, hub: &Hub, live: &LiveRef, log: &LogReload) {
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
                if apply_live(s, &new, running, hub, log) {
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
    hub: &Hub,
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
            // The peer's own `tx_rate` caps it; the `[peer]` table's is `link.tx_rate`.
            let rate = new
                .peer_specs()
                .first()
                .map_or(new.link.tx_rate.bps(), |p| p.tx_bps);
            hub.lock().assoc.set_rate(rate);
            running.link.tx_rate = new.link.tx_rate;
        }
        LiveSetting::AckPolicy => {
            hub.lock().assoc.set_ack_policy(new.transport().ack);
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
            hub.lock().assoc.set_max_flows(served);
            running.limits.max_flows = served;
        }
        LiveSetting::MemoryBudget => {
            // The send side follows at once; the receive window was advertised at the
            // handshake and changes with the next association.
            hub.set_memory_budget(new.limits.memory_budget.bytes());
            running.limits.memory_budget = new.limits.memory_budget;
        }
        // Read from `Live` by connections opened from now on.
        LiveSetting::OverLimit => running.limits.over_limit = new.limits.over_limit,
        LiveSetting::Timeouts => running.timeouts = new.timeouts.clone(),
        LiveSetting::Upstream => running.upstream = new.upstream.clone(),
        // Read when SIGTERM comes.
        LiveSetting::Shutdown => running.shutdown = new.shutdown.clone(),
    }
    true
}
