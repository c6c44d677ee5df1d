//! Flows the peer opens: each connected to its destination (the peer may open only what its
//! subnets allow) and then relayed.

use std::sync::Arc;
#[cfg(test)]
use std::sync::RwLock;
#[cfg(test)]
use std::time::Duration;

use pep_transport::{FlowMeta, ResetReason};
use tracing::{debug, warn};

#[cfg(test)]
use crate::config::{FailMode, OverLimit};
use crate::proxy::compression::{FlowBlocks, Scope};
use crate::proxy::live::{self, Live, LiveRef};
use crate::proxy::relay::{log_end, Relay};
use crate::proxy::upstream;
#[cfg(test)]
use crate::proxy::upstream::UpstreamOptions;
use crate::tunnel::driver::FlowAcceptor;
use crate::tunnel::gateway::Gateway;
use crate::tunnel::memory::FlowCharge;
use crate::tunnel::peer::{FlowRef, Peer, PeerCounters};

/// Connects flows the peer opened to their destination.
pub struct UpstreamAcceptor {
    pub live: LiveRef,
    pub gateway: Arc<Gateway>,
    /// The daemon's runtime: the relays run there whichever worker thread accepts their
    /// flow.
    pub runtime: tokio::runtime::Handle,
    /// Where this gateway compresses what it sends; `None`: compression off.
    pub compression: Option<Arc<Scope>>,
}

impl UpstreamAcceptor {
    /// Whether the peer may open this flow: from an address of its own subnets (WireGuard's
    /// inbound check), to a destination no other peer is reached through, so one terminal
    /// cannot use the hub as a relay into another's LAN. The pair's one peer holds every
    /// address, so this never refuses there.
    fn may_open(&self, peer: &Peer, meta: &FlowMeta) -> bool {
        let table = self.gateway.peers.table();
        let routes = &table.routes;
        let peer = peer.id;
        routes.admits(peer, meta.client.ip())
            && routes.lookup(meta.server.ip()).is_none_or(|p| p == peer)
    }
}

impl FlowAcceptor for UpstreamAcceptor {
    fn accept(&self, peer: Arc<Peer>, flow: FlowRef, meta: FlowMeta, charge: FlowCharge) {
        let live = live::read(&self.live);
        if live.draining {
            peer.reset(&flow, ResetReason::ResourceLimit);
            return;
        }
        if !self.may_open(&peer, &meta) {
            let c = &self.gateway.counters;
            PeerCounters::add(&c.flows_refused, 1);
            PeerCounters::add(&c.flows_isolated, 1);
            warn!(peer = %peer.name, client = %meta.client, server = %meta.server,
                "flow refused: the peer may not open it (isolation)");
            peer.reset(&flow, ResetReason::Refused);
            return;
        }
        let blocks = match (meta.compression, peer.compression()) {
            (false, _) => None,
            (true, Some(agreed)) => Some(FlowBlocks::new(
                agreed.max_block,
                self.compression
                    .as_ref()
                    .is_some_and(|s| s.applies(meta.server)),
            )),
            (true, None) => {
                peer.counters.compression.refuse("not_agreed");
                debug!(peer = %peer.name, "compressed flow without an agreement: reset");
                peer.reset(&flow, ResetReason::Protocol);
                return;
            }
        };
        self.runtime
            .spawn(from_peer(peer, flow, meta, live, charge, blocks));
    }
}

/// A flow the peer opened: the connect to its destination, then the relay.
async fn from_peer(
    peer: Arc<Peer>,
    flow: FlowRef,
    meta: FlowMeta,
    live: Live,
    charge: FlowCharge,
    blocks: Option<FlowBlocks>,
) {
    let connected = tokio::select! {
        r = upstream::connect(&meta, &live.upstream) => r,
        // The client may give up (reset) while the connect is still pending.
        () = wait_reset(&flow) => return,
    };
    match connected {
        Ok(tcp) => {
            let relay = Relay {
                peer,
                flow,
                tcp,
                idle_timeout: live.idle,
                stalled_timeout: live.stalled_flow_timeout,
                tcp_read_done: false,
                charge,
                blocks,
            };
            let id = relay.flow.id;
            let end = relay.run().await;
            log_end(id, meta.client, meta.server, end);
        }
        Err(f) => {
            peer.counters.connect_errors.add(f.reason);
            debug!(server = %meta.server, error = %f.error, reason = ?f.reason,
                "upstream connect failed");
            peer.reset(&flow, f.reason);
        }
    }
}

async fn wait_reset(flow: &FlowRef) {
    loop {
        if flow.signal.reset_reason().is_some() {
            return;
        }
        flow.signal.notify.notified().await;
    }
}

/// Each kind of flow task, not started, to weigh for the per-flow cost (memory.rs).
#[cfg(test)]
pub(crate) fn flow_tasks(
    peer: Arc<Peer>,
    flow: FlowRef,
    tcp: tokio::net::TcpStream,
) -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ()>,
) {
    let live = Live {
        over_limit: OverLimit::Refuse,
        fail: FailMode::Closed,
        upstream: UpstreamOptions {
            mark: 0,
            transparent_source: false,
            connect_timeout: Duration::from_secs(1),
        },
        idle: None,
        stalled_flow_timeout: None,
        draining: false,
    };
    let meta = FlowMeta {
        client: "198.18.0.2:1000".parse().expect("addr"),
        server: "198.18.1.2:80".parse().expect("addr"),
        dscp: 0,
        compression: false,
    };
    let gateway = Gateway::new(
        crate::tunnel::peer_table::PeerTable::new(vec![peer.clone()], Vec::new()),
        0,
        Arc::new(tokio::sync::Notify::new()),
        peer.memory.clone(),
        1,
    );
    let ctx = Arc::new(crate::proxy::intercept::Interception {
        gateway: Arc::new(gateway),
        live: Arc::new(RwLock::new(live.clone())),
        compression: None,
    });
    let conn = crate::proxy::tproxy::Intercepted {
        tcp,
        client: meta.client,
        server: meta.server,
        dscp: 0,
    };
    let charge = peer.charge_flow();
    let peer = from_peer(peer, flow, meta, live, charge, None);
    (crate::proxy::intercept::intercepted(ctx, conn), peer)
}
