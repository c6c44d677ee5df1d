//! Headless chromium driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: the browser reads commands on its descriptor 3 and writes
//! answers and events on descriptor 4, one JSON message each, ended by a NUL byte), so no
//! port is opened and no websocket is needed.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::topology::command_in;
use crate::Error;

/// How one browser is started.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The network namespace it runs in.
    pub netns: String,
    /// Its profile (`--user-data-dir`); the HTTP cache and the learned Alt-Svc live there.
    pub profile: PathBuf,
    /// Its home directory, where chromium finds the NSS database that trusts the test CA.
    pub home: PathBuf,
    /// Extra switches.
    pub switches: Vec<String>,
    /// Where its stderr goes.
    pub log: PathBuf,
}

/// A running browser and the DevTools session of one page.
pub struct Browser {
    child: Child,
    to_browser: std::fs::File,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
}

fn pipe_err(e: std::io::Error) -> Error {
    Error::Invalid(format!("chromium's DevTools pipe: {e}"))
}

impl Browser {
    pub fn start(l: &Launch) -> Result<Browser, Error> {
        let pipe =
            || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from);
        let (read_fd, to_browser): (OwnedFd, OwnedFd) = pipe()?;
        let (from_browser, write_fd): (OwnedFd, OwnedFd) = pipe()?;
        let (to_browser, from_browser) = (
            std::fs::File::from(to_browser),
            std::fs::File::from(from_browser),
        );
        let (r, w) = (read_fd.as_raw_fd(), write_fd.as_raw_fd());
        let mut cmd = command_in(&l.netns, "chromium");
        cmd.args([
            "--headless",
            // Root cannot use chromium's sandbox; the page is the benchmark's own.
            "--no-sandbox",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            // Nothing but the benchmark's page: no updates, sync, metrics or time queries.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-domain-reliability",
        ])
        .arg(format!("--user-data-dir={}", l.profile.display()))
        .args(&l.switches)
        .arg("about:blank")
        .env("HOME", &l.home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&l.log)?);
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2). The
        // pipe ends are first copied above 9 so that moving them to 3 and 4 never
        // overwrites one with the other; dup2 leaves the copies without close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                use nix::fcntl::{fcntl, FcntlArg};
                let hi_r = fcntl(r, FcntlArg::F_DUPFD(10))?;
                let hi_w = fcntl(w, FcntlArg::F_DUPFD(10))?;
                nix::unistd::dup2(hi_r, 3)?;
                nix::unistd::dup2(hi_w, 4)?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: "chromium".into(),
            source,
        })?;
        drop((read_fd, write_fd));
        let (tx, messages) = mpsc::channel();
        thread::spawn(move || {
            let mut r = BufReader::new(from_browser);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        // A message that is not JSON is dropped: the session then times
                        // out waiting for what it expected, with a clear error.
                        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to_browser,
            messages,
            next_id: 0,
            session: String::new(),
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}), None)?;
        let target_id = str_at(&target, "/targetId")?.to_owned();
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
            None,
        )?;
        b.session = str_at(&attached, "/sessionId")?.to_owned();
        Ok(b)
    }

    fn send(&mut self, method: &str, params: Value, session: Option<&str>) -> Result<u64, Error> {
        self.next_id += 1;
        let mut m = json!({"id": self.next_id, "method": method, "params": params});
        if let Some(s) = session {
            m["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&m).map_err(|e| Error::Invalid(e.to_string()))?;
        bytes.push(0);
        self.to_browser.write_all(&bytes).map_err(pipe_err)?;
        Ok(self.next_id)
    }

    fn recv(&self, deadline: Instant) -> Result<Value, Error> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.messages.recv_timeout(left) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => {
                Err(Error::Invalid("chromium did not answer in time".into()))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::Invalid("chromium closed its DevTools pipe".into()))
            }
        }
    }

    /// Sends a command and waits for its answer; events arriving meanwhile go to `events`.
    fn call_collecting(
        &mut self,
        method: &str,
        params: Value,
        session: Option<&str>,
        events: &mut Vec<Value>,
    ) -> Result<Value, Error> {
        let id = self.send(method, params, session)?;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let m = self.recv(deadline)?;
            if m.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(e) = m.get("error") {
                    return Err(Error::Invalid(format!("chromium: {method}: {e}")));
                }
                return Ok(m.get("result").cloned().unwrap_or(Value::Null));
            }
            if m.get("method").is_some() {
                events.push(m);
            }
        }
    }

    fn call(&mut self, method: &str, params: Value, session: Option<&str>) -> Result<Value, Error> {
        self.call_collecting(method, params, session, &mut Vec::new())
    }

    /// A command to the page's session.
    pub fn page_call(&mut self, method: &str, params: Value) -> Result<Value, Error> {
        let s = self.session.clone();
        self.call(method, params, Some(&s))
    }

    /// Navigates to `url` and returns every event of the page's session until the load
    /// event (or until `timeout`, an error).
    pub fn load(&mut self, url: &str, timeout: Duration) -> Result<Vec<Value>, Error> {
        let s = self.session.clone();
        let mut events = Vec::new();
        self.call_collecting("Network.enable", json!({}), Some(&s), &mut events)?;
        self.call_collecting("Page.enable", json!({}), Some(&s), &mut events)?;
        events.clear();
        let nav =
            self.call_collecting("Page.navigate", json!({"url": url}), Some(&s), &mut events)?;
        if let Some(e) = nav.get("errorText").and_then(Value::as_str) {
            return Err(Error::Invalid(format!(
                "chromium could not load {url}: {e}"
            )));
        }
        let deadline = Instant::now() + timeout;
        while !events.iter().any(|e| method_of(e) == "Page.loadEventFired") {
            let m = self.recv(deadline).map_err(|_| {
                Error::Invalid(format!("{url} did not finish loading within {timeout:?}"))
            })?;
            if m.get("method").is_some() {
                events.push(m);
            }
        }
        Ok(events)
    }

    /// Closes the browser cleanly (it writes its profile, the learned Alt-Svc included),
    /// and kills it if it has not exited within a few seconds.
    pub fn close(mut self) -> Result<(), Error> {
        let _ = self.send("Browser.close", json!({}), None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(Error::Invalid(
            "chromium did not exit after Browser.close".into(),
        ))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long one DevTools command may take to be answered.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

pub fn method_of(m: &Value) -> &str {
    m.get("method").and_then(Value::as_str).unwrap_or("")
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Result<&'a str, Error> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Invalid(format!("chromium's answer has no {pointer}: {v}")))
}

/// Creates `home/.pki/nssdb` (where chromium on Linux looks for the user's NSS database)
/// trusting `ca` to identify web servers.
pub fn trust_ca(home: &Path, ca: &Path) -> Result<(), Error> {
    let db = home.join(".pki/nssdb");
    std::fs::create_dir_all(&db)?;
    let d = format!("sql:{}", db.display());
    let ca = ca
        .to_str()
        .ok_or_else(|| Error::Invalid(format!("{} is not UTF-8", ca.display())))?;
    crate::cmd::run("certutil", &["-N", "-d", &d, "--empty-password"])?;
    crate::cmd::run(
        "certutil",
        &[
            "-A",
            "-d",
            &d,
            "-n",
            "pepd testbed CA",
            "-t",
            "C,,",
            "-i",
            ca,
        ],
    )?;
    Ok(())
}
