//! How a body is delimited, the smuggling rules that keep the proxy and
//! the next hop agreeing on it (Content-Length, Transfer-Encoding, the
//! `Connection` lists, hop-by-hop fields), and the chunked body scanner.

use super::head::{trim, HeadError};

/// How a message's body is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Transfer-Encoding: chunked, up to the last chunk and trailers.
    Chunked,
    /// Until the sender closes (responses only).
    Close,
}

/// A Content-Length value merged with the ones seen before: a list or
/// repeats of one number are that number; anything else is an error.
pub(super) fn merge_length(prev: Option<u64>, value: &[u8]) -> Result<u64, HeadError> {
    // The usual field: one plain number, seen first.
    if prev.is_none()
        && !value.is_empty()
        && value.len() <= 19
        && value.iter().all(u8::is_ascii_digit)
    {
        return Ok(value
            .iter()
            .fold(0u64, |a, &d| a * 10 + u64::from(d - b'0')));
    }
    let mut n = prev;
    for part in value.split(|&b| b == b',') {
        let p = trim(part);
        if p.is_empty() || p.len() > 19 || !p.iter().all(u8::is_ascii_digit) {
            return Err(HeadError::Framing);
        }
        let v = p.iter().fold(0u64, |a, &d| a * 10 + u64::from(d - b'0'));
        if n.is_some_and(|x| x != v) {
            return Err(HeadError::Framing);
        }
        n = Some(v);
    }
    n.ok_or(HeadError::Framing)
}

/// The last coding of a Transfer-Encoding value is `chunked`.
pub(super) fn ends_in_chunked(v: &[u8]) -> bool {
    v.rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"))
}

/// Fields that describe one connection, not the message.
pub(super) fn is_hop_by_hop(name: &str, response: bool) -> bool {
    const ALWAYS: [&str; 5] = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
    ];
    if ALWAYS.iter().any(|h| name.eq_ignore_ascii_case(h)) {
        return true;
    }
    if response {
        // As 3proxy: no Proxy-* field of the origin's reaches the client.
        name.len() > 6 && name[..6].eq_ignore_ascii_case("proxy-")
    } else {
        name.eq_ignore_ascii_case("proxy-authorization")
    }
}

/// What the `Connection` (and `Proxy-Connection`) fields say.
pub(super) struct ConnTokens<'a> {
    pub(super) close: bool,
    pub(super) keep_alive: bool,
    pub(super) upgrade: bool,
    /// A `Connection` field names `Content-Length` or `Transfer-Encoding`:
    /// dropping the named field (as hop-by-hop) would change where the
    /// message ends for the next hop, so the message is refused.
    pub(super) frames: bool,
    /// A `Connection` field names `Host` or `Expect`, which route the
    /// request or decide when its body is sent (refused in requests).
    pub(super) routes: bool,
    /// The values of the `Connection` fields, to find other named fields.
    lists: [Option<&'a [u8]>; 4],
}

impl<'a> ConnTokens<'a> {
    pub(super) fn of(headers: &[httparse::Header<'a>]) -> ConnTokens<'a> {
        let mut t = ConnTokens {
            close: false,
            keep_alive: false,
            upgrade: false,
            frames: false,
            routes: false,
            lists: [None; 4],
        };
        let mut k = 0;
        for h in headers {
            let is_conn = h.name.eq_ignore_ascii_case("connection");
            if !is_conn && !h.name.eq_ignore_ascii_case("proxy-connection") {
                continue;
            }
            for tok in h.value.split(|&b| b == b',') {
                let tok = trim(tok);
                t.close |= tok.eq_ignore_ascii_case(b"close");
                t.keep_alive |= tok.eq_ignore_ascii_case(b"keep-alive");
                t.upgrade |= is_conn && tok.eq_ignore_ascii_case(b"upgrade");
                if is_conn {
                    t.frames |= tok.eq_ignore_ascii_case(b"content-length")
                        || tok.eq_ignore_ascii_case(b"transfer-encoding");
                    t.routes |=
                        tok.eq_ignore_ascii_case(b"host") || tok.eq_ignore_ascii_case(b"expect");
                }
            }
            if is_conn {
                if k == t.lists.len() {
                    // More Connection fields than remembered: a field one
                    // of them names could slip through, so refuse (no
                    // client sends that many).
                    t.frames = true;
                } else {
                    t.lists[k] = Some(h.value);
                    k += 1;
                }
            }
        }
        t
    }

    /// The field `name` is named in a `Connection` list (other than the
    /// tokens handled above), so it is hop-by-hop too.
    pub(super) fn names(&self, name: &str) -> bool {
        self.lists.iter().flatten().any(|l| {
            l.split(|&b| b == b',').any(|tok| {
                let tok = trim(tok);
                !tok.eq_ignore_ascii_case(b"upgrade") && tok.eq_ignore_ascii_case(name.as_bytes())
            })
        })
    }
}

/// Finds the end of a chunked body in the bytes relayed through it, without
/// changing them (3proxy relays chunked bodies as they are too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkScanner {
    state: ChunkState,
    /// Bytes of the current size line or trailer section, to bound them.
    line: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// In the hex size; the value so far and whether a digit was seen.
    Size(u64, bool),
    /// The size line after its digits, as RFC 9112 section 7.1.1 writes
    /// it: `*( BWS ";" BWS name [ BWS "=" BWS value ] )` up to CR. The
    /// chunk size rides along in each state.
    Ext(u64, ExtState),
    /// Saw the CR ending the size line.
    SizeLf(u64),
    /// Chunk data left.
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: at the start of a trailer line.
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    TrailerLf,
    /// CR of the final blank line seen.
    EndLf,
    Done,
}

/// Where in a chunk extension the scanner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExtState {
    /// Blanks after the digits or after a value: `;` or CR may follow.
    Gap,
    /// After `;`, blanks before a name.
    BeforeName,
    /// In a name (a token).
    Name,
    /// Blanks after a name: `=`, `;` or CR may follow.
    AfterName,
    /// After `=`, blanks before the value.
    BeforeValue,
    /// In a token value.
    Value,
    /// In a quoted-string value; `Escape` just after a backslash.
    Quoted,
    Escape,
}

/// A `tchar` of RFC 9110 section 5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Longest chunk-size line (with extensions) and trailer section accepted.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

impl Default for ChunkScanner {
    fn default() -> Self {
        ChunkScanner::new()
    }
}

impl ChunkScanner {
    pub fn new() -> ChunkScanner {
        ChunkScanner {
            state: ChunkState::Size(0, false),
            line: 0,
        }
    }

    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Scan `data`. Returns how many of its bytes belong to the body (all
    /// of them, unless the body ends inside `data`); `done()` tells if it
    /// ended. Err on anything that is not valid chunked coding.
    pub fn feed(&mut self, data: &[u8]) -> Result<usize, ()> {
        self.feed_into(data, None)
    }

    /// [`ChunkScanner::feed`], appending the chunks' data (without the
    /// framing) to `payload` if given: what a filter looks at.
    pub fn feed_into(
        &mut self,
        data: &[u8],
        mut payload: Option<&mut Vec<u8>>,
    ) -> Result<usize, ()> {
        use ChunkState::*;
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            self.state = match self.state {
                Done => return Ok(i),
                Data(n) => {
                    let take = (data.len() - i).min(usize::try_from(n).unwrap_or(usize::MAX));
                    if let Some(p) = payload.as_deref_mut() {
                        p.extend_from_slice(&data[i..i + take]);
                    }
                    i += take;
                    let left = n - take as u64;
                    self.state = if left == 0 { DataCr } else { Data(left) };
                    continue;
                }
                Size(v, seen) => match hex(b) {
                    Some(d) => {
                        if v >> 60 != 0 {
                            return Err(());
                        }
                        Size(v << 4 | u64::from(d), true)
                    }
                    None if !seen => return Err(()),
                    None => ext_byte(v, ExtState::Gap, b)?,
                },
                Ext(v, e) => ext_byte(v, e, b)?,
                SizeLf(v) => match b {
                    b'\n' if v == 0 => TrailerStart,
                    b'\n' => Data(v),
                    _ => return Err(()),
                },
                DataCr => {
                    if b == b'\r' {
                        DataLf
                    } else {
                        return Err(());
                    }
                }
                DataLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.line = 0;
                    Size(0, false)
                }
                TrailerStart => match b {
                    b'\r' => EndLf,
                    b'\n' | 0..=31 | 127 if b != b'\t' => return Err(()),
                    _ => Trailer,
                },
                Trailer => match b {
                    b'\r' => TrailerLf,
                    b'\t' => Trailer,
                    0..=31 | 127 => return Err(()),
                    _ => Trailer,
                },
                TrailerLf => {
                    if b == b'\n' {
                        TrailerStart
                    } else {
                        return Err(());
                    }
                }
                EndLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.state = Done;
                    return Ok(i + 1);
                }
            };
            if !matches!(self.state, Data(_)) {
                self.line += 1;
                let limit = if matches!(self.state, TrailerStart | Trailer | TrailerLf | EndLf) {
                    MAX_TRAILERS
                } else {
                    MAX_CHUNK_LINE
                };
                if self.line > limit {
                    return Err(());
                }
            }
            i += 1;
        }
        Ok(i)
    }
}

/// The state after byte `b` of a size line past its digits (chunk size
/// `v`, extension state `e`). Anything the grammar does not allow is an
/// error: a parser that reads `0x17` or `5garbage` differently from us
/// must never get to see such a line (strtol-like parsers stop at the
/// first non-digit and take the rest for data).
fn ext_byte(v: u64, e: ExtState, b: u8) -> Result<ChunkState, ()> {
    let blank = b == b' ' || b == b'\t';
    let next = match (e, b) {
        // CR ends the line where a name, a value or blanks end. Blanks
        // right before CR are not in the grammar, but every parser reads
        // them the same way, and some senders write them.
        (ExtState::Gap | ExtState::Name | ExtState::AfterName | ExtState::Value, b'\r') => {
            return Ok(ChunkState::SizeLf(v))
        }
        (ExtState::Gap | ExtState::Name | ExtState::AfterName | ExtState::Value, b';') => {
            ExtState::BeforeName
        }
        (ExtState::Gap | ExtState::Value, _) if blank => ExtState::Gap,
        (ExtState::BeforeName, _) if blank => ExtState::BeforeName,
        (ExtState::BeforeName | ExtState::Name, _) if is_tchar(b) => ExtState::Name,
        (ExtState::Name | ExtState::AfterName, _) if blank => ExtState::AfterName,
        (ExtState::Name | ExtState::AfterName, b'=') => ExtState::BeforeValue,
        (ExtState::BeforeValue, _) if blank => ExtState::BeforeValue,
        (ExtState::BeforeValue, b'"') => ExtState::Quoted,
        (ExtState::BeforeValue | ExtState::Value, _) if is_tchar(b) => ExtState::Value,
        (ExtState::Quoted, b'"') => ExtState::Gap,
        (ExtState::Quoted, b'\\') => ExtState::Escape,
        // qdtext, and what quoted-pair may escape: no controls but HTAB.
        (ExtState::Quoted | ExtState::Escape, b'\t' | b' '..=126 | 128..=255) => ExtState::Quoted,
        _ => return Err(()),
    };
    Ok(ChunkState::Ext(v, next))
}

pub(super) fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::request::tests::{err, fwd, req};
    use crate::proto::http::response::parse_response;
    use crate::proto::http::response::tests::resp;

    #[test]
    fn smuggling_shapes_are_refused() {
        let base = "POST http://h/ HTTP/1.1\r\n";
        let e = |fields: &str| err(&format!("{base}{fields}\r\n"));
        assert_eq!(
            e("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"),
            HeadError::Framing
        );
        assert_eq!(
            e("Content-Length: 3\r\nContent-Length: 4\r\n"),
            HeadError::Framing
        );
        assert_eq!(e("Content-Length: 3, 4\r\n"), HeadError::Framing);
        assert_eq!(e("Content-Length: -1\r\n"), HeadError::Framing);
        assert_eq!(e("Content-Length: 0x10\r\n"), HeadError::Framing);
        assert_eq!(
            e("Content-Length: 99999999999999999999\r\n"),
            HeadError::Framing
        );
        assert_eq!(e("Transfer-Encoding: gzip\r\n"), HeadError::Framing);
        assert_eq!(
            e("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            HeadError::Framing
        );
        assert_eq!(e("X: a\r\n b\r\n"), HeadError::Syntax);
        assert_eq!(e("Content-Length : 3\r\n"), HeadError::Syntax);
        assert_eq!(
            err("POST http://h/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadError::Framing
        );
        let ok = |fields: &str| {
            req(&format!("{base}{fields}\r\n"))
                .unwrap()
                .unwrap()
                .0
                .framing
        };
        assert_eq!(
            ok("Content-Length: 3\r\nContent-Length: 3\r\n"),
            Framing::Length(3)
        );
        assert_eq!(ok("Content-Length: 3, 3\r\n"), Framing::Length(3));
        assert_eq!(ok("Transfer-Encoding: gzip, Chunked\r\n"), Framing::Chunked);
        assert_eq!(ok("Content-Length: 0\r\n"), Framing::None);
        assert_eq!(ok(""), Framing::None);
    }

    #[test]
    fn connection_may_not_name_framing_or_routing_fields() {
        for name in [
            "content-length",
            "Content-Length",
            "TRANSFER-ENCODING",
            "host",
            "Expect",
        ] {
            for conn in [
                format!("Connection: {name}\r\n"),
                format!("Connection: close, {name} \r\n"),
                format!("Connection: keep-alive\r\nConnection: {name}\r\n"),
            ] {
                let t = format!("POST http://h/ HTTP/1.1\r\n{conn}Content-Length: 1\r\n\r\n");
                assert_eq!(err(&t), HeadError::Framing, "{t}");
                let t = format!("GET / HTTP/1.1\r\nHost: h\r\n{conn}\r\n");
                assert_eq!(err(&t), HeadError::Framing, "{t}");
            }
        }
        // Already hop-by-hop, or not about framing: forwarded without them.
        let out = fwd("GET http://h/ HTTP/1.1\r\nConnection: te, trailer, x-a\r\nTE: trailers\r\nX-A: 1\r\nX-B: 2\r\n\r\n");
        assert_eq!(
            out,
            "GET / HTTP/1.1\r\nHost: h\r\nX-B: 2\r\nForwarded: for=x\r\n\r\n"
        );
        // Proxy-Connection names nothing.
        let out = fwd("POST http://h/ HTTP/1.1\r\nProxy-Connection: content-length\r\nContent-Length: 1\r\n\r\n");
        assert_eq!(
            out,
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nForwarded: for=x\r\n\r\n"
        );
        // More Connection fields than are remembered.
        let many = "Connection: x\r\n".repeat(5);
        assert_eq!(
            err(&format!("GET http://h/ HTTP/1.1\r\n{many}\r\n")),
            HeadError::Framing
        );

        let mut o = Vec::new();
        for t in [
            "HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nConnection: close, Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 304 OK\r\nConnection: CONTENT-LENGTH\r\n\r\n",
        ] {
            assert_eq!(parse_response(t.as_bytes(), false, &mut o), Err(HeadError::Framing), "{t}");
        }
        let (_, out) = resp(
            "HTTP/1.1 200 OK\r\nConnection: x-a\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
    }

    #[test]
    fn one_content_length_is_forwarded() {
        for fields in [
            "Content-Length: 5, 5\r\n",
            "Content-Length: 5\r\nX: y\r\ncontent-length: 5\r\n",
        ] {
            let out = fwd(&format!("POST http://h/ HTTP/1.1\r\n{fields}\r\n"));
            assert_eq!(out.matches("Content-Length").count(), 1, "{out}");
            assert!(out.contains("Content-Length: 5\r\n"), "{out}");
            let (h, out) = resp(&format!("HTTP/1.1 200 OK\r\n{fields}\r\n"), false);
            assert_eq!(h.framing, Framing::Length(5));
            assert_eq!(out.matches("Content-Length").count(), 1, "{out}");
            assert!(out.contains("Content-Length: 5\r\n"), "{out}");
        }
        assert_eq!(
            err("POST http://h/ HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n"),
            HeadError::Framing
        );
    }

    /// Feeds `body` in pieces of `step` bytes; returns the bytes that
    /// belong to the body, or None on an error.
    fn scan(body: &[u8], step: usize) -> Option<usize> {
        let mut s = ChunkScanner::new();
        let mut total = 0;
        for piece in body.chunks(step) {
            let n = s.feed(piece).ok()?;
            total += n;
            if s.done() {
                return Some(total);
            }
        }
        None
    }

    #[test]
    fn chunked_bodies_end_where_they_end() {
        let body = b"5\r\nhello\r\n1;ext=\"x\"\r\n!\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in 1..body.len() {
            assert_eq!(scan(body, step), Some(body.len() - 4), "step {step}");
        }
        assert_eq!(scan(b"0\r\n\r\n", 100), Some(5));
        assert_eq!(scan(b"A \r\n0123456789\r\n0\r\n\r\n", 3), Some(21));
    }

    #[test]
    fn bad_chunks_are_errors() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"-5\r\n",
            b"11111111111111111\r\n",
            b"0\r\nX\n",
            b"0\r\n\rX",
        ] {
            assert_eq!(scan(bad, 1), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let long_ext = format!("1;{}\r\n", "a".repeat(MAX_CHUNK_LINE));
        assert_eq!(scan(long_ext.as_bytes(), 64), None);
    }

    /// Size lines that strtol-like parsers read another way, or that the
    /// grammar of RFC 9112 section 7.1 does not allow.
    #[test]
    fn chunk_size_lines_follow_the_grammar() {
        let bad: [&[u8]; 17] = [
            b"0x17",
            b"5garbage",
            b"5 garbage",
            b"+5",
            b" 5",
            b"5;",
            b"5;=x",
            b"5;a=",
            b"5;a=\"x",
            b"5;a\x01",
            b"5\r",
            b"5;a b",
            b"5;a=b c",
            b"5;a=\"x\"y",
            b"5;a=\"\x01\"",
            b"5;a=\"x\"\x7f",
            b"5,a",
        ];
        for line in bad {
            for step in [1, 100] {
                let mut body = line.to_vec();
                body.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
                assert_eq!(
                    scan(&body, step),
                    None,
                    "{:?}",
                    String::from_utf8_lossy(line)
                );
            }
        }
        let good: [&[u8]; 11] = [
            b"5",
            b"5;name",
            b"5;name=val",
            b"5 ; name = \"q\\\"uoted\"",
            b"5\t;x",
            b"0005",
            b"5 ",
            b"5;a;b=c;d=\"e;f\"",
            b"5;a=\"\xe9\"",
            b"5;a=b ",
            b"5;!#$%&'*+-.^_`|~=x",
        ];
        for line in good {
            for step in [1, 3, 100] {
                let mut body = line.to_vec();
                body.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
                assert_eq!(
                    scan(&body, step),
                    Some(body.len()),
                    "{:?}",
                    String::from_utf8_lossy(line)
                );
            }
        }
    }
}
