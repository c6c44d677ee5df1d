//! Traffic classes (`[[class]]`): which flows share a peer's capacity how. A flow is put in
//! the first class whose selectors all match it (the client's DSCP as its SYN carried it,
//! the destination port, the destination prefix; a selector left out matches anything), or
//! in the default class when none does. The transport's class table is the default class
//! (number 0), then the configured ones in file order.

use std::fmt;

use ipnet::IpNet;
use pep_transport::{FlowMeta, TrafficClass, TrafficClassId};
use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::{cidr, BitRate, PepdConfig};

/// The name of the class that takes the flows no `[[class]]` matches.
pub const DEFAULT_CLASS_NAME: &str = "default";

/// Most `[[class]]` entries: the transport's classes less the default one.
pub const MAX_CLASSES: usize = pep_transport::MAX_TRAFFIC_CLASSES - 1;

/// One `[[class]]` entry.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassEntry {
    /// Unique; the `class` label of its metrics.
    pub name: String,
    /// The client's DSCP marks it takes (names like `"AF41"` or numbers 0 to 63).
    #[serde(default)]
    pub dscp: Vec<Dscp>,
    /// Destination ports it takes.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Destination prefixes it takes.
    #[serde(default, deserialize_with = "cidr::subnets")]
    pub subnets: Vec<IpNet>,
    /// Its share of what the priority classes leave, among the classes with data.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Served ahead of the classes without it, up to `max_rate`.
    #[serde(default)]
    pub priority: bool,
    /// Most it sends to one peer; required with `priority`.
    pub max_rate: Option<BitRate>,
}

fn default_weight() -> u32 {
    1
}

impl Default for ClassEntry {
    /// No name, no selector, weight 1, no priority, no cap.
    fn default() -> Self {
        ClassEntry {
            name: String::new(),
            dscp: Vec::new(),
            ports: Vec::new(),
            subnets: Vec::new(),
            weight: default_weight(),
            priority: false,
            max_rate: None,
        }
    }
}

impl ClassEntry {
    /// It has no selector, so it takes every flow that reaches it.
    pub fn takes_everything(&self) -> bool {
        self.dscp.is_empty() && self.ports.is_empty() && self.subnets.is_empty()
    }

    fn matches(&self, meta: &FlowMeta) -> bool {
        (self.dscp.is_empty() || self.dscp.iter().any(|d| d.0 == meta.dscp))
            && (self.ports.is_empty() || self.ports.contains(&meta.server.port()))
            && (self.subnets.is_empty()
                || self.subnets.iter().any(|n| n.contains(&meta.server.ip())))
    }
}

/// A DSCP value (6 bits), written as a number or by its name (RFC 4594, RFC 8622).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dscp(pub u8);

/// The code points by name, as `tc`, Wireshark and the RFCs write them.
const DSCP_NAMES: [(&str, u8); 23] = [
    ("DF", 0),
    ("CS0", 0),
    ("LE", 1),
    ("CS1", 8),
    ("AF11", 10),
    ("AF12", 12),
    ("AF13", 14),
    ("CS2", 16),
    ("AF21", 18),
    ("AF22", 20),
    ("AF23", 22),
    ("CS3", 24),
    ("AF31", 26),
    ("AF32", 28),
    ("AF33", 30),
    ("CS4", 32),
    ("AF41", 34),
    ("AF42", 36),
    ("AF43", 38),
    ("CS5", 40),
    ("VA", 44),
    ("EF", 46),
    ("CS6", 48),
];

impl Dscp {
    /// `name` (any case) as a code point; CS7 too.
    pub fn by_name(name: &str) -> Option<Dscp> {
        let upper = name.trim().to_ascii_uppercase();
        if upper == "CS7" {
            return Some(Dscp(56));
        }
        DSCP_NAMES
            .iter()
            .find(|(n, _)| *n == upper)
            .map(|&(_, v)| Dscp(v))
    }
}

impl fmt::Display for Dscp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DSCP_NAMES.iter().find(|(_, v)| *v == self.0) {
            Some((name, _)) => write!(f, "{name}"),
            None if self.0 == 56 => write!(f, "CS7"),
            None => write!(f, "{}", self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Dscp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DscpVisitor)
    }
}

struct DscpVisitor;

const DSCP_EXPECTED: &str = "a DSCP: 0 to 63, or a name like \"AF41\", \"EF\" or \"CS1\"";

impl Visitor<'_> for DscpVisitor {
    type Value = Dscp;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(DSCP_EXPECTED)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dscp, E> {
        u8::try_from(v)
            .ok()
            .filter(|v| *v < 64)
            .map(Dscp)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Signed(v), &DSCP_EXPECTED))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dscp, E> {
        u8::try_from(v)
            .ok()
            .filter(|v| *v < 64)
            .map(Dscp)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &DSCP_EXPECTED))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Dscp, E> {
        Dscp::by_name(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &DSCP_EXPECTED))
    }
}

/// The classes a gateway puts its flows in: `[[class]]` as the daemon matches them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrafficClasses {
    entries: Vec<ClassEntry>,
}

impl TrafficClasses {
    pub fn of(cfg: &PepdConfig) -> TrafficClasses {
        TrafficClasses {
            entries: cfg.class.clone(),
        }
    }

    /// No `[[class]]` is configured: every flow is alike, as the transport has them
    /// without classes.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The class of a flow with `meta`: 1 + the index of the first entry that matches, or
    /// 0, the default class.
    pub fn class_of(&self, meta: &FlowMeta) -> TrafficClassId {
        self.entries
            .iter()
            .position(|e| e.matches(meta))
            .and_then(|i| TrafficClassId::try_from(i + 1).ok())
            .unwrap_or(0)
    }

    /// The transport's table: the default class, then the entries; empty without entries.
    pub fn transport(&self) -> Vec<TrafficClass> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        let mut out = vec![TrafficClass::default()];
        out.extend(self.entries.iter().map(|e| TrafficClass {
            weight: e.weight,
            priority: e.priority,
            max_rate_bps: e.max_rate.map(BitRate::bps),
        }));
        out
    }

    /// Each class's name by number: `default`, then the entries'.
    pub fn names(&self) -> Vec<String> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        std::iter::once(DEFAULT_CLASS_NAME.to_owned())
            .chain(self.entries.iter().map(|e| e.name.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dscp: u8, server: &str) -> FlowMeta {
        FlowMeta {
            client: "198.18.1.2:40000".parse().expect("addr"),
            server: server.parse().expect("addr"),
            dscp,
            compression: false,
        }
    }

    fn entry(name: &str) -> ClassEntry {
        ClassEntry {
            name: name.into(),
            ..ClassEntry::default()
        }
    }

    #[test]
    fn the_first_class_whose_selectors_all_match() {
        let video = ClassEntry {
            dscp: vec![Dscp(34), Dscp(36)],
            ..entry("video")
        };
        let web = ClassEntry {
            ports: vec![80, 443],
            subnets: vec!["198.18.3.0/24".parse().expect("net")],
            ..entry("web")
        };
        let rest = ClassEntry {
            weight: 2,
            ..entry("rest")
        };
        let t = TrafficClasses {
            entries: vec![video, web],
        };
        assert_eq!(t.class_of(&meta(34, "198.19.0.1:5000")), 1);
        assert_eq!(t.class_of(&meta(36, "198.18.3.2:443")), 1);
        assert_eq!(t.class_of(&meta(8, "198.18.3.2:443")), 2);
        // Both selectors of `web` must hold.
        assert_eq!(t.class_of(&meta(8, "198.18.4.2:443")), 0);
        assert_eq!(t.class_of(&meta(8, "198.18.3.2:22")), 0);
        assert_eq!(t.names(), ["default", "video", "web"]);
        let mut with_rest = t.clone();
        with_rest.entries.push(rest);
        assert_eq!(with_rest.class_of(&meta(8, "198.18.4.2:443")), 3);
        assert_eq!(with_rest.transport()[3].weight, 2);
        assert!(TrafficClasses::default().transport().is_empty());
    }

    #[test]
    fn dscp_names_and_numbers() {
        assert_eq!(Dscp::by_name("af41"), Some(Dscp(34)));
        assert_eq!(Dscp::by_name("EF"), Some(Dscp(46)));
        assert_eq!(Dscp::by_name("CS1"), Some(Dscp(8)));
        assert_eq!(Dscp::by_name("cs7"), Some(Dscp(56)));
        assert_eq!(Dscp::by_name("AF44"), None);
        assert_eq!(Dscp(34).to_string(), "AF41");
        assert_eq!(Dscp(56).to_string(), "CS7");
        assert_eq!(Dscp(63).to_string(), "63");
    }
}
