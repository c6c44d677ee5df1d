//! The layering docs/ARCHITECTURE.md draws, checked from the source text: each room of the
//! daemon imports only the rooms below it, config imports nothing above it, and neither the
//! rooms' modules nor the transport crate's top-level modules import each other in a circle;
//! and the names the glossary retired stay retired.
//!
//! Test code (`tests.rs` files and the `mod tests` at the end of a file) is left out: it
//! builds fixtures from whatever it needs and is no part of the daemon's structure.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each room of `src/` and the rooms it may import: control above all, proxy and metrics on
/// the tunnel, the tunnel on config and the system helpers, which import nothing of pepd.
const ROOMS: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("sys", &[]),
    ("tunnel", &["config", "sys"]),
    ("proxy", &["tunnel", "config", "sys"]),
    ("metrics", &["tunnel", "config", "sys"]),
    ("control", &["proxy", "metrics", "tunnel", "config", "sys"]),
];

/// A module path, `["tunnel", "driver"]` for `crate::tunnel::driver`.
type ModPath = Vec<String>;

struct Source {
    /// The module the file is, from its place in the tree.
    module: ModPath,
    /// The module paths it names (`crate::…`, `super::…`), resolved from the crate root.
    names: Vec<ModPath>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn each_room_imports_only_the_rooms_below_it() {
    let sources = crate_sources(&root().join("src"));
    let rooms: BTreeMap<&str, &[&str]> = ROOMS.iter().copied().collect();
    let mut wrong = Vec::new();
    for s in &sources {
        let Some(from) = s.module.first() else {
            continue;
        };
        let Some(allowed) = rooms.get(from.as_str()) else {
            wrong.push(format!(
                "src/{from}: not a room of docs/ARCHITECTURE.md (add it there and to ROOMS)"
            ));
            continue;
        };
        for name in &s.names {
            let Some(to) = name.first() else { continue };
            if to != from && rooms.contains_key(to.as_str()) && !allowed.contains(&to.as_str()) {
                wrong.push(format!(
                    "{} imports crate::{}",
                    s.module.join("::"),
                    name.join("::")
                ));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports across rooms that the layering forbids:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_circle_among_a_room_s_modules() {
    let sources = crate_sources(&root().join("src"));
    for (room, _) in ROOMS {
        let inside: Vec<&Source> = sources
            .iter()
            .filter(|s| s.module.first().map(String::as_str) == Some(room))
            .collect();
        let circles = circles(&inside, 2, room);
        assert!(
            circles.is_empty(),
            "modules of src/{room}/ that import each other in a circle: {circles:?}"
        );
    }
}

#[test]
fn no_circle_among_the_transport_s_modules() {
    let sources = crate_sources(&root().join("crates/transport/src"));
    let all: Vec<&Source> = sources.iter().collect();
    let circles = circles(&all, 1, "");
    assert!(
        circles.is_empty(),
        "top-level modules of pep-transport that import each other in a circle: {circles:?}"
    );
}

/// Names that meant a second thing beside their glossary meaning (docs/ARCHITECTURE.md,
/// "Words"), with the name that replaced them: none may come back.
const RETIRED: &[(&str, &str)] = &[
    ("PeerLink", "Peer: a link is the satellite hop"),
    ("LinkState", "PeerState"),
    ("LinkCounters", "PeerCounters"),
    ("PeerConfig", "PairConfig: the pair's `[peer]` table"),
    (
        "peer_send_share",
        "peer_send_quota: a share is a portion of the carrier",
    ),
    ("flow_share", "flow_quota"),
    ("SHARE_FLOOR", "QUOTA_FLOOR"),
    ("share_waiting", "quota_waiting"),
    ("lift_shares", "lift_quotas"),
    ("wait_for_share", "wait_for_quota"),
    ("release_share_waits", "release_quota_waits"),
    ("flows_waiting_for_share", "flows_waiting_for_quota"),
    ("share_blocked", "quota_blocked"),
    ("share_initiations", "use_initiation_memory"),
    (
        "SCRATCH_PER_WORKER",
        "SCRATCH_PER_RUNTIME_THREAD: a worker is a tunnel thread",
    ),
    ("budget::worker_threads", "budget::runtime_threads"),
    (
        "pep_transport::ConfigError",
        "pep_transport::InvalidConfig: ConfigError is the config file's",
    ),
];

#[test]
fn retired_words_stay_retired() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "benches",
        "tests",
        "crates",
        "fuzz/fuzz_targets",
        "docs",
    ] {
        walk_all(&root().join(dir), &mut files);
    }
    files.push(root().join("README.md"));
    let me = root().join("tests/layering.rs");
    let mut found = Vec::new();
    for path in files.iter().filter(|p| **p != me) {
        let Ok(text) = fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (old, new) in RETIRED {
                let hit = line.match_indices(old).any(|(at, _)| {
                    let before = line[..at].chars().next_back();
                    let after = line[at + old.len()..].chars().next();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                        && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    found.push(format!("{}:{}: `{old}` (now {new})", path.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "retired names in use:\n{}",
        found.join("\n")
    );
}

/// Every Rust and Markdown file under `dir`, build output left out.
fn walk_all(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                walk_all(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
            out.push(p);
        }
    }
}

#[test]
fn the_parser_sees_grouped_relative_and_inline_paths_and_skips_comments_and_strings() {
    let module: ModPath = vec!["tunnel".into(), "driver".into(), "outbox".into()];
    let text = r#"
use crate::{config::{A, B}, sys::sockopt};
use super::super::conn::PeerConn; // crate::proxy in a comment
/* crate::control in a block comment */
fn f() { let _ = "crate::metrics in a string"; let c = '"'; crate::tunnel::memory::f(); }
#[cfg(test)]
mod tests { use crate::control::run; }
"#;
    let names = names_in(&module, text);
    let firsts: BTreeSet<String> = names
        .iter()
        .map(|n| n[..2.min(n.len())].join("::"))
        .collect();
    assert_eq!(
        firsts,
        [
            "config::A",
            "config::B",
            "sys::sockopt",
            "tunnel::conn",
            "tunnel::memory"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
}

/// Every non-test source file under `dir` (a crate's `src/`), as the module it is.
fn crate_sources(dir: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(dir).ok()?;
            let mut module: ModPath = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().map(String::as_str) == Some("mod") {
                module.pop();
            }
            if matches!(module.as_slice(), [m] if m == "lib" || m == "main") {
                module.clear();
            }
            if module.last().map(String::as_str) == Some("tests")
                || module.iter().any(|m| m == "bin")
            {
                return None;
            }
            let text = fs::read_to_string(&path).ok()?;
            Some(Source {
                names: names_in(&module, &text),
                module,
            })
        })
        .filter(|s| !s.module.is_empty())
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The circles (strongly connected components of more than one module) among `sources`'
/// modules cut to `depth` components, counting only modules under `prefix`.
fn circles(sources: &[&Source], depth: usize, prefix: &str) -> Vec<Vec<String>> {
    let cut = |m: &ModPath| -> Option<String> {
        (m.len() >= depth && (prefix.is_empty() || m[0] == prefix)).then(|| m[..depth].join("::"))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        let Some(from) = cut(&s.module) else { continue };
        edges.entry(from.clone()).or_default();
        for n in &s.names {
            if let Some(to) = cut(n) {
                if to != from {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// Tarjan's algorithm over a small graph.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            c.sort();
            s.out.push(c);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The module paths `text` (the file of `module`) names through `crate::` or `super::`,
/// resolved from the crate root; comments, string literals and the trailing test module
/// are skipped.
fn names_in(module: &ModPath, text: &str) -> Vec<ModPath> {
    let code = code_only(text);
    let code = match code.find("#[cfg(test)]\nmod tests") {
        Some(at) => &code[..at],
        None => &code,
    };
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        if starts_word {
            let (lead, base) = if bytes[i..].starts_with(b"crate::") {
                ("crate::".len(), Some(Vec::new()))
            } else {
                let mut n = 0;
                while bytes[i + n * "super::".len()..].starts_with(b"super::") {
                    n += 1;
                }
                (
                    n * "super::".len(),
                    (n > 0 && n <= module.len()).then(|| module[..module.len() - n].to_vec()),
                )
            };
            if let Some(base) = base {
                let (paths, end) = paths_after(code, i + lead);
                for p in paths {
                    let mut full = base.clone();
                    full.extend(p);
                    out.push(full);
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The paths (as components) written from `at` on: `a::b::C`, or a `{…}` group of them.
fn paths_after(code: &str, at: usize) -> (Vec<ModPath>, usize) {
    let bytes = code.as_bytes();
    let mut i = at;
    let mut path = Vec::new();
    loop {
        if code[i..].starts_with('{') {
            // A group: each comma-separated item at depth one is a path of its own.
            let mut depth = 0;
            let mut start = i + 1;
            let mut items = Vec::new();
            while i < bytes.len() {
                match bytes[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            items.push(&code[start..i]);
                            break;
                        }
                    }
                    b',' if depth == 1 => {
                        items.push(&code[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
                i += 1;
            }
            let mut out = Vec::new();
            for item in items {
                let item = item.trim();
                if item.is_empty() || item == "self" {
                    out.push(path.clone());
                    continue;
                }
                let (inner, _) = paths_after(item, 0);
                for p in inner {
                    let mut full = path.clone();
                    full.extend(p);
                    out.push(full);
                }
            }
            return (out, i);
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let word = &code[start..i];
        if word.is_empty() {
            break;
        }
        path.push(word.to_string());
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    (vec![path], i)
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `text` with comments and the contents of string and char literals blanked out, so that
/// what remains is code (lines kept).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let at = |i: usize, s: &str| b[i..].starts_with(s.as_bytes());
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if at(i, "//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            i = (i + 2..b.len())
                .find(|&j| at(j, "*/"))
                .map_or(b.len(), |j| j + 2);
            out.push(b' ');
        } else if b[i] == b'"' || at(i, "r#\"") || at(i, "r\"") {
            let raw = b[i] == b'r';
            let hashes = if raw {
                b[i + 1..].iter().take_while(|&&c| c == b'#').count()
            } else {
                0
            };
            i += if raw { 2 + hashes } else { 1 };
            let close = format!("\"{}", "#".repeat(hashes));
            while i < b.len() {
                if !raw && b[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if at(i, &close) {
                    i += close.len();
                    break;
                }
                if b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'\'' && char_literal_len(&text[i..]).is_some() {
            // A char literal ('x', 'ç' or an escape), not a lifetime.
            i += char_literal_len(&text[i..]).unwrap_or(1);
            out.extend_from_slice(b"' '");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length in bytes of the char literal `rest` starts with, if it starts with one.
fn char_literal_len(rest: &str) -> Option<usize> {
    let mut chars = rest.char_indices().skip(1);
    let (_, c) = chars.next()?;
    if c == '\\' {
        // An escape: up to the closing quote ('\n', '\'', '\u{…}').
        let (_, _) = chars.next()?;
        return chars.find(|&(_, c)| c == '\'').map(|(j, _)| j + 1);
    }
    match chars.next()? {
        (j, '\'') => Some(j + 1),
        _ => None,
    }
}
