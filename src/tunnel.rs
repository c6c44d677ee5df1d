//! The tunnel end of `pepd run`, built from the config: the endpoint in front of every
//! association, one link per peer (with its association made up front when the peer's
//! address is configured), the route table, and the addresses the socket takes datagrams
//! from.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use pep_transport::security::{LocalIdentity, HANDSHAKES_PER_SECOND, HANDSHAKE_BURST, TAG_LEN};
use pep_transport::{Endpoint, EndpointConfig, PeerId, PeerIdentity};
use tokio::sync::Notify;

use crate::config::{LoadedSecurity, Peers, PepdConfig, Side};
use crate::driver::AssocFactory;
use crate::gateway::{Gateway, GatewayCounters};
use crate::link::PeerLink;
use crate::memory::MemoryAccount;
use crate::routes::Routes;
use crate::share::CarrierShare;

/// Connection ID length of a hub with `[[peer]]` entries: 2 bytes name up to 65,536
/// associations, even with one peer so that more can be added. Everywhere else (a
/// terminal, either end of a `[peer]` pair) the one association needs none.
const HUB_CID_LEN: u8 = 2;

pub struct Tunnel {
    pub gateway: Arc<Gateway>,
    pub endpoint: Endpoint,
    pub factory: AssocFactory,
    /// `None`: datagrams from any address (connection IDs and authentication gate them).
    pub allowed: Option<HashSet<SocketAddr>>,
    /// With `[[peer]]` entries: the peers share `[link] tx_rate`.
    pub share: Option<CarrierShare>,
}

/// The connection ID length this gateway's endpoint chooses.
pub fn cid_len(cfg: &PepdConfig) -> u8 {
    match (&cfg.peer, cfg.side()) {
        (Peers::List(_), Side::Hub) => HUB_CID_LEN,
        _ => 0,
    }
}

/// Builds the tunnel end; `epoch` and `seed` are this start's.
pub fn build(
    cfg: &PepdConfig,
    security: &LoadedSecurity,
    epoch: u64,
    seed: [u8; 32],
) -> anyhow::Result<Tunnel> {
    let specs = cfg.peer_specs();
    let factory = AssocFactory {
        configs: specs.iter().map(|p| cfg.transport_for(p)).collect(),
        security: specs.iter().map(|p| security.towards(p)).collect(),
        role: cfg.role(),
        epoch,
    };
    let mut ecfg = EndpointConfig::new(cid_len(cfg));
    ecfg.max_datagram = factory
        .configs
        .iter()
        .map(pep_transport::Config::max_datagram)
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
    let mut endpoint = Endpoint::new(ecfg, local, seed)
        .map_err(|e| anyhow::anyhow!("tunnel endpoint {}: {}", e.key, e.why))?;
    endpoint.set_peers(specs.iter().enumerate().map(|(i, p)| {
        (
            PeerId(i as u32),
            PeerIdentity {
                public_key: p.public_key.filter(|_| secure),
                address: p.address,
            },
        )
    }));
    let wake = Arc::new(Notify::new());
    let memory = Arc::new(gateway_memory(cfg, &factory.configs));
    // Each peer's relays buffer at most their share of the send half of the budget.
    let send_budget = peer_send_share(cfg.limits.memory_budget.bytes(), specs.len());
    let now = Instant::now();
    let mut links = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let assoc = match spec.address {
            Some(_) => {
                let (_, a) = factory
                    .make(&mut endpoint, now, i)
                    .map_err(|e| anyhow::anyhow!("transport setting {}: {}", e.key, e.why))
                    .with_context(|| format!("the association with peer {}", spec.name))?;
                Some(a)
            }
            None => None,
        };
        links.push(Arc::new(PeerLink::new(
            PeerId(i as u32),
            &spec.name,
            assoc,
            send_budget,
            memory.clone(),
            wake.clone(),
        )));
    }
    // The pair keeps its filter on the peer's address; without security the address is a
    // peer's identity.
    let allowed = (matches!(cfg.peer, Peers::Pair(_)) || !secure)
        .then(|| specs.iter().filter_map(|p| p.address).collect());
    let share = matches!(cfg.peer, Peers::List(_)).then(|| {
        let transport = cfg.transport();
        CarrierShare::new(
            cfg.link.tx_rate.bps(),
            factory
                .configs
                .iter()
                .map(|c| c.mtu)
                .max()
                .unwrap_or(transport.mtu),
            transport.pacing_burst,
            &specs,
            // As the association counts a datagram on the wire: `wire_overhead` holds room
            // for the AEAD tag, which a sealed datagram carries already.
            factory
                .configs
                .iter()
                .zip(&factory.security)
                .map(|(c, sec)| {
                    c.wire_overhead
                        .saturating_sub(sec.as_ref().map_or(0, |_| TAG_LEN))
                })
                .collect(),
        )
    });
    let gateway = Gateway {
        links,
        routes: Routes::new(&specs),
        specs,
        counters: GatewayCounters::default(),
        carrier_bps: AtomicU64::new(cfg.link.tx_rate.bps()),
        wake,
        memory,
    };
    Ok(Tunnel {
        gateway: Arc::new(gateway),
        endpoint,
        factory,
        allowed,
        share,
    })
}

/// A peer's share of the send side of `budget` when `peers` share it.
pub fn peer_send_share(budget: u64, peers: usize) -> u64 {
    crate::memory::send_cap(budget) / peers.max(1) as u64
}

/// The gateway's one memory account. Every association's receive window is reserved; each
/// is sized within the receive half of the budget (config.rs), and their sum is held to
/// that half too, so that the send side keeps its share however many peers there are.
fn gateway_memory(cfg: &PepdConfig, configs: &[pep_transport::Config]) -> MemoryAccount {
    let budget = cfg.limits.memory_budget.bytes();
    let windows: u64 = configs.iter().map(|c| c.assoc_window).sum();
    let receive_reserve = windows.min(budget - crate::memory::send_cap(budget));
    let mtu = configs
        .iter()
        .map(|c| c.mtu)
        .max()
        .unwrap_or(cfg.transport().mtu);
    MemoryAccount::new(
        budget,
        receive_reserve,
        crate::memory::fixed(mtu, crate::memory::worker_threads()),
    )
}
