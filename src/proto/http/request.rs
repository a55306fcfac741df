//! Request heads: what the proxy reads from one (destination, framing,
//! credentials), the [`Rewrite`] it applies, and the origin-form head it
//! sends on.

use super::fields::{base64_encode, put_field, put_host, put_length};
use super::framing::{ends_in_chunked, hex, is_hop_by_hop, merge_length, ConnTokens, Framing};
use super::head::{trim, HeadError, FEW_HEADERS, MAX_HEADERS};
use crate::proto::starts_ci;

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
    let to = destination(method, uri, headers, rw)?;
    let f = Fields::of(headers)?;
    let framing = body_framing(f.te, f.cl, version)?;
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
        host: to.host,
        port: to.port,
        framing,
        keep_alive,
        upgrade,
        expect_continue: f.expect_continue,
        proxy_auth: f.proxy_auth,
        conn_auth: f.conn_auth,
        login: to.login,
        ftp: to.ftp,
        auth: f.auth,
    };
    out.clear();
    if head.is_connect() {
        return Ok(Some(head));
    }
    put_request_line(out, method, to.path, version);
    if to.absolute || (to.no_host && version == 1) {
        // The URI's authority wins over any Host field (RFC 9112 section
        // 3.2.2). An HTTP/1.1 request must have a Host (section 3.2): a
        // redirected client's without one names where it meant to go.
        // (3proxy forwards it without; an HTTP/1.0 head is left as sent.)
        put_host(out, &head.host, head.port);
    }
    put_fields(out, headers, &conn, &f, to.absolute, upgrade, rw);
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

/// Where a request goes, as its target (and `Host`) names it.
struct Destination<'a> {
    host: std::borrow::Cow<'a, str>,
    port: u16,
    /// The path and query to send in the origin-form request line.
    path: &'a str,
    /// The target is an absolute URI: its authority is the `Host` sent.
    absolute: bool,
    /// An origin-form request without `Host` from a redirected client:
    /// the host is where the client meant to go.
    no_host: bool,
    /// An `ftp://` URI's path ([`RequestHead::ftp`]).
    ftp: Option<&'a str>,
    login: UrlLogin,
}

/// The destination of a request: a CONNECT's authority, an origin-form
/// request's `Host` (or, without one, where a redirected client meant to
/// go), or an absolute URI's authority.
fn destination<'a>(
    method: &str,
    uri: &'a str,
    headers: &[httparse::Header<'a>],
    rw: &Rewrite<'_>,
) -> Result<Destination<'a>, HeadError> {
    let mut login = UrlLogin::default();
    let delim = if rw.delim == 0 { b'@' } else { rw.delim };
    let mut no_host = false;
    let (host, port) = if method == "CONNECT" {
        login_authority(uri, None, delim, rw.login, &mut login)?
    } else if uri.starts_with('/') {
        let mut hosts = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"));
        match (hosts.next(), hosts.next(), rw.redirected_to) {
            (Some(h), None, _) => {
                let v = std::str::from_utf8(h.value).map_err(|_| HeadError::Target)?;
                let (h, p) = split_authority(v, Some(80))?;
                (std::borrow::Cow::Borrowed(h), p)
            }
            (None, _, Some(to)) => {
                no_host = true;
                (std::borrow::Cow::Owned(to.ip().to_string()), to.port())
            }
            _ => return Err(HeadError::Target),
        }
    } else {
        return absolute_destination(uri, delim, rw.login);
    };
    Ok(Destination {
        host,
        port,
        path: uri,
        absolute: false,
        no_host,
        ftp: None,
        login,
    })
}

/// The destination of an absolute-URI request (`http://` or `ftp://`):
/// its authority, and the path to send on without the fragment.
fn absolute_destination(
    uri: &str,
    delim: u8,
    want_login: bool,
) -> Result<Destination<'_>, HeadError> {
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
    let path = match path_all.bytes().position(|b| b == b'#') {
        Some(i) => &path_all[..i],
        None => path_all,
    };
    let mut ftp = None;
    if is_ftp {
        let p = path.split(['?', '#']).next().unwrap_or("");
        ftp = Some(if p.is_empty() { "/" } else { p });
    }
    let default = if is_ftp { 21 } else { 80 };
    let mut login = UrlLogin::default();
    let (host, port) = login_authority(&rest[..end], Some(default), delim, want_login, &mut login)?;
    Ok(Destination {
        host,
        port,
        path,
        absolute: true,
        no_host: false,
        ftp,
        login,
    })
}

/// What a request's fields say of its body, its `Expect` and its
/// credentials.
struct Fields<'a> {
    /// `Content-Length`, its repeats merged.
    cl: Option<u64>,
    /// How many `Content-Length` fields there were.
    cl_fields: u32,
    /// The `Transfer-Encoding` value.
    te: Option<&'a [u8]>,
    expect_continue: bool,
    proxy_auth: Option<&'a [u8]>,
    conn_auth: bool,
    auth: Option<&'a [u8]>,
}

impl<'a> Fields<'a> {
    /// Read the fields; Err for repeats that cannot be taken (two
    /// `Transfer-Encoding`, two `Proxy-Authorization`, lengths that
    /// differ).
    fn of(headers: &[httparse::Header<'a>]) -> Result<Fields<'a>, HeadError> {
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
                conn_auth |= starts_ci(v, b"ntlm") || starts_ci(v, b"negotiate");
            }
        }
        Ok(Fields {
            cl,
            cl_fields,
            te,
            expect_continue,
            proxy_auth,
            conn_auth,
            auth,
        })
    }
}

/// How the body is framed, from `Transfer-Encoding` and `Content-Length`;
/// Err for both, for a TE in HTTP/1.0, or for a TE that does not end in
/// `chunked`.
fn body_framing(te: Option<&[u8]>, cl: Option<u64>, version: u8) -> Result<Framing, HeadError> {
    Ok(match (te, cl) {
        (Some(_), Some(_)) => return Err(HeadError::Framing),
        (Some(_), None) if version == 0 => return Err(HeadError::Framing),
        (Some(t), None) if ends_in_chunked(t) => Framing::Chunked,
        (Some(_), None) => return Err(HeadError::Framing),
        (None, Some(0)) | (None, None) => Framing::None,
        (None, Some(n)) => Framing::Length(n),
    })
}

/// The origin-form request line: `method`, `path` (`/` when it has none)
/// and the version.
fn put_request_line(out: &mut Vec<u8>, method: &str, path: &str, version: u8) {
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
}

/// The client's fields to send on: one `Content-Length`, without the
/// hop-by-hop ones, those `Connection` names, `Host` when `absolute`
/// put one already, `Upgrade` unless `upgrade`, and with `-a` the
/// forwarding ones.
fn put_fields(
    out: &mut Vec<u8>,
    headers: &[httparse::Header<'_>],
    conn: &ConnTokens<'_>,
    f: &Fields<'_>,
    absolute: bool,
    upgrade: bool,
    rw: &Rewrite<'_>,
) {
    let mut cl_sent = false;
    for h in headers {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            // Repeats and lists of one value become one field: the next
            // hop must not have to merge them (RFC 9110 section 8.6).
            if let (Some(v), false) = (f.cl, cl_sent) {
                put_length(out, n, h.value, v, f.cl_fields);
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
}

/// Methods safe to send twice (RFC 9110 section 9.2.2).
pub fn is_idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
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

fn is_forwarding(name: &str) -> bool {
    ["forwarded", "x-forwarded-for", "via"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::proto::http::fields::{base64_decode, with_field};

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
        assert_eq!(out, b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        // HTTP/1.1 needs a Host (RFC 9112 section 3.2): the destination's.
        let h = parse_request(b"GET /x HTTP/1.1\r\nA: b\r\n\r\n", &rw, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.port), ("10.1.2.3", 8080));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /x HTTP/1.1\r\nHost: 10.1.2.3:8080\r\nA: b\r\n\r\n"
        );
        rw.redirected_to = Some("[2001:db8::1]:80".parse().unwrap());
        parse_request(b"GET / HTTP/1.1\r\n\r\n", &rw, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n"
        );
        // A Host the client sent names the destination for the ACL.
        let h = parse_request(b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n", &rw, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((&*h.host, h.port), ("a.test", 80));
    }

    pub(crate) fn req(text: &str) -> Result<Option<(RequestHead<'_>, String)>, HeadError> {
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
    pub(crate) fn fwd(text: &str) -> String {
        req(text).unwrap().unwrap().1
    }

    pub(crate) fn err(text: &str) -> HeadError {
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

    #[test]
    fn two_proxy_authorizations_are_refused() {
        let t = "GET http://h/ HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\nProxy-Authorization: Basic dTpw\r\n\r\n";
        assert_eq!(err(t), HeadError::Syntax);
    }
}
