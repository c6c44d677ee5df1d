//! Whether the flows of an association may carry compressed blocks, and with which limits:
//! each gateway that can decompress offers it in its HELLO, and both compute the same
//! agreement from the two offers (docs/PROTOCOL.md §3.2 and §9). The blocks themselves are
//! the gateways' business (pepd's relays), not the transport's: it only carries the offers
//! and each flow's `FlowMeta::compression` bit.

use std::fmt;

use crate::codec::{DecodeError, Reader};

/// Most algorithm identifiers an offer carries; longer offers are malformed.
pub const MAX_ALGORITHMS: usize = 8;

/// Identifier of zstd (RFC 8878) in an offer.
pub const ID_ZSTD: u8 = 1;

/// The least and greatest block size (log2 of the bytes one block may decompress to) an
/// offer may state: 1 KiB to 1 GiB. Anything outside is malformed.
pub const MIN_BLOCK_LOG: u8 = 10;
pub const MAX_BLOCK_LOG: u8 = 30;

/// A compression algorithm both sides may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Zstd,
}

impl Algorithm {
    pub fn id(self) -> u8 {
        match self {
            Algorithm::Zstd => ID_ZSTD,
        }
    }

    fn from_id(id: u8) -> Option<Self> {
        match id {
            ID_ZSTD => Some(Algorithm::Zstd),
            _ => None,
        }
    }

    /// The name used in configuration and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Zstd => "zstd",
        }
    }
}

/// What a HELLO's sender can decompress: algorithms, most preferred first (identifiers this
/// build does not know are kept and never chosen), and the largest block it takes, as the
/// log2 of the bytes one block may decompress to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CompressionOffer {
    ids: [u8; MAX_ALGORITHMS],
    len: u8,
    block_log: u8,
}

impl CompressionOffer {
    /// zstd alone, with blocks of up to `2^block_log` bytes (clamped to the legal range).
    pub fn zstd(block_log: u8) -> Self {
        let mut ids = [0; MAX_ALGORITHMS];
        ids[0] = ID_ZSTD;
        CompressionOffer {
            ids,
            len: 1,
            block_log: block_log.clamp(MIN_BLOCK_LOG, MAX_BLOCK_LOG),
        }
    }

    fn ids(&self) -> &[u8] {
        &self.ids[..usize::from(self.len)]
    }

    pub fn block_log(&self) -> u8 {
        self.block_log
    }

    /// `u8 count | count × u8 identifier | u8 block log`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.len);
        out.extend_from_slice(self.ids());
        out.push(self.block_log);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.u8()?);
        if len == 0 || len > MAX_ALGORITHMS {
            return Err(DecodeError::Invalid("compression offer length"));
        }
        let mut ids = [0u8; MAX_ALGORITHMS];
        for slot in &mut ids[..len] {
            *slot = r.u8()?;
        }
        let block_log = r.u8()?;
        if !(MIN_BLOCK_LOG..=MAX_BLOCK_LOG).contains(&block_log) {
            return Err(DecodeError::Invalid("compression block size"));
        }
        Ok(CompressionOffer {
            ids,
            len: len as u8,
            block_log,
        })
    }

    fn rank(&self, a: Algorithm) -> Option<usize> {
        self.ids().iter().position(|&id| id == a.id())
    }
}

impl fmt::Debug for CompressionOffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for &id in self.ids() {
            match Algorithm::from_id(id) {
                Some(a) => l.entry(&a.name()),
                None => l.entry(&id),
            };
        }
        l.entry(&format_args!("block 2^{}", self.block_log));
        l.finish()
    }
}

/// What two offers settle on: the flows of the association may carry blocks of this
/// algorithm, none decompressing to more than `max_block` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Compression {
    pub algorithm: Algorithm,
    /// Bytes one block may decompress to at most: the smaller of the two offers'.
    pub max_block: usize,
}

/// The agreement of two offers, the same whichever side computes it: of the algorithms in
/// both, the one with the lowest sum of its ranks (ties to the lower identifier), and the
/// smaller block size. `None` when either side offers nothing or they share no algorithm.
pub fn negotiate(
    ours: Option<&CompressionOffer>,
    theirs: Option<&CompressionOffer>,
) -> Option<Compression> {
    let (ours, theirs) = (ours?, theirs?);
    // Listed in tie-break order (lowest identifier first).
    let algorithm = [Algorithm::Zstd]
        .into_iter()
        .filter_map(|a| Some((ours.rank(a)? + theirs.rank(a)?, a)))
        .min_by_key(|&(rank, _)| rank)
        .map(|(_, a)| a)?;
    let log = ours.block_log.min(theirs.block_log);
    Some(Compression {
        algorithm,
        max_block: 1usize << log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_agree_on_the_smaller_block_and_a_common_algorithm() {
        let a = CompressionOffer::zstd(17);
        let b = CompressionOffer::zstd(16);
        let agreed = Some(Compression {
            algorithm: Algorithm::Zstd,
            max_block: 1 << 16,
        });
        assert_eq!(negotiate(Some(&a), Some(&b)), agreed);
        assert_eq!(negotiate(Some(&b), Some(&a)), agreed);
        // A peer without an offer (it cannot decompress, or predates compression).
        assert_eq!(negotiate(Some(&a), None), None);
        assert_eq!(negotiate(None, Some(&a)), None);
        // Only algorithms this build does not know: nothing in common.
        let unknown = CompressionOffer::decode(&mut Reader::new(&[2, 9, 7, 17])).unwrap();
        assert_eq!(negotiate(Some(&a), Some(&unknown)), None);
        let newer = CompressionOffer::decode(&mut Reader::new(&[2, 9, ID_ZSTD, 20])).unwrap();
        assert_eq!(
            negotiate(Some(&newer), Some(&a)),
            negotiate(Some(&a), Some(&newer))
        );
        assert_eq!(
            negotiate(Some(&a), Some(&newer)).map(|c| c.max_block),
            Some(1 << 17)
        );
        assert_eq!(format!("{newer:?}"), r#"[9, "zstd", block 2^20]"#);
    }

    #[test]
    fn encoding_and_malformed_offers() {
        let mut out = Vec::new();
        CompressionOffer::zstd(17).encode(&mut out);
        assert_eq!(out, [1, ID_ZSTD, 17]);
        assert_eq!(
            CompressionOffer::decode(&mut Reader::new(&out)),
            Ok(CompressionOffer::zstd(17))
        );
        for bad in [
            &[0, 17][..],
            &[9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 17],
            &[1, ID_ZSTD],
            &[1, ID_ZSTD, MIN_BLOCK_LOG - 1],
            &[1, ID_ZSTD, MAX_BLOCK_LOG + 1],
        ] {
            assert!(
                CompressionOffer::decode(&mut Reader::new(bad)).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(CompressionOffer::zstd(40).block_log(), MAX_BLOCK_LOG);
    }
}
