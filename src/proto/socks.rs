//! SOCKS 4, 4a and 5 on the wire (RFC 1928, RFC 1929, the SOCKS4 and 4a
//! notes): the encoders and decoders shared by the `socks` service (the
//! server side, `services::socks`) and the parent chain (the client side,
//! `parent`), as g3's `g3-socks` keeps both sides in one place.
//!
//! The server side reads a client's handshake through a [`Source`] (the
//! service's socket) and answers it through a [`Peer`], so the reader
//! itself is pure; the client side is the handshakes with a SOCKS parent,
//! on a stream the caller connected.
//!
//! Invariant: but for those client handshakes, nothing here does IO;
//! every function takes bytes or values and returns bytes or values, and
//! none of them panics on any input.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::res::Res;
use crate::timeouts::Timeouts;

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

// --- The server side: reading a client's handshake --------------------------

/// What the client asked for.
#[derive(Debug)]
pub(crate) struct Ask {
    pub(crate) ver: u8,
    pub(crate) cmd: u8,
    pub(crate) dest: Dest,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// Bytes the client sent after its request without waiting for the
    /// reply (read with it): the start of the session's data.
    pub(crate) early: Vec<u8>,
}

/// The largest handshake message: a SOCKS4a request with a 255-byte user
/// id and a 255-byte name (an RFC 1929 one is 513 bytes).
const HANDSHAKE_BUF: usize = 528;

/// Where a client's handshake comes from once the bytes read before are
/// used up: the client's socket (`services::socks`), or nothing.
pub(crate) trait Source {
    /// Read into `room`, waiting at most `wait` (how long the client may
    /// take); 0 or an error: no more bytes come.
    fn recv(&mut self, room: &mut [u8], wait: Duration) -> io::Result<usize>;
}

/// Nothing past the bytes given (the fuzz target's reader).
struct Nothing;

impl Source for Nothing {
    fn recv(&mut self, _: &mut [u8], _: Duration) -> io::Result<usize> {
        Ok(0)
    }
}

/// Reads the client's handshake: BYTE_LONG for the first byte of a
/// message, BYTE_SHORT for the rest, each failure mapped to the code
/// 3proxy logs. Bytes come through a buffer, so a message that arrived
/// whole costs one recv() whatever its fields.
pub(crate) struct Reader<'a, S> {
    src: S,
    /// Bytes another handler read before it handed the client over: read
    /// before the socket.
    pre: &'a [u8],
    long: Duration,
    short: Duration,
    buf: [u8; HANDSHAKE_BUF],
    pos: usize,
    end: usize,
}

impl<'a, S: Source> Reader<'a, S> {
    /// `long` and `short`: BYTE_LONG and BYTE_SHORT.
    pub(crate) fn new(src: S, pre: &'a [u8], long: Duration, short: Duration) -> Reader<'a, S> {
        Reader {
            src,
            pre,
            long,
            short,
            buf: [0; HANDSHAKE_BUF],
            pos: 0,
            end: 0,
        }
    }

    /// Read more bytes; `wait` is how long the client may take.
    fn fill(&mut self, wait: Duration, code: Res) -> Result<(), Res> {
        if self.pos == self.end {
            (self.pos, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.pos..self.end, 0);
            (self.end, self.pos) = (self.end - self.pos, 0);
        }
        let room = &mut self.buf[self.end..];
        if !self.pre.is_empty() {
            let n = room.len().min(self.pre.len());
            room[..n].copy_from_slice(&self.pre[..n]);
            self.pre = &self.pre[n..];
            self.end += n;
            return Ok(());
        }
        match self.src.recv(room, wait) {
            Ok(0) | Err(_) => Err(code),
            Ok(n) => {
                self.end += n;
                Ok(())
            }
        }
    }

    /// The first byte of a message: the client may think first.
    fn first(&mut self, code: Res) -> Result<u8, Res> {
        if self.pos == self.end {
            self.fill(self.long, code)?;
        }
        self.byte(code)
    }

    fn byte(&mut self, code: Res) -> Result<u8, Res> {
        let mut b = [0u8; 1];
        self.exact(&mut b, code)?;
        Ok(b[0])
    }

    fn exact(&mut self, b: &mut [u8], code: Res) -> Result<(), Res> {
        while self.end - self.pos < b.len() {
            self.fill(self.short, code)?;
        }
        b.copy_from_slice(&self.buf[self.pos..self.pos + b.len()]);
        self.pos += b.len();
        Ok(())
    }

    fn port(&mut self) -> Result<u16, Res> {
        let mut p = [0u8; 2];
        self.exact(&mut p, Res::SOCKS_SHORT)?;
        Ok(u16::from_be_bytes(p))
    }

    /// A NUL-terminated string (SOCKS4 user id, 4a host name) of at most
    /// 255 bytes; a longer one is refused (441) rather than read forever.
    fn cstr(&mut self) -> Result<Vec<u8>, Res> {
        let mut out = Vec::new();
        loop {
            let b = self.byte(Res::SOCKS_SHORT)?;
            if b == 0 {
                return Ok(out);
            }
            if out.len() >= 255 {
                return Err(Res::SOCKS_SHORT);
            }
            out.push(b);
        }
    }

    /// A length-prefixed string (RFC 1929 fields, SOCKS5 names).
    fn pstr(&mut self, len_code: Res) -> Result<Vec<u8>, Res> {
        let n = self.byte(len_code)? as usize;
        let mut v = vec![0u8; n];
        self.exact(&mut v, Res::SOCKS_SHORT)?;
        Ok(v)
    }

    /// What was read past the request.
    fn rest(&self) -> Vec<u8> {
        [&self.buf[self.pos..self.end], self.pre].concat()
    }
}

/// What the handshake needs from the session besides the client's bytes:
/// a way to answer, and the `auth` chain's early verdict on RFC 1929
/// credentials.
pub(crate) trait Peer {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    fn refuses(&self, user: &str, password: &str) -> Option<Res>;
}

/// The fuzz target's peer: replies are collected, every login passes.
struct Collect(Vec<u8>);

impl Peer for Collect {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn refuses(&self, _: &str, _: &str) -> Option<Res> {
        None
    }
}

/// The handshake read from `input` alone, as a client sending exactly
/// these bytes and then nothing would get it read (for `crate::fuzzing`):
/// what was asked or the code, and the bytes the service answered.
pub(crate) fn read_handshake(input: &[u8], needuser: u32) -> (Result<Ask, Res>, Vec<u8>) {
    let t = Timeouts::default();
    let mut r = Reader::new(
        Nothing,
        input,
        t.get(Timeouts::BYTE_LONG),
        t.get(Timeouts::BYTE_SHORT),
    );
    let mut peer = Collect(Vec::new());
    let (mut ver, mut owed, mut refused) = (None, false, None);
    let ask = read_from(
        &mut r,
        &mut peer,
        needuser,
        &mut ver,
        &mut owed,
        &mut refused,
    );
    (ask, peer.0)
}

/// The greeting and request from `r`, the answers to the greeting and to
/// RFC 1929 sent through `peer`; `ver`, `owed` and `refused` as for
/// `services::socks`'s `read_request`.
pub(crate) fn read_from<S: Source>(
    r: &mut Reader<'_, S>,
    peer: &mut dyn Peer,
    needuser: u32,
    ver: &mut Option<u8>,
    owed: &mut bool,
    refused: &mut Option<String>,
) -> Result<Ask, Res> {
    let v = r.first(Res::SOCKS_VERSION)?;
    if v != 4 && v != 5 {
        return Err(Res::SOCKS_VERSION);
    }
    *ver = Some(v);
    let mut ask = if v == 4 {
        *owed = true;
        read_v4(r, needuser)
    } else {
        read_v5(r, peer, needuser, owed, refused)
    }?;
    ask.early = r.rest();
    Ok(ask)
}

fn read_v4<S: Source>(r: &mut Reader<'_, S>, needuser: u32) -> Result<Ask, Res> {
    let cmd = r.byte(Res::SOCKS_SHORT)?;
    let port = r.port()?;
    let mut ip = [0u8; 4];
    r.exact(&mut ip, Res::SOCKS_SHORT)?;
    let user = r.cstr()?;
    // SOCKS4a: DSTIP 0.0.0.x with x non-zero, the name after the user id.
    let dest = if ip[..3] == [0, 0, 0] && ip[3] != 0 {
        let name = String::from_utf8(r.cstr()?).map_err(|_| Res::SOCKS_SHORT)?;
        if name.is_empty() {
            return Err(Res::SOCKS_NULL_ADDR);
        }
        Dest::Name(name, port)
    } else {
        Dest::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
    };
    if cmd != CMD_CONNECT && cmd != CMD_BIND {
        return Err(Res::SOCKS_COMMAND);
    }
    // The user id is a user name only where the service asks for one.
    let user = (needuser > 0 && !user.is_empty()).then(|| String::from_utf8_lossy(&user).into());
    Ok(Ask {
        ver: 4,
        cmd,
        dest,
        user,
        password: None,
        early: Vec::new(),
    })
}

fn read_v5<S: Source>(
    r: &mut Reader<'_, S>,
    c: &mut dyn Peer,
    needuser: u32,
    owed: &mut bool,
    refused: &mut Option<String>,
) -> Result<Ask, Res> {
    let n = r.byte(Res::SOCKS_SHORT)? as usize;
    let mut methods = vec![0u8; n];
    r.exact(&mut methods, Res::SOCKS_SHORT)?;
    let m = choose_method(&methods, needuser);
    c.send(&[5, m]).map_err(|_| Res::SOCKS_VERSION)?;
    if m == METHOD_REFUSED {
        return Err(if needuser > 1 {
            Res::AUTH_NO_USER
        } else {
            Res::SOCKS_SHORT
        });
    }
    let (mut user, mut password) = (None, None);
    if m == METHOD_USERPASS {
        // RFC 1929. Where the `auth` chain is sure to refuse these
        // credentials whatever the request (`access::refuses_credentials`:
        // `auth strong` and a wrong password, say) the answer is failure
        // and the connection closes, as the RFC says. Otherwise it is
        // success and the credentials are checked with the request, as
        // 3proxy always does: a refusal then gets REP 2.
        if r.first(Res::SOCKS_AUTH_VERSION)? != 1 {
            let _ = c.send(&[1, 1]);
            return Err(Res::SOCKS_AUTH_VERSION);
        }
        let u = r.pstr(Res::SOCKS_SHORT_NAME)?;
        let p = r.pstr(Res::SOCKS_SHORT_PASSWORD)?;
        if needuser > 0 {
            let (u, p) = (
                crate::charset::login_text(&u),
                crate::charset::login_text(&p),
            );
            if let Some(res) = c.refuses(&u, &p) {
                let _ = c.send(&[1, 1]);
                *refused = Some(u);
                return Err(res);
            }
            (user, password) = (Some(u), Some(p));
        }
        c.send(&[1, 0]).map_err(|_| Res::SOCKS_AUTH_REPLY)?;
    }
    *owed = true;
    if r.first(Res::SOCKS_REQUEST_VERSION)? != 5 {
        return Err(Res::SOCKS_REQUEST_VERSION);
    }
    let cmd = r.byte(Res::SOCKS_SHORT)?;
    r.byte(Res::SOCKS_SHORT_RSV)?;
    let atyp = r.byte(Res::SOCKS_SHORT)?;
    if !(CMD_CONNECT..=CMD_UDP).contains(&cmd) {
        return Err(Res::SOCKS_COMMAND);
    }
    let dest = match atyp {
        ATYP_V4 => {
            let mut ip = [0u8; 4];
            r.exact(&mut ip, Res::SOCKS_SHORT)?;
            Dest::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), r.port()?))
        }
        ATYP_V6 => {
            let mut ip = [0u8; 16];
            r.exact(&mut ip, Res::SOCKS_SHORT)?;
            Dest::Addr(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), r.port()?))
        }
        ATYP_NAME => {
            let name = r.pstr(Res::SOCKS_SHORT_NAME)?;
            let port = r.port()?;
            let name = String::from_utf8(name).map_err(|_| Res::NOHOST)?;
            if name.is_empty() {
                return Err(Res::SOCKS_NULL_ADDR);
            }
            Dest::Name(name, port)
        }
        _ => return Err(Res::NOTIMPL_ATYP),
    };
    Ok(Ask {
        ver: 5,
        cmd,
        dest,
        user,
        password,
        early: Vec::new(),
    })
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
