//! What the near relay sends first on a tunnel connection: the intercepted connection's
//! original destination, so the far relay knows where to connect. One byte of family (4
//! or 6), the address (4 or 16 bytes), the port (big-endian); the payload follows at once.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The header announcing `dst`.
pub fn encode(dst: SocketAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(19);
    match dst.ip() {
        IpAddr::V4(a) => {
            h.push(4);
            h.extend_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            h.push(6);
            h.extend_from_slice(&a.octets());
        }
    }
    h.extend_from_slice(&dst.port().to_be_bytes());
    h
}

/// Reads one header from `r`.
pub fn read(r: &mut impl Read) -> io::Result<SocketAddr> {
    let mut family = [0u8; 1];
    r.read_exact(&mut family)?;
    let ip = match family[0] {
        4 => {
            let mut a = [0u8; 4];
            r.read_exact(&mut a)?;
            IpAddr::from(Ipv4Addr::from(a))
        }
        6 => {
            let mut a = [0u8; 16];
            r.read_exact(&mut a)?;
            IpAddr::from(Ipv6Addr::from(a))
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("tunnel header of unknown family {other}"),
            ))
        }
    };
    let mut port = [0u8; 2];
    r.read_exact(&mut port)?;
    Ok(SocketAddr::new(ip, u16::from_be_bytes(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_families_round_trip_and_the_payload_follows_untouched() {
        for dst in ["198.18.3.2:5001", "[fd00:198:18:3::2]:443"] {
            let dst: SocketAddr = dst.parse().expect("address");
            let mut wire = encode(dst);
            wire.extend_from_slice(b"payload");
            let mut r = &wire[..];
            assert_eq!(read(&mut r).expect("header"), dst);
            assert_eq!(r, b"payload");
        }
        assert_eq!(encode("198.18.3.2:5001".parse().expect("a")).len(), 7);
    }

    #[test]
    fn an_unknown_family_or_a_short_header_is_refused() {
        let e = read(&mut &[5u8, 1, 2, 3, 4, 0, 80][..]).expect_err("family 5");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let e = read(&mut &[6u8, 0, 0][..]).expect_err("short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
