//! What the browser loads: a page of [`OBJECTS`] objects of [`PAGE_BYTES`] in all, a test
//! certificate authority and a leaf certificate for [`HOST`] made with the `openssl`
//! command line, and the Caddyfile that serves them over HTTP/1.1, HTTP/2 (TCP 443) and
//! HTTP/3 (UDP 443), advertising HTTP/3 with Alt-Svc as caddy does by default.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::cmd::run;
use crate::Error;

/// The name the browser loads the page from (mapped to the server's address by the
/// browser's own resolver rules, so no DNS is involved).
pub const HOST: &str = "bench.pepd.test";
/// Objects the page references (style sheets, scripts and images), besides the page itself.
pub const OBJECTS: usize = 30;
/// Bytes of the objects together.
pub const PAGE_BYTES: usize = 3_000_000;

/// Relative sizes of the objects: 2 style sheets, 4 scripts and 24 images, a few large and
/// many small, as on a typical page.
const WEIGHTS: [(Kind, u32); OBJECTS] = {
    use Kind::*;
    [
        (Style, 30),
        (Style, 15),
        (Script, 80),
        (Script, 60),
        (Script, 40),
        (Script, 20),
        (Image, 400),
        (Image, 300),
        (Image, 250),
        (Image, 200),
        (Image, 150),
        (Image, 150),
        (Image, 120),
        (Image, 100),
        (Image, 100),
        (Image, 80),
        (Image, 80),
        (Image, 60),
        (Image, 60),
        (Image, 50),
        (Image, 40),
        (Image, 40),
        (Image, 30),
        (Image, 30),
        (Image, 20),
        (Image, 20),
        (Image, 15),
        (Image, 10),
        (Image, 10),
        (Image, 5),
    ]
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Style,
    Script,
    Image,
}

/// One object of the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub path: String,
    pub bytes: usize,
}

/// The objects' names and sizes: exactly [`PAGE_BYTES`] together.
pub fn objects() -> Vec<Object> {
    let total: u32 = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut out: Vec<Object> = WEIGHTS
        .iter()
        .enumerate()
        .map(|(i, (kind, w))| {
            let ext = match kind {
                Kind::Style => "css",
                Kind::Script => "js",
                Kind::Image => "bmp",
            };
            Object {
                path: format!("obj{i:02}.{ext}"),
                bytes: PAGE_BYTES * *w as usize / total as usize,
            }
        })
        .collect();
    let sum: usize = out.iter().map(|o| o.bytes).sum();
    if let Some(first_image) = out.iter_mut().find(|o| o.path.ends_with(".bmp")) {
        first_image.bytes += PAGE_BYTES - sum;
    }
    out
}

/// The page referencing every object: style sheets in the head, scripts deferred, images
/// in the body, and an empty icon so the browser asks for no favicon.
pub fn index_html(objects: &[Object]) -> String {
    let mut head = String::new();
    let mut body = String::new();
    for o in objects {
        let p = &o.path;
        if p.ends_with(".css") {
            let _ = writeln!(head, "<link rel=\"stylesheet\" href=\"{p}\">");
        } else if p.ends_with(".js") {
            let _ = writeln!(head, "<script defer src=\"{p}\"></script>");
        } else {
            let _ = writeln!(
                body,
                "<img src=\"{p}\" width=\"64\" height=\"64\" alt=\"\">"
            );
        }
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>pepd browser \
         benchmark</title>\n<link rel=\"icon\" href=\"data:,\">\n{head}</head>\n<body>\n{body}\
         </body></html>\n"
    )
}

/// An object's content: incompressible bytes, inside a comment for style sheets and
/// scripts so they parse, as the pixels of a bitmap for images (a browser stops fetching
/// an image it cannot decode, so the images must be valid for the whole page to load).
/// TLS hides the content from any compression on the path anyway.
fn content(o: &Object) -> Result<Vec<u8>, Error> {
    if o.path.ends_with(".bmp") {
        return bitmap(o.bytes);
    }
    let (open, close) = (b"/* ".as_slice(), b" */\n".as_slice());
    let n = o.bytes.saturating_sub(open.len() + close.len());
    let mut raw = vec![0u8; n.div_ceil(2)];
    random(&mut raw)?;
    let mut v = Vec::with_capacity(o.bytes);
    v.extend_from_slice(open);
    for b in &raw {
        let _ = write!(HexByte(&mut v), "{b:02x}");
    }
    v.truncate(open.len() + n);
    v.extend_from_slice(close);
    Ok(v)
}

/// Pixels per row of the bitmaps: 3 bytes each and a multiple of 4, so rows need no
/// padding.
const BITMAP_WIDTH: usize = 256;
const BITMAP_HEADER: usize = 54;

/// A 24-bit BMP of random pixels, `bytes` long: as many rows as fit, then the few bytes
/// left after the pixel array (decoders read the rows the header announces).
fn bitmap(bytes: usize) -> Result<Vec<u8>, Error> {
    let row = 3 * BITMAP_WIDTH;
    let rows = bytes.saturating_sub(BITMAP_HEADER) / row;
    if rows == 0 {
        return Err(Error::Invalid(format!(
            "an image of {bytes} bytes is too small for a {BITMAP_WIDTH}-pixel row"
        )));
    }
    let u32_of =
        |n: usize| u32::try_from(n).map_err(|_| Error::Invalid(format!("image of {bytes} bytes")));
    let mut v = Vec::with_capacity(bytes);
    v.extend_from_slice(b"BM");
    v.extend_from_slice(&u32_of(bytes)?.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&(BITMAP_HEADER as u32).to_le_bytes());
    v.extend_from_slice(&40u32.to_le_bytes());
    v.extend_from_slice(&(BITMAP_WIDTH as u32).to_le_bytes());
    v.extend_from_slice(&u32_of(rows)?.to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&24u16.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&u32_of(rows * row)?.to_le_bytes());
    v.extend_from_slice(&2835u32.to_le_bytes());
    v.extend_from_slice(&2835u32.to_le_bytes());
    v.extend_from_slice(&[0; 8]);
    debug_assert_eq!(v.len(), BITMAP_HEADER);
    let start = v.len();
    v.resize(bytes, 0);
    random(&mut v[start..])?;
    Ok(v)
}

fn random(buf: &mut [u8]) -> Result<(), Error> {
    getrandom::fill(buf).map_err(|e| Error::Invalid(format!("no OS randomness: {e}")))
}

struct HexByte<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for HexByte<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Where a run's server side lives.
#[derive(Clone, Debug)]
pub struct Site {
    pub dir: PathBuf,
    pub root: PathBuf,
    pub ca_cert: PathBuf,
    pub leaf_cert: PathBuf,
    pub leaf_key: PathBuf,
    pub caddyfile: PathBuf,
}

/// Writes the page, the certificates and the Caddyfile under `dir`.
pub fn build(dir: &Path) -> Result<Site, Error> {
    let root = dir.join("www");
    fs::create_dir_all(&root)?;
    let objs = objects();
    fs::write(root.join("index.html"), index_html(&objs))?;
    for o in &objs {
        fs::write(root.join(&o.path), content(o)?)?;
    }
    let site = Site {
        ca_cert: dir.join("ca.pem"),
        leaf_cert: dir.join("leaf.pem"),
        leaf_key: dir.join("leaf.key"),
        caddyfile: dir.join("Caddyfile"),
        root,
        dir: dir.to_owned(),
    };
    make_certificates(&site)?;
    fs::write(&site.caddyfile, caddyfile(&site))?;
    Ok(site)
}

fn path_str(p: &Path) -> Result<&str, Error> {
    p.to_str()
        .ok_or_else(|| Error::Invalid(format!("{} is not UTF-8", p.display())))
}

/// A P-256 certificate authority valid for two days, and a leaf for [`HOST`] it signs.
fn make_certificates(s: &Site) -> Result<(), Error> {
    let ca_key = s.dir.join("ca.key");
    let csr = s.dir.join("leaf.csr");
    let ext = s.dir.join("leaf.ext");
    fs::write(
        &ext,
        format!(
            "subjectAltName=DNS:{HOST}\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        path_str(&ca_key)?,
        "-out",
        path_str(&s.ca_cert)?,
        "-days",
        "2",
        "-subj",
        "/CN=pepd testbed CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run("openssl", &ca)?;
    let mut req = vec!["req"];
    req.extend(ec);
    let subj = format!("/CN={HOST}");
    req.extend([
        "-keyout",
        path_str(&s.leaf_key)?,
        "-out",
        path_str(&csr)?,
        "-subj",
        &subj,
    ]);
    run("openssl", &req)?;
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            path_str(&csr)?,
            "-CA",
            path_str(&s.ca_cert)?,
            "-CAkey",
            path_str(&ca_key)?,
            "-CAcreateserial",
            "-out",
            path_str(&s.leaf_cert)?,
            "-days",
            "2",
            "-extfile",
            path_str(&ext)?,
        ],
    )?;
    Ok(())
}

/// Serves the page at `https://HOST` on every address of the server's namespace, HTTP/3
/// included, with the run's own certificate; no admin endpoint, no automatic HTTPS (no
/// certificate requests, no port 80 redirects).
fn caddyfile(s: &Site) -> String {
    format!(
        "{{\n\tadmin off\n\tauto_https off\n\tstorage file_system {storage}\n\tservers {{\n\
         \t\tprotocols h1 h2 h3\n\t}}\n}}\n\
         https://{HOST}:443 {{\n\ttls {cert} {key}\n\troot * {root}\n\tfile_server\n}}\n",
        storage = s.dir.join("caddy-data").display(),
        cert = s.leaf_cert.display(),
        key = s.leaf_key.display(),
        root = s.root.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirty_objects_of_three_megabytes() {
        let o = objects();
        assert_eq!(o.len(), OBJECTS);
        assert_eq!(o.iter().map(|o| o.bytes).sum::<usize>(), PAGE_BYTES);
        let html = index_html(&o);
        for obj in &o {
            assert_eq!(html.matches(&format!("\"{}\"", obj.path)).count(), 1);
        }
    }

    #[test]
    fn text_objects_have_their_exact_size() {
        for o in objects() {
            let c = content(&o).expect("random bytes");
            assert_eq!(c.len(), o.bytes, "{}", o.path);
            if o.path.ends_with(".js") {
                assert!(c.starts_with(b"/* ") && c.ends_with(b" */\n"));
            }
            if o.path.ends_with(".bmp") {
                assert_eq!(&c[..2], b"BM");
                assert_eq!(c[2..6], (o.bytes as u32).to_le_bytes());
                let rows = u32::from_le_bytes([c[22], c[23], c[24], c[25]]) as usize;
                assert!(BITMAP_HEADER + rows * 3 * BITMAP_WIDTH <= o.bytes);
                assert!(BITMAP_HEADER + (rows + 1) * 3 * BITMAP_WIDTH > o.bytes);
            }
        }
    }
}
