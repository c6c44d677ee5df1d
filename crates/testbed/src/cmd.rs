//! Running `ip` and friends, with errors that show the command and its stderr.

use std::process::Command;

use crate::Error;

/// Runs `prog args…` and fails unless it exits 0; returns stdout.
pub fn run(prog: &str, args: &[&str]) -> Result<String, Error> {
    let line = || format!("{prog} {}", args.join(" "));
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            cmd: line(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: line(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NS args…`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<String, Error> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// Sets sysctls inside a namespace.
pub fn sysctl_in(ns: &str, settings: &[&str]) -> Result<(), Error> {
    let mut all = vec!["netns", "exec", ns, "sysctl", "-q", "-w"];
    all.extend_from_slice(settings);
    run("ip", &all).map(drop)
}

/// Runs `prog args…` with `input` on its stdin (e.g. an `nft -f -` ruleset); returns stdout.
pub fn run_with_input(prog: &str, args: &[&str], input: &str) -> Result<String, Error> {
    use std::io::Write;
    use std::process::Stdio;
    let line = || format!("{prog} {}", args.join(" "));
    let spawn_err = |source| Error::Spawn {
        cmd: line(),
        source,
    };
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: line(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `nft -f -` inside a namespace, the ruleset on stdin.
pub fn nft_in(ns: &str, ruleset: &str) -> Result<(), Error> {
    run_with_input("ip", &["netns", "exec", ns, "nft", "-f", "-"], ruleset).map(drop)
}

/// Starts `cmd` in the background with stdin closed and its stdout and stderr appended to
/// `log`.
pub fn spawn_logged(mut cmd: Command, log: &std::path::Path) -> Result<std::process::Child, Error> {
    use std::process::Stdio;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    cmd.spawn().map_err(|source| Error::Spawn {
        cmd: format!("{cmd:?}"),
        source,
    })
}

/// The last `lines` lines of a log file.
pub fn file_tail(path: &std::path::Path, lines: usize) -> String {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return format!("(cannot read {}: {e})", path.display()),
    };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
