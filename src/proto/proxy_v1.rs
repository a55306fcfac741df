//! PROXY protocol version 1 on the wire (HAProxy's proxy-protocol.txt):
//! `PROXY TCP4 <src> <dst> <sport> <dport>\r\n` before the client's bytes,
//! so the real client address survives. Both directions: [`parse`] reads
//! the header a load balancer sends us (`-H`; [`read`] takes it off the
//! socket), [`encode`] writes the one a parent gets (`ha`, sent by
//! `chain`).
//!
//! Invariant: but for [`read`], nothing here does IO.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};

use crate::net::Stream;

/// The longest v1 header the specification allows, CRLF included.
pub const MAX_LINE: usize = 107;

/// What a header says: None for `PROXY UNKNOWN` (keep the real addresses),
/// else (source, destination).
pub type Header = Option<(SocketAddr, SocketAddr)>;

/// Parse one header line (with or without its CRLF).
pub fn parse(line: &[u8]) -> Result<Header, String> {
    let line = std::str::from_utf8(line).map_err(|_| "not text")?;
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut w = line.split(' ');
    if w.next() != Some("PROXY") {
        return Err("does not start with 'PROXY '".into());
    }
    let proto = w.next().ok_or("no protocol")?;
    if proto == "UNKNOWN" {
        return Ok(None);
    }
    let want_v6 = match proto {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(format!("unknown protocol '{proto}'")),
    };
    let ip = |s: Option<&str>| -> Result<IpAddr, String> {
        let s = s.ok_or("missing address")?;
        let ip: IpAddr = s.parse().map_err(|_| format!("bad address '{s}'"))?;
        if ip.is_ipv6() != want_v6 {
            return Err(format!("address '{s}' does not match {proto}"));
        }
        Ok(ip)
    };
    let port = |s: Option<&str>| -> Result<u16, String> {
        let s = s.ok_or("missing port")?;
        if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad port '{s}'"));
        }
        s.parse().map_err(|_| format!("bad port '{s}'"))
    };
    let (src, dst) = (ip(w.next())?, ip(w.next())?);
    let (sport, dport) = (port(w.next())?, port(w.next())?);
    if w.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Some((
        SocketAddr::new(src, sport),
        SocketAddr::new(dst, dport),
    )))
}

/// `PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n`.
pub fn encode(client: SocketAddr, local: SocketAddr) -> String {
    let fam = if client.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {fam} {} {} {} {}\r\n",
        client.ip(),
        local.ip(),
        client.port(),
        local.port()
    )
}

/// Read the header line from `s` (whose read timeout is already set) and
/// parse it. Consumes the line and nothing after it.
pub fn read(s: &Stream) -> Result<Header, String> {
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut buf = [0u8; MAX_LINE];
    loop {
        let room = MAX_LINE - line.len();
        if room == 0 {
            return Err("header longer than 107 bytes".into());
        }
        let n = s.peek(&mut buf[..room]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before the header ended".into());
        }
        let take = buf[..n]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(n, |i| i + 1);
        let mut r = s;
        r.read_exact(&mut buf[..take]).map_err(|e| e.to_string())?;
        line.extend_from_slice(&buf[..take]);
        if line.last() == Some(&b'\n') {
            return parse(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Header {
        parse(line.as_bytes()).unwrap()
    }

    #[test]
    fn tcp4_and_tcp6() {
        assert_eq!(
            ok("PROXY TCP4 1.2.3.4 5.6.7.8 1111 2222\r\n"),
            Some((
                "1.2.3.4:1111".parse().unwrap(),
                "5.6.7.8:2222".parse().unwrap()
            ))
        );
        assert_eq!(
            ok("PROXY TCP6 ::1 2001:db8::1 1 65535\r\n"),
            Some((
                "[::1]:1".parse().unwrap(),
                "[2001:db8::1]:65535".parse().unwrap()
            ))
        );
        assert_eq!(ok("PROXY UNKNOWN\r\n"), None);
        assert_eq!(ok("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"), None);
    }

    #[test]
    fn malformed() {
        for bad in [
            "GET / HTTP/1.1\r\n",
            "PROXY TCP4 1.2.3.4 5.6.7.8 1111\r\n",
            "PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
            "PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
            "PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn proxy_v1_lines() {
        assert_eq!(
            encode("1.2.3.4:5".parse().unwrap(), "6.7.8.9:10".parse().unwrap()),
            "PROXY TCP4 1.2.3.4 6.7.8.9 5 10\r\n"
        );
        assert_eq!(
            encode("[::1]:5".parse().unwrap(), "[::2]:10".parse().unwrap()),
            "PROXY TCP6 ::1 ::2 5 10\r\n"
        );
    }
}
