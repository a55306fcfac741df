//! SOCKS 4, 4a and 5 on the wire (RFC 1928, RFC 1929, the SOCKS4 and 4a
//! notes): the encoders and decoders shared by the `socks` service (the
//! server side, `services::socks`) and the parent chain (the client side,
//! `parent`), as g3's `g3-socks` keeps both sides in one place.
//!
//! Invariant: nothing here does IO; every function takes bytes or values
//! and returns bytes or values, and none of them panics on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::res::Res;

/// SOCKS5 methods (RFC 1928 section 3).
pub const METHOD_NONE: u8 = 0;
pub const METHOD_USERPASS: u8 = 2;
pub const METHOD_REFUSED: u8 = 0xFF;

/// SOCKS commands; the same numbers in versions 4 and 5.
pub const CMD_CONNECT: u8 = 1;
pub const CMD_BIND: u8 = 2;
pub const CMD_UDP: u8 = 3;

/// SOCKS5 address types.
pub const ATYP_V4: u8 = 1;
pub const ATYP_NAME: u8 = 3;
pub const ATYP_V6: u8 = 4;

/// SOCKS4 reply codes: granted, refused.
pub const V4_GRANTED: u8 = 90;
pub const V4_REFUSED: u8 = 91;

/// A SOCKS destination: an address, or a host name and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    Addr(SocketAddr),
    Name(String, u16),
}

impl Dest {
    pub fn port(&self) -> u16 {
        match self {
            Dest::Addr(a) => a.port(),
            Dest::Name(_, p) => *p,
        }
    }

    /// `host:port` as the log's `%T` shows it (IPv6 without brackets, as
    /// 3proxy prints it).
    pub fn text(&self) -> String {
        match self {
            Dest::Addr(a) => crate::addr::host_port_text("", *a),
            Dest::Name(n, p) => format!("{n}:{p}"),
        }
    }

    /// [`Dest::text`] after `prefix` (a log text's verb), in one string.
    pub fn text_after(&self, prefix: &str) -> String {
        match self {
            Dest::Addr(a) => crate::addr::host_port_text(prefix, *a),
            Dest::Name(n, p) => format!("{prefix}{n}:{p}"),
        }
    }
}

/// The SOCKS5 reply code for a 3proxy result code (socks.c's mapping:
/// up to 10 is "not allowed", 11-19 "refused", 20-29 "general failure",
/// 30-100 "host unreachable", 997 "address type not supported", anything
/// else its last digit). Unlike 3proxy, a failure never maps to 0
/// ("succeeded"): 3proxy answers a refused BIND peer (470) with success.
pub fn v5_rep(res: Res) -> u8 {
    match res.0 {
        0 => 0,
        1..=10 => 2,
        11..=19 => 5,
        20..=29 => 1,
        30..=100 => 4,
        997 => 8,
        // 3proxy sends the last digit; 0 would say success and 9 is not a
        // reply RFC 1928 defines, so both become 1, general failure.
        n => match (n % 10) as u8 {
            0 | 9 => 1,
            r => r,
        },
    }
}

/// A SOCKS5 reply: VER REP RSV ATYP BND.ADDR BND.PORT.
pub fn v5_reply(rep: u8, bnd: SocketAddr) -> Vec<u8> {
    let mut b = vec![5, rep, 0];
    put_addr(&mut b, bnd);
    b
}

/// A SOCKS4 reply: VN=0, CD 90 (granted) or 91, DSTPORT, DSTIP. An IPv6
/// address cannot be said in SOCKS4 and is sent as zeros.
pub fn v4_reply(ok: bool, bnd: SocketAddr) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[1] = if ok { V4_GRANTED } else { V4_REFUSED };
    if let SocketAddr::V4(a) = bnd {
        b[2..4].copy_from_slice(&a.port().to_be_bytes());
        b[4..8].copy_from_slice(&a.ip().octets());
    }
    b
}

/// ATYP, address and port of `a`.
pub fn put_addr(b: &mut Vec<u8>, a: SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            b.push(ATYP_V4);
            b.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b.push(ATYP_V6);
            b.extend_from_slice(&ip.octets());
        }
    }
    b.extend_from_slice(&a.port().to_be_bytes());
}

/// ATYP, address or name, and port of `d`. A name longer than 255 bytes
/// cannot be sent: None.
pub fn put_dest(b: &mut Vec<u8>, d: &Dest) -> Option<()> {
    match d {
        Dest::Addr(a) => put_addr(b, *a),
        Dest::Name(n, p) => {
            let len = u8::try_from(n.len()).ok()?;
            b.push(ATYP_NAME);
            b.push(len);
            b.extend_from_slice(n.as_bytes());
            b.extend_from_slice(&p.to_be_bytes());
        }
    }
    Some(())
}

/// Parse the header of a SOCKS5 UDP datagram: RSV(2) FRAG ATYP ADDR PORT.
/// Returns the destination and the offset of the payload. Err: 483 for a
/// fragment or a non-zero RSV (3proxy ends the association), 484/485 for a
/// short header, 997 for an unknown address type.
pub fn parse_udp_header(d: &[u8]) -> Result<(Dest, usize), Res> {
    if d.len() < 4 {
        return Err(Res::SOCKS_UDP_SHORT);
    }
    if d[0] != 0 || d[1] != 0 || d[2] != 0 {
        // Fragments are not supported: 3proxy ends the association.
        return Err(Res::SOCKS_UDP_FRAG);
    }
    match d[3] {
        ATYP_V4 if d.len() >= 10 => {
            let ip = Ipv4Addr::new(d[4], d[5], d[6], d[7]);
            let port = u16::from_be_bytes([d[8], d[9]]);
            Ok((Dest::Addr(SocketAddr::new(IpAddr::V4(ip), port)), 10))
        }
        ATYP_V6 if d.len() >= 22 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&d[4..20]);
            let port = u16::from_be_bytes([d[20], d[21]]);
            let a = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port);
            Ok((Dest::Addr(a), 22))
        }
        ATYP_NAME if d.len() >= 5 => {
            let n = d[4] as usize;
            if d.len() < 7 + n {
                return Err(Res::SOCKS_UDP_NAME);
            }
            let name = std::str::from_utf8(&d[5..5 + n]).map_err(|_| Res::SOCKS_UDP_NAME)?;
            let port = u16::from_be_bytes([d[5 + n], d[6 + n]]);
            Ok((Dest::Name(name.to_string(), port), 7 + n))
        }
        ATYP_V4 | ATYP_NAME | ATYP_V6 => Err(Res::SOCKS_UDP_SHORT),
        _ => Err(Res::NOTIMPL_ATYP),
    }
}

/// The SOCKS5 UDP header for a datagram from `src`.
pub fn udp_header(src: SocketAddr) -> Vec<u8> {
    let mut b = vec![0, 0, 0];
    put_addr(&mut b, src);
    b
}

/// Pick the SOCKS5 method from the offered ones, given `needuser` (`-u`
/// is 0, the default 1, `-u2` is 2). 0xFF: none is acceptable.
///
/// Username/password is chosen whenever it is offered and the service may
/// ask for it; `-u2` accepts nothing else. With `-u` a client that offers
/// only username/password still gets it (its credentials are read and
/// ignored), where 3proxy would answer with a method the client did not
/// offer.
pub fn choose_method(offered: &[u8], needuser: u32) -> u8 {
    let has = |m| offered.contains(&m);
    match needuser {
        0 if has(METHOD_NONE) => METHOD_NONE,
        0 if has(METHOD_USERPASS) => METHOD_USERPASS,
        1 if has(METHOD_USERPASS) => METHOD_USERPASS,
        1 if has(METHOD_NONE) => METHOD_NONE,
        2 if has(METHOD_USERPASS) => METHOD_USERPASS,
        _ => METHOD_REFUSED,
    }
}

// --- The client side (parent chains) ---------------------------------------

/// A SOCKS4 CONNECT request. With a name (SOCKS4a), DSTIP is 0.0.0.1 and
/// the name follows the user id. Err 44 when the destination is IPv6
/// (SOCKS4 has no way to say it).
pub fn v4_connect(dest: &Dest, userid: &str) -> Result<Vec<u8>, Res> {
    let mut b = vec![4, CMD_CONNECT];
    b.extend_from_slice(&dest.port().to_be_bytes());
    match dest {
        Dest::Addr(SocketAddr::V4(a)) => b.extend_from_slice(&a.ip().octets()),
        Dest::Addr(SocketAddr::V6(_)) => return Err(Res::PARENT_SOCKS4_NOT_V4),
        Dest::Name(..) => b.extend_from_slice(&[0, 0, 0, 1]),
    }
    // NUL-terminated strings: a NUL inside would end them early.
    b.extend(userid.bytes().filter(|&c| c != 0).take(255));
    b.push(0);
    if let Dest::Name(n, _) = dest {
        b.extend(n.bytes().filter(|&c| c != 0).take(255));
        b.push(0);
    }
    Ok(b)
}

/// The SOCKS5 greeting: "no authentication", plus username/password when
/// we have credentials to give.
pub fn v5_greeting(with_password: bool) -> Vec<u8> {
    if with_password {
        vec![5, 2, METHOD_NONE, METHOD_USERPASS]
    } else {
        vec![5, 1, METHOD_NONE]
    }
}

/// An RFC 1929 username/password request; each is cut at 255 bytes.
pub fn v5_userpass(user: &str, password: &str) -> Vec<u8> {
    let u = &user.as_bytes()[..user.len().min(255)];
    let p = &password.as_bytes()[..password.len().min(255)];
    let mut b = vec![1, u.len() as u8];
    b.extend_from_slice(u);
    b.push(p.len() as u8);
    b.extend_from_slice(p);
    b
}

/// A SOCKS5 request for `cmd` to `dest`. Err 51 when a name is too long
/// to send (3proxy counts it a send failure).
pub fn v5_request(cmd: u8, dest: &Dest) -> Result<Vec<u8>, Res> {
    let mut b = vec![5, cmd, 0];
    put_dest(&mut b, dest).ok_or(Res::PARENT_SOCKS5_SEND)?;
    Ok(b)
}

/// How many bytes follow the first 4 of a SOCKS5 reply with this ATYP:
/// the address and the port. For a name, `name_len` is the byte after the
/// ATYP, and the count is of the bytes after that one. None: unknown ATYP.
pub fn v5_reply_rest(atyp: u8, name_len: u8) -> Option<usize> {
    match atyp {
        ATYP_V4 => Some(6),
        ATYP_V6 => Some(18),
        ATYP_NAME => Some(name_len as usize + 2),
        _ => None,
    }
}

// --- The client side: a SOCKS parent -----------------------------------

use super::{recv, send};
use crate::net::Stream;

/// CONNECT through a SOCKS4 parent (`short`: `socks4b`, a 3-byte reply).
pub fn client_v4_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
    short: bool,
) -> Result<(), Res> {
    let userid = creds.map_or("anonymous", |(u, _)| u.as_str());
    let req = v4_connect(dest, userid)?;
    send(s, &req, Res::PARENT_SOCKS4_SEND)?;
    let mut r = [0u8; 8];
    let n = if short { 3 } else { 8 };
    recv(s, &mut r[..n], Res::PARENT_SOCKS4_SHORT)?;
    if r[1] != V4_GRANTED {
        return Err(Res::PARENT_SOCKS4_REFUSED);
    }
    Ok(())
}

/// The SOCKS5 greeting and, if the parent picks it, RFC 1929.
fn client_v5_hello(s: &Stream, creds: Option<&(String, String)>) -> Result<(), Res> {
    send(s, &v5_greeting(creds.is_some()), Res::PARENT_SOCKS5_SEND)?;
    let mut r = [0u8; 4];
    recv(s, &mut r[..2], Res::PARENT_SOCKS5_NO_GREETING)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    match (r[1], creds) {
        (METHOD_NONE, _) => {}
        (METHOD_USERPASS, Some((u, p))) => {
            send(s, &v5_userpass(u, p), Res::PARENT_SOCKS5_SEND)?;
            recv(s, &mut r[..2], Res::PARENT_SOCKS5_NO_AUTH_REPLY)?;
            if r[..2] != [1, 0] {
                return Err(Res::PARENT_SOCKS5_AUTH_REFUSED);
            }
        }
        _ => return Err(Res::PARENT_SOCKS5_NO_METHOD),
    }
    Ok(())
}

/// CONNECT through a SOCKS5 parent (`short`: `socks5b`, which sends only
/// the first 4 bytes of an IPv4 reply).
pub fn client_v5_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
    short: bool,
) -> Result<(), Res> {
    client_v5_hello(s, creds)?;
    let mut r = [0u8; 4];
    send(s, &v5_request(CMD_CONNECT, dest)?, Res::PARENT_SOCKS5_SEND)?;
    recv(s, &mut r, Res::PARENT_SOCKS5_NO_REPLY)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    if r[1] != 0 {
        return Err(Res::parent_socks5_rep(r[1]));
    }
    let mut len = [0u8; 1];
    if r[3] == ATYP_NAME {
        recv(s, &mut len, Res::PARENT_SOCKS5_SHORT_REPLY)?;
    }
    let rest = v5_reply_rest(r[3], len[0]).ok_or(Res::PARENT_SOCKS5_BAD_ATYP)?;
    if short && r[3] == ATYP_V4 {
        // socks5b: a parent known to send only the first 4 bytes.
        return Ok(());
    }
    let mut skip = [0u8; 257];
    recv(s, &mut skip[..rest], Res::PARENT_SOCKS5_SHORT_REPLY)
}

/// UDP ASSOCIATE at a SOCKS5 parent, from any address (0.0.0.0:0, as
/// 3proxy asks); the reply's address is the parent's UDP relay.
pub fn client_v5_udp(s: &Stream, creds: Option<&(String, String)>) -> Result<SocketAddr, Res> {
    client_v5_hello(s, creds)?;
    let any = Dest::Addr(SocketAddr::new(
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        0,
    ));
    send(s, &v5_request(CMD_UDP, &any)?, Res::PARENT_SOCKS5_SEND)?;
    let mut r = [0u8; 4];
    recv(s, &mut r, Res::PARENT_SOCKS5_NO_REPLY)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    if r[1] != 0 {
        return Err(Res::parent_socks5_rep(r[1]));
    }
    let mut a = [0u8; 18];
    let ip = match r[3] {
        ATYP_V4 => {
            recv(s, &mut a[..6], Res::PARENT_SOCKS5_SHORT_REPLY)?;
            IpAddr::from([a[0], a[1], a[2], a[3]])
        }
        ATYP_V6 => {
            recv(s, &mut a, Res::PARENT_SOCKS5_SHORT_REPLY)?;
            let mut o = [0u8; 16];
            o.copy_from_slice(&a[..16]);
            a.copy_within(16..18, 4);
            IpAddr::from(o)
        }
        // A relay given by name cannot be used.
        _ => return Err(Res::PARENT_SOCKS5_BAD_ATYP),
    };
    Ok(SocketAddr::new(ip, u16::from_be_bytes([a[4], a[5]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_codes_follow_3proxy() {
        let cases = [
            (0, 0),
            (1, 2),
            (3, 2),
            (10, 2),
            (11, 5),
            (13, 5),
            (21, 1),
            (31, 4),
            (92, 4),
            (100, 4),
            (997, 8),
            (461, 1),
            (407, 7),
            (470, 1),
            (460, 1),
            (519, 1),
            (999, 1),
        ];
        for (res, rep) in cases {
            assert_eq!(v5_rep(Res(res)), rep, "res {res}");
        }
    }

    #[test]
    fn replies_encode_addresses() {
        let a = "1.2.3.4:258".parse().unwrap();
        assert_eq!(v5_reply(0, a), [5, 0, 0, 1, 1, 2, 3, 4, 1, 2]);
        let r = v5_reply(5, "[::1]:80".parse().unwrap());
        assert_eq!(r.len(), 22);
        assert_eq!((r[1], r[3], r[19], r[21]), (5, 4, 1, 80));
        assert_eq!(v4_reply(true, a), [0, 90, 1, 2, 1, 2, 3, 4]);
        let r = v4_reply(false, "[::1]:1".parse().unwrap());
        assert_eq!(r, [0, 91, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn method_choice() {
        assert_eq!(choose_method(&[0], 1), 0);
        assert_eq!(choose_method(&[0, 2], 1), 2);
        assert_eq!(choose_method(&[2], 0), 2);
        assert_eq!(choose_method(&[0, 2], 0), 0);
        assert_eq!(choose_method(&[0], 2), 0xFF);
        assert_eq!(choose_method(&[1], 1), 0xFF);
        assert_eq!(choose_method(&[], 1), 0xFF);
    }

    #[test]
    fn udp_headers() {
        let h = udp_header("10.0.0.1:53".parse().unwrap());
        let mut d = h.clone();
        d.extend_from_slice(b"payload");
        let (dest, off) = parse_udp_header(&d).unwrap();
        assert_eq!(dest, Dest::Addr("10.0.0.1:53".parse().unwrap()));
        assert_eq!(&d[off..], b"payload");
        let mut named = vec![0, 0, 0, 3, 4];
        named.extend_from_slice(b"host");
        named.extend_from_slice(&[0, 7, b'x']);
        let (dest, off) = parse_udp_header(&named).unwrap();
        assert_eq!((dest, off), (Dest::Name("host".into(), 7), 11));
        assert_eq!(parse_udp_header(&[0, 0, 1, 1]).unwrap_err(), Res(483));
        assert_eq!(parse_udp_header(&[1, 0, 0, 1]).unwrap_err(), Res(483));
        assert!(parse_udp_header(&[0, 0, 0, 1, 1, 2]).is_err());
        assert!(parse_udp_header(&[0, 0, 0, 3, 200, b'a']).is_err());
        assert!(parse_udp_header(&[0, 0, 0, 3]).is_err());
        assert_eq!(
            parse_udp_header(&[0, 0, 0, 9, 0, 0, 0, 0]).unwrap_err(),
            Res::NOTIMPL_ATYP
        );
    }

    #[test]
    fn v4_requests() {
        let d = Dest::Addr("10.1.2.3:80".parse().unwrap());
        assert_eq!(
            v4_connect(&d, "bob").unwrap(),
            [4, 1, 0, 80, 10, 1, 2, 3, b'b', b'o', b'b', 0]
        );
        let d = Dest::Name("ex.org".into(), 443);
        let mut want = vec![4, 1, 1, 187, 0, 0, 0, 1, b'u', 0];
        want.extend_from_slice(b"ex.org\0");
        assert_eq!(v4_connect(&d, "u").unwrap(), want);
        let d = Dest::Addr("[::1]:80".parse().unwrap());
        assert_eq!(v4_connect(&d, "").unwrap_err(), Res(44));
    }

    #[test]
    fn v5_client_messages() {
        assert_eq!(v5_greeting(false), [5, 1, 0]);
        assert_eq!(v5_greeting(true), [5, 2, 0, 2]);
        assert_eq!(v5_userpass("ab", "c"), [1, 2, b'a', b'b', 1, b'c']);
        let d = Dest::Name("h".into(), 1);
        assert_eq!(v5_request(1, &d).unwrap(), [5, 1, 0, 3, 1, b'h', 0, 1]);
        let d = Dest::Addr("1.2.3.4:5".parse().unwrap());
        assert_eq!(v5_request(3, &d).unwrap(), [5, 3, 0, 1, 1, 2, 3, 4, 0, 5]);
        let long = Dest::Name("a".repeat(256), 1);
        assert_eq!(v5_request(1, &long).unwrap_err(), Res(51));
        assert_eq!(v5_reply_rest(1, 0), Some(6));
        assert_eq!(v5_reply_rest(4, 0), Some(18));
        assert_eq!(v5_reply_rest(3, 5), Some(7));
        assert_eq!(v5_reply_rest(2, 0), None);
    }
}
