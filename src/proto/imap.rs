//! IMAP4 credentials on the wire, as 3proxy's imapp.c reads them: the
//! arguments of `LOGIN`, and the base64 responses of `AUTHENTICATE PLAIN`
//! and `AUTHENTICATE LOGIN` (3proxy's de64). `services::imapp` reads the
//! lines and calls these.
//!
//! Invariant: pure; nothing here does IO.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// The longest name and password (3proxy's buffers less the NUL).
pub(crate) const CRED_MAX: usize = 319;

/// 3proxy's de64 decodes whole groups and checks no padding or leftover
/// bits: the standard alphabet, canonical padding, any leftover bits.
const DE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
        .with_decode_allow_trailing_bits(true),
);

/// 3proxy's de64: an optional `+ ` prefix, then whole groups of four
/// base64 characters up to the first padded group (what follows it is
/// ignored); at most `max` bytes out. None on any other character or a
/// short group, and for nothing. A group whose third character is `=`
/// gives one byte whatever its fourth, which must still be `=` or a
/// base64 character.
pub(crate) fn de64(s: &[u8], max: usize) -> Option<Vec<u8>> {
    let s = s.strip_prefix(b"+ ").unwrap_or(s);
    let mut groups = Vec::new();
    for g in s.chunks(4) {
        let g: [u8; 4] = g.try_into().ok()?;
        let b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'+' || c == b'/';
        if g[2] == b'=' && g[3] != b'=' && !b64(g[3]) {
            return None;
        }
        let padded = g[2] == b'=' || g[3] == b'=';
        if g[2] == b'=' {
            groups.extend_from_slice(&[g[0], g[1], b'=', b'=']);
        } else {
            groups.extend_from_slice(&g);
        }
        if padded {
            break;
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut out = DE64.decode(&groups).ok()?;
    out.truncate(max);
    Some(out)
}

/// Up to the first NUL, as C's string functions see a buffer.
pub(crate) fn cstr(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// `LOGIN`'s arguments: a name, bare or in double quotes, and the rest of
/// the line, sent on as it came, as the password.
pub(crate) fn parse_login_args(args: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (user, pass) = if let Some(rest) = args.strip_prefix(b"\"") {
        let q = rest.iter().position(|&b| b == b'"')?;
        let pass = &rest[q + 1..];
        (&rest[..q], pass.strip_prefix(b" ").unwrap_or(pass))
    } else {
        let sp = args.iter().position(|&b| b == b' ')?;
        (&args[..sp], &args[sp + 1..])
    };
    (user.len() <= CRED_MAX && pass.len() <= CRED_MAX).then(|| (user.to_vec(), pass.to_vec()))
}

/// `AUTHENTICATE PLAIN`'s decoded response: `[authzid] NUL name NUL
/// password`, or `name NUL password`.
pub(crate) fn parse_plain(raw: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if raw.len() < 3 {
        return None;
    }
    let p1 = raw.iter().position(|&b| b == 0)?;
    if p1 == raw.len() - 1 {
        return None;
    }
    let (user, pass) = match raw[p1 + 1..].iter().position(|&b| b == 0) {
        Some(p2) => (&raw[p1 + 1..p1 + 1 + p2], &raw[p1 + 2 + p2..]),
        None => (&raw[..p1], &raw[p1 + 1..]),
    };
    let (user, pass) = (cstr(user), cstr(pass));
    (user.len() <= CRED_MAX && pass.len() <= CRED_MAX).then(|| (user.to_vec(), pass.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `got` is the name `user` and the password `pass`.
    fn creds(got: Option<(Vec<u8>, Vec<u8>)>, user: &[u8], pass: &[u8]) {
        let (u, p) = got.expect("credentials");
        assert_eq!((&u[..], &p[..]), (user, pass));
    }

    #[test]
    fn login_arguments() {
        creds(parse_login_args(b"bob@h secret"), b"bob@h", b"secret");
        let quoted = parse_login_args(b"\"me@corp@h\" \"pw x\"");
        creds(quoted, b"me@corp@h", b"\"pw x\"");
        creds(parse_login_args(b"\"bob@h\"pw"), b"bob@h", b"pw");
        assert_eq!(parse_login_args(b"bob@h"), None);
        assert_eq!(parse_login_args(b"\"bob@h pw"), None);
        let long = format!("{} p", "a".repeat(320));
        assert_eq!(parse_login_args(long.as_bytes()), None);
    }

    #[test]
    fn base64_as_3proxy_reads_it() {
        assert_eq!(de64(b"Ym9i", 100).unwrap(), b"bob");
        assert_eq!(de64(b"+ Ym9iMQ==", 100).unwrap(), b"bob1");
        assert_eq!(de64(b"Ym9iMTI=", 100).unwrap(), b"bob12");
        assert_eq!(de64(b"Ym9iMQ==junk", 100).unwrap(), b"bob1");
        assert_eq!(de64(b"Ym9iMTIz", 2).unwrap(), b"bo");
        assert_eq!(de64(b"", 100), None);
        assert_eq!(de64(b"Ym9", 100), None);
        assert_eq!(de64(b"Ym9*", 100), None);
        // A padded third character ends the group, the fourth is still
        // checked; leftover bits need not be zero.
        assert_eq!(de64(b"Ym=x", 100).unwrap(), b"b");
        assert_eq!(de64(b"Ym=*", 100), None);
        assert_eq!(de64(b"Ym==", 100).unwrap(), b"b");
        assert_eq!(de64(b"YR==", 100).unwrap(), b"a");
        assert_eq!(de64(b"Ym9=", 100).unwrap(), b"bo");
        assert_eq!(de64(b"+/8=", 100).unwrap(), [0xfb, 0xff]);
        assert_eq!(de64(b"Y===", 100), None);
        assert_eq!(de64(b"+ ", 100), None);
        assert_eq!(de64(b"Ym9iM", 100), None);
        assert_eq!(de64(b"Ym9iYQ", 100), None);
        assert_eq!(de64(b"Ym9i\r\n", 100), None);
        assert_eq!(de64(b" Ym9i", 100), None);
        assert_eq!(de64(b"YQ-_", 100), None);
        assert_eq!(de64(b"Ym9iMTIz", 100).unwrap(), b"bob123");
    }

    #[test]
    fn plain_responses() {
        creds(parse_plain(b"\0bob@h\0pw"), b"bob@h", b"pw");
        creds(parse_plain(b"admin\0bob@h\0pw"), b"bob@h", b"pw");
        creds(parse_plain(b"bob@h\0pw"), b"bob@h", b"pw");
        assert_eq!(parse_plain(b"bob@h\0"), None);
        assert_eq!(parse_plain(b"bob@h"), None);
        assert_eq!(parse_plain(b"a\0"), None);
    }
}
