//! A relay's side of a flow whose streams are compression blocks (docs/PROTOCOL.md §9):
//! which flows this gateway compresses (`transport.compression` and where it applies), and
//! per flow the policy of the direction it sends and the decoder of the one it receives.
//! The block format, the decoder and the policy are pep-compress's; this is the glue.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;

use ipnet::IpNet;
use pep_compress::{Decoder, Policy};

use crate::config::{CompressionMode, PepdConfig};

/// Where `transport.compression = "auto"` compresses: flows to these server ports and
/// prefixes (an empty list: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    ports: Vec<u16>,
    prefixes: Vec<IpNet>,
}

impl Scope {
    /// `None` with compression off.
    pub fn from_config(cfg: &PepdConfig) -> Option<Arc<Scope>> {
        let t = &cfg.transport;
        match t.compression {
            CompressionMode::Off => None,
            CompressionMode::Auto => Some(Arc::new(Scope {
                ports: t.compression_ports.clone(),
                prefixes: t.compression_prefixes.clone(),
            })),
        }
    }

    /// Whether flows to `server` are compressed.
    pub fn applies(&self, server: SocketAddr) -> bool {
        (self.ports.is_empty() || self.ports.contains(&server.port()))
            && (self.prefixes.is_empty() || self.prefixes.iter().any(|p| p.contains(&server.ip())))
    }
}

/// One flow's blocks at this gateway: the policy of the direction it sends, the decoder of
/// the one it receives.
pub struct FlowBlocks {
    /// The agreed largest block.
    pub max_block: usize,
    /// `None`: this gateway sends every block raw (the flow is outside its scope, or
    /// compression is off here while the peer compresses).
    pub policy: Option<Policy>,
    pub decoder: Decoder,
    /// The block in progress that the flow had no room for yet.
    pub backlog: Vec<u8>,
    /// The application's data ran out before the last block was full.
    pub source_drained: bool,
    /// TCP sent FIN; the flow is finished once the backlog is written.
    pub fin_after_backlog: bool,
}

impl FlowBlocks {
    pub fn new(max_block: usize, compress: bool) -> FlowBlocks {
        FlowBlocks {
            max_block,
            policy: compress.then(Policy::new),
            decoder: Decoder::new(max_block),
            backlog: Vec::new(),
            source_drained: true,
            fin_after_backlog: false,
        }
    }
}

thread_local! {
    /// The raw bytes of the block being built and the block itself, one pair per runtime
    /// thread (as `scratch`): a block is read, compressed and handed to its flow without an
    /// await, so no relay keeps them.
    static BLOCK_BUFFERS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on this thread's block buffers: the input of `len` bytes (initialised) and an
/// empty output.
pub fn with_block_buffers<R>(len: usize, f: impl FnOnce(&mut [u8], &mut Vec<u8>) -> R) -> R {
    BLOCK_BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let (input, output) = &mut *bufs;
            if input.len() < len {
                input.resize(len, 0);
            }
            output.clear();
            f(&mut input[..len], output)
        }
        Err(_) => f(&mut vec![0u8; len], &mut Vec::new()),
    })
}

#[cfg(test)]
mod tests;
