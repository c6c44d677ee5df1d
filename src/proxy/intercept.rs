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
use crate::proxy::live::{self, Live, LiveRef};
use crate::proxy::relay::{abort_tcp, log_end, Relay};
use crate::proxy::tproxy::{self, Intercepted};
use crate::tunnel::gateway::{Gateway, GatewayCounters};
use crate::tunnel::peer::{OpenRefused, PeerCounters};

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
    let meta = FlowMeta {
        client,
        server,
        dscp,
    };
    let live = live::read(&ctx.live);
    let peer = ctx.gateway.route(server.ip());
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
        let opened = match peer {
            Some(peer) => match ctx.gateway.take_flow_slot() {
                Some(slot) => {
                    match peer.open_in_class(meta, ctx.gateway.classes.class_of(&meta), first) {
                        Ok((flow, charge)) => Ok((peer, flow, charge.with_slot(slot))),
                        Err(why) => Err((Some(why), first.to_vec())),
                    }
                }
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
    };
    let id = relay.flow.id;
    let end = relay.run().await;
    log_end(id, client, server, end);
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
