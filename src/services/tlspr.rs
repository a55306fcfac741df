//! `tlspr`: the TLS SNI proxy (3proxy's tlspr.c, tlspr(8)). The client's
//! first TLS record, its ClientHello, names the destination host (the SNI
//! extension); the port is `-P` (443 by default). The record is read
//! whole, the name checked with the access layer (op CONNECT), and after
//! connecting (directly or through `parent`s) the bytes read are replayed
//! to the destination before the two sockets are relayed.
//!
//! `-c` is how much TLS is required: 0 (the default) lets anything pass
//! (without a name there is no destination, so such a session ends with
//! 100), 1 refuses a first record that is not a well-formed ClientHello,
//! 2 also reads the server's first record and refuses it unless it is a
//! ServerHello, 3 also wants the server's certificate (visible up to TLS
//! 1.2 only), 4 also a client certificate the server asked for.
//!
//! `-Ximap`, `-Xpop3`, `-Xsmtp`: STARTTLS with the client (as a server
//! offering nothing else) and, once the ClientHello named the server, with
//! the server (as a client); the TLS session then passes through. The
//! mail proxies hand a client that asked them for STARTTLS here with
//! `Client::starttls` set, and only the server's side is done.
//!
//! The record carrying the text `%T`: `TLSv1.3 host alpn` as in 3proxy
//! (`NONEv0.0 - -` when no hello was seen).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::access::{Op, Request};
use crate::chain;
use crate::client::{Client, StartTls};
use crate::conf::token::quote;
use crate::conf::value::number;
use crate::net::{resolve, Stream};
use crate::parent;
use crate::res::Res;
use crate::service::ServiceOpts;
use crate::timeouts::Timeouts;

/// The destination port when `-P` is not given (or is 0).
pub const DEFAULT_PORT: u16 = 443;
/// The longest host name kept from SNI (3proxy's SNILEN less its NUL).
const SNI_MAX: usize = 255;
/// The longest ALPN protocol name kept (3proxy's PROTOLEN less its NUL).
const ALPN_MAX: usize = 31;
/// A TLS record's header: type, version (2), length (2).
const RECORD_HEAD: usize = 5;
/// Record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake types.
const CLIENT_HELLO: u8 = 1;
const SERVER_HELLO: u8 = 2;

/// The tlspr options of a service line (also read when a mail proxy
/// hands a STARTTLS client to tlspr: its own line's options apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsOpts {
    /// `-P`: the destination port (443 unless given).
    pub port: u16,
    /// `-P` was given (not 0): it wins over a STARTTLS protocol's port.
    pub port_given: bool,
    /// `-c[N]`: the TLS check level, 0 to 4.
    pub check: u32,
    /// `-Ximap`, `-Xpop3`, `-Xsmtp`: STARTTLS with both sides first.
    pub starttls: Option<StartTls>,
}

impl Default for TlsOpts {
    fn default() -> TlsOpts {
        TlsOpts {
            port: DEFAULT_PORT,
            port_given: false,
            check: 0,
            starttls: None,
        }
    }
}

impl TlsOpts {
    /// The destination port for a session speaking `proto` first: `-P`,
    /// else the protocol's submission port (110, 143, 587), else 443.
    pub fn port_for(&self, proto: Option<StartTls>) -> u16 {
        match proto {
            _ if self.port_given => self.port,
            Some(StartTls::Pop3) => 110,
            Some(StartTls::Imap) => 143,
            Some(StartTls::Smtp) => 587,
            None => self.port,
        }
    }
}

/// Read `-P`, `-c` and `-X` from a service line's options.
pub fn options(o: &ServiceOpts) -> Result<TlsOpts, String> {
    let mut t = TlsOpts::default();
    for a in &o.other {
        let (letter, val) = a[1..].split_at(1);
        match letter {
            "P" => {
                let p = number(val, 0u16, 65535).map_err(|e| format!("'{}': {e}", quote(a)))?;
                t.port = if p == 0 { DEFAULT_PORT } else { p };
                t.port_given = p != 0;
            }
            "c" => {
                t.check = if val.is_empty() {
                    1
                } else {
                    number(val, 0u32, 4).map_err(|e| format!("'{}': {e}", quote(a)))?
                };
            }
            "X" => {
                // As 3proxy: the first four letters decide.
                let v = val.to_ascii_lowercase();
                t.starttls = Some(if v.starts_with("imap") {
                    StartTls::Imap
                } else if v.starts_with("pop3") {
                    StartTls::Pop3
                } else if v.starts_with("smtp") {
                    StartTls::Smtp
                } else {
                    return Err(format!(
                        "'{}': the STARTTLS protocol must be imap, pop3 or smtp",
                        quote(a)
                    ));
                });
            }
            _ => {}
        }
    }
    Ok(t)
}

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

/// Read one whole TLS record from `s` into `buf` (bytes already there
/// count), within `wait` overall and at most `max` bytes. Ok is the
/// record's length; an error is 3proxy's code: -2 fewer than 5 bytes
/// came, -3 not version 3.x, -4 longer than `max`, -5 cut short.
pub fn read_record(
    s: &Stream,
    buf: &mut Vec<u8>,
    max: usize,
    wait: Duration,
) -> Result<usize, i32> {
    let until = Instant::now() + wait;
    fill(s, buf, RECORD_HEAD, until).map_err(|_| -2)?;
    if buf[1] != 3 {
        return Err(-3);
    }
    let len = RECORD_HEAD + be16(buf, 3).unwrap_or(0);
    if len > max {
        return Err(-4);
    }
    fill(s, buf, len, until).map_err(|_| -5)?;
    Ok(len)
}

/// Read until `buf` holds `need` bytes or `until` passes.
fn fill(s: &Stream, buf: &mut Vec<u8>, need: usize, until: Instant) -> Result<(), ()> {
    while buf.len() < need {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return Err(());
        }
        let have = buf.len();
        buf.resize(need, 0);
        let mut r = s;
        let n = r.read(&mut buf[have..]);
        match n {
            Ok(n) if n > 0 => buf.truncate(have + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => buf.truncate(have),
            _ => {
                buf.truncate(have);
                return Err(());
            }
        }
    }
    Ok(())
}

/// `%T` of a tlspr record, as 3proxy writes it.
fn text(lv: i32, host: Option<&str>, alpn: Option<&[u8]>) -> String {
    let (name, major, minor) = match lv {
        l if l < 0 => ("NONE", 0, 0),
        0 => ("SSL", 3, 0),
        l => ("TLS", 1, l - 1),
    };
    let alpn = alpn.map_or("-".into(), String::from_utf8_lossy);
    format!("{name}v{major}.{minor} {} {alpn}", host.unwrap_or("-"))
}

/// A name fit to be a destination: printable ASCII without blanks.
fn host_name(sni: &[u8]) -> Option<String> {
    let ok = sni.iter().all(|&b| b.is_ascii_graphic());
    ok.then(|| String::from_utf8_lossy(sni).into_owned())
}

/// `parent tls 0.0.0.0 0` in another service's ACL: read the client's
/// ClientHello (`early` first), check the ACL again with its SNI as the
/// destination's name (the entries that redirect locally skipped), and
/// relay to the destination the first handler chose, as 3proxy's
/// tlsprchild does with a host already known. Without one, the SNI is
/// the destination, as for a tlspr client.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve(c: &mut Client, early: &[u8], known: Option<&parent::Known>) -> parent::Next {
    let svc = c.svc().clone();
    let t = options(&svc.opts).unwrap_or_default();
    let mut st = State {
        lv: -1,
        host: None,
        alpn: None,
        buf: early.to_vec(),
    };
    // `transparent`: a redirected client goes where it meant to, with its
    // SNI (if any) as the name, as 3proxy's plugin and tlspr do.
    let original = match known {
        Some(_) => None,
        None => c
            .original_dst()
            .map(|addr| parent::Known { name: None, addr }),
    };
    let known = known.or(original.as_ref());
    if let Err(res) = run(c, &t, &mut st, known) {
        c.res = res;
    }
    c.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
    c.next()
}

/// What the session learned, for its record.
struct State {
    lv: i32,
    host: Option<String>,
    alpn: Option<Vec<u8>>,
    /// The client's bytes read so far.
    buf: Vec<u8>,
}

fn run(
    c: &mut Client,
    t: &TlsOpts,
    st: &mut State,
    known: Option<&parent::Known>,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let wait = svc.timeouts.get(Timeouts::STRING_SHORT);
    // STARTTLS: a mail proxy has done the client's side already, or `-X`
    // asks for both sides here.
    let done = c.starttls.take();
    let proto = done.or(t.starttls);
    if let (None, Some(p)) = (done, t.starttls) {
        if !client_starttls(c, p, &mut st.buf)? {
            // The client left before asking for TLS.
            return Ok(());
        }
    }
    let read = read_record(&c.cli, &mut st.buf, svc.bufsize, wait);
    match read {
        Ok(n) if st.buf[0] == HANDSHAKE => {
            st.lv = st.buf[2] as i32;
            match parse_hello(CLIENT_HELLO, &st.buf[..n], &mut st.lv) {
                Ok(h) => {
                    st.alpn = h.alpn;
                    if let Some(sni) = h.sni {
                        st.host = Some(host_name(&sni).ok_or(Res::NOHOST)?);
                    }
                }
                Err(e) if t.check > 0 => return Err(Res::tls(Res::TLS_CLIENT_HELLO, e)),
                Err(_) => {}
            }
        }
        // 3proxy logs 300 minus the record's length for a record that
        // is not a handshake: the code is 300 here.
        Ok(_) if t.check > 0 => return Err(Res::TLS_RECORD),
        Err(e) if t.check > 0 => return Err(Res::tls(Res::TLS_RECORD, e)),
        _ => {}
    }
    if st.host.is_none() {
        // No SNI: a redirected client keeps the name it asked for.
        st.host = known.and_then(|k| k.name.clone());
    }
    c.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
    c.req_host.clone_from(&st.host);
    let port = t.port_for(proto);
    let (dst, port) = match (known, &st.host) {
        (Some(k), _) => (Some(k.addr), k.addr.port()),
        (None, Some(h)) => (Some(resolve(h, port, svc.family)?), port),
        (None, None) => (None, port),
    };
    c.req_addr = dst;
    let req = Request {
        host: st.host.as_deref(),
        addr: dst.map(|a| a.ip()),
        port: if dst.is_some() { port } else { 0 },
        user: None,
        password: None,
        ..c.request(Op::Connect)
    };
    let (grant, again) = crate::session::admit(c, &req)?;
    // No name and not redirected: nowhere to go.
    let dst = dst.ok_or(Res::NOHOST)?;
    if c.is_self(dst) {
        return Err(Res::LOOP);
    }
    let Some(srv) = connect(c, dst, st, &grant.parents)? else {
        // Handed over to a local handler, the hello with it.
        return Ok(());
    };
    if svc.mitm.is_some() && proto.is_none() {
        return intercepted(c, srv, st, dst, &grant, &again);
    }
    // What the server sent that the client has still to get.
    let mut to_client = Vec::new();
    if let Some(p) = proto {
        if let Err(e) = server_starttls(c, &srv, p, &mut to_client) {
            // A TLS alert (handshake failure) tells the client.
            let _ = c.cli.set_timeout(Some(wait));
            let _ = (&c.cli).write_all(b"\x15\x03\x01\x00\x02\x02\x28");
            c.srv = Some(srv);
            return Err(e);
        }
    }
    let sent = (&srv).write_all(&st.buf);
    c.bytes_out += st.buf.len() as u64;
    st.buf.clear();
    if sent.is_err() {
        c.srv = Some(srv);
        return Err(Res::SERVER_ERR);
    }
    // What the client sent that the server has still to get.
    let mut to_server = Vec::new();
    if t.check > 1 {
        if let Err(e) = check_server(c, &srv, t, st, &mut to_client, &mut to_server) {
            c.srv = Some(srv);
            return Err(e);
        }
    }
    if !to_client.is_empty() {
        to_cli(c, &to_client, wait).map_err(|()| Res::CLIENT_ERR)?;
    }
    crate::session::relay_to_parking(
        c,
        srv,
        &grant,
        &again,
        &to_server,
        Timeouts::CONNECTION_LONG,
    );
    Ok(())
}

/// `ssl_mitm`: TLS with the destination (the SNI, or the name or address
/// it was redirected to, asked and checked), then with the client, whose
/// ClientHello was read already; HTTP inside is served by the HTTP proxy,
/// anything else relayed. The `-c` checks of the server's records do not
/// apply: the proxy is the destination's TLS client itself.
fn intercepted(
    c: &mut Client,
    mut srv: Stream,
    st: &mut State,
    dst: SocketAddr,
    grant: &crate::access::Grant,
    again: &crate::access::Recheck,
) -> Result<(), Res> {
    let host = st
        .host
        .clone()
        .unwrap_or_else(|| crate::addr::ip_text(dst.ip()));
    let hello = std::mem::take(&mut st.buf);
    if let Err(res) = crate::session::intercept_hello(c, &mut srv, &host, &hello) {
        c.srv = Some(srv);
        return Err(res);
    }
    let inside = crate::services::proxy::Inside {
        host,
        port: dst.port(),
        addr: dst,
        user: None,
        password: None,
    };
    let hops = c.hops.saturating_sub(c.local_hops);
    if let Some(srv) = crate::services::proxy::serve_inside(c, srv, inside, &grant.parents, hops) {
        crate::session::relay_to_parking(c, srv, grant, again, &[], Timeouts::CONNECTION_LONG);
    }
    Ok(())
}

/// `-c2` and up: the server's first record must be a ServerHello; with
/// `-c3` its handshake must carry a certificate (which TLS 1.3 hides),
/// with `-c4` it must ask the client for one and the client must send
/// one. The records looked at are passed on as they come; the last one
/// read from each side is left in `to_client` / `to_server`.
fn check_server(
    c: &mut Client,
    srv: &Stream,
    t: &TlsOpts,
    st: &mut State,
    to_client: &mut Vec<u8>,
    to_server: &mut Vec<u8>,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let wait = svc.timeouts.get(Timeouts::STRING_SHORT);
    let mut sbuf = std::mem::take(to_client);
    let n = match read_record(srv, &mut sbuf, svc.bufsize, wait) {
        Ok(n) if sbuf[0] == HANDSHAKE => n,
        Ok(_) => return Err(Res::TLS_SERVER_RECORD),
        Err(e) => return Err(Res::tls(Res::TLS_SERVER_RECORD, e)),
    };
    st.lv = sbuf[2] as i32;
    parse_hello(SERVER_HELLO, &sbuf[..n], &mut st.lv)
        .map_err(|e| Res::tls(Res::TLS_SERVER_HELLO, e))?;
    c.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
    if t.check < 3 {
        *to_client = sbuf;
        return Ok(());
    }
    if st.lv > 3 {
        return Err(Res::TLS_CERT_HIDDEN);
    }
    let mut flight = Flight::default();
    let (mut cert, mut asks, mut done) = (false, false, false);
    let mut look = |flight: &mut Flight, rec: &[u8], done: &mut bool| {
        flight.feed(&rec[RECORD_HEAD..], |kind, len| match kind {
            CERTIFICATE => cert |= len > CERT_MIN,
            CERTIFICATE_REQUEST => asks = true,
            SERVER_HELLO_DONE => *done = true,
            _ => {}
        })
    };
    // The ServerHello's record may carry the rest of the flight.
    look(&mut flight, &sbuf[..n], &mut done);
    loop {
        to_cli(c, &sbuf, wait).map_err(|()| Res::TLS_TO_CLIENT)?;
        sbuf.clear();
        if done {
            break;
        }
        let n = read_record(srv, &mut sbuf, svc.bufsize, wait)
            .map_err(|e| Res::tls(Res::TLS_SERVER_FLIGHT, e))?;
        if sbuf[0] != HANDSHAKE {
            // Left for the relay to pass on.
            break;
        }
        look(&mut flight, &sbuf[..n], &mut done);
    }
    *to_client = sbuf;
    if !cert {
        return Err(Res::TLS_NO_SERVER_CERT);
    }
    if t.check < 4 {
        return Ok(());
    }
    if !asks {
        return Err(Res::TLS_NO_CERT_REQUEST);
    }
    // The client's answer: its Certificate first.
    if !to_client.is_empty() {
        to_cli(c, to_client, wait).map_err(|()| Res::TLS_TO_CLIENT)?;
        to_client.clear();
    }
    let mut flight = Flight::default();
    let mut cert = false;
    let mut cbuf = Vec::new();
    loop {
        let n = read_record(&c.cli, &mut cbuf, svc.bufsize, wait)
            .map_err(|e| Res::tls(Res::TLS_CLIENT_FLIGHT, e))?;
        if cbuf[0] != HANDSHAKE {
            break;
        }
        flight.feed(&cbuf[RECORD_HEAD..n], |kind, len| {
            if kind == CERTIFICATE {
                cert |= len > CERT_MIN;
            }
        });
        let _ = srv.set_timeout(Some(wait));
        (&*srv)
            .write_all(&cbuf)
            .map_err(|_| Res::TLS_NO_CLIENT_CERT)?;
        c.bytes_out += cbuf.len() as u64;
        cbuf.clear();
    }
    *to_server = cbuf;
    if !cert {
        return Err(Res::TLS_NO_CLIENT_CERT);
    }
    Ok(())
}

/// Pass server bytes `b` to the client within `wait`, counted as %I.
fn to_cli(c: &mut Client, b: &[u8], wait: Duration) -> Result<(), ()> {
    let _ = c.cli.set_timeout(Some(wait));
    (&c.cli).write_all(b).map_err(|_| ())?;
    c.bytes_in += b.len() as u64;
    Ok(())
}

/// The handshake messages in a run of records, however they are split
/// across them: calls back with each message's type and length as its
/// header completes.
#[derive(Default)]
struct Flight {
    /// A message header read in part.
    head: Vec<u8>,
    /// Bytes of the current message's body still to skip.
    left: usize,
}

impl Flight {
    fn feed(&mut self, mut data: &[u8], mut on: impl FnMut(u8, usize)) {
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
const CERT_MIN: usize = 64;
/// Handshake message types tlspr `-c3`/`-c4` look for.
const CERTIFICATE: u8 = 11;
const CERTIFICATE_REQUEST: u8 = 13;
const SERVER_HELLO_DONE: u8 = 14;

/// The longest line of a STARTTLS dialogue (3proxy's buffer less slack).
const STARTTLS_LINE: usize = 1014;

/// STARTTLS with the client, as a server of `proto` that offers nothing
/// but STARTTLS. Ok(true) when the client asked for TLS (what it sent
/// after that line is left in `rest`), Ok(false) when it quit; Err 364
/// when the dialogue failed.
fn client_starttls(c: &mut Client, proto: StartTls, rest: &mut Vec<u8>) -> Result<bool, Res> {
    use super::login::{starts_ci, Lines};
    let wait = c.svc().timeouts.get(Timeouts::STRING_SHORT);
    let _ = c.cli.set_timeout(Some(wait));
    let fail = |_| Res::STARTTLS_CLIENT;
    let cli = &c.cli;
    let say = |m: &[u8]| (&*cli).write_all(m);
    let greeting: &[u8] = match proto {
        StartTls::Imap => {
            b"* OK [CAPABILITY IMAP4rev1 STARTTLS LOGINDISABLED] IMAP4rev1 Proxy Ready\r\n"
        }
        StartTls::Pop3 => b"+OK Proxy\r\n",
        StartTls::Smtp => b"220 Proxy\r\n",
    };
    say(greeting).map_err(fail)?;
    let mut lines = Lines::with(rest);
    loop {
        let line = lines.line(cli, STARTTLS_LINE, wait);
        if line.len() < 4 {
            return Err(Res::STARTTLS_CLIENT);
        }
        let go = match proto {
            StartTls::Imap => {
                let end = line
                    .iter()
                    .position(|&b| b == b'\r' || b == b'\n')
                    .unwrap_or(line.len());
                let l = &line[..end];
                let Some(sp) = l.iter().position(|&b| b == b' ').filter(|&i| i < 63) else {
                    return Err(Res::STARTTLS_CLIENT);
                };
                let tag = String::from_utf8_lossy(&l[..sp.min(60)]).into_owned();
                let cmd = &l[sp + 1..];
                if starts_ci(cmd, b"LOGOUT") {
                    let _ = say(format!("* BYE\r\n{tag} OK LOGOUT completed\r\n").as_bytes());
                    return Ok(false);
                } else if starts_ci(cmd, b"CAPABILITY") {
                    let m = format!(
                        "* CAPABILITY IMAP4rev1 STARTTLS LOGINDISABLED\r\n{tag} OK CAPABILITY completed\r\n"
                    );
                    say(m.as_bytes()).map_err(fail)?;
                    false
                } else if starts_ci(cmd, b"STARTTLS") {
                    say(format!("{tag} OK Begin TLS negotiation\r\n").as_bytes()).map_err(fail)?;
                    true
                } else {
                    say(format!("{tag} BAD need STARTTLS first\r\n").as_bytes()).map_err(fail)?;
                    false
                }
            }
            StartTls::Pop3 => {
                if starts_ci(&line, b"STLS") {
                    say(b"+OK Begin TLS negotiation\r\n").map_err(fail)?;
                    true
                } else if starts_ci(&line, b"CAPA") {
                    say(b"+OK Capability list follows\r\nSTLS\r\n.\r\n").map_err(fail)?;
                    false
                } else if starts_ci(&line, b"QUIT") {
                    let _ = say(b"+OK\r\n");
                    return Ok(false);
                } else {
                    say(b"-ERR need STLS first\r\n").map_err(fail)?;
                    false
                }
            }
            StartTls::Smtp => {
                if starts_ci(&line, b"STARTTLS") {
                    say(b"220 2.0.0 Ready to start TLS\r\n").map_err(fail)?;
                    true
                } else if starts_ci(&line, b"EHLO ") {
                    say(b"250-Proxy\r\n250 STARTTLS\r\n").map_err(fail)?;
                    false
                } else if starts_ci(&line, b"HELO ") {
                    say(b"250 Proxy\r\n").map_err(fail)?;
                    false
                } else if starts_ci(&line, b"QUIT") {
                    let _ = say(b"221 Proxy\r\n");
                    return Ok(false);
                } else {
                    say(b"530 5.7.0 Must issue a STARTTLS command first\r\n").map_err(fail)?;
                    false
                }
            }
        };
        if go {
            *rest = std::mem::take(&mut lines.buf);
            return Ok(true);
        }
    }
}

/// Whether `line` names `cap` anywhere (3proxy's hascap: a substring,
/// any case).
fn has_cap(line: &[u8], cap: &[u8]) -> bool {
    line.windows(cap.len()).any(|w| w.eq_ignore_ascii_case(cap))
}

/// STARTTLS with the server, as a client of `proto`: its greeting, its
/// capabilities, then the command and its go-ahead. Err 361 a greeting
/// not of the protocol, 362 the exchange failed, 363 no STARTTLS there.
/// Bytes the server sent after its last line go to `rest`.
fn server_starttls(
    c: &Client,
    srv: &Stream,
    proto: StartTls,
    rest: &mut Vec<u8>,
) -> Result<(), Res> {
    use super::login::{starts_ci, Lines};
    let svc = c.svc();
    let long = svc.timeouts.get(Timeouts::STRING_LONG);
    let _ = srv.set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
    let io = |_| Res::STARTTLS_SERVER_IO;
    let send = |m: &[u8]| (&*srv).write_all(m).map_err(io);
    let mut lines = Lines::default();
    let mut line = |min: usize| {
        let l = lines.line(srv, STARTTLS_LINE, long);
        if l.len() < min {
            Err(Res::STARTTLS_SERVER_IO)
        } else {
            Ok(l)
        }
    };
    let greeting = |l: &[u8], min: usize, start: &[u8]| {
        if l.len() < min || !starts_ci(l, start) {
            Err(Res::STARTTLS_SERVER_GREETING)
        } else {
            Ok(())
        }
    };
    match proto {
        StartTls::Imap => {
            let g = line(0)?;
            greeting(&g, 4, b"* OK")?;
            if !has_cap(&g, b"STARTTLS") {
                send(b"zz CAPABILITY\r\n")?;
                let mut found = false;
                loop {
                    let l = line(3)?;
                    found |= starts_ci(&l, b"* CAPABILITY") && has_cap(&l, b"STARTTLS");
                    if starts_ci(&l, b"zz ") {
                        break;
                    }
                }
                if !found {
                    return Err(Res::STARTTLS_SERVER_REFUSED);
                }
            }
            send(b"zz STARTTLS\r\n")?;
            let l = line(5)?;
            if !starts_ci(&l, b"zz OK") {
                return Err(Res::STARTTLS_SERVER_REFUSED);
            }
        }
        StartTls::Pop3 => {
            let g = line(0)?;
            greeting(&g, 3, b"+OK")?;
            send(b"CAPA\r\n")?;
            let mut found = false;
            loop {
                let l = line(1)?;
                if l[0] == b'.' {
                    break;
                }
                if starts_ci(&l, b"-ERR") {
                    return Err(Res::STARTTLS_SERVER_IO);
                }
                found |= has_cap(&l, b"STLS");
            }
            if !found {
                return Err(Res::STARTTLS_SERVER_REFUSED);
            }
            send(b"STLS\r\n")?;
            if !starts_ci(&line(3)?, b"+OK") {
                return Err(Res::STARTTLS_SERVER_REFUSED);
            }
        }
        StartTls::Smtp => {
            // A multi-line reply: lines with '-' after the code go on.
            let mut reply = |found: &mut bool| -> Result<Vec<u8>, Res> {
                loop {
                    let l = line(0)?;
                    *found |= has_cap(&l, b"STARTTLS");
                    if l.len() <= 3 || l[3] != b'-' {
                        return Ok(l);
                    }
                }
            };
            let g = reply(&mut false)?;
            greeting(&g, 3, b"220")?;
            let me = c
                .local_addr
                .map(|a| crate::addr::ip_text(a.ip()))
                .unwrap_or_default();
            send(format!("EHLO [{me}]\r\n").as_bytes())?;
            let mut found = false;
            let l = reply(&mut found)?;
            if l.len() < 3 || !starts_ci(&l, b"250") {
                return Err(Res::STARTTLS_SERVER_IO);
            }
            if !found {
                return Err(Res::STARTTLS_SERVER_REFUSED);
            }
            send(b"STARTTLS\r\n")?;
            let l = line(3)?;
            if !starts_ci(&l, b"220") {
                return Err(Res::STARTTLS_SERVER_REFUSED);
            }
        }
    }
    *rest = std::mem::take(&mut lines.buf);
    Ok(())
}

/// Connect to `dst` (the name `st.host`), through the grant's parents.
/// Ok(None): a local redirection took the client, with the bytes read so
/// far (see [`parent::hand_over`]).
fn connect(
    c: &mut Client,
    dst: SocketAddr,
    st: &mut State,
    parents: &[parent::Hop],
) -> Result<Option<Stream>, Res> {
    let svc = c.svc().clone();
    let want = chain::Want {
        addr: Some(dst),
        host: st.host.as_deref(),
        client: c.client_addr,
        local: c.local_addr,
        ..chain::Want::default()
    };
    let chain = match chain::connect(&svc, parents, &want)? {
        chain::Route::Stream(chain) => chain,
        chain::Route::Local { kind, hops } => {
            c.hand_over(parent::Handoff {
                kind,
                hops,
                early: std::mem::take(&mut st.buf),
                dest: Some(parent::Known {
                    name: st.host.clone(),
                    addr: dst,
                }),
            })?;
            return Ok(None);
        }
    };
    crate::session::note_chain(c, &chain, dst);
    Ok(Some(chain.stream))
}

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
        assert_eq!(
            text(lv, Some("example.com"), h.alpn.as_deref()),
            "TLSv1.3 example.com h2"
        );
        assert_eq!(text(-1, None, None), "NONEv0.0 - -");
        assert_eq!(text(0, None, None), "SSLv3.0 - -");
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
    fn host_names_must_be_printable() {
        assert_eq!(host_name(b"a.example").as_deref(), Some("a.example"));
        assert_eq!(host_name(b"a b"), None);
        assert_eq!(host_name(b"a\0b"), None);
        assert_eq!(host_name(&[0xc3, 0xa9]), None);
    }

    #[test]
    fn options_p_and_c() {
        let o = |s: &str| {
            let args: Vec<String> = s.split_whitespace().map(String::from).collect();
            options(&ServiceOpts::parse(&args, 1400).unwrap())
        };
        assert_eq!(o("").unwrap(), TlsOpts::default());
        assert_eq!(
            o("-P8443 -c").unwrap(),
            TlsOpts {
                port: 8443,
                port_given: true,
                check: 1,
                starttls: None,
            }
        );
        assert_eq!(
            o("-P0 -c2").unwrap(),
            TlsOpts {
                port: 443,
                check: 2,
                ..TlsOpts::default()
            }
        );
        assert_eq!(o("-c4").unwrap().check, 4);
        assert!(o("-c5").is_err());
        assert!(o("-c9").is_err());
        assert_eq!(o("-XIMAP4").unwrap().starttls, Some(StartTls::Imap));
        assert_eq!(o("-Xpop3").unwrap().starttls, Some(StartTls::Pop3));
        assert_eq!(o("-Xsmtp").unwrap().starttls, Some(StartTls::Smtp));
        assert!(o("-Xftp").is_err());
        // -P wins over a protocol's port.
        assert_eq!(o("-Xsmtp").unwrap().port_for(Some(StartTls::Smtp)), 587);
        assert_eq!(o("-P25 -Xsmtp").unwrap().port_for(Some(StartTls::Smtp)), 25);
        assert_eq!(o("").unwrap().port_for(None), 443);
        assert!(o("-Pxyz").is_err());
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
