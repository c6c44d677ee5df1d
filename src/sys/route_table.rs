//! A kernel routing table pepd owns: `blackhole` routes that mark prefixes for a routing
//! daemon to import and advertise, written with `ip -batch -` and read with `ip -json`.
//! They are markers, not for forwarding: no `ip rule` should look such a table up.
//!
//! Runs `ip` from `PATH` in the caller's network namespace; every call blocks until `ip`
//! ends.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Deserialize;

/// One route pepd writes: `blackhole <net> table <table>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Marker {
    pub table: u32,
    pub net: IpNet,
}

/// One line of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Added, or kept if it is there (`route replace`).
    Put(Marker),
    /// `route del`: fails if it is not there.
    Remove(Marker),
}

#[derive(Debug, thiserror::Error)]
pub enum RouteTableError {
    #[error("cannot run `ip` (iproute2): {0}")]
    Spawn(#[source] std::io::Error),
    /// `ip` ran and failed; with `-force` the other lines of its batch were applied.
    #[error("`ip {command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("`ip {command}` printed what is not a route list: {why}")]
    Unreadable { command: String, why: String },
}

/// What `ip` prints when a table has no route of a family yet: such a table is empty.
const NO_SUCH_TABLE: &str = "FIB table does not exist";

/// The batch that applies `changes` in order, one command a line.
pub fn batch(changes: &[Change]) -> String {
    let mut text = String::new();
    for c in changes {
        let line = match c {
            Change::Put(m) => format!("route replace blackhole {} table {}\n", m.net, m.table),
            Change::Remove(m) => format!("route del {} table {}\n", m.net, m.table),
        };
        text.push_str(&line);
    }
    text
}

/// Applies `changes` with one `ip -force -batch -`: a line that fails (a route already
/// gone) does not stop the others. `Err` if any line failed or `ip` could not run.
pub fn apply(changes: &[Change]) -> Result<(), RouteTableError> {
    if changes.is_empty() {
        return Ok(());
    }
    let text = batch(changes);
    let command = "-force -batch -";
    let mut child = Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(RouteTableError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error means `ip` ended early; its status and stderr say why.
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(RouteTableError::Spawn)?;
    if out.status.success() {
        return Ok(());
    }
    Err(RouteTableError::Failed {
        command: command.into(),
        stderr: one_line(&out.stderr),
    })
}

/// The prefixes in `table`, both families, whatever their route type.
pub fn read(table: u32) -> Result<BTreeSet<IpNet>, RouteTableError> {
    let mut nets = BTreeSet::new();
    for family in [Family::V4, Family::V6] {
        let table_arg = table.to_string();
        let args = [
            "-json",
            family.flag(),
            "route",
            "show",
            "table",
            table_arg.as_str(),
        ];
        let command = args.join(" ");
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(RouteTableError::Spawn)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if stderr.contains(NO_SUCH_TABLE) {
                continue;
            }
            return Err(RouteTableError::Failed {
                command,
                stderr: one_line(&out.stderr),
            });
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let found = parse_routes(&text, family)
            .map_err(|why| RouteTableError::Unreadable { command, why })?;
        nets.extend(found);
    }
    Ok(nets)
}

/// Empties `table` of every route of both families.
pub fn flush(table: u32) -> Result<(), RouteTableError> {
    for family in [Family::V4, Family::V6] {
        let table_arg = table.to_string();
        let args = [family.flag(), "route", "flush", "table", table_arg.as_str()];
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(RouteTableError::Spawn)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !stderr.contains(NO_SUCH_TABLE) {
            return Err(RouteTableError::Failed {
                command: args.join(" "),
                stderr: one_line(&out.stderr),
            });
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }
}

#[derive(Deserialize)]
struct JsonRoute {
    dst: String,
}

/// The destinations of `ip -json -4|-6 route show`'s output. `ip` writes `default` for the
/// zero-length prefix and a host route without its length.
pub fn parse_routes(json: &str, family: Family) -> Result<Vec<IpNet>, String> {
    let routes: Vec<JsonRoute> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    routes
        .iter()
        .map(|r| parse_dst(&r.dst, family).ok_or_else(|| format!("destination {:?}", r.dst)))
        .collect()
}

fn parse_dst(dst: &str, family: Family) -> Option<IpNet> {
    let net = match (dst, family) {
        ("default", Family::V4) => IpNet::V4(Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).ok()?),
        ("default", Family::V6) => IpNet::V6(Ipv6Net::new(Ipv6Addr::UNSPECIFIED, 0).ok()?),
        (d, _) if d.contains('/') => d.parse().ok()?,
        (d, _) => IpNet::from(d.parse::<std::net::IpAddr>().ok()?),
    };
    let ok = match family {
        Family::V4 => net.addr().is_ipv4(),
        Family::V6 => net.addr().is_ipv6(),
    };
    ok.then_some(net)
}

/// `ip`'s complaint as one line for a log.
fn one_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        "no message".into()
    } else {
        lines.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect(s)
    }

    #[test]
    fn a_batch_puts_and_removes_line_by_line() {
        let a = Marker {
            table: 200,
            net: net("198.18.5.0/24"),
        };
        let b = Marker {
            table: 201,
            net: net("fd00:198:18:5::/64"),
        };
        assert_eq!(
            batch(&[Change::Put(b), Change::Remove(a)]),
            "route replace blackhole fd00:198:18:5::/64 table 201\n\
             route del 198.18.5.0/24 table 200\n"
        );
        assert_eq!(batch(&[]), "");
    }

    #[test]
    fn routes_are_read_as_ip_prints_them() {
        // Captured from iproute2 6.1 (Debian 12).
        let v4 = r#"[{"type":"blackhole","dst":"default","flags":[]},{"type":"blackhole","dst":"198.18.6.1","flags":[]},{"type":"blackhole","dst":"198.18.5.0/24","protocol":"static","flags":[]}]"#;
        assert_eq!(
            parse_routes(v4, Family::V4),
            Ok(vec![
                net("0.0.0.0/0"),
                net("198.18.6.1/32"),
                net("198.18.5.0/24")
            ])
        );
        let v6 = r#"[{"type":"blackhole","dst":"fd00:198:18:5::/64","dev":"lo","metric":1024,"flags":[],"pref":"medium"},{"type":"blackhole","dst":"default","dev":"lo","metric":1024,"flags":[]}]"#;
        assert_eq!(
            parse_routes(v6, Family::V6),
            Ok(vec![net("fd00:198:18:5::/64"), net("::/0")])
        );
        assert_eq!(parse_routes("[]", Family::V6), Ok(vec![]));
        // A family's route in the other's list, a broken list: never taken as empty.
        assert!(parse_routes(v4, Family::V6).is_err());
        assert!(parse_routes("[", Family::V4).is_err());
        assert!(parse_routes(r#"[{"dst":"10.0.0.0/33"}]"#, Family::V4).is_err());
    }
}
