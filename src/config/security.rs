//! `[security]` turned into the transport's settings: the key files are read here, not
//! when the config is parsed, so `pepd nft-rules` and the config tests need no keys, while
//! `pepd run` and `pepd check-config` refuse a missing, unreadable, malformed or exposed key.

use std::path::Path;
use std::time::Duration;

use pep_transport::security::{hardware_aes, public_key, AeadOffer, SecurityConfig, KEY_LEN};

use super::error::{sort_by_position, Position};
use super::{ConfigError, Diagnostic, PeerSpec, Peers, PepdConfig, SecurityMode};
use crate::config::keys::{self, Exposure, KeyError};

/// What [`PepdConfig::load_security`] found.
#[derive(Debug)]
pub struct LoadedSecurity {
    /// This gateway's keys; `None` with `mode = "none"`.
    pub local: Option<LocalKeys>,
    /// Legal but worth fixing (a group-readable key file), in the form of
    /// [`PepdConfig::warnings`].
    pub warnings: Vec<String>,
}

/// This gateway's half of every association's security: what does not depend on the peer.
#[derive(Clone, PartialEq, Eq)]
pub struct LocalKeys {
    pub private_key: [u8; KEY_LEN],
    pub psk: Option<[u8; KEY_LEN]>,
    pub rekey_interval: Duration,
    pub rekey_after_packets: u64,
    /// What this gateway offers for packet protection, with this CPU's AES instructions
    /// taken into account.
    pub aeads: AeadOffer,
}

impl std::fmt::Debug for LocalKeys {
    // Secrets stay out of logs and test output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKeys")
            .field("public_key", &public_key(&self.private_key))
            .field("psk", &self.psk.map(|_| "<set>"))
            .field("rekey_interval", &self.rekey_interval)
            .field("rekey_after_packets", &self.rekey_after_packets)
            .field("aeads", &self.aeads)
            .finish()
    }
}

impl LoadedSecurity {
    /// This gateway's public key, base64, for `check-config` to show: it is what the
    /// other gateway's `security.peer_public_key` (or a hub's `[[peer]]` entry for this
    /// terminal) must say.
    pub fn local_public_key(&self) -> Option<String> {
        self.local
            .as_ref()
            .map(|l| keys::encode_key(&public_key(&l.private_key)))
    }

    /// The transport's settings for the association with `peer`; `None` with
    /// `mode = "none"`.
    pub fn towards(&self, peer: &PeerSpec) -> Option<SecurityConfig> {
        let local = self.local.as_ref()?;
        Some(SecurityConfig {
            local_private_key: local.private_key,
            peer_public_key: peer.public_key?,
            psk: local.psk,
            rekey_interval: local.rekey_interval,
            rekey_after_packets: local.rekey_after_packets,
            aeads: local.aeads,
        })
    }
}

impl PepdConfig {
    /// The tunnel's security settings with the key files read, towards the first peer (the
    /// only one of a `[peer]` table); `None` with `mode = "none"`. Errors name the key, its
    /// line and the file.
    pub fn security(&self) -> Result<Option<SecurityConfig>, ConfigError> {
        let loaded = self.load_security()?;
        Ok(self
            .peer_specs()
            .first()
            .and_then(|peer| loaded.towards(peer)))
    }

    /// This gateway's keys with the warnings found while reading the key files, after
    /// checking every peer's key against them. Reports every problem at once, like
    /// `validate`.
    pub fn load_security(&self) -> Result<LoadedSecurity, ConfigError> {
        let s = &self.security;
        if s.mode == SecurityMode::None {
            return Ok(LoadedSecurity {
                local: None,
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
        match &self.peer {
            Peers::Pair(_) => match &s.peer_public_key {
                Some(text) => r.peer_key(
                    "security.peer_public_key",
                    text,
                    private.as_ref(),
                    Whose::OtherGateway,
                ),
                None => r.missing(
                    "security.peer_public_key",
                    "set it to the other gateway's public key (`pepd pubkey \
                     /etc/pepd/private.key` there)",
                ),
            },
            // Validation insists on a key in every entry.
            Peers::List(entries) => {
                for (i, entry) in entries.iter().enumerate() {
                    if let Some(text) = &entry.public_key {
                        let key = format!("peer[{i}].public_key");
                        r.peer_key(&key, text, private.as_ref(), Whose::Entry);
                    }
                }
            }
        }
        let psk = s
            .psk_file
            .as_ref()
            .map(|path| r.secret("security.psk_file", path, "genpsk"));
        let mut problems = r.problems;
        let mut warnings = r.warnings;
        let (Some(private), true) = (private, problems.is_empty()) else {
            sort_by_position(&mut problems);
            return Err(ConfigError::Invalid(problems));
        };
        // With no problems, a psk file that is set was read.
        let psk = psk.flatten();
        sort_by_position(&mut warnings);
        Ok(LoadedSecurity {
            local: Some(LocalKeys {
                private_key: private,
                psk,
                rekey_interval: s.rekey_interval,
                rekey_after_packets: s.rekey_after_packets,
                // The CPU is read here, in the daemon, and never by the transport's state
                // machine, so simulations replay alike on every machine.
                aeads: s.aead.offer(hardware_aes()),
            }),
            warnings: warnings.iter().map(ToString::to_string).collect(),
        })
    }
}

/// Whose key a peer key is, for the messages about it.
#[derive(Clone, Copy)]
enum Whose {
    /// `security.peer_public_key`, of a pair's other gateway.
    OtherGateway,
    /// A `[[peer]]` entry's `public_key`.
    Entry,
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

    /// A peer's public key at `key`: not the example's placeholder, not our own.
    fn peer_key(&mut self, key: &str, text: &str, private: Option<&[u8; KEY_LEN]>, peer: Whose) {
        let (whose, theirs) = match peer {
            Whose::OtherGateway => ("the other gateway", "the other gateway's"),
            Whose::Entry => ("that peer", "that peer's"),
        };
        if keys::is_placeholder(text) {
            self.fail(
                key,
                format!(
                    "`{key}` is still the example's placeholder: replace it with the output of \
                     `pepd pubkey /etc/pepd/private.key` on {whose}"
                ),
            );
            return;
        }
        let peer = match keys::decode_key(text) {
            Ok(k) => k,
            // `validate` reports this already for a parsed config; here for completeness.
            Err(why) => {
                self.fail(key, format!("`{key}` {why}"));
                return;
            }
        };
        if private.is_some_and(|p| public_key(p) == peer) {
            self.fail(
                key,
                format!(
                    "`{key}` is this gateway's own public key; it must be {theirs} (`pepd \
                     pubkey` there)"
                ),
            );
        }
    }
}
