//! SIGHUP: re-read the config, apply what can change live, and say what needs a restart.

mod changes;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use pep_transport::PeerId;
use tracing::{info, warn};

use crate::config::{LoadedSecurity, PeerEntry, Peers, PepdConfig};
use crate::proxy::live::{Live, LiveRef};
use crate::tunnel::gateway::Gateway;
use crate::tunnel::peer::{Peer, ShareRates};
use crate::tunnel::peer_table::{PeerChange, PeerTable};
use changes::{LiveSetting, Setting};

/// Changes the log filter of the running daemon (from the binary's tracing setup).
pub type LogReload = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Applies `path` to the running daemon; on a bad file the running config stays.
/// `security`: the keys read at start, which new peers' associations use too.
pub fn apply(
    path: &Path,
    running: &mut PepdConfig,
    security: &LoadedSecurity,
    gateway: &Gateway,
    live: &LiveRef,
    log: &LogReload,
) {
    let new = match PepdConfig::load(path)
        .map_err(anyhow::Error::from)
        .and_then(|c| {
            c.check_servable()?;
            Ok(c)
        }) {
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
                if apply_live(s, &new, running, security, gateway, log) {
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
    security: &LoadedSecurity,
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
            // Each peer's own `tx_rate` caps it; the `[peer]` table's is `link.tx_rate`. A
            // peer the reload removes keeps its rate to its end.
            let specs = new.peer_specs();
            for peer in &gateway.peers() {
                let spec = specs.iter().find(|p| *p.name == *peer.name);
                peer.set_tx_rate(spec.map_or(new.link.tx_rate.bps(), |p| p.tx_bps));
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
            for peer in &gateway.peers() {
                with_assoc(peer, |a| a.set_ack_policy(ack));
            }
            running.transport.ack_every_packets = new.transport.ack_every_packets;
            running.transport.ack_max_delay = new.transport.ack_max_delay;
        }
        LiveSetting::MaxFlows => {
            // Within what the open-file limit raised at start serves.
            let served =
                crate::control::fdlimit::served(new.limits.max_flows, new.limits.over_limit);
            if served < new.limits.max_flows {
                warn!(
                    max_flows = new.limits.max_flows,
                    served, "the open-file limit serves fewer flows than `limits.max_flows`"
                );
            }
            // A peer's own `max_flows` stays below the gateway's; the others follow it.
            let specs = new.peer_specs();
            for peer in &gateway.peers() {
                let spec = specs.iter().find(|p| *p.name == *peer.name);
                peer.set_max_flows(spec.map_or(served, |p| p.max_flows.min(served)));
            }
            gateway.open_flows.set_max(served);
            running.limits.max_flows = served;
        }
        LiveSetting::MemoryBudget => {
            // The send side follows at once; the receive window was advertised at the
            // handshake and changes with the next association.
            // One budget for the gateway; each peer's quota of the send side follows it.
            let budget = new.limits.memory_budget.bytes();
            gateway.memory.set_budget(budget);
            let peers = gateway.peers();
            let quota = crate::tunnel::memory::peer_send_quota(budget, peers.len());
            for peer in &peers {
                peer.set_send_budget(quota);
            }
            running.limits.memory_budget = new.limits.memory_budget;
        }
        // Read from `Live` by connections opened from now on.
        LiveSetting::OverLimit => running.limits.over_limit = new.limits.over_limit,
        LiveSetting::StalledFlowTimeout => {
            running.limits.stalled_flow_timeout = new.limits.stalled_flow_timeout
        }
        LiveSetting::Timeouts => running.timeouts = new.timeouts.clone(),
        LiveSetting::Upstream => running.upstream = new.upstream.clone(),
        // Read when SIGTERM comes.
        LiveSetting::Shutdown => running.shutdown = new.shutdown.clone(),
        // One change of the set of peers, whichever keys changed; the second finds the
        // running entries equal to the new ones.
        LiveSetting::PeerRates | LiveSetting::PeerMaxFlows | LiveSetting::Peers => {
            apply_peers(new, running, security, gateway)
        }
    }
    true
}

/// The new `[[peer]]` entries on the running gateway, matched by name: an entry that stays
/// the same peer (same key, address, subnets and `rx_rate`) keeps its association and flows
/// and takes its new MIR, CIR, weight, keepalive and `max_flows` (flows open above a lower
/// one stay; new ones are refused until fewer are open); an entry that is new, or names another
/// peer now, is added (after the one it replaces is removed); a running peer whose entry
/// went is removed, its flows reset. The route table changes at once, the endpoint and the
/// carrier scheduler at the driver's next pass.
fn apply_peers(
    new: &PepdConfig,
    running: &mut PepdConfig,
    security: &LoadedSecurity,
    gateway: &Gateway,
) {
    let (Peers::List(entries), Peers::List(old)) = (&new.peer, &running.peer) else {
        return;
    };
    let table = gateway.peers.table();
    let specs = new.peer_specs();
    let mut peers = Vec::with_capacity(specs.len());
    let mut kept: HashSet<PeerId> = HashSet::new();
    let mut added = Vec::new();
    for (entry, spec) in entries.iter().zip(&specs) {
        let running_entry = old.iter().find(|o| o.name == entry.name);
        let peer = table.peers.iter().find(|l| *l.name == entry.name);
        match (running_entry, peer) {
            (Some(o), Some(peer)) if same_peer(o, entry) => {
                if rates_changed(o, entry) {
                    peer.set_tx_rate(spec.tx_bps);
                    peer.set_keepalive(spec.keepalive);
                    peer.set_share_rates(ShareRates {
                        min_bps: spec.min_bps,
                        weight: spec.weight,
                    });
                }
                if o.max_flows != entry.max_flows {
                    peer.set_max_flows(spec.max_flows.min(running.limits.max_flows));
                }
                kept.insert(peer.id);
                peers.push(peer.clone());
            }
            _ => {
                let id = gateway.peers.fresh_id();
                let peer = crate::tunnel::setup::new_peer(running, security, spec, id, gateway);
                peers.push(peer.peer.clone());
                added.push(peer);
            }
        }
    }
    let removed: Vec<Arc<Peer>> = table
        .peers
        .iter()
        .filter(|l| !kept.contains(&l.id))
        .cloned()
        .collect();
    if !added.is_empty() || !removed.is_empty() {
        let names = |peers: &mut dyn Iterator<Item = &Arc<Peer>>| -> Vec<String> {
            peers.map(|l| l.name.to_string()).collect()
        };
        info!(
            added = ?names(&mut added.iter().map(|p| &p.peer)),
            removed = ?names(&mut removed.iter()),
            "peers changed; the others' flows carry on"
        );
        gateway
            .peers
            .replace(PeerTable::new(peers, specs), PeerChange { removed, added });
        gateway.workers.wake_all();
    }
    running.peer = new.peer.clone();
}

/// Whether `new` is still the peer `old` is: what its association was made from is the same.
fn same_peer(old: &PeerEntry, new: &PeerEntry) -> bool {
    old.public_key == new.public_key
        && old.address == new.address
        && old.subnets == new.subnets
        && old.rx_rate == new.rx_rate
}

fn rates_changed(old: &PeerEntry, new: &PeerEntry) -> bool {
    old.tx_rate != new.tx_rate
        || old.min_rate != new.min_rate
        || old.weight != new.weight
        || old.keepalive != new.keepalive
}

/// Changes a peer's association, if it has one yet, and has the driver look at it again.
fn with_assoc(peer: &Peer, f: impl FnOnce(&mut pep_transport::Association)) {
    if let Some(a) = peer.lock().assoc.as_mut() {
        f(a);
    }
    peer.wake();
}

#[cfg(test)]
mod tests {
    use pep_transport::PeerId;

    use super::*;

    fn named(peers: &[(&str, u32)]) -> Vec<(String, u32)> {
        peers.iter().map(|&(n, id)| (n.to_owned(), id)).collect()
    }

    fn names_and_ids(gateway: &Gateway) -> Vec<(String, u32)> {
        let table = gateway.peers.table();
        table
            .peers
            .iter()
            .map(|l| (l.name.to_string(), l.id.0))
            .collect()
    }

    /// One endpoint seed for each worker there may be.
    const SEEDS: [[u8; 32]; crate::config::MAX_WORKERS] = [[7; 32]; crate::config::MAX_WORKERS];

    /// config/hub-spoke.toml's config, without keys, and its gateway.
    fn hub_spoke() -> (PepdConfig, LoadedSecurity, Arc<Gateway>) {
        let start =
            PepdConfig::parse(include_str!("../../config/hub-spoke.toml")).expect("hub-spoke.toml");
        let security = LoadedSecurity {
            local: None,
            warnings: Vec::new(),
        };
        let gateway = crate::tunnel::setup::build(&start, &security, 1, &SEEDS)
            .expect("tunnel")
            .gateway;
        (start, security, gateway)
    }

    #[test]
    fn entries_are_matched_by_name_and_another_identity_replaces_the_peer() {
        let (start, security, gateway) = hub_spoke();
        let at_start = named(&[("rig-3", 0), ("ship-7", 1), ("cell-12", 2)]);
        assert_eq!(names_and_ids(&gateway), at_start);

        let mut new = start.clone();
        let Peers::List(entries) = &mut new.peer else {
            panic!("the list form");
        };
        // ship-7 goes; cell-12 reaches another subnet now (another peer); rig-3 gets a new
        // weight and comes last, where its place does not matter; buoy-1 is new.
        let mut rig = entries.remove(0);
        entries.remove(0);
        entries[0].subnets = vec!["10.13.0.0/22".parse().expect("cidr")];
        rig.weight = 3;
        let mut buoy = rig.clone();
        buoy.name = "buoy-1".into();
        buoy.address = Some("198.19.0.40:7400".parse().expect("address"));
        buoy.subnets = vec!["10.40.0.0/24".parse().expect("cidr")];
        entries.push(rig);
        entries.push(buoy);
        let mut running = start.clone();
        apply_peers(&new, &mut running, &security, &gateway);
        let now = named(&[("cell-12", 3), ("rig-3", 0), ("buoy-1", 4)]);
        assert_eq!(names_and_ids(&gateway), now);
        assert_eq!(running.peer, new.peer);
        let (changes, table) = gateway.peers.take_changes(0).expect("a change");
        assert_eq!(changes.len(), 1);
        let removed: Vec<&str> = changes[0].removed.iter().map(|l| &*l.name).collect();
        let added: Vec<&str> = changes[0].added.iter().map(|p| &*p.peer.name).collect();
        assert_eq!(removed, ["ship-7", "cell-12"]);
        assert_eq!(added, ["cell-12", "buoy-1"]);
        let route = |ip: &str| table.routes.lookup(ip.parse().expect("ip"));
        assert_eq!(route("10.13.0.5"), Some(PeerId(3)));
        assert_eq!(route("10.12.0.5"), None);
        assert_eq!(route("10.7.0.1"), None);
        assert_eq!(route("10.3.0.1"), Some(PeerId(0)));
        assert_eq!(route("10.40.0.1"), Some(PeerId(4)));
        // The same file again changes nothing; removing a peer never frees its id for another.
        apply_peers(&new, &mut running, &security, &gateway);
        assert!(gateway.peers.take_changes(0).is_none());
        apply_peers(&start, &mut running, &security, &gateway);
        let back = named(&[("rig-3", 0), ("ship-7", 5), ("cell-12", 6)]);
        assert_eq!(names_and_ids(&gateway), back);
    }

    #[test]
    fn a_peer_s_max_flows_applies_to_its_running_association() {
        let (start, security, gateway) = hub_spoke();
        let max_flows = |name: &str| {
            let peer = gateway.peers().into_iter().find(|l| *l.name == *name);
            let peer = peer.expect("the peer");
            let st = peer.lock();
            st.assoc.as_ref().map(|a| a.config().max_flows)
        };
        // rig-3 sets its own; cell-12 takes `limits.max_flows`; ship-7 has no association
        // until it initiates.
        assert_eq!(max_flows("rig-3"), Some(2000));
        assert_eq!(max_flows("cell-12"), Some(10_000));
        let mut new = start.clone();
        let Peers::List(entries) = &mut new.peer else {
            panic!("the list form");
        };
        entries[0].max_flows = Some(3);
        entries[2].max_flows = Some(5);
        let mut running = start.clone();
        apply_peers(&new, &mut running, &security, &gateway);
        assert_eq!(
            (max_flows("rig-3"), max_flows("cell-12")),
            (Some(3), Some(5))
        );
        assert!(gateway.peers.take_changes(0).is_none(), "the same peers");
        assert_eq!(running.peer, new.peer);
    }
}
