//! What `pepd check-config` prints: the effective settings, and the legal settings an
//! operator most likely did not mean.

use std::fmt::Write as _;
use std::time::Duration;

use super::error::sort_by_position;
use super::{
    AeadSetting, BitRate, CcModeName, FailMode, LossDefault, OverLimit, PeerSpec, Peers,
    PepdConfig, SecurityMode, Side,
};

/// The round trip a flow buffer must cover to keep a GEO link busy (two hops up and down,
/// plus ground segments and ACK delay).
const GEO_RTT: Duration = Duration::from_millis(600);

/// Rekeying more often than this spends link time on handshakes for no gain in secrecy;
/// shorter intervals are for tests.
const SHORT_REKEY: Duration = Duration::from_secs(10);

/// Idle timeouts below this reset quiet interactive sessions (ssh, database pools).
const SHORT_IDLE: Duration = Duration::from_secs(60);

fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// "5.7 MiB": sizes computed from rates are rarely round, and exact bytes are noise here.
pub(super) fn approx(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let tenths = (u128::from(bytes) * 10 + u128::from(unit) / 2) / u128::from(unit);
            return match tenths % 10 {
                0 => format!("{} {name}", tenths / 10),
                t => format!("{}.{t} {name}", tenths / 10),
            };
        }
    }
    format!("{bytes} B")
}

impl PepdConfig {
    /// A short human summary of the effective settings, defaults filled in.
    pub fn summary(&self) -> String {
        let t = self.transport();
        let mut s = String::new();
        // Writing to a String cannot fail; the results are discarded for that reason.
        let side = match self.side() {
            Side::Terminal => "terminal (initiator)",
            Side::Hub => "hub (responder)",
        };
        let _ = writeln!(s, "side:       {side}");
        match &self.peer {
            Peers::Pair(pair) => {
                let _ = writeln!(
                    s,
                    "peer:       {} over UDP, tunnel bound to {}",
                    pair.address,
                    self.tunnel_bind()
                );
            }
            Peers::List(entries) => {
                let n = entries.len();
                let _ = writeln!(
                    s,
                    "peers:      {n} `[[peer]]` {} over UDP, tunnel bound to {}",
                    if n == 1 { "entry" } else { "entries" },
                    self.tunnel_bind(),
                );
                for peer in self.peer_specs() {
                    let _ = writeln!(s, "  {}", peer_line(&peer));
                }
                let workers = self.workers();
                let _ = writeln!(
                    s,
                    "workers:    {workers} {}",
                    if workers == 1 {
                        "thread"
                    } else {
                        "threads, the associations spread over them by peer"
                    }
                );
            }
        }
        let listen: Vec<String> = self
            .intercept
            .listen
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(
            s,
            "intercept:  {} (own mark {:#x})",
            listen.join(", "),
            self.intercept.own_mark
        );
        let _ = writeln!(s, "rules:      {}", self.rules_summary());
        let _ = writeln!(
            s,
            "link:       tx {}, rx {}, MTU {} ({}-byte datagrams)",
            self.link.tx_rate,
            self.link.rx_rate,
            t.mtu,
            t.mtu.saturating_sub(t.wire_overhead)
        );
        let tr = &self.transport;
        let cc = match tr.cc {
            CcModeName::Adaptive => "adaptive".to_owned(),
            CcModeName::Rate => "rate".to_owned(),
            CcModeName::Vegas => format!(
                "vegas (alpha {}, beta {}, gamma {})",
                tr.vegas_alpha, tr.vegas_beta, tr.vegas_gamma
            ),
        };
        let loss = match tr.loss_default {
            LossDefault::Corruption => "corruption",
            LossDefault::Congestion => "congestion",
        };
        let _ = writeln!(
            s,
            "transport:  cc {cc}, unexplained loss = {loss}, pacing burst {}",
            dur(tr.pacing_burst)
        );
        let _ = writeln!(
            s,
            "acks:       every {} packets or {}",
            tr.ack_every_packets,
            dur(tr.ack_max_delay)
        );
        let buffer = match self.limits.flow_buffer {
            Some(_) => "",
            None => ", sized from the link rates",
        };
        let _ = writeln!(
            s,
            "windows:    flow {}, association {}, send buffer {}{buffer}",
            approx(t.flow_window),
            approx(t.assoc_window),
            approx(t.send_buffer)
        );
        let over = match self.limits.over_limit {
            OverLimit::Refuse => "refuse",
            OverLimit::Bypass => "bypass",
        };
        let _ = writeln!(
            s,
            "limits:     {} flows (then {over}), memory budget {}",
            self.limits.max_flows, self.limits.memory_budget
        );
        let m = self.memory_implied();
        let _ = writeln!(
            s,
            "memory:     fixed {} + {} per flow + payload (receive reserve {}, send up to {}): \
             the budget carries {} idle flows; at most {} in use with {} flows, plus the \
             process itself",
            approx(m.fixed),
            approx(crate::memory::PER_FLOW),
            approx(m.receive_reserve),
            approx(crate::memory::send_cap(self.limits.memory_budget.bytes())),
            m.max_idle_flows,
            approx(m.worst_case),
            self.limits.max_flows
        );
        let never_or = |d: Duration| match d {
            Duration::ZERO => "never".to_owned(),
            d => dur(d),
        };
        let _ = writeln!(
            s,
            "timeouts:   connect {}, idle {}, stalled under contention {}, outage {}, \
             keepalive {}",
            dur(self.timeouts.connect),
            never_or(self.timeouts.idle),
            never_or(self.limits.stalled_flow_timeout),
            dur(tr.outage_limit),
            dur(tr.keepalive)
        );
        let source = if self.upstream.transparent_source {
            "the client's address (transparent)"
        } else {
            "this gateway's address"
        };
        let _ = writeln!(s, "upstream:   connects from {source}");
        let _ = writeln!(s, "security:   {}", self.security_summary());
        let _ = writeln!(s, "log:        {}", self.log.level);
        let _ = write!(s, "metrics:    {}", self.metrics.listen);
        s
    }

    /// One line on how the tunnel is protected, e.g. "noise (peer key hSDw…), no psk;
    /// rekey every 2m or 1073741824 packets".
    fn security_summary(&self) -> String {
        let sec = &self.security;
        match sec.mode {
            SecurityMode::None => "none: the tunnel is not authenticated or encrypted".to_owned(),
            SecurityMode::Noise => {
                let peer = match (&self.peer, &sec.peer_public_key) {
                    (Peers::List(entries), _) => match entries.len() {
                        1 => "1 peer key, in its `[[peer]]` entry".to_owned(),
                        n => format!("{n} peer keys, one per `[[peer]]` entry"),
                    },
                    (Peers::Pair(_), Some(k)) => format!("peer key {}", k.trim()),
                    (Peers::Pair(_), None) => "no peer key".to_owned(),
                };
                let psk = match &sec.psk_file {
                    Some(p) => format!("psk from {}", p.display()),
                    None => "no psk".to_owned(),
                };
                let aead = match sec.aead {
                    AeadSetting::Auto => "AEAD chosen with the peer",
                    AeadSetting::ChaCha20Poly1305 => "AEAD pinned to chacha20-poly1305",
                    AeadSetting::Aes256Gcm => "AEAD pinned to aes-256-gcm",
                };
                format!(
                    "noise IK ({peer}), {psk}; rekey every {} or {} packets; {aead}",
                    dur(sec.rekey_interval),
                    sec.rekey_after_packets
                )
            }
        }
    }

    /// One line on what `pepd nft-rules` intercepts, e.g. "TCP from lan0 to ports 80, 443;
    /// bypass 1 subnet; mark 0x1, table 100; fail open".
    fn rules_summary(&self) -> String {
        let r = &self.rules;
        let list = |items: Vec<String>| items.join(", ");
        let from = match r.interfaces.len() {
            0 => "any interface".to_owned(),
            _ => list(r.interfaces.clone()),
        };
        let ports = match r.ports.as_slice() {
            [] => "any port".to_owned(),
            [one] => format!("port {one}"),
            many => format!(
                "ports {}",
                list(many.iter().map(ToString::to_string).collect())
            ),
        };
        let to = match r.proxy_subnets.len() {
            0 => String::new(),
            _ => format!(
                " in {}",
                list(r.proxy_subnets.iter().map(ToString::to_string).collect())
            ),
        };
        let bypass = match r.bypass_subnets.len() {
            0 => String::new(),
            n => format!("; bypass {n} subnet{}", if n == 1 { "" } else { "s" }),
        };
        let fail = match r.fail {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        };
        // Named only when it is not the default, which every pair of gateways keeps.
        let nft_table = match r.table.as_str() {
            super::DEFAULT_NFT_TABLE => String::new(),
            name => format!("; nftables table inet {name}"),
        };
        format!(
            "TCP from {from} to {ports}{to}{bypass}; mark {:#x}, table {}; fail {fail}{nft_table}",
            r.tproxy_mark, r.route_table
        )
    }

    /// What the limits imply for memory on this host (the fixed part counts one read
    /// buffer per CPU, as the daemon's runtime has one worker thread each).
    pub fn memory_implied(&self) -> crate::memory::Implied {
        let t = self.transport();
        crate::memory::implied(
            self.limits.memory_budget.bytes(),
            t.assoc_window,
            crate::memory::daemon_fixed(t.mtu, self.workers()),
            self.limits.max_flows as u64,
        )
    }

    /// Settings that are legal but probably not what the operator meant, each prefixed with
    /// where it is set. Empty for the example configs.
    pub fn warnings(&self) -> Vec<String> {
        let map = &self.source_map;
        let mut found = Vec::new();
        let mut warn = |key: &str, why: String| {
            found.push(map.diagnostic(key, format!("`{key}` {why}")));
        };
        let tr = &self.transport;

        match self.tunnel.as_ref().and_then(|t| t.workers) {
            Some(w) if w > crate::config::MAX_WORKERS && self.workers() > 1 => warn(
                "tunnel.workers",
                format!(
                    "= {w} is more than a connection ID can name shards for: running {}",
                    crate::config::MAX_WORKERS
                ),
            ),
            Some(w) if w > 1 && self.workers() == 1 => warn(
                "tunnel.workers",
                "has no effect on a terminal: its one association runs on one worker".into(),
            ),
            _ => {}
        }
        if tr.loss_default == LossDefault::Congestion {
            warn(
                "transport.loss_default",
                "= \"congestion\" slows down on every loss the delay does not explain; on a \
                 satellite link most such losses are bit errors (\"corruption\")"
                    .into(),
            );
        }
        if tr.cc != CcModeName::Vegas {
            let mode = match tr.cc {
                CcModeName::Rate => "rate",
                _ => "adaptive",
            };
            for key in [
                "transport.vegas_alpha",
                "transport.vegas_beta",
                "transport.vegas_gamma",
            ] {
                if map.contains(key) {
                    warn(
                        key,
                        format!("has no effect with `transport.cc = \"{mode}\"`"),
                    );
                }
            }
        }
        if tr.pacing_burst.is_zero() {
            warn(
                "transport.pacing_burst",
                "= 0 lets the pacer never catch up after a late timer, so the link runs \
                 below `link.tx_rate`"
                    .into(),
            );
        }
        if tr.keepalive > tr.outage_limit / 3 {
            warn(
                "transport.keepalive",
                format!(
                    "({}) leaves fewer than three probes before `transport.outage_limit` ({}): \
                     an outage on an idle link is noticed late",
                    dur(tr.keepalive),
                    dur(tr.outage_limit)
                ),
            );
        }
        if let Some(b) = self.limits.flow_buffer {
            let bdp = u128::from(self.link.tx_rate.bytes_per_sec()) * GEO_RTT.as_millis() / 1000;
            if u128::from(b.bytes()) < bdp {
                warn(
                    "limits.flow_buffer",
                    format!(
                        "({b}) is less than one bandwidth-delay product of `link.tx_rate` at \
                         600 ms RTT ({}): a single flow cannot fill the link",
                        approx(u64::try_from(bdp).unwrap_or(u64::MAX))
                    ),
                );
            }
        }
        let carried = self.memory_implied().max_idle_flows;
        if carried < self.limits.max_flows as u64 {
            warn(
                "limits.max_flows",
                format!(
                    "({}) is more than `limits.memory_budget` ({}) carries: {carried} flows \
                     with nothing buffered; past that, new connections get the `over_limit` \
                     treatment. Raise the budget, or lower `limits.max_flows` to match",
                    self.limits.max_flows, self.limits.memory_budget
                ),
            );
        }
        match self.timeouts.idle {
            Duration::ZERO => warn(
                "timeouts.idle",
                "= 0 never resets idle flows: clients that vanish without FIN or RST hold \
                 their buffers and a flow slot forever"
                    .into(),
            ),
            d if d < SHORT_IDLE => warn(
                "timeouts.idle",
                format!(
                    "({}) resets interactive sessions (ssh, database pools) that stay quiet \
                     that long",
                    dur(d)
                ),
            ),
            _ => {}
        }
        if self.link.mtu > 1500 {
            warn(
                "link.mtu",
                format!(
                    "({}) is above Ethernet's 1500: every hop between the gateways, modems \
                     included, must carry it or datagrams are lost",
                    self.link.mtu
                ),
            );
        }
        if !self.metrics.listen.ip().is_loopback() {
            warn(
                "metrics.listen",
                format!(
                    "({}) serves metrics beyond this host; they reveal traffic volumes",
                    self.metrics.listen
                ),
            );
        }
        let sec = &self.security;
        match sec.mode {
            SecurityMode::None => {
                let checked = match self.peer {
                    Peers::Pair(_) => "`peer.address`",
                    Peers::List(_) => "a peer's `address`",
                };
                warn(
                    "security.mode",
                    format!(
                        "= \"none\" leaves the tunnel unauthenticated and unencrypted: pepd \
                         only checks that packets come from {checked}, which anyone on the path \
                         can forge. Use it only on a link already encrypted below pepd"
                    ),
                );
                for key in [
                    "security.private_key_file",
                    "security.peer_public_key",
                    "security.psk_file",
                    "security.rekey_interval",
                    "security.rekey_after_packets",
                    "security.aead",
                ] {
                    if map.contains(key) {
                        warn(key, "has no effect with `security.mode = \"none\"`".into());
                    }
                }
                for i in 0..self.peer.len() {
                    let key = format!("peer[{i}].public_key");
                    if map.contains(&key) {
                        warn(&key, "has no effect with `security.mode = \"none\"`".into());
                    }
                }
            }
            SecurityMode::Noise if sec.rekey_interval < SHORT_REKEY => warn(
                "security.rekey_interval",
                format!(
                    "({}) is below 10s: every rekey is a handshake across the link; this \
                     short is meant for tests",
                    dur(sec.rekey_interval)
                ),
            ),
            SecurityMode::Noise => {}
        }
        sort_by_position(&mut found);
        found.iter().map(ToString::to_string).collect()
    }
}

/// One `[[peer]]` entry as `check-config` shows it, defaults filled in.
fn peer_line(p: &PeerSpec) -> String {
    let at = match p.address {
        Some(a) => a.to_string(),
        None => "address learned from its packets".to_owned(),
    };
    let subnets: Vec<String> = p.subnets.iter().map(ToString::to_string).collect();
    let min = match p.min_bps {
        0 => String::new(),
        bps => format!("min {}, ", BitRate(bps)),
    };
    format!(
        "{}: {at}; subnets {}; tx {} ({min}weight {}), rx {}; keepalive {}; max {} flows",
        p.name,
        subnets.join(", "),
        BitRate(p.tx_bps),
        p.weight,
        BitRate(p.rx_bps),
        dur(p.keepalive),
        p.max_flows
    )
}

#[cfg(test)]
mod tests {
    use super::approx;

    #[test]
    fn approx_rounds_to_a_tenth() {
        assert_eq!(approx(0), "0 B");
        assert_eq!(approx(1023), "1023 B");
        assert_eq!(approx(1024), "1 KiB");
        assert_eq!(approx(6_000_000), "5.7 MiB");
        assert_eq!(approx(4 << 20), "4 MiB");
        assert_eq!(approx(u64::MAX), "17179869184 GiB");
    }
}
