//! Where each key sits in the config text, and config errors turned into diagnostics that
//! name the key and its line. A deserialization error brings its key path
//! (serde_path_to_error) and a byte span (toml); a syntax error only the span, which this
//! map turns back into the dotted key an operator would search for. The validator uses the
//! map to point at the line of a key long after parsing.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::{Diagnostic, Position};
use super::messages::{self, SchemaError};

/// Dotted key path → location, for every key and array element in one config text.
#[derive(Clone, Default)]
pub struct SourceMap {
    origin: String,
    entries: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    key_span: Range<usize>,
    key_at: Position,
}

impl fmt::Debug for SourceMap {
    // The full map would drown the config in `{:?}` output; the origin is what matters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceMap")
            .field("origin", &self.origin)
            .field("keys", &self.entries.len())
            .finish()
    }
}

impl SourceMap {
    pub(super) fn build(origin: &str, text: &str, root: &DeTable<'_>) -> SourceMap {
        let lines = LineIndex::new(text);
        let mut map = SourceMap {
            origin: origin.to_owned(),
            entries: BTreeMap::new(),
        };
        map.add_table("", root, &lines);
        map
    }

    /// The file the config came from, as it was named; empty for text from elsewhere.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Where `key` (a dotted path like `link.mtu`) is written, or `Position::Default` when
    /// the file leaves it out.
    pub fn position(&self, key: &str) -> Position {
        self.entries
            .get(key)
            .map_or(Position::Default, |e| e.key_at)
    }

    pub fn line(&self, key: &str) -> Option<usize> {
        self.position(key).line()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// "line 12", or "default" for a key the file does not set; for messages that refer to
    /// a second key.
    pub fn describe(&self, key: &str) -> String {
        match self.line(key) {
            Some(line) => format!("line {line}"),
            None => "default".to_owned(),
        }
    }

    /// A diagnostic about `key` placed at `position`, for a key that is missing from a
    /// section the file does have (point at the section) or from the whole file.
    pub(super) fn diagnostic_at(
        &self,
        key: &str,
        position: Position,
        message: String,
    ) -> Diagnostic {
        Diagnostic {
            origin: self.origin.clone(),
            key: Some(key.to_owned()),
            position,
            message,
        }
    }

    pub(super) fn diagnostic(&self, key: &str, message: String) -> Diagnostic {
        Diagnostic {
            origin: self.origin.clone(),
            key: Some(key.to_owned()),
            position: self.position(key),
            message,
        }
    }

    fn add_table(&mut self, prefix: &str, table: &DeTable<'_>, lines: &LineIndex) {
        for (key, value) in table {
            let path = if prefix.is_empty() {
                key.get_ref().to_string()
            } else {
                format!("{prefix}.{}", key.get_ref())
            };
            self.add_value(path, key.span(), value, lines);
        }
    }

    fn add_value(
        &mut self,
        path: String,
        key_span: Range<usize>,
        value: &Spanned<DeValue<'_>>,
        lines: &LineIndex,
    ) {
        match value.get_ref() {
            DeValue::Table(t) => self.add_table(&path, t, lines),
            DeValue::Array(a) => {
                for (i, element) in a.iter().enumerate() {
                    // An array element has no key of its own: point at the element.
                    self.add_value(format!("{path}[{i}]"), element.span(), element, lines);
                }
            }
            _ => {}
        }
        let entry = Entry {
            key_at: lines.position(key_span.start),
            key_span,
        };
        self.entries.insert(path, entry);
    }

    /// For a duplicate key at `span`: the closest earlier key of the same name, which is
    /// the one the recovered table kept.
    fn first_definition(&self, text: &str, span: &Range<usize>) -> Option<&str> {
        let name = text
            .get(span.clone())?
            .trim_matches(|c| c == '"' || c == '\'');
        self.entries
            .iter()
            .filter(|(path, e)| {
                e.key_span.start < span.start && path.rsplit('.').next() == Some(name)
            })
            .max_by_key(|(_, e)| e.key_span.start)
            .map(|(path, _)| path.as_str())
    }

    /// Turns an error from deserializing this text into one naming the key and line.
    pub(super) fn explain(
        &self,
        error: &serde_path_to_error::Error<toml::de::Error>,
        text: &str,
    ) -> Diagnostic {
        // The path is empty for an error about the whole document; `Path` shows that as ".".
        let path = match error.path().iter().next() {
            Some(_) => error.path().to_string(),
            None => String::new(),
        };
        let error = error.inner();
        // toml's span is the offending key or value; without one, where the path is written.
        let at = match error.span() {
            Some(span) => LineIndex::new(text).position(span.start),
            None => self.position(&path),
        };
        let diag = |key: Option<String>, position: Position, message: String| Diagnostic {
            origin: self.origin.clone(),
            key,
            position,
            message,
        };
        match messages::schema_error(error.message()) {
            SchemaError::UnknownKey { expected } => {
                let hint = expected.map_or_else(String::new, |e| format!(" ({e})"));
                let moved = messages::moved_key(&path).map_or_else(String::new, |to| {
                    format!("; with `[[peer]]` entries it goes in `[tunnel]`, as `{to}`")
                });
                let message = format!("unknown key `{path}`{hint}{moved}");
                diag(Some(path), at, message)
            }
            SchemaError::MissingKey { name } if path.is_empty() => diag(
                Some(name.to_owned()),
                Position::Document,
                format!("missing required section `[{name}]`"),
            ),
            // Serde reports a missing key at the table that lacks it: point at its header.
            SchemaError::MissingKey { name } => {
                let key = format!("{path}.{name}");
                let header = self
                    .entries
                    .get(&path)
                    .map_or(Position::Document, |e| e.key_at);
                // An element of an array of tables is an entry of `[[name]]`.
                let section = match path.strip_suffix(']').and_then(|p| p.rsplit_once('[')) {
                    Some((array, _)) => format!("[[{array}]]"),
                    None => format!("[{path}]"),
                };
                let message = format!("missing required key `{key}` in `{section}`");
                diag(Some(key), header, message)
            }
            SchemaError::Value(message) if path.is_empty() => diag(None, at, message),
            SchemaError::Value(message) => {
                let message = format!("`{path}`: {message}");
                diag(Some(path), at, message)
            }
        }
    }

    /// Turns a TOML syntax error into a diagnostic; `partial` is what the parser recovered,
    /// which still names the first definition of a duplicate key.
    pub(super) fn explain_syntax(
        origin: &str,
        error: &toml::de::Error,
        text: &str,
        partial: &DeTable<'_>,
    ) -> Diagnostic {
        let span = error.span().unwrap_or(0..0);
        let position = LineIndex::new(text).position(span.start);
        // Other syntax errors are best found by line and column; naming a key for them
        // would be a guess.
        let duplicate = if messages::is_duplicate_key(error.message()) {
            let map = SourceMap::build(origin, text, partial);
            map.first_definition(text, &span).map(str::to_owned)
        } else {
            None
        };
        let message = match &duplicate {
            Some(key) => format!("duplicate key `{key}`"),
            None => format!("invalid TOML: {}", error.message()),
        };
        Diagnostic {
            origin: origin.to_owned(),
            key: duplicate,
            position,
            message,
        }
    }
}

/// Byte offset → line and column.
struct LineIndex<'t> {
    text: &'t str,
    starts: Vec<usize>,
}

impl<'t> LineIndex<'t> {
    fn new(text: &'t str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { text, starts }
    }

    fn position(&self, offset: usize) -> Position {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&s| s <= offset);
        let start = self
            .starts
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(0);
        // Columns count characters, as editors do; a span inside a character (never
        // produced by the parser) falls back to bytes.
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        Position::At {
            line,
            column: column + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: usize, column: usize) -> Position {
        Position::At { line, column }
    }

    #[test]
    fn line_index_counts_from_one_in_characters() {
        let idx = LineIndex::new("ab\nçd\n\nx");
        assert_eq!(idx.position(0), at(1, 1));
        assert_eq!(idx.position(2), at(1, 3));
        assert_eq!(idx.position(3), at(2, 1));
        assert_eq!(idx.position(5), at(2, 2)); // after the two-byte 'ç'
        assert_eq!(idx.position(7), at(3, 1));
        assert_eq!(idx.position(8), at(4, 1));
        assert_eq!(idx.position(100), at(4, 2));
    }

    #[test]
    fn map_names_nested_keys_and_elements() {
        let text = "a = 1\n[t]\nb = 2\nl = [\n  1,\n  2,\n]\n[t.u]\nc = { d = 3 }\n";
        let root = DeTable::parse(text).expect("valid toml");
        let map = SourceMap::build("x.toml", text, root.get_ref());
        assert_eq!(map.line("a"), Some(1));
        assert_eq!(map.line("t"), Some(2));
        assert_eq!(map.line("t.b"), Some(3));
        assert_eq!(map.line("t.l"), Some(4));
        assert_eq!(map.line("t.l[1]"), Some(6));
        assert_eq!(map.line("t.u.c.d"), Some(9));
        assert_eq!(map.position("t.nope"), Position::Default);
        assert_eq!(map.describe("t.b"), "line 3");
        assert_eq!(map.describe("t.nope"), "default");
        assert!(format!("{map:?}").contains("x.toml"));
    }
}
