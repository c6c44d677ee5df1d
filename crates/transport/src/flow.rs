//! Per-flow state held by the association: both stream halves plus the control-plane state
//! (open, reset, credit) of one proxied TCP connection.

use crate::frame::{FlowMeta, ResetReason};
use crate::stream::{RecvStream, SendStream};
use crate::traffic_class::{TrafficClassId, WriteTimes};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenState {
    /// Opened by the peer: nothing to send.
    Remote,
    /// Opened here, not yet sent.
    Pending,
    Sent,
    /// Sent and lost: resend the metadata.
    Lost,
    Acked,
}

#[derive(Debug, Clone, Copy)]
pub struct ResetState {
    pub reason: ResetReason,
    /// Our RESET (carrying our final offset) must be (re)sent.
    pub needs_send: bool,
    pub acked: bool,
    /// The peer's final offset, once its RESET arrived.
    pub peer_final: Option<u64>,
}

#[derive(Debug)]
pub struct Flow {
    /// `None` while data for a peer flow arrived before its FLOW_OPEN.
    pub meta: Option<FlowMeta>,
    pub open: OpenState,
    pub send: SendStream,
    pub recv: RecvStream,
    pub reset: Option<ResetState>,
    pub credit_dirty: bool,
    pub in_send_queue: bool,
    /// Stream bytes sent in this flow's current turn at the head of its class's queue.
    pub turn_bytes: usize,
    /// The traffic class whose turns it takes.
    pub class: TrafficClassId,
    /// When its unsent bytes were written (kept while traffic classes are configured).
    pub write_times: WriteTimes,
    pub in_control_queue: bool,
    pub readable_signaled: bool,
    pub write_blocked: bool,
    /// The application holds back writes until acknowledgements shrink what the flow
    /// buffers (its share of a memory budget the transport does not see).
    pub quota_blocked: bool,
    /// Since when the receive side has had a gap at an unchanged cumulative point.
    pub gap_since: Option<(u64, std::time::Instant)>,
    pub stream_snack_due: bool,
}

impl Flow {
    pub fn new(
        meta: Option<FlowMeta>,
        open: OpenState,
        send_credit: u64,
        send_buffer: u64,
        recv_window: u64,
    ) -> Self {
        Flow {
            meta,
            open,
            send: SendStream::new(send_credit, send_buffer),
            recv: RecvStream::new(recv_window),
            reset: None,
            credit_dirty: false,
            in_send_queue: false,
            turn_bytes: 0,
            class: 0,
            write_times: WriteTimes::default(),
            in_control_queue: false,
            readable_signaled: false,
            write_blocked: false,
            quota_blocked: false,
            gap_since: None,
            stream_snack_due: false,
        }
    }

    /// Nothing left to do in either direction: the state can be dropped.
    pub fn is_closed(&self) -> bool {
        if let Some(r) = self.reset {
            return r.acked && r.peer_final.is_some();
        }
        let open_done = matches!(self.open, OpenState::Remote | OpenState::Acked);
        open_done && self.send.is_done() && self.recv.fin_delivered()
    }
}
