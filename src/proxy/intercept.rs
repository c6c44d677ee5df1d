//! Interception: the TPROXY listeners' accept loops, and each intercepted connection opened
//! as a flow to the peer its destination is routed to, refused, or relayed unproxied.

use std::sync::Arc;
use std::time::Duration;

use pep_transport::FlowMeta;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::config::{FailMode, OverLimit};
use crate::proxy::bypass;
use crate::proxy::compression::{FlowBlocks, Scope};
use crate::proxy::live::{self, Live, LiveRef};
use crate::proxy::relay::{abort_tcp, log_end, Relay};
use crate::proxy::tproxy::{self, Intercepted};
use crate::tunnel::gateway::{Gateway, GatewayCounters};
use crate::tunnel::peer::{OpenRefused, Peer, PeerCounters};

/// How long an accepted connection may take to send its first bytes and still have them
/// ride with the flow's open (clients that speak first do so within a LAN round trip).
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(2);

/// Largest first read carried in the open.
const FIRST_BYTES_MAX: usize = 16 * 1024;

const _: () = assert!(FIRST_BYTES_MAX <= crate::proxy::scratch::SIZE);

/// What every intercepted connection is served with.
pub struct Interception {
    pub gateway: Arc<Gateway>,
    pub live: LiveRef,
    /// Where flows are compressed; `None`: compression off.
    pub compression: Option<Arc<Scope>>,
}

/// Accepts intercepted connections on `l` until `stop`.
pub async fn accept_loop(l: TcpListener, ctx: Arc<Interception>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = l.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((tcp, client)) => match tproxy::inspect(tcp, client) {
                Ok(conn) => {
                    tokio::spawn(intercepted(ctx.clone(), conn));
                }
                Err(e) => {
                    PeerCounters::add(&ctx.gateway.counters.inspect_errors, 1);
                    debug!(error = %e, "accepted connection vanished");
                }
            },
            Err(e) => {
                PeerCounters::add(&ctx.gateway.counters.accept_errors, 1);
                // Out of descriptors or memory: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub(crate) async fn intercepted(ctx: Arc<Interception>, conn: Intercepted) {
    let Intercepted {
        tcp,
        client,
        server,
        dscp,
    } = conn;
    let counters = &ctx.gateway.counters;
    PeerCounters::add(&counters.flows_intercepted, 1);
    let _ = tcp.set_nodelay(true);
    let readable = tokio::time::timeout(FIRST_BYTES_WAIT, tcp.readable())
        .await
        .is_ok();
    let live = live::read(&ctx.live);
    let peer = ctx.gateway.route(server.ip());
    // A flow inside this gateway's scope, over an association that agreed on compression,
    // carries blocks both ways; any other flow its bytes as they are.
    let mut blocks = match (&ctx.compression, &peer) {
        (Some(scope), Some(peer)) if scope.applies(server) => peer
            .compression()
            .map(|agreed| FlowBlocks::new(agreed.max_block, true)),
        _ => None,
    };
    let meta = FlowMeta {
        client,
        server,
        dscp,
        compression: blocks.is_some(),
    };
    // The first bytes are read into this thread's scratch buffer and, from there, into the
    // flow's open, with no await between: nothing of them stays with the connection. Only
    // a connection the peers do not take keeps a copy, for the bypass to send.
    let (opened, client_done) = crate::proxy::scratch::with(|buf| {
        let buf = &mut buf[..FIRST_BYTES_MAX];
        let (first_len, client_done) = match readable.then(|| tcp.try_read(buf)) {
            Some(Ok(0)) => (0, true),
            Some(Ok(n)) => (n, false),
            Some(Err(_)) | None => (0, false),
        };
        let first = &buf[..first_len];
        let first_block = blocks
            .as_mut()
            .filter(|_| !first.is_empty())
            .map(|b| first_block(b, first, peer.as_deref()));
        let opened = match peer {
            Some(peer) => match ctx.gateway.take_flow_slot() {
                Some(slot) => match peer.open_in_class(
                    meta,
                    ctx.gateway.classes.class_of(&meta),
                    first_block.as_deref().unwrap_or(first),
                ) {
                    Ok((flow, charge)) => {
                        PeerCounters::add(&peer.counters.bytes_to_peer, first.len() as u64);
                        Ok((peer, flow, charge.with_slot(slot)))
                    }
                    Err(why) => Err((Some(why), first.to_vec())),
                },
                None => {
                    PeerCounters::add(&peer.counters.flows_over_gateway, 1);
                    Err((Some(OpenRefused::GatewayFlowLimit), first.to_vec()))
                }
            },
            None => Err((None, first.to_vec())),
        };
        (opened, client_done)
    });
    let (peer, flow, charge) = match opened {
        Ok(opened) => opened,
        Err((None, first)) => {
            PeerCounters::add(&counters.flows_unrouted, 1);
            fail(
                counters,
                &live,
                tcp,
                meta,
                first,
                "no peer's subnets hold the destination",
            )
            .await;
            return;
        }
        Err((Some(why), first)) => {
            over_limit(counters, &live, tcp, meta, first, why).await;
            return;
        }
    };
    debug!(flow = flow.id, %client, %server, dscp, peer = %peer.name, "intercepted; flow opened");
    if client_done {
        let _ = peer.finish(&flow);
    }
    let relay = Relay {
        peer,
        flow,
        tcp,
        idle_timeout: live.idle,
        stalled_timeout: live.stalled_flow_timeout,
        tcp_read_done: client_done,
        charge,
        blocks,
    };
    let id = relay.flow.id;
    let end = relay.run().await;
    log_end(id, client, server, end);
}

/// The first bytes as the flow's first block: compressed at the fast level as the sample of
/// the direction, unless they start with a TLS record (then raw).
fn first_block(blocks: &mut FlowBlocks, first: &[u8], peer: Option<&Peer>) -> Vec<u8> {
    let mut out = Vec::with_capacity(first.len() + pep_compress::ZSTD_HEADER);
    let Some(policy) = blocks.policy.as_mut() else {
        pep_compress::encode_block(first, None, &mut out);
        return out;
    };
    policy.first_bytes(first);
    let level = match policy.choose(pep_compress::Signals {
        link_bound: false,
        source_drained: true,
        link_bps: 0,
    }) {
        pep_compress::Choice::Zstd(level) => Some(level),
        pep_compress::Choice::Raw => None,
    };
    let started = std::time::Instant::now();
    let kind = pep_compress::encode_block(first, level, &mut out);
    let spent = started.elapsed().as_nanos() as u64;
    match level {
        Some(level) => policy.compressed(level, first.len(), out.len(), spent),
        None => policy.sent_raw(first.len()),
    }
    if let Some(peer) = peer {
        let c = &peer.counters.compression;
        PeerCounters::add(&c.plain_sent, first.len() as u64);
        PeerCounters::add(&c.blocks_sent, out.len() as u64);
        PeerCounters::add(&c.compress_ns, if level.is_some() { spent } else { 0 });
        PeerCounters::add(
            match (kind, level) {
                (pep_compress::BlockKind::Zstd, Some(pep_compress::Level::Hard)) => &c.sent_hard,
                (pep_compress::BlockKind::Zstd, _) => &c.sent_fast,
                (pep_compress::BlockKind::Raw, _) => &c.sent_raw,
            },
            1,
        );
    }
    out
}

async fn over_limit(
    counters: &GatewayCounters,
    live: &Live,
    tcp: tokio::net::TcpStream,
    meta: FlowMeta,
    first: Vec<u8>,
    why: OpenRefused,
) {
    match live.over_limit {
        OverLimit::Refuse => {
            PeerCounters::add(&counters.flows_refused, 1);
            warn!(client = %meta.client, server = %meta.server, ?why, "connection refused");
            abort_tcp(tcp);
        }
        OverLimit::Bypass => {
            PeerCounters::add(&counters.flows_bypassed, 1);
            debug!(client = %meta.client, server = %meta.server, ?why, "relayed unproxied");
            bypass::run(tcp, meta, first, &live.upstream).await;
        }
    }
}

/// A connection no peer takes follows `[rules] fail`, as if pepd were not there: routed
/// unproxied when open, refused when closed.
async fn fail(
    counters: &GatewayCounters,
    live: &Live,
    tcp: tokio::net::TcpStream,
    meta: FlowMeta,
    first: Vec<u8>,
    why: &'static str,
) {
    match live.fail {
        FailMode::Closed => {
            PeerCounters::add(&counters.flows_refused, 1);
            debug!(client = %meta.client, server = %meta.server, why, "connection refused");
            abort_tcp(tcp);
        }
        FailMode::Open => {
            PeerCounters::add(&counters.flows_bypassed, 1);
            debug!(client = %meta.client, server = %meta.server, why, "relayed unproxied");
            bypass::run(tcp, meta, first, &live.upstream).await;
        }
    }
}
