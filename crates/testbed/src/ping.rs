//! A minimal ICMP echo (ping) over a raw socket, for measuring RTT through the emulator
//! without depending on an external `ping` binary or its output format.

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use pep_linkemu::checksum::internet_checksum;
use socket2::{Domain, Protocol, Socket, Type};

static NEXT_ID: AtomicU16 = AtomicU16::new(0);

/// An echo request's size on the wire: a 20-byte IP header, an 8-byte ICMP header and 56
/// bytes of payload, the classic ping.
pub const PACKET_BYTES: usize = 84;
const IP_HEADER_BYTES: usize = 20;

fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![0u8; PACKET_BYTES - IP_HEADER_BYTES];
    p[0] = 8;
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    let c = internet_checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// Sends `count` echo requests to `dst`, one every `interval`, from the calling thread's
/// namespace, and returns each one's round-trip time (`None`: no reply within `timeout` after
/// the last request). Needs CAP_NET_RAW.
pub fn ping(
    dst: Ipv4Addr,
    count: u16,
    interval: Duration,
    timeout: Duration,
) -> io::Result<Vec<Option<Duration>>> {
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
    let id = (std::process::id() as u16) ^ NEXT_ID.fetch_add(0x1357, Ordering::Relaxed);
    let to = SocketAddrV4::new(dst, 0).into();
    let mut sent_at = vec![None; count as usize];
    let mut rtts = vec![None; count as usize];
    let start = Instant::now();
    let mut next_seq: u16 = 0;
    let end = start + interval * u32::from(count) + timeout;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    while Instant::now() < end && rtts.iter().any(Option::is_none) {
        let next_send = start + interval * u32::from(next_seq);
        if next_seq < count && Instant::now() >= next_send {
            // Timed before the send: a thread preempted after it would read an RTT too short.
            let at = Instant::now();
            sock.send_to(&echo_request(id, next_seq), &to)?;
            sent_at[next_seq as usize] = Some(at);
            next_seq += 1;
            continue;
        }
        let wake = if next_seq < count { next_send } else { end };
        let wait = wake
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(100));
        sock.set_read_timeout(Some(wait))?;
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        // SAFETY: recv initialised the first `n` bytes.
        let pkt: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let ihl = usize::from(pkt.first().map_or(0, |b| b & 0x0f)) * 4;
        let Some(icmp) = pkt.get(ihl..ihl + 8) else {
            continue;
        };
        let seq = u16::from_be_bytes([icmp[6], icmp[7]]);
        if icmp[0] != 0 || u16::from_be_bytes([icmp[4], icmp[5]]) != id {
            continue;
        }
        if let Some(Some(t)) = sent_at.get(usize::from(seq)) {
            rtts[usize::from(seq)] = Some(now - *t);
        }
    }
    Ok(rtts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksum_of_a_request_verifies_to_zero() {
        let p = super::echo_request(0x1234, 7);
        assert_eq!(pep_linkemu::checksum::internet_checksum(&p), 0);
    }
}
