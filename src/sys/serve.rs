//! Serving a listener: each connection handled on a task of its own, at most a fixed number
//! at once, until a stop signal. Dropping the tasks on return aborts them, so a stopped
//! daemon answers no more; a failed accept (out of descriptors, typically) waits before the
//! next try instead of spinning.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::warn;

/// A listener whose connections [`serve`] hands out.
pub trait Listener {
    type Stream: Send + 'static;
    fn accept_one(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn accept_one(&self) -> io::Result<TcpStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    async fn accept_one(&self) -> io::Result<UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// Hands each connection of `listener` to `handle` on a task of its own, at most `max` at
/// once, until `stop` turns true or its sender goes. `what` names the service in logs.
pub async fn serve<L, H, F>(
    listener: L,
    max: usize,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
    handle: H,
) where
    L: Listener + Sync,
    H: Fn(L::Stream) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            Some(done) = conns.join_next() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        warn!(%e, "{what}: a connection's handler panicked");
                    }
                }
            }
            accepted = listener.accept_one(), if conns.len() < max => match accepted {
                Ok(stream) => {
                    conns.spawn(handle(stream));
                }
                Err(e) => {
                    warn!(%e, "{what}: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}
