//! Settings that are legal but probably not what the operator meant: `check-config` prints
//! them, and `pepd run` logs them at start.

use std::time::Duration;

use super::error::sort_by_position;
use super::units::{approx, dur};
use super::{CcModeName, LossDefault, Peers, PepdConfig, QuicPolicy, SecurityMode, Side};

/// The round trip a flow buffer must cover to keep a GEO link busy (two hops up and down,
/// plus ground segments and ACK delay).
const GEO_RTT: Duration = Duration::from_millis(600);

/// Rekeying more often than this spends link time on handshakes for no gain in secrecy;
/// shorter intervals are for tests.
const SHORT_REKEY: Duration = Duration::from_secs(10);

/// Idle timeouts below this reset quiet interactive sessions (ssh, database pools).
const SHORT_IDLE: Duration = Duration::from_secs(60);

impl PepdConfig {
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
        let rules = &self.rules;
        if rules.quic != QuicPolicy::Pass {
            let policy = rules.quic.name();
            if self.side() == Side::Hub {
                warn(
                    "rules.quic",
                    format!(
                        "= \"{policy}\" at a hub refuses QUIC from the hub's own client side \
                         only; the terminals' clients are best refused at each terminal, since \
                         a refusal at the hub costs them a satellite round trip per attempt"
                    ),
                );
            }
            if !rules.ports.is_empty() {
                let missed: Vec<String> = rules
                    .quic_ports
                    .iter()
                    .filter(|p| !rules.ports.contains(p))
                    .map(ToString::to_string)
                    .collect();
                if !missed.is_empty() {
                    warn(
                        "rules.quic",
                        format!(
                            "= \"{policy}\" sends clients to TCP port {} that `rules.ports` \
                             does not intercept: their fallback is not accelerated either",
                            missed.join(", ")
                        ),
                    );
                }
            }
        } else if map.contains("rules.quic_ports") || map.contains("rules.quic_exceptions") {
            for key in ["rules.quic_ports", "rules.quic_exceptions"] {
                if map.contains(key) {
                    warn(key, "has no effect with `rules.quic = \"pass\"`".into());
                }
            }
        }
        let tx = self.link.tx_rate;
        let mut priority_sum: u64 = 0;
        for (i, class) in self.class.iter().enumerate() {
            let Some(cap) = class.max_rate else { continue };
            if class.priority {
                priority_sum = priority_sum.saturating_add(cap.bps());
            }
            if cap > tx {
                warn(
                    &format!("class[{i}].max_rate"),
                    format!("({cap}) is above `link.tx_rate` ({tx}): it caps nothing"),
                );
            }
        }
        if priority_sum >= tx.bps() && self.class.len() > 1 {
            warn(
                "class",
                format!(
                    "the priority classes' `max_rate`s add up to {}, all of `link.tx_rate` \
                     ({tx}): while they send at their caps the other classes get nothing",
                    super::BitRate(priority_sum)
                ),
            );
        }
        if let (true, Peers::List(entries)) = (self.redundant(), &self.peer) {
            for (i, e) in entries.iter().enumerate() {
                if e.address.is_some() {
                    warn(
                        &format!("peer[{i}].address"),
                        "starts no association at a redundant hub (`tunnel.redundant`): the \
                         terminal initiates towards whichever hub holds the address"
                            .into(),
                    );
                }
            }
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
        if let Peers::Pair(pair) = &self.peer {
            if pair.return_to_preferred && pair.address.all().len() < 2 {
                warn(
                    "peer.return_to_preferred",
                    "has no effect with one hub address: there is no other hub to return from"
                        .into(),
                );
            }
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
