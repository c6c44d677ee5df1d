//! Whether the daemon serves: every tunnel worker's loop answers within
//! [`WORKER_ANSWER`], and it is not draining. `GET /healthz` on the metrics endpoint
//! answers it ([`serving`]), and `pepd health` asks it ([`ask`]): what keepalived's
//! `vrrp_script` runs on a redundant hub, so that the virtual addresses move when pepd
//! stops serving, not only when its process is gone.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::proxy::live::LiveRef;
use crate::tunnel::gateway::Gateway;
use crate::tunnel::workers::Workers;

/// How long every worker's loop gets to show that it runs.
pub const WORKER_ANSWER: Duration = Duration::from_millis(300);

/// How long `pepd health` waits for the whole answer.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(700);

/// Ok when the daemon serves, else why not.
pub async fn serving(gateway: &Gateway, live: &LiveRef) -> Result<(), String> {
    if live.read().unwrap_or_else(|p| p.into_inner()).draining {
        return Err("draining".into());
    }
    workers_answer(&gateway.workers, WORKER_ANSWER).await
}

/// Asks every worker's loop and waits up to `within` for all of them to answer.
pub async fn workers_answer(workers: &Workers, within: Duration) -> Result<(), String> {
    let asked = workers.ask();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let Some(worker) = workers.unanswered(&asked) else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "tunnel worker {worker} did not answer within {} ms",
                within.as_millis()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Where a client on this host reaches an endpoint listening on `listen`: the loopback
/// address of its family when it listens on every address.
pub fn local_target(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

/// `pepd health`'s question to the metrics endpoint at `at`: Ok with the daemon's line
/// when it serves, Err with its line (or why no answer came) otherwise.
pub fn ask(at: SocketAddr, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let no_answer = |e: std::io::Error| format!("no answer from {at}: {e}");
    let mut s = TcpStream::connect_timeout(&at, timeout).map_err(no_answer)?;
    s.set_write_timeout(Some(timeout)).map_err(no_answer)?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pepd\r\nConnection: close\r\n\r\n")
        .map_err(no_answer)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let wait = left();
        if wait.is_zero() {
            return Err(format!(
                "no complete answer from {at} within {} ms",
                timeout.as_millis()
            ));
        }
        s.set_read_timeout(Some(wait)).map_err(no_answer)?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if answer.len() + n <= 4096 => answer.extend_from_slice(&chunk[..n]),
            Ok(_) => return Err(format!("an answer longer than 4 KiB from {at}")),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(no_answer(e)),
        }
    }
    read_answer(&answer).map_err(|why| format!("{at}: {why}"))
}

/// The verdict in an HTTP answer to `GET /healthz`: its status and its body's first line.
fn read_answer(answer: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    let line = body.lines().next().unwrap_or("").trim().to_owned();
    match status {
        200 => Ok(line),
        503 => Err(line),
        other => Err(format!("HTTP {other} (not a pepd metrics endpoint?)")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;

    #[tokio::test]
    async fn workers_that_loop_answer_and_a_stalled_one_is_named() {
        let workers = Arc::new(Workers::new(3, Arc::new(Notify::new())));
        // Workers 0 and 2 run a loop that answers when woken; worker 1's never runs.
        for i in [0, 2] {
            let w = workers.clone();
            tokio::spawn(async move {
                loop {
                    let worker = w.get(i).expect("worker");
                    worker.wake.notified().await;
                    worker.answer();
                }
            });
        }
        let r = workers_answer(&workers, Duration::from_millis(100)).await;
        assert_eq!(
            r,
            Err("tunnel worker 1 did not answer within 100 ms".to_owned())
        );
        // Its loop comes back: it answers again.
        let w = workers.clone();
        tokio::spawn(async move {
            loop {
                let worker = w.get(1).expect("worker");
                worker.wake.notified().await;
                worker.answer();
            }
        });
        assert_eq!(
            workers_answer(&workers, Duration::from_secs(5)).await,
            Ok(())
        );
    }

    #[test]
    fn the_answer_is_read_from_status_and_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nserving\n";
        assert_eq!(read_answer(ok), Ok("serving".to_owned()));
        let no = b"HTTP/1.1 503 Service Unavailable\r\n\r\nnot serving: draining\n";
        assert_eq!(read_answer(no), Err("not serving: draining".to_owned()));
        let other = b"HTTP/1.1 404 Not Found\r\n\r\n";
        assert_eq!(
            read_answer(other),
            Err("HTTP 404 (not a pepd metrics endpoint?)".to_owned())
        );
        assert_eq!(
            read_answer(b"SSH-2.0-x\r\n"),
            Err("not an HTTP answer".to_owned())
        );
    }

    #[test]
    fn a_wildcard_listener_is_asked_on_loopback() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("address");
        assert_eq!(local_target(at("0.0.0.0:9464")), at("127.0.0.1:9464"));
        assert_eq!(local_target(at("[::]:9464")), at("[::1]:9464"));
        assert_eq!(local_target(at("198.18.0.1:9000")), at("198.18.0.1:9000"));
    }
}
