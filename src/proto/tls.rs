//! TLS on the wire, as far as the proxy reads it without terminating it
//! (3proxy's tlspr.c): a record's header, a ClientHello's or
//! ServerHello's SNI, ALPN and version, and the handshake messages of a
//! flight however records split them. `services::tlspr` reads the
//! records off the sockets and calls these.
//!
//! Invariant: pure; nothing here does IO, and nothing panics on any input.

/// The longest host name kept from SNI (3proxy's SNILEN less its NUL).
const SNI_MAX: usize = 255;
/// The longest ALPN protocol name kept (3proxy's PROTOLEN less its NUL).
const ALPN_MAX: usize = 31;
/// A TLS record's header: type, version (2), length (2).
pub(crate) const RECORD_HEAD: usize = 5;
/// Record content type of handshake messages.
pub(crate) const HANDSHAKE: u8 = 22;
/// Handshake types.
pub(crate) const CLIENT_HELLO: u8 = 1;
pub(crate) const SERVER_HELLO: u8 = 2;

/// What a hello said.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Hello {
    /// The SNI host name (None when absent or empty).
    pub sni: Option<Vec<u8>>,
    /// The first ALPN protocol.
    pub alpn: Option<Vec<u8>>,
}

fn be16(b: &[u8], i: usize) -> Option<usize> {
    Some(((*b.get(i)? as usize) << 8) | *b.get(i + 1)? as usize)
}

/// Parse one TLS record holding exactly one hello message of type `kind`
/// (1 ClientHello, 2 ServerHello). `lv` is updated with the minor
/// version the hello claims (client_version, then supported_versions).
/// An error is 3proxy's negative code for what is wrong (-1 short, -2
/// wrong message type, -4 lengths disagree, -5 not version 3.x, -6 to
/// -10 fields overrunning, -12 to -15 a bad SNI, -16, -17 a bad ALPN).
pub fn parse_hello(kind: u8, h: &[u8], lv: &mut i32) -> Result<Hello, i32> {
    let len = h.len();
    if len < 64 {
        return Err(-1);
    }
    if h[5] != kind {
        return Err(-2);
    }
    if h[6] != 0 {
        return Err(-3);
    }
    if be16(h, 7).ok_or(-4)? + 9 != len {
        return Err(-4);
    }
    let mut off = 9;
    if h[off] != 3 {
        return Err(-5);
    }
    *lv = h[off + 1] as i32;
    // version (2) and random (32)
    off += 34;
    let slen = h[off] as usize;
    if off + slen + 3 > len {
        return Err(-6);
    }
    off += slen + 1;
    if kind == CLIENT_HELLO {
        let cs = be16(h, off).ok_or(-7)?;
        if off + cs + 3 > len {
            return Err(-7);
        }
        off += cs + 2;
        let cm = h[off] as usize;
        if off + cm + 3 > len {
            return Err(-8);
        }
        off += cm + 1;
    } else {
        // cipher suite (2) and compression method (1)
        off += 3;
    }
    let mut elen = be16(h, off).ok_or(-9)?;
    off += 2;
    if elen + off != len {
        return Err(-9);
    }
    let mut out = Hello::default();
    // From here `off + elen == len`: every index below is checked
    // against `elen` first.
    while elen > 3 {
        let xlen = be16(h, off + 2).ok_or(-10)?;
        if xlen + 4 > elen {
            return Err(-10);
        }
        let body = &h[off + 4..off + 4 + xlen];
        match (h[off], h[off + 1]) {
            (0, 0) if kind == CLIENT_HELLO && xlen >= 5 => {
                let list = be16(body, 0).ok_or(-12)?;
                if list > 3 {
                    if list + 2 != xlen {
                        return Err(-12);
                    }
                    if body[2] != 0 {
                        return Err(-13);
                    }
                    let n = be16(body, 3).ok_or(-14)?;
                    if n + 3 > list {
                        return Err(-14);
                    }
                    if n > SNI_MAX {
                        return Err(-15);
                    }
                    out.sni = (n > 0).then(|| body[5..5 + n].to_vec());
                }
            }
            (0, 43) if xlen > 2 => *lv = body[2] as i32,
            (0, 43) if xlen == 2 => *lv = body[1] as i32,
            (0, 16) if xlen >= 3 => {
                let n = body[2] as usize;
                // Within its own extension, not only within the ones
                // left (3proxy checks the latter only, so a name could
                // take the next extension's bytes).
                if n + 7 > elen || n + 3 > xlen {
                    return Err(-16);
                }
                if n > ALPN_MAX {
                    return Err(-17);
                }
                out.alpn = Some(h[off + 7..off + 7 + n].to_vec());
            }
            _ => {}
        }
        off += xlen + 4;
        elen -= xlen + 4;
    }
    Ok(out)
}

/// The length of the record whose header (its first [`RECORD_HEAD`]
/// bytes) starts `head`, header included, at most `max`; an error is
/// 3proxy's code: -3 not version 3.x, -4 longer than `max`.
pub(crate) fn record_len(head: &[u8], max: usize) -> Result<usize, i32> {
    if head.get(1) != Some(&3) {
        return Err(-3);
    }
    let len = RECORD_HEAD + be16(head, 3).unwrap_or(0);
    if len > max {
        return Err(-4);
    }
    Ok(len)
}

/// The handshake messages in a run of records, however they are split
/// across them: calls back with each message's type and length as its
/// header completes.
#[derive(Default)]
pub(crate) struct Flight {
    /// A message header read in part.
    head: Vec<u8>,
    /// Bytes of the current message's body still to skip.
    left: usize,
}

impl Flight {
    pub(crate) fn feed(&mut self, mut data: &[u8], mut on: impl FnMut(u8, usize)) {
        while !data.is_empty() {
            if self.left > 0 {
                let k = self.left.min(data.len());
                self.left -= k;
                data = &data[k..];
                continue;
            }
            self.head.push(data[0]);
            data = &data[1..];
            if self.head.len() == 4 {
                let h = &self.head;
                let len = (h[1] as usize) << 16 | (h[2] as usize) << 8 | h[3] as usize;
                on(h[0], len);
                self.left = len;
                self.head.clear();
            }
        }
    }
}

/// The longest Certificate message that holds no certificate, as 3proxy
/// counts (an empty list is 3 bytes).
pub(crate) const CERT_MIN: usize = 64;
/// Handshake message types tlspr `-c3`/`-c4` look for.
pub(crate) const CERTIFICATE: u8 = 11;
pub(crate) const CERTIFICATE_REQUEST: u8 = 13;
pub(crate) const SERVER_HELLO_DONE: u8 = 14;

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record as a TLS 1.3 client sends it: session id,
    /// suites, compression, then SNI, supported_versions and ALPN.
    fn client_hello(sni: &[u8], alpn: &[u8]) -> Vec<u8> {
        let mut ext = Vec::new();
        if !sni.is_empty() {
            let n = sni.len();
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&((n + 5) as u16).to_be_bytes());
            ext.extend_from_slice(&((n + 3) as u16).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&(n as u16).to_be_bytes());
            ext.extend_from_slice(sni);
        }
        ext.extend_from_slice(&[0, 43, 0, 5, 4, 3, 4, 3, 3]);
        if !alpn.is_empty() {
            let n = alpn.len();
            ext.extend_from_slice(&[0, 16]);
            ext.extend_from_slice(&((n + 3) as u16).to_be_bytes());
            ext.extend_from_slice(&((n + 1) as u16).to_be_bytes());
            ext.push(n as u8);
            ext.extend_from_slice(alpn);
        }
        hello_of(&ext)
    }

    /// A ClientHello record carrying the extensions `ext`.
    fn hello_of(ext: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(32);
        body.extend_from_slice(&[9u8; 32]);
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(ext);
        let mut hs = vec![CLIENT_HELLO, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn an_alpn_name_may_not_run_into_the_next_extension() {
        // ALPN "h2" whose name length says 6, then a padding extension:
        // the 4 bytes past the name are the next extension's header.
        let mut ext = vec![0, 16, 0, 5, 0, 3, 6, b'h', b'2'];
        ext.extend_from_slice(&[0, 21, 0, 4, 0, 0, 0, 0]);
        ext.extend_from_slice(&[0, 43, 0, 5, 4, 3, 4, 3, 3]);
        let rec = hello_of(&ext);
        let mut lv = rec[2] as i32;
        assert_eq!(parse_hello(CLIENT_HELLO, &rec, &mut lv), Err(-16));
        // The same with the right length parses.
        ext[6] = 2;
        let rec = hello_of(&ext);
        let h = parse_hello(CLIENT_HELLO, &rec, &mut lv).unwrap();
        assert_eq!(h.alpn.as_deref(), Some(&b"h2"[..]));
    }

    #[test]
    fn finds_sni_alpn_and_version() {
        let rec = client_hello(b"example.com", b"h2");
        let mut lv = rec[2] as i32;
        let h = parse_hello(CLIENT_HELLO, &rec, &mut lv).unwrap();
        assert_eq!(h.sni.as_deref(), Some(&b"example.com"[..]));
        assert_eq!(h.alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!(lv, 4);
    }

    #[test]
    fn no_sni_is_not_an_error() {
        let rec = client_hello(b"", b"");
        let mut lv = -1;
        let h = parse_hello(CLIENT_HELLO, &rec, &mut lv).unwrap();
        assert_eq!(h, Hello::default());
    }

    #[test]
    fn every_truncation_is_refused_without_panic() {
        let rec = client_hello(b"example.com", b"http/1.1");
        for n in 0..rec.len() {
            let mut lv = -1;
            assert!(
                parse_hello(CLIENT_HELLO, &rec[..n], &mut lv).is_err(),
                "{n}"
            );
        }
    }

    #[test]
    fn garbage_and_bad_fields_never_panic() {
        let rec = client_hello(b"example.com", b"h2");
        // Every single byte changed to every value: no panic, and a
        // result is either an error or a hello.
        for i in 0..rec.len() {
            for v in [0u8, 1, 2, 3, 0x7f, 0x80, 0xfe, 0xff] {
                let mut r = rec.clone();
                r[i] = v;
                let mut lv = -1;
                let _ = parse_hello(CLIENT_HELLO, &r, &mut lv);
                let _ = parse_hello(SERVER_HELLO, &r, &mut lv);
            }
        }
        let mut seed = 0x1234_5678_u64;
        for len in 0..600 {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let mut lv = -1;
            let _ = parse_hello(CLIENT_HELLO, &g, &mut lv);
        }
        let mut lv = -1;
        assert_eq!(parse_hello(CLIENT_HELLO, &[0u8; 64], &mut lv), Err(-2));
        let mut r = rec.clone();
        r[9] = 2;
        assert_eq!(parse_hello(CLIENT_HELLO, &r, &mut lv), Err(-5));
        let mut r = rec.clone();
        r.push(0);
        assert_eq!(parse_hello(CLIENT_HELLO, &r, &mut lv), Err(-4));
    }

    #[test]
    fn oversized_names_are_refused() {
        let long = vec![b'a'; 256];
        let rec = client_hello(&long, b"");
        let mut lv = -1;
        assert_eq!(parse_hello(CLIENT_HELLO, &rec, &mut lv), Err(-15));
        let rec = client_hello(b"a.example", &[b'p'; 32]);
        assert_eq!(parse_hello(CLIENT_HELLO, &rec, &mut lv), Err(-17));
        let ok = client_hello(&[b'a'; 255], &[b'p'; 31]);
        assert!(parse_hello(CLIENT_HELLO, &ok, &mut lv).is_ok());
    }

    #[test]
    fn flight_sees_messages_however_records_split_them() {
        // Certificate (11, 70 bytes), CertificateRequest (13, 4),
        // ServerHelloDone (14, 0), split across three records mid-header.
        let mut msgs = vec![11, 0, 0, 70];
        msgs.extend([0u8; 70]);
        msgs.extend([13, 0, 0, 4, 1, 2, 3, 4, 14, 0, 0, 0]);
        let mut f = Flight::default();
        let mut seen = Vec::new();
        for part in [&msgs[..2], &msgs[2..50], &msgs[50..]] {
            f.feed(part, |t, l| seen.push((t, l)));
        }
        assert_eq!(seen, [(11, 70), (13, 4), (14, 0)]);
    }
}
