//! The seam where packet protection (AEAD) plugs in: the header stays in the clear, the
//! payload after it is sealed with the packet number as nonce and a tag is appended.

/// A datagram failed authentication or decryption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("packet failed authentication")]
pub struct OpenError;

/// Seals and opens packet payloads. `header_len` bytes at the front are authenticated but
/// not encrypted.
pub trait PacketProtection: Send {
    /// Bytes `seal` appends.
    fn tag_len(&self) -> usize;
    fn seal(&mut self, pn: u64, header_len: usize, packet: &mut Vec<u8>);
    /// Verifies and decrypts in place; returns the payload length without the tag.
    fn open(&mut self, pn: u64, header_len: usize, packet: &mut [u8]) -> Result<usize, OpenError>;
}

/// No protection (`security = "none"`): only for links already encrypted below us.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullProtection;

impl PacketProtection for NullProtection {
    fn tag_len(&self) -> usize {
        0
    }

    fn seal(&mut self, _pn: u64, _header_len: usize, _packet: &mut Vec<u8>) {}

    fn open(&mut self, _pn: u64, header_len: usize, packet: &mut [u8]) -> Result<usize, OpenError> {
        Ok(packet.len() - header_len)
    }
}
