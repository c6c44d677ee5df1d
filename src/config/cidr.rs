//! Subnets in the config (`"198.18.0.0/15"`, `"fd00:198:18::/48"`, or a bare address for a
//! single host), for the interception rules' bypass and proxy lists and the peers' subnets.
//! They are read into [`IpNet`]s, which keep the address as written: a subnet with host bits
//! set (`198.18.0.1/15`) parses, and validation reports it, since it is usually a typo.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserialize, Deserializer, Visitor};

const CIDR_EXPECTED: &str = "a subnet like \"198.18.0.0/15\" or \"fd00:198:18::/48\"";

/// Why a subnet string was rejected; the `Display` text is meant for operators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("`{0}` is not an IPv4 or IPv6 address")]
    Address(String),
    #[error("`{0}` is not a prefix length")]
    Prefix(String),
    #[error("prefix length {prefix} is longer than the {max} bits of the address")]
    PrefixTooLong { prefix: u8, max: u8 },
}

/// Reads a subnet as the config writes it. Unlike `IpNet`'s own parser it takes a bare
/// address (the one host), and its errors say which part is wrong.
pub fn parse_subnet(s: &str) -> Result<IpNet, CidrError> {
    let s = s.trim();
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| CidrError::Address(addr.to_owned()))?;
    let max = match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let prefix = match prefix {
        None => max,
        Some(p) => {
            // `u8::from_str` takes a leading '+', which is no prefix syntax anyone writes.
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(CidrError::Prefix(p.to_owned()));
            }
            p.parse::<u8>()
                .map_err(|_| CidrError::Prefix(p.to_owned()))?
        }
    };
    IpNet::new(addr, prefix).map_err(|_| CidrError::PrefixTooLong { prefix, max })
}

/// True when the address is not the subnet's first one (`198.18.0.1/15`).
pub(super) fn has_host_bits(net: &IpNet) -> bool {
    net.addr() != net.network()
}

/// `#[serde(deserialize_with)]` for a list of subnets: each element's error names its
/// index, as any list's would.
pub(super) fn subnets<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let list = Vec::<Subnet>::deserialize(d)?;
    Ok(list.into_iter().map(|Subnet(net)| net).collect())
}

/// One element of a subnet list, read with [`parse_subnet`].
struct Subnet(IpNet);

struct SubnetVisitor;

impl Visitor<'_> for SubnetVisitor {
    type Value = Subnet;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(CIDR_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Subnet, E> {
        parse_subnet(v)
            .map(Subnet)
            .map_err(|e| E::custom(format!("{e}; expected {CIDR_EXPECTED}")))
    }
}

impl<'de> Deserialize<'de> for Subnet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(SubnetVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> IpNet {
        parse_subnet(s).expect(s)
    }

    #[test]
    fn parses_subnets_and_bare_addresses() {
        assert_eq!(cidr("198.18.0.0/15").to_string(), "198.18.0.0/15");
        assert_eq!(cidr(" fd00:198:18::/48 ").to_string(), "fd00:198:18::/48");
        assert_eq!(cidr("198.18.0.7").to_string(), "198.18.0.7/32");
        assert_eq!(cidr("fd00:198:18::7").to_string(), "fd00:198:18::7/128");
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(cidr("::/0").to_string(), "::/0");
        assert!(cidr("198.18.0.0/15").addr().is_ipv4());
        assert!(!cidr("::/0").addr().is_ipv4());
    }

    #[test]
    fn host_bits() {
        let has = |s: &str| has_host_bits(&cidr(s));
        assert!(!has("198.18.0.0/15"));
        assert!(has("198.19.0.0/15"));
        assert_eq!(cidr("198.19.1.2/15").network().to_string(), "198.18.0.0");
        assert!(!has("0.0.0.0/0"));
        assert!(has("198.18.0.1/0"));
        assert!(!has("198.18.0.1/32"));
        assert!(has("fd00:198:18::1/48"));
        assert_eq!(
            cidr("fd00:198:18:ff::1/48").network().to_string(),
            "fd00:198:18::"
        );
        assert!(!has("fd00:198:18::1/128"));
        assert!(has("::1/0"));
    }

    #[test]
    fn rejects_what_is_not_a_subnet() {
        let err = |s: &str| parse_subnet(s).unwrap_err().to_string();
        assert_eq!(err("lan/24"), "`lan` is not an IPv4 or IPv6 address");
        assert_eq!(err(""), "`` is not an IPv4 or IPv6 address");
        assert_eq!(err("198.18.0.0/"), "`` is not a prefix length");
        assert_eq!(err("198.18.0.0/+8"), "`+8` is not a prefix length");
        assert_eq!(err("198.18.0.0/300"), "`300` is not a prefix length");
        assert_eq!(
            err("198.18.0.0/33"),
            "prefix length 33 is longer than the 32 bits of the address"
        );
        assert_eq!(
            err("fd00::/129"),
            "prefix length 129 is longer than the 128 bits of the address"
        );
    }
}
