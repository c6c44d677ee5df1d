//! The scrape endpoint: just enough HTTP/1.1 for a Prometheus server (or curl) to fetch
//! `/metrics`, and for a health check to ask `/healthz` whether the daemon serves. One request per connection, then close: scrapers do not need keep-alive,
//! and it keeps a misbehaving client from holding a connection slot for long.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{encode, Snapshot};

/// What [`encode`] produces: the OpenMetrics text format (it ends in `# EOF` and has `info`
/// and `# UNIT` lines, so the classic Prometheus `text/plain; version=0.0.4` would be a lie).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The daemon's side of a scrape: called once per `GET /metrics`.
pub type SnapshotSource = Arc<dyn Fn() -> Snapshot + Send + Sync>;

/// The daemon's side of `GET /healthz`: Ok when it serves, else why not.
pub type HealthSource = Arc<HealthFn>;

/// What a [`HealthSource`] calls: one check per request.
pub type HealthFn =
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync;

/// Bounds on what one client can cost.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Largest request head (request line and headers) read; larger gets 431.
    pub max_head: usize,
    /// Time allowed for the whole request head to arrive; longer gets 408.
    pub read_timeout: Duration,
    /// Time allowed for the response to drain to a slow reader before giving up on it.
    pub write_timeout: Duration,
    /// Connections handled at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// After responding, how long and how much to keep reading until the client closes.
    pub linger: Duration,
    pub linger_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 8 * 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 32,
            linger: Duration::from_secs(2),
            linger_bytes: 256 * 1024,
        }
    }
}

/// Serves `GET /metrics` and `GET /healthz` (and `HEAD`) on `listener` until `stop` turns
/// true or its sender is dropped. Each connection is handled in its own task; connections
/// still open when this returns are aborted.
pub async fn serve(
    listener: TcpListener,
    source: SnapshotSource,
    health: HealthSource,
    stop: watch::Receiver<bool>,
) {
    serve_with(listener, source, health, stop, Limits::default()).await;
}

pub(super) async fn serve_with(
    listener: TcpListener,
    source: SnapshotSource,
    health: HealthSource,
    stop: watch::Receiver<bool>,
    limits: Limits,
) {
    crate::sys::serve::serve(
        listener,
        limits.max_connections,
        stop,
        "metrics",
        |stream| {
            let (source, health) = (source.clone(), health.clone());
            async move { handle(stream, &*source, &*health, limits).await }
        },
    )
    .await;
}

#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("request head longer than the limit")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("connection closed before a request arrived")]
    Closed,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The parts of a request line the router needs.
#[derive(Debug, PartialEq, Eq)]
struct RequestLine {
    method: String,
    path: String,
}

async fn handle(
    mut stream: TcpStream,
    source: &(dyn Fn() -> Snapshot + Send + Sync),
    health: &HealthFn,
    limits: Limits,
) {
    let head = tokio::time::timeout(limits.read_timeout, read_head(&mut stream, limits.max_head));
    // After a timeout everything the client sent has been read, so closing cannot reset the
    // connection; lingering would only hold a slot longer for a client that already stalled.
    let mut linger_after = true;
    let response = match head.await {
        Err(_) => {
            linger_after = false;
            status_only(408, "Request Timeout")
        }
        // Nobody left to answer.
        Ok(Err(RequestError::Closed | RequestError::Io(_))) => return,
        Ok(Err(RequestError::TooLarge)) => status_only(431, "Request Header Fields Too Large"),
        Ok(Err(err @ RequestError::Malformed(_))) => {
            debug!(%err, "metrics: bad request");
            status_only(400, "Bad Request")
        }
        Ok(Ok(head)) => match parse_request_line(&head) {
            Ok(line) if line.path == "/healthz" => healthz(&line, health).await,
            Ok(line) => route(&line, source),
            Err(err) => {
                debug!(%err, "metrics: bad request");
                status_only(400, "Bad Request")
            }
        },
    };
    let sent = tokio::time::timeout(limits.write_timeout, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await;
    match sent {
        Ok(Ok(())) if linger_after => linger(&mut stream, limits).await,
        Ok(Ok(())) => {}
        Ok(Err(err)) => debug!(%err, "metrics: response not delivered"),
        Err(_) => debug!("metrics: response not delivered in time"),
    }
}

/// Reads and discards what the client still sends until it closes, within bounds. Closing
/// with unread data makes the kernel send a reset, which can destroy the response in the
/// client's receive buffer before it is read (a client that sent a body, an oversized head,
/// or a pipelined request would see "connection reset" instead of our answer).
async fn linger(stream: &mut TcpStream, limits: Limits) {
    let mut left = limits.linger_bytes;
    let mut chunk = [0u8; 4096];
    let _ = tokio::time::timeout(limits.linger, async {
        while left > 0 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Reads up to the blank line that ends the request head; the head, without it.
async fn read_head(stream: &mut TcpStream, max: usize) -> Result<Vec<u8>, RequestError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(if buf.is_empty() {
                RequestError::Closed
            } else {
                RequestError::Malformed("connection closed inside the request head")
            });
        }
        // Resume the search a few bytes back: the terminator may straddle two reads.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf[from..]) {
            let end = from + end;
            if end > max {
                return Err(RequestError::TooLarge);
            }
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > max {
            return Err(RequestError::TooLarge);
        }
    }
}

/// Where the head ends in `b`: the offset of its terminating blank line. Bare LF line ends
/// are tolerated, as RFC 9112 §2.2 allows.
fn head_end(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = b.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn parse_request_line(head: &[u8]) -> Result<RequestLine, RequestError> {
    let line_end = head.iter().position(|&c| c == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end])
        .map_err(|_| RequestError::Malformed("request line is not UTF-8"))?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::Malformed(
            "request line is not `METHOD target HTTP/1.x`",
        ));
    };
    if method.is_empty() || !method.bytes().all(|c| c.is_ascii_alphabetic()) {
        return Err(RequestError::Malformed("bad method"));
    }
    if !target.starts_with('/') {
        return Err(RequestError::Malformed("target is not an absolute path"));
    }
    if !version.starts_with("HTTP/1.") {
        return Err(RequestError::Malformed("not HTTP/1.x"));
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(RequestLine {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

/// 200 `serving` or 503 `not serving: <why>`, one line of plain text either way.
async fn healthz(req: &RequestLine, health: &HealthFn) -> Vec<u8> {
    let head_only = match req.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => return response(405, "Method Not Allowed", &[("Allow", "GET, HEAD")], None),
    };
    let (code, reason, body) = match health().await {
        Ok(()) => (200, "OK", "serving\n".to_owned()),
        Err(why) => (503, "Service Unavailable", format!("not serving: {why}\n")),
    };
    let mut r = response(
        code,
        reason,
        &[("Content-Type", "text/plain; charset=utf-8")],
        Some(body.len()),
    );
    if !head_only {
        r.extend_from_slice(body.as_bytes());
    }
    r
}

fn route(req: &RequestLine, source: &(dyn Fn() -> Snapshot + Send + Sync)) -> Vec<u8> {
    if req.path != "/metrics" {
        return status_only(404, "Not Found");
    }
    let head_only = match req.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => return response(405, "Method Not Allowed", &[("Allow", "GET, HEAD")], None),
    };
    // A panic in the daemon's snapshot code (a poisoned lock, say) becomes a 500 for this
    // scrape rather than a silently dropped connection.
    let snapshot = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(source)) {
        Ok(s) => s,
        Err(_) => {
            warn!("metrics: taking the snapshot panicked");
            return status_only(500, "Internal Server Error");
        }
    };
    match encode(&snapshot) {
        Ok(body) => {
            let mut r = response(
                200,
                "OK",
                &[("Content-Type", CONTENT_TYPE)],
                Some(body.len()),
            );
            if !head_only {
                r.extend_from_slice(body.as_bytes());
            }
            r
        }
        Err(err) => {
            warn!(%err, "metrics: encoding failed");
            status_only(500, "Internal Server Error")
        }
    }
}

/// A response whose body is its status line's reason phrase, so a human with curl sees why.
fn status_only(code: u16, reason: &str) -> Vec<u8> {
    let body = format!("{reason}\n");
    let mut r = response(
        code,
        reason,
        &[("Content-Type", "text/plain; charset=utf-8")],
        Some(body.len()),
    );
    r.extend_from_slice(body.as_bytes());
    r
}

/// Status line and headers; `content_length: None` sends an empty body.
fn response(
    code: u16,
    reason: &str,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {code} {reason}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        content_length.unwrap_or(0)
    ));
    head.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end_finds_either_terminator() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn request_line_parsing() {
        let ok = |s: &str| parse_request_line(s.as_bytes()).expect("parses");
        assert_eq!(
            ok("GET /metrics HTTP/1.1\r\nHost: x"),
            RequestLine {
                method: "GET".into(),
                path: "/metrics".into()
            }
        );
        assert_eq!(ok("GET /metrics?x=1 HTTP/1.0").path, "/metrics");
        for bad in [
            "",
            "GET",
            "GET /metrics",
            "GET /metrics HTTP/2.0",
            "GET  /metrics HTTP/1.1",
            "GET /metrics HTTP/1.1 extra",
            "G3T /metrics HTTP/1.1",
            "GET metrics HTTP/1.1",
            "PRI * HTTP/2.0",
        ] {
            assert!(
                matches!(
                    parse_request_line(bad.as_bytes()),
                    Err(RequestError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        assert!(parse_request_line(b"GET /\xff HTTP/1.1").is_err());
    }
}
