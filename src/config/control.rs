//! `[control]`: the local socket through which `pepd status` and `pepd flows` ask the
//! running daemon, one per instance.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::PepdConfig;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Path of the unix stream socket; unset: the config file's name (without `.toml`)
    /// with `.sock`, in the runtime directory ([`runtime_dir`]).
    pub socket: Option<PathBuf>,
}

/// The config `pepd run` is given in the packaged unit, and whose daemon `pepd status`
/// asks when told of no other.
pub const DEFAULT_CONFIG: &str = "/etc/pepd/pepd.toml";

/// The runtime directory when systemd names none: what the unit's `RuntimeDirectory=pepd`
/// makes.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/pepd";

/// The longest path a unix socket address holds (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The name the socket of a config that came from no file takes.
const NAME_WITHOUT_FILE: &str = "pepd";

/// Where instances keep their sockets: the first directory systemd gives the unit in
/// `$RUNTIME_DIRECTORY` (`RuntimeDirectory=`), else [`DEFAULT_RUNTIME_DIR`].
pub fn runtime_dir() -> PathBuf {
    std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|dirs| {
            std::env::split_paths(&dirs)
                .next()
                .filter(|d| d.is_absolute())
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME_DIR))
}

/// The socket of the instance whose config is `config_path` when `[control] socket` is
/// unset: `/etc/pepd/hub.toml` → `/run/pepd/hub.sock`, so instances with configs of their
/// own have sockets of their own.
pub fn default_socket(config_path: &Path) -> PathBuf {
    let name = config_path
        .file_stem()
        .filter(|s| !s.is_empty())
        .map_or_else(|| NAME_WITHOUT_FILE.into(), |s| s.to_os_string());
    let mut file = name;
    file.push(".sock");
    runtime_dir().join(file)
}

impl PepdConfig {
    /// This instance's control socket: `[control] socket`, or the default for the file
    /// the config was loaded from.
    pub fn control_socket(&self) -> PathBuf {
        match &self.control.socket {
            Some(p) => p.clone(),
            None => default_socket(Path::new(self.source_map.origin())),
        }
    }
}
