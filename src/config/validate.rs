//! Semantic checks after deserialization: ranges, and settings that contradict each other.
//! Every problem is collected, so an operator fixes a file in one round rather than one
//! error per restart.

use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::bounds::{Bounded, Bounds};
use super::classes::{DEFAULT_CLASS_NAME, MAX_CLASSES};
use super::error::{sort_by_position, Position};
use super::peers::{self, PeerEntry, MAX_NAME_LEN, MAX_PEERS};
use super::units::{approx, dur};
use super::{
    cidr, BitRate, ByteSize, ConfigError, Diagnostic, PairConfig, Peers, PepdConfig, SecurityMode,
    Side, SourceMap, MIN_RETURN_AFTER,
};

const MIN_RATE: BitRate = BitRate(8_000);
const MAX_RATE: BitRate = BitRate(100_000_000_000);
const MIN_MTU: usize = 576;
const MIN_MTU_V6: usize = 1280;
const MAX_MTU: usize = 9000;
/// Link-layer encapsulation beyond this per packet is not a satellite link's (GSE adds
/// 2–10 bytes, an RCS2 burst header a few tens).
const MAX_FRAME_OVERHEAD: usize = 1024;
const MAX_ACK_DELAY: Duration = Duration::from_secs(1);
const MIN_OUTAGE_LIMIT: Duration = Duration::from_secs(1);
const MAX_PACING_BURST: Duration = Duration::from_millis(100);
const MAX_FLOWS: usize = 1_000_000;
const MIN_FLOW_BUFFER: ByteSize = ByteSize(64 << 10);
/// The transport's receive window limit.
const MAX_FLOW_BUFFER: ByteSize = ByteSize(1 << 30);
const MIN_MEMORY_BUDGET: ByteSize = ByteSize(1 << 20);
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Short enough for tests to watch several rekeys; below 10 s is warned about.
const MIN_REKEY_INTERVAL: Duration = Duration::from_secs(1);
const MAX_REKEY_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// Fewer packets per key would spend a good part of the link on handshakes.
const MIN_REKEY_PACKETS: u64 = 1000;
const MAX_WEIGHT: u32 = 1000;
/// nftables takes longer table names; this keeps them plain words that need no quoting.
const MAX_NFT_TABLE_LEN: usize = 32;

struct Checker<'a> {
    map: &'a SourceMap,
    found: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn fail(&mut self, key: &str, why: impl Display) {
        let d = self.map.diagnostic(key, format!("`{key}` {why}"));
        self.found.push(d);
    }

    fn check(&mut self, ok: bool, key: &str, why: impl Display) {
        if !ok {
            self.fail(key, why);
        }
    }

    /// Reports `key` unless `value` lies in `range` (`a..=b`, `a..` or `..=b`), as "must be
    /// 1 to 1000, not 0", "must be at least 1s, not 500ms" or "must be at most 1s, not 2s".
    /// True if it does.
    fn range<T: Bounded>(&mut self, key: &str, value: T, range: impl Into<Bounds<T>>) -> bool {
        self.range_in(key, value, range, "")
    }

    /// As [`range`](Self::range), with the limits' `unit` written after them (" bytes").
    fn range_in<T: Bounded>(
        &mut self,
        key: &str,
        value: T,
        range: impl Into<Bounds<T>>,
        unit: &str,
    ) -> bool {
        let bounds = range.into();
        let ok = bounds.contains(value);
        if !ok {
            let value = value.show();
            self.fail(key, format!("must be {bounds}{unit}, not {value}"));
        }
        ok
    }

    /// A problem with `key` shown at `position`: for a key the file leaves out but must
    /// have, there is no default to blame.
    fn fail_at(&mut self, key: &str, position: Position, why: impl Display) {
        let d = self
            .map
            .diagnostic_at(key, position, format!("`{key}` {why}"));
        self.found.push(d);
    }

    /// Where the `[[peer]]` entry `i` starts: its header.
    fn entry_position(&self, i: usize) -> Position {
        match self.map.position(&format!("peer[{i}]")) {
            Position::Default => Position::Document,
            at => at,
        }
    }
}

fn ms(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

impl PepdConfig {
    /// Checks ranges and consistency; `parse` and `load` call it. Errors name every bad key
    /// with its line, or "(default)" for a key the file leaves out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut c = Checker {
            map: &self.source_map,
            found: Vec::new(),
        };
        self.check_log(&mut c);
        self.check_intercept(&mut c);
        self.check_rules(&mut c);
        self.check_tunnel(&mut c);
        match &self.peer {
            Peers::Pair(pair) => self.check_peer(pair, &mut c),
            Peers::List(entries) => self.check_peers(entries, &mut c),
        }
        self.check_link(&mut c);
        self.check_transport(&mut c);
        self.check_limits(&mut c);
        self.check_timeouts(&mut c);
        self.check_security(&mut c);
        self.check_control(&mut c);
        self.check_classes(&mut c);
        self.check_announce(&mut c);
        if c.found.is_empty() {
            // Ours are stricter; this catches a rule the transport gains later.
            if let Err(e) = self.transport().validate() {
                let key = transport_key(e.key, self);
                c.fail(key, format!("gives an invalid transport setting: {e}"));
            }
        }
        if c.found.is_empty() {
            return Ok(());
        }
        let mut found = c.found;
        sort_by_position(&mut found);
        Err(ConfigError::Invalid(found))
    }

    fn check_classes(&self, c: &mut Checker<'_>) {
        let classes = &self.class;
        if classes.len() > MAX_CLASSES {
            c.fail(
                "class",
                format!(
                    "has {} entries; at most {MAX_CLASSES} are supported",
                    classes.len()
                ),
            );
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        // The first entry without selectors takes every flow after it.
        let mut catch_all: Option<usize> = None;
        for (i, e) in classes.iter().enumerate() {
            let key = |field: &str| format!("class[{i}].{field}");
            if check_name(c, &key("name"), &e.name) {
                if e.name == DEFAULT_CLASS_NAME {
                    c.fail(
                        &key("name"),
                        "(\"default\") is the name of the class of the flows no `[[class]]` \
                         takes: give this one another",
                    );
                } else if let Some(first) = names.insert(&e.name, i) {
                    c.fail(
                        &key("name"),
                        format!(
                            "is also `class[{first}].name` ({}): each class needs its own name",
                            c.map.describe(&format!("class[{first}].name"))
                        ),
                    );
                }
            }
            if let Some(first) = catch_all {
                c.fail_at(
                    &format!("class[{i}]"),
                    class_position(c, i),
                    format!(
                        "never takes a flow: `class[{first}]` ({}) has no `dscp`, `ports` or \
                         `subnets` and takes every flow that reaches it; put it last",
                        c.map.describe(&format!("class[{first}].name"))
                    ),
                );
            } else if e.takes_everything() {
                catch_all = Some(i);
            }
            let mut seen = HashSet::new();
            for (j, d) in e.dscp.iter().enumerate() {
                if !seen.insert(d.0) {
                    c.fail(
                        &format!("class[{i}].dscp[{j}]"),
                        format!("({d}) is listed twice"),
                    );
                }
            }
            let mut seen = HashSet::new();
            for (j, port) in e.ports.iter().enumerate() {
                let k = format!("class[{i}].ports[{j}]");
                if *port == 0 {
                    c.fail(&k, "must be a port from 1 to 65535, not 0");
                } else if !seen.insert(port) {
                    c.fail(&k, format!("({port}) is listed twice"));
                }
            }
            for (j, subnet) in e.subnets.iter().enumerate() {
                c.check(
                    !cidr::has_host_bits(subnet),
                    &format!("class[{i}].subnets[{j}]"),
                    host_bits(subnet),
                );
            }
            c.range(&key("weight"), e.weight, 1..=MAX_WEIGHT);
            if let Some(rate) = e.max_rate {
                c.range(&key("max_rate"), rate, MIN_RATE..=MAX_RATE);
            } else if e.priority {
                c.fail_at(
                    &key("max_rate"),
                    class_position(c, i),
                    format!(
                        "is required with `class[{i}].priority = true` ({}): a priority class \
                         without a cap could starve every other class",
                        c.map.describe(&key("priority"))
                    ),
                );
            }
        }
    }

    /// The announcement tables are pepd's alone: never a table the kernel reserves, nor the
    /// one the interception's `local` route lives in, which the flush would empty.
    fn check_announce(&self, c: &mut Checker<'_>) {
        let Some(a) = &self.announce else {
            return;
        };
        if self.side() != Side::Hub {
            c.fail(
                "announce",
                "is for a hub: a terminal's subnets are behind it, not behind its hub",
            );
        } else if matches!(self.peer, Peers::Pair(_)) {
            c.fail(
                "announce",
                "needs `[[peer]]` entries: the `[peer]` table's one peer is every destination \
                 (0.0.0.0/0 and ::/0), which no hub should announce",
            );
        }
        let mut tables = vec![("announce.table", a.table)];
        if let Some(t) = a.outage_table {
            tables.push(("announce.outage_table", t));
        }
        for (key, table) in tables {
            if super::RESERVED_TABLES.contains(&table) {
                c.fail(
                    key,
                    format_args!(
                        "({table}) is a table the kernel reserves (0 unspecified, 253 default, \
                         254 main, 255 local): pepd empties its tables at start and at exit"
                    ),
                );
            } else if table == self.rules.route_table {
                c.fail(
                    key,
                    format_args!(
                        "({table}) is `rules.route_table`, which holds the interception's \
                         `local` route: pepd empties its announcement tables at start and at exit"
                    ),
                );
            }
        }
    }

    fn check_control(&self, c: &mut Checker<'_>) {
        let Some(path) = &self.control.socket else {
            return;
        };
        let key = "control.socket";
        let shown = path.display();
        if !path.is_absolute() {
            c.fail(key, format_args!("({shown}) must be an absolute path"));
        } else if path.file_name().is_none() || path.as_os_str().as_encoded_bytes().ends_with(b"/")
        {
            c.fail(
                key,
                format_args!("({shown}) must name a file, not a directory"),
            );
        }
        let len = path.as_os_str().len();
        if len > super::control::MAX_SOCKET_PATH {
            c.fail(
                key,
                format_args!(
                    "is {len} bytes long; a unix socket's path holds at most {}",
                    super::control::MAX_SOCKET_PATH
                ),
            );
        }
    }

    fn check_log(&self, c: &mut Checker<'_>) {
        let level = self.log.level.trim();
        if level.is_empty() {
            c.fail("log.level", "must not be empty (e.g. \"info\")");
        } else if let Err(e) = tracing_subscriber::EnvFilter::try_new(level) {
            c.fail(
                "log.level",
                format!("is not a valid filter like \"info\" or \"pepd=debug,info\": {e}"),
            );
        }
    }

    fn check_intercept(&self, c: &mut Checker<'_>) {
        let listen = &self.intercept.listen;
        c.check(
            !listen.is_empty(),
            "intercept.listen",
            "must list at least one address",
        );
        let mut seen = HashSet::new();
        for (i, addr) in listen.iter().enumerate() {
            let key = format!("intercept.listen[{i}]");
            if addr.port() == 0 {
                c.fail(&key, format!("({addr}) needs a port other than 0"));
            }
            if !seen.insert(addr) {
                c.fail(&key, format!("({addr}) is listed twice"));
            }
        }
        c.check(
            self.intercept.own_mark != 0,
            "intercept.own_mark",
            "must not be 0: unmarked traffic is what gets intercepted",
        );
    }

    fn check_rules(&self, c: &mut Checker<'_>) {
        let r = &self.rules;
        let mut seen = HashSet::new();
        for (i, name) in r.interfaces.iter().enumerate() {
            let key = format!("rules.interfaces[{i}]");
            if let Err(why) = check_interface_name(name) {
                c.fail(&key, format!("({name:?}) {why}"));
            } else if !seen.insert(name) {
                c.fail(&key, format!("({name:?}) is listed twice"));
            }
        }
        let mut seen = HashSet::new();
        for (i, port) in r.ports.iter().enumerate() {
            let key = format!("rules.ports[{i}]");
            if *port == 0 {
                c.fail(&key, "must be a port from 1 to 65535, not 0");
            } else if !seen.insert(port) {
                c.fail(&key, format!("({port}) is listed twice"));
            }
        }
        c.check(
            !r.quic_ports.is_empty(),
            "rules.quic_ports",
            "must list at least one port (443 is HTTP/3's)",
        );
        let mut seen = HashSet::new();
        for (i, port) in r.quic_ports.iter().enumerate() {
            let key = format!("rules.quic_ports[{i}]");
            if *port == 0 {
                c.fail(&key, "must be a port from 1 to 65535, not 0");
            } else if !seen.insert(port) {
                c.fail(&key, format!("({port}) is listed twice"));
            }
        }
        for (list, subnets) in [
            ("rules.bypass_subnets", &r.bypass_subnets),
            ("rules.proxy_subnets", &r.proxy_subnets),
            ("rules.quic_exceptions", &r.quic_exceptions),
        ] {
            for (i, subnet) in subnets.iter().enumerate() {
                c.check(
                    !cidr::has_host_bits(subnet),
                    &format!("{list}[{i}]"),
                    host_bits(subnet),
                );
            }
        }
        let listened = |v4: bool| self.intercept.listen.iter().any(|a| a.is_ipv4() == v4);
        if !r.proxy_subnets.is_empty()
            && !r.proxy_subnets.iter().any(|n| listened(n.addr().is_ipv4()))
        {
            c.fail(
                "rules.proxy_subnets",
                "lists no subnet of an address family `intercept.listen` has a listener for, \
                 so nothing would be intercepted",
            );
        }
        if r.tproxy_mark == 0 {
            c.fail(
                "rules.tproxy_mark",
                "must not be 0: the policy-routing rule needs a mark to match",
            );
        } else if r.tproxy_mark == self.intercept.own_mark {
            c.fail(
                "rules.tproxy_mark",
                format!(
                    "({:#x}) must differ from `intercept.own_mark` ({:#x}, {}): pepd's own \
                     packets would be delivered to itself",
                    r.tproxy_mark,
                    self.intercept.own_mark,
                    c.map.describe("intercept.own_mark")
                ),
            );
        }
        c.check(
            !RESERVED_TABLES.contains(&r.route_table),
            "rules.route_table",
            format!(
                "must not be 0 or a system table (253 default, 254 main, 255 local), not {}",
                r.route_table
            ),
        );
        c.check(
            is_nft_table_name(&r.table),
            "rules.table",
            format!(
                "({:?}) must be a letter followed by at most {} letters, digits or '_'",
                r.table,
                MAX_NFT_TABLE_LEN - 1
            ),
        );
    }

    fn check_peer(&self, pair: &PairConfig, c: &mut Checker<'_>) {
        let addr = pair.address.first();
        for &a in pair.address.all() {
            check_peer_address(c, "peer.address", a);
        }
        if let Some(&other) = pair
            .address
            .alternates()
            .iter()
            .find(|a| a.is_ipv4() != addr.is_ipv4())
        {
            c.fail(
                "peer.address",
                format!("lists {other} and {addr}: every hub must be of one address family"),
            );
        }
        if let Some(bind) = pair.bind {
            c.check(
                bind.is_ipv4() == addr.is_ipv4(),
                "peer.bind",
                format!("({bind}) must be of the same address family as `peer.address` ({addr})"),
            );
        }
        let several = pair.address.all().len() > 1;
        if several && pair.side == Side::Hub {
            c.fail(
                "peer.address",
                format!(
                    "({}) lists several hubs, which only a terminal can: a hub's peer is one                      terminal",
                    pair.address
                ),
            );
        }
        if several && self.security.mode != SecurityMode::Noise {
            c.fail(
                "peer.address",
                "lists several hubs, which needs `security.mode = \"noise\"`: a terminal moves                  only to a hub whose handshake authenticated",
            );
        }
        c.check(
            pair.return_after >= MIN_RETURN_AFTER,
            "peer.return_after",
            format!(
                "({}) must be at least {}: every move resets the terminal's flows",
                dur(pair.return_after),
                dur(MIN_RETURN_AFTER)
            ),
        );
    }

    /// `[tunnel]` belongs to the `[[peer]]` form, and that form needs it.
    fn check_tunnel(&self, c: &mut Checker<'_>) {
        match (&self.peer, &self.tunnel) {
            (Peers::List(_), None) => c.fail_at(
                "tunnel",
                Position::Document,
                "is required with `[[peer]]` entries: add a `[tunnel]` section with this \
                 gateway's `side` (\"hub\" or \"terminal\") and, optionally, its `bind` address",
            ),
            (Peers::Pair(_), Some(_)) => c.fail(
                "peer",
                format!(
                    "is a single `[peer]` table, which keeps its own `side` and `bind`: \
                     `[tunnel]` ({}) is only for `[[peer]]` entries; move its keys into \
                     `[peer]`, or write the peers as `[[peer]]` entries",
                    c.map.describe("tunnel")
                ),
            ),
            _ => {}
        }
        if self.tunnel.as_ref().and_then(|t| t.workers) == Some(0) {
            c.fail(
                "tunnel.workers",
                "must be at least 1 (leave it out for one per core available)",
            );
        }
        if self.tunnel.as_ref().and_then(|t| t.hints) == Some(true) {
            if self.security.mode != SecurityMode::Noise {
                c.fail(
                    "tunnel.hints",
                    "needs `security.mode = \"noise\"`: a hint asks the terminal for an \
                     authenticated handshake, which there is none of without security",
                );
            } else if self.side() != Side::Hub {
                c.fail(
                    "tunnel.hints",
                    "is for a hub (`tunnel.side = \"hub\"`): only a hub chooses connection \
                     IDs, so only it can tell that it holds none for a packet",
                );
            }
        }
        if self.redundant() {
            self.check_redundant(c);
        }
    }

    /// A redundant hub answers from the address that moves between the hubs, and tells its
    /// terminals apart by their keys.
    fn check_redundant(&self, c: &mut Checker<'_>) {
        if self.side() != Side::Hub {
            c.fail(
                "tunnel.redundant",
                "is for hubs: a terminal starts its association, and a set of redundant hubs \
                 is one peer to it",
            );
        }
        match self.tunnel.as_ref().and_then(|t| t.bind) {
            Some(bind) if !bind.ip().is_unspecified() => {}
            _ => c.fail(
                "tunnel.redundant",
                "needs `tunnel.bind` set to the virtual address the hubs share (not a \
                 wildcard): a redundant hub binds it before it holds it, so that its replies \
                 leave from it once it does",
            ),
        }
        if self.security.mode != SecurityMode::Noise {
            c.fail(
                "tunnel.redundant",
                "needs `security.mode = \"noise\"`: the hubs share one static key, which is \
                 what lets a terminal's authenticated handshake reach whichever of them holds \
                 the address",
            );
        }
    }

    /// The `[[peer]]` form: each entry on its own, then what entries must not share.
    fn check_peers(&self, entries: &[PeerEntry], c: &mut Checker<'_>) {
        let count = entries.len();
        if count == 0 {
            c.fail("peer", "must have at least one `[[peer]]` entry");
        } else if count > MAX_PEERS {
            c.fail(
                "peer",
                format!("has {count} entries; at most {MAX_PEERS} are supported"),
            );
        }
        if count > 1 && self.side() == Side::Terminal {
            c.fail(
                "peer",
                format!(
                    "has {count} entries, but a terminal (`tunnel.side = \"terminal\"`, {}) \
                     has one peer, its hub: only a hub serves several",
                    c.map.describe("tunnel.side")
                ),
            );
        }
        if self.security.peer_public_key.is_some() {
            c.fail(
                "security.peer_public_key",
                "is for a single `[peer]` table; with `[[peer]]` entries each has \
                 `public_key`: move it into the entry of that peer",
            );
        }
        for (i, entry) in entries.iter().enumerate() {
            self.check_entry(i, entry, c);
        }
        self.check_entries_differ(entries, c);
        self.check_min_rates_fit(entries, c);
    }

    fn check_entry(&self, i: usize, e: &PeerEntry, c: &mut Checker<'_>) {
        let key = |field: &str| format!("peer[{i}].{field}");
        check_name(c, &key("name"), &e.name);
        let noise = self.security.mode == SecurityMode::Noise;
        match &e.public_key {
            Some(text) => check_public_key(c, &key("public_key"), text, "that peer"),
            None if noise => c.fail_at(
                &key("public_key"),
                c.entry_position(i),
                "is required with `security.mode = \"noise\"` (the default): that peer's \
                 public key, as `pepd pubkey` prints it there",
            ),
            None => {}
        }
        match e.address {
            Some(addr) => {
                check_peer_address(c, &key("address"), addr);
                let bind = self.tunnel_bind();
                if bind.is_ipv4() != addr.is_ipv4() {
                    let whence = match c.map.line("tunnel.bind") {
                        Some(line) => format!("`tunnel.bind`, line {line}"),
                        None => "the default bind address".to_owned(),
                    };
                    c.fail(
                        &key("address"),
                        format!(
                            "({addr}) must be of the same address family as the tunnel's \
                             ({bind}, {whence})"
                        ),
                    );
                }
            }
            // Without authentication the source address is all that tells peers apart.
            None if !noise => c.fail_at(
                &key("address"),
                c.entry_position(i),
                "is required with `security.mode = \"none\"`: without keys, a peer is known \
                 by its address",
            ),
            None => {}
        }
        if e.subnets.is_empty() {
            c.fail(
                &key("subnets"),
                "must list at least one prefix reached through this peer (its LAN at a hub; \
                 \"0.0.0.0/0\" and \"::/0\" at a terminal)",
            );
        }
        for (k, subnet) in e.subnets.iter().enumerate() {
            let at = format!("peer[{i}].subnets[{k}]");
            if cidr::has_host_bits(subnet) {
                c.fail(&at, host_bits(subnet));
            } else if e.subnets[..k].iter().any(|s| s.trunc() == subnet.trunc()) {
                c.fail(&at, format!("({subnet}) is listed twice"));
            }
        }
        self.check_entry_rates(i, e, c);
        c.range(&key("weight"), e.weight, 1..=MAX_WEIGHT);
        if let Some(keepalive) = e.keepalive {
            check_keepalive(c, &key("keepalive"), keepalive, self.transport.outage_limit);
        }
        if let Some(max_flows) = e.max_flows {
            let gateway = self.limits.max_flows;
            c.check(
                (1..=gateway).contains(&max_flows),
                &key("max_flows"),
                format!(
                    "must be 1 to `limits.max_flows` ({gateway}, {}), not {max_flows}",
                    c.map.describe("limits.max_flows")
                ),
            );
        }
    }

    fn check_entry_rates(&self, i: usize, e: &PeerEntry, c: &mut Checker<'_>) {
        let key = |field: &str| format!("peer[{i}].{field}");
        for (field, rate) in [
            ("tx_rate", e.tx_rate),
            ("rx_rate", e.rx_rate),
            ("min_rate", e.min_rate),
        ] {
            if let Some(rate) = rate {
                c.range(&key(field), rate, MIN_RATE..=MAX_RATE);
            }
        }
        let link = self.link.tx_rate;
        if let Some(tx) = e
            .tx_rate
            .filter(|tx| rate_in_range(*tx) && rate_in_range(link))
        {
            c.check(
                tx <= link,
                &key("tx_rate"),
                format!(
                    "({tx}) must be at most `link.tx_rate` ({link}, {}), the carrier it shares",
                    c.map.describe("link.tx_rate")
                ),
            );
        }
        let (ceiling, ceiling_key) = match e.tx_rate {
            Some(tx) => (tx, key("tx_rate")),
            None => (link, "link.tx_rate".to_owned()),
        };
        if let Some(min) = e
            .min_rate
            .filter(|min| rate_in_range(*min) && rate_in_range(ceiling))
        {
            c.check(
                min <= ceiling,
                &key("min_rate"),
                format!(
                    "({min}) must be at most `{ceiling_key}` ({ceiling}, {}): a peer is never \
                     sent more than its `tx_rate`",
                    c.map.describe(&ceiling_key)
                ),
            );
        }
    }

    /// Names, keys and addresses are unique; subnets of different peers are disjoint.
    fn check_entries_differ(&self, entries: &[PeerEntry], c: &mut Checker<'_>) {
        let mut also = |field: &str, what: &str, dups: Vec<(usize, usize)>| {
            for (first, later) in dups {
                let other = format!("peer[{first}].{field}");
                c.fail(
                    &format!("peer[{later}].{field}"),
                    format!("is also `{other}` ({}): {what}", c.map.describe(&other)),
                );
            }
        };
        also(
            "name",
            "each peer needs its own name",
            peers::duplicates(entries.iter().map(|e| Some(e.name.as_str()))),
        );
        also(
            "public_key",
            "each peer has its own key pair",
            peers::duplicates(entries.iter().map(|e| {
                e.public_key
                    .as_deref()
                    .and_then(|k| crate::config::keys::decode_key(k).ok())
            })),
        );
        also(
            "address",
            "each peer has its own tunnel address",
            peers::duplicates(entries.iter().map(|e| e.address)),
        );
        for (outer, inner) in peers::overlaps(&peers::subnets_of(entries)) {
            // Blame the one written later; name the other with its line.
            let (blamed, other) = if (outer.peer, outer.index) > (inner.peer, inner.index) {
                (outer, inner)
            } else {
                (inner, outer)
            };
            let other_key = format!("peer[{}].subnets[{}]", other.peer, other.index);
            c.fail(
                &format!("peer[{}].subnets[{}]", blamed.peer, blamed.index),
                format!(
                    "({}) overlaps `{other_key}` ({}, {}): each destination must belong to \
                     one peer",
                    blamed.net,
                    other.net,
                    c.map.describe(&other_key)
                ),
            );
        }
    }

    /// The CIRs must fit on the carrier together.
    fn check_min_rates_fit(&self, entries: &[PeerEntry], c: &mut Checker<'_>) {
        let link = self.link.tx_rate;
        let committed: Vec<(usize, &PeerEntry, BitRate)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.min_rate.map(|min| (i, e, min)))
            .collect();
        if !rate_in_range(link) || committed.iter().any(|(_, _, min)| !rate_in_range(*min)) {
            return;
        }
        let sum = committed
            .iter()
            .fold(0u64, |sum, (_, _, min)| sum.saturating_add(min.bps()));
        if sum <= link.bps() {
            return;
        }
        let each: Vec<String> = committed
            .iter()
            .map(|(i, e, min)| {
                format!(
                    "{} {min} ({})",
                    e.name,
                    c.map.describe(&format!("peer[{i}].min_rate"))
                )
            })
            .collect();
        c.fail(
            "link.tx_rate",
            format!(
                "({link}) is less than the `min_rate` of the peers together ({}): {}",
                BitRate(sum),
                each.join(", ")
            ),
        );
    }

    fn check_link(&self, c: &mut Checker<'_>) {
        for (key, rate) in [
            ("link.tx_rate", self.link.tx_rate),
            ("link.rx_rate", self.link.rx_rate),
        ] {
            c.range(key, rate, MIN_RATE..=MAX_RATE);
        }
        let mtu = self.link.mtu;
        if c.range_in("link.mtu", mtu, MIN_MTU..=MAX_MTU, " bytes")
            && self.tunnel_is_ipv6()
            && mtu < MIN_MTU_V6
        {
            c.fail(
                "link.mtu",
                format!("must be at least {MIN_MTU_V6} bytes with an IPv6 peer, not {mtu}"),
            );
        }
        c.range_in(
            "link.frame_overhead",
            self.link.frame_overhead,
            ..=MAX_FRAME_OVERHEAD,
            " bytes",
        );
    }

    fn check_transport(&self, c: &mut Checker<'_>) {
        let t = &self.transport;
        c.check(
            t.ack_every_packets >= 1,
            "transport.ack_every_packets",
            "must be at least 1",
        );
        c.range("transport.ack_max_delay", t.ack_max_delay, ..=MAX_ACK_DELAY);
        c.range("transport.outage_limit", t.outage_limit, MIN_OUTAGE_LIMIT..);
        check_keepalive(c, "transport.keepalive", t.keepalive, t.outage_limit);
        c.range(
            "transport.pacing_burst",
            t.pacing_burst,
            ..=MAX_PACING_BURST,
        );
        c.check(
            !t.compression_ports.contains(&0),
            "transport.compression_ports",
            "port 0 is no server port",
        );
        for (i, subnet) in t.compression_prefixes.iter().enumerate() {
            c.check(
                !cidr::has_host_bits(subnet),
                &format!("transport.compression_prefixes[{i}]"),
                host_bits(subnet),
            );
        }
        self.check_vegas(c);
    }

    fn check_vegas(&self, c: &mut Checker<'_>) {
        let t = &self.transport;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        for (key, value) in [
            ("transport.vegas_alpha", t.vegas_alpha),
            ("transport.vegas_beta", t.vegas_beta),
            ("transport.vegas_gamma", t.vegas_gamma),
        ] {
            c.check(
                positive(value),
                key,
                format!("must be a positive number, not {value}"),
            );
        }
        if positive(t.vegas_alpha) && positive(t.vegas_beta) && t.vegas_alpha >= t.vegas_beta {
            // Blame the one the operator wrote; beta if both.
            if c.map.contains("transport.vegas_beta") {
                c.fail(
                    "transport.vegas_beta",
                    format!(
                        "({}) must be greater than `transport.vegas_alpha` ({}, {})",
                        t.vegas_beta,
                        t.vegas_alpha,
                        c.map.describe("transport.vegas_alpha")
                    ),
                );
            } else {
                c.fail(
                    "transport.vegas_alpha",
                    format!(
                        "({}) must be less than `transport.vegas_beta` ({}, default)",
                        t.vegas_alpha, t.vegas_beta
                    ),
                );
            }
        }
    }

    fn check_limits(&self, c: &mut Checker<'_>) {
        let l = &self.limits;
        c.range("limits.max_flows", l.max_flows, 1..=MAX_FLOWS);
        let buffer_ok = l
            .flow_buffer
            .is_none_or(|b| c.range("limits.flow_buffer", b, MIN_FLOW_BUFFER..=MAX_FLOW_BUFFER));
        if c.range("limits.memory_budget", l.memory_budget, MIN_MEMORY_BUDGET..) && buffer_ok {
            self.check_budget_holds_a_flow(c);
        }
    }

    /// One flow must fit: its buffer in both directions.
    fn check_budget_holds_a_flow(&self, c: &mut Checker<'_>) {
        let budget = self.limits.memory_budget;
        let (need, because) = match self.limits.flow_buffer {
            Some(b) => (
                b.bytes().saturating_mul(2),
                format!(
                    "2 × `limits.flow_buffer` ({b}, {})",
                    c.map.describe("limits.flow_buffer")
                ),
            ),
            // Buffers sized from a rate that is already reported would only repeat it.
            None if !(rate_in_range(self.link.tx_rate) && rate_in_range(self.link.rx_rate)) => {
                return;
            }
            None => {
                let t = self.transport();
                let need = t.flow_window.saturating_add(t.send_buffer);
                (
                    need,
                    format!(
                        "one flow's buffers as sized from the link rates ({}: {} to send, {} \
                         to receive); set `limits.flow_buffer` to use smaller ones",
                        approx(need),
                        approx(t.send_buffer),
                        approx(t.flow_window)
                    ),
                )
            }
        };
        c.check(
            budget.bytes() >= need,
            "limits.memory_budget",
            format!("({budget}) must hold at least {because}"),
        );
    }

    fn check_timeouts(&self, c: &mut Checker<'_>) {
        c.range(
            "timeouts.connect",
            self.timeouts.connect,
            MIN_CONNECT_TIMEOUT..,
        );
    }
}

impl PepdConfig {
    /// The settings that need no file: ranges, the peer's key, path forms. Key files are
    /// read, and required keys insisted on, by `security()`, so a config can be checked for
    /// everything else (e.g. by `pepd nft-rules`) on a host that holds no keys.
    fn check_security(&self, c: &mut Checker<'_>) {
        let s = &self.security;
        c.range(
            "security.rekey_interval",
            s.rekey_interval,
            MIN_REKEY_INTERVAL..=MAX_REKEY_INTERVAL,
        );
        c.range(
            "security.rekey_after_packets",
            s.rekey_after_packets,
            MIN_REKEY_PACKETS..,
        );
        if let Some(key) = &s.peer_public_key {
            check_public_key(c, "security.peer_public_key", key, "the other gateway");
        }
        for (key, path) in [
            ("security.private_key_file", &s.private_key_file),
            ("security.psk_file", &s.psk_file),
        ] {
            if let Some(path) = path {
                // Relative paths would be resolved against whatever directory pepd or
                // check-config happens to run in, which differ.
                c.check(
                    path.is_absolute(),
                    key,
                    format!(
                        "must be an absolute path, not {:?}",
                        path.display().to_string()
                    ),
                );
            }
        }
    }
}

/// A peer's tunnel address: somewhere a datagram can be sent.
fn check_peer_address(c: &mut Checker<'_>, key: &str, addr: SocketAddr) {
    c.check(
        addr.port() != 0,
        key,
        format!("({addr}) needs a port other than 0"),
    );
    c.check(
        !addr.ip().is_unspecified(),
        key,
        format!("({addr}) must be the peer's address, not the unspecified address"),
    );
    c.check(
        !addr.ip().is_multicast(),
        key,
        format!("({addr}) must be a unicast address"),
    );
}

/// A peer's public key as written: base64 of 32 bytes, not all zeros. `whose` says where
/// `pepd pubkey` prints it. The example's placeholder and our own key are refused when
/// the keys are loaded (`security()`), so the examples parse.
fn check_public_key(c: &mut Checker<'_>, key: &str, text: &str, whose: &str) {
    match crate::config::keys::decode_key(text) {
        Ok(k) if k == [0; crate::config::keys::KEY_LEN] => c.fail(
            key,
            format!(
                "is all zeros, which is no one's public key; use the output of `pepd pubkey` \
                 on {whose}"
            ),
        ),
        Ok(_) => {}
        Err(why) => c.fail(
            key,
            format!("{why}; expected base64 of a 32-byte key, as `pepd pubkey` prints on {whose}"),
        ),
    }
}

fn check_keepalive(c: &mut Checker<'_>, key: &str, keepalive: Duration, outage_limit: Duration) {
    if keepalive.is_zero() {
        c.fail(key, "must be more than 0");
    } else if keepalive >= outage_limit {
        c.fail(
            key,
            format!(
                "({}) must be shorter than `transport.outage_limit` ({}, {}), or idle \
                 outages go unnoticed",
                ms(keepalive),
                ms(outage_limit),
                c.map.describe("transport.outage_limit"),
            ),
        );
    }
}

/// Fails `key` unless `name` is a valid name (peers' and classes' alike); whether it was.
fn check_name(c: &mut Checker<'_>, key: &str, name: &str) -> bool {
    let valid = peers::is_valid_name(name);
    if !valid {
        c.fail(
            key,
            format!("({name:?}) must be 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-'"),
        );
    }
    valid
}

/// Where the `[[class]]` entry `i` starts: its header.
fn class_position(c: &Checker<'_>, i: usize) -> Position {
    match c.map.position(&format!("class[{i}]")) {
        Position::Default => Position::Document,
        at => at,
    }
}

fn host_bits(subnet: &IpNet) -> String {
    format!(
        "({subnet}) has bits set after the prefix: write {}",
        subnet.trunc()
    )
}

/// `[A-Za-z][A-Za-z0-9_]{0,31}`: a plain nftables identifier.
fn is_nft_table_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && name.len() <= MAX_NFT_TABLE_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Routing tables the kernel and iproute2 use themselves: unspec, default, main, local.
const RESERVED_TABLES: [u32; 4] = [0, 253, 254, 255];

/// Names the kernel accepts (at most 15 bytes, no '/', ':' or white space) and that are safe
/// inside a quoted nftables string; a trailing `*` is nftables' wildcard.
fn check_interface_name(name: &str) -> Result<(), &'static str> {
    const IFNAMSIZ: usize = 16;
    let base = name.strip_suffix('*').unwrap_or(name);
    if name.is_empty() || name == "*" {
        return Err("must name an interface (a trailing `*` matches several)");
    }
    if name.len() >= IFNAMSIZ {
        return Err("is longer than the 15 bytes of an interface name");
    }
    if base.chars().any(|ch| {
        ch.is_whitespace() || ch.is_control() || matches!(ch, '/' | ':' | '"' | '\\' | '*')
    }) {
        return Err("must not contain white space, quotes, '/', ':', '\\' or a '*' before the end");
    }
    Ok(())
}

fn rate_in_range(rate: BitRate) -> bool {
    (MIN_RATE..=MAX_RATE).contains(&rate)
}

/// The config key behind a `pep_transport::Config` field, for the backstop check.
fn transport_key(field: &str, config: &PepdConfig) -> &'static str {
    match field {
        "flow_window" | "send_buffer" if config.limits.flow_buffer.is_some() => {
            "limits.flow_buffer"
        }
        // Unset, the buffers are sized from the rates.
        "rate_bps" | "send_buffer" => "link.tx_rate",
        "flow_window" => "link.rx_rate",
        "mtu" => "link.mtu",
        "frame_overhead" => "link.frame_overhead",
        "assoc_window" => "limits.memory_budget",
        "ack.every_packets" => "transport.ack_every_packets",
        "vegas" => "transport.vegas_alpha",
        "max_flows" => "limits.max_flows",
        _ => "transport",
    }
}
