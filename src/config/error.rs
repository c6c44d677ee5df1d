//! Config errors. Every one says where: the file, the dotted key and the line, so an
//! operator can go straight to the offending setting.

use std::fmt;

/// Where in the file a diagnostic points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// 1-based line and column (column in characters).
    At { line: usize, column: usize },
    /// The key is not in the file: its default value is at fault.
    Default,
    /// No single place in the file, e.g. a required section that is missing.
    Document,
}

impl Position {
    pub fn line(self) -> Option<usize> {
        match self {
            Position::At { line, .. } => Some(line),
            Position::Default | Position::Document => None,
        }
    }
}

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file name, or empty when the text did not come from a file.
    pub origin: String,
    /// Dotted key path, e.g. `transport.ack_max_delay` or `intercept.listen[1]`; `None` for
    /// syntax errors that are not inside a key.
    pub key: Option<String>,
    pub position: Position,
    /// Complete sentence naming the key; printed after the position.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if self.origin.is_empty() { "" } else { " " };
        match self.position {
            // A syntax error has no key to look for, so the column earns its place.
            Position::At { line, column } if self.key.is_none() => write!(
                f,
                "{}{sep}line {line}, column {column}: {}",
                self.origin, self.message
            ),
            Position::At { line, .. } => {
                write!(f, "{}{sep}line {line}: {}", self.origin, self.message)
            }
            Position::Default => write!(f, "{}{sep}(default): {}", self.origin, self.message),
            Position::Document if self.origin.is_empty() => f.write_str(&self.message),
            Position::Document => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

/// Why a config was rejected; `Display` names the key and the line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// Not TOML, or not pepd's schema: a syntax error, an unknown or missing key, a value of
    /// the wrong type or out of the type's range.
    #[error("{0}")]
    Parse(Diagnostic),
    /// Well-formed but unusable: values out of range or contradicting each other. Holds
    /// every problem found, in file order, values left at their default last.
    #[error("{}", lines(.0))]
    Invalid(Vec<Diagnostic>),
}

/// File order, keys left at their default after those in the file; stable, so ties keep
/// the order they were found in.
pub(super) fn sort_by_position(diagnostics: &mut [Diagnostic]) {
    diagnostics.sort_by_key(|d| match d.position {
        Position::At { line, column } => (0, line, column),
        Position::Default => (1, 0, 0),
        Position::Document => (2, 0, 0),
    });
}

fn lines(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(Diagnostic::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(origin: &str, key: Option<&str>, position: Position) -> Diagnostic {
        Diagnostic {
            origin: origin.into(),
            key: key.map(Into::into),
            position,
            message: "msg".into(),
        }
    }

    #[test]
    fn display_forms() {
        let at = Position::At {
            line: 12,
            column: 3,
        };
        assert_eq!(
            diag("a.toml", Some("k"), at).to_string(),
            "a.toml line 12: msg"
        );
        assert_eq!(diag("", Some("k"), at).to_string(), "line 12: msg");
        assert_eq!(
            diag("a.toml", None, at).to_string(),
            "a.toml line 12, column 3: msg"
        );
        assert_eq!(
            diag("a.toml", Some("k"), Position::Default).to_string(),
            "a.toml (default): msg"
        );
        assert_eq!(
            diag("a.toml", None, Position::Document).to_string(),
            "a.toml: msg"
        );
        assert_eq!(diag("", None, Position::Document).to_string(), "msg");
    }

    #[test]
    fn invalid_lists_every_problem() {
        let e = ConfigError::Invalid(vec![
            diag("a.toml", Some("k"), Position::At { line: 1, column: 1 }),
            diag("a.toml", Some("j"), Position::Default),
        ]);
        assert_eq!(e.to_string(), "a.toml line 1: msg\na.toml (default): msg");
    }
}
