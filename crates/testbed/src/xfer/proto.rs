//! The traffic tool's per-connection header: the client says what it wants, the server obeys.
//! Fixed 40 bytes, big-endian: magic, op, seed, upload bytes, download bytes, duration, pace.

use std::io::{self, Read};

use super::pattern::Digest;

const MAGIC: u32 = 0x5054_4258; // "PTBX"
pub const HEADER_LEN: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Client sends `up` bytes (or until EOF when 0); server answers with a [`Report`].
    Upload = 1,
    /// Server sends `down` bytes, or for `duration_ms` when non-zero, then closes.
    Download = 2,
    /// Repeated requests, each `[req_len u32][resp_len u32]` + req_len bytes; server answers
    /// resp_len bytes; ends at client EOF.
    Rr = 3,
    /// Client sends `up` bytes and shuts down its write side; after EOF the server sends
    /// `down` bytes and closes.
    HalfClose = 4,
    /// Both at once: the client sends `up` bytes and shuts down its write side while the
    /// server sends `down` bytes; after both the server answers with a [`Report`] on the
    /// upload and closes.
    Bidir = 5,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub seed: u64,
    pub up: u64,
    pub down: u64,
    pub duration_ms: u32,
    /// Download: the rate the server paces its sending at, in kbit/s (0: as fast as the
    /// connection takes it).
    pub pace_kbps: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4] = self.op as u8;
        b[8..16].copy_from_slice(&self.seed.to_be_bytes());
        b[16..24].copy_from_slice(&self.up.to_be_bytes());
        b[24..32].copy_from_slice(&self.down.to_be_bytes());
        b[32..36].copy_from_slice(&self.duration_ms.to_be_bytes());
        b[36..40].copy_from_slice(&self.pace_kbps.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> io::Result<Header> {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        let bad = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        if b[0..4] != MAGIC.to_be_bytes() {
            return Err(bad("not a pep-testbed xfer client"));
        }
        let op = match b[4] {
            1 => Op::Upload,
            2 => Op::Download,
            3 => Op::Rr,
            4 => Op::HalfClose,
            5 => Op::Bidir,
            _ => return Err(bad("unknown op")),
        };
        Ok(Header {
            op,
            seed: u64_at(8),
            up: u64_at(16),
            down: u64_at(24),
            duration_ms: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
            pace_kbps: u32::from_be_bytes([b[36], b[37], b[38], b[39]]),
        })
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Header> {
        let mut b = [0u8; HEADER_LEN];
        r.read_exact(&mut b)?;
        Header::decode(&b)
    }
}

/// Server's verdict on an upload: bytes received, whether they were all intact, and the
/// digest of what it received.
pub const REPORT_LEN: usize = 17;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub received: u64,
    pub intact: bool,
    pub digest: Digest,
}

pub fn encode_report(r: &Report) -> [u8; REPORT_LEN] {
    let mut b = [0u8; REPORT_LEN];
    b[..8].copy_from_slice(&r.received.to_be_bytes());
    b[8] = r.intact as u8;
    b[9..17].copy_from_slice(&r.digest.value().to_be_bytes());
    b
}

pub fn decode_report(b: &[u8; REPORT_LEN]) -> Report {
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_be_bytes(a)
    };
    Report {
        received: u64_at(0),
        intact: b[8] == 1,
        digest: Digest::from_value(u64_at(9)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            op: Op::HalfClose,
            seed: 42,
            up: 1 << 40,
            down: 7,
            duration_ms: 1500,
            pace_kbps: 4000,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut junk = h.encode();
        junk[0] = 0;
        assert!(Header::decode(&junk).is_err());
        let mut d = Digest::default();
        d.update(b"xyz");
        let r = Report {
            received: 123_456_789,
            intact: true,
            digest: d,
        };
        assert_eq!(decode_report(&encode_report(&r)), r);
    }
}
