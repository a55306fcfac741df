//! A request and its answer: the head read within its deadline and
//! parsed by the HTTP proxy's rules (`proto::http`), form fields, and the
//! HTTP/1.0 answers every page is sent in.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use super::pages::{escape, heading, page, page_top, PAGE_END};
use crate::client::Client;
use crate::proto::http::{basic_credentials, parse_request, Framing, Rewrite};
use crate::res::Res;
use crate::stringtable::{self, Strings};

/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// The request could not be read or parsed (3proxy's 701/702).
pub(super) const BAD_REQUEST: Res = Res::ADMIN_BAD_REQUEST;
/// A path with no page.
pub(super) const NOT_FOUND: Res = Res::ADMIN_NOT_FOUND;
/// `/U`: rewriting the cfg is refused.
pub(super) const FORBIDDEN: Res = Res::ADMIN_FORBIDDEN;

/// What a head without a `Host` field is taken to ask for: `proto::http`
/// wants a host for it, and no page looks at it.
const NO_HOST: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// Read the request head: up to the empty line, within `wait`; `early`
/// is what the client sent before a local redirection handed it here.
pub(super) fn read_head(c: &Client, early: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let until = Instant::now() + wait;
    let mut buf = early.to_vec();
    loop {
        if crate::proto::http::find_head_end(&buf, 0).is_some() {
            return Some(buf);
        }
        if buf.len() >= MAX_HEAD {
            return None;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.cli.set_read_timeout(Some(left)).is_err() {
            return None;
        }
        let mut chunk = [0u8; 1024];
        let mut r = &c.cli;
        match r.read(&mut chunk) {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => return None,
        }
    }
}

pub(super) struct Head {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    /// Content-Length, when given.
    pub(super) length: Option<usize>,
    /// The Host and Origin headers, when given (`/E` refuses a POST from
    /// another site's page).
    pub(super) host: Option<String>,
    pub(super) origin: Option<String>,
    /// Bytes of the head, blank line included.
    pub(super) len: usize,
}

/// The request head at the start of `buf`, by the HTTP proxy's rules
/// (`proto::http::parse_request`: a well-formed head, one body length, no
/// Transfer-Encoding beside a Content-Length); None if it is none, or not
/// for a path.
pub(super) fn parse_head(buf: &[u8]) -> Option<Head> {
    let rw = Rewrite {
        redirected_to: Some(NO_HOST),
        ..Rewrite::default()
    };
    let mut forward = Vec::new();
    let req = parse_request(buf, &rw, &mut forward).ok()??;
    if !req.uri.starts_with('/') {
        return None;
    }
    let (user, password) = match req.auth.and_then(basic_credentials) {
        Some((u, p)) => (Some(u), Some(p)),
        None => (None, None),
    };
    let length = match req.framing {
        Framing::Length(n) => Some(usize::try_from(n).ok()?),
        _ => None,
    };
    let fields = &buf[..req.len];
    Some(Head {
        method: req.method.to_string(),
        path: req.uri.to_string(),
        user,
        password,
        length,
        host: field(fields, "host"),
        origin: field(fields, "origin"),
        len: req.len,
    })
}

/// The value of the last field `name` of a head `proto::http` has read
/// (so every field line has its colon, and none is folded).
fn field(head: &[u8], name: &str) -> Option<String> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let value = || {
                String::from_utf8_lossy(&line[colon + 1..])
                    .trim()
                    .to_string()
            };
            line[..colon]
                .eq_ignore_ascii_case(name.as_bytes())
                .then(value)
        })
        .last()
}

pub(super) fn respond(c: &Client, status: &str, extra: &str, body: &str) {
    respond_as(c, status, "text/html; charset=utf-8", extra, body)
}

pub(super) fn respond_as(c: &Client, status: &str, ctype: &str, extra: &str, body: &str) {
    respond_bytes(c, status, ctype, extra, &[body.as_bytes()]);
}

/// [`respond_as`] with a body of byte strings, in order.
pub(super) fn respond_bytes(c: &Client, status: &str, ctype: &str, extra: &str, body: &[&[u8]]) {
    let len: usize = body.iter().map(|b| b.len()).sum();
    let head = format!(
        "HTTP/1.0 {status}\r\nConnection: close\r\nCache-Control: no-cache\r\n\
         Content-Type: {ctype}\r\n{extra}Content-Length: {len}\r\n\r\n"
    );
    let mut out = Vec::with_capacity(head.len() + len);
    out.extend_from_slice(head.as_bytes());
    body.iter().for_each(|b| out.extend_from_slice(b));
    let mut w = &c.cli;
    let _ = w.write_all(&out);
}

/// Bytes as they are: StringsPlugin's texts, which carry their own HTTP
/// head and no length (the connection's close ends the answer).
pub(super) fn send_raw(c: &Client, parts: &[&[u8]]) {
    let _ = (&c.cli).write_all(&parts.concat());
}

/// A page answered 200: in the built-in frame, or with StringsPlugin's
/// start (admin entry 1, a printf format given the program's name twice
/// and its version, HTTP head included) and end (entry 5) where its file
/// has them. The heading and the content are this service's.
pub(super) fn send_page(c: &Client, strings: Option<&Strings>, title: &str, content: &str) {
    let start = strings.and_then(|t| t.admin(stringtable::ADMIN_HEAD));
    let end = strings
        .and_then(|t| t.admin(stringtable::ADMIN_TAIL))
        .unwrap_or(PAGE_END.as_bytes());
    let heading = heading(title);
    match start {
        Some(f) => {
            const NAME: &str = "threeproxy";
            let start = stringtable::printf_s(f, &[NAME, NAME, env!("CARGO_PKG_VERSION")]);
            send_raw(c, &[&start, heading.as_bytes(), content.as_bytes(), end]);
        }
        None => respond_bytes(
            c,
            "200 OK",
            "text/html; charset=utf-8",
            "",
            &[
                page_top(title).as_bytes(),
                heading.as_bytes(),
                content.as_bytes(),
                end,
            ],
        ),
    }
}

pub(super) fn error_page(c: &mut Client, res: Res, status: &str, extra: &str, what: &str) {
    c.record.res = res;
    respond(
        c,
        status,
        extra,
        &page(status, &format!("<p>{}</p>\n", escape(what))),
    );
}

/// A field of an `application/x-www-form-urlencoded` body, decoded (`+`
/// is a blank, `%XX` a byte).
pub(super) fn form_field(body: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let raw = body.split(|&b| b == b'&').find_map(|kv| {
        let eq = kv.iter().position(|&b| b == b'=')?;
        (&kv[..eq] == name).then(|| &kv[eq + 1..])
    })?;
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let digit = |k: usize| raw.get(i + k).copied().and_then(hex);
                match (digit(1), digit(2)) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_decode() {
        let body = b"a=1&conffile=log+x%0D%0A%25%zz&b=2";
        assert_eq!(form_field(body, b"conffile").unwrap(), b"log x\r\n%%zz");
        assert_eq!(form_field(body, b"a").unwrap(), b"1");
        assert!(form_field(body, b"c").is_none());
    }

    #[test]
    fn parses_basic_auth() {
        let h = parse_head(b"GET /C HTTP/1.0\r\nAuthorization: Basic dTpw\r\n\r\n").unwrap();
        assert_eq!(h.path, "/C");
        assert_eq!(h.user.as_deref(), Some("u"));
        assert_eq!(h.password.as_deref(), Some("p"));
        assert!(parse_head(b"GARBAGE\r\n\r\n").is_none());
    }
}
