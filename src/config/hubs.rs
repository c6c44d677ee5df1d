//! `[peer] address`: the hub's tunnel address, or several hubs' in order of preference
//! (a terminal served by one of them at a time, docs/PROTOCOL.md §10).

use std::fmt;
use std::net::SocketAddr;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

/// Most hubs one terminal lists.
pub const MAX_HUB_ADDRESSES: usize = pep_transport::MAX_HUBS;

/// One address or a list of 1 to [`MAX_HUB_ADDRESSES`] distinct ones, the first preferred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubAddresses(Vec<SocketAddr>);

impl HubAddresses {
    pub fn one(address: SocketAddr) -> Self {
        HubAddresses(vec![address])
    }

    /// The address the association starts towards: the only one, or the preferred.
    pub fn first(&self) -> SocketAddr {
        self.0[0]
    }

    pub fn all(&self) -> &[SocketAddr] {
        &self.0
    }

    /// The addresses after the first.
    pub fn alternates(&self) -> &[SocketAddr] {
        &self.0[1..]
    }

    /// The first address with another port: tests and reload checks change it in place.
    pub fn set_port(&mut self, port: u16) {
        self.0[0].set_port(port);
    }
}

impl fmt::Display for HubAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                let list: Vec<String> = many.iter().map(SocketAddr::to_string).collect();
                write!(f, "[{}]", list.join(", "))
            }
        }
    }
}

impl<'de> Deserialize<'de> for HubAddresses {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not `#[serde(untagged)]`: that buffers the value first, which loses the key path
        // and the span, and turns every error into "did not match any variant".
        d.deserialize_any(HubAddressesVisitor)
    }
}

struct HubAddressesVisitor;

impl<'de> Visitor<'de> for HubAddressesVisitor {
    type Value = HubAddresses;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a socket address, or a list of up to 8 in order of preference")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<HubAddresses, E> {
        v.parse::<SocketAddr>()
            .map(HubAddresses::one)
            .map_err(|_| E::custom("invalid socket address syntax"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<HubAddresses, A::Error> {
        let mut list: Vec<SocketAddr> = Vec::new();
        while let Some(a) = seq.next_element::<SocketAddr>()? {
            if list.contains(&a) {
                return Err(de::Error::custom(format!("lists {a} twice")));
            }
            list.push(a);
            if list.len() > MAX_HUB_ADDRESSES {
                return Err(de::Error::custom(format!(
                    "lists more than {MAX_HUB_ADDRESSES} hubs"
                )));
            }
        }
        if list.is_empty() {
            return Err(de::Error::custom("lists no address"));
        }
        Ok(HubAddresses(list))
    }
}
