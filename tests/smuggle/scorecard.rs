//! The framing scorecard (issue #17): a few hundred framing variants (RFC
//! 9112 edge cases and the smuggling classes: CL.TE, TE.CL, TE.TE
//! obfuscations, Connection naming framing fields, chunk-size and
//! extension edge cases, obs-fold, bare CR and LF, NUL, duplicate fields,
//! absolute-form against Host), each sent through the proxy to a raw
//! recording origin and followed by a second request on the same client
//! connection. Each variant must end one of two ways:
//!
//! - refused: the client gets a 4xx/5xx from the proxy and the origin
//!   receives no message;
//! - forwarded consistently: the bytes the origin received frame, read by
//!   a strict RFC 9112 parser, into exactly the messages the proxy
//!   answered from the origin and logged, in order, with no byte left
//!   over.
//!
//! Anything else is a desync and fails the test. The summary line is the
//! README's "Framing scorecard".

use super::*;

/// Framing fields (each a block of field lines, CRLF-separated, without
/// the last CRLF); `{o}` is the origin's authority.
const FIELDS: &[&str] = &[
    "",
    "Content-Length: 5",
    "Content-Length: 5\r\nContent-Length: 5",
    "Content-Length: 5, 5",
    "Content-Length: 5\r\nContent-Length: 6",
    "Content-Length: 5, 6",
    "Content-Length: +5",
    "Content-Length: -5",
    "Content-Length: 05",
    "Content-Length: 5 ",
    "Content-Length: 0x5",
    "Content-Length: 5.0",
    "Content-Length: 99999999999999999999",
    "Content-Length:",
    "Content-Length : 5",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: Chunked",
    "Transfer-Encoding:  chunked ",
    "Transfer-Encoding: xchunked",
    "Transfer-Encoding: chunked, identity",
    "Transfer-Encoding: identity, chunked",
    "Transfer-Encoding: gzip, chunked",
    "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity",
    "Transfer-Encoding:\tchunked",
    "Transfer-Encoding: chunked;q=1",
    "Transfer-Encoding : chunked",
    "Transfer_Encoding: chunked",
    "Transfer-Encoding:\x0bchunked",
    "Transfer-Encoding: \"chunked\"",
    "Content-Length: 5\r\nTransfer-Encoding: chunked",
    "Transfer-Encoding: chunked\r\nContent-Length: 5",
    "Content-Length: 0\r\nTransfer-Encoding: chunked",
    "Transfer-Encoding:\r\n chunked",
    "X-Folded: a\r\n b\r\nContent-Length: 5",
    "Connection: Content-Length\r\nContent-Length: 5",
    "Connection: transfer-encoding\r\nTransfer-Encoding: chunked",
    "Connection: close, Host",
    "Connection: keep-alive, Expect\r\nExpect: 100-continue\r\nContent-Length: 5",
    "X-A: a\rContent-Length: 5",
    "X-A: a\nContent-Length: 5",
    "X-A: a\0b\r\nContent-Length: 5",
    "Host: other.example\r\nContent-Length: 5",
    "Expect: 100-continue\r\nContent-Length: 5",
    "Content-Length: 5\r\nUpgrade: h2c\r\nConnection: Upgrade",
];

/// Bodies sent after the head.
const BODIES: &[&[u8]] = &[
    b"",
    b"hello",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"05\r\nhello\r\n0\r\n\r\n",
    b"5;ext=1\r\nhello\r\n0\r\n\r\n",
    b"5 ;ext\r\nhello\r\n0\r\n\r\n",
    b"0x5\r\nhello\r\n0\r\n\r\n",
    b"5\nhello\n0\n\n",
    b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
    b"5\r\nhelloXX0\r\n\r\n",
    b"5;a=\"b\\\"c\"\r\nhello\r\n0\r\n\r\n",
    b"fffffffffffffffff\r\nhello\r\n0\r\n\r\n",
];

/// How a variant ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Refused,
    Forwarded(usize),
    Desync(String),
}

/// The messages at the start of `b`, read by a strict RFC 9112 parser:
/// (request target, body length) of each. Err: bytes a strict parser
/// would not frame (what a desync needs), or a message cut short.
fn strict_messages(b: &[u8]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let he = head_end(&b[pos..]).ok_or("a head without its end")?;
        // Each line with its CRLF, the blank line left out.
        let head = &b[pos..pos + he - 2];
        let mut lines = head.split(|&c| c == b'\n');
        lines.next_back();
        let first = lines.next().unwrap_or_default();
        let first = first.strip_suffix(b"\r").ok_or("bare LF")?;
        let target = text(first)
            .split(' ')
            .nth(1)
            .ok_or("no request target")?
            .to_string();
        let (mut cl, mut te): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
        for l in lines {
            let l = l.strip_suffix(b"\r").ok_or("bare LF in a field")?;
            if l.iter().any(|&c| c == b'\r' || c == 0) {
                return Err("bare CR or NUL in a field".into());
            }
            if l.first().is_some_and(|c| *c == b' ' || *c == b'\t') {
                return Err("obs-fold".into());
            }
            let colon = l.iter().position(|&c| c == b':').ok_or("no colon")?;
            let name = &l[..colon];
            if name.is_empty()
                || !name
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(c))
            {
                return Err(format!("bad field name {:?}", text(name)));
            }
            let value = text(&l[colon + 1..]).trim_matches([' ', '\t']).to_string();
            if name.eq_ignore_ascii_case(b"content-length") {
                cl.push(value);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                te.push(value);
            }
        }
        let body = &b[pos + he..];
        let len = match (cl.as_slice(), te.as_slice()) {
            ([], []) => 0,
            // chunked last in the list of codings (RFC 9112 section 6.1).
            ([], [t])
                if t.rsplit(',').next().is_some_and(|c| {
                    c.trim_matches([' ', '\t']).eq_ignore_ascii_case("chunked")
                }) =>
            {
                strict_chunked(body)?
            }
            (_, [_, ..]) => return Err(format!("framing CL {cl:?} TE {te:?}")),
            ([n], []) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) && n.len() < 16 => {
                let n: usize = n.parse().unwrap();
                if body.len() < n {
                    return Err("a body cut short".into());
                }
                n
            }
            _ => return Err(format!("Content-Length {cl:?}")),
        };
        out.push(target);
        pos += he + len;
    }
    Ok(out)
}

/// The length of a chunked body read strictly: hex size, extensions of
/// tokens and quoted strings, CRLF everywhere.
fn strict_chunked(b: &[u8]) -> Result<usize, String> {
    let mut pos = 0;
    loop {
        let eol = pos + find(&b[pos..], b"\r\n").ok_or("a size line cut short")?;
        let line = &b[pos..eol];
        let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 15 {
            return Err(format!("chunk size {:?}", text(line)));
        }
        // BWS may come before a `;` (RFC 9112 section 7.1.1).
        let ext = &line[digits..];
        let ext = &ext[ext.iter().take_while(|&&c| c == b' ' || c == b'\t').count()..];
        if !ext.is_empty() && !ext.starts_with(b";") {
            return Err(format!("chunk size line {:?}", text(line)));
        }
        if ext.iter().any(|&c| c == b'\n' || c == 0) {
            return Err("a control byte in a chunk extension".into());
        }
        let size = usize::from_str_radix(&text(&line[..digits]), 16).unwrap();
        pos = eol + 2;
        if size == 0 {
            loop {
                let eol = pos + find(&b[pos..], b"\r\n").ok_or("trailers cut short")?;
                let empty = eol == pos;
                pos = eol + 2;
                if empty {
                    return Ok(pos);
                }
            }
        }
        if b.len() < pos + size + 2 || &b[pos + size..pos + size + 2] != b"\r\n" {
            return Err("chunk data not followed by CRLF".into());
        }
        pos += size + 2;
    }
}

/// The paths the origin answered, from the `saw PATH` bodies the client
/// got, and whether the proxy answered with an error of its own.
fn answers(b: &[u8]) -> (Vec<String>, bool) {
    let mut paths = Vec::new();
    let mut refused = false;
    for r in responses(b) {
        match text(&r.body).strip_prefix("saw ") {
            Some(p) if r.status == 200 => paths.push(p.to_string()),
            _ if r.status >= 400 => refused = true,
            _ => {}
        }
    }
    (paths, refused)
}

/// Path of a request target (absolute-form or origin-form).
fn path_of(target: &str) -> String {
    match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/".into(), |i| rest[i..].to_string()),
        None => target.to_string(),
    }
}

fn run_variant(px: &Px, i: usize, fields: &str, body: &[u8]) -> (String, Outcome) {
    let origin = Recorder::parse_chunked();
    let o = format!("127.0.0.1:{}", origin.port());
    let absolute = i % 2 == 0;
    let target = |p: &str| {
        if absolute {
            format!("http://{o}{p}")
        } else {
            p.to_string()
        }
    };
    let host = if absolute {
        "h.invalid".to_string()
    } else {
        o.clone()
    };
    let v = format!("/v{i}");
    let mut req = format!("POST {} HTTP/1.1\r\nHost: {host}\r\n", target(&v)).into_bytes();
    if !fields.is_empty() {
        req.extend_from_slice(fields.replace("{o}", &o).as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    req.extend_from_slice(
        format!(
            "GET {} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n",
            target("/next")
        )
        .as_bytes(),
    );
    let row = format!(
        "#{i} {} {:?} + {:?}",
        if absolute { "absolute" } else { "origin-form" },
        fields,
        text(body)
    );
    let mut c = px.client();
    let port = c.port();
    c.send(&req);
    let (got, _) = c.rest(Duration::from_millis(1500));
    drop(c);
    let (paths, refused) = answers(&got);
    // The origin's bytes: once they frame as many messages as the client
    // got answers for (or the settle time passes).
    let settle = |o: &Recorder| strict_messages(&o.all_bytes()).map(|m| m.len());
    wait_for(
        || settle(&origin) == Ok(paths.len()),
        Duration::from_millis(500),
    );
    let bytes = origin.all_bytes();
    let outcome = match strict_messages(&bytes) {
        Err(why) => Outcome::Desync(format!(
            "the origin got bytes a strict parser cannot frame ({why}): {:?}",
            text(&bytes)
        )),
        Ok(msgs) if msgs.is_empty() && refused => Outcome::Refused,
        Ok(msgs) if msgs.is_empty() && paths.is_empty() => {
            Outcome::Desync(format!("no answer at all: {:?}", text(&got)))
        }
        Ok(msgs) => {
            let seen: Vec<String> = msgs.iter().map(|t| path_of(t)).collect();
            // Every origin message was answered to the client, in order,
            // and logged by the proxy.
            let logged = wait_for(
                || {
                    let lines = log_lines(&px.log());
                    let at = format!(" 127.0.0.1:{port} ");
                    seen.iter().all(|p| {
                        lines
                            .iter()
                            .any(|l| l.contains(&at) && l.contains(p.as_str()))
                    })
                },
                LOG_TIMEOUT,
            );
            if seen != paths {
                Outcome::Desync(format!(
                    "the origin framed {seen:?}, the client got answers for {paths:?}: {:?}",
                    text(&bytes)
                ))
            } else if seen.first() != Some(&v) {
                Outcome::Desync(format!("the first message is not the variant: {seen:?}"))
            } else if !logged {
                Outcome::Desync(format!("not every forwarded message is logged: {seen:?}"))
            } else {
                Outcome::Forwarded(seen.len())
            }
        }
    };
    (row, outcome)
}

#[test]
fn framing_scorecard() {
    let px = Px::open("scorecard");
    let mut variants = Vec::new();
    for f in FIELDS {
        for b in BODIES {
            variants.push((*f, *b));
        }
    }
    let total = variants.len();
    let results = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((f, b)) = variants.get(i) else { break };
                let r = run_variant(&px, i, f, b);
                results.lock().unwrap().push(r);
            });
        }
    });
    let results = results.into_inner().unwrap();
    let refused = results.iter().filter(|r| r.1 == Outcome::Refused).count();
    let forwarded = results
        .iter()
        .filter(|r| matches!(r.1, Outcome::Forwarded(_)))
        .count();
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(row, o)| match o {
            Outcome::Desync(why) => Some(format!("{row} -- {why}")),
            _ => None,
        })
        .collect();
    eprintln!(
        "framing scorecard: {total} variants, {refused} refused, {forwarded} forwarded consistently, {} desync",
        failures.len()
    );
    assert_eq!(results.len(), total);
    assert_rows("framing scorecard", total, &failures);
}
