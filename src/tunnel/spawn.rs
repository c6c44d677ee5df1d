//! The tunnel's workers started: a driver per worker on its socket, the first on the
//! daemon's runtime when it is the only one, the others each on a thread of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::sys::notify::Notifier;
use crate::tunnel::driver::{Driver, FlowAcceptor, TunnelSocket};
use crate::tunnel::gateway::Gateway;

/// Starts a driver per worker, each on its socket (one per worker, see `tunnel_sockets`),
/// from the daemon's runtime: tasks that end with them.
pub fn start_drivers(
    tunnel: crate::tunnel::setup::Tunnel,
    sockets: Vec<std::net::UdpSocket>,
    acceptor: Arc<dyn FlowAcceptor>,
    notifier: Notifier,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<std::io::Result<()>>>> {
    let workers = sockets.len();
    let mut tasks = Vec::with_capacity(workers);
    for (worker, (socket, shard)) in sockets.into_iter().zip(tunnel.shards).enumerate() {
        let parts = DriverParts {
            gateway: tunnel.gateway.clone(),
            worker,
            shard,
            factory: tunnel.factory.clone(),
            allowed: tunnel.allowed.clone(),
            acceptor: acceptor.clone(),
            notifier,
        };
        let task = if workers == 1 {
            // The pair (and a single worker) runs on the daemon's runtime as always.
            let socket = TunnelSocket::new(UdpSocket::from_std(socket)?)?;
            tokio::spawn(parts.driver(socket).run(stop.clone()))
        } else {
            spawn_worker(parts, socket, stop.clone())
                .with_context(|| format!("starting tunnel worker {worker}"))?
        };
        tasks.push(task);
    }
    Ok(tasks)
}

/// What one worker's driver is made of, but its socket.
struct DriverParts {
    gateway: Arc<Gateway>,
    worker: usize,
    shard: crate::tunnel::setup::Shard,
    factory: crate::tunnel::driver::AssocFactory,
    allowed: Option<std::collections::HashSet<SocketAddr>>,
    acceptor: Arc<dyn FlowAcceptor>,
    notifier: Notifier,
}

impl DriverParts {
    fn driver(self, socket: TunnelSocket) -> Driver {
        Driver::new(
            self.gateway,
            self.worker,
            socket,
            self.shard.endpoint,
            self.factory,
            self.allowed,
            self.acceptor,
            self.notifier,
        )
        .with_share(self.shard.share)
    }
}

/// Runs a worker's driver on a thread of its own, on a current-thread runtime: its socket,
/// endpoint and associations are that thread's alone, and it shares nothing with the
/// relays' runtime but the peers' locks and wake-ups. The task returned ends with it.
fn spawn_worker(
    parts: DriverParts,
    socket: std::net::UdpSocket,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let worker = parts.worker;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let driver = {
        // The socket registers with the reactor of the runtime it is made in.
        let _in_worker = rt.enter();
        parts.driver(TunnelSocket::new(UdpSocket::from_std(socket)?)?)
    };
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("pepd-worker-{worker}"))
        .spawn(move || {
            let _ = done.send(rt.block_on(driver.run(stop)));
        })?;
    Ok(tokio::spawn(async move {
        result.await.unwrap_or_else(|_| {
            Err(std::io::Error::other(format!(
                "tunnel worker {worker} panicked"
            )))
        })
    }))
}
