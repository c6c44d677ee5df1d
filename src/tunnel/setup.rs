//! The tunnel end of `pepd run`, built from the config: the endpoint in front of every
//! association, one [`Peer`] per configured peer (with its association made up front when the peer's
//! address is configured and the hub is not redundant), the route table, and the addresses the socket takes datagrams
//! from.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use pep_transport::security::{LocalIdentity, HANDSHAKES_PER_SECOND, HANDSHAKE_BURST, TAG_LEN};
use pep_transport::{Endpoint, EndpointConfig, PeerId, PeerIdentity};
use tokio::sync::Notify;

use crate::config::{LoadedSecurity, PeerSpec, Peers, PepdConfig, TrafficClasses};
use crate::tunnel::carrier::CarrierShare;
use crate::tunnel::driver::AssocFactory;
use crate::tunnel::gateway::Gateway;
use crate::tunnel::memory::{peer_send_quota, receive_reserve, MemoryAccount};
use crate::tunnel::peer::Peer;
use crate::tunnel::peer_table::{NewPeer, PeerSettings, PeerTable};

pub struct Tunnel {
    pub gateway: Arc<Gateway>,
    /// One per worker, by number.
    pub shards: Vec<Shard>,
    pub factory: AssocFactory,
    /// `None`: datagrams from any address (connection IDs and authentication gate them).
    pub allowed: Option<HashSet<SocketAddr>>,
}

/// What one worker serves: its endpoint shard, which holds the associations of the peers it
/// owns and knows every peer, and its part of the carrier.
pub struct Shard {
    pub endpoint: Endpoint,
    /// With `[[peer]]` entries: its peers' members of the shared `[link] tx_rate`.
    pub share: Option<CarrierShare>,
}

/// Builds the tunnel end; `epoch` is this start's, and `seeds` (32 random bytes each) seed
/// the workers' endpoints, one each ([`PepdConfig::workers`]).
pub fn build(
    cfg: &PepdConfig,
    security: &LoadedSecurity,
    epoch: u64,
    seeds: &[[u8; 32]],
) -> anyhow::Result<Tunnel> {
    let workers = cfg.workers();
    anyhow::ensure!(
        seeds.len() >= workers,
        "{} seeds for {workers} workers",
        seeds.len()
    );
    let specs = cfg.peer_specs();
    let ids: Vec<PeerId> = (0..specs.len()).map(|i| PeerId(i as u32)).collect();
    let settings: Vec<PeerSettings> = specs
        .iter()
        .map(|p| peer_settings(cfg, security, p))
        .collect();
    let factory = AssocFactory {
        peers: ids.iter().copied().zip(settings.iter().cloned()).collect(),
        role: cfg.role(),
        epoch,
        redundant: cfg.redundant(),
        hubs: cfg.hubs(),
    };
    let mut ecfg = EndpointConfig::new(cfg.cid_len());
    ecfg.shard_bits = crate::tunnel::workers::shard_bits(workers);
    ecfg.shards = workers as u8;
    // Hints call for an authenticated handshake: with the keys loaded only.
    ecfg.hints = cfg.hints() && security.local.is_some();
    ecfg.max_datagram = settings
        .iter()
        .map(|s| s.config.max_datagram())
        .max()
        .unwrap_or(ecfg.max_datagram);
    if matches!(cfg.peer, Peers::Pair(_)) {
        // One peer: the handshake budget a pair always had.
        ecfg.handshakes_per_second = HANDSHAKES_PER_SECOND;
        ecfg.handshake_burst = HANDSHAKE_BURST;
    }
    let local = security.local.as_ref().map(|l| LocalIdentity {
        private_key: l.private_key,
        psk: l.psk,
    });
    let secure = local.is_some();
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(workers);
    for (shard, seed) in seeds.iter().take(workers).enumerate() {
        let mut ecfg = ecfg.clone();
        ecfg.shard = shard as u8;
        let mut endpoint = Endpoint::new(ecfg, local.clone(), *seed)
            .map_err(|e| anyhow::anyhow!("tunnel endpoint {}: {}", e.key, e.why))?;
        endpoint.set_peers(
            ids.iter()
                .zip(&specs)
                .map(|(&id, p)| (id, identity(p, secure))),
        );
        // One replay memory for all workers: a captured initiation sent to each worker's
        // socket in turn is refused by every one after the first.
        if let Some(first) = endpoints.first() {
            endpoint.use_initiation_memory(first.initiations());
        }
        endpoints.push(endpoint);
    }
    let wake = Arc::new(Notify::new());
    let worker_set = crate::tunnel::workers::Workers::new(workers, wake);
    let memory = Arc::new(gateway_memory(cfg, settings.iter().map(|s| &s.config)));
    // Each peer's relays buffer at most their quota of the send half of the budget.
    let send_budget = peer_send_quota(cfg.limits.memory_budget.bytes(), specs.len());
    let now = Instant::now();
    let mut peers = Vec::with_capacity(specs.len());
    for (&id, spec) in ids.iter().zip(&specs) {
        let endpoint = &mut endpoints[crate::tunnel::workers::owner(id, workers)];
        let assoc = match factory.makes_up_front(spec.address) {
            true => {
                let (_, a) = factory
                    .make(endpoint, now, id)
                    .map_err(|e| anyhow::anyhow!("transport setting {}: {}", e.key, e.why))
                    .with_context(|| format!("the association with peer {}", spec.name))?;
                Some(a)
            }
            false => None,
        };
        peers.push(Arc::new(Peer::new(
            id,
            &spec.name,
            assoc,
            send_budget,
            memory.clone(),
            worker_set.wake_of(id),
        )));
    }
    // The pair keeps its filter on the peer's addresses (every hub of a terminal's list);
    // without security the address is a peer's identity.
    let allowed = (matches!(cfg.peer, Peers::Pair(_)) || !secure)
        .then(|| cfg.peer_addresses().into_iter().collect());
    let transport = cfg.transport();
    let mtu = settings
        .iter()
        .map(|s| s.config.mtu)
        .max()
        .unwrap_or(transport.mtu);
    let carrier = crate::tunnel::carrier::SharedCarrier::new(
        cfg.link.tx_rate.bps(),
        mtu,
        transport.pacing_burst,
        workers,
    );
    let shards = endpoints
        .into_iter()
        .enumerate()
        .map(|(worker, endpoint)| {
            let share = matches!(cfg.peer, Peers::List(_)).then(|| {
                let mut share =
                    CarrierShare::new(cfg.link.tx_rate.bps(), mtu, transport.pacing_burst);
                if workers > 1 {
                    share = share.on_worker(carrier.clone(), worker);
                }
                for ((&id, spec), s) in ids.iter().zip(&specs).zip(&settings) {
                    if crate::tunnel::workers::owner(id, workers) == worker {
                        share.add(id, spec, carrier_overhead(s));
                    }
                }
                share
            });
            Shard { endpoint, share }
        })
        .collect();
    let gateway = Gateway::on_workers(
        PeerTable::new(peers, specs),
        cfg.link.tx_rate.bps(),
        worker_set,
        memory,
        cfg.limits.max_flows,
    )
    .with_classes(TrafficClasses::of(cfg));
    Ok(Tunnel {
        gateway: Arc::new(gateway),
        shards,
        factory,
        allowed,
    })
}

/// How the association with `peer` is made: the transport settings of `cfg` at the peer's
/// rates, and the security towards its key.
pub fn peer_settings(cfg: &PepdConfig, security: &LoadedSecurity, peer: &PeerSpec) -> PeerSettings {
    PeerSettings {
        config: cfg.transport_for(peer),
        security: security.towards(peer),
    }
}

/// What the endpoint knows of `peer`: its key only when security is on.
pub fn identity(peer: &PeerSpec, secure: bool) -> PeerIdentity {
    PeerIdentity {
        public_key: peer.public_key.filter(|_| secure),
        address: peer.address,
    }
}

/// What a datagram costs on the carrier beyond its bytes, as the association counts a
/// datagram on the wire: `wire_overhead` holds room for the AEAD tag, which a sealed
/// datagram carries already.
pub fn carrier_overhead(settings: &PeerSettings) -> usize {
    let tag = settings.security.as_ref().map_or(0, |_| TAG_LEN);
    settings.config.wire_overhead.saturating_sub(tag)
}

/// A peer a reload adds, as `build` makes one at start: its [`Peer`] (no association yet; the
/// driver makes it) and what the driver needs to make it.
pub fn new_peer(
    cfg: &PepdConfig,
    security: &LoadedSecurity,
    spec: &PeerSpec,
    id: PeerId,
    gateway: &Gateway,
) -> NewPeer {
    let settings = peer_settings(cfg, security, spec);
    let peer = Peer::new(
        id,
        &spec.name,
        None,
        // The driver divides the budget anew once the peer is in.
        0,
        gateway.memory.clone(),
        gateway.workers.wake_of(id),
    );
    NewPeer {
        peer: Arc::new(peer),
        spec: spec.clone(),
        identity: identity(spec, security.local.is_some()),
        carrier_overhead: carrier_overhead(&settings),
        settings,
    }
}

/// The gateway's one memory account. Every association's receive window is reserved.
fn gateway_memory<'a>(
    cfg: &PepdConfig,
    configs: impl Iterator<Item = &'a pep_transport::Config> + Clone,
) -> MemoryAccount {
    let budget = cfg.limits.memory_budget.bytes();
    let mtu = configs
        .clone()
        .map(|c| c.mtu)
        .max()
        .unwrap_or(cfg.transport().mtu);
    MemoryAccount::new(
        budget,
        receive_reserve(budget, configs),
        crate::config::budget::daemon_fixed(mtu, cfg.workers()) + cfg.compression_contexts(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redundant_hub_makes_no_association_before_a_terminal_initiates() {
        let text = include_str!("../../config/hub-spoke.toml");
        let security = LoadedSecurity {
            local: None,
            warnings: Vec::new(),
        };
        // hub-spoke.toml gives two of its three terminals an address.
        for (redundant, made) in [(false, 2), (true, 0)] {
            let text = text.replace("redundant = false", &format!("redundant = {redundant}"));
            let cfg = PepdConfig::parse(&text).expect("hub-spoke.toml");
            let tunnel =
                build(&cfg, &security, 1, &[[7; 32]; crate::config::MAX_WORKERS]).expect("tunnel");
            let peers = tunnel.gateway.peers();
            assert_eq!(peers.len(), 3);
            let with_association = peers.iter().filter(|p| p.lock().assoc.is_some()).count();
            assert_eq!(with_association, made, "redundant = {redundant}");
        }
    }
}
