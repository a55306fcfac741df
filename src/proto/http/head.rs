//! What request and response heads share: the field limits, why a head
//! is refused, where a head ends, and the byte helpers of the field
//! scans.

/// Most header fields accepted in one head; more gives 431.
pub const MAX_HEADERS: usize = 100;

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

/// Field slots on the stack for the first try at a head; a head with more
/// fields is parsed again with [`MAX_HEADERS`] slots on the heap. (Every
/// byte of stack a client thread touches stays resident while it lives.)
pub(super) const FEW_HEADERS: usize = 24;

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
pub(super) fn next_lf(buf: &[u8], from: usize) -> Option<usize> {
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

pub(super) fn trim(v: &[u8]) -> &[u8] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::framing::Framing;
    use crate::proto::http::request::tests::{err, fwd};
    use crate::proto::http::response::parse_response;

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
}
