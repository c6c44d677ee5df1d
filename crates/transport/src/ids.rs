//! Identifiers the protocol hands out: connection IDs on the wire, flow ids inside an
//! association, and the ids an endpoint gives its configured peers. Kept apart from the
//! modules that use them so each can name an id without importing another's machinery.

use crate::codec::{DecodeError, Reader};

/// Identifies a flow within an association. Even ids are opened by the initiator role, odd by
/// the responder, so both sides can open flows without coordination.
pub type FlowId = u64;

/// A configured peer, named by the caller: it keeps its id while it stays configured, and a
/// removed peer's id is never given to another, so nothing keyed by it shifts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// Longest connection ID the wire format can carry.
pub const MAX_CID_LEN: usize = 8;

/// A connection ID: chosen by the receiver of the packets that carry it, so it can find the
/// association before it knows the sender. Zero bytes at a gateway with one peer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnectionId {
    len: u8,
    bytes: [u8; MAX_CID_LEN],
}

impl ConnectionId {
    pub const EMPTY: ConnectionId = ConnectionId {
        len: 0,
        bytes: [0; MAX_CID_LEN],
    };

    /// `None` if `bytes` is longer than [`MAX_CID_LEN`].
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let mut cid = ConnectionId::EMPTY;
        cid.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        cid.len = bytes.len() as u8;
        Some(cid)
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads a connection ID of a length the reader already knows (a short header's DCID).
    pub fn read(r: &mut Reader<'_>, len: usize) -> Result<Self, DecodeError> {
        if len > MAX_CID_LEN {
            return Err(DecodeError::Invalid("connection ID too long"));
        }
        ConnectionId::new(r.bytes(len)?).ok_or(DecodeError::Invalid("connection ID too long"))
    }

    /// Reads a length-prefixed connection ID (HELLO, INIT).
    pub fn read_prefixed(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.u8()?);
        Self::read(r, len)
    }

    pub fn write_prefixed(&self, out: &mut Vec<u8>) {
        out.push(self.len);
        out.extend_from_slice(self.as_slice());
    }
}

impl std::fmt::Debug for ConnectionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cid:")?;
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}
