//! The far side of a flow: the TCP connection to the original destination, from pepd's own
//! address or transparently from the client's, carrying the client's DSCP and pepd's mark.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use pep_transport::{FlowMeta, ResetReason};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};

use crate::sys::sockopt;

#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub mark: u32,
    pub transparent_source: bool,
    pub connect_timeout: Duration,
}

/// Why the connect failed, as the reset the client will see.
#[derive(Debug)]
pub struct ConnectFailure {
    pub reason: ResetReason,
    pub error: io::Error,
}

pub async fn connect(meta: &FlowMeta, opts: &UpstreamOptions) -> Result<TcpStream, ConnectFailure> {
    let fail = |reason, error| ConnectFailure { reason, error };
    let socket = make_socket(meta, opts).map_err(|e| fail(ResetReason::ResourceLimit, e))?;
    match tokio::time::timeout(opts.connect_timeout, socket.connect(meta.server)).await {
        Err(_) => Err(fail(
            ResetReason::Timeout,
            io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        )),
        Ok(Err(e)) => Err(fail(reason_of(&e), e)),
        Ok(Ok(tcp)) => {
            let _ = tcp.set_nodelay(true);
            Ok(tcp)
        }
    }
}

fn make_socket(meta: &FlowMeta, opts: &UpstreamOptions) -> io::Result<TcpSocket> {
    let dst = meta.server;
    let sock = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    if opts.mark != 0 {
        sock.set_mark(opts.mark)?;
    }
    if meta.dscp != 0 {
        sockopt::set_dscp(&sock, &dst, meta.dscp)?;
    }
    if opts.transparent_source && meta.client.is_ipv4() == dst.is_ipv4() {
        sockopt::set_transparent(&sock, dst.is_ipv6())?;
        sockopt::set_bind_address_no_port(&sock)?;
        let from = SocketAddr::new(meta.client.ip(), 0);
        sock.bind(&from.into())?;
    }
    Ok(TcpSocket::from_std_stream(sock.into()))
}

fn reason_of(e: &io::Error) -> ResetReason {
    use nix::libc;
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => ResetReason::Refused,
        Some(libc::ETIMEDOUT) => ResetReason::Timeout,
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN) => {
            ResetReason::Unreachable
        }
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL) => {
            ResetReason::ResourceLimit
        }
        _ => ResetReason::Unreachable,
    }
}
