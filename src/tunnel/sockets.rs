//! The tunnel's UDP sockets: one per worker on the tunnel address, marked, with buffers
//! that hold a burst at the link rate, and steered to their worker (`steering`).

use std::net::SocketAddr;

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};
use tracing::warn;

use crate::sys::sockopt;

/// Socket buffer of the tunnel socket: bursts at the link rate must not overflow it.
const TUNNEL_SOCKET_BUFFER: usize = 8 << 20;

/// The tunnel sockets, one per worker on the same address (see `workers::steering`). With
/// `freebind` they bind `bind` whether or not this host holds it yet (a redundant hub's
/// virtual address): they receive nothing, and every send fails, until it does.
pub fn tunnel_sockets(
    bind: SocketAddr,
    mark: u32,
    workers: usize,
    freebind: bool,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    let shard_bits = crate::tunnel::workers::shard_bits(workers);
    let (sockets, steered) =
        crate::tunnel::steering::bind_group(bind, workers, shard_bits, || {
            tunnel_socket(bind, mark, freebind).map_err(std::io::Error::other)
        })?;
    if let Err(e) = steered {
        warn!(error = %e, workers, "the kernel did not take the tunnel sockets' steering program: datagrams reach the workers by the kernel's hash and are handed on to their association's worker");
    }
    Ok(sockets.into_iter().map(Into::into).collect())
}

/// One tunnel socket, not bound yet.
///
/// Never `IP_TRANSPARENT`: that would let a standby send from the virtual address before it
/// holds it. `IP_FREEBIND` only allows the bind; the kernel still refuses to send from an
/// address the host does not hold.
fn tunnel_socket(bind: SocketAddr, mark: u32, freebind: bool) -> anyhow::Result<Socket> {
    let sock = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    if bind.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    if freebind {
        match bind {
            SocketAddr::V4(_) => sock.set_freebind(true),
            SocketAddr::V6(_) => sock.set_freebind_ipv6(true),
        }
        .context("IP_FREEBIND on the tunnel socket")?;
    }
    if mark != 0 {
        sock.set_mark(mark)
            .context("SO_MARK (needs CAP_NET_ADMIN)")?;
    }
    // Forcing past rmem_max needs CAP_NET_ADMIN, which pepd has; the plain call is the
    // fallback when it runs without.
    if sockopt::force_buffers(&sock, TUNNEL_SOCKET_BUFFER).is_err() {
        let _ = sock.set_recv_buffer_size(TUNNEL_SOCKET_BUFFER);
        let _ = sock.set_send_buffer_size(TUNNEL_SOCKET_BUFFER);
    }
    sock.set_nonblocking(true)?;
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunnel_sockets_are_never_transparent_and_free_to_bind_only_when_asked() {
        for bind in ["198.18.250.100:7400", "[fd00:198:18::100]:7400"] {
            let bind: SocketAddr = bind.parse().expect("address");
            for freebind in [false, true] {
                let sock = tunnel_socket(bind, 0, freebind).expect("socket");
                let (transparent, free) = match bind {
                    SocketAddr::V4(_) => (sock.ip_transparent(), sock.freebind()),
                    SocketAddr::V6(_) => (sockopt::ipv6_transparent(&sock), sock.freebind_ipv6()),
                };
                assert!(!transparent.expect("IP_TRANSPARENT readable"), "{bind}");
                assert_eq!(free.expect("IP_FREEBIND readable"), freebind, "{bind}");
            }
        }
    }
}
