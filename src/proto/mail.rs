//! The line dialogues of the mail proxies (`pop3p`, `imapp`, `smtpp`)
//! and `ftppr`, and tlspr's STARTTLS: lines split off what a peer sent,
//! a `name@host[:port]` login split as 3proxy splits it (its last
//! `delimchar`), and the small tests on a line the dialogues share.
//! The services read the bytes (`services::login` reads [`Lines`] off a
//! socket) and call these; IMAP's and SMTP's own credentials are in
//! `proto::imap` and `proto::smtp`.
//!
//! Invariant: pure; nothing here does IO.

use std::io;

/// Lines read from a socket, with what came after them kept for the relay.
#[derive(Default)]
pub(crate) struct Lines {
    pub(crate) buf: Vec<u8>,
    /// Bytes read from the socket in all.
    pub(crate) total: u64,
    /// Reads from the socket that took bytes.
    pub(crate) reads: u64,
}

impl Lines {
    /// A reader with `early` already read (by the handler that handed the
    /// client over).
    pub(crate) fn with(early: &[u8]) -> Lines {
        Lines {
            buf: early.to_vec(),
            total: 0,
            reads: 0,
        }
    }

    /// A whole line already read, if there is one.
    pub(crate) fn buffered(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        Some(self.buf.drain(..=end).collect())
    }

    /// One line up to and including `\n`, at most `max` bytes, from what
    /// was read before and what `more` reads into a chunk it is given;
    /// fewer (maybe none) when `more` reads nothing or fails (but for
    /// `Interrupted`, which asks it again).
    pub(crate) fn line_from(
        &mut self,
        max: usize,
        mut more: impl FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> Vec<u8> {
        let mut scanned = 0;
        loop {
            let end = self.buf[scanned..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| scanned + i + 1);
            if let Some(end) = end.filter(|&e| e <= max) {
                return self.buf.drain(..end).collect();
            }
            if self.buf.len() >= max {
                return self.buf.drain(..max).collect();
            }
            scanned = self.buf.len();
            let mut chunk = [0u8; 512];
            match more(&mut chunk) {
                Ok(n) if n > 0 => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.total += n as u64;
                    self.reads += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => return self.buf.drain(..).collect(),
            }
        }
    }
}

/// What `USER` said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Login {
    /// The proxy's own credentials (`proxyuser:proxypass:name`).
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// The name for the server (the POP3, IMAP, SMTP or FTP login).
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) port: u16,
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address;
/// `port` when none is given.
pub(crate) fn parse_host(s: &[u8], port: u16) -> Option<(String, u16)> {
    let (host, p) = if let Some(rest) = s.strip_prefix(b"[") {
        let close = rest.iter().position(|&b| b == b']')?;
        let after = &rest[close + 1..];
        let p = match after {
            [] => None,
            [b':', p @ ..] => Some(p),
            _ => return None,
        };
        (&rest[..close], p)
    } else {
        let colons = s.iter().filter(|&&b| b == b':').count();
        match s.iter().position(|&b| b == b':') {
            Some(i) if colons == 1 => (&s[..i], Some(&s[i + 1..])),
            _ => (s, None),
        }
    };
    if host.is_empty() || host.len() > 253 {
        return None;
    }
    let port = match p {
        Some(p) => std::str::from_utf8(p)
            .ok()?
            .parse()
            .ok()
            .filter(|&p| p > 0)?,
        None => port,
    };
    Some((text(host), port))
}

/// The argument of `USER`, split as 3proxy splits it: the host after the
/// last `delim`, and with `creds`, `user:pass:` in front of the name.
/// `default` is `-h`'s host and the port of a host given without one.
pub(crate) fn parse_login(
    arg: &[u8],
    delim: u8,
    creds: bool,
    default: (Option<&str>, u16),
) -> Option<Login> {
    let (name, host, port) = match arg.iter().rposition(|&b| b == delim) {
        Some(i) => {
            let (h, p) = parse_host(&arg[i + 1..], default.1)?;
            (&arg[..i], h, p)
        }
        None => (arg, default.0?.to_string(), default.1),
    };
    if name.is_empty() {
        return None;
    }
    let mut login = Login {
        user: None,
        password: None,
        name: text(name),
        host,
        port,
    };
    if creds {
        proxy_credentials(name, &mut login);
    }
    Some(login)
}

/// `proxyuser:proxypass:name`: the proxy's own credentials in front of the
/// name a login carries (each only when not empty), as 3proxy splits them.
fn proxy_credentials(name: &[u8], l: &mut Login) {
    let mut parts = name.splitn(3, |&b| b == b':');
    if let (Some(u), Some(p), Some(n)) = (parts.next(), parts.next(), parts.next()) {
        l.user = (!u.is_empty()).then(|| text(u));
        l.password = (!p.is_empty()).then(|| text(p));
        l.name = text(n);
    }
}

/// Whether `line` names `cap` anywhere (3proxy's hascap: a substring,
/// any case).
pub(crate) fn has_cap(line: &[u8], cap: &[u8]) -> bool {
    line.windows(cap.len()).any(|w| w.eq_ignore_ascii_case(cap))
}

/// A line without its end: cut at the first CR or LF.
pub(crate) fn chomp(line: &[u8]) -> &[u8] {
    &line[..line
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(line.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(arg: &str) -> Option<Login> {
        parse_login(arg.as_bytes(), b'@', true, (None, 110))
    }

    #[test]
    fn splits_at_the_last_delimiter() {
        let l = login("me@corp@mail.example:2110").unwrap();
        assert_eq!(
            (l.name.as_str(), l.host.as_str(), l.port),
            ("me@corp", "mail.example", 2110)
        );
        let l = login("bob@[::1]").unwrap();
        assert_eq!((l.host.as_str(), l.port), ("::1", 110));
        let l = login("bob@::1").unwrap();
        assert_eq!((l.host.as_str(), l.port), ("::1", 110));
        let l = parse_login(b"a@b#h:1", b'#', true, (None, 110)).unwrap();
        assert_eq!((l.name.as_str(), l.host.as_str(), l.port), ("a@b", "h", 1));
    }

    #[test]
    fn proxy_credentials_in_front() {
        let l = login("pu:pp:bob@h").unwrap();
        assert_eq!(l.user.as_deref(), Some("pu"));
        assert_eq!(l.password.as_deref(), Some("pp"));
        assert_eq!(l.name, "bob");
        let l = parse_login(b"pu:pp:bob@h", b'@', false, (None, 110)).unwrap();
        assert_eq!((l.user, l.name.as_str()), (None, "pu:pp:bob"));
        let l = login("a:b@h").unwrap();
        assert_eq!((l.user, l.name.as_str()), (None, "a:b"));
    }

    #[test]
    fn bad_logins() {
        for bad in [
            "",
            "bob",
            "@h",
            "bob@",
            "bob@h:",
            "bob@h:x",
            "bob@h:0",
            "bob@h:70000",
            "bob@[::1",
        ] {
            assert_eq!(login(bad), None, "{bad:?}");
        }
        assert_eq!(login(&format!("b@{}", "a".repeat(254))), None);
    }

    #[test]
    fn has_cap_is_a_substring_in_any_case() {
        assert!(has_cap(b"250-starttls\r\n", b"STARTTLS"));
        assert!(has_cap(
            b"* OK [CAPABILITY IMAP4rev1 STARTTLS]",
            b"STARTTLS"
        ));
        assert!(!has_cap(b"250 SIZE 1000", b"STARTTLS"));
    }
}
