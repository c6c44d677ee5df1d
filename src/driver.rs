//! Drives the sans-IO association: feeds it datagrams from the tunnel socket and timer
//! expiries, sends what it produces, and hands its events to the relays.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use pep_transport::{Event, FlowMeta};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::link::{FlowRef, LinkCounters, PeerLink};
use crate::metrics::AssociationState;
use crate::notify::Notifier;

/// Datagrams taken from the socket, or produced, per pass under one lock.
const BATCH: usize = 64;

/// Largest datagram read; longer ones are truncated by the kernel and then fail to parse.
const RECV_BUF: usize = 65_536;

/// Opens the local end of a flow the peer started (connect upstream and relay). Called with
/// no lock held, so it may use the link (reset the flow) right away.
pub trait FlowAcceptor: Send + Sync + 'static {
    fn accept(&self, link: Arc<PeerLink>, flow: FlowRef, meta: FlowMeta);
}

/// Flows the peer opened, collected under the link lock and accepted once it is released.
type Accepts = Vec<(FlowRef, FlowMeta)>;

pub struct Driver {
    pub link: Arc<PeerLink>,
    pub socket: UdpSocket,
    pub peer: SocketAddr,
    pub acceptor: Arc<dyn FlowAcceptor>,
    pub notifier: Notifier,
}

impl Driver {
    /// Runs until `stop` turns true, then closes the association with one CLOSE.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> io::Result<()> {
        let mut rx: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; RECV_BUF]).collect();
        let mut rx_lens: Vec<usize> = Vec::with_capacity(BATCH);
        let mut tx: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut drop_log = crate::droplog::DropLog::default();
        let mut accepts: Accepts = Vec::new();
        loop {
            let deadline = self.link.lock().assoc.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.socket.readable() => r?,
                _ = self.link.driver_wake.notified() => {}
                _ = sleep => {}
                _ = stop.changed() => {
                    if *stop.borrow() {
                        self.close(&mut tx).await;
                        return Ok(());
                    }
                }
            }
            rx_lens.clear();
            while rx_lens.len() < BATCH {
                let buf = &mut rx[rx_lens.len()];
                match self.socket.try_recv_from(buf) {
                    Ok((n, from)) if from == self.peer => rx_lens.push(n),
                    Ok((_, from)) => {
                        LinkCounters::add(&self.link.counters.foreign_datagrams, 1);
                        debug!(%from, "datagram from an address that is not the peer dropped");
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ICMP errors (peer port unreachable) surface here; the transport's
                    // own timers deal with an unreachable peer.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                    Err(e) => return Err(e),
                }
            }
            let more = {
                let now = Instant::now();
                let link = self.link.clone();
                let mut st = link.lock();
                for (buf, &n) in rx.iter().zip(&rx_lens) {
                    st.assoc.handle_datagram(now, &buf[..n]);
                }
                if drop_log.is_due(now) {
                    let foreign = self.link.counters.foreign_datagrams.load(Ordering::Relaxed);
                    if let Some(s) = drop_log.summary(now, &st.assoc.stats(), foreign) {
                        warn!("dropped datagrams: {s}");
                    }
                }
                if st.assoc.poll_timeout().is_some_and(|t| t <= now) {
                    st.assoc.handle_timeout(now);
                }
                let mut more = false;
                loop {
                    if tx.len() == BATCH {
                        more = true;
                        break;
                    }
                    let mut buf = spare.pop().unwrap_or_default();
                    if !st.assoc.poll_transmit(now, &mut buf) {
                        spare.push(buf);
                        break;
                    }
                    tx.push(buf);
                }
                while let Some(ev) = st.assoc.poll_event() {
                    self.dispatch(&mut st, ev, &mut accepts);
                }
                st.wake_budget_waiters(self.link.send_budget(), crate::relay::CHUNK as u64);
                more || rx_lens.len() == BATCH
            };
            self.accept_all(&mut accepts);
            self.send_all(&mut tx, &mut spare).await?;
            if more {
                self.link.driver_wake.notify_one();
            }
        }
    }

    async fn send_all(&self, tx: &mut Vec<Vec<u8>>, spare: &mut Vec<Vec<u8>>) -> io::Result<()> {
        for buf in tx.drain(..) {
            loop {
                match self.socket.try_send_to(&buf, self.peer) {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.socket.writable().await?;
                    }
                    // A full device queue or an ICMP error from an earlier datagram: the
                    // datagram is lost like on the link, and recovery repairs it.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(nix::libc::ENOBUFS)
                                | Some(nix::libc::ECONNREFUSED)
                                | Some(nix::libc::EHOSTUNREACH)
                                | Some(nix::libc::ENETUNREACH)
                        ) =>
                    {
                        break
                    }
                    Err(e) => return Err(e),
                }
            }
            spare.push(buf);
        }
        Ok(())
    }

    fn accept_all(&self, accepts: &mut Accepts) {
        for (flow, meta) in accepts.drain(..) {
            self.acceptor.accept(self.link.clone(), flow, meta);
        }
    }

    fn dispatch(&self, st: &mut crate::link::LinkState, ev: Event, accepts: &mut Accepts) {
        match ev {
            Event::Established => {
                let c = &self.link.counters;
                LinkCounters::add(&c.associations_established, 1);
                c.set_state(AssociationState::Established);
                let rtt = st.assoc.stats().rtt_smoothed;
                info!(peer = %self.peer, ?rtt, "association established");
                self.notifier
                    .status(&format!("association established with {}", self.peer));
            }
            Event::PeerRestarted => {
                self.link.counters.set_state(AssociationState::Connecting);
                warn!(peer = %self.peer, "peer gateway restarted; its flows were reset");
            }
            Event::FlowOpened { flow, meta } => {
                debug!(flow, client = %meta.client, server = %meta.server, "flow opened by peer");
                LinkCounters::add(&self.link.counters.flows_from_peer, 1);
                accepts.push((st.insert_slot(flow), meta));
            }
            Event::FlowReadable { flow } | Event::FlowWritable { flow } => st.signal_flow(flow),
            Event::FlowReset { flow, reason } => {
                debug!(flow, ?reason, "flow reset");
                self.link.counters.flow_resets.add(reason);
                st.flow_reset(flow, reason);
            }
            Event::FlowClosed { flow } => st.flow_closed(flow),
            Event::OutageStarted => {
                self.link.counters.set_state(AssociationState::Outage);
                warn!(peer = %self.peer, "satellite link outage: no answer from the peer");
                self.notifier.status("link outage");
            }
            Event::OutageEnded { duration } => {
                self.link.counters.set_state(AssociationState::Established);
                info!(?duration, "satellite link back");
                self.notifier
                    .status(&format!("association established with {}", self.peer));
            }
            Event::AssociationLost { reason } => {
                self.link.counters.set_state(AssociationState::Connecting);
                warn!(
                    ?reason,
                    "association lost; every flow was reset; re-establishing"
                );
                self.notifier
                    .status(&format!("association down ({reason:?}), re-establishing"));
            }
        }
    }

    /// Tells the peer we are going (one best-effort CLOSE).
    async fn close(&mut self, tx: &mut Vec<Vec<u8>>) {
        let mut accepts = Accepts::new();
        {
            let now = Instant::now();
            let link = self.link.clone();
            let mut st = link.lock();
            st.assoc.close(0, "gateway shutting down");
            // Only the CLOSE: the HELLO of the fresh epoch that would follow it must not
            // reach the peer from a gateway that is going away.
            let mut buf = Vec::new();
            if st.assoc.poll_transmit(now, &mut buf) {
                tx.push(buf);
            }
            while let Some(ev) = st.assoc.poll_event() {
                self.dispatch(&mut st, ev, &mut accepts);
            }
        }
        self.accept_all(&mut accepts);
        let mut spare = Vec::new();
        let _ = self.send_all(tx, &mut spare).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use pep_transport::{Association, Config, ResetReason, Role};

    use super::*;
    use std::sync::Mutex;

    /// Resets every flow the peer opens from inside `accept`, which takes the link lock.
    struct ResettingAcceptor {
        accepted: Mutex<mpsc::Sender<FlowMeta>>,
    }

    impl FlowAcceptor for ResettingAcceptor {
        fn accept(&self, link: Arc<PeerLink>, flow: FlowRef, meta: FlowMeta) {
            link.reset(&flow, ResetReason::Refused);
            let _ = self
                .accepted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(meta);
        }
    }

    fn meta() -> FlowMeta {
        FlowMeta {
            client: SocketAddr::from(([198, 18, 0, 2], 40000)),
            server: SocketAddr::from(([198, 18, 1, 2], 80)),
            dscp: 0,
        }
    }

    #[test]
    fn accept_may_take_the_link_lock() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let theirs = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        theirs
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let (accepted_tx, accepted) = mpsc::channel();
        let (stop, stop_rx) = watch::channel(false);
        let cfg = Config::for_rate(10_000_000);
        let ours = rt.block_on(async {
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let ours = socket.local_addr().unwrap();
            let assoc = Association::new(cfg.clone(), Role::Responder, 1, Instant::now()).unwrap();
            let driver = Driver {
                link: Arc::new(PeerLink::new(assoc, 1 << 20)),
                socket,
                peer: theirs.local_addr().unwrap(),
                acceptor: Arc::new(ResettingAcceptor {
                    accepted: Mutex::new(accepted_tx),
                }),
                notifier: Notifier,
            };
            tokio::spawn(driver.run(stop_rx));
            ours
        });

        let mut peer = Association::new(cfg, Role::Initiator, 2, Instant::now()).unwrap();
        let flow = peer.open_flow(meta()).unwrap();
        peer.write(flow, b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = vec![0u8; 65_536];
        let mut out = Vec::new();
        let mut got = None;
        let mut reset = None;
        while Instant::now() < deadline && (got.is_none() || reset.is_none()) {
            let now = Instant::now();
            if peer.poll_timeout().is_some_and(|t| t <= now) {
                peer.handle_timeout(now);
            }
            while peer.poll_transmit(now, &mut out) {
                theirs.send_to(&out, ours).unwrap();
            }
            if let Ok((n, _)) = theirs.recv_from(&mut buf) {
                peer.handle_datagram(Instant::now(), &buf[..n]);
            }
            while let Some(ev) = peer.poll_event() {
                if let Event::FlowReset { flow: f, reason } = ev {
                    assert_eq!(f, flow);
                    reset = Some(reason);
                }
            }
            if let Ok(m) = accepted.try_recv() {
                got = Some(m);
            }
        }
        let _ = stop.send(true);
        rt.shutdown_timeout(Duration::from_secs(1));
        assert_eq!(got, Some(meta()), "the acceptor ran within 5 s");
        assert_eq!(
            reset,
            Some(ResetReason::Refused),
            "its reset reached the peer"
        );
    }
}
