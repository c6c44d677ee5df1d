//! One pepd process in a namespace: its config file and log in the instance's directory,
//! the notify socket it reports readiness on (the systemd protocol), and the child itself,
//! killed on drop. [`crate::pepd::Gateways`] runs two of them, [`crate::hub`] one per
//! gateway of a hub and its terminals.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::topology::command_in;
use crate::Error;

/// One notify-socket datagram and when it arrived.
#[derive(Clone, Debug)]
pub struct Notification {
    pub at: Instant,
    pub text: String,
}

impl Notification {
    /// Whether one of its `KEY=VALUE` lines starts with `needle`.
    pub fn has(&self, needle: &str) -> bool {
        self.text.lines().any(|l| l.starts_with(needle))
    }
}

#[derive(Default)]
struct Notes {
    list: Mutex<Vec<Notification>>,
    changed: Condvar,
    stop: AtomicBool,
}

fn read_notifications(sock: &UnixDatagram, notes: &Notes) {
    let mut buf = vec![0u8; 4096];
    while !notes.stop.load(Ordering::Relaxed) {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                notes
                    .list
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Notification {
                        at: Instant::now(),
                        text,
                    });
                notes.changed.notify_all();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            // Not expected on a bound datagram socket; back off rather than spin.
            Err(_) => thread::sleep(crate::xfer::io::TICK),
        }
    }
}

/// How a daemon is started: the executable, arguments before `run -c FILE` (for
/// stand-ins such as `pep-testbed fake-pepd`) and extra environment.
#[derive(Clone, Debug)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

pub struct Daemon {
    /// How errors and the panic-time log dump name it, e.g. "gw-a (terminal)".
    label: String,
    ns: String,
    config: PathBuf,
    log: PathBuf,
    notify: PathBuf,
    notes: Arc<Notes>,
    reader: Option<JoinHandle<()>>,
    child: Option<Child>,
}

impl Daemon {
    /// Writes `config_text` to `DIR/FILE.toml` and listens on `DIR/FILE.notify`; the log
    /// goes to `DIR/FILE.log`. Nothing runs until [`Daemon::spawn`].
    pub fn prepare(
        dir: &Path,
        file: &str,
        label: &str,
        ns: &str,
        config_text: &str,
    ) -> Result<Daemon, Error> {
        let config = dir.join(format!("{file}.toml"));
        fs::write(&config, config_text)?;
        let notify = dir.join(format!("{file}.notify"));
        let sock = UnixDatagram::bind(&notify)?;
        sock.set_read_timeout(Some(crate::xfer::io::TICK))?;
        let notes = Arc::new(Notes::default());
        let n = notes.clone();
        let reader = thread::Builder::new()
            .name(format!("notify-{file}"))
            .spawn(move || read_notifications(&sock, &n))?;
        Ok(Daemon {
            label: label.to_owned(),
            ns: ns.to_owned(),
            config,
            log: dir.join(format!("{file}.log")),
            notify,
            notes,
            reader: Some(reader),
            child: None,
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The instance's directory: its config, log, notify and control sockets.
    fn dir(&self) -> &Path {
        self.config.parent().unwrap_or(Path::new("/"))
    }

    /// Where pepd answers `pepd status`: its config file's name with `.sock`, in the
    /// directory it was given as its runtime directory.
    pub fn control_socket(&self) -> PathBuf {
        self.config.with_extension("sock")
    }

    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Starts pepd (which must not be running) and returns when it was started.
    pub fn spawn(&mut self, launch: &Launch) -> Result<Instant, Error> {
        let mut cmd = command_in(&self.ns, &launch.program);
        cmd.args(&launch.args)
            .arg("run")
            .arg("-c")
            .arg(&self.config)
            .env("NOTIFY_SOCKET", &self.notify)
            // What systemd gives a unit with `RuntimeDirectory=`: pepd's control socket
            // goes there, named after the config ([`Daemon::control_socket`]), so that
            // instances of other testbeds never meet at the default /run/pepd.
            .env("RUNTIME_DIRECTORY", self.dir())
            .envs(launch.env.iter().map(|(k, v)| (k, v)));
        self.append_log(&format!("starting {:?}", cmd));
        let started = Instant::now();
        self.child = Some(crate::cmd::spawn_logged(cmd, &self.log)?);
        Ok(started)
    }

    /// Waits until pepd sent a notification with a line starting with `needle`, at or
    /// after `since`. Fails when the deadline passes (`allowed` says how long that was) or
    /// pepd exits first, quoting its log.
    pub fn wait_for(
        &mut self,
        needle: &str,
        since: Instant,
        deadline: Instant,
        allowed: Duration,
    ) -> Result<Notification, Error> {
        loop {
            let notes = self.notes.clone();
            {
                let list = notes.list.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = list.iter().find(|n| n.at >= since && n.has(needle)) {
                    return Ok(n.clone());
                }
                // Short waits: the child's exit is polled, not signalled.
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = notes
                    .changed
                    .wait_timeout(list, left.min(Duration::from_millis(50)));
            }
            if let Some(status) = self.exit_status() {
                return Err(self.failure(&format!("exited ({status}) before sending `{needle}`")));
            }
            if Instant::now() >= deadline {
                let got: Vec<String> = self
                    .notifications()
                    .iter()
                    .map(|n| format!("{:?}", n.text))
                    .collect();
                return Err(self.failure(&format!(
                    "sent no `{needle}` within {allowed:?} (notifications so far: [{}])",
                    got.join(", ")
                )));
            }
        }
    }

    /// An error naming this daemon and quoting the end of its log.
    pub fn failure(&self, what: &str) -> Error {
        Error::Pepd(format!(
            "pepd on {} {what}; log {}:\n{}",
            self.label,
            self.log.display(),
            self.log_tail(40)
        ))
    }

    /// Exit status if pepd has exited (None while running or never started).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_started(&self) -> bool {
        self.child.is_some()
    }

    /// Forgets a child that has exited, noting its status in the log.
    pub fn reap(&mut self) {
        if let Some(status) = self.exit_status() {
            self.child = None;
            self.append_log(&format!("exited earlier: {status}"));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills pepd with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill(&mut self) -> Result<ExitStatus, Error> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| Error::Pepd(format!("pepd on {} is not running", self.label)))?;
        self.append_log("SIGKILL");
        // Child::kill sends SIGKILL.
        child.kill()?;
        Ok(child.wait()?)
    }

    /// Every notification sent so far, oldest first.
    pub fn notifications(&self) -> Vec<Notification> {
        self.notes
            .list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The daemon's stdout and stderr (with the testbed's `===` lines between runs).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = match fs::read(&self.log) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => return format!("(cannot read the log: {e})"),
        };
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Prints the end of the log to stderr (when a test panics with the daemon up).
    pub fn dump_tail(&self, lines: usize) {
        eprintln!(
            "---- pepd on {}, last {lines} lines of {} ----\n{}",
            self.label,
            self.log.display(),
            self.log_tail(lines)
        );
    }

    fn append_log(&self, line: &str) {
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&self.log) {
            let _ = writeln!(f, "=== pep-testbed: {line}");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.notes.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}
