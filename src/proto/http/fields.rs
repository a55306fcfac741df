//! Writing fields and heads: the rewritten head's fields, the
//! `Connection` field a response head ends with, the absolute form for an
//! HTTP parent, and Basic credentials (base64) both ways.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use super::head::trim;
use crate::proto::starts_ci;

/// Finish a head from [`parse_response`]: the `Connection` field the
/// client needs, then the blank line. For an HTTP/1.1 client that keeps
/// the connection no field is needed.
///
/// [`parse_response`]: super::response::parse_response
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

/// `Basic <base64(user:password)>` from a `Proxy-Authorization` value.
pub fn basic_credentials(value: &[u8]) -> Option<(String, String)> {
    let v = trim(value);
    if !starts_ci(v, b"basic ") {
        return None;
    }
    let raw = base64_decode(trim(&v[6..]))?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = crate::charset::login_text(&raw[..colon]);
    let pass = crate::charset::login_text(&raw[colon + 1..]);
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

/// Standard base64 with padding.
pub(crate) fn base64_encode(raw: &[u8]) -> String {
    STANDARD.encode(raw)
}

/// `head` (from [`parse_request`]) with the field `name: value` added
/// before its blank line, into `out`.
///
/// [`parse_request`]: super::request::parse_request
pub fn with_field(head: &[u8], name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let end = head.len().saturating_sub(2);
    out.extend_from_slice(&head[..end]);
    put_field(out, name, value);
    out.extend_from_slice(b"\r\n");
}

pub(super) fn put_host(out: &mut Vec<u8>, host: &str, port: u16) {
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
///
/// [`parse_request`]: super::request::parse_request
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

pub(super) fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The one Content-Length field to pass on, for the value `n` merged
/// from `fields` fields: the field as it came when it was the only one
/// and plain digits (the usual case: no formatting), else `N` written
/// anew.
pub(super) fn put_length(out: &mut Vec<u8>, name: &str, value: &[u8], n: u64, fields: u32) {
    if fields == 1 && !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        put_field(out, name.as_bytes(), value);
        return;
    }
    out.extend_from_slice(b"Content-Length: ");
    let mut digits = [0u8; 20];
    out.extend_from_slice(crate::addr::decimal(n, &mut digits));
    out.extend_from_slice(b"\r\n");
}

/// base64 of `user:password`, for `Proxy-Authorization: Basic`.
pub fn basic_auth(user: &str, password: &str) -> String {
    base64_encode(format!("{user}:{password}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::request::tests::fwd;

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
