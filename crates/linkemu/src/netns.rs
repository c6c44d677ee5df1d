//! Entering named network namespaces (the `ip netns` convention: a bind mount under
//! /run/netns). Only the calling thread moves, so one process can serve several namespaces by
//! doing namespace-specific work on threads that entered them.

use std::fs::File;
use std::path::PathBuf;
use std::thread;

use nix::sched::{setns, CloneFlags};

use crate::Error;

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
