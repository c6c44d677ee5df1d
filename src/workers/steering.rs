//! The workers' tunnel sockets: one per worker on the same address (`SO_REUSEPORT`), with a
//! classic BPF program on the group that hands each short packet to the socket its
//! connection ID's shard bits name. The kernel numbers a group's sockets in the order they
//! were bound, so socket *i* is worker *i*'s. Handshake messages, and anything the program
//! cannot read, go by the kernel's hash of the addresses; what lands on the wrong worker is
//! handed on in user space (super::Workers::hand_off), so steering is a saving, never a
//! condition of correctness.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::libc;
use pep_transport::packet::LONG_HEADER_BIT;
use socket2::Socket;

/// `SO_ATTACH_REUSEPORT_CBPF` (include/uapi/asm-generic/socket.h); the libc crate has it
/// for Android only.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// A return value no socket has: the kernel then picks by its hash.
const BY_HASH: u32 = u32::MAX;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The program for `shard_bits` bits of a 2-byte connection ID right after the first byte.
/// The filter sees the UDP payload from offset 0.
pub fn program(shard_bits: u8) -> Vec<libc::sock_filter> {
    use libc::{BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_JMP, BPF_JSET, BPF_K, BPF_LD};
    use libc::{BPF_RET, BPF_RSH};
    let long = libc::sock_filter {
        code: (BPF_JMP | BPF_JSET | BPF_K) as u16,
        // Long header: on to the last instruction.
        jt: 3,
        jf: 0,
        k: u32::from(LONG_HEADER_BIT),
    };
    vec![
        stmt(BPF_LD | BPF_B | BPF_ABS, 0),
        long,
        stmt(BPF_LD | BPF_H | BPF_ABS, 1),
        stmt(BPF_ALU | BPF_RSH | BPF_K, 16 - u32::from(shard_bits)),
        stmt(BPF_RET | BPF_A, 0),
        stmt(BPF_RET | BPF_K, BY_HASH),
    ]
}

/// Binds `count` sockets made by `make` to `bind` in one reuseport group (the first picks
/// the port if `bind`'s is 0) and steers by `shard_bits`. Whether the steering program was
/// taken is the second value: without it the kernel's hash places every datagram.
pub fn bind_group(
    bind: SocketAddr,
    count: usize,
    shard_bits: u8,
    mut make: impl FnMut() -> io::Result<Socket>,
) -> io::Result<(Vec<Socket>, io::Result<()>)> {
    let mut sockets: Vec<Socket> = Vec::with_capacity(count);
    let mut at = bind;
    for _ in 0..count {
        let s = make()?;
        if count > 1 {
            s.set_reuse_port(true)?;
        }
        s.bind(&at.into())?;
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

fn attach(socket: &Socket, program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // `prog` points at `program`, which outlives the call; the kernel copies it.
    crate::sockopt::set_raw(
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

    #[test]
    fn short_packets_reach_the_socket_their_shard_bits_name() {
        let (group, steered) =
            bind_group("127.0.0.1:0".parse().expect("addr"), 4, 2, udp).expect("group");
        steered.expect("the steering program attached");
        let to = group[0]
            .local_addr()
            .expect("addr")
            .as_socket()
            .expect("inet");
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
    fn one_socket_needs_no_group() {
        let (group, steered) =
            bind_group("127.0.0.1:0".parse().expect("addr"), 1, 0, udp).expect("group");
        assert!(steered.is_ok());
        assert_eq!(group.len(), 1);
        assert!(!group[0].reuse_port().expect("getsockopt"));
    }
}
