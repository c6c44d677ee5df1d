//! The text of `pepd status` and `pepd flows` (and of the SIGUSR1 log): one screen for a
//! peer, a table sorted by a column for a hub's many, a table of the open flows.

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::config::units::approx;
use crate::config::BitRate;

use super::status::{FlowStatus, PeerStatus, Status};

/// What the peers' table is sorted by: the name A to Z, the state with outages first, the
/// rest largest (or longest ago) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SortKey {
    #[default]
    Name,
    State,
    Rtt,
    QueueDelay,
    Pacing,
    Allocated,
    Loss,
    Flows,
    ToPeer,
    FromPeer,
    LastPacket,
}

/// `s` as `pepd status` prints it: the gateway, then one screen for a single peer or a
/// table of many, sorted by `sort`.
pub fn status_text(s: &Status, sort: SortKey) -> String {
    let mut out = header(s);
    out.push('\n');
    match s.peers.as_slice() {
        [] => out.push_str("no peers\n"),
        [one] => out.push_str(&peer_screen(one)),
        many => out.push_str(&peer_table(many, sort)),
    }
    out
}

fn header(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pepd {} (protocol {}), {}, up {}",
        s.pepd,
        s.protocol,
        s.side,
        age(s.uptime_seconds)
    );
    let c = &s.carrier;
    let g = &s.gateway;
    let shared = if c.shared {
        format!(
            " shared by {} ({} established),",
            count(g.peers as usize, "peer", "peers"),
            g.peers_established
        )
    } else {
        ",".to_owned()
    };
    let _ = writeln!(
        out,
        "carrier   tx_rate {}{shared} pacing {}",
        BitRate(c.tx_rate_bps),
        rate(c.pacing_bps)
    );
    let held: Vec<String> = g
        .workers
        .iter()
        .map(|w| w.associations.to_string())
        .collect();
    let workers = match g.workers.len() {
        1 => "1 worker".to_owned(),
        n => format!("{n} workers holding {} associations", held.join("/")),
    };
    let budget = g.memory_budget_bytes.max(1);
    let _ = writeln!(
        out,
        "gateway   {} of {} flows open, memory {} of {} accounted ({:.1} %), {workers}",
        g.flows_open,
        g.max_flows,
        approx(g.memory_accounted_bytes),
        approx(g.memory_budget_bytes),
        g.memory_accounted_bytes as f64 * 100.0 / budget as f64,
    );
    out
}

/// Every figure of one peer, a line per subject.
fn peer_screen(p: &PeerStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "peer {}", p.name);
    let endpoint = match p.endpoint {
        Some(a) => a.to_string(),
        None => "not known yet (it has not associated)".to_owned(),
    };
    let moved = match (p.endpoint_moves, p.endpoint_moved_seconds_ago) {
        (0, _) => "never moved".to_owned(),
        (n, Some(ago)) => format!(
            "moved {}, last {} ago",
            count(n as usize, "time", "times"),
            age(ago)
        ),
        (n, None) => format!("moved {}", count(n as usize, "time", "times")),
    };
    let _ = writeln!(out, "  endpoint      {endpoint}, {moved}");
    let state = match p.outage_seconds {
        Some(o) => format!("outage for {} (no answer from the peer)", age(o)),
        None => format!("{} for {}", p.state, age(p.state_seconds)),
    };
    let _ = writeln!(
        out,
        "  association   {state}, last handshake {}, last packet {}",
        ago_or(p.last_handshake_seconds_ago, "none"),
        ago_or(p.last_packet_seconds_ago, "none"),
    );
    let _ = writeln!(
        out,
        "  path          RTT {} (min {}), queue delay {}, datagrams of {} bytes",
        age(p.rtt_seconds),
        age(p.rtt_min_seconds),
        age(p.queue_delay_seconds),
        p.datagram_size
    );
    let _ = writeln!(
        out,
        "  rate          pacing {}, capacity estimate {}, ceiling {}",
        rate(p.pacing_bps),
        rate(p.capacity_estimate_bps),
        BitRate(p.ceiling_bps)
    );
    if let Some(sh) = &p.share {
        let _ = writeln!(
            out,
            "  share         allocated {} of its MIR {}, {}, weight {}, {}",
            BitRate(sh.allocated_bps),
            BitRate(p.tx_rate_bps),
            match sh.cir_bps {
                0 => "no CIR".to_owned(),
                cir => format!("CIR {}", BitRate(cir)),
            },
            sh.weight,
            if sh.capped {
                "capped by the others' shares"
            } else {
                "not capped"
            }
        );
    }
    let l = &p.lost;
    let lost = l.congestion + l.corruption + l.outage;
    let _ = writeln!(
        out,
        "  loss          {} of {} packets sent: congestion {}, corruption {}, outage {}",
        percent(lost, p.packets_sent),
        p.packets_sent,
        l.congestion,
        l.corruption,
        l.outage
    );
    let _ = writeln!(
        out,
        "  flows         {} open; {} to the peer, {} from it",
        p.flows_open,
        bytes(p.bytes_to_peer),
        bytes(p.bytes_from_peer)
    );
    out
}

const PEER_COLUMNS: [&str; 20] = [
    "PEER",
    "STATE",
    "FOR",
    "ENDPOINT",
    "HANDSHAKE",
    "LAST-PKT",
    "RTT",
    "QDELAY",
    "ESTIMATE",
    "PACING",
    "ALLOC",
    "MIR",
    "CIR",
    "W",
    "CAPPED",
    "DGRAM",
    "LOST-C/X/O",
    "FLOWS",
    "TO-PEER",
    "FROM-PEER",
];

/// One row per peer, sorted by `sort`; rates in bit/s, sizes in bytes.
fn peer_table(peers: &[PeerStatus], sort: SortKey) -> String {
    let mut sorted: Vec<&PeerStatus> = peers.iter().collect();
    sorted.sort_by(|a, b| compare(a, b, sort).then_with(|| a.name.cmp(&b.name)));
    let rows: Vec<Vec<String>> = sorted
        .iter()
        .map(|p| {
            let dash = || "-".to_owned();
            let share = p.share.as_ref();
            vec![
                p.name.clone(),
                p.state.clone(),
                short_age(p.outage_seconds.unwrap_or(p.state_seconds)),
                p.endpoint.map_or_else(dash, |a| a.to_string()),
                p.last_handshake_seconds_ago.map_or_else(dash, short_age),
                p.last_packet_seconds_ago.map_or_else(dash, short_age),
                short_age(p.rtt_seconds),
                short_age(p.queue_delay_seconds),
                short(p.capacity_estimate_bps as f64),
                short(p.pacing_bps as f64),
                share.map_or_else(dash, |s| short(s.allocated_bps as f64)),
                short(p.tx_rate_bps as f64),
                share.map_or_else(dash, |s| short(s.cir_bps as f64)),
                share.map_or_else(dash, |s| s.weight.to_string()),
                share.map_or_else(dash, |s| if s.capped { "yes" } else { "no" }.to_owned()),
                p.datagram_size.to_string(),
                format!(
                    "{}/{}/{}",
                    p.lost.congestion, p.lost.corruption, p.lost.outage
                ),
                p.flows_open.to_string(),
                short(p.bytes_to_peer as f64),
                short(p.bytes_from_peer as f64),
            ]
        })
        .collect();
    let mut out = table(&PEER_COLUMNS, &rows);
    out.push_str("(rates in bit/s, sizes in bytes; `--peer NAME` shows one peer's screen)\n");
    out
}

fn compare(a: &PeerStatus, b: &PeerStatus, sort: SortKey) -> Ordering {
    let desc = |x: f64, y: f64| y.total_cmp(&x);
    let lost = |p: &PeerStatus| p.lost.congestion + p.lost.corruption + p.lost.outage;
    match sort {
        SortKey::Name => a.name.cmp(&b.name),
        SortKey::State => state_rank(&a.state).cmp(&state_rank(&b.state)),
        SortKey::Rtt => desc(a.rtt_seconds, b.rtt_seconds),
        SortKey::QueueDelay => desc(a.queue_delay_seconds, b.queue_delay_seconds),
        SortKey::Pacing => b.pacing_bps.cmp(&a.pacing_bps),
        SortKey::Allocated => {
            let alloc = |p: &PeerStatus| p.share.as_ref().map_or(0, |s| s.allocated_bps);
            alloc(b).cmp(&alloc(a))
        }
        SortKey::Loss => lost(b).cmp(&lost(a)),
        SortKey::Flows => b.flows_open.cmp(&a.flows_open),
        SortKey::ToPeer => b.bytes_to_peer.cmp(&a.bytes_to_peer),
        SortKey::FromPeer => b.bytes_from_peer.cmp(&a.bytes_from_peer),
        // Never heard from counts as longest ago.
        SortKey::LastPacket => desc(
            a.last_packet_seconds_ago.unwrap_or(f64::INFINITY),
            b.last_packet_seconds_ago.unwrap_or(f64::INFINITY),
        ),
    }
}

/// The states that need looking at first.
fn state_rank(state: &str) -> u8 {
    match state {
        "outage" => 0,
        "connecting" => 1,
        "established" => 2,
        _ => 3,
    }
}

const FLOW_COLUMNS: [&str; 8] = [
    "PEER",
    "ORIGIN",
    "CLIENT",
    "SERVER",
    "AGE",
    "TO-PEER",
    "FROM-PEER",
    "STATE",
];

/// `pepd flows`: one row per open flow, as the daemon listed them.
pub fn flows_text(flows: &[FlowStatus]) -> String {
    if flows.is_empty() {
        return "no flows open\n".to_owned();
    }
    let rows: Vec<Vec<String>> = flows
        .iter()
        .map(|f| {
            let addr =
                |a: Option<std::net::SocketAddr>| a.map_or("-".to_owned(), |a| a.to_string());
            let state = match &f.reset_reason {
                Some(r) => format!("{} ({r})", f.state),
                None => f.state.clone(),
            };
            vec![
                f.peer.clone(),
                f.origin.clone(),
                addr(f.client),
                addr(f.server),
                short_age(f.age_seconds),
                short(f.bytes_to_peer as f64),
                short(f.bytes_from_peer as f64),
                state,
            ]
        })
        .collect();
    let mut out = table(&FLOW_COLUMNS, &rows);
    let _ = writeln!(
        out,
        "{} (sizes in bytes)",
        count(flows.len(), "flow", "flows")
    );
    out
}

/// Left-aligned columns two spaces apart, no trailing blanks.
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (cell, w) in cells.zip(&widths) {
            let _ = write!(l, "{cell:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut head.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ago_or(seconds: Option<f64>, none: &str) -> String {
    seconds.map_or_else(|| none.to_owned(), |s| format!("{} ago", age(s)))
}

/// `part` of `whole` in percent; nothing of nothing is 0 %.
fn percent(part: u64, whole: u64) -> String {
    format!("{:.2} %", part as f64 * 100.0 / whole.max(1) as f64)
}

/// Three significant digits.
fn sig3(v: f64) -> String {
    if v >= 99.95 {
        format!("{v:.0}")
    } else if v >= 9.995 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `v` with an SI prefix (k, M, G, T), three significant digits.
fn prefixed(v: f64) -> (String, &'static str) {
    for (unit, prefix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v >= unit * 0.9995 {
            return (sig3(v / unit), prefix);
        }
    }
    (format!("{v:.0}"), "")
}

/// A measured rate: "48.1 Mbit/s".
fn rate(bps: u64) -> String {
    let (v, prefix) = prefixed(bps as f64);
    format!("{v} {prefix}bit/s")
}

/// An amount of traffic: "14.3 GB".
fn bytes(n: u64) -> String {
    let (v, prefix) = prefixed(n as f64);
    format!("{v} {prefix}B")
}

/// A figure for a table cell: "48.1M".
fn short(v: f64) -> String {
    let (v, prefix) = prefixed(v);
    format!("{v}{prefix}")
}

/// A duration, three digits below a minute: "0.25 ms", "612 ms", "4.20 s", then "3m 10s",
/// "2h 5m", "3d 4h".
fn age(seconds: f64) -> String {
    spell(seconds, " ")
}

/// As [`age`], without spaces: "3m10s".
fn short_age(seconds: f64) -> String {
    spell(seconds, "")
}

fn spell(seconds: f64, gap: &str) -> String {
    let s = seconds.max(0.0);
    if s == 0.0 {
        return format!("0{gap}ms");
    }
    if s < 0.9995 {
        return format!("{}{gap}ms", sig3(s * 1000.0));
    }
    if s < 60.0 {
        return format!("{}{gap}s", sig3(s));
    }
    let whole = s as u64;
    let (d, h, m, sec) = (
        whole / 86_400,
        whole / 3600 % 24,
        whole / 60 % 60,
        whole % 60,
    );
    if d > 0 {
        format!("{d}d{gap}{h}h")
    } else if h > 0 {
        format!("{h}h{gap}{m}m")
    } else {
        format!("{m}m{gap}{sec}s")
    }
}

#[cfg(test)]
mod tests;
