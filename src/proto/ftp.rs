//! FTP on the wire, as ftppr and the HTTP proxy's ftp:// gateway speak it
//! (3proxy's ftppr.c and ftp.c): the last line of a reply, the port of a
//! PASV answer and of a PORT command, the proxy's own PASV and EPSV
//! answers, and ftppr's `USER name@host[:port]` login. The services read
//! the lines (`proto::mail::Lines`) and call these.
//!
//! Invariant: pure; nothing here does IO.

use std::net::Ipv4Addr;

use crate::proto::mail::{self, text, Login};

/// The destination port when the login names none.
pub const DEFAULT_PORT: u16 = 21;

/// A reply's last line: three digits and no `-` after them.
pub(crate) fn is_final(l: &[u8]) -> bool {
    l.len() > 3 && l[0].is_ascii_digit() && l[3] != b'-'
}

/// A reply's last line as the gateway reads it: three digits, and no `-`
/// after them (a line of the three digits alone ends it too).
pub(crate) fn ends_reply(l: &[u8]) -> bool {
    l.len() >= 3 && l[..3].iter().all(u8::is_ascii_digit) && l.get(3) != Some(&b'-')
}

/// The port of a 227 answer's `(h1,h2,h3,h4,p1,p2)`.
pub(crate) fn pasv_port(reply: &[u8]) -> Option<u16> {
    let s = String::from_utf8_lossy(reply.get(4..)?);
    let open = s.find('(')?;
    let close = open + s[open..].find(')')?;
    let n: Vec<u16> = s[open + 1..close]
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    (n.len() == 6).then(|| ((n[4] & 0xff) << 8) | (n[5] & 0xff))
}

/// The port of a PORT command's argument `h1,h2,h3,h4,p1,p2` (the
/// address is not read: the data connection goes to the client's own);
/// None unless it is six numbers of 0 to 255.
pub(crate) fn port_arg(arg: &[u8]) -> Option<u16> {
    let n: Vec<u32> = text(arg)
        .trim()
        .split(',')
        .map(|x| x.trim().parse().unwrap_or(u32::MAX))
        .collect();
    if n.len() != 6 || n.iter().any(|&x| x > 255) {
        return None;
    }
    Some(((n[4] << 8) ^ n[5]) as u16)
}

/// The proxy's answer to EPSV, listening on `port`.
pub(crate) fn epsv_reply(port: u16) -> String {
    format!("229 OK (|||{port}|)\r\n")
}

/// The proxy's answer to PASV, listening at `ip` and `port`.
pub(crate) fn pasv_reply(ip: Ipv4Addr, port: u16) -> String {
    let o = ip.octets();
    format!(
        "227 OK ({},{},{},{},{},{})\r\n",
        o[0],
        o[1],
        o[2],
        o[3],
        port >> 8,
        port & 0xff
    )
}

/// `USER`'s argument: the host after the last `delim` (or `host`, from
/// OPEN or `-h`), and with `creds`, `proxyuser:proxypass:` before the name.
/// A host without a port is on `host`'s, else on 21: the mail proxies'
/// login with FTP's default.
pub(crate) fn parse_login(
    arg: &[u8],
    delim: u8,
    creds: bool,
    host: Option<(&str, u16)>,
) -> Option<Login> {
    let dport = host.map_or(DEFAULT_PORT, |h| h.1);
    mail::parse_login(arg, delim, creds, (host.map(|h| h.0), dport))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins() {
        let l = parse_login(b"me@corp@ftp.example:2121", b'@', true, None).unwrap();
        assert_eq!(
            (l.name.as_str(), l.host.as_str(), l.port),
            ("me@corp", "ftp.example", 2121)
        );
        let l = parse_login(b"bob@h", b'@', true, None).unwrap();
        assert_eq!(l.port, 21);
        let l = parse_login(b"bob", b'@', true, Some(("h", 2100))).unwrap();
        assert_eq!((l.host.as_str(), l.port), ("h", 2100));
        assert_eq!(parse_login(b"bob", b'@', true, None), None);
        assert_eq!(parse_login(b"@h", b'@', true, None), None);
        let l = parse_login(b"pu:pp:bob@h", b'@', true, None).unwrap();
        assert_eq!((l.user.as_deref(), l.name.as_str()), (Some("pu"), "bob"));
    }

    #[test]
    fn pasv_replies() {
        assert_eq!(pasv_port(b"227 Entering (127,0,0,1,4,1)\r\n"), Some(1025));
        assert_eq!(pasv_port(b"227 Entering 127,0,0,1,4,1\r\n"), None);
        assert_eq!(pasv_port(b"227 (1,2,3)\r\n"), None);
        assert_eq!(pasv_port(b"227 nothing\r\n"), None);
    }

    #[test]
    fn data_commands_and_answers() {
        assert_eq!(port_arg(b"127,0,0,1,4,1"), Some(1025));
        assert_eq!(port_arg(b" 10, 0,0,1 ,0,21 "), Some(21));
        assert_eq!(port_arg(b"1,2,3,4,256,1"), None);
        assert_eq!(port_arg(b"1,2,3,4,5"), None);
        assert_eq!(port_arg(b"1,2,3,4,5,x"), None);
        let pasv = pasv_reply(Ipv4Addr::new(10, 0, 0, 1), 1025);
        assert_eq!(pasv, "227 OK (10,0,0,1,4,1)\r\n");
        assert_eq!(pasv_port(pasv.as_bytes()), Some(1025));
        assert_eq!(epsv_reply(2121), "229 OK (|||2121|)\r\n");
        assert!(is_final(b"226 done\r\n") && !is_final(b"226-more\r\n"));
        assert!(!is_final(b"226") && ends_reply(b"226"));
        assert!(!ends_reply(b"2x6 done\r\n") && !ends_reply(b"226-more\r\n"));
    }
}
