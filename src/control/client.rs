//! `pepd status` and `pepd flows`: one request to the running daemon's control socket,
//! its answer printed as text or JSON, once or every few seconds. What keeps it from an
//! answer is said in one sentence, with an exit code of its own.

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::{Answer, Ask, Request, VERSION};
use super::screen::{flows_text, status_text, SortKey};

/// How long `pepd status` waits for the daemon's answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The largest answer read (a hub of thousands of peers answers some megabytes).
const MAX_ANSWER: u64 = 64 << 20;

/// The shortest `--watch` period.
pub const MIN_WATCH: Duration = Duration::from_millis(50);

/// Why there is no answer.
#[derive(Debug)]
pub enum Trouble {
    /// No socket at the path, or one nothing answers on.
    NotRunning { socket: PathBuf, stale: bool },
    /// The socket is not this user's to use.
    NoAccess { socket: PathBuf, group: String },
    /// Connected, and no answer came in time.
    NoAnswer { socket: PathBuf },
    /// Anything else, said as one sentence.
    Failed(String),
}

impl Trouble {
    /// `pepd status`'s exit code: 3 for a daemon not running and 4 for a socket the user
    /// may not use (the LSB's codes for `status`), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Trouble::NotRunning { .. } => 3,
            Trouble::NoAccess { .. } => 4,
            Trouble::NoAnswer { .. } | Trouble::Failed(_) => 1,
        }
    }
}

impl fmt::Display for Trouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trouble::NotRunning {
                socket,
                stale: false,
            } => write!(
                f,
                "pepd is not running: there is no control socket {}",
                socket.display()
            ),
            Trouble::NotRunning {
                socket,
                stale: true,
            } => write!(
                f,
                "pepd is not running: nothing answers on {}",
                socket.display()
            ),
            Trouble::NoAccess { socket, group } => write!(
                f,
                "permission denied on {}: run this as root or as a member of group {group}",
                socket.display()
            ),
            Trouble::NoAnswer { socket } => write!(
                f,
                "pepd did not answer on {} within {} s",
                socket.display(),
                ANSWER_WAIT.as_secs()
            ),
            Trouble::Failed(why) => f.write_str(why),
        }
    }
}

/// Asks the daemon at `socket`.
pub fn ask(socket: &Path, request: &Request) -> Result<Answer, Trouble> {
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Trouble::NotRunning {
            socket: socket.to_owned(),
            stale: false,
        },
        io::ErrorKind::ConnectionRefused => Trouble::NotRunning {
            socket: socket.to_owned(),
            stale: true,
        },
        io::ErrorKind::PermissionDenied => Trouble::NoAccess {
            socket: socket.to_owned(),
            group: group_of(socket),
        },
        _ => Trouble::Failed(format!("cannot connect to {}: {e}", socket.display())),
    })?;
    let failed = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Trouble::NoAnswer {
            socket: socket.to_owned(),
        },
        _ => Trouble::Failed(format!("talking to pepd on {}: {e}", socket.display())),
    };
    stream.set_read_timeout(Some(ANSWER_WAIT)).map_err(failed)?;
    stream
        .set_write_timeout(Some(ANSWER_WAIT))
        .map_err(failed)?;
    let mut line = serde_json::to_vec(request)
        .map_err(|e| Trouble::Failed(format!("writing the request: {e}")))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(failed)?;
    let mut text = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut text)
        .map_err(failed)?;
    read_answer(&text, socket)
}

/// The answer in `text`, or what is wrong with it.
fn read_answer(text: &[u8], socket: &Path) -> Result<Answer, Trouble> {
    #[derive(serde::Deserialize)]
    struct Versioned {
        version: u32,
    }
    let bad = |e: serde_json::Error| {
        Trouble::Failed(format!(
            "pepd on {} answered what this pepd cannot read: {e}",
            socket.display()
        ))
    };
    let v: Versioned = serde_json::from_slice(text).map_err(bad)?;
    if v.version != VERSION {
        return Err(Trouble::Failed(format!(
            "pepd on {} speaks control protocol version {}, this pepd version {VERSION}: run \
             the pepd binary of the running daemon",
            socket.display(),
            v.version
        )));
    }
    let answer: Answer = serde_json::from_slice(text).map_err(bad)?;
    match &answer.error {
        Some(why) => Err(Trouble::Failed(format!("pepd answered: {why}"))),
        None => Ok(answer),
    }
}

/// The name of the socket's group, for the sentence that says who may use it.
fn group_of(socket: &Path) -> String {
    let gid = std::fs::metadata(socket).map(|m| m.gid()).ok();
    gid.and_then(|g| {
        nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(g))
            .ok()
            .flatten()
    })
    .map_or_else(|| super::socket::GROUP.to_owned(), |g| g.name)
}

/// What `pepd status` or `pepd flows` asks and how it prints the answer.
#[derive(Debug, Clone)]
pub struct Query {
    pub socket: PathBuf,
    pub ask: Ask,
    pub peer: Option<String>,
    pub sort: SortKey,
    /// The answer as it came (one JSON line) rather than as text.
    pub json: bool,
    /// Ask again every this long, until interrupted.
    pub watch: Option<Duration>,
}

impl Query {
    fn request(&self) -> Request {
        Request {
            version: VERSION,
            request: self.ask,
            peer: self.peer.clone(),
        }
    }

    /// What to print of `answer`.
    fn render(&self, answer: &Answer) -> String {
        if self.json {
            let mut line = serde_json::to_string(answer).unwrap_or_default();
            line.push('\n');
            return line;
        }
        match (&answer.status, &answer.flows) {
            (Some(s), _) => status_text(s, self.sort),
            (None, Some(f)) => flows_text(f),
            (None, None) => String::new(),
        }
    }

    /// Asks and prints, once or (with `watch`) until interrupted. A failure of the first
    /// request ends it; later ones are printed in place of the answer, and it asks again.
    pub fn run(&self) -> Result<(), Trouble> {
        let request = self.request();
        let first = ask(&self.socket, &request)?;
        let Some(every) = self.watch else {
            print(&self.render(&first));
            return Ok(());
        };
        let every = every.max(MIN_WATCH);
        // On a terminal each answer replaces the last; elsewhere they follow each other.
        let clear = !self.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
        let mut answer = Ok(first);
        // Asked at a steady pace: every `every` from the first, whatever an answer took
        // (one that took longer than that is followed at once).
        let mut next = Instant::now();
        loop {
            let mut frame = String::new();
            if clear {
                frame.push_str("\x1b[H\x1b[2J");
            }
            match &answer {
                Ok(a) => frame.push_str(&self.render(a)),
                Err(t) => frame.push_str(&format!("pepd: {t}\n")),
            }
            if !self.json && !clear {
                frame.push('\n');
            }
            if !print(&frame) {
                return Ok(());
            }
            next += every;
            let now = Instant::now();
            match next.checked_duration_since(now) {
                Some(wait) => std::thread::sleep(wait),
                None => next = now,
            }
            answer = ask(&self.socket, &request);
        }
    }
}

/// Whether the text went out: a closed pipe (`pepd status --watch | head`) ends the
/// output, without a panic.
fn print(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}
