//! The peers a gateway talks to: one `[peer]` table (a pair of gateways, the form pepd has
//! always read) or `[[peer]]` entries (a hub and its terminals, each with its own key, subnets
//! and rates), and [`PeerSpec`], the one view of either form the rest of pepd reads.

use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{cidr, BitRate, PairConfig, PepdConfig, Side, DEFAULT_TUNNEL_PORT};
use crate::config::keys::KEY_LEN;

/// Most `[[peer]]` entries one gateway takes: a hub's connection IDs have room for 8 × 8192
/// associations, and one shard's worth is what the first multi-peer steps serve.
pub const MAX_PEERS: usize = 8192;

/// The name the `[peer]` table's peer goes by in logs and metric labels.
pub const PAIR_PEER_NAME: &str = "peer";

/// Longest `[[peer]]` name: it becomes a metric label value and a log field.
pub const MAX_NAME_LEN: usize = 32;

/// `peer` as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Peers {
    /// `[peer]`: side and bind in the table, the key in `security.peer_public_key`, the
    /// rates in `[link]`.
    Pair(PairConfig),
    /// `[[peer]]`: side and bind in `[tunnel]`, everything else per entry.
    List(Vec<PeerEntry>),
}

/// One `[[peer]]` entry.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerEntry {
    /// Unique; names the peer in logs and metric labels.
    pub name: String,
    /// Base64 X25519 public key; required with `security.mode = "noise"`.
    pub public_key: Option<String>,
    /// Its tunnel address (UDP); a terminal behind NAT has none, the hub learns it.
    pub address: Option<SocketAddr>,
    /// The prefixes reached through this peer.
    #[serde(deserialize_with = "cidr::subnets")]
    pub subnets: Vec<IpNet>,
    /// Most this gateway sends to it (MIR); default `link.tx_rate`.
    pub tx_rate: Option<BitRate>,
    /// What it sends to us; sizes the receive windows. Default `link.rx_rate`.
    pub rx_rate: Option<BitRate>,
    /// What it is guaranteed of `link.tx_rate` when it has data (CIR); default 0.
    pub min_rate: Option<BitRate>,
    /// Its share of the capacity left over once every CIR is served.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Overrides `transport.keepalive` for this peer (a NAT mapping to keep open).
    #[serde(default, with = "humantime_serde")]
    pub keepalive: Option<Duration>,
    /// Most flows with this peer open at once, both directions together; default
    /// `limits.max_flows`, so that one terminal cannot take the whole flow table.
    pub max_flows: Option<usize>,
}

fn default_weight() -> u32 {
    1
}

/// Most workers a hub runs: a connection ID names at most 2^3 shards (docs/PROTOCOL.md §8).
pub const MAX_WORKERS: usize = 8;

/// `[tunnel]`: this gateway's end of the tunnel in the `[[peer]]` form.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelConfig {
    pub side: Side,
    /// Local tunnel address (UDP); default the unspecified address of the first peer
    /// address's family, port 7400.
    pub bind: Option<SocketAddr>,
    /// A hub's worker threads; default the cores available. Read through
    /// [`PepdConfig::workers`].
    #[serde(default)]
    pub workers: Option<usize>,
    /// A hub answers a short packet for a connection ID it does not hold with a HINT;
    /// default on with security. Read through [`PepdConfig::hints`].
    #[serde(default)]
    pub hints: Option<bool>,
    /// A hub of a redundant set sharing one static key and peer list (active/standby): it
    /// binds its tunnel address whether or not this host holds it yet, and makes no
    /// association before a terminal initiates. Read through [`PepdConfig::redundant`].
    #[serde(default)]
    pub redundant: bool,
}

/// One peer as pepd serves it, whichever form the config used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub name: String,
    /// `None` only with `security.mode = "none"` (or a config that failed validation).
    pub public_key: Option<[u8; KEY_LEN]>,
    pub address: Option<SocketAddr>,
    /// Host bits cleared.
    pub subnets: Vec<IpNet>,
    pub tx_bps: u64,
    pub rx_bps: u64,
    pub min_bps: u64,
    pub weight: u32,
    pub keepalive: Duration,
    /// Its flows open at once, either side's.
    pub max_flows: usize,
}

impl<'de> Deserialize<'de> for Peers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not `#[serde(untagged)]`: that buffers the value first, which loses the key path
        // and the span, and turns every error into "did not match any variant".
        d.deserialize_any(PeersVisitor)
    }
}

struct PeersVisitor;

impl<'de> Visitor<'de> for PeersVisitor {
    type Value = Peers;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a `[peer]` table (one peer) or `[[peer]]` entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Peers, A::Error> {
        PairConfig::deserialize(MapAccessDeserializer::new(map)).map(Peers::Pair)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Peers, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = seq.next_element::<PeerEntry>()? {
            entries.push(entry);
        }
        Ok(Peers::List(entries))
    }
}

impl Peers {
    pub fn len(&self) -> usize {
        match self {
            Peers::Pair(_) => 1,
            Peers::List(entries) => entries.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key of the `i`th peer's address, for messages: `peer.address` or
    /// `peer[2].address`.
    pub fn address_key(&self, i: usize) -> String {
        match self {
            Peers::Pair(_) => "peer.address".to_owned(),
            Peers::List(_) => format!("peer[{i}].address"),
        }
    }
}

/// Connection ID length of a hub with `[[peer]]` entries: 2 bytes name up to 65,536
/// associations, even with one peer so that more can be added. Everywhere else (a
/// terminal, either end of a `[peer]` pair) the one association needs none.
const HUB_CID_LEN: u8 = 2;

/// A terminal peer without the address its association starts towards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{key}` of peer {peer} is not set: a terminal starts the association, so it needs its \
     hub's tunnel address (only a hub learns its peers' addresses)"
)]
pub struct Unservable {
    key: String,
    peer: String,
}

impl PepdConfig {
    /// Every peer as pepd serves it, in the order of the file. The `[peer]` table is one
    /// peer named "peer" that every destination is routed to (`0.0.0.0/0`, `::/0`), at the
    /// `[link]` rates.
    pub fn peer_specs(&self) -> Vec<PeerSpec> {
        let decode =
            |key: Option<&String>| key.and_then(|k| crate::config::keys::decode_key(k).ok());
        match &self.peer {
            Peers::Pair(pair) => vec![PeerSpec {
                name: PAIR_PEER_NAME.to_owned(),
                public_key: decode(self.security.peer_public_key.as_ref()),
                address: Some(pair.address.first()),
                subnets: vec![IpNet::V4(Ipv4Net::default()), IpNet::V6(Ipv6Net::default())],
                tx_bps: self.link.tx_rate.bps(),
                rx_bps: self.link.rx_rate.bps(),
                min_bps: 0,
                weight: default_weight(),
                keepalive: self.transport.keepalive,
                max_flows: self.limits.max_flows,
            }],
            Peers::List(entries) => entries
                .iter()
                .map(|e| PeerSpec {
                    name: e.name.clone(),
                    public_key: decode(e.public_key.as_ref()),
                    address: e.address,
                    subnets: e.subnets.iter().map(IpNet::trunc).collect(),
                    tx_bps: e.tx_rate.unwrap_or(self.link.tx_rate).bps(),
                    rx_bps: e.rx_rate.unwrap_or(self.link.rx_rate).bps(),
                    min_bps: e.min_rate.map_or(0, BitRate::bps),
                    weight: e.weight,
                    keepalive: e.keepalive.unwrap_or(self.transport.keepalive),
                    max_flows: e.max_flows.unwrap_or(self.limits.max_flows),
                })
                .collect(),
        }
    }

    /// Which end of the hop this gateway is: `peer.side`, or `tunnel.side` with
    /// `[[peer]]` entries.
    pub fn side(&self) -> Side {
        match (&self.peer, &self.tunnel) {
            (Peers::Pair(pair), _) => pair.side,
            (Peers::List(_), Some(tunnel)) => tunnel.side,
            // Validation requires `[tunnel]` with entries; a list of peers is a hub's.
            (Peers::List(_), None) => Side::Hub,
        }
    }

    /// The local tunnel address: `bind` as written, else the unspecified address of the
    /// (first) peer address's family, port 7400; IPv4 when no peer has an address.
    pub fn tunnel_bind(&self) -> SocketAddr {
        let (bind, first_address) = match &self.peer {
            Peers::Pair(pair) => (pair.bind, Some(pair.address.first())),
            Peers::List(entries) => (
                self.tunnel.as_ref().and_then(|t| t.bind),
                entries.iter().find_map(|e| e.address),
            ),
        };
        bind.unwrap_or_else(|| match first_address {
            Some(SocketAddr::V6(_)) => {
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, DEFAULT_TUNNEL_PORT))
            }
            _ => SocketAddr::from((Ipv4Addr::UNSPECIFIED, DEFAULT_TUNNEL_PORT)),
        })
    }

    /// What `pepd run` cannot serve although `check-config` accepts it, refused at start
    /// rather than served in part: a terminal sends first, so it needs its hub's address (a
    /// hub learns a terminal's from its authenticated initiation).
    pub fn check_servable(&self) -> Result<(), Unservable> {
        if self.side() != Side::Terminal {
            return Ok(());
        }
        for (i, peer) in self.peer_specs().iter().enumerate() {
            if peer.address.is_none() {
                return Err(Unservable {
                    key: self.peer.address_key(i),
                    peer: peer.name.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The connection ID length this gateway's endpoint chooses.
    pub fn cid_len(&self) -> u8 {
        match (&self.peer, self.side()) {
            (Peers::List(_), Side::Hub) => HUB_CID_LEN,
            _ => 0,
        }
    }

    /// Whether this gateway sends HINTs (docs/PROTOCOL.md §7.7): a hub with security, unless
    /// `tunnel.hints = false`.
    pub fn hints(&self) -> bool {
        self.cid_len() > 0
            && self.security.mode == crate::config::SecurityMode::Noise
            && self.tunnel.as_ref().and_then(|t| t.hints) != Some(false)
    }

    /// The threads a hub serves its associations on: `tunnel.workers`, else the cores
    /// available, at most [`MAX_WORKERS`] (the shards a connection ID can name). One for
    /// a pair and a terminal: one association has nothing to spread.
    pub fn workers(&self) -> usize {
        if self.cid_len() == 0 {
            return 1;
        }
        let wanted = self.tunnel.as_ref().and_then(|t| t.workers);
        wanted
            .unwrap_or_else(crate::config::budget::runtime_threads)
            .clamp(1, MAX_WORKERS)
    }

    /// Every address a peer may send from: each peer's, and every hub of a terminal's list.
    pub fn peer_addresses(&self) -> Vec<SocketAddr> {
        match &self.peer {
            Peers::Pair(pair) => pair.address.all().to_vec(),
            Peers::List(entries) => entries.iter().filter_map(|e| e.address).collect(),
        }
    }

    /// A terminal's hubs, when `[peer] address` lists several: the transport tries the
    /// others while the one serving it is silent (docs/PROTOCOL.md §10).
    pub fn hubs(&self) -> Option<pep_transport::Hubs> {
        let Peers::Pair(pair) = &self.peer else {
            return None;
        };
        (pair.address.all().len() > 1).then(|| pep_transport::Hubs {
            addresses: pair.address.all().to_vec(),
            return_after: pair.return_to_preferred.then_some(pair.return_after),
        })
    }

    /// `[tunnel] redundant`: false in the `[peer]` form.
    pub fn redundant(&self) -> bool {
        self.tunnel.as_ref().is_some_and(|t| t.redundant)
    }

    /// Whether the tunnel runs over IPv6: the peer's family for the `[peer]` table (as it
    /// always was), the bind address's for `[[peer]]` entries.
    pub(super) fn tunnel_is_ipv6(&self) -> bool {
        match &self.peer {
            Peers::Pair(pair) => pair.address.first().is_ipv6(),
            Peers::List(_) => self.tunnel_bind().is_ipv6(),
        }
    }
}

/// Whether `name` can name a peer: 1 to 32 of `A-Z a-z 0-9 . _ -`, safe in a metric label
/// and a log line as it is.
pub(super) fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A subnet of a `[[peer]]` entry: `peer[peer].subnets[index]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SubnetAt {
    pub peer: usize,
    pub index: usize,
    pub net: IpNet,
}

/// The subnets of every entry, host bits cleared.
pub(super) fn subnets_of(entries: &[PeerEntry]) -> Vec<SubnetAt> {
    entries
        .iter()
        .enumerate()
        .flat_map(|(peer, e)| {
            e.subnets
                .iter()
                .enumerate()
                .map(move |(index, net)| SubnetAt {
                    peer,
                    index,
                    net: net.trunc(),
                })
        })
        .collect()
}

/// Pairs of subnets of different peers where one holds the other (equal or nested), as
/// (outer, inner). Each subnet is reported at most once, with the closest enclosing subnet
/// of another peer. Sorted by network then prefix length, a subnet comes after every subnet
/// holding it, so a stack of the open prefixes finds them in O(n log n).
pub(super) fn overlaps(subnets: &[SubnetAt]) -> Vec<(SubnetAt, SubnetAt)> {
    let mut sorted = subnets.to_vec();
    sorted.sort_by_key(|s| (s.net.network(), s.net.prefix_len(), s.peer, s.index));
    let mut open: Vec<SubnetAt> = Vec::new();
    let mut found = Vec::new();
    for s in sorted {
        while open.last().is_some_and(|o| !o.net.contains(&s.net)) {
            open.pop();
        }
        // Every open prefix holds `s`; the innermost of another peer is the one to name.
        if let Some(outer) = open.iter().rev().find(|o| o.peer != s.peer) {
            found.push((*outer, s));
        }
        open.push(s);
    }
    found
}

/// The entries with the same value of `key`, as (earlier, later) indices; `None` values
/// are skipped.
pub(super) fn duplicates<K: std::hash::Hash + Eq>(
    keys: impl IntoIterator<Item = Option<K>>,
) -> Vec<(usize, usize)> {
    let mut first: HashMap<K, usize> = HashMap::new();
    let mut found = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        if let Some(key) = key {
            match first.get(&key) {
                Some(&earlier) => found.push((earlier, i)),
                None => {
                    first.insert(key, i);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests;
