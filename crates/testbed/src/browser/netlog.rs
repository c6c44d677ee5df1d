//! The browser's QUIC attempts from its NetLog (`--log-net-log`): for each QUIC session
//! and each QUIC connection job to the page's server, how long it lived, whether the
//! handshake completed, and the error it ended with.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::Error;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QuicAttempt {
    /// "session" (a QUIC connection) or "job" (the request for one, which also ends when
    /// no connection could be made).
    pub kind: &'static str,
    /// From its start to its end in the log; None when it had not ended when the log did.
    pub lived_ms: Option<f64>,
    pub handshake_completed: bool,
    /// The network error it ended with (e.g. ERR_QUIC_CERT_ROOT_NOT_KNOWN,
    /// ERR_CONNECTION_REFUSED), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net_error: Option<String>,
    /// The QUIC close reason, for a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_details: Option<String>,
}

impl QuicAttempt {
    /// How it ended, in a word or a few: the network error or the close reason, else
    /// whether the handshake had completed.
    pub fn end(&self) -> String {
        match (&self.net_error, &self.close_details) {
            (Some(e), _) => e.clone(),
            (None, Some(d)) => d.clone(),
            (None, None) if self.lived_ms.is_none() => "open when the log ended".into(),
            (None, None) if self.handshake_completed => "closed after its handshake".into(),
            (None, None) => "closed before its handshake".into(),
        }
    }
}

/// Reads the NetLog at `path`. A log the browser could not finish (killed) lacks its
/// closing brackets; they are added before giving up.
pub fn quic_attempts(path: &Path, host: &str) -> Result<Vec<QuicAttempt>, Error> {
    let text = std::fs::read_to_string(path)?;
    let log: Value = serde_json::from_str(&text)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", text.trim_end().trim_end_matches(','))))
        .map_err(|e| Error::Invalid(format!("NetLog {}: {e}", path.display())))?;
    Ok(attempts(&log, host))
}

/// A NetLog constants table (name → code) turned round, code → name; a table missing from
/// the log is empty.
fn names_by_code<'a, K: Ord>(
    log: &'a Value,
    table: &str,
    code: impl Fn(&Value) -> Option<K>,
) -> BTreeMap<K, &'a str> {
    log.pointer(table)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((code(v)?, k.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

pub fn attempts(log: &Value, host: &str) -> Vec<QuicAttempt> {
    let types = names_by_code(log, "/constants/logEventTypes", Value::as_u64);
    let errors = names_by_code(log, "/constants/netError", Value::as_i64);
    let phase_of = |name: &str, default: u64| {
        log.pointer(&format!("/constants/logEventPhase/{name}"))
            .and_then(Value::as_u64)
            .unwrap_or(default)
    };
    let (begin, end) = (phase_of("PHASE_BEGIN", 1), phase_of("PHASE_END", 2));
    let Some(events) = log.get("events").and_then(Value::as_array) else {
        return Vec::new();
    };
    // Source id → (index in `out`, start time).
    let mut open: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    let mut out: Vec<QuicAttempt> = Vec::new();
    for e in events {
        let Some(name) = e
            .get("type")
            .and_then(Value::as_u64)
            .and_then(|t| types.get(&t))
        else {
            continue;
        };
        let Some(source) = e.pointer("/source/id").and_then(Value::as_u64) else {
            continue;
        };
        let phase = e.get("phase").and_then(Value::as_u64).unwrap_or(0);
        let time = e
            .get("time")
            .and_then(|t| t.as_str().and_then(|s| s.parse().ok()).or(t.as_f64()))
            .unwrap_or(f64::NAN);
        let params = e.get("params").unwrap_or(&Value::Null);
        let error_name = |p: &Value| {
            p.get("net_error")
                .and_then(Value::as_i64)
                .filter(|&c| c != 0)
                .map(|c| {
                    errors
                        .get(&c)
                        .map_or_else(|| c.to_string(), |n| (*n).to_owned())
                })
        };
        let kind = match *name {
            "QUIC_SESSION" => Some("session"),
            "QUIC_SESSION_POOL_JOB" => Some("job"),
            _ => None,
        };
        match (kind, phase) {
            (Some(kind), p) if p == begin => {
                if params.get("host").and_then(Value::as_str) == Some(host) {
                    open.insert(source, (out.len(), time));
                    out.push(QuicAttempt {
                        kind,
                        lived_ms: None,
                        handshake_completed: false,
                        net_error: None,
                        close_details: None,
                    });
                }
            }
            (Some(_), p) if p == end => {
                if let Some((i, t0)) = open.remove(&source) {
                    out[i].lived_ms = Some(time - t0);
                    if out[i].net_error.is_none() {
                        out[i].net_error = error_name(params);
                    }
                }
            }
            _ => {
                let Some(&(i, _)) = open.get(&source) else {
                    continue;
                };
                match *name {
                    "QUIC_SESSION_CRYPTO_HANDSHAKE_COMPLETE" => out[i].handshake_completed = true,
                    "QUIC_SESSION_CLOSE_ON_ERROR" | "QUIC_SESSION_POOL_JOB_CONNECT" => {
                        if let Some(err) = error_name(params) {
                            out[i].net_error = Some(err);
                        }
                    }
                    "QUIC_SESSION_CLOSED" => {
                        // The first sentence; TLS failures append the library's error stack.
                        out[i].close_details = params
                            .get("details")
                            .and_then(Value::as_str)
                            .map(|d| d.split(". ").next().unwrap_or(d).to_owned())
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sessions_and_jobs_to_the_host_with_their_ends() {
        let log = json!({
            "constants": {
                "logEventTypes": {"QUIC_SESSION": 10, "QUIC_SESSION_POOL_JOB": 11,
                    "QUIC_SESSION_CRYPTO_HANDSHAKE_COMPLETE": 12, "QUIC_SESSION_CLOSED": 13,
                    "QUIC_SESSION_CLOSE_ON_ERROR": 14, "QUIC_SESSION_POOL_JOB_CONNECT": 15},
                "logEventPhase": {"PHASE_BEGIN": 1, "PHASE_END": 2, "PHASE_NONE": 0},
                "netError": {"ERR_CONNECTION_REFUSED": -102}
            },
            "events": [
                {"type": 11, "source": {"id": 1}, "phase": 1, "time": "100", "params": {"host": "h"}},
                {"type": 10, "source": {"id": 2}, "phase": 1, "time": "101", "params": {"host": "h"}},
                {"type": 10, "source": {"id": 3}, "phase": 1, "time": "101", "params": {"host": "other"}},
                {"type": 14, "source": {"id": 2}, "phase": 0, "time": "103", "params": {"net_error": -102}},
                {"type": 13, "source": {"id": 2}, "phase": 0, "time": "103", "params": {"details": "refused. Stack: x"}},
                {"type": 10, "source": {"id": 2}, "phase": 2, "time": "103"},
                {"type": 15, "source": {"id": 1}, "phase": 2, "time": "104", "params": {"net_error": -102}},
                {"type": 11, "source": {"id": 1}, "phase": 2, "time": "104"},
                {"type": 10, "source": {"id": 4}, "phase": 1, "time": "200", "params": {"host": "h"}},
                {"type": 12, "source": {"id": 4}, "phase": 0, "time": "800"}
            ]
        });
        let a = attempts(&log, "h");
        assert_eq!(
            a,
            vec![
                QuicAttempt {
                    kind: "job",
                    lived_ms: Some(4.0),
                    handshake_completed: false,
                    net_error: Some("ERR_CONNECTION_REFUSED".into()),
                    close_details: None,
                },
                QuicAttempt {
                    kind: "session",
                    lived_ms: Some(2.0),
                    handshake_completed: false,
                    net_error: Some("ERR_CONNECTION_REFUSED".into()),
                    close_details: Some("refused".into()),
                },
                QuicAttempt {
                    kind: "session",
                    lived_ms: None,
                    handshake_completed: true,
                    net_error: None,
                    close_details: None,
                },
            ]
        );
    }
}
