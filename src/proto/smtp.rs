//! SMTP credentials on the wire, as 3proxy's smtpp.c reads them: the
//! base64 answers to `AUTH LOGIN` and `AUTH PLAIN`, and a PLAIN
//! response's name and password. `services::smtpp` reads the lines and
//! calls these.
//!
//! Invariant: pure; nothing here does IO.

use crate::proto::http::base64_decode;
use crate::proto::mail::chomp;

/// The longest decoded login or password.
pub(crate) const MAX_CRED: usize = 255;

/// A base64 credential of at most [`MAX_CRED`] bytes.
pub(crate) fn decode(b64: &[u8]) -> Option<Vec<u8>> {
    base64_decode(chomp(b64)).filter(|v| v.len() <= MAX_CRED)
}

/// `authzid NUL authcid NUL password` with an empty authzid, as 3proxy
/// takes it: the name and whatever follows the second NUL.
pub(crate) fn split_plain(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    if raw.len() < 3 || raw[0] != 0 {
        return None;
    }
    let rest = &raw[1..];
    let name_end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let pass = rest.get(name_end + 1..).unwrap_or(&[]);
    let pass_end = pass.iter().position(|&b| b == 0).unwrap_or(pass.len());
    Some((&rest[..name_end], &pass[..pass_end]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::base64_encode;

    #[test]
    fn plain_credentials_as_3proxy_takes_them() {
        assert_eq!(
            split_plain(b"\0bob@h\0pw"),
            Some((&b"bob@h"[..], &b"pw"[..]))
        );
        assert_eq!(split_plain(b"\0bob@h"), Some((&b"bob@h"[..], &b""[..])));
        assert_eq!(
            split_plain(b"\0bob\0pw\0x"),
            Some((&b"bob"[..], &b"pw"[..]))
        );
        // An authorization identity, or too short: refused.
        assert_eq!(split_plain(b"z\0bob\0pw"), None);
        assert_eq!(split_plain(b"\0b"), None);
    }

    #[test]
    fn credentials_decode_within_limits() {
        assert_eq!(decode(b"Ym9i\r\n"), Some(b"bob".to_vec()));
        assert_eq!(decode(b"!!\r\n"), None);
        let long = base64_encode(&[b'a'; MAX_CRED + 1]);
        assert_eq!(decode(long.as_bytes()), None);
    }
}
