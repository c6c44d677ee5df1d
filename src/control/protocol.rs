//! What goes over the control socket: one request line of JSON from the client, one JSON
//! answer line from the daemon, then the daemon closes. Both carry the protocol's
//! version; a daemon answers a request of another version with an error that names its
//! own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::status::{FlowStatus, Status};

/// This protocol's version. Fields may be added within a version (readers ignore what they
/// do not know); anything else takes a new one.
pub const VERSION: u32 = 1;

/// The longest request line the daemon reads, its newline included.
pub const MAX_REQUEST: usize = 1024;

/// How long the daemon waits for a client's request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the daemon gives a client to take its answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Clients the daemon answers at once; more wait in the socket's backlog.
pub const MAX_CLIENTS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    pub request: Ask,
    /// Only this peer's part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ask {
    Status,
    Flows,
}

/// The daemon's answer: one of `status`, `flows` or `error`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Answer {
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Vec<FlowStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Answer {
    pub fn error(why: impl Into<String>) -> Answer {
        Answer {
            version: VERSION,
            error: Some(why.into()),
            ..Answer::default()
        }
    }
}

impl Request {
    /// A request line as the daemon reads it (without its newline): the request, or what
    /// is wrong with it, for an error answer.
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        // The version first, so that a request of another version gets that said rather
        // than a complaint about a field this version does not know.
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let v: Versioned =
            serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))?;
        if v.version != VERSION {
            return Err(format!(
                "this pepd speaks control protocol version {VERSION}, not {}",
                v.version
            ));
        }
        serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))
    }
}
