//! The tunnel's key files: X25519 private keys and pre-shared keys, stored as one line of
//! standard padded base64 (the format WireGuard uses, so operators recognise it and can
//! move keys with the usual tools), and the file-permission rules pepd holds them to.
//!
//! The key arithmetic itself (clamping, public-key derivation) lives in
//! `pep_transport::security`, so the key tools and the handshake cannot disagree.

use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

pub use pep_transport::security::KEY_LEN;

/// A key in its text form: 44 characters of base64 with one `=` of padding.
pub const ENCODED_LEN: usize = 44;

/// What the example configs carry in `security.peer_public_key`: valid base64 of 32 bytes,
/// so the examples parse, but refused when keys are loaded, so a copied example cannot
/// start a tunnel that never authenticates.
pub const PLACEHOLDER_PUBLIC_KEY: &str = "REPLACE+with+output+of+pepd+pubkey+on+peer0=";

/// How every placeholder starts: config/hub-spoke.toml needs one per `[[peer]]` entry, since
/// two entries with the same key are an error.
const PLACEHOLDER_PREFIX: &str = "REPLACE+with+";

/// Whether `text` is an example config's placeholder rather than a key someone made.
pub fn is_placeholder(text: &str) -> bool {
    text.trim().starts_with(PLACEHOLDER_PREFIX)
}

/// A key file is never more than a line; reading stops well past that, so a path to a
/// huge file or a device does not fill memory.
const MAX_FILE_LEN: u64 = 4096;

/// Why a key string is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("is empty")]
    Empty,
    #[error("is not base64 ({0})")]
    NotBase64(String),
    #[error("decodes to {0} bytes, not {KEY_LEN}")]
    WrongLength(usize),
}

/// A problem with a key file or with making a key. Each names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{} does not exist", .path.display())]
    Missing { path: PathBuf },
    #[error("cannot read {}: {source}{}", .path.display(), read_hint(.source))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is readable by other users (mode {mode:04o}); run `chmod 600 {}`", .path.display(), .path.display())]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("{} is not a key file: its content {reason}; a key file holds one line of base64 \
             encoding {KEY_LEN} bytes", .path.display())]
    BadContent { path: PathBuf, reason: DecodeError },
    #[error("{} already exists; refusing to overwrite a key (remove the file first to \
             replace it)", .path.display())]
    Exists { path: PathBuf },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the operating system's random number generator failed: {0}")]
    Random(getrandom::Error),
}

fn read_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        // The usual cause: made by root, read by the service user.
        std::io::ErrorKind::PermissionDenied => {
            " (the pepd service runs as user pepd: `chown pepd:pepd` the file)"
        }
        _ => "",
    }
}

/// Standard padded base64, as `pepd pubkey` prints and the config takes.
pub fn encode_key(key: &[u8; KEY_LEN]) -> String {
    STANDARD.encode(key)
}

/// Parses base64 of exactly 32 bytes; white space around it is ignored.
pub fn decode_key(text: &str) -> Result<[u8; KEY_LEN], DecodeError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DecodeError::Empty);
    }
    let bytes = STANDARD
        .decode(text)
        .map_err(|e| DecodeError::NotBase64(e.to_string()))?;
    <[u8; KEY_LEN]>::try_from(bytes.as_slice()).map_err(|_| DecodeError::WrongLength(bytes.len()))
}

/// 32 bytes from the operating system's random number generator (getrandom(2)), which
/// blocks only until the kernel's pool is seeded at boot.
pub fn random_bytes() -> Result<[u8; KEY_LEN], KeyError> {
    let mut out = [0u8; KEY_LEN];
    getrandom::fill(&mut out).map_err(KeyError::Random)?;
    Ok(out)
}

/// A new X25519 private key from the OS random number generator.
pub fn generate_private_key() -> Result<[u8; KEY_LEN], KeyError> {
    Ok(pep_transport::security::private_key_from_random(
        random_bytes()?,
    ))
}

/// Writes a new private key to `path` (mode 0600, never over an existing file) and
/// returns it; its public key is `pep_transport::security::public_key(&key)`.
pub fn write_private_key(path: &Path) -> Result<[u8; KEY_LEN], KeyError> {
    let key = generate_private_key()?;
    write_key_file(path, &key)?;
    Ok(key)
}

/// Writes a new random pre-shared key to `path` (mode 0600, never over an existing file).
pub fn write_psk(path: &Path) -> Result<(), KeyError> {
    let key = random_bytes()?;
    write_key_file(path, &key)
}

/// Creates `path` with mode 0600 and writes `key` as base64 and a newline. Refuses an
/// existing file: overwriting a private key by mistake cuts the tunnel until both
/// gateways are reconfigured.
pub fn write_key_file(path: &Path, key: &[u8; KEY_LEN]) -> Result<(), KeyError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // Created private, so the key is never readable by others, not even briefly.
        .mode(0o600)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists {
                path: path.to_owned(),
            },
            _ => KeyError::Write {
                path: path.to_owned(),
                source,
            },
        })?;
    let written = (|| {
        // The umask may have taken bits away; make the mode exactly 0600 regardless.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(format!("{}\n", encode_key(key)).as_bytes())?;
        file.sync_all()
    })();
    written.map_err(|source| {
        // A half-written key file would be refused by the next `genkey` and by pepd;
        // leaving nothing behind lets the operator simply retry.
        let _ = std::fs::remove_file(path);
        KeyError::Write {
            path: path.to_owned(),
            source,
        }
    })
}

/// Reads a key from `path` without looking at its permissions (for `pepd pubkey`, which
/// only derives public information).
pub fn read_key_file(path: &Path) -> Result<[u8; KEY_LEN], KeyError> {
    let file = open(path)?;
    read_key_from(file, path)
}

/// Parses a key read from `reader` (a file or stdin); `path` names it in errors.
pub fn read_key_from(reader: impl Read, path: &Path) -> Result<[u8; KEY_LEN], KeyError> {
    let mut text = String::new();
    reader
        .take(MAX_FILE_LEN)
        .read_to_string(&mut text)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::InvalidData => KeyError::BadContent {
                path: path.to_owned(),
                reason: DecodeError::NotBase64("not text".into()),
            },
            _ => KeyError::Read {
                path: path.to_owned(),
                source,
            },
        })?;
    decode_key(&text).map_err(|reason| KeyError::BadContent {
        path: path.to_owned(),
        reason,
    })
}

/// How private a secret key file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Only the owner can read it.
    Owner,
    /// Its group can read it too: acceptable when the group is the service's, but worth
    /// a warning.
    Group,
}

/// A secret read from a file that passed the permission check.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey {
    pub key: [u8; KEY_LEN],
    pub exposure: Exposure,
    pub mode: u32,
}

impl fmt::Debug for SecretKey {
    // Never print the key itself, e.g. in a log line with `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKey")
            .field("exposure", &self.exposure)
            .field("mode", &format_args!("{:04o}", self.mode))
            .finish_non_exhaustive()
    }
}

/// The permission rule for secret key files: refused if anyone beyond owner and group may
/// read or write it, flagged if the group may.
pub fn check_secret_mode(path: &Path, mode: u32) -> Result<Exposure, KeyError> {
    let mode = mode & 0o7777;
    if mode & 0o007 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(if mode & 0o070 != 0 {
        Exposure::Group
    } else {
        Exposure::Owner
    })
}

/// Reads a private key or pre-shared key from `path`, refusing a file other users can
/// read (see [`check_secret_mode`]). The mode is taken from the opened file, so the file
/// checked is the file read.
pub fn read_secret_key_file(path: &Path) -> Result<SecretKey, KeyError> {
    let file = open(path)?;
    let meta = file.metadata().map_err(|source| KeyError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(KeyError::Read {
            path: path.to_owned(),
            source: std::io::Error::other("not a regular file"),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    let exposure = check_secret_mode(path, mode)?;
    let key = read_key_from(file, path)?;
    Ok(SecretKey {
        key,
        exposure,
        mode,
    })
}

fn open(path: &Path) -> Result<File, KeyError> {
    File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => KeyError::Missing {
            path: path.to_owned(),
        },
        _ => KeyError::Read {
            path: path.to_owned(),
            source,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    fn temp_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("pepd-keys-")
            .tempdir()
            .expect("temp dir")
    }

    #[test]
    fn base64_round_trip() {
        for key in [[0u8; 32], [0xff; 32], std::array::from_fn(|i| i as u8)] {
            let text = encode_key(&key);
            assert_eq!(text.len(), ENCODED_LEN);
            assert!(text.ends_with('='));
            assert_eq!(decode_key(&text), Ok(key));
            assert_eq!(decode_key(&format!("  {text}\n")), Ok(key));
        }
        // RFC 7748's Alice public key, as `wg pubkey` prints it.
        let text = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
        let key = decode_key(text).expect("key");
        assert_eq!(key[0], 0x85);
        assert_eq!(encode_key(&key), text);
    }

    #[test]
    fn wrong_length_and_bad_base64() {
        assert_eq!(decode_key(""), Err(DecodeError::Empty));
        assert_eq!(decode_key(" \n"), Err(DecodeError::Empty));
        assert_eq!(
            decode_key(&STANDARD.encode([1u8; 31])),
            Err(DecodeError::WrongLength(31))
        );
        assert_eq!(
            decode_key(&STANDARD.encode([1u8; 33])),
            Err(DecodeError::WrongLength(33))
        );
        for bad in [
            "not base64 at all!",
            // URL-safe alphabet: not what pepd prints, refused rather than guessed.
            "hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo=",
            // Padding missing.
            "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo",
        ] {
            assert!(
                matches!(decode_key(bad), Err(DecodeError::NotBase64(_))),
                "{bad}: {:?}",
                decode_key(bad)
            );
        }
        let e = decode_key("abc").unwrap_err().to_string();
        assert!(e.starts_with("is not base64"), "{e}");
    }

    #[test]
    fn placeholder_is_a_valid_key_that_says_what_to_do() {
        let key = decode_key(PLACEHOLDER_PUBLIC_KEY).expect("placeholder decodes");
        assert_eq!(encode_key(&key), PLACEHOLDER_PUBLIC_KEY);
        assert!(is_placeholder(PLACEHOLDER_PUBLIC_KEY));
        // config/hub-spoke.toml's, one per terminal.
        for text in include_str!("../../config/hub-spoke.toml")
            .lines()
            .filter_map(|l| l.strip_prefix("public_key = \""))
        {
            let text = text.trim_end_matches('"');
            assert!(is_placeholder(text), "{text}");
            let key = decode_key(text).expect("placeholder decodes");
            assert_eq!(encode_key(&key), text);
        }
        assert!(!is_placeholder(&encode_key(&[7; KEY_LEN])));
    }

    #[test]
    fn generated_keys_differ_and_are_clamped() {
        let a = generate_private_key().expect("key");
        let b = generate_private_key().expect("key");
        assert_ne!(a, b);
        assert_eq!(pep_transport::security::private_key_from_random(a), a);
    }

    #[test]
    fn write_creates_0600_and_reads_back() {
        let dir = temp_dir();
        let path = dir.path().join("private.key");
        let key = write_private_key(&path).expect("write");
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, format!("{}\n", encode_key(&key)));
        assert_eq!(read_key_file(&path).expect("read key"), key);
        let secret = read_secret_key_file(&path).expect("secret");
        assert_eq!((secret.key, secret.exposure), (key, Exposure::Owner));
        assert!(!format!("{secret:?}").contains(&encode_key(&key)));

        let psk = dir.path().join("psk");
        write_psk(&psk).expect("psk");
        assert_eq!(
            std::fs::metadata(&psk).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        assert_ne!(read_key_file(&psk).expect("psk"), key);
    }

    #[test]
    fn write_refuses_to_overwrite() {
        let dir = temp_dir();
        let path = dir.path().join("private.key");
        let first = write_private_key(&path).expect("write");
        let e = write_private_key(&path).unwrap_err();
        assert!(matches!(e, KeyError::Exists { .. }), "{e}");
        assert!(e.to_string().contains("already exists"), "{e}");
        assert_eq!(read_key_file(&path).expect("unchanged"), first);
        let e = write_psk(&dir.path().join("no/such/dir")).unwrap_err();
        assert!(matches!(e, KeyError::Write { .. }), "{e}");
    }

    #[test]
    fn permissions_are_checked() {
        let dir = temp_dir();
        let path = dir.path().join("private.key");
        write_private_key(&path).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read_secret_key_file(&path).unwrap_err();
        assert!(matches!(e, KeyError::TooOpen { mode: 0o644, .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("mode 0644"), "{text}");
        assert!(
            text.contains(&format!("chmod 600 {}", path.display())),
            "{text}"
        );
        // Public information still comes out of it.
        read_key_file(&path).expect("pubkey ignores permissions");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert_eq!(
            read_secret_key_file(&path).expect("group").exposure,
            Exposure::Group
        );
        for (mode, want) in [
            (0o600, Ok(Exposure::Owner)),
            (0o400, Ok(Exposure::Owner)),
            (0o660, Ok(Exposure::Group)),
            (0o604, Err(())),
            (0o602, Err(())),
            (0o601, Err(())),
            (0o100_644, Err(())),
        ] {
            assert_eq!(
                check_secret_mode(&path, mode).map_err(|_| ()),
                want,
                "{mode:o}"
            );
        }
    }

    #[test]
    fn unreadable_missing_and_garbage_files() {
        let dir = temp_dir();
        let missing = dir.path().join("missing.key");
        let e = read_secret_key_file(&missing).unwrap_err();
        assert!(matches!(e, KeyError::Missing { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("{} does not exist", missing.display())
        );

        let garbage = dir.path().join("garbage.key");
        std::fs::write(&garbage, "this is not a key\n").expect("write");
        std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = read_secret_key_file(&garbage).unwrap_err();
        assert!(matches!(e, KeyError::BadContent { .. }), "{e}");
        assert!(e.to_string().contains("is not a key file"), "{e}");

        let short = dir.path().join("short.key");
        std::fs::write(&short, STANDARD.encode([7u8; 16])).expect("write");
        let e = read_key_file(&short).unwrap_err().to_string();
        assert!(e.contains("decodes to 16 bytes, not 32"), "{e}");

        let binary = dir.path().join("binary.key");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).expect("write");
        assert!(matches!(
            read_key_file(&binary),
            Err(KeyError::BadContent { .. })
        ));

        let e = read_secret_key_file(dir.path()).unwrap_err();
        assert!(matches!(e, KeyError::Read { .. }), "{e}");
    }
}
