//! SIGHUP: re-read the config, apply what can change live, and say what needs a restart.

use std::path::Path;

use tracing::{info, warn};

use crate::config::PepdConfig;
use crate::daemon::{Live, LiveRef, LogReload};
use crate::hub::Hub;

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

    if new.log.level != running.log.level {
        match log(&new.log.level) {
            Ok(()) => {
                changed.push("log.level");
                running.log = new.log.clone();
            }
            Err(e) => warn!(level = %new.log.level, "log level not applied: {e}"),
        }
    }
    if new.link.tx_rate != running.link.tx_rate {
        hub.lock().assoc.set_rate(new.link.tx_rate.bps());
        running.link.tx_rate = new.link.tx_rate;
        changed.push("link.tx_rate");
    }
    let (old_t, new_t) = (&running.transport, &new.transport);
    if old_t.ack_every_packets != new_t.ack_every_packets
        || old_t.ack_max_delay != new_t.ack_max_delay
    {
        hub.lock().assoc.set_ack_policy(new.transport().ack);
        running.transport.ack_every_packets = new_t.ack_every_packets;
        running.transport.ack_max_delay = new_t.ack_max_delay;
        changed.push("transport.ack_*");
    }
    if new.limits.max_flows != running.limits.max_flows {
        hub.lock().assoc.set_max_flows(new.limits.max_flows);
        running.limits.max_flows = new.limits.max_flows;
        changed.push("limits.max_flows");
    }
    if new.limits.memory_budget != running.limits.memory_budget {
        // The send side follows at once; the receive window was advertised at the
        // handshake and changes with the next association.
        hub.set_send_budget(new.limits.memory_budget.bytes() / 2);
        running.limits.memory_budget = new.limits.memory_budget;
        changed.push("limits.memory_budget (send side; receive side after a restart)");
    }
    if new.limits.over_limit != running.limits.over_limit {
        running.limits.over_limit = new.limits.over_limit;
        changed.push("limits.over_limit");
    }
    if new.timeouts != running.timeouts {
        running.timeouts = new.timeouts.clone();
        changed.push("timeouts");
    }
    if new.upstream != running.upstream {
        running.upstream = new.upstream.clone();
        changed.push("upstream");
    }
    if new.shutdown != running.shutdown {
        running.shutdown = new.shutdown.clone();
        changed.push("shutdown");
    }
    {
        let mut l = live.write().unwrap_or_else(|p| p.into_inner());
        let draining = l.draining;
        *l = Live::from_config(running);
        l.draining = draining;
    }

    if new.link.rx_rate != running.link.rx_rate || new.link.mtu != running.link.mtu {
        needs_restart.push("link.rx_rate/mtu");
    }
    if new.limits.flow_buffer != running.limits.flow_buffer {
        needs_restart.push("limits.flow_buffer");
    }
    // The ACK policy was applied above; everything else in [transport] is fixed at start.
    let rest = crate::config::TransportConfig {
        ack_every_packets: running.transport.ack_every_packets,
        ack_max_delay: running.transport.ack_max_delay,
        ..new.transport.clone()
    };
    if rest != running.transport {
        needs_restart
            .push("transport (cc, vegas, loss_default, outage_limit, keepalive, pacing_burst)");
    }
    if new.peer != running.peer {
        needs_restart.push("peer");
    }
    if new.intercept != running.intercept {
        needs_restart.push("intercept");
    }
    if new.metrics != running.metrics {
        needs_restart.push("metrics");
    }
    // Keys are read once at start; a changed file at the same path needs a restart too.
    if new.security != running.security {
        needs_restart.push("security");
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
