//! `[security]` turned into the transport's settings: the key files are read here, not
//! when the config is parsed, so `pepd nft-rules` and the config tests need no keys, while
//! `pepd run` and `pepd check-config` refuse a missing, unreadable, malformed or exposed key.

use std::path::Path;

use pep_transport::security::{public_key, SecurityConfig, KEY_LEN};

use super::error::{sort_by_position, Position};
use super::{ConfigError, Diagnostic, PepdConfig, SecurityMode};
use crate::keys::{self, Exposure, KeyError};

/// What [`PepdConfig::load_security`] found.
#[derive(Debug)]
pub struct LoadedSecurity {
    /// The transport's settings; `None` with `mode = "none"`.
    pub config: Option<SecurityConfig>,
    /// Legal but worth fixing (a group-readable key file), in the form of
    /// [`PepdConfig::warnings`].
    pub warnings: Vec<String>,
}

impl LoadedSecurity {
    /// This gateway's public key, base64, for `check-config` to show: it is what the
    /// other gateway's `security.peer_public_key` must say.
    pub fn local_public_key(&self) -> Option<String> {
        self.config
            .as_ref()
            .map(|c| keys::encode_key(&public_key(&c.local_private_key)))
    }
}

impl PepdConfig {
    /// The tunnel's security settings with the key files read; `None` with
    /// `mode = "none"`. Errors name the key, its line and the file.
    pub fn security(&self) -> Result<Option<SecurityConfig>, ConfigError> {
        self.load_security().map(|l| l.config)
    }

    /// As [`PepdConfig::security`], with the warnings found while reading the key files.
    /// Reports every problem at once, like `validate`.
    pub fn load_security(&self) -> Result<LoadedSecurity, ConfigError> {
        let s = &self.security;
        if s.mode == SecurityMode::None {
            return Ok(LoadedSecurity {
                config: None,
                warnings: Vec::new(),
            });
        }
        let mut r = Reader {
            config: self,
            problems: Vec::new(),
            warnings: Vec::new(),
        };
        let private = match &s.private_key_file {
            Some(path) => r.secret("security.private_key_file", path, "genkey"),
            None => {
                r.missing(
                    "security.private_key_file",
                    "name the file holding this gateway's private key (create one with \
                     `pepd genkey /etc/pepd/private.key`)",
                );
                None
            }
        };
        let peer = match &s.peer_public_key {
            Some(text) => r.peer_key(text, private.as_ref()),
            None => {
                r.missing(
                    "security.peer_public_key",
                    "set it to the other gateway's public key (`pepd pubkey \
                     /etc/pepd/private.key` there)",
                );
                None
            }
        };
        let psk = s
            .psk_file
            .as_ref()
            .map(|path| r.secret("security.psk_file", path, "genpsk"));
        let mut problems = r.problems;
        let mut warnings = r.warnings;
        let (Some(private), Some(peer), true) = (private, peer, problems.is_empty()) else {
            sort_by_position(&mut problems);
            return Err(ConfigError::Invalid(problems));
        };
        // With no problems, a psk file that is set was read.
        let psk = psk.flatten();
        sort_by_position(&mut warnings);
        Ok(LoadedSecurity {
            config: Some(SecurityConfig {
                local_private_key: private,
                peer_public_key: peer,
                psk,
                rekey_interval: s.rekey_interval,
                rekey_after_packets: s.rekey_after_packets,
            }),
            warnings: warnings.iter().map(ToString::to_string).collect(),
        })
    }
}

struct Reader<'a> {
    config: &'a PepdConfig,
    problems: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Reader<'_> {
    fn fail(&mut self, key: &str, message: String) {
        let d = self.config.source_map.diagnostic(key, message);
        self.problems.push(d);
    }

    /// A required key left out: point at `[security]` if the file has it, else at the
    /// file, never at "(default)", since there is no default to blame.
    fn missing(&mut self, key: &str, what: &str) {
        let map = &self.config.source_map;
        let position = match map.position("security") {
            at @ Position::At { .. } => at,
            Position::Default | Position::Document => Position::Document,
        };
        self.problems.push(map.diagnostic_at(
            key,
            position,
            format!(
                "`{key}` is required with `security.mode = \"noise\"` (the default): {what}; \
                 only on a link encrypted below pepd, set `security.mode = \"none\"` instead"
            ),
        ));
    }

    /// Reads a private key or psk file; `tool` is the `pepd` subcommand that makes one.
    fn secret(&mut self, key: &str, path: &Path, tool: &str) -> Option<[u8; KEY_LEN]> {
        match keys::read_secret_key_file(path) {
            Ok(secret) => {
                if secret.exposure == Exposure::Group {
                    let d = self.config.source_map.diagnostic(
                        key,
                        format!(
                            "`{key}`: {} is readable by its group (mode {:04o}); unless only \
                             the service user is in that group, make the service user (pepd) \
                             its owner and `chmod 600` it",
                            path.display(),
                            secret.mode
                        ),
                    );
                    self.warnings.push(d);
                }
                Some(secret.key)
            }
            Err(e) => {
                let hint = match e {
                    KeyError::Missing { .. } => {
                        format!("; create it with `pepd {tool} {}`", path.display())
                    }
                    _ => String::new(),
                };
                self.fail(key, format!("`{key}`: {e}{hint}"));
                None
            }
        }
    }

    fn peer_key(&mut self, text: &str, private: Option<&[u8; KEY_LEN]>) -> Option<[u8; KEY_LEN]> {
        const KEY: &str = "security.peer_public_key";
        if text.trim() == keys::PLACEHOLDER_PUBLIC_KEY {
            self.fail(
                KEY,
                format!(
                    "`{KEY}` is still the example's placeholder: replace it with the output of \
                     `pepd pubkey /etc/pepd/private.key` on the other gateway"
                ),
            );
            return None;
        }
        let peer = match keys::decode_key(text) {
            Ok(k) => k,
            // `validate` reports this already for a parsed config; here for completeness.
            Err(why) => {
                self.fail(KEY, format!("`{KEY}` {why}"));
                return None;
            }
        };
        if private.is_some_and(|p| public_key(p) == peer) {
            self.fail(
                KEY,
                format!(
                    "`{KEY}` is this gateway's own public key; it must be the other gateway's \
                     (`pepd pubkey` there)"
                ),
            );
            return None;
        }
        Some(peer)
    }
}
