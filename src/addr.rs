//! Address families, IP literals, the one test for a socket timeout and
//! a read with a deadline: a leaf shared by `net` and the resolver `net`
//! calls (`resolve`).

use std::io::{self, Read};
use std::net::{IpAddr, TcpStream};
use std::time::Instant;

/// An IP literal, IPv6 with or without brackets.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    s.parse().ok()
}

/// Which address families names resolve to (`-4 -6 -46 -64`). 3proxy's
/// default is IPv4 only for names; IP literals of either family always work
/// here (3proxy refuses an IPv6 literal without `-6`/`-46`/`-64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    #[default]
    V4,
    V6,
    V46,
    V64,
}

/// A socket timeout: blocking sockets report an expired SO_RCVTIMEO or
/// SO_SNDTIMEO as WouldBlock, some paths as TimedOut.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Fill `buf` from `s` by `deadline`, however many reads it takes (a DNS
/// message over TCP: its length, then its body). Err TimedOut when the
/// deadline passes (or the socket's timeout fires), UnexpectedEof when
/// the peer closes first, or the read's own error.
pub fn read_exact_by(s: &mut TcpStream, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An address as text, as `Display` writes it, without the formatting
/// machinery for IPv4 (the common case: a SOCKS request's host text for
/// the ACL and `%n` is made for every session).
pub fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut s = String::with_capacity(15);
    push_ipv4(&mut s, v4);
    s
}

fn push_ipv4(s: &mut String, v4: std::net::Ipv4Addr) {
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if o >= 100 {
            s.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            s.push(char::from(b'0' + o / 10 % 10));
        }
        s.push(char::from(b'0' + o % 10));
    }
}

/// `host:port` of an address as `format!("{}:{}", a.ip(), a.port())`
/// writes it (an IPv6 address without brackets, as 3proxy's `%T` shows
/// it), after `prefix`; IPv4 without the formatting machinery (a SOCKS
/// request's text is made for every session).
pub fn host_port_text(prefix: &str, a: std::net::SocketAddr) -> String {
    let IpAddr::V4(v4) = a.ip() else {
        return format!("{prefix}{}:{}", a.ip(), a.port());
    };
    let mut s = String::with_capacity(prefix.len() + 21);
    s.push_str(prefix);
    push_ipv4(&mut s, v4);
    s.push(':');
    let mut digits = [0u8; 20];
    for &d in decimal(u64::from(a.port()), &mut digits) {
        s.push(char::from(d));
    }
    s
}

/// `v` in decimal ASCII, as `format!` writes it, in the end of `buf`
/// (the hot paths' numbers without the formatting machinery).
pub fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_what_format_writes() {
        let mut b = [0u8; 20];
        for v in [0, 7, 10, 65535, 1_000_000, u64::MAX] {
            assert_eq!(decimal(v, &mut b), v.to_string().as_bytes());
        }
    }

    #[test]
    fn ip_text_is_display() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "100.200.255.9",
            "255.255.255.255",
            "::1",
            "2001:db8::8",
        ] {
            let a: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(a), a.to_string());
            for port in [0u16, 7, 80, 1080, 65535] {
                let sa = std::net::SocketAddr::new(a, port);
                assert_eq!(
                    host_port_text("CONNECT ", sa),
                    format!("CONNECT {ip}:{port}")
                );
            }
        }
    }
}
