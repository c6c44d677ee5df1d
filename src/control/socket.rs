//! The control socket: a unix stream socket per instance on which the daemon answers
//! `pepd status` and `pepd flows` (docs/OPERATIONS.md, "Status"). Who may connect is who
//! may write the socket file: mode 0660, group `pepd`. Answers are built from the snapshot
//! the metrics take, on a blocking thread, a bounded number of clients at a time, so that
//! neither the tunnel's workers nor the relays wait for a client.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::protocol::{
    Answer, Ask, Request, ANSWER_TIMEOUT, MAX_CLIENTS, MAX_REQUEST, REQUEST_TIMEOUT, VERSION,
};
use super::status::StatusSource;

/// The group whose members may use the socket (the package makes it with the user).
pub const GROUP: &str = "pepd";

/// The socket file while the daemon runs; removed when dropped, unless another process
/// has put its own at the path since.
pub struct SocketFile {
    path: PathBuf,
    /// Device, inode and change time of the socket bound: a file system may give the
    /// inode of a removed socket to the next one at once.
    identity: (u64, u64, i64, i64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| identity(&m) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// A bound control socket: its listener, the file, and what an operator should know of
/// who may use it (a missing group), to log.
pub struct Bound {
    pub listener: UnixListener,
    pub file: SocketFile,
    pub note: Option<String>,
}

/// Binds the control socket at `path`: makes its directory if missing (mode 0755), takes
/// the place of a socket no process answers on any more (a crashed daemon's), refuses one
/// another daemon answers on, and gives the socket mode 0660 and group [`GROUP`]. Needs a
/// tokio runtime.
pub fn bind(path: &Path) -> anyhow::Result<Bound> {
    if let Some(dir) = path.parent().filter(|d| !d.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => anyhow::bail!(
                "another pepd answers on it (each instance needs a socket of its own: give \
                 it a config file of its own name, or set `[control] socket`)"
            ),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .context("removing the socket left by a pepd that stopped")?;
            }
            Err(e) => return Err(e).context("checking the socket found there"),
        },
        Ok(_) => anyhow::bail!("it exists and is not a socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    // Bound with the process's umask (0077 under the unit): never more open than this.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    let note = give_to_group(path);
    let m = std::fs::symlink_metadata(path)?;
    listener.set_nonblocking(true)?;
    Ok(Bound {
        listener: UnixListener::from_std(listener)?,
        file: SocketFile {
            path: path.to_owned(),
            identity: identity(&m),
        },
        note,
    })
}

/// Puts the socket in [`GROUP`]; what keeps it from there, as the log should say it.
fn give_to_group(path: &Path) -> Option<String> {
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::geteuid().to_string(), |u| u.name);
    let only = || {
        let who = if user == "root" {
            "root".to_owned()
        } else {
            format!("root and {user}")
        };
        format!("only {who} may use {}", path.display())
    };
    match nix::unistd::Group::from_name(GROUP) {
        Ok(Some(g)) => match nix::unistd::chown(path, None, Some(g.gid)) {
            Ok(()) => None,
            Err(e) => Some(format!(
                "could not give the control socket to group {GROUP} ({e}; pepd's user is not \
                 a member): {}",
                only()
            )),
        },
        Ok(None) => {
            let gid = nix::unistd::getegid();
            let group = nix::unistd::Group::from_gid(gid)
                .ok()
                .flatten()
                .map_or_else(|| gid.to_string(), |g| g.name);
            let who = if user == "root" {
                format!("root and members of group {group}")
            } else {
                format!("root, {user} and members of group {group}")
            };
            Some(format!(
                "there is no group {GROUP} on this host: {} keeps group {group}, so only {who} \
                 may use it",
                path.display()
            ))
        }
        Err(e) => Some(format!("looking up group {GROUP}: {e}: {}", only())),
    }
}

/// Answers on `listener` until `stop` turns true or its sender goes; connections still
/// open then are dropped.
pub async fn serve(listener: UnixListener, source: Arc<StatusSource>, stop: watch::Receiver<bool>) {
    crate::sys::serve::serve(listener, MAX_CLIENTS, stop, "control socket", |stream| {
        answer(stream, source.clone())
    })
    .await;
}

/// Reads one request line and writes the answer.
async fn answer(mut stream: UnixStream, source: Arc<StatusSource>) {
    let answer = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream)).await {
        Err(_) => Answer::error(format!(
            "no request line within {} s",
            REQUEST_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Answer::error(e),
        Ok(Ok(line)) => match Request::parse(&line) {
            Ok(req) => tokio::task::spawn_blocking(move || respond(&source, &req))
                .await
                .unwrap_or_else(|e| Answer::error(format!("the answer failed: {e}"))),
            Err(why) => Answer::error(why),
        },
    };
    let mut text = match serde_json::to_vec(&answer) {
        Ok(t) => t,
        Err(e) => {
            warn!(%e, "control socket: the answer did not serialise");
            return;
        }
    };
    text.push(b'\n');
    let sent = tokio::time::timeout(ANSWER_TIMEOUT, async {
        stream.write_all(&text).await?;
        stream.shutdown().await
    })
    .await;
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(%e, "control socket: the client left before its answer"),
        Err(_) => debug!("control socket: the client did not take its answer in time"),
    }
    // Closed with bytes of the client's unread, the socket would reset the client's side,
    // and it could lose the answer waiting there: what it sent beyond the request (a line
    // too long) is read first, until it closes, for a moment at most.
    let _ = tokio::time::timeout(LINGER, async {
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// How long, and how much, the daemon reads after its answer, until the client closes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// The request line, without its newline: what came before the client's newline or end of
/// stream, at most [`MAX_REQUEST`] bytes.
async fn read_request(stream: &mut UnixStream) -> Result<Vec<u8>, String> {
    let mut line = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Ok(line);
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            if line.len() < MAX_REQUEST {
                return Ok(line);
            }
        } else {
            line.extend_from_slice(&chunk[..n]);
        }
        if line.len() >= MAX_REQUEST {
            return Err(format!("request longer than {MAX_REQUEST} bytes"));
        }
    }
}

fn respond(source: &StatusSource, req: &Request) -> Answer {
    let peer = req.peer.as_deref();
    let answer = match req.request {
        Ask::Status => source.status(peer).map(|s| Answer {
            version: VERSION,
            status: Some(s),
            ..Answer::default()
        }),
        Ask::Flows => source.flows(peer).map(|f| Answer {
            version: VERSION,
            flows: Some(f),
            ..Answer::default()
        }),
    };
    answer.unwrap_or_else(|e| Answer::error(e.to_string()))
}

#[cfg(test)]
mod tests;
