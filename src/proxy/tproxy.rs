//! TPROXY listeners, and what an accepted connection tells us (the original
//! destination is the accepted socket's local address; the client's DSCP is in its SYN).

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

use crate::sys::sockopt;

/// A listening socket that accepts connections to any address TPROXY redirects to it,
/// with room in its accept queue for `backlog` (the kernel caps it at `net.core.somaxconn`,
/// which the self-check compares with `limits.max_flows`).
pub fn listen(addr: SocketAddr, backlog: usize) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        // The IPv4 listener on the same port takes IPv4; TPROXY needs one per family.
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sockopt::set_transparent(&sock, addr.is_ipv6())?;
    sockopt::set_save_syn(&sock)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    TcpListener::from_std(sock.into())
}

/// An intercepted connection.
pub struct Intercepted {
    pub tcp: TcpStream,
    pub client: SocketAddr,
    /// Where the client was going.
    pub server: SocketAddr,
    pub dscp: u8,
}

pub fn inspect(tcp: TcpStream, client: SocketAddr) -> io::Result<Intercepted> {
    let server = tcp.local_addr()?;
    let dscp = sockopt::saved_syn_dscp(&tcp).unwrap_or(0);
    Ok(Intercepted {
        tcp,
        client,
        server,
        dscp,
    })
}
