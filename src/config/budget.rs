//! What `limits.memory_budget` counts: bytes = fixed + per_flow × flows + buffered payload,
//! and the sizes the daemon allocates that the formula is made of.
//!
//! The payload is the transport's send buffers (counted as they fill), the receive side
//! (reserved whole: it is bounded by the association window already granted to the peer)
//! and what relays hold between the transport and their TCP socket. Flows cost their
//! structures whether they move data or not; the fixed part is the buffers the daemon
//! allocates once. The process's own baseline (executable, runtime, allocator) is not in
//! the budget: docs/CONFIG.md gives the measured figure beside the formula. The running
//! count against the budget is the tunnel's (`tunnel::memory`).

use super::PepdConfig;

/// Datagrams a tunnel worker takes from its socket, or produces, per pass.
pub const BATCH: usize = 64;

/// Largest datagram read; longer ones are truncated by the kernel and then fail to parse.
/// With GRO the receive buffers are fewer and larger, in the same memory.
pub const RECV_BUF: usize = 65_536;

/// Largest piece a relay moves per read, either way.
pub const CHUNK: usize = 64 * 1024;

/// A flow's structures while it lives, both gateways' kinds (intercepted or opened by the
/// peer): the relay task and its future, the transport's flow state, the hub's slot and
/// signal, tokio's registration of the TCP socket. Measured by `per_flow_cost_is_covered`
/// (about 2.5 KiB); the rest is headroom for allocator rounding and map growth.
pub const PER_FLOW: u64 = 4 * 1024;

/// Read buffer each runtime thread lends to the relays it runs (CHUNK).
pub const SCRATCH_PER_RUNTIME_THREAD: u64 = CHUNK as u64;

/// The driver's receive batch (64 datagrams of up to 64 KiB each; with GRO fewer, larger
/// buffers in no more memory, each holding a coalesced batch).
pub const DRIVER_RECEIVE: u64 = (BATCH * RECV_BUF) as u64;

/// The association and hub themselves, the driver's other state, the metrics endpoint.
pub const DAEMON_STATE: u64 = 256 * 1024;

/// The part of the budget that does not depend on the traffic: the driver's batches
/// (receive, and up to twice a batch of `mtu`-sized datagrams to send), one scratch buffer
/// per runtime thread and the daemon's state.
pub fn fixed(mtu: usize, workers: usize) -> u64 {
    driver_buffers(mtu) + SCRATCH_PER_RUNTIME_THREAD * workers as u64 + DAEMON_STATE
}

/// The daemon's fixed memory with `drivers` drivers (a hub's `tunnel.workers`, 1 otherwise),
/// on this host's runtime threads.
pub fn daemon_fixed(mtu: usize, drivers: usize) -> u64 {
    fixed(mtu, runtime_threads()) + (drivers as u64).saturating_sub(1) * driver_buffers(mtu)
}

/// One driver's batches: receive, and up to twice a batch of `mtu`-sized datagrams to send.
/// A hub has one driver per `tunnel.workers`.
pub fn driver_buffers(mtu: usize) -> u64 {
    DRIVER_RECEIVE + 2 * BATCH as u64 * mtu as u64
}

/// The zstd contexts a runtime thread keeps once its relays compressed or decompressed a
/// block (pep-compress measures 1.27 MB after blocks at both levels;
/// `compression_contexts_are_covered` checks), with headroom. Counted only with
/// `transport.compression` on: without an offer the thread never makes them.
pub const COMPRESSION_PER_RUNTIME_THREAD: u64 = 2 << 20;

/// The threads of the runtime the relays run on, as tokio sizes them by default: one per CPU.
pub fn runtime_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The send buffers' part of the budget: half, the other half bounding the receive
/// window (config.rs sizes the association window within it).
pub fn send_cap(budget: u64) -> u64 {
    budget / 2
}

/// What a configuration's limits imply, for `check-config` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Implied {
    pub fixed: u64,
    /// The association receive window: reserved whole, the peer may fill it at any time.
    pub receive_reserve: u64,
    /// Flows the budget carries when none of them has anything buffered to send.
    pub max_idle_flows: u64,
    /// Memory with `max_flows` flows and every buffer full: the budget, or less when the
    /// flows, the send half and the receive reserve together cannot reach it.
    pub worst_case: u64,
}

pub fn implied(budget: u64, receive_reserve: u64, fixed: u64, max_flows: u64) -> Implied {
    let for_flows = budget.saturating_sub(receive_reserve).saturating_sub(fixed);
    let flows = max_flows.min(for_flows / PER_FLOW);
    Implied {
        fixed,
        receive_reserve,
        max_idle_flows: for_flows / PER_FLOW,
        worst_case: budget.min(fixed + receive_reserve + send_cap(budget) + PER_FLOW * flows),
    }
}

impl PepdConfig {
    /// What the limits imply for memory on this host (the fixed part counts one read
    /// buffer per CPU, as the daemon's runtime has one thread each).
    pub fn memory_implied(&self) -> Implied {
        let t = self.transport();
        implied(
            self.limits.memory_budget.bytes(),
            t.assoc_window,
            self.fixed_memory(),
            self.limits.max_flows as u64,
        )
    }

    /// The daemon's fixed memory on this host: its buffers, and the compression contexts
    /// of each runtime thread when compression is on.
    pub fn fixed_memory(&self) -> u64 {
        daemon_fixed(self.transport().mtu, self.workers()) + self.compression_contexts()
    }

    /// The compression contexts of the runtime threads, when compression is on.
    pub fn compression_contexts(&self) -> u64 {
        if self.transport().compression.is_some() {
            COMPRESSION_PER_RUNTIME_THREAD * runtime_threads() as u64
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn fixed_costs_are_the_daemons_buffers() {
        // 64 × 64 KiB to receive, 2 × 64 datagrams of 1500 B to send, 64 KiB per worker,
        // 256 KiB of state.
        assert_eq!(fixed(1500, 2), 4_194_304 + 192_000 + 131_072 + 262_144);
        assert_eq!(fixed(1500, 2), 4_779_520);
        assert_eq!(fixed(9000, 1), 4_194_304 + 1_152_000 + 65_536 + 262_144);
    }

    #[test]
    fn compression_contexts_are_covered() {
        // Both levels and a decompression on this thread, at the block size pepd offers.
        let block = 1usize << pep_compress::OFFERED_BLOCK_LOG;
        let data: Vec<u8> = (0..block as u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut stream = Vec::new();
        for level in pep_compress::Level::ALL {
            pep_compress::encode_block(&data, Some(level), &mut stream);
        }
        let mut d = pep_compress::Decoder::new(block);
        d.feed(bytes::Bytes::from(stream), &mut |_| {})
            .expect("decodes");
        let used = pep_compress::context_bytes() as u64;
        assert!(used > 0 && used <= COMPRESSION_PER_RUNTIME_THREAD, "{used}");
    }

    #[test]
    fn what_the_default_limits_imply() {
        // The defaults: 512 MiB, a 64 MiB association window, 10,000 flows, two CPUs.
        let m = implied(512 * MIB, 64 * MIB, fixed(1500, 2), 10_000);
        // (512 MiB − 64 MiB − 4,779,520) / 4096
        assert_eq!(m.max_idle_flows, 113_521);
        // fixed + 64 MiB + 256 MiB + 10,000 × 4 KiB
        assert_eq!(
            m.worst_case,
            4_779_520 + 67_108_864 + 268_435_456 + 40_960_000
        );
        assert_eq!(m.worst_case, 381_283_840);
        // A budget that cannot reach its send half with the flows counted is the bound.
        let small = implied(16 * MIB, 8 * MIB, fixed(1500, 2), 10_000);
        assert_eq!(
            small.max_idle_flows,
            (16 * MIB - 8 * MIB - 4_779_520) / 4096
        );
        assert_eq!(small.max_idle_flows, 881);
        assert_eq!(small.worst_case, 16 * MIB);
        // Fixed costs above what is left: nothing carried, nothing panics.
        assert_eq!(implied(4 * MIB, 2 * MIB, 4 * MIB, 10).max_idle_flows, 0);
    }
}
