//! What a transfer carries: seeded pseudo-random bytes (the default), real text, or real
//! text already compressed. The text corpus is built from files every Debian system has
//! (packages of priority "required"), not already gzipped: the licences of base-files,
//! the Perl modules of perl-base, debconf's modules. The compressed corpus is that text
//! through `gzip -9n` (gzip is required too). Both are built once per process, in memory.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::xfer::pattern::Digest;
use crate::Error;

/// What a transfer's streams carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// Seeded pseudo-random bytes: nothing to compress.
    #[default]
    Random,
    /// The text corpus, from a seeded offset, round and round.
    Text,
    /// The text corpus gzipped, likewise: already compressed.
    Compressed,
}

/// The directories the text corpus is read from, and which files of each (by extension; all
/// when empty). `*` stands for one path component (the multiarch triplet).
const TEXT_SOURCES: &[(&str, &[&str])] = &[
    // base-files
    ("/usr/share/common-licenses", &[]),
    // perl-base
    ("/usr/lib/*/perl-base", &["pm", "pl"]),
    // debconf
    ("/usr/share/perl5/Debconf", &["pm"]),
];

/// The text corpus on Debian 12 (bookworm) amd64: 716 files, its size and FNV-1a digest.
/// Another release ships other versions of these files: the corpus is then another one,
/// which every result says (`corpus.pinned`), with its own ratio beside it.
pub const PINNED_TEXT: (u64, &str) = (2_853_042, "3f9ae67968c54992");

/// A built corpus and what identifies it.
#[derive(Debug)]
pub struct Corpus {
    pub bytes: Arc<[u8]>,
    pub files: usize,
    /// FNV-1a (64 bit) of the bytes, hex.
    pub digest: String,
}

/// What a result says about the corpus its transfer carried.
#[derive(Clone, Debug, Serialize)]
pub struct CorpusInfo {
    pub content: Content,
    pub files: usize,
    pub bytes: u64,
    pub digest: String,
    /// The text corpus is the pinned one (Debian 12's files); always true for `compressed`
    /// built from it, and for random data.
    pub pinned: bool,
}

static TEXT: OnceLock<Result<Corpus, String>> = OnceLock::new();
static COMPRESSED: OnceLock<Result<Corpus, String>> = OnceLock::new();

/// The corpus of `content` (built on first use); `None` for random data.
pub fn get(content: Content) -> Result<Option<&'static Corpus>, Error> {
    let cell = match content {
        Content::Random => return Ok(None),
        Content::Text => &TEXT,
        Content::Compressed => &COMPRESSED,
    };
    let built = cell.get_or_init(|| {
        match content {
            Content::Text => build_text(),
            _ => get(Content::Text).and_then(|t| gzip(t.expect("text corpus"))),
        }
        .map_err(|e| e.to_string())
    });
    match built {
        Ok(c) => Ok(Some(c)),
        Err(e) => Err(Error::Invalid(format!("{content:?} corpus: {e}"))),
    }
}

/// What identifies the data `content` carries.
pub fn info(content: Content) -> Result<CorpusInfo, Error> {
    Ok(match get(content)? {
        None => CorpusInfo {
            content,
            files: 0,
            bytes: 0,
            digest: String::new(),
            pinned: true,
        },
        Some(c) => CorpusInfo {
            content,
            files: c.files,
            bytes: c.bytes.len() as u64,
            digest: c.digest.clone(),
            pinned: get(Content::Text)?
                .is_some_and(|t| (t.bytes.len() as u64, t.digest.as_str()) == PINNED_TEXT),
        },
    })
}

/// The files of the text corpus, in the order they are concatenated: sorted by the bytes of
/// their paths (as `LC_ALL=C sort` does), regular files only (no symlinks).
pub fn text_files() -> Result<Vec<PathBuf>, Error> {
    let mut all = Vec::new();
    for (dir, exts) in TEXT_SOURCES {
        let mut files = Vec::new();
        for root in expand(dir)? {
            walk(&root, exts, &mut files)?;
        }
        if files.is_empty() {
            return Err(Error::Invalid(format!(
                "no files for the text corpus under {dir} (not a Debian system?)"
            )));
        }
        files.sort_by(|a: &PathBuf, b: &PathBuf| {
            a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes())
        });
        all.extend(files);
    }
    Ok(all)
}

/// `dir` with a `*` component matched against what exists.
fn expand(dir: &str) -> Result<Vec<PathBuf>, Error> {
    let Some((head, tail)) = dir.split_once("/*/") else {
        return Ok(vec![PathBuf::from(dir)]);
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(head)? {
        let p = e?.path().join(tail);
        if p.is_dir() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) -> Result<(), Error> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            walk(&p, exts, out)?;
        } else if t.is_file()
            && (exts.is_empty()
                || p.extension()
                    .and_then(|x| x.to_str())
                    .is_some_and(|x| exts.contains(&x)))
        {
            out.push(p);
        }
    }
    Ok(())
}

fn build_text() -> Result<Corpus, Error> {
    let files = text_files()?;
    let mut bytes = Vec::new();
    for f in &files {
        bytes.extend_from_slice(&std::fs::read(f)?);
    }
    Ok(corpus(bytes, files.len()))
}

fn gzip(text: &Corpus) -> Result<Corpus, Error> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .args(["-9", "-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let data = text.bytes.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| Error::Invalid("gzip writer panicked".into()))??;
    if !out.status.success() {
        return Err(Error::Invalid(format!("gzip: {}", out.status)));
    }
    Ok(corpus(out.stdout, text.files))
}

fn corpus(bytes: Vec<u8>, files: usize) -> Corpus {
    let mut d = Digest::default();
    d.update(&bytes);
    Corpus {
        bytes: bytes.into(),
        files,
        digest: d.hex(),
    }
}

/// How much smaller `content` gets as pepd compresses it at its hard level, in its blocks:
/// over the corpus, or over 8 MiB of the random stream of `seed`.
pub fn offline_ratio(content: Content, seed: u64) -> Result<f64, Error> {
    let block = 1usize << pep_compress::OFFERED_BLOCK_LOG;
    Ok(match get(content)? {
        Some(c) => pep_compress::offline_ratio(&c.bytes, block, pep_compress::Level::Hard),
        None => {
            let mut sample = vec![0u8; 8 << 20];
            crate::xfer::pattern::Pattern::new(seed, 1).fill(&mut sample);
            pep_compress::offline_ratio(&sample, block, pep_compress::Level::Hard)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_corpus_is_text_and_compresses() {
        let Ok(Some(t)) = get(Content::Text) else {
            eprintln!("no Debian text corpus here: skipped");
            return;
        };
        assert!(
            t.files > 100 && t.bytes.len() > 1 << 20,
            "{} files",
            t.files
        );
        assert!(
            t.bytes.iter().filter(|&&b| b == 0).count() == 0,
            "no NUL in text"
        );
        let info = info(Content::Text).unwrap();
        eprintln!(
            "text corpus: {} files, {} bytes, {} (pinned {})",
            info.files, info.bytes, info.digest, info.pinned
        );
        let c = get(Content::Compressed).unwrap().unwrap();
        assert_eq!(&c.bytes[..2], &[0x1f, 0x8b], "gzip magic");
        assert!(c.bytes.len() * 3 < t.bytes.len());
        let ratio =
            pep_compress::offline_ratio(&t.bytes[..1 << 20], 1 << 17, pep_compress::Level::Hard);
        assert!(ratio > 2.5, "{ratio}");
        let ratio = pep_compress::offline_ratio(&c.bytes, 1 << 17, pep_compress::Level::Hard);
        assert!(ratio < 1.05, "{ratio}");
    }
}
