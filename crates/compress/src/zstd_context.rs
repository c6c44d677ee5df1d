//! One zstd compression and one decompression context per thread, reused by every flow the
//! thread serves: a block is compressed in one call, so no flow keeps a context between
//! blocks, and 10,000 flows cost what the few threads' contexts cost.

use std::cell::RefCell;
use std::io;

use zstd::bulk::Compressor;
use zstd::zstd_safe::{get_error_name, DCtx};

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// Compresses `input` at zstd `level` into `out` (a slice of at most the room the caller
/// allows); `Err` when it does not fit, which means it did not shrink enough to be worth it.
pub(crate) fn compress(input: &[u8], level: i32, out: &mut [u8]) -> io::Result<usize> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.try_borrow_mut().map_err(io::Error::other)?;
        let c = match slot.as_mut() {
            Some(c) => c,
            None => {
                let mut c = Compressor::new(level)?;
                // Nothing in a block that the block format does not need: the content size
                // stays (the decoder checks it), no checksum (the AEAD covers the bytes), no
                // dictionary.
                c.include_checksum(false)?;
                c.include_dictid(false)?;
                c.include_contentsize(true)?;
                slot.insert(c)
            }
        };
        c.set_compression_level(level)?;
        c.compress_to_buffer(input, out)
    })
}

/// Decompresses `input` (one or more zstd frames) into `out`, which is exactly as long as
/// the content the block announced; returns the bytes written. Writing past `out` is an
/// error. One-shot decoding keeps its history in `out` itself: a frame's window allocates
/// nothing, whatever it declares.
pub(crate) fn decompress(input: &[u8], out: &mut [u8]) -> io::Result<usize> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.try_borrow_mut().map_err(io::Error::other)?;
        let d = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(DCtx::try_create().ok_or_else(|| io::Error::other("zstd"))?),
        };
        d.decompress(out, input).map_err(zstd_error)
    })
}

fn zstd_error(code: usize) -> io::Error {
    io::Error::other(get_error_name(code))
}

/// Bytes this thread's contexts hold now (after use at the levels pepd uses: what
/// `config::budget` counts per runtime thread).
pub fn context_bytes() -> usize {
    let c = COMPRESSOR.with(|cell| {
        cell.try_borrow_mut()
            .ok()
            .and_then(|mut s| s.as_mut().map(|c| c.context_mut().sizeof()))
            .unwrap_or(0)
    });
    let d = DECOMPRESSOR.with(|cell| {
        cell.try_borrow()
            .ok()
            .and_then(|s| s.as_ref().map(DCtx::sizeof))
            .unwrap_or(0)
    });
    c + d
}

#[cfg(test)]
mod tests {
    use crate::block::{encode_block, Level};
    use crate::Decoder;

    #[test]
    fn contexts_after_blocks_at_every_level() {
        let data: Vec<u8> = (0..1u32 << 17).map(|i| (i * 7 % 253) as u8).collect();
        let mut stream = Vec::new();
        for level in Level::ALL {
            encode_block(&data, Some(level), &mut stream);
        }
        let mut d = Decoder::new(1 << 17);
        d.feed(bytes::Bytes::from(stream), &mut |_| {}).unwrap();
        let bytes = super::context_bytes();
        println!("zstd contexts of one thread: {bytes} bytes");
        assert!(bytes > 0 && bytes <= 4 << 20, "{bytes}");
    }
}
