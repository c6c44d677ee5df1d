//! What `pepd check-config` prints: the effective settings, each as the daemon will use it.

use std::fmt::Write as _;
use std::time::Duration;

use crate::config::units::{approx, dur};
use crate::config::{
    AeadSetting, BitRate, CcModeName, FailMode, LossDefault, OverLimit, PeerSpec, Peers,
    PepdConfig, QuicPolicy, SecurityMode, Side,
};

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
                if let Some(hubs) = self.hubs() {
                    let back = match hubs.return_after {
                        Some(d) => format!("back to the first when idle after {}", dur(d)),
                        None => "staying where it moved".to_owned(),
                    };
                    let _ = writeln!(
                        s,
                        "hubs:       {} in order of preference, one at a time; another is \
                         tried while the one serving is silent, {back}",
                        hubs.addresses.len()
                    );
                }
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
        let _ = writeln!(s, "quic:       {}", self.quic_summary());
        for line in self.classes_summary() {
            let _ = writeln!(s, "{line}");
        }
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
        let _ = writeln!(s, "compression: {}", compression_summary(tr));
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
        let _ =
            writeln!(
            s,
            "memory:     fixed {} + {} per flow + payload (receive reserve {}, send up to {}): \
             the budget carries {} idle flows; at most {} in use with {} flows, plus the \
             process itself",
            approx(m.fixed),
            approx(crate::config::budget::PER_FLOW),
            approx(m.receive_reserve),
            approx(crate::config::budget::send_cap(self.limits.memory_budget.bytes())),
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
        let _ = writeln!(s, "metrics:    {}", self.metrics.listen);
        let _ = write!(
            s,
            "control:    {} (`pepd status`, `pepd flows`)",
            self.control_socket().display()
        );
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

    /// A line per traffic class, e.g. "class:      video (dscp AF41): priority up to 5
    /// Mbit/s, weight 1"; none without `[[class]]`.
    fn classes_summary(&self) -> Vec<String> {
        if self.class.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for c in &self.class {
            let mut takes = Vec::new();
            if !c.dscp.is_empty() {
                let d: Vec<String> = c.dscp.iter().map(ToString::to_string).collect();
                takes.push(format!("dscp {}", d.join(", ")));
            }
            if !c.ports.is_empty() {
                let p: Vec<String> = c.ports.iter().map(ToString::to_string).collect();
                takes.push(format!("port {}", p.join(", ")));
            }
            if !c.subnets.is_empty() {
                let n: Vec<String> = c.subnets.iter().map(ToString::to_string).collect();
                takes.push(format!("to {}", n.join(", ")));
            }
            let takes = if takes.is_empty() {
                "every other flow".to_owned()
            } else {
                takes.join("; ")
            };
            let share = match (c.priority, c.max_rate) {
                (true, Some(cap)) => format!("priority up to {cap}, weight {}", c.weight),
                (_, Some(cap)) => format!("weight {}, at most {cap}", c.weight),
                (_, None) => format!("weight {}", c.weight),
            };
            out.push(format!("class:      {} ({takes}): {share}", c.name));
        }
        if !self.class.iter().any(|c| c.takes_everything()) {
            out.push(format!(
                "class:      {} (every other flow): weight 1",
                crate::config::classes::DEFAULT_CLASS_NAME
            ));
        }
        out
    }

    /// One line on what the rules do with the clients' QUIC, e.g. "UDP to port 443 from lan0
    /// rejected (ICMP port unreachable); 1 exception".
    fn quic_summary(&self) -> String {
        let r = &self.rules;
        let ports = match r.quic_ports.as_slice() {
            [one] => format!("port {one}"),
            many => format!(
                "ports {}",
                many.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let verdict = match r.quic {
            QuicPolicy::Pass => return format!("UDP to {ports} passes, unaccelerated"),
            QuicPolicy::Reject => "rejected (ICMP port unreachable)",
            QuicPolicy::Drop => "dropped",
        };
        let from = match r.interfaces.len() {
            0 => "any interface".to_owned(),
            _ => r.interfaces.join(", "),
        };
        let exceptions = match r.quic_exceptions.len() {
            0 => String::new(),
            n => format!("; {n} exception{}", if n == 1 { "" } else { "s" }),
        };
        format!("UDP to {ports} from {from} {verdict}{exceptions}")
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
            crate::config::DEFAULT_NFT_TABLE => String::new(),
            name => format!("; nftables table inet {name}"),
        };
        format!(
            "TCP from {from} to {ports}{to}{bypass}; mark {:#x}, table {}; fail {fail}{nft_table}",
            r.tproxy_mark, r.route_table
        )
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

/// `transport.compression` and where it applies, for the report.
fn compression_summary(t: &crate::config::TransportConfig) -> String {
    match t.compression {
        crate::config::CompressionMode::Off => "off".to_owned(),
        crate::config::CompressionMode::Auto => {
            let ports = if t.compression_ports.is_empty() {
                "every port".to_owned()
            } else {
                let p: Vec<String> = t.compression_ports.iter().map(u16::to_string).collect();
                format!("ports {}", p.join(", "))
            };
            let prefixes = if t.compression_prefixes.is_empty() {
                "every address".to_owned()
            } else {
                let p: Vec<String> = t
                    .compression_prefixes
                    .iter()
                    .map(|n| n.to_string())
                    .collect();
                p.join(", ")
            };
            format!("auto (zstd), flows to {ports} of {prefixes}")
        }
    }
}
