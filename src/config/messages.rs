//! The one place pepd reads the text of serde's and toml's error messages.
//!
//! Which key and which line an error is about come from structure: serde_path_to_error's
//! path and toml's spans. What kind of error it is does not: serde reports an unknown
//! field, a missing field and a wrong type all through `Error::custom`, so only the words
//! tell them apart, and only the words name a missing field or list the expected keys.
//! That wording is not an API and may change in any release; the tests in
//! `config/tests.rs` assert every message in full, so a change fails a test instead of
//! quietly degrading what operators read.

/// What a deserialization error says, as far as pepd needs to know.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SchemaError<'m> {
    /// A key the schema does not have. `expected` is serde's list of the keys it does
    /// have ("expected one of `a`, `b`"), if there are any.
    UnknownKey { expected: Option<&'m str> },
    /// A required key (or, at the top, section) that is not there.
    MissingKey { name: &'m str },
    /// Anything else (a wrong type, a value out of range or not allowed), reworded in
    /// the terms of the config rather than of Rust.
    Value(String),
}

pub(super) fn schema_error(message: &str) -> SchemaError<'_> {
    if let Some((_, rest)) = backquoted_after(message, "unknown field `") {
        let expected = rest.trim_start_matches(", ");
        let expected =
            (!expected.is_empty() && !expected.starts_with("there are no")).then_some(expected);
        return SchemaError::UnknownKey { expected };
    }
    if let Some((name, _)) = backquoted_after(message, "missing field `") {
        return SchemaError::MissingKey { name };
    }
    SchemaError::Value(plain_types(
        &message.replace("unknown variant", "unknown value"),
    ))
}

/// Whether a TOML syntax error is a key defined twice; toml's error has no kind to ask.
pub(super) fn is_duplicate_key(message: &str) -> bool {
    message == "duplicate key"
}

/// Serde names Rust types ("expected u32"); operators think in ranges.
fn plain_types(message: &str) -> String {
    const NAMES: [(&str, &str); 8] = [
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected u64", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected i64", "expected an integer"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ];
    NAMES
        .iter()
        .find_map(|(rust, plain)| {
            let head = message.strip_suffix(rust)?;
            Some(format!("{head}{plain}"))
        })
        .unwrap_or_else(|| message.to_owned())
}

/// Splits "{prefix}NAME\`REST" into (NAME, REST): serde quotes names in backticks.
fn backquoted_after<'m>(message: &'m str, prefix: &str) -> Option<(&'m str, &'m str)> {
    let after = message.strip_prefix(prefix)?;
    let end = after.find('`')?;
    Some((&after[..end], &after[end + 1..]))
}

/// Where a key of the `[peer]` table goes in the `[[peer]]` form, for an entry that sets it
/// (`peer[1].side`): `side` and `bind` are the gateway's, not a peer's.
pub(super) fn moved_key(path: &str) -> Option<&'static str> {
    let (entry, field) = path.rsplit_once('.')?;
    let index = entry.strip_prefix("peer[")?.strip_suffix(']')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match field {
        "side" => Some("tunnel.side"),
        "bind" => Some("tunnel.bind"),
        _ => None,
    }
}
