//! The cfg editor: `/F` shows the cfg file the running configuration came
//! from, `/U` rewrites it (with `writable`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::pages::escape;
use super::request::{form_field, Head, BAD_REQUEST, FORBIDDEN};
use crate::client::Client;
use crate::res::Res;

/// The longest form `/U` takes.
const MAX_FORM: usize = 4 << 20;

/// The cfg file the running configuration came from; None when it came
/// from standard input or the command line.
static CFG: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Record where the running cfg is read from (for `/F`).
pub fn set_cfg(path: Option<PathBuf>) {
    *CFG.lock().unwrap_or_else(|e| e.into_inner()) = path;
}

/// `writable` in the running cfg: `/U` may rewrite the cfg file.
static WRITABLE: AtomicBool = AtomicBool::new(false);

/// Record whether the running cfg said `writable`.
pub fn set_writable(on: bool) {
    WRITABLE.store(on, Ordering::Relaxed);
}

fn cfg_path() -> Option<PathBuf> {
    CFG.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The largest cfg file `/F` shows: what one load reads at most (its
/// includes and `$FILE`s counted in), so a file it refuses could not
/// load anyway. 3proxy copies the file to the page in 256-byte pieces,
/// without a bound; the page here is built whole before it is sent.
const MAX_SHOWN: u64 = crate::conf::state::MAX_LOAD_BYTES;

/// The answer when the cfg file is over [`MAX_SHOWN`].
const TOO_BIG: &str = "The configuration file is larger than 16 MiB, more than a \
                       configuration may load: it is not shown.";

/// Read the cfg file, at most [`MAX_SHOWN`] bytes: None if it is longer.
fn read_bounded(path: &std::path::Path) -> std::io::Result<Option<Vec<u8>>> {
    let mut text = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_SHOWN + 1)
        .read_to_end(&mut text)?;
    Ok((text.len() as u64 <= MAX_SHOWN).then_some(text))
}

/// `/F`'s content: the cfg file's text, HTML-escaped; with `writable`, inside the
/// form that posts it to `/U`. A file over [`MAX_SHOWN`] is an error page.
pub(super) fn cfg_page() -> Result<String, (Res, &'static str, &'static str)> {
    let text = match cfg_path().map(|p| read_bounded(&p)) {
        Some(Ok(Some(text))) => text,
        Some(Ok(None)) => return Err((FORBIDDEN, "500 Internal Server Error", TOO_BIG)),
        _ => return Ok("<p>The configuration file cannot be read.</p>\n".into()),
    };
    let text = escape(&String::from_utf8_lossy(&text));
    Ok(if WRITABLE.load(Ordering::Relaxed) {
        format!(
            "<p>Careful: the text below replaces the file, and takes effect at the \
                 next reload.</p>\n<form method=\"POST\" action=\"/U\" \
                 enctype=\"application/x-www-form-urlencoded\">\
                 <textarea cols=\"80\" rows=\"30\" name=\"conffile\">{text}</textarea><br>\
                 <input type=\"submit\"></form>\n"
        )
    } else {
        format!("<pre>{text}</pre>\n")
    })
}

/// `/U`: read the posted form and rewrite the cfg file with its
/// `conffile` field, in place (the file keeps its owner and mode, as
/// 3proxy rewrites the file it opened).
pub(super) fn update(
    c: &Client,
    head: &Head,
    buf: &[u8],
    wait: Duration,
) -> Result<(), (Res, &'static str, &'static str)> {
    const NOT_WRITABLE: &str = "The configuration file is not writable: the cfg needs 'writable'.";
    let path = match cfg_path() {
        Some(p) if WRITABLE.load(Ordering::Relaxed) => p,
        _ => return Err((FORBIDDEN, "403 Forbidden", NOT_WRITABLE)),
    };
    let bad = (
        BAD_REQUEST,
        "400 Bad Request",
        "Expected a POST of the form field 'conffile'.",
    );
    let n = match head.length {
        Some(n) if head.method == "POST" && n <= MAX_FORM => n,
        _ => return Err(bad),
    };
    let mut body = buf[head.len.min(buf.len())..].to_vec();
    let until = Instant::now() + wait;
    while body.len() < n {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.cli.set_read_timeout(Some(left)).is_err() {
            return Err(bad);
        }
        let mut chunk = [0u8; 16 * 1024];
        match (&c.cli).read(&mut chunk) {
            Ok(0) => return Err(bad),
            Ok(k) => body.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(bad),
        }
    }
    body.truncate(n);
    let text = form_field(&body, b"conffile").ok_or(bad)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|_| (FORBIDDEN, "403 Forbidden", NOT_WRITABLE))?;
    f.write_all(&text).map_err(|_| {
        (
            FORBIDDEN,
            "403 Forbidden",
            "Writing the configuration file failed.",
        )
    })?;
    ::log::warn!("admin: the cfg file was rewritten by {:?}", c.client_addr);
    Ok(())
}
