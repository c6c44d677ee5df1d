//! UDP segmentation offload through the TUN devices. With `IFF_VNET_HDR` and `TUN_F_USO4/6`
//! the kernel hands the emulator a UDP GSO burst (one IP header, one UDP header, up to 64 KiB
//! of datagrams of `gso_size` bytes each) behind a `virtio_net_hdr`, instead of cutting it into
//! datagrams first. A link that has nothing to do to single datagrams (no loss, no errors, a
//! serialisation time far below a millisecond) can then carry the burst as one unit, which
//! costs one read and one write instead of up to 64 of each: at gigabits the emulator's
//! per-packet work, not the gateways', would otherwise set the pace. Every other link cuts the
//! burst here, exactly as the kernel would have, and judges each datagram on its own.

use crate::checksum::{fold, internet_checksum, ones_sum};

/// `struct virtio_net_hdr` (the 10-byte form TUN uses by default). TUN's byte order is the
/// host's (legacy virtio) unless TUNSETVNETBE/LE says otherwise; pepd's testbed runs on
/// little-endian hosts, where both agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` on is left to the device.
pub const NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`: a single packet.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`.
pub const GSO_UDP_L4: u8 = 5;

const UDP_HEADER: usize = 8;
const IPPROTO_UDP: u8 = 17;

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

/// A UDP GSO burst's layout: where the UDP header is and how the payload divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpBurst {
    ip_header: usize,
    ipv6: bool,
    gso_size: usize,
    /// Payload bytes after the UDP header.
    payload: usize,
}

impl UdpBurst {
    /// The burst behind `hdr`, or None if `packet` is not a UDP GSO burst this module can cut
    /// (anything else passes as it came).
    pub fn parse(hdr: &VnetHdr, packet: &[u8]) -> Option<UdpBurst> {
        if hdr.gso_type != GSO_UDP_L4 || hdr.gso_size == 0 {
            return None;
        }
        let (ip_header, ipv6) = match packet.first()? >> 4 {
            4 => {
                let ihl = usize::from(packet[0] & 0x0f) * 4;
                let fragmented = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x3fff;
                if ihl < 20 || *packet.get(9)? != IPPROTO_UDP || fragmented != 0 {
                    return None;
                }
                (ihl, false)
            }
            // Extension headers are not expected on the testbed's links: such a burst passes
            // whole, and the far kernel cuts it.
            6 if *packet.get(6)? == IPPROTO_UDP => (40, true),
            _ => return None,
        };
        let payload = packet.len().checked_sub(ip_header + UDP_HEADER)?;
        if payload == 0 {
            return None;
        }
        Some(UdpBurst {
            ip_header,
            ipv6,
            gso_size: usize::from(hdr.gso_size),
            payload,
        })
    }

    pub fn segments(&self) -> usize {
        self.payload.div_ceil(self.gso_size)
    }

    /// IP bytes of the datagrams the burst stands for (each with its own headers).
    pub fn wire_bytes(&self) -> usize {
        self.payload + self.segments() * (self.ip_header + UDP_HEADER)
    }

    /// Cuts the burst into datagrams, each behind its own `virtio_net_hdr`, as the kernel's
    /// segmentation would: IP length and (IPv4) identifier and header checksum per datagram,
    /// the UDP length, and the UDP checksum left to the far device over the pseudo-header.
    pub fn cut(&self, packet: &[u8]) -> Vec<Vec<u8>> {
        let headers = self.ip_header + UDP_HEADER;
        let payload = &packet[headers..];
        let hdr = VnetHdr {
            flags: NEEDS_CSUM,
            csum_start: self.ip_header as u16,
            csum_offset: 6,
            ..VnetHdr::default()
        }
        .encode();
        payload
            .chunks(self.gso_size)
            .enumerate()
            .map(|(i, chunk)| {
                let mut d = Vec::with_capacity(VNET_HDR_LEN + headers + chunk.len());
                d.extend_from_slice(&hdr);
                d.extend_from_slice(&packet[..headers]);
                d.extend_from_slice(chunk);
                let ip = &mut d[VNET_HDR_LEN..];
                let udp_len = (UDP_HEADER + chunk.len()) as u16;
                if self.ipv6 {
                    ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
                } else {
                    let total = (self.ip_header + usize::from(udp_len)) as u16;
                    ip[2..4].copy_from_slice(&total.to_be_bytes());
                    let id = u16::from_be_bytes([ip[4], ip[5]]).wrapping_add(i as u16);
                    ip[4..6].copy_from_slice(&id.to_be_bytes());
                    ip[10..12].fill(0);
                    let sum = internet_checksum(&ip[..self.ip_header]);
                    ip[10..12].copy_from_slice(&sum.to_be_bytes());
                }
                let (udp_at, pseudo) = (self.ip_header, self.pseudo_header_sum(ip, udp_len));
                ip[udp_at + 4..udp_at + 6].copy_from_slice(&udp_len.to_be_bytes());
                // With NEEDS_CSUM the field holds the folded pseudo-header sum, not inverted.
                ip[udp_at + 6..udp_at + 8].copy_from_slice(&fold(pseudo).to_be_bytes());
                d
            })
            .collect()
    }

    fn pseudo_header_sum(&self, ip: &[u8], udp_len: u16) -> u32 {
        let addrs = if self.ipv6 { &ip[8..40] } else { &ip[12..20] };
        ones_sum(addrs, u32::from(IPPROTO_UDP) + u32::from(udp_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The UDP checksum a device computes for a NEEDS_CSUM datagram: the one's-complement
    /// sum from `csum_start`, seeded with what the field holds, inverted.
    fn finish_checksum(d: &[u8]) -> Vec<u8> {
        let hdr = VnetHdr::parse(d).unwrap();
        let mut ip = d[VNET_HDR_LEN..].to_vec();
        let start = usize::from(hdr.csum_start);
        let sum = internet_checksum(&ip[start..]);
        let at = start + usize::from(hdr.csum_offset);
        ip[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        ip
    }

    /// A checksum is right when the sum over what it covers (the pseudo-header included)
    /// folds to 0xffff.
    fn verifies(ip: &[u8], ipv6: bool) -> bool {
        let (h, addrs) = if ipv6 {
            (40, &ip[8..40])
        } else {
            (usize::from(ip[0] & 0xf) * 4, &ip[12..20])
        };
        let udp = &ip[h..];
        let pseudo = ones_sum(addrs, 17 + udp.len() as u32);
        fold(ones_sum(udp, pseudo)) == 0xffff
    }

    fn ipv4_burst(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 198, 18, 1, 1, 198, 18, 2, 2,
        ];
        p.extend_from_slice(&[0x13, 0x88, 0x27, 0x10, 0, 0, 0xab, 0xcd]);
        p.extend_from_slice(payload);
        let total = p.len() as u16;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p
    }

    fn udp_gso(size: u16) -> VnetHdr {
        VnetHdr {
            flags: NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            hdr_len: 28,
            gso_size: size,
            csum_start: 20,
            csum_offset: 6,
        }
    }

    #[test]
    fn the_header_round_trips() {
        let h = udp_gso(1456);
        assert_eq!(VnetHdr::parse(&h.encode()), Some(h));
        assert_eq!(VnetHdr::parse(&[0; 9]), None);
    }

    #[test]
    fn an_ipv4_burst_is_cut_into_datagrams_the_far_kernel_accepts() {
        let payload: Vec<u8> = (0..2500u32).map(|i| (i * 7 % 251) as u8).collect();
        let packet = ipv4_burst(&payload);
        let burst = UdpBurst::parse(&udp_gso(1000), &packet).unwrap();
        assert_eq!(burst.segments(), 3);
        assert_eq!(burst.wire_bytes(), 2500 + 3 * 28);
        let cut = burst.cut(&packet);
        assert_eq!(cut.len(), 3);
        for (i, d) in cut.iter().enumerate() {
            let chunk = &payload[i * 1000..(i * 1000 + 1000).min(2500)];
            let ip = finish_checksum(d);
            assert_eq!(ip.len(), 28 + chunk.len());
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, ip.len());
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 0x1234 + i as u16);
            assert_eq!(fold(ones_sum(&ip[..20], 0)), 0xffff, "IPv4 header checksum");
            assert_eq!(&ip[20..24], &packet[20..24], "ports");
            assert_eq!(
                u16::from_be_bytes([ip[24], ip[25]]) as usize,
                8 + chunk.len()
            );
            assert_eq!(&ip[28..], chunk);
            assert!(verifies(&ip, false), "UDP checksum of datagram {i}");
        }
    }

    #[test]
    fn an_ipv6_burst_is_cut_too() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        let mut p = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        p.extend_from_slice(&[0xfd, 0, 1, 0x98, 0, 0x18, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0xfd, 0, 1, 0x98, 0, 0x18, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&[0x13, 0x88, 0x27, 0x10, 0, 0, 0, 0]);
        p.extend_from_slice(&payload);
        let hdr = VnetHdr {
            csum_start: 40,
            ..udp_gso(1400)
        };
        let burst = UdpBurst::parse(&hdr, &p).unwrap();
        let cut = burst.cut(&p);
        assert_eq!(cut.len(), 3);
        let mut joined = Vec::new();
        for d in &cut {
            let ip = finish_checksum(d);
            let len = u16::from_be_bytes([ip[4], ip[5]]) as usize;
            assert_eq!(len, ip.len() - 40);
            assert!(verifies(&ip, true));
            joined.extend_from_slice(&ip[48..]);
        }
        assert_eq!(joined, payload);
    }

    #[test]
    fn what_is_not_a_udp_burst_passes_as_it_came() {
        let packet = ipv4_burst(&[1; 100]);
        assert_eq!(UdpBurst::parse(&VnetHdr::default(), &packet), None);
        let mut tcp = packet.clone();
        tcp[9] = 6;
        assert_eq!(UdpBurst::parse(&udp_gso(50), &tcp), None);
        assert_eq!(UdpBurst::parse(&udp_gso(50), &packet[..28]), None);
        assert_eq!(UdpBurst::parse(&udp_gso(50), &[]), None);
    }
}
