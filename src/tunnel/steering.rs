//! Steering between the workers' tunnel sockets, one per worker on the same address
//! (`SO_REUSEPORT`): a classic BPF program on the group hands each short packet to the
//! socket its connection ID's shard bits name, and so each REPLY or COOKIE to the hub's own
//! initiations. The kernel numbers a group's sockets in the order they were bound, so
//! socket *i* is worker *i*'s. Initiations, HELLOs, and anything too short for the program
//! to read, go by the kernel's hash of the addresses; what lands on the wrong worker is
//! handed on in user space (`Workers::hand_off`), so steering is a saving, never a
//! condition of correctness.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixDatagram;

use nix::libc;
use pep_transport::packet::{
    HANDSHAKE_HEADER_LEN, LONG_HEADER_BIT, LONG_TYPE_COOKIE, LONG_TYPE_HANDSHAKE_REPLY,
};
use socket2::Socket;

/// `SO_ATTACH_REUSEPORT_CBPF` (include/uapi/asm-generic/socket.h); the libc crate has it
/// for Android only.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// A return value no socket has: the kernel then picks by its hash.
const BY_HASH: u32 = u32::MAX;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    jump(code, k, 0, 0)
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The program for `shard_bits` bits of a 2-byte connection ID: a short packet's right
/// after the first byte, a REPLY's or COOKIE's after the type byte and the version (the
/// answers to a handshake the hub leads). The filter sees the UDP payload from offset 0.
/// Every load is behind a length check: a load past the end would end the program with 0,
/// socket 0, instead of the hash.
pub fn program(shard_bits: u8) -> Vec<libc::sock_filter> {
    use libc::{BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET};
    use libc::{BPF_K, BPF_LD, BPF_LEN, BPF_MISC, BPF_RET, BPF_RSH, BPF_TAX, BPF_TXA, BPF_W};
    let shift = 16 - u32::from(shard_bits);
    let at = HANDSHAKE_HEADER_LEN as u32;
    let long = u32::from(LONG_HEADER_BIT);
    let (reply, cookie) = (
        long | u32::from(LONG_TYPE_HANDSHAKE_REPLY),
        long | u32::from(LONG_TYPE_COOKIE),
    );
    // Jump offsets count the instructions skipped; the comments number them.
    vec![
        /* 0 */ stmt(BPF_LD | BPF_W | BPF_LEN, 0),
        /* 1 */ stmt(BPF_MISC | BPF_TAX, 0),
        /* 2 */ jump(BPF_JMP | BPF_JGE | BPF_K, 3, 0, 12),
        /* 3 */ stmt(BPF_LD | BPF_B | BPF_ABS, 0),
        /* 4 */ jump(BPF_JMP | BPF_JSET | BPF_K, long, 3, 0),
        /* 5 */ stmt(BPF_LD | BPF_H | BPF_ABS, 1),
        /* 6 */ stmt(BPF_ALU | BPF_RSH | BPF_K, shift),
        /* 7 */ stmt(BPF_RET | BPF_A, 0),
        /* 8 */ jump(BPF_JMP | BPF_JEQ | BPF_K, reply, 1, 0),
        /* 9 */ jump(BPF_JMP | BPF_JEQ | BPF_K, cookie, 0, 5),
        /* 10 */ stmt(BPF_MISC | BPF_TXA, 0),
        /* 11 */ jump(BPF_JMP | BPF_JGE | BPF_K, at + 2, 0, 3),
        /* 12 */ stmt(BPF_LD | BPF_H | BPF_ABS, at),
        /* 13 */ stmt(BPF_ALU | BPF_RSH | BPF_K, shift),
        /* 14 */ stmt(BPF_RET | BPF_A, 0),
        /* 15 */ stmt(BPF_RET | BPF_K, BY_HASH),
    ]
}

/// Binds `count` sockets made by `make` to `bind` in one reuseport group (the first picks
/// the port if `bind`'s is 0) and steers by `shard_bits`. Whether the steering program was
/// taken is the second value: without it the kernel's hash places every datagram.
///
/// A group fails to bind while another process holds `bind`, also another's group: a
/// socket without `SO_REUSEPORT` binds there first, which no group of another lets pass
/// (a second pepd would otherwise join the first's group and take part of its datagrams).
pub fn bind_group(
    bind: SocketAddr,
    count: usize,
    shard_bits: u8,
    mut make: impl FnMut() -> io::Result<Socket>,
) -> io::Result<(Vec<Socket>, io::Result<()>)> {
    if count > 1 && bind.port() != 0 {
        make()?.bind(&bind.into()).map_err(|e| taken(bind, e))?;
    }
    let mut sockets: Vec<Socket> = Vec::with_capacity(count);
    let mut at = bind;
    for _ in 0..count {
        let s = make()?;
        if count > 1 {
            s.set_reuse_port(true)?;
        }
        s.bind(&at.into()).map_err(|e| taken(at, e))?;
        if sockets.is_empty() {
            if let Some(a) = s.local_addr()?.as_socket() {
                at = a;
            }
        }
        sockets.push(s);
    }
    let steered = match sockets.first() {
        Some(first) if count > 1 => attach(first, &program(shard_bits)),
        _ => Ok(()),
    };
    Ok((sockets, steered))
}

/// Claims `at` for this process among the pepds of its network namespace, for as long as
/// the value is kept: an abstract unix socket named after it, which the kernel frees when
/// the process ends. Two daemons that start at the same moment may both find `at` free in
/// [`bind_group`] and share one group; the second to claim fails.
pub fn claim(at: SocketAddr) -> io::Result<UnixDatagram> {
    let name = std::os::unix::net::SocketAddr::from_abstract_name(format!("pepd tunnel {at}"))?;
    UnixDatagram::bind_addr(&name).map_err(|e| taken(at, e))
}

/// `e`, said plainly when the address is in use.
fn taken(at: SocketAddr, e: io::Error) -> io::Error {
    if e.kind() != io::ErrorKind::AddrInUse {
        return e;
    }
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("{at} is in use by another process (is a pepd already running?)"),
    )
}

fn attach(socket: &Socket, program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // `prog` points at `program`, which outlives the call; the kernel copies it.
    crate::sys::sockopt::set_raw(
        socket.as_raw_fd(),
        libc::SOL_SOCKET,
        SO_ATTACH_REUSEPORT_CBPF,
        &prog,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use socket2::{Domain, Protocol, Type};

    use super::*;

    fn udp() -> io::Result<Socket> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(s)
    }

    /// What each of the group's sockets reads (up to `n` datagrams each).
    fn read_all(group: &[Socket]) -> Vec<Vec<Vec<u8>>> {
        group
            .iter()
            .map(|s| {
                let mut got = Vec::new();
                let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
                while let Ok(n) = s.recv(&mut buf) {
                    // SAFETY: recv initialised the first n bytes.
                    got.push(
                        buf[..n]
                            .iter()
                            .map(|b| unsafe { b.assume_init() })
                            .collect(),
                    );
                }
                got
            })
            .collect()
    }

    /// Four loopback sockets steered by two shard bits, and their address.
    fn steered_group() -> (Vec<Socket>, SocketAddr) {
        let (group, steered) =
            bind_group("127.0.0.1:0".parse().expect("addr"), 4, 2, udp).expect("group");
        steered.expect("the steering program attached");
        let to = group[0]
            .local_addr()
            .expect("addr")
            .as_socket()
            .expect("inet");
        (group, to)
    }

    #[test]
    fn short_packets_reach_the_socket_their_shard_bits_name() {
        let (group, to) = steered_group();
        for s in &group[1..] {
            assert_eq!(s.local_addr().expect("addr").as_socket(), Some(to));
        }
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        // Shards 3, 1, 0, 2 in the top two bits of the connection ID; 2 datagrams each.
        let sent: Vec<[u8; 4]> = [0xC0u8, 0x40, 0x00, 0x80]
            .iter()
            .flat_map(|&hi| [[0x40, hi, 0x01, 1], [0x40, hi | 0x3F, 0xFF, 2]])
            .collect();
        for d in &sent {
            sender.send_to(d, to).expect("send");
        }
        let got = read_all(&group);
        for (shard, datagrams) in got.iter().enumerate() {
            assert_eq!(datagrams.len(), 2, "socket {shard} got {datagrams:?}");
            for d in datagrams {
                assert_eq!(usize::from(d[1] >> 6), shard);
            }
        }
        // Long headers go by the hash: from one source address, all to one socket.
        for i in 0..4u8 {
            sender.send_to(&[0x82, i], to).expect("send");
        }
        let got = read_all(&group);
        let counts: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(counts.iter().sum::<usize>(), 4);
        assert_eq!(counts.iter().filter(|&&c| c > 0).count(), 1, "{counts:?}");
    }

    #[test]
    fn replies_and_cookies_reach_the_socket_their_shard_bits_name() {
        let (group, to) = steered_group();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        // The hub's connection ID after the type byte and the version, shards 2, 0, 3, 1.
        for hi in [0x80u8, 0x00, 0xC0, 0x40] {
            for kind in [0x83u8, 0x84] {
                sender
                    .send_to(&[kind, 0, 0, 0, 2, hi, 0x05, 9], to)
                    .expect("send");
            }
        }
        let got = read_all(&group);
        for (shard, datagrams) in got.iter().enumerate() {
            assert_eq!(datagrams.len(), 2, "socket {shard} got {datagrams:?}");
            for d in datagrams {
                assert_eq!(usize::from(d[5] >> 6), shard);
            }
        }
    }

    #[test]
    fn what_is_too_short_to_steer_goes_by_the_hash_not_to_socket_0() {
        let (group, to) = steered_group();
        // From 16 source ports the hash reaches more than one socket; a load past the end
        // would end the program with 0 and put every one on socket 0.
        let short: [&[u8]; 5] = [
            &[],
            &[0x40],
            &[0x40, 0xC0],
            &[0x83, 0, 0, 0, 2, 0xC0],
            &[0x84],
        ];
        for datagram in short {
            let senders: Vec<std::net::UdpSocket> = (0..16)
                .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("bind"))
                .collect();
            for s in &senders {
                s.send_to(datagram, to).expect("send");
            }
            let counts: Vec<usize> = read_all(&group).iter().map(Vec::len).collect();
            assert_eq!(counts.iter().sum::<usize>(), 16, "{datagram:?}: {counts:?}");
            assert!(counts[0] < 16, "{datagram:?}: {counts:?}");
        }
    }

    #[test]
    fn a_group_does_not_join_another_s_on_the_same_address() {
        let (_first, to) = steered_group();
        let e = bind_group(to, 2, 1, udp).expect_err("the address is taken");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(e
            .to_string()
            .contains(&format!("{to} is in use by another process")));
    }

    #[test]
    fn an_address_is_claimed_once() {
        // A port of this process's own, so that no other test run claims the same name.
        let port = 1024 + (std::process::id() % 60_000) as u16;
        let at = SocketAddr::from(([198, 18, 0, 1], port));
        let held = claim(at).expect("free");
        let e = claim(at).expect_err("held");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        let other = claim(SocketAddr::from(([198, 18, 0, 2], port)));
        assert!(other.is_ok(), "{other:?}");
        drop(held);
        assert!(claim(at).is_ok(), "free again");
    }

    #[test]
    fn one_socket_needs_no_group() {
        let (group, steered) =
            bind_group("127.0.0.1:0".parse().expect("addr"), 1, 0, udp).expect("group");
        assert!(steered.is_ok());
        assert_eq!(group.len(), 1);
        assert!(!group[0].reuse_port().expect("getsockopt"));
    }
}
