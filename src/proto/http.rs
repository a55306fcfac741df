//! HTTP/1.x message heads for the `proxy` service: parsing, framing and
//! the header rewriting a forward proxy does (3proxy's proxy.c header
//! loop; RFC 9110 and RFC 9112).
//!
//! Everything here is pure: bytes in, values (and a rewritten head in a
//! caller's buffer) out. The service (`services::proxy`) does the IO.
//!
//! Invariants:
//! - A request whose body length could be read two ways (Content-Length
//!   and Transfer-Encoding, differing Content-Lengths, a Transfer-Encoding
//!   that does not end in `chunked`, obs-fold) is refused, never guessed:
//!   the proxy and the origin must always agree where a request ends, or a
//!   second request could be hidden inside the first's body and bypass the
//!   ACL (request smuggling).
//! - Hop-by-hop fields never cross the proxy: `Connection` and every field
//!   it names, `Proxy-Connection`, `Keep-Alive`, `TE`, `Trailer`, `Upgrade`
//!   (unless upgrading), `Proxy-Authorization`.
//! - Chunked bodies are relayed as they are; [`ChunkScanner`] only finds
//!   where they end.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Most header fields accepted in one head; more gives 431.
pub const MAX_HEADERS: usize = 100;

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

/// Why a head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Not a well-formed HTTP/1.x head (bad line, bad field, obs-fold).
    Syntax,
    /// More than [`MAX_HEADERS`] fields.
    TooMany,
    /// The body length is ambiguous or invalid (CL with TE, differing
    /// CLs, TE not ending in chunked, TE in HTTP/1.0).
    Framing,
    /// No usable destination: bad authority, missing or repeated Host.
    Target,
    /// An absolute URI with a scheme other than `http` or `ftp`
    /// (https://, ...).
    Scheme,
    /// Credentials in the authority that do not split into a login and a
    /// host (3proxy's 100: nothing before or after the delimiter).
    Login,
}

/// A parsed request head. Strings borrow the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    /// The request target as the client sent it.
    pub uri: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// Destination host, without IPv6 brackets (decoded when the
    /// authority carried credentials).
    pub host: std::borrow::Cow<'a, str>,
    pub port: u16,
    pub framing: Framing,
    /// The client wants the connection kept after this request.
    pub keep_alive: bool,
    /// `Upgrade` asked for (and named in `Connection`).
    pub upgrade: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// The `Proxy-Authorization` value.
    pub proxy_auth: Option<&'a [u8]>,
    /// `Authorization: NTLM|Negotiate`: authentication bound to the
    /// origin connection.
    pub conn_auth: bool,
    /// Credentials from the URI's (or CONNECT target's) authority.
    pub login: UrlLogin,
    /// An `ftp://` URI: the proxy's FTP gateway serves it (3proxy's
    /// proxy.c); `path` is its path, still %-encoded.
    pub ftp: Option<&'a str>,
    /// The `Authorization` field's value: the FTP gateway's login when
    /// the URL has none.
    pub auth: Option<&'a [u8]>,
}

/// What `user:pass@host` in a request's authority said (3proxy's
/// parseconnusername and parseusername).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlLogin {
    /// The proxy login of `puser:ppass:euser:epass@host` (each only when
    /// not empty), for the ACL like `Proxy-Authorization`.
    pub user: Option<String>,
    pub password: Option<String>,
    /// `Basic base64(euser:epass)`: the destination's credentials, sent to
    /// the origin as `Authorization` (to an `http` parent as
    /// `Proxy-Authorization`).
    pub dest_auth: Option<String>,
}

impl RequestHead<'_> {
    pub fn is_connect(&self) -> bool {
        self.method == "CONNECT"
    }
}

/// What the proxy adds to or strips from a forwarded request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rewrite<'a> {
    /// `-a`: also drop the client's `Forwarded`, `X-Forwarded-For`, `Via`.
    pub strip_forwarding: bool,
    /// Fields to add, each ending in CRLF (`Forwarded: ...`).
    pub extra: &'a [u8],
    /// `delimchar`: splits credentials from the host in an authority that
    /// has an `@` (0 is `@`).
    pub delim: u8,
    /// The service asks for users (`needuser` not 0, i.e. no `-u`): an
    /// authority's `puser:ppass:euser:epass` also gives the proxy login.
    pub login: bool,
    /// `transparent`: where a redirected client meant to go. An
    /// origin-form request without `Host` names it as its host.
    pub redirected_to: Option<std::net::SocketAddr>,
}

/// Parse a request head at the start of `buf`. Ok(None) if the head is not
/// complete yet. On success `out` holds the head to send to the origin
/// (origin-form request line, rewritten fields, the blank line); for
/// CONNECT it is left empty.
pub fn parse_request<'a>(
    buf: &'a [u8],
    rw: &Rewrite<'_>,
    out: &mut Vec<u8>,
) -> Result<Option<RequestHead<'a>>, HeadError> {
    let mut hs = [httparse::EMPTY_HEADER; FEW_HEADERS];
    match parse_request_in(buf, rw, out, &mut hs) {
        Err(HeadError::TooMany) => {
            let mut many = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
            parse_request_in(buf, rw, out, &mut many)
        }
        r => r,
    }
}

/// [`parse_request`] with `slots` field slots: for reading again a head
/// this proxy wrote, which may carry a few fields more than
/// [`MAX_HEADERS`] (the Host, forwarding and cfg fields it adds to a
/// client's head of at most that many; the next hop, not this proxy,
/// decides whether it takes them).
pub(crate) fn parse_request_slots<'a>(
    buf: &'a [u8],
    rw: &Rewrite<'_>,
    out: &mut Vec<u8>,
    slots: usize,
) -> Result<Option<RequestHead<'a>>, HeadError> {
    parse_request_in(buf, rw, out, &mut vec![httparse::EMPTY_HEADER; slots])
}

/// [`parse_response`] with `slots` field slots (see
/// [`parse_request_slots`]).
pub(crate) fn parse_response_slots(
    buf: &[u8],
    head_req: bool,
    out: &mut Vec<u8>,
    slots: usize,
) -> Result<Option<ResponseHead>, HeadError> {
    parse_response_in(buf, head_req, out, &mut vec![httparse::EMPTY_HEADER; slots])
}

/// Field slots on the stack for the first try at a head; a head with more
/// fields is parsed again with [`MAX_HEADERS`] slots on the heap. (Every
/// byte of stack a client thread touches stays resident while it lives.)
const FEW_HEADERS: usize = 24;

fn parse_request_in<'a>(
    buf: &'a [u8],
    rw: &Rewrite<'_>,
    out: &mut Vec<u8>,
    hs: &mut [httparse::Header<'a>],
) -> Result<Option<RequestHead<'a>>, HeadError> {
    let mut req = httparse::Request::new(hs);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooMany),
        Err(_) => return Err(HeadError::Syntax),
    };
    let (Some(method), Some(uri), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Syntax);
    };
    let headers: &[httparse::Header<'a>] = req.headers;
    let conn = ConnTokens::of(headers);
    if conn.frames || conn.routes {
        // RFC 9110 section 7.6.1 lets a proxy refuse such a request; the
        // alternatives (dropping the field while framing the body by it,
        // or keeping a field the client declared hop-by-hop) both let the
        // next hop read the body as another request.
        return Err(HeadError::Framing);
    }

    // Where to: CONNECT authority, absolute URI, or origin-form plus Host.
    let mut path = uri;
    let mut ftp = None;
    let absolute;
    let mut login = UrlLogin::default();
    let delim = if rw.delim == 0 { b'@' } else { rw.delim };
    let (host, port) = if method == "CONNECT" {
        absolute = false;
        login_authority(uri, None, delim, rw.login, &mut login)?
    } else if uri.starts_with('/') {
        absolute = false;
        let mut hosts = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"));
        match (hosts.next(), hosts.next(), rw.redirected_to) {
            (Some(h), None, _) => {
                let v = std::str::from_utf8(h.value).map_err(|_| HeadError::Target)?;
                let (h, p) = split_authority(v, Some(80))?;
                (std::borrow::Cow::Borrowed(h), p)
            }
            (None, _, Some(to)) => (std::borrow::Cow::Owned(to.ip().to_string()), to.port()),
            _ => return Err(HeadError::Target),
        }
    } else {
        absolute = true;
        // Byte scans, here and for the authority's end: `str::find` with a
        // string or a char set builds a searcher per call (~450
        // instructions per request for these two).
        let Some(colon) = uri.as_bytes().windows(3).position(|w| w == b"://") else {
            return Err(HeadError::Syntax);
        };
        let is_ftp = uri[..colon].eq_ignore_ascii_case("ftp");
        if !is_ftp && !uri[..colon].eq_ignore_ascii_case("http") {
            return Err(HeadError::Scheme);
        }
        let rest = &uri[colon + 3..];
        // With `delimchar #` a `#` separates credentials from the host, so
        // it cannot end the authority.
        let end = rest
            .bytes()
            .position(|b| b == b'/' || b == b'?' || (b == b'#' && delim != b'#'))
            .unwrap_or(rest.len());
        // A fragment stays with the client: an absolute-URI has none
        // (RFC 9112 section 3.2).
        // (A byte scan: paths are short, and this runs for every request.)
        let path_all = &rest[end..];
        path = match path_all.bytes().position(|b| b == b'#') {
            Some(i) => &path_all[..i],
            None => path_all,
        };
        if is_ftp {
            let p = path.split(['?', '#']).next().unwrap_or("");
            ftp = Some(if p.is_empty() { "/" } else { p });
        }
        let default = if is_ftp { 21 } else { 80 };
        login_authority(&rest[..end], Some(default), delim, rw.login, &mut login)?
    };

    let mut cl: Option<u64> = None;
    let mut cl_fields = 0u32;
    let mut te: Option<&[u8]> = None;
    let mut expect_continue = false;
    let mut proxy_auth = None;
    let mut conn_auth = false;
    let mut auth = None;
    for h in headers {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            cl = Some(merge_length(cl, h.value)?);
            cl_fields += 1;
        } else if n.eq_ignore_ascii_case("transfer-encoding") {
            if te.is_some() {
                // Two TE fields: legal as a list, but nothing sends it;
                // refusing is simpler than merging.
                return Err(HeadError::Framing);
            }
            te = Some(h.value);
        } else if n.eq_ignore_ascii_case("expect") {
            expect_continue = trim(h.value).eq_ignore_ascii_case(b"100-continue");
        } else if n.eq_ignore_ascii_case("proxy-authorization") {
            if proxy_auth.is_some() {
                // Two sets of credentials: which one the ACL would see
                // is a guess, so neither is taken.
                return Err(HeadError::Syntax);
            }
            proxy_auth = Some(h.value);
        } else if n.eq_ignore_ascii_case("authorization") {
            auth = Some(h.value);
            let v = trim(h.value);
            conn_auth |= starts_with_ci(v, b"ntlm") || starts_with_ci(v, b"negotiate");
        }
    }
    let framing = match (te, cl) {
        (Some(_), Some(_)) => return Err(HeadError::Framing),
        (Some(_), None) if version == 0 => return Err(HeadError::Framing),
        (Some(t), None) if ends_in_chunked(t) => Framing::Chunked,
        (Some(_), None) => return Err(HeadError::Framing),
        (None, Some(0)) | (None, None) => Framing::None,
        (None, Some(n)) => Framing::Length(n),
    };
    let keep_alive = if version == 0 {
        conn.keep_alive && !conn.close
    } else {
        !conn.close
    };
    let upgrade = version == 1
        && conn.upgrade
        && headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("upgrade"));

    let head = RequestHead {
        method,
        uri,
        version,
        len,
        host,
        port,
        framing,
        keep_alive,
        upgrade,
        expect_continue,
        proxy_auth,
        conn_auth,
        login,
        ftp,
        auth,
    };
    out.clear();
    if head.is_connect() {
        return Ok(Some(head));
    }
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    if path.is_empty() || path.starts_with('?') {
        out.push(b'/');
    }
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(if version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    if absolute {
        // The URI's authority wins over any Host field (RFC 9112 section
        // 3.2.2).
        put_host(out, &head.host, head.port);
    }
    let mut cl_sent = false;
    for h in headers {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            // Repeats and lists of one value become one field: the next
            // hop must not have to merge them (RFC 9110 section 8.6).
            if let (Some(v), false) = (cl, cl_sent) {
                put_length(out, n, h.value, v, cl_fields);
                cl_sent = true;
            }
            continue;
        }
        if (absolute && n.eq_ignore_ascii_case("host"))
            || is_hop_by_hop(n, false)
            || (n.eq_ignore_ascii_case("upgrade") && !upgrade)
            || conn.names(n)
            || (rw.strip_forwarding && is_forwarding(n))
        {
            continue;
        }
        put_field(out, n.as_bytes(), h.value);
    }
    if upgrade {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    } else if version == 0 {
        // Ask an HTTP/1.0 origin to keep the connection, so it can serve
        // the next request.
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(rw.extra);
    out.extend_from_slice(b"\r\n");
    Ok(Some(head))
}

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

/// Finish a head from [`parse_response`]: the `Connection` field the
/// client needs, then the blank line. For an HTTP/1.1 client that keeps
/// the connection no field is needed.
pub fn end_response_head(out: &mut Vec<u8>, client_version: u8, keep_alive: bool, interim: bool) {
    if !interim {
        if !keep_alive {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if client_version == 0 {
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Where a head ends: the index just past the first empty line (`\n\n` or
/// `\n\r\n`), searching from `from` (pass where the last search stopped,
/// so a slowly arriving head is scanned once).
pub fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    // Only the line ends are looked at, found eight bytes at a time: a
    // byte loop cost ~5 instructions a byte over every head, twice per
    // request.
    let mut at = from.saturating_sub(2);
    while let Some(i) = next_lf(buf, at) {
        match (buf.get(i + 1), buf.get(i + 2)) {
            (Some(b'\n'), _) => return Some(i + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
            _ => {}
        }
        at = i + 1;
    }
    None
}

/// The index of the first LF in `buf` at or after `from`. A word at a
/// time: in `w = word ^ LFs` an LF is a zero byte, and the lowest byte
/// `(w - 0x01..) & !w & 0x80..` marks is the first zero byte (a borrow
/// only marks bytes above a true zero).
fn next_lf(buf: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const LFS: u64 = ONES * b'\n' as u64;
    let mut i = from;
    while let Some(word) = buf.get(i..i + 8) {
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(word);
        let w = u64::from_le_bytes(w8) ^ LFS;
        let m = w.wrapping_sub(ONES) & !w & HIGH;
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    buf.get(i..)?
        .iter()
        .position(|&b| b == b'\n')
        .map(|p| i + p)
}

/// Methods safe to send twice (RFC 9110 section 9.2.2).
pub fn is_idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// `Basic <base64(user:password)>` from a `Proxy-Authorization` value.
pub fn basic_credentials(value: &[u8]) -> Option<(String, String)> {
    let v = trim(value);
    if !starts_with_ci(v, b"basic ") {
        return None;
    }
    let raw = base64_decode(trim(&v[6..]))?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8_lossy(&raw[..colon]).into_owned();
    let pass = String::from_utf8_lossy(&raw[colon + 1..]).into_owned();
    Some((user, pass))
}

/// The standard alphabet, no `=` taken (the caller drops padding) and
/// leftover bits not checked, as the hand-written decoder this replaced.
const B64_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// Standard base64 with optional padding; None on any other byte. Up to
/// two trailing `=` are dropped whatever the last group needs (`YWJj==`
/// is `abc`), as 3proxy's decoder does not check them.
pub(crate) fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let s = match s {
        [rest @ .., b'=', b'='] | [rest @ .., b'='] => rest,
        _ => s,
    };
    B64_LENIENT.decode(s).ok()
}

/// The host and port of an authority (a CONNECT target, or an absolute
/// URI's) and its credentials, as 3proxy reads them: only an authority
/// with an `@` has credentials; it is then percent-decoded whole and split
/// at its last `delim`: the host and port after it, the credentials
/// before it (see [`split_login`]).
fn login_authority<'a>(
    auth: &'a str,
    default: Option<u16>,
    delim: u8,
    want_login: bool,
    login: &mut UrlLogin,
) -> Result<(std::borrow::Cow<'a, str>, u16), HeadError> {
    if !auth.as_bytes().contains(&b'@') {
        let (h, p) = split_authority(auth, default)?;
        return Ok((std::borrow::Cow::Borrowed(h), p));
    }
    let decoded = decode_url(auth.as_bytes());
    let at = decoded
        .iter()
        .rposition(|&b| b == delim)
        .ok_or(HeadError::Login)?;
    let (creds, hostport) = (&decoded[..at], &decoded[at + 1..]);
    if creds.is_empty() || hostport.is_empty() {
        return Err(HeadError::Login);
    }
    let hostport = std::str::from_utf8(hostport).map_err(|_| HeadError::Target)?;
    let (h, p) = split_authority(hostport, default)?;
    *login = split_login(creds, want_login);
    Ok((std::borrow::Cow::Owned(h.to_string()), p))
}

/// 3proxy's decodeurl for an authority: `%XX` decoded (CR and LF dropped,
/// `"` and `\` escaped with a `\`, 0xFF doubled, and NUL ending the
/// string), `+` a space, a `%` without two hex digits kept, and nothing
/// from a `?` on.
fn decode_url(s: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let pair = s
            .get(i + 1)
            .and_then(|&a| hex(a))
            .zip(s.get(i + 2).and_then(|&b| hex(b)));
        match (c, pair) {
            (b'%', Some((a, b))) => {
                let u = a << 4 | b;
                match u {
                    0 => break,
                    b'\r' | b'\n' => {}
                    b'"' | b'\\' => d.extend_from_slice(&[b'\\', u]),
                    255 => d.extend_from_slice(&[255, 255]),
                    _ => d.push(u),
                }
                i += 3;
                continue;
            }
            (b'?', _) | (0, _) => break,
            (b'+', _) => d.push(b' '),
            _ => d.push(c),
        }
        i += 1;
    }
    d
}

/// The credentials before the delimiter (3proxy's parseusername): with
/// `want_login` and at least three colons, `puser:ppass:euser:epass` (an
/// empty puser or ppass is left unset); otherwise `euser[:epass]`. The
/// destination's user and password are cut to 128 bytes each, as 3proxy
/// does.
fn split_login(creds: &[u8], want_login: bool) -> UrlLogin {
    let colon = |from: usize| {
        creds[from..]
            .iter()
            .position(|&b| b == b':')
            .map(|i| from + i)
    };
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut login = UrlLogin::default();
    let mut rest = creds;
    if want_login {
        if let Some(a) = colon(0) {
            if let Some(b) = colon(a + 1) {
                if colon(b + 1).is_some() {
                    if b > a + 1 {
                        login.password = Some(lossy(&creds[a + 1..b]));
                    }
                    if a > 0 {
                        login.user = Some(lossy(&creds[..a]));
                    }
                    rest = &creds[b + 1..];
                }
            }
        }
    }
    let (user, pass): (&[u8], &[u8]) = match rest.iter().position(|&b| b == b':') {
        Some(c) => (&rest[..c], &rest[c + 1..]),
        None => (rest, b""),
    };
    let mut raw = Vec::with_capacity(user.len() + pass.len() + 1);
    raw.extend_from_slice(&user[..user.len().min(128)]);
    raw.push(b':');
    raw.extend_from_slice(&pass[..pass.len().min(128)]);
    login.dest_auth = Some(format!("Basic {}", base64_encode(&raw)));
    login
}

/// Standard base64 with padding.
pub(crate) fn base64_encode(raw: &[u8]) -> String {
    STANDARD.encode(raw)
}

/// `head` (from [`parse_request`]) with the field `name: value` added
/// before its blank line, into `out`.
pub fn with_field(head: &[u8], name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let end = head.len().saturating_sub(2);
    out.extend_from_slice(&head[..end]);
    put_field(out, name, value);
    out.extend_from_slice(b"\r\n");
}

/// Split `host[:port]` (IPv6 in brackets). `default` None: the port is
/// required (CONNECT).
fn split_authority(s: &str, default: Option<u16>) -> Result<(&str, u16), HeadError> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let close = rest.find(']').ok_or(HeadError::Target)?;
        let host = &rest[..close];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(HeadError::Target);
        }
        match &rest[close + 1..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or(HeadError::Target)?)),
        }
    } else {
        // Byte search: ':' is ASCII, so both halves stay valid str.
        match s.bytes().rposition(|b| b == b':') {
            Some(i) => (&s[..i], Some(&s[i + 1..])),
            None => (s, None),
        }
    };
    let mut colon = false;
    let mut valid = |b: u8| {
        colon |= b == b':';
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':')
    };
    if host.is_empty() || !host.bytes().all(&mut valid) {
        return Err(HeadError::Target);
    }
    // A colon in a host only ever belongs to an IPv6 address (which is
    // sent on in brackets).
    if colon && host.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(HeadError::Target);
    }
    let port = match (port, default) {
        (Some(p), _) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            // Five digits at most: no overflow in a u32.
            let n = p.bytes().fold(0u32, |a, d| a * 10 + u32::from(d - b'0'));
            u16::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or(HeadError::Target)?
        }
        (None, Some(d)) | (Some(""), Some(d)) => d,
        _ => return Err(HeadError::Target),
    };
    Ok((host, port))
}

fn put_host(out: &mut Vec<u8>, host: &str, port: u16) {
    out.extend_from_slice(b"Host: ");
    put_authority(out, host, port, 80);
    out.extend_from_slice(b"\r\n");
}

/// `host:port` (IPv6 in brackets); the port is left out when it is
/// `default`.
pub fn put_authority(out: &mut Vec<u8>, host: &str, port: u16, default: u16) {
    let v6 = host.contains(':');
    if v6 {
        out.push(b'[');
    }
    out.extend_from_slice(host.as_bytes());
    if v6 {
        out.push(b']');
    }
    if port != default {
        out.push(b':');
        let mut digits = [0u8; 20];
        out.extend_from_slice(crate::addr::decimal(u64::from(port), &mut digits));
    }
}

/// A head from [`parse_request`] (origin form) in absolute form, for an
/// HTTP parent proxy: `GET http://host[:port]/path HTTP/1.1`, and with
/// `auth` a `Proxy-Authorization` field for that parent. Into `out`.
pub fn absolute_form(head: &[u8], host: &str, port: u16, auth: Option<&str>, out: &mut Vec<u8>) {
    out.clear();
    let sp = head.iter().position(|&b| b == b' ').unwrap_or(0);
    out.extend_from_slice(&head[..sp]);
    out.extend_from_slice(b" http://");
    put_authority(out, host, port, 80);
    // The path, the version and every field; the blank line comes last.
    let end = head.len().saturating_sub(2).max(sp);
    out.extend_from_slice(&head[(sp + 1).min(end)..end]);
    if let Some(a) = auth {
        put_field(out, b"Proxy-Authorization", a.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The one Content-Length field to pass on, for the value `n` merged
/// from `fields` fields: the field as it came when it was the only one
/// and plain digits (the usual case: no formatting), else `N` written
/// anew.
fn put_length(out: &mut Vec<u8>, name: &str, value: &[u8], n: u64, fields: u32) {
    if fields == 1 && !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        put_field(out, name.as_bytes(), value);
        return;
    }
    out.extend_from_slice(b"Content-Length: ");
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut v = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// A Content-Length value merged with the ones seen before: a list or
/// repeats of one number are that number; anything else is an error.
fn merge_length(prev: Option<u64>, value: &[u8]) -> Result<u64, HeadError> {
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
fn ends_in_chunked(v: &[u8]) -> bool {
    v.rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"))
}

/// Fields that describe one connection, not the message.
fn is_hop_by_hop(name: &str, response: bool) -> bool {
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

fn is_forwarding(name: &str) -> bool {
    ["forwarded", "x-forwarded-for", "via"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

/// What the `Connection` (and `Proxy-Connection`) fields say.
struct ConnTokens<'a> {
    close: bool,
    keep_alive: bool,
    upgrade: bool,
    /// A `Connection` field names `Content-Length` or `Transfer-Encoding`:
    /// dropping the named field (as hop-by-hop) would change where the
    /// message ends for the next hop, so the message is refused.
    frames: bool,
    /// A `Connection` field names `Host` or `Expect`, which route the
    /// request or decide when its body is sent (refused in requests).
    routes: bool,
    /// The values of the `Connection` fields, to find other named fields.
    lists: [Option<&'a [u8]>; 4],
}

impl<'a> ConnTokens<'a> {
    fn of(headers: &[httparse::Header<'a>]) -> ConnTokens<'a> {
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
    fn names(&self, name: &str) -> bool {
        self.lists.iter().flatten().any(|l| {
            l.split(|&b| b == b',').any(|tok| {
                let tok = trim(tok);
                !tok.eq_ignore_ascii_case(b"upgrade") && tok.eq_ignore_ascii_case(name.as_bytes())
            })
        })
    }
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(s, |i| i + 1);
    &v[s..e.max(s)]
}

fn starts_with_ci(v: &[u8], prefix: &[u8]) -> bool {
    v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix)
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

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// base64 of `user:password`, for `Proxy-Authorization: Basic`.
pub fn basic_auth(user: &str, password: &str) -> String {
    crate::proto::http::base64_encode(format!("{user}:{password}").as_bytes())
}

// --- The client side: an HTTP CONNECT parent ------------------------------

use super::send;
use crate::net::Stream;
use crate::proto::socks::Dest;
use crate::res::Res;
use std::io::Read;

/// `CONNECT host:port HTTP/1.0`; any 2xx status is success.
pub fn client_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
) -> Result<(), Res> {
    let target = match dest {
        Dest::Name(n, p) if n.contains(':') => format!("[{n}]:{p}"),
        Dest::Name(n, p) => format!("{n}:{p}"),
        Dest::Addr(a) => a.to_string(),
    };
    let mut req = format!("CONNECT {target} HTTP/1.0\r\nConnection: keep-alive\r\n");
    if let Some((u, p)) = creds {
        req.push_str(&format!(
            "Proxy-Authorization: Basic {}\r\n",
            basic_auth(u, p)
        ));
    }
    req.push_str("\r\n");
    send(s, req.as_bytes(), Res::PARENT_CONNECT_SEND)?;
    // Byte by byte: what follows the header belongs to the tunnel.
    let status = read_line(s, Res::PARENT_CONNECT_REPLY)?;
    if status.len() < 12 || !status.starts_with(b"HTTP/") {
        return Err(Res::PARENT_CONNECT_REPLY);
    }
    if status[9] != b'2' {
        return Err(Res::PARENT_CONNECT_REFUSED);
    }
    let mut total = status.len();
    loop {
        let line = read_line(s, Res::PARENT_CONNECT_HEAD)?;
        total += line.len();
        if line.is_empty() {
            return Ok(());
        }
        if total > MAX_REPLY_HEAD {
            return Err(Res::PARENT_CONNECT_HEAD);
        }
    }
}

/// The most a CONNECT parent may send before its blank line.
const MAX_REPLY_HEAD: usize = 16 * 1024;

/// One line without its CR LF; `code` on EOF, error or a line too long.
fn read_line(mut s: &Stream, code: Res) -> Result<Vec<u8>, Res> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(1) if b[0] == b'\n' => {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            Ok(1) if line.len() < MAX_REPLY_HEAD => line.push(b[0]),
            _ => return Err(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirected_origin_form_may_lack_host() {
        let mut rw = Rewrite::default();
        let mut out = Vec::new();
        let head = b"GET /x HTTP/1.0\r\n\r\n";
        assert_eq!(
            parse_request(head, &rw, &mut out).unwrap_err(),
            HeadError::Target
        );
        rw.redirected_to = Some("10.1.2.3:8080".parse().unwrap());
        let h = parse_request(head, &rw, &mut out).unwrap().unwrap();
        assert_eq!((&*h.host, h.port), ("10.1.2.3", 8080));
        // A Host the client sent names the destination for the ACL.
        let h = parse_request(b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n", &rw, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.port), ("a.test", 80));
    }

    fn req(text: &str) -> Result<Option<(RequestHead<'_>, String)>, HeadError> {
        let rw = Rewrite {
            strip_forwarding: false,
            extra: b"Forwarded: for=x\r\n",
            delim: b'@',
            login: true,
            redirected_to: None,
        };
        let mut out = Vec::new();
        let h = parse_request(text.as_bytes(), &rw, &mut out)?;
        Ok(h.map(|h| (h, String::from_utf8(out).unwrap())))
    }

    /// The rewritten head of a complete, valid request.
    fn fwd(text: &str) -> String {
        req(text).unwrap().unwrap().1
    }

    fn err(text: &str) -> HeadError {
        req(text).unwrap_err()
    }

    /// Found by the http_request fuzz target: a fragment right after the
    /// authority became the whole request target (`GET #frag`), which
    /// no origin can read.
    #[test]
    fn an_absolute_uri_loses_its_fragment() {
        assert_eq!(
            fwd("GET http://h#frag HTTP/1.1\r\n\r\n"),
            "GET / HTTP/1.1\r\nHost: h\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(
            fwd("GET http://h/a?b#c/d HTTP/1.1\r\n\r\n"),
            "GET /a?b HTTP/1.1\r\nHost: h\r\nForwarded: for=x\r\n\r\n"
        );
        let (h, out) = req("GET ftp://u:p@h#x/pub/ HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.ftp), ("h", Some("/")));
        assert!(out.starts_with("GET / HTTP/1.1\r\n"), "{out}");
    }

    #[test]
    fn absolute_form_becomes_origin_form() {
        assert_eq!(
            fwd("GET http://example.org/a?b HTTP/1.1\r\nHost: other\r\nAccept: */*\r\n\r\n"),
            "GET /a?b HTTP/1.1\r\nHost: example.org\r\nAccept: */*\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(
            fwd("GET http://h:8080 HTTP/1.1\r\n\r\n"),
            "GET / HTTP/1.1\r\nHost: h:8080\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(
            fwd("GET http://h?q HTTP/1.1\r\n\r\n"),
            "GET /?q HTTP/1.1\r\nHost: h\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(
            fwd("GET http://u:p@h/ HTTP/1.0\r\n\r\n"),
            "GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\nForwarded: for=x\r\n\r\n"
        );
        let (h, _) = req("GET HTTP://[::1]:81/x HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.port), ("::1", 81));
        assert_eq!(
            fwd("GET http://[::1]/ HTTP/1.1\r\n\r\n"),
            "GET / HTTP/1.1\r\nHost: [::1]\r\nForwarded: for=x\r\n\r\n"
        );
    }

    /// Host, port and login of a request parsed with `delim` and `login`.
    fn login_of(text: &str, delim: u8, login: bool) -> Result<(String, u16, UrlLogin), HeadError> {
        let rw = Rewrite {
            delim,
            login,
            ..Rewrite::default()
        };
        let mut out = Vec::new();
        let h = parse_request(text.as_bytes(), &rw, &mut out)?.unwrap();
        let first = String::from_utf8(out).unwrap();
        assert!(!first.contains('@') || delim != b'@', "{first}");
        Ok((h.host.into_owned(), h.port, h.login))
    }

    fn basic(s: &str) -> Option<String> {
        Some(format!("Basic {}", base64_encode(s.as_bytes())))
    }

    #[test]
    fn credentials_in_the_authority() {
        let get = |uri: &str| format!("GET {uri} HTTP/1.1\r\n\r\n");
        let ok = |uri: &str, login: bool| login_of(&get(uri), b'@', login).unwrap();
        // user:pass@host: the destination's credentials only.
        let (h, p, l) = ok("http://alice:secret@h:81/x", true);
        assert_eq!((h.as_str(), p), ("h", 81));
        assert_eq!((l.user, l.password), (None, None));
        assert_eq!(l.dest_auth, basic("alice:secret"));
        assert_eq!(
            fwd("GET http://alice:secret@h:81/x HTTP/1.1\r\n\r\n"),
            "GET /x HTTP/1.1\r\nHost: h:81\r\nForwarded: for=x\r\n\r\n"
        );
        // Three colons: the proxy login too, unless the service never asks
        // for users (-u).
        let l = ok("http://pu:pp:eu:ep@h/", true).2;
        assert_eq!(
            (l.user.as_deref(), l.password.as_deref()),
            (Some("pu"), Some("pp"))
        );
        assert_eq!(l.dest_auth, basic("eu:ep"));
        let l = ok("http://pu:pp:eu:ep:more@h/", true).2;
        assert_eq!(l.dest_auth, basic("eu:ep:more"));
        let l = ok("http://pu:pp:eu:ep@h/", false).2;
        assert_eq!((l.user, l.password), (None, None));
        assert_eq!(l.dest_auth, basic("pu:pp:eu:ep"));
        // Two colons are not the login form.
        let l = ok("http://a:b:c@h/", true).2;
        assert_eq!((l.user, l.dest_auth), (None, basic("a:b:c")));
        // Empty parts: an empty puser or ppass is left unset.
        let l = ok("http://:pp:eu:ep@h/", true).2;
        assert_eq!((l.user, l.password.as_deref()), (None, Some("pp")));
        let l = ok("http://pu:::@h/", true).2;
        assert_eq!((l.user.as_deref(), l.password), (Some("pu"), None));
        assert_eq!(l.dest_auth, basic(":"));
        assert_eq!(ok("http://alice@h/", true).2.dest_auth, basic("alice:"));
        assert_eq!(ok("http://:pw@h/", true).2.dest_auth, basic(":pw"));
        // Decoded before the split, at the last delimiter.
        let l = ok("http://a%40b.c:p%3Ax@d@h/", true).2;
        assert_eq!(l.dest_auth, basic("a@b.c:p:x@d"));
        assert_eq!(
            ok("http://u:a+b%20c@h/", true).2.dest_auth,
            basic("u:a b c")
        );
        assert_eq!(ok("http://u:%zz%4@h/", true).2.dest_auth, basic("u:%zz%4"));
        assert_eq!(ok("http://u:a%0d%0Ab@h/", true).2.dest_auth, basic("u:ab"));
        assert_eq!(
            ok("http://u:%22%5c@h/", true).2.dest_auth,
            basic("u:\\\"\\\\")
        );
        let (h, _, _) = ok("http://u:p@%31%32%37.0.0.1/", true);
        assert_eq!(h, "127.0.0.1");
        // 128 bytes each at most.
        let long = "x".repeat(200);
        let l = ok(&format!("http://{long}:{long}@h/"), true).2;
        let cut = "x".repeat(128);
        assert_eq!(l.dest_auth, basic(&format!("{cut}:{cut}")));
        // Nothing before or after the delimiter, or none left after
        // decoding (a NUL ends the string): 3proxy's 100.
        let bad = |uri: &str| login_of(&get(uri), b'@', true).unwrap_err();
        assert_eq!(bad("http://@h/"), HeadError::Login);
        assert_eq!(bad("http://u:p@/"), HeadError::Login);
        assert_eq!(bad("http://u%00:p@h/"), HeadError::Login);
        assert_eq!(bad("http://u:p%00@h/"), HeadError::Login);
        assert_eq!(ok("http://u:p@h%00junk/", true).0, "h");
        assert_eq!(bad("http://u:p@h:0/"), HeadError::Target);
        assert_eq!(bad("http://u:p@a b/"), HeadError::Syntax);
        assert_eq!(bad("http://u:p@%ff/"), HeadError::Target);
        // Another delimiter: `@` still has to be there for credentials to
        // be looked for, and then the split is at the last `#`.
        let l = login_of(&get("http://a@b.c:p#h:82/x"), b'#', true).unwrap();
        assert_eq!((l.0.as_str(), l.1), ("h", 82));
        assert_eq!(l.2.dest_auth, basic("a@b.c:p"));
        assert_eq!(
            login_of(&get("http://u:p@h/"), b'#', true).unwrap_err(),
            HeadError::Login
        );
        let l = login_of(&get("http://h/#frag"), b'#', true).unwrap();
        assert_eq!((l.0.as_str(), l.2), ("h", UrlLogin::default()));
        // CONNECT's target too.
        let l = login_of("CONNECT pu:pp:eu:ep@h:443 HTTP/1.1\r\n\r\n", b'@', true).unwrap();
        assert_eq!(
            (l.0.as_str(), l.1, l.2.user.as_deref()),
            ("h", 443, Some("pu"))
        );
        assert_eq!(l.2.dest_auth, basic("eu:ep"));
        // Adding the field to a rewritten head.
        let mut out = Vec::new();
        with_field(
            b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"Authorization",
            b"Basic x",
            &mut out,
        );
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Basic x\r\n\r\n"
        );
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(
            base64_decode(base64_encode(&[0, 255, 7, 9]).as_bytes()),
            Some(vec![0, 255, 7, 9])
        );
    }

    #[test]
    fn absolute_form_for_an_http_parent() {
        let head = fwd("GET http://h:8080/a?b HTTP/1.1\r\nAccept: */*\r\n\r\n");
        let mut out = Vec::new();
        absolute_form(head.as_bytes(), "h", 8080, Some("Basic eDp5"), &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "GET http://h:8080/a?b HTTP/1.1\r\nHost: h:8080\r\nAccept: */*\r\n\
            Forwarded: for=x\r\nProxy-Authorization: Basic eDp5\r\n\r\n"
        );
        let head = fwd("POST /x HTTP/1.0\r\nHost: [::1]\r\n\r\n");
        absolute_form(head.as_bytes(), "::1", 80, None, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST http://[::1]/x HTTP/1.0\r\nHost: [::1]\r\nConnection: keep-alive\r\n\
            Forwarded: for=x\r\n\r\n"
        );
        let mut a = Vec::new();
        put_authority(&mut a, "h", 65535, 80);
        put_authority(&mut a, "h", 1, 80);
        put_authority(&mut a, "h", 80, 80);
        assert_eq!(a, b"h:65535h:1h");
    }

    #[test]
    fn origin_form_uses_host() {
        let (h, out) = req("POST /x HTTP/1.1\r\nHost: a.b:99\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap()
            .unwrap();
        assert_eq!(
            (&*h.host, h.port, h.framing, h.len),
            ("a.b", 99, Framing::Length(3), 53)
        );
        assert_eq!(
            out,
            "POST /x HTTP/1.1\r\nHost: a.b:99\r\nContent-Length: 3\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(err("GET / HTTP/1.1\r\n\r\n"), HeadError::Target);
        assert_eq!(
            err("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            HeadError::Target
        );
        assert_eq!(
            err("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
            HeadError::Target
        );
    }

    #[test]
    fn connect_takes_an_authority() {
        let (h, out) = req("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.is_connect());
        assert_eq!((&*h.host, h.port), ("h", 443));
        assert_eq!(out, "");
        let (h, _) = req("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.host, "2001:db8::1");
        assert_eq!(err("CONNECT h HTTP/1.1\r\n\r\n"), HeadError::Target);
        assert_eq!(err("CONNECT h:0 HTTP/1.1\r\n\r\n"), HeadError::Target);
        assert_eq!(err("CONNECT h:70000 HTTP/1.1\r\n\r\n"), HeadError::Target);
        assert_eq!(err("CONNECT [zz]:1 HTTP/1.1\r\n\r\n"), HeadError::Target);
    }

    /// Found by the http_request fuzz target: a host with a colon that is
    /// no IPv6 address (`a:b` of `http://a:b:80/`) was taken, and sent on
    /// in brackets as if it were one (`Host: [a:b]`).
    #[test]
    fn a_host_with_colons_must_be_an_ipv6_address() {
        assert_eq!(
            err("GET http://a:b:80/ HTTP/1.1\r\n\r\n"),
            HeadError::Target
        );
        assert_eq!(err("CONNECT a:b:443 HTTP/1.1\r\n\r\n"), HeadError::Target);
        assert_eq!(
            err("GET / HTTP/1.1\r\nHost: x:y:80\r\n\r\n"),
            HeadError::Target
        );
    }

    #[test]
    fn other_schemes_and_garbage() {
        assert_eq!(err("GET https://h/ HTTP/1.1\r\n\r\n"), HeadError::Scheme);
        assert_eq!(err("GET gopher://h/ HTTP/1.1\r\n\r\n"), HeadError::Scheme);
        let (h, _) = req("GET ftp://u:p@h/a%20b/?x HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.port, h.ftp), ("h", 21, Some("/a%20b/")));
        let (h, _) = req("GET FTP://h:2121 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.port, h.ftp), (2121, Some("/")));
        assert_eq!(err("GET h/ HTTP/1.1\r\n\r\n"), HeadError::Syntax);
        assert_eq!(err("hello\r\n\r\n"), HeadError::Syntax);
        assert_eq!(err("GET http://h/ HTTP/2.0\r\n\r\n"), HeadError::Syntax);
        assert!(req("GET http://h/ HTTP/1.1\r\nHost: h\r\n")
            .unwrap()
            .is_none());
    }

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
    fn many_fields_are_fine_up_to_the_limit() {
        let many: String = (0..MAX_HEADERS - 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let out = fwd(&format!("GET http://h/ HTTP/1.1\r\n{many}\r\n"));
        assert!(out.contains("X-98: v\r\n"), "{out}");
        let mut o = Vec::new();
        let h = parse_response(
            format!("HTTP/1.1 200 OK\r\n{many}Content-Length: 1\r\n\r\n").as_bytes(),
            false,
            &mut o,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Length(1));
        assert!(String::from_utf8(o).unwrap().contains("X-98: v\r\n"));
    }

    #[test]
    fn too_many_fields() {
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            err(&format!("GET http://h/ HTTP/1.1\r\n{many}\r\n")),
            HeadError::TooMany
        );
    }

    #[test]
    fn hop_by_hop_fields_are_dropped() {
        let out = fwd(
            "GET http://h/ HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
            Keep-Alive: 5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X\r\n\
            Upgrade: foo\r\nProxy-Authorization: Basic eDp5\r\nX-Kept: 2\r\n\r\n",
        );
        assert_eq!(
            out,
            "GET / HTTP/1.1\r\nHost: h\r\nX-Kept: 2\r\nForwarded: for=x\r\n\r\n"
        );
    }

    #[test]
    fn a_client_that_closes_does_not_close_the_origin_connection() {
        // Connection is hop-by-hop: the client's close ends the client's
        // connection; the origin's is the proxy's to keep (for the pool).
        assert_eq!(
            fwd("GET http://h/ HTTP/1.1\r\nConnection: close\r\n\r\n"),
            "GET / HTTP/1.1\r\nHost: h\r\nForwarded: for=x\r\n\r\n"
        );
        assert_eq!(
            fwd("GET http://h/ HTTP/1.0\r\nConnection: close\r\n\r\n"),
            "GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\nForwarded: for=x\r\n\r\n"
        );
    }

    #[test]
    fn upgrade_passes_when_asked_for() {
        let (h, out) = req("GET http://h/ws HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.upgrade);
        assert_eq!(out, "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: upgrade\r\nForwarded: for=x\r\n\r\n");
    }

    #[test]
    fn anonymous_strips_forwarding_fields() {
        let rw = Rewrite {
            strip_forwarding: true,
            extra: b"",
            ..Rewrite::default()
        };
        let mut out = Vec::new();
        let t = b"GET http://h/ HTTP/1.1\r\nVia: 1.1 x\r\nX-Forwarded-For: 1.2.3.4\r\nForwarded: for=y\r\nA: b\r\n\r\n";
        parse_request(t, &rw, &mut out).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nHost: h\r\nA: b\r\n\r\n"
        );
    }

    #[test]
    fn keep_alive_by_version_and_fields() {
        let ka = |t: &str| req(t).unwrap().unwrap().0.keep_alive;
        assert!(ka("GET http://h/ HTTP/1.1\r\n\r\n"));
        assert!(!ka("GET http://h/ HTTP/1.1\r\nConnection: close\r\n\r\n"));
        assert!(!ka(
            "GET http://h/ HTTP/1.1\r\nProxy-Connection: close\r\n\r\n"
        ));
        assert!(!ka("GET http://h/ HTTP/1.0\r\n\r\n"));
        assert!(ka(
            "GET http://h/ HTTP/1.0\r\nProxy-Connection: Keep-Alive\r\n\r\n"
        ));
    }

    #[test]
    fn expect_and_auth_fields() {
        let (h, _) = req(
            "PUT http://h/ HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\
            Proxy-Authorization: Basic dTpw\r\nAuthorization: NTLM abc\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(h.expect_continue && h.conn_auth);
        assert_eq!(h.proxy_auth, Some(&b"Basic dTpw"[..]));
    }

    fn resp(text: &str, head_req: bool) -> (ResponseHead, String) {
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

    #[test]
    fn head_end() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nX", 0), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\nX", 0), Some(16));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r", 0), None);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n", 17), Some(18));
        // Every position of the LFs against the eight-byte words.
        for pad in 0..20 {
            let mut b = vec![b'a'; pad];
            b.extend_from_slice(b"\r\nX: y\r\n\r\nrest");
            assert_eq!(find_head_end(&b, 0), Some(pad + 10), "pad {pad}");
            let mut b = vec![b'a'; pad];
            b.extend_from_slice(b"\n\n");
            assert_eq!(find_head_end(&b, 0), Some(pad + 2), "pad {pad}");
            assert_eq!(find_head_end(&b[..pad + 1], 0), None, "pad {pad}");
            let bytes: Vec<u8> = (0..=255u8).filter(|&c| c != b'\n').collect();
            assert_eq!(next_lf(&bytes, 0), None);
            let mut with = bytes.clone();
            with.insert(pad * 7, b'\n');
            assert_eq!(next_lf(&with, 0), Some(pad * 7));
            assert_eq!(next_lf(&with, pad * 7 + 1), None);
        }
    }

    #[test]
    fn basic_auth() {
        assert_eq!(
            basic_credentials(b"Basic dTpwOng="),
            Some(("u".into(), "p:x".into()))
        );
        assert_eq!(
            basic_credentials(b"basic   dXNlcjpwYXNz"),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(basic_credentials(b"Basic dXNlcg=="), None);
        assert_eq!(basic_credentials(b"Bearer x"), None);
        assert_eq!(basic_credentials(b"Basic *"), None);
        assert_eq!(base64_decode(b"YQ==").unwrap(), b"a");
        assert_eq!(base64_decode(b"YWI=").unwrap(), b"ab");
        assert_eq!(base64_decode(b"YWJj").unwrap(), b"abc");
        assert_eq!(base64_decode(b"Y"), None);
    }

    /// What the Basic (and SMTP AUTH) decoder takes: the standard
    /// alphabet; up to two trailing `=` dropped whatever the group needs;
    /// leftover bits need not be zero; nothing else (no whitespace, no
    /// URL-safe alphabet, no `=` left inside).
    #[test]
    fn base64_decode_accepts_and_refuses() {
        let ok: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"=", b""),
            (b"==", b""),
            (b"YQ==", b"a"),
            (b"YQ=", b"a"),
            (b"YQ", b"a"),
            (b"YR", b"a"),
            (b"YWI=", b"ab"),
            (b"YWI", b"ab"),
            (b"YWI==", b"ab"),
            (b"YWJj", b"abc"),
            (b"YWJj=", b"abc"),
            (b"YWJj==", b"abc"),
            (b"+/8=", &[0xfb, 0xff]),
            (b"dXNlcjpwYXNz", b"user:pass"),
        ];
        for (enc, dec) in ok {
            assert_eq!(base64_decode(enc).as_deref(), Some(*dec), "{enc:?}");
        }
        let refused: &[&[u8]] = &[
            b"Y",
            b"YWJjZ",
            b"YQ===",
            b"YQ==YQ==",
            b"Y=Q=",
            b"Y Q==",
            b"YQ==\n",
            b" YQ==",
            b"YQ-_",
            b"*",
            b"\xffYQ",
        ];
        for enc in refused {
            assert_eq!(base64_decode(enc), None, "{enc:?}");
        }
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(b"abc"), "YWJj");
        assert_eq!(base64_encode(&[0xfb, 0xff]), "+/8=");
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

    #[test]
    fn two_proxy_authorizations_are_refused() {
        let t = "GET http://h/ HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\nProxy-Authorization: Basic dTpw\r\n\r\n";
        assert_eq!(err(t), HeadError::Syntax);
    }

    #[test]
    fn basic_auth_is_base64_of_user_and_password() {
        assert_eq!(
            super::basic_auth("Aladdin", "open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(super::basic_auth("a", ""), "YTo=");
        assert_eq!(super::basic_auth("ab", "c"), "YWI6Yw==");
        assert_eq!(super::basic_auth("", "ab"), "OmFi");
    }
}
