//! Which peer a destination is reached through: longest-prefix match over every peer's
//! `subnets`, the cryptokey routing of WireGuard. The config refuses overlapping subnets
//! between peers, so the longest match matters only where a peer's prefixes nest within
//! its own (a terminal's `0.0.0.0/0` beside a more specific one).

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use pep_transport::PeerId;
use prefix_trie::PrefixMap;

use crate::config::PeerSpec;

/// The route table: destination prefix → the peer's id, which stays the same while the
/// peer is configured (a reload that removes another peer does not shift it).
#[derive(Debug, Clone, Default)]
pub struct Routes {
    v4: PrefixMap<Ipv4Net, PeerId>,
    v6: PrefixMap<Ipv6Net, PeerId>,
}

impl Routes {
    /// Every subnet of every peer. A prefix listed by two peers (refused by the config)
    /// goes to the later one.
    pub fn new<'a>(peers: impl IntoIterator<Item = (PeerId, &'a PeerSpec)>) -> Self {
        let mut routes = Routes::default();
        for (id, peer) in peers {
            for net in &peer.subnets {
                match net.trunc() {
                    IpNet::V4(n) => routes.v4.insert(n, id),
                    IpNet::V6(n) => routes.v6.insert(n, id),
                };
            }
        }
        routes
    }

    /// The peer that `ip` is reached through, if any. An IPv4-mapped IPv6 address (what a
    /// dual-stack socket reports for IPv4) is looked up as the IPv4 address it is.
    pub fn lookup(&self, ip: IpAddr) -> Option<PeerId> {
        match ip.to_canonical() {
            IpAddr::V4(a) => self.v4.get_lpm(&Ipv4Net::from(a)).map(|(_, &i)| i),
            IpAddr::V6(a) => self.v6.get_lpm(&Ipv6Net::from(a)).map(|(_, &i)| i),
        }
    }

    /// Whether traffic from `source`, arriving from peer `peer`, may enter: only from an
    /// address that is routed back to that same peer (WireGuard's inbound check), so one
    /// terminal cannot speak with another's addresses.
    pub fn admits(&self, peer: PeerId, source: IpAddr) -> bool {
        self.lookup(source) == Some(peer)
    }

    /// Number of prefixes in the table.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn peer(name: &str, subnets: &[&str]) -> PeerSpec {
        PeerSpec {
            name: name.into(),
            public_key: None,
            address: None,
            subnets: subnets.iter().map(|s| s.parse().expect(s)).collect(),
            tx_bps: 1_000_000,
            rx_bps: 1_000_000,
            min_bps: 0,
            weight: 1,
            keepalive: Duration::from_secs(5),
            max_flows: 10_000,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect(s)
    }

    /// The table of `peers`, each with its place as its id.
    fn table(peers: &[PeerSpec]) -> Routes {
        Routes::new(peers.iter().enumerate().map(|(i, p)| (PeerId(i as u32), p)))
    }

    fn id(i: u32) -> Option<PeerId> {
        Some(PeerId(i))
    }

    #[test]
    fn longest_prefix_wins() {
        let r = table(&[
            peer("a", &["0.0.0.0/0", "::/0"]),
            peer("b", &["10.7.0.0/16", "fd00:198:19::/48"]),
            peer("c", &["10.7.3.0/24", "fd00:198:19:3::/64"]),
        ]);
        assert_eq!(r.len(), 6);
        assert_eq!(r.lookup(ip("10.7.3.9")), id(2));
        assert_eq!(r.lookup(ip("10.7.4.9")), id(1));
        assert_eq!(r.lookup(ip("10.8.0.1")), id(0));
        assert_eq!(r.lookup(ip("fd00:198:19:3::1")), id(2));
        assert_eq!(r.lookup(ip("fd00:198:19:4::1")), id(1));
        assert_eq!(r.lookup(ip("2001:db8::1")), id(0));
        // The edges of a prefix belong to it; the next address does not.
        assert_eq!(r.lookup(ip("10.7.3.0")), id(2));
        assert_eq!(r.lookup(ip("10.7.3.255")), id(2));
        assert_eq!(r.lookup(ip("10.7.2.255")), id(1));
    }

    #[test]
    fn v4_mapped_routes_as_v4() {
        let r = table(&[peer("a", &["10.1.0.0/24"]), peer("b", &["::/0"])]);
        assert_eq!(r.lookup(ip("::ffff:10.1.0.7")), id(0));
        // Not mapped, so IPv6, so the IPv6 default.
        assert_eq!(r.lookup(ip("::10.1.0.7")), id(1));
        assert_eq!(r.lookup(ip("::ffff:10.2.0.7")), None);
    }

    #[test]
    fn no_route_is_none() {
        let r = table(&[peer("a", &["10.1.0.0/24"]), peer("b", &["10.2.0.0/24"])]);
        assert_eq!(r.lookup(ip("10.3.0.1")), None);
        assert_eq!(r.lookup(ip("fd00::1")), None);
        assert!(table(&[]).is_empty());
        assert_eq!(table(&[]).lookup(ip("10.1.0.1")), None);
    }

    #[test]
    fn host_bits_do_not_matter() {
        // PeerSpec clears them, but a table built from anything else must not misroute.
        let r = table(&[peer("a", &["10.1.0.9/24"])]);
        assert_eq!(r.lookup(ip("10.1.0.200")), id(0));
    }

    #[test]
    fn admits_only_the_peers_own_addresses() {
        let r = table(&[peer("a", &["10.1.0.0/24"]), peer("b", &["10.2.0.0/24"])]);
        assert!(r.admits(PeerId(0), ip("10.1.0.5")));
        assert!(r.admits(PeerId(1), ip("::ffff:10.2.0.5")));
        assert!(
            !r.admits(PeerId(0), ip("10.2.0.5")),
            "a's packets with b's address"
        );
        assert!(
            !r.admits(PeerId(1), ip("192.0.2.1")),
            "an address routed nowhere"
        );
    }

    #[test]
    fn the_pair_form_routes_everything_to_its_peer() {
        let cfg = crate::config::PepdConfig::parse(include_str!("../../config/terminal.toml"))
            .expect("terminal.toml");
        let r = table(&cfg.peer_specs());
        for a in [
            "198.51.100.1",
            "10.0.0.1",
            "2001:db8::1",
            "::ffff:192.0.2.1",
        ] {
            assert_eq!(r.lookup(ip(a)), id(0), "{a}");
        }
    }

    #[test]
    fn the_hub_spoke_example_routes_each_lan_to_its_terminal() {
        let cfg = crate::config::PepdConfig::parse(include_str!("../../config/hub-spoke.toml"))
            .expect("hub-spoke.toml");
        let specs = cfg.peer_specs();
        let r = table(&specs);
        let name = |a: &str| r.lookup(ip(a)).map(|i| specs[i.0 as usize].name.as_str());
        assert_eq!(name("10.3.0.20"), Some("rig-3"));
        assert_eq!(name("fd00:198:19:3::20"), Some("rig-3"));
        assert_eq!(name("10.7.0.1"), Some("ship-7"));
        assert_eq!(name("10.12.3.254"), Some("cell-12"));
        assert_eq!(name("10.12.4.1"), None);
    }
}
