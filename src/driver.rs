//! Drives the sans-IO association: feeds it datagrams from the tunnel socket and timer
//! expiries, sends what it produces, and hands its events to the relays.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use pep_transport::{Event, FlowMeta, ResetReason};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::hub::{Counters, FlowRef, Hub};
use crate::memory::FlowCharge;
use crate::metrics::AssociationState;
use crate::notify::Notifier;

/// Datagrams taken from the socket, or produced, per pass under one lock.
pub const BATCH: usize = 64;

/// Largest datagram read; longer ones are truncated by the kernel and then fail to parse.
pub const RECV_BUF: usize = 65_536;

/// Opens the local end of a flow the peer started (connect upstream and relay).
pub trait FlowAcceptor: Send + Sync + 'static {
    /// `charge` counts the flow against the memory budget; the relay keeps it to its end.
    fn accept(&self, hub: Arc<Hub>, flow: FlowRef, meta: FlowMeta, charge: FlowCharge);
}

pub struct Driver {
    pub hub: Arc<Hub>,
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
        loop {
            let deadline = self.hub.lock().assoc.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.socket.readable() => r?,
                _ = self.hub.driver_wake.notified() => {}
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
                        Counters::add(&self.hub.counters.foreign_datagrams, 1);
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
                let hub = self.hub.clone();
                let mut st = hub.lock();
                for (buf, &n) in rx.iter().zip(&rx_lens) {
                    st.assoc.handle_datagram(now, &buf[..n]);
                }
                if drop_log.is_due(now) {
                    let foreign = self.hub.counters.foreign_datagrams.load(Ordering::Relaxed);
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
                    self.dispatch(&mut st, ev);
                }
                st.wake_budget_waiters(&self.hub.memory, crate::relay::CHUNK as u64);
                more || rx_lens.len() == BATCH
            };
            self.send_all(&mut tx, &mut spare).await?;
            if more {
                self.hub.driver_wake.notify_one();
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

    fn dispatch(&self, st: &mut crate::hub::State, ev: Event) {
        match ev {
            Event::Established => {
                let c = &self.hub.counters;
                Counters::add(&c.associations_established, 1);
                c.set_state(AssociationState::Established);
                let rtt = st.assoc.stats().rtt_smoothed;
                info!(peer = %self.peer, ?rtt, "association established");
                self.notifier
                    .status(&format!("association established with {}", self.peer));
            }
            Event::PeerRestarted => {
                self.hub.counters.set_state(AssociationState::Connecting);
                warn!(peer = %self.peer, "peer gateway restarted; its flows were reset");
            }
            Event::FlowOpened { flow, meta } => {
                debug!(flow, client = %meta.client, server = %meta.server, "flow opened by peer");
                Counters::add(&self.hub.counters.flows_from_peer, 1);
                if !st.admits_peer_flow(&self.hub.memory) {
                    // The peer's client gets the reset, as it would from a full `max_flows`.
                    debug!(flow, "memory budget reached; flow refused");
                    if st.assoc.reset(flow, ResetReason::ResourceLimit).is_ok() {
                        self.hub
                            .counters
                            .flow_resets
                            .add(ResetReason::ResourceLimit);
                    }
                    return;
                }
                let r = st.insert_slot(flow);
                let charge = self.hub.charge_flow();
                self.acceptor.accept(self.hub.clone(), r, meta, charge);
            }
            Event::FlowReadable { flow } | Event::FlowWritable { flow } => st.signal_flow(flow),
            Event::FlowReset { flow, reason } => {
                debug!(flow, ?reason, "flow reset");
                self.hub.counters.flow_resets.add(reason);
                st.flow_reset(flow, reason);
            }
            Event::FlowClosed { flow } => st.flow_closed(flow),
            Event::OutageStarted => {
                self.hub.counters.set_state(AssociationState::Outage);
                warn!(peer = %self.peer, "satellite link outage: no answer from the peer");
                self.notifier.status("link outage");
            }
            Event::OutageEnded { duration } => {
                self.hub.counters.set_state(AssociationState::Established);
                info!(?duration, "satellite link back");
                self.notifier
                    .status(&format!("association established with {}", self.peer));
            }
            Event::AssociationLost { reason } => {
                self.hub.counters.set_state(AssociationState::Connecting);
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
        {
            let now = Instant::now();
            let hub = self.hub.clone();
            let mut st = hub.lock();
            st.assoc.close(0, "gateway shutting down");
            // Only the CLOSE: the HELLO of the fresh epoch that would follow it must not
            // reach the peer from a gateway that is going away.
            let mut buf = Vec::new();
            if st.assoc.poll_transmit(now, &mut buf) {
                tx.push(buf);
            }
            while let Some(ev) = st.assoc.poll_event() {
                self.dispatch(&mut st, ev);
            }
        }
        let mut spare = Vec::new();
        let _ = self.send_all(tx, &mut spare).await;
    }
}
