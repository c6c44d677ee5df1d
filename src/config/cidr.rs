//! Subnets in the config (`"198.18.0.0/15"`, `"fd00:198:18::/48"`, or a bare address for a
//! single host), for the interception rules' bypass and proxy lists.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

const CIDR_EXPECTED: &str = "a subnet like \"198.18.0.0/15\" or \"fd00:198:18::/48\"";

/// An IPv4 or IPv6 subnet: an address and a prefix length. The address may have host bits
/// set (`198.18.0.1/15`); validation reports that, since it is usually a typo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

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

impl Cidr {
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    fn bits(&self) -> u8 {
        match self.addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// The subnet's first address: the address with the host bits cleared.
    pub fn network(&self) -> IpAddr {
        let host_bits = u32::from(self.bits() - self.prefix);
        match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(host_bits).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }

    /// True when the address is not the subnet's first one (`198.18.0.1/15`).
    pub fn has_host_bits(&self) -> bool {
        self.network() != self.addr
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
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
            // A bare address is the one host.
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
        if prefix > max {
            return Err(CidrError::PrefixTooLong { prefix, max });
        }
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    /// Always with the prefix length, as nftables and `ip` print subnets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

struct CidrVisitor;

impl Visitor<'_> for CidrVisitor {
    type Value = Cidr;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(CIDR_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cidr, E> {
        v.parse()
            .map_err(|e: CidrError| E::custom(format!("{e}; expected {CIDR_EXPECTED}")))
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(CidrVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().expect(s)
    }

    #[test]
    fn parses_subnets_and_bare_addresses() {
        assert_eq!(cidr("198.18.0.0/15").to_string(), "198.18.0.0/15");
        assert_eq!(cidr(" fd00:198:18::/48 ").to_string(), "fd00:198:18::/48");
        assert_eq!(cidr("198.18.0.7").to_string(), "198.18.0.7/32");
        assert_eq!(cidr("fd00:198:18::7").to_string(), "fd00:198:18::7/128");
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(cidr("::/0").to_string(), "::/0");
        assert!(cidr("198.18.0.0/15").is_ipv4());
        assert!(!cidr("::/0").is_ipv4());
    }

    #[test]
    fn host_bits() {
        assert!(!cidr("198.18.0.0/15").has_host_bits());
        assert!(cidr("198.19.0.0/15").has_host_bits());
        assert_eq!(cidr("198.19.1.2/15").network().to_string(), "198.18.0.0");
        assert!(!cidr("0.0.0.0/0").has_host_bits());
        assert!(cidr("198.18.0.1/0").has_host_bits());
        assert!(!cidr("198.18.0.1/32").has_host_bits());
        assert!(cidr("fd00:198:18::1/48").has_host_bits());
        assert_eq!(
            cidr("fd00:198:18:ff::1/48").network().to_string(),
            "fd00:198:18::"
        );
        assert!(!cidr("fd00:198:18::1/128").has_host_bits());
        assert!(cidr("::1/0").has_host_bits());
    }

    #[test]
    fn rejects_what_is_not_a_subnet() {
        let err = |s: &str| s.parse::<Cidr>().unwrap_err().to_string();
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
