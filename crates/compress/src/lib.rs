//! pep-compress: payload compression on the satellite hop. A flow whose association agreed on
//! compression carries, in each direction, a sequence of **blocks**: each says whether it is
//! raw or zstd-compressed and how long it is, so data that does not shrink goes as it is
//! (docs/PROTOCOL.md §9). This crate owns that format: building blocks ([`block`]), reading
//! a peer's blocks as the hostile input they may be ([`decoder`]), and deciding per block
//! whether and how hard to compress ([`policy`]). It does no I/O; pepd's relays drive it.

pub mod block;
pub mod decoder;
pub mod policy;
mod zstd_context;

pub use block::{
    encode_block, offline_ratio, BlockKind, Level, MAX_RATIO, RAW_HEADER, ZSTD_HEADER,
};
pub use decoder::{BlockError, Decoder};
pub use policy::{Choice, Policy, Signals};
pub use zstd_context::context_bytes;

/// The largest block pepd offers to take (log2 of the bytes a block decompresses to):
/// 128 KiB. Larger blocks compress text a little better (256 KiB: +6 % at zstd level 6 on
/// the testbed's corpus) but hold twice as much per flow and keep the first bytes of a block
/// waiting for the rest.
pub const OFFERED_BLOCK_LOG: u8 = 17;
