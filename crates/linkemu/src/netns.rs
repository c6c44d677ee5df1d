//! Entering named network namespaces (the `ip netns` convention: a bind mount under
//! /run/netns). Only the calling thread moves, so one process can serve several namespaces by
//! doing namespace-specific work on threads that entered them. Also the root check every
//! namespace-building test of the workspace starts with.

use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::thread;

use nix::sched::{setns, CloneFlags};

use crate::Error;

/// Set (to anything but empty or `0`) where every test that needs root must run, as in CI.
pub const REQUIRE_ROOT_TESTS: &str = "PEPD_REQUIRE_ROOT_TESTS";

/// The guard of every test that builds namespaces: true when the process is root. Otherwise
/// the test should return at once; a developer without root sees it skipped, while under
/// [`REQUIRE_ROOT_TESTS`] a skip would hide a test that never ran, so this panics instead.
pub fn require_root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    let test = thread::current().name().unwrap_or("test").to_owned();
    let why = "network namespaces, veth, TUN and nftables";
    let required = std::env::var(REQUIRE_ROOT_TESTS).is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "{test} needs root ({why}) and {REQUIRE_ROOT_TESTS} is set"
    );
    // Straight to stderr, in one write: the test harness hides what `eprintln!` prints in
    // passing tests, and its own progress lines interleave with ours.
    let line = format!(
        "skipped {test}: needs root ({why}); {REQUIRE_ROOT_TESTS}=1 makes this a failure\n"
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
    false
}

/// Where `ip netns` keeps the namespace called `name`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Moves the calling thread into the named network namespace.
pub fn enter(name: &str) -> Result<(), Error> {
    let err = |source| Error::Netns {
        name: name.to_owned(),
        source,
    };
    let f = File::open(path(name)).map_err(err)?;
    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| err(e.into()))
}

/// Runs `f` on a fresh thread inside namespace `name` (or the current one when `None`) and
/// returns its result. Threads `f` spawns stay in that namespace too.
pub fn run_in<T, F>(name: Option<&str>, f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    let name = name.map(str::to_owned);
    let handle = thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            if let Some(n) = &name {
                enter(n)?;
            }
            f()
        })
        .map_err(Error::Thread)?;
    handle
        .join()
        .map_err(|_| Error::Thread(std::io::Error::other("namespace thread panicked")))?
}
