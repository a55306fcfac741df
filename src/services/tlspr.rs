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
use crate::net::Stream;
use crate::parent;
use crate::proto::mail::has_cap;
use crate::proto::starts_ci;
use crate::proto::tls::{
    parse_hello, record_len, Flight, CERTIFICATE, CERTIFICATE_REQUEST, CERT_MIN, CLIENT_HELLO,
    HANDSHAKE, RECORD_HEAD, SERVER_HELLO, SERVER_HELLO_DONE,
};
use crate::res::Res;
use crate::resolve::resolve;
use crate::service::ServiceOpts;
use crate::session::{DestAt, Park};
use crate::timeouts::Timeouts;

/// The destination port when `-P` is not given (or is 0).
pub const DEFAULT_PORT: u16 = 443;

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
    let len = record_len(buf, max)?;
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
        c.record.res = res;
    }
    c.record.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
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
    // The ClientHello is in (or the wait for it is over).
    c.live.busy();
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
    c.record.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
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
    c.record.bytes_out += st.buf.len() as u64;
    c.record.ops.writes += 1;
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
    crate::session::relay_to(
        c,
        srv,
        &grant,
        &again,
        &to_server,
        Timeouts::CONNECTION_LONG,
        Park::WhenQuiet,
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
        crate::session::relay_to(
            c,
            srv,
            grant,
            again,
            &[],
            Timeouts::CONNECTION_LONG,
            Park::WhenQuiet,
        );
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
    c.record.text = text(st.lv, st.host.as_deref(), st.alpn.as_deref());
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
        c.record.bytes_out += cbuf.len() as u64;
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
    c.record.bytes_in += b.len() as u64;
    Ok(())
}

/// The longest line of a STARTTLS dialogue (3proxy's buffer less slack).
const STARTTLS_LINE: usize = 1014;

/// What a STARTTLS dialogue with the client does after it answered a
/// command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// TLS begins.
    Tls,
    /// The next command is read.
    More,
    /// The client quit.
    Quit,
}

/// An untagged STARTTLS dialogue with the client (POP3's, SMTP's): for
/// each command, known by its start in any case, the answer and what
/// comes after it; and the answer to any other command.
struct Dialogue {
    commands: &'static [(&'static [u8], &'static [u8], Then)],
    other: &'static [u8],
}

impl Dialogue {
    /// The answer to the command `line` and what comes after it.
    fn answer(&self, line: &[u8]) -> (&'static [u8], Then) {
        let known = self.commands.iter().find(|c| starts_ci(line, c.0));
        known.map_or((self.other, Then::More), |c| (c.1, c.2))
    }
}

const POP3: Dialogue = Dialogue {
    commands: &[
        (b"STLS", b"+OK Begin TLS negotiation\r\n", Then::Tls),
        (
            b"CAPA",
            b"+OK Capability list follows\r\nSTLS\r\n.\r\n",
            Then::More,
        ),
        (b"QUIT", b"+OK\r\n", Then::Quit),
    ],
    other: b"-ERR need STLS first\r\n",
};

const SMTP: Dialogue = Dialogue {
    commands: &[
        (b"STARTTLS", b"220 2.0.0 Ready to start TLS\r\n", Then::Tls),
        (b"EHLO ", b"250-Proxy\r\n250 STARTTLS\r\n", Then::More),
        (b"HELO ", b"250 Proxy\r\n", Then::More),
        (b"QUIT", b"221 Proxy\r\n", Then::Quit),
    ],
    other: b"530 5.7.0 Must issue a STARTTLS command first\r\n",
};

/// STARTTLS with the client, as a server of `proto` that offers nothing
/// but STARTTLS. Ok(true) when the client asked for TLS (what it sent
/// after that line is left in `rest`), Ok(false) when it quit; Err 364
/// when the dialogue failed.
fn client_starttls(c: &mut Client, proto: StartTls, rest: &mut Vec<u8>) -> Result<bool, Res> {
    use crate::proto::mail::Lines;
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
            StartTls::Pop3 | StartTls::Smtp => {
                let d = if proto == StartTls::Pop3 {
                    &POP3
                } else {
                    &SMTP
                };
                let (answer, then) = d.answer(&line);
                if then == Then::Quit {
                    let _ = say(answer);
                    return Ok(false);
                }
                say(answer).map_err(fail)?;
                then == Then::Tls
            }
        };
        if go {
            *rest = std::mem::take(&mut lines.buf);
            return Ok(true);
        }
    }
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
    use crate::proto::mail::Lines;
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
            let early = std::mem::take(&mut st.buf);
            c.hand_over(parent::Handoff::to(kind, hops, early, st.host.clone(), dst))?;
            return Ok(None);
        }
    };
    crate::session::note_chain(c, &chain);
    let mut srv = chain.stream;
    // `ssl_cli`: the client's own TLS goes inside a TLS session of ours
    // with the server, as in 3proxy (which applies it to every service
    // that connects); the outer session names the same host. tlspr
    // answers nothing first, so every mode handshakes here.
    // (The host's text only when there is a handshake to make: this runs
    // for every session.)
    let due = |at| crate::session::dest_tls_due(&svc, at, true).is_some();
    if due(DestAt::Reached) || due(DestAt::Answered) {
        let host = st
            .host
            .clone()
            .unwrap_or_else(|| crate::addr::ip_text(dst.ip()));
        for at in [DestAt::Reached, DestAt::Answered] {
            crate::session::tls_to_dest(c, &mut srv, &host, at, true)?;
        }
    }
    Ok(Some(srv))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn untagged_dialogues_answer_as_3proxy() {
        assert_eq!(
            POP3.answer(b"capa\r\n"),
            (
                &b"+OK Capability list follows\r\nSTLS\r\n.\r\n"[..],
                Then::More
            )
        );
        assert_eq!(POP3.answer(b"STLS\r\n").1, Then::Tls);
        assert_eq!(POP3.answer(b"Quit\r\n"), (&b"+OK\r\n"[..], Then::Quit));
        assert_eq!(
            POP3.answer(b"USER bob\r\n"),
            (&b"-ERR need STLS first\r\n"[..], Then::More)
        );
        assert_eq!(SMTP.answer(b"starttls\r\n").1, Then::Tls);
        assert_eq!(
            SMTP.answer(b"EHLO me\r\n"),
            (&b"250-Proxy\r\n250 STARTTLS\r\n"[..], Then::More)
        );
        assert_eq!(SMTP.answer(b"helo me\r\n").0, b"250 Proxy\r\n");
        assert_eq!(
            SMTP.answer(b"QUIT\r\n"),
            (&b"221 Proxy\r\n"[..], Then::Quit)
        );
        // EHLO without its space is another command.
        assert_eq!(
            SMTP.answer(b"EHLO\r\n"),
            (
                &b"530 5.7.0 Must issue a STARTTLS command first\r\n"[..],
                Then::More
            )
        );
    }

    #[test]
    fn record_text() {
        assert_eq!(
            text(4, Some("example.com"), Some(&b"h2"[..])),
            "TLSv1.3 example.com h2"
        );
        assert_eq!(text(-1, None, None), "NONEv0.0 - -");
        assert_eq!(text(0, None, None), "SSLv3.0 - -");
    }
}
