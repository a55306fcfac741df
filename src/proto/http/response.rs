//! Response heads: what the proxy reads from one (status, framing,
//! keep-alive) and the head it passes on to the client.

use super::fields::{put_field, put_length};
use super::framing::{ends_in_chunked, is_hop_by_hop, merge_length, ConnTokens, Framing};
use super::head::{HeadError, FEW_HEADERS, MAX_HEADERS};

/// A parsed response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub version: u8,
    pub len: usize,
    pub framing: Framing,
    /// The origin allows another request on this connection.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// 1xx other than 101: an interim response, the final one follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// Parse a response head at the start of `buf` (the answer to a `HEAD`
/// request if `head_req`). Ok(None) if incomplete. On success `out` holds
/// the status line and the fields to pass to the client, *without* the
/// closing blank line: the caller adds its `Connection` field and the
/// blank line with [`end_response_head`].
///
/// [`end_response_head`]: super::fields::end_response_head
pub fn parse_response(
    buf: &[u8],
    head_req: bool,
    out: &mut Vec<u8>,
) -> Result<Option<ResponseHead>, HeadError> {
    let mut hs = [httparse::EMPTY_HEADER; FEW_HEADERS];
    match parse_response_in(buf, head_req, out, &mut hs) {
        Err(HeadError::TooMany) => {
            let mut many = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
            parse_response_in(buf, head_req, out, &mut many)
        }
        r => r,
    }
}

/// [`parse_response`] with `slots` field slots (see
/// [`parse_request_slots`]).
///
/// [`parse_request_slots`]: super::request::parse_request_slots
pub(crate) fn parse_response_slots(
    buf: &[u8],
    head_req: bool,
    out: &mut Vec<u8>,
    slots: usize,
) -> Result<Option<ResponseHead>, HeadError> {
    parse_response_in(buf, head_req, out, &mut vec![httparse::EMPTY_HEADER; slots])
}

fn parse_response_in<'a>(
    buf: &'a [u8],
    head_req: bool,
    out: &mut Vec<u8>,
    hs: &mut [httparse::Header<'a>],
) -> Result<Option<ResponseHead>, HeadError> {
    let mut resp = httparse::Response::new(hs);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooMany),
        Err(_) => return Err(HeadError::Syntax),
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return Err(HeadError::Syntax);
    };
    let headers: &[httparse::Header<'_>] = resp.headers;
    let conn = ConnTokens::of(headers);
    if conn.frames {
        // The client would get the body without the field that frames
        // it, on a connection that stays open: never relay that.
        return Err(HeadError::Framing);
    }
    let mut cl: Option<u64> = None;
    let mut cl_fields = 0u32;
    let mut te: Option<&[u8]> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            cl = Some(merge_length(cl, h.value)?);
            cl_fields += 1;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if te.is_some() {
                return Err(HeadError::Framing);
            }
            te = Some(h.value);
        }
    }
    let no_body = head_req || (100..200).contains(&status) || status == 204 || status == 304;
    let framing = match (te, cl) {
        _ if no_body => Framing::None,
        (Some(t), _) if ends_in_chunked(t) && version == 1 => Framing::Chunked,
        (Some(_), _) => Framing::Close,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Close,
    };
    // A response with both CL and TE may have been smuggled; never reuse
    // that connection (RFC 9112 section 6.3, item 3).
    let keep_alive = framing != Framing::Close
        && !(te.is_some() && cl.is_some())
        && !conn.close
        && (version == 1 || conn.keep_alive)
        && status != 101;

    out.clear();
    // The status line as the origin sent it, minus its line end. httparse
    // skips empty lines before it (RFC 9112 section 2.2): so do we.
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(0);
    let line_end = buf[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(start, |i| start + i);
    let line = &buf[start..line_end];
    out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
    out.extend_from_slice(b"\r\n");
    let mut cl_sent = false;
    for h in headers {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            // With Transfer-Encoding the length is dropped; otherwise
            // repeats and lists of one value become one field.
            if let (Some(v), None, false) = (cl, te, cl_sent) {
                put_length(out, n, h.value, v, cl_fields);
                cl_sent = true;
            }
            continue;
        }
        if is_hop_by_hop(n, true)
            || (n.eq_ignore_ascii_case("upgrade") && status != 101)
            || conn.names(n)
        {
            continue;
        }
        put_field(out, n.as_bytes(), h.value);
    }
    if status == 101 {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    }
    Ok(Some(ResponseHead {
        status,
        version,
        len,
        framing,
        keep_alive,
    }))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::proto::http::fields::end_response_head;

    pub(crate) fn resp(text: &str, head_req: bool) -> (ResponseHead, String) {
        let mut out = Vec::new();
        let h = parse_response(text.as_bytes(), head_req, &mut out)
            .unwrap()
            .unwrap();
        (h, String::from_utf8(out).unwrap())
    }

    #[test]
    fn response_framing() {
        let f = |t: &str, head| resp(t, head).0.framing;
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false),
            Framing::Length(5)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true),
            Framing::None
        );
        assert_eq!(
            f(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false
            ),
            Framing::Chunked
        );
        assert_eq!(f("HTTP/1.1 200 OK\r\n\r\n", false), Framing::Close);
        assert_eq!(f("HTTP/1.1 204 No\r\n\r\n", false), Framing::None);
        assert_eq!(
            f("HTTP/1.1 304 NM\r\nContent-Length: 9\r\n\r\n", false),
            Framing::None
        );
        assert_eq!(f("HTTP/1.1 100 Continue\r\n\r\n", false), Framing::None);
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false),
            Framing::Close
        );
        let mut out = Vec::new();
        let bad = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(
            parse_response(bad, false, &mut out),
            Err(HeadError::Framing)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\n", false, &mut out),
            Ok(None)
        );
    }

    /// Found by the http_response fuzz target: empty lines before the
    /// status line (which httparse skips, as RFC 9112 section 2.2 allows)
    /// took the place of the status line in the head sent to the client.
    #[test]
    fn empty_lines_before_the_status_line_are_not_passed_on() {
        for pre in ["\r\n", "\n", "\r\n\n\r\n"] {
            let (h, out) = resp(
                &format!("{pre}HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
                false,
            );
            assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", "{pre:?}");
            assert_eq!((h.status, h.len), (200, pre.len() + 38));
        }
    }

    #[test]
    fn response_keep_alive_and_rewrite() {
        let (h, out) = resp("HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nX-A: 1\r\nProxy-Foo: 2\r\nContent-Length: 0\r\n\r\n", false);
        assert!(!h.keep_alive);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
        assert!(
            !resp("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false)
                .0
                .keep_alive
        );
        assert!(
            resp(
                "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                false
            )
            .0
            .keep_alive
        );
        let (h, out) = resp(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        );
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.keep_alive);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n");
        let (h, out) = resp(
            "HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            false,
        );
        assert!(!h.is_interim());
        assert_eq!(
            out,
            "HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nConnection: upgrade\r\n"
        );
        let mut o = b"X\r\n".to_vec();
        end_response_head(&mut o, 0, true, false);
        assert_eq!(o, b"X\r\nConnection: keep-alive\r\n\r\n");
    }
}
