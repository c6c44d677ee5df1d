//! Addresses of the topology (RFC 2544 benchmarking range and a ULA prefix): subnet 1 is
//! client–gw-a, subnet 2 the emulated satellite hop, subnet 3 gw-b–server.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
pub const GW_A_LAN_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
pub const GW_A_SAT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
pub const GW_B_SAT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);
pub const GW_B_LAN_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 1);
pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 2);

const fn v6(subnet: u16, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x198, 0x18, subnet, 0, 0, 0, host)
}
pub const CLIENT_V6: Ipv6Addr = v6(1, 2);
pub const GW_A_LAN_V6: Ipv6Addr = v6(1, 1);
pub const GW_A_SAT_V6: Ipv6Addr = v6(2, 1);
pub const GW_B_SAT_V6: Ipv6Addr = v6(2, 2);
pub const GW_B_LAN_V6: Ipv6Addr = v6(3, 1);
pub const SERVER_V6: Ipv6Addr = v6(3, 2);

pub fn server(ipv6: bool) -> IpAddr {
    if ipv6 {
        SERVER_V6.into()
    } else {
        SERVER_V4.into()
    }
}
