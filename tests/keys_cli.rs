//! The key tools (`pepd genkey`, `pubkey`, `genpsk`) and `pepd check-config` loading the key
//! files, run as an operator would: the built binary, real files, exit codes and output.
//! Needs no root and no network namespaces.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

const PEPD: &str = env!("CARGO_BIN_EXE_pepd");
const TERMINAL: &str = include_str!("../config/terminal.toml");
const HUB: &str = include_str!("../config/hub.toml");
const HUB_SPOKE: &str = include_str!("../config/hub-spoke.toml");
const PLACEHOLDER: &str = "REPLACE+with+output+of+pepd+pubkey+on+peer0=";

/// A fresh directory, removed on drop.
fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("pepd-keys-cli-")
        .tempdir()
        .expect("temp dir")
}

fn pepd(args: &[&str]) -> Output {
    Command::new(PEPD)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pepd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

/// `pepd genkey PATH`, asserting success; returns the public key it printed.
fn genkey(path: &Path) -> String {
    let o = pepd(&["genkey", path.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "genkey failed: {}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(
        out.lines().count(),
        1,
        "only the public key on stdout: {out:?}"
    );
    out.trim().to_owned()
}

/// The example config with its key paths and peer key replaced.
fn example_with(example: &str, private_key: &Path, peer: &str) -> String {
    let text = example
        .replace(
            "private_key_file = \"/etc/pepd/private.key\"",
            &format!("private_key_file = {:?}", private_key.display().to_string()),
        )
        .replace(PLACEHOLDER, peer);
    assert_ne!(text, example, "the example's [security] section changed");
    text
}

fn check_config(dir: &TempDir, name: &str, text: &str) -> Output {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write config");
    pepd(&["check-config", "-c", path.to_str().expect("utf-8 path")])
}

#[test]
fn genkey_writes_a_0600_key_and_pubkey_derives_the_same_public_key() {
    let dir = temp_dir();
    let key = dir.path().join("private.key");
    let public = genkey(&key);
    assert_eq!(public.len(), 44, "{public}");
    assert_eq!(mode(&key), 0o600);
    let text = std::fs::read_to_string(&key).expect("read key");
    assert!(text.ends_with('\n') && text.trim().len() == 44, "{text:?}");
    assert_ne!(text.trim(), public, "the file holds the private key");

    let o = pepd(&["pubkey", key.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), public);

    // From standard input, with and without "-".
    for args in [&["pubkey"][..], &["pubkey", "-"][..]] {
        let mut child = Command::new(PEPD)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
        let o = child.wait_with_output().expect("wait");
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert_eq!(stdout(&o).trim(), public, "{args:?}");
    }

    // Another key is another key.
    assert_ne!(genkey(&dir.path().join("other.key")), public);
}

#[test]
fn genkey_and_genpsk_refuse_to_overwrite() {
    let dir = temp_dir();
    let key = dir.path().join("private.key");
    genkey(&key);
    let before = std::fs::read(&key).expect("read");
    for tool in ["genkey", "genpsk"] {
        let o = pepd(&[tool, key.to_str().expect("utf-8")]);
        assert!(!o.status.success(), "{tool} overwrote {}", key.display());
        assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
        assert!(stdout(&o).is_empty());
    }
    assert_eq!(std::fs::read(&key).expect("read"), before);
}

#[test]
fn genpsk_writes_a_0600_key() {
    let dir = temp_dir();
    let psk = dir.path().join("psk.key");
    let o = pepd(&["genpsk", psk.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "the psk is not printed");
    assert_eq!(mode(&psk), 0o600);
    let text = std::fs::read_to_string(&psk).expect("read");
    assert_eq!(text.trim().len(), 44, "{text:?}");
}

#[test]
fn pubkey_rejects_what_is_not_a_key() {
    let dir = temp_dir();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "hello\n").expect("write");
    let o = pepd(&["pubkey", garbage.to_str().expect("utf-8")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not a key file"), "{}", stderr(&o));
    let o = pepd(&[
        "pubkey",
        dir.path().join("missing").to_str().expect("utf-8"),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
}

#[test]
fn check_config_accepts_the_examples_with_real_keys() {
    let dir = temp_dir();
    let terminal_key = dir.path().join("terminal.key");
    let hub_key = dir.path().join("hub.key");
    let terminal_public = genkey(&terminal_key);
    let hub_public = genkey(&hub_key);
    for (name, example, key, own, peer) in [
        (
            "terminal.toml",
            TERMINAL,
            &terminal_key,
            &terminal_public,
            &hub_public,
        ),
        ("hub.toml", HUB, &hub_key, &hub_public, &terminal_public),
    ] {
        let o = check_config(&dir, name, &example_with(example, key, peer));
        assert!(o.status.success(), "{name}: {}{}", stdout(&o), stderr(&o));
        let out = stdout(&o);
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("public key: {own} "))),
            "{name}: {out}"
        );
        assert!(
            !out.contains("warning:"),
            "{name}: examples are quiet: {out}"
        );
    }
}

#[test]
fn check_config_accepts_the_hub_spoke_example() {
    let dir = temp_dir();
    let hub_key = dir.path().join("hub.key");
    let hub_public = genkey(&hub_key);
    let mut text = example_with(HUB_SPOKE, &hub_key, "unused");
    let mut terminals = Vec::new();
    for (name, placeholder) in [
        ("rig-3", "REPLACE+with+output+of+pepd+pubkey+on+rig00="),
        ("ship-7", "REPLACE+with+output+of+pepd+pubkey+on+ship0="),
        ("cell-12", "REPLACE+with+output+of+pepd+pubkey+on+cell0="),
    ] {
        let public = genkey(&dir.path().join(format!("{name}.key")));
        assert!(text.contains(placeholder), "{name}: the example changed");
        text = text.replace(placeholder, &public);
        terminals.push(public);
    }
    let o = check_config(&dir, "hub-spoke.toml", &text);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("{}: ok", dir.path().join("hub-spoke.toml").display())
    );
    for want in [
        "side:       hub (responder)",
        "peers:      3 `[[peer]]` entries over UDP, tunnel bound to 198.18.0.1:7400",
        "  ship-7: address learned from its packets; subnets 10.7.0.0/24; tx 10 Mbit/s \
         (weight 1), rx 2 Mbit/s; keepalive 25s; max 10000 flows",
        &format!("public key: {hub_public} (this gateway's, for the peer's config)"),
    ] {
        assert!(lines.contains(&want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("warning:"), "the example is quiet: {out}");
    // `pepd run` takes the config and goes as far as the tunnel socket, whose address (the
    // example's, from 198.18.0.0/15) is not this host's.
    let path = dir.path().join("hub-spoke.toml");
    let o = pepd(&["run", "-c", path.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).lines().last(),
        Some(
            "pepd: tunnel socket on 198.18.0.1:7400: Cannot assign requested address (os \
             error 99)"
        )
    );
    // A terminal's key twice is an error naming both entries.
    let twice = text.replace(&terminals[2], &terminals[0]);
    let o = check_config(&dir, "twice.toml", &twice);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let line_of = |needle: &str| {
        twice
            .lines()
            .position(|l| l.contains(needle))
            .expect("line")
            + 1
    };
    let first = line_of(&terminals[0]);
    let second = twice
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(&terminals[0]))
        .nth(1)
        .expect("second")
        .0
        + 1;
    assert_eq!(
        stderr(&o),
        format!(
            "pepd: {} line {second}: `peer[2].public_key` is also `peer[0].public_key` (line \
             {first}): each peer has its own key pair\n",
            dir.path().join("twice.toml").display()
        )
    );
}

#[test]
fn check_config_refuses_the_placeholder() {
    let dir = temp_dir();
    let key = dir.path().join("private.key");
    genkey(&key);
    let text = example_with(TERMINAL, &key, PLACEHOLDER);
    let o = check_config(&dir, "terminal.toml", &text);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("`security.peer_public_key` is still the example's placeholder"),
        "{err}"
    );
}

#[test]
fn check_config_names_a_bad_private_key_file() {
    let dir = temp_dir();
    let peer = genkey(&dir.path().join("peer.key"));
    let open = dir.path().join("open.key");
    genkey(&open);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let garbage = dir.path().join("garbage.key");
    std::fs::write(&garbage, "not a key at all\n").expect("write");
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let missing = dir.path().join("missing.key");
    for (what, key, says) in [
        ("0644", &open, "is readable by other users (mode 0644)"),
        ("missing", &missing, "does not exist"),
        ("garbage", &garbage, "is not a key file"),
    ] {
        let text = example_with(TERMINAL, key, &peer);
        let line = text
            .lines()
            .position(|l| l.starts_with("private_key_file ="))
            .expect("key line")
            + 1;
        let o = check_config(&dir, "terminal.toml", &text);
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!(
                "line {line}: `security.private_key_file`: {}",
                key.display()
            )),
            "{what}: {err}"
        );
        assert!(err.contains(says), "{what}: {err}");
        if what == "0644" {
            assert!(err.contains("chmod 600"), "{err}");
        }
    }
}

#[test]
fn check_config_warns_for_mode_none_and_nft_rules_needs_no_keys() {
    let dir = temp_dir();
    let plain = "[peer]\naddress = \"198.18.0.1:7400\"\nside = \"terminal\"\n\
                 [link]\ntx_rate = \"2M\"\nrx_rate = \"10M\"\n";
    let o = check_config(
        &dir,
        "none.toml",
        &format!("{plain}[security]\nmode = \"none\"\n"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let warning = out
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or_else(|| panic!("no warning in {out}"));
    assert!(
        warning.contains("line 8: `security.mode` = \"none\"")
            && warning.contains("unauthenticated")
            && warning.contains("`peer.address`"),
        "{warning}"
    );
    assert!(!out.contains("public key:"), "{out}");

    // Without [security], check-config insists on keys; nft-rules does not need them.
    let o = check_config(&dir, "plain.toml", plain);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("`security.private_key_file` is required"),
        "{}",
        stderr(&o)
    );
    let o = pepd(&[
        "nft-rules",
        "-c",
        dir.path().join("plain.toml").to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}
