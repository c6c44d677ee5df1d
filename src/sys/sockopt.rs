//! Socket options the standard wrappers do not cover: transparent sockets, the saved SYN (to
//! learn the client's DSCP), the traffic class of outgoing packets and forced buffer sizes.
//! socket2 and nix set most of them; the rest (IPV6_TRANSPARENT, TCP_SAVE_SYN,
//! TCP_SAVED_SYN) neither crate offers, so they are set here.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::libc;
use nix::sys::socket::{setsockopt, sockopt};
use socket2::Socket;

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    set_raw(fd, level, name, &value)
}

/// Sets an option whose value the kernel reads as a `T` (plain data, which it copies).
pub(crate) fn set_raw<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is a live socket owned by the caller and the option value is a `T` of
    // the size passed, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a live socket owned by the caller; value and len describe a writable
    // c_int.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Options quinn-udp's socket setup changes that pepd keeps as the kernel had them: path-MTU
/// discovery as before (quinn-udp forbids fragmentation for QUIC's own MTU probing; pepd
/// sends at the configured `link.mtu` and lets the kernel fragment past a smaller path MTU,
/// as it always did). The receive timestamps it turns on stay on: the driver places each
/// datagram at its kernel receive time.
const KEPT_AS_THEY_WERE: [(libc::c_int, libc::c_int); 3] = [
    (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER),
    (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER),
    (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG),
];

/// The values of [`KEPT_AS_THEY_WERE`] a socket had (those of its family).
pub struct SavedOptions(Vec<(libc::c_int, libc::c_int, libc::c_int)>);

/// Reads the options that [`restore`] puts back.
pub fn save(sock: &impl AsRawFd) -> SavedOptions {
    let fd = sock.as_raw_fd();
    SavedOptions(
        KEPT_AS_THEY_WERE
            .iter()
            // An option of the other family does not read (ENOPROTOOPT): nothing to keep.
            .filter_map(|&(level, name)| Some((level, name, get_int(fd, level, name).ok()?)))
            .collect(),
    )
}

/// Puts the saved options back.
pub fn restore(sock: &impl AsRawFd, saved: &SavedOptions) -> io::Result<()> {
    for &(level, name, value) in &saved.0 {
        set_int(sock.as_raw_fd(), level, name, value)?;
    }
    Ok(())
}

/// Lets the socket accept TPROXY-redirected connections or bind a foreign address.
pub fn set_transparent(sock: &Socket, family_v6: bool) -> io::Result<()> {
    if family_v6 {
        set_int(sock.as_raw_fd(), libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1)
    } else {
        sock.set_ip_transparent(true)
    }
}

/// Keeps the SYN of each accepted connection so its DSCP can be read after `accept`.
pub fn set_save_syn(listener: &impl AsRawFd) -> io::Result<()> {
    set_int(
        listener.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_SAVE_SYN,
        1,
    )
}

/// The DSCP of the client's SYN (the kernel hands the saved headers out once).
pub fn saved_syn_dscp(sock: &impl AsRawFd) -> Option<u8> {
    let mut buf = [0u8; 128];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the buffer and its length describe valid writable memory.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SAVED_SYN,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    dscp_of_ip_header(buf.get(..len as usize)?)
}

/// DSCP from the first bytes of an IPv4 or IPv6 header.
pub fn dscp_of_ip_header(h: &[u8]) -> Option<u8> {
    let first = *h.first()?;
    match first >> 4 {
        4 => h.get(1).map(|tos| tos >> 2),
        6 => {
            let second = *h.get(1)?;
            let traffic_class = (first << 4) | (second >> 4);
            Some(traffic_class >> 2)
        }
        _ => None,
    }
}

/// Marks outgoing packets with `dscp` (ECN bits left to the kernel).
pub fn set_dscp(sock: &Socket, addr: &SocketAddr, dscp: u8) -> io::Result<()> {
    let tos = u32::from(dscp & 0x3f) << 2;
    match addr {
        SocketAddr::V4(_) => sock.set_tos(tos),
        SocketAddr::V6(_) => sock.set_tclass_v6(tos),
    }
}

/// Socket buffers beyond `net.core.[rw]mem_max` (needs CAP_NET_ADMIN).
pub fn force_buffers(sock: &impl AsFd, bytes: usize) -> io::Result<()> {
    // The kernel takes an int, and nix casts to one: a larger value would wrap.
    let bytes = bytes.min(libc::c_int::MAX as usize);
    setsockopt(sock, sockopt::RcvBufForce, &bytes)?;
    setsockopt(sock, sockopt::SndBufForce, &bytes)?;
    Ok(())
}

/// Whether `IPV6_TRANSPARENT` is set (socket2 reads only the IPv4 option).
pub fn ipv6_transparent(sock: &Socket) -> io::Result<bool> {
    get_int(sock.as_raw_fd(), libc::SOL_IPV6, libc::IPV6_TRANSPARENT).map(|v| v != 0)
}

/// Lets a transparent bind leave the port to `connect`, so many upstream connections from
/// one client address do not exhaust ports at bind time: `connect` then picks a port free
/// for the whole 4-tuple, as it does for an unbound socket. Works on IPv6 sockets too (the
/// kernel passes IPv4-level options of TCP sockets through).
pub fn set_bind_address_no_port(sock: &impl AsFd) -> io::Result<()> {
    Ok(setsockopt(sock, sockopt::IpBindAddressNoPort, &true)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dscp_from_both_ip_versions() {
        // IPv4, TOS 0xb8 = DSCP 46 (EF).
        assert_eq!(dscp_of_ip_header(&[0x45, 0xb8, 0, 0]), Some(46));
        // IPv6, traffic class 0x28 = DSCP 10 (AF11): version 6, TC split over two bytes.
        assert_eq!(dscp_of_ip_header(&[0x62, 0x80, 0, 0]), Some(10));
        assert_eq!(dscp_of_ip_header(&[0x15]), None);
        assert_eq!(dscp_of_ip_header(&[]), None);
    }

    /// Each option reads back as set (the transparent and forced ones need CAP_NET_ADMIN,
    /// which the tests have as root).
    #[test]
    fn options_read_back_as_set() {
        use nix::sys::socket::getsockopt;
        use socket2::{Domain, Type};

        let v4 = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let v6 = Socket::new(Domain::IPV6, Type::STREAM, None).expect("socket");
        let v4_addr: SocketAddr = "198.18.0.1:80".parse().expect("addr");
        let v6_addr: SocketAddr = "[fd00:198:18::1]:80".parse().expect("addr");

        set_dscp(&v4, &v4_addr, 46).expect("tos");
        assert_eq!(v4.tos().expect("tos"), 46 << 2);
        set_dscp(&v6, &v6_addr, 10).expect("tclass");
        assert_eq!(v6.tclass_v6().expect("tclass"), 10 << 2);

        set_transparent(&v4, false).expect("transparent");
        assert!(v4.ip_transparent().expect("transparent"));
        set_transparent(&v6, true).expect("transparent v6");

        set_bind_address_no_port(&v4).expect("no port");
        assert!(getsockopt(&v4, sockopt::IpBindAddressNoPort).expect("no port"));
        // An IPv6 socket takes the IPv4-level option too, and its bind honours it.
        set_bind_address_no_port(&v6).expect("no port v6");
        assert!(getsockopt(&v6, sockopt::IpBindAddressNoPort).expect("no port v6"));

        // Past any rmem_max; the kernel reports twice what it was given.
        let udp = Socket::new(Domain::IPV4, Type::DGRAM, None).expect("socket");
        force_buffers(&udp, 64 << 20).expect("force");
        assert_eq!(udp.recv_buffer_size().expect("rcvbuf"), 128 << 20);
        assert_eq!(udp.send_buffer_size().expect("sndbuf"), 128 << 20);
    }
}
