//! `pop3p`: the POP3 proxy (3proxy's pop3p.c, pop3p(8)). The client is
//! greeted as by a POP3 server and logs in with `USER name@host[:port]`;
//! the proxy connects to `host` (port 110 by default), checks that it
//! greets with `+OK`, sends `USER name` on, and from then relays both
//! ways: the server's answer to USER, PASS and the rest pass untouched.
//!
//! The login is split at its last `delimchar` (`@` by default). With `-u`
//! not set to 0, `proxyuser:proxypass:name@host` also carries the proxy's
//! own credentials, checked by `auth` as for any service (op CONNECT).
//! `-hhost[:port]` is the destination of a login without a host.
//!
//! Before USER, QUIT is answered `+OK` and any other command
//! `-ERR need USER first`; STLS is not offered (3proxy's STARTTLS hand-over
//! to tlspr is not built), as with 3proxy's `-x`. Result codes are
//! 3proxy's: 611 the greeting could not be sent, 612 no command came, 614
//! not a USER command, 615 a bad login, 621 no banner from the server, 622
//! the banner is not `+OK` or is another proxy's, 623 USER could not be
//! sent. A session ending with a code of 1 to 99 or 612 to 699 is told
//! `-ERR`. The record's `%T` is `name@host`, with `:port` when it is not
//! 110.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::access::{self, Op, Recheck, Request};
use crate::chain;
use crate::client::Client;
use crate::net::{resolve, Stream};
use crate::parent;
use crate::relay::RelayOpts;
use crate::res::Res;
use crate::timeouts::Timeouts;

/// The destination port when the login names none.
pub const DEFAULT_PORT: u16 = 110;
/// The longest client command line read (3proxy's buffer less its slack).
const CLIENT_LINE: usize = 310;
/// The longest server banner line read.
const SERVER_LINE: usize = 319;

const GREET_FAILED: Res = Res::POP3_GREET_FAILED;
const NO_COMMAND: Res = Res::POP3_NO_COMMAND;
const NOT_USER: Res = Res::POP3_NOT_USER;
const BAD_LOGIN: Res = Res::POP3_BAD_LOGIN;
const NO_BANNER: Res = Res::POP3_NO_BANNER;
const BAD_BANNER: Res = Res::POP3_BAD_BANNER;
const USER_FAILED: Res = Res::POP3_USER_FAILED;

/// Lines read from a socket, with what came after them kept for the relay.
#[derive(Default)]
pub(super) struct Lines {
    pub(super) buf: Vec<u8>,
    /// Bytes read from the socket in all.
    pub(super) total: u64,
}

impl Lines {
    /// A reader with `early` already read (by the handler that handed the
    /// client over).
    pub(super) fn with(early: &[u8]) -> Lines {
        Lines {
            buf: early.to_vec(),
            total: 0,
        }
    }

    /// A whole line already read, if there is one.
    pub(super) fn buffered(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        Some(self.buf.drain(..=end).collect())
    }

    /// One line up to and including `\n`, at most `max` bytes; fewer (maybe
    /// none) when the peer closes or `wait` passes first.
    pub(super) fn line(&mut self, s: &Stream, max: usize, wait: Duration) -> Vec<u8> {
        let until = Instant::now() + wait;
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
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
                return self.buf.drain(..).collect();
            }
            let mut chunk = [0u8; 512];
            let mut r = s;
            match r.read(&mut chunk) {
                Ok(n) if n > 0 => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.total += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => return self.buf.drain(..).collect(),
            }
        }
    }
}

/// What `USER` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Login {
    /// The proxy's own credentials (`proxyuser:proxypass:name`).
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    /// The name for the POP3 server.
    pub(super) name: String,
    pub(super) host: String,
    pub(super) port: u16,
}

pub(super) fn starts_ci(line: &[u8], word: &[u8]) -> bool {
    line.len() >= word.len() && line[..word.len()].eq_ignore_ascii_case(word)
}

pub(super) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address;
/// `port` when none is given.
pub(super) fn parse_host(s: &[u8], port: u16) -> Option<(String, u16)> {
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
pub(super) fn parse_login(
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
        let mut parts = name.splitn(3, |&b| b == b':');
        if let (Some(u), Some(p), Some(n)) = (parts.next(), parts.next(), parts.next()) {
            login.user = (!u.is_empty()).then(|| text(u));
            login.password = (!p.is_empty()).then(|| text(p));
            login.name = text(n);
        }
    }
    Some(login)
}

/// `-hhost[:port]`: the destination of logins without a host, and the
/// port of a host without one.
fn default_dest(other: &[String]) -> (Option<String>, u16) {
    let h = other.iter().rev().find_map(|a| a.strip_prefix("-h"));
    match h.and_then(|h| parse_host(h.as_bytes(), DEFAULT_PORT)) {
        Some((host, port)) => (Some(host), port),
        None => (None, DEFAULT_PORT),
    }
}

/// The client thread's work for one pop3p client.
pub fn serve(c: &mut Client) {
    let svc = c.svc().clone();
    if svc.opts.proxy_header && !super::tcppm::read_proxy_header(c) {
        return;
    }
    serve_redirected(c, &[], None);
}

/// `parent pop3 0.0.0.0 0` in another service's ACL: greet the client
/// as pop3p does (`early`, what it sent before, is read first); a `USER`
/// without a host logs in at the destination the first handler chose
/// (3proxy's parseconnusername with a host known). The ACL is checked
/// again with the entries that redirect locally skipped.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve_redirected(c: &mut Client, early: &[u8], known: Option<&parent::Known>) {
    let svc = c.svc().clone();
    let mut login = None;
    if let Err(res) = run(c, &mut login, early, known) {
        c.res = res;
    }
    if let Some(l) = &login {
        c.text = format!("{}@{}", l.name, l.host);
        if l.port != DEFAULT_PORT {
            c.text.push_str(&format!(":{}", l.port));
        }
    }
    let told = matches!(c.res.0, 1..=99 | 612..=699);
    if told {
        let _ = c
            .cli
            .set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
        let _ = (&c.cli).write_all(b"-ERR\r\n");
    }
}

fn run(
    c: &mut Client,
    login: &mut Option<Login>,
    early: &[u8],
    known: Option<&parent::Known>,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let short = svc.timeouts.get(Timeouts::STRING_SHORT);
    let _ = c.cli.set_timeout(Some(short));
    (&c.cli)
        .write_all(b"+OK Proxy\r\n")
        .map_err(|_| GREET_FAILED)?;
    let mut from_cli = Lines::with(early);
    let mut line = from_cli.line(&c.cli, CLIENT_LINE, short);
    while line.len() > 4 && !starts_ci(&line, b"USER") {
        if starts_ci(&line, b"QUIT") {
            let _ = (&c.cli).write_all(b"+OK\r\n");
            return Ok(());
        }
        let _ = (&c.cli).write_all(b"-ERR need USER first\r\n");
        line = from_cli.line(&c.cli, CLIENT_LINE, short);
    }
    if line.len() < 6 {
        return Err(NO_COMMAND);
    }
    let end = line
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(line.len());
    let line = &line[..end];
    if !starts_ci(line, b"USER ") {
        return Err(NOT_USER);
    }
    let (dhost, dport) = match known {
        Some(k) => (Some(k.host()), k.addr.port()),
        None => default_dest(&svc.opts.other),
    };
    let creds = svc.opts.needuser.unwrap_or(1) > 0;
    let l = parse_login(&line[5..], svc.delimchar, creds, (dhost.as_deref(), dport))
        .ok_or(BAD_LOGIN)?;
    c.req_host = Some(l.host.clone());
    c.user.clone_from(&l.user);
    let l = login.insert(l);
    let dst = resolve_login(l, known, svc.family).map_err(|_| BAD_LOGIN)?;
    c.req_addr = Some(dst);
    let (grant, again) = admit_login(c, l, dst)?;
    let srv = connect(c, dst, l, &grant.parents)?;
    let mut from_srv = Lines::default();
    let banner = from_srv.line(&srv, SERVER_LINE, svc.timeouts.get(Timeouts::STRING_LONG));
    c.bytes_in += from_srv.total;
    if banner.len() < 3 {
        return Err(NO_BANNER);
    }
    if !starts_ci(&banner, b"+OK") || starts_ci(banner.get(4..).unwrap_or(&[]), b"PROXY") {
        return Err(BAD_BANNER);
    }
    let _ = srv.set_timeout(Some(short));
    if l.name.is_empty() {
        return Err(USER_FAILED);
    }
    let user = format!("USER {}\r\n", l.name);
    (&srv).write_all(user.as_bytes()).map_err(|_| USER_FAILED)?;
    c.bytes_out += user.len() as u64;
    // What either side sent after its line goes on first.
    if !from_cli.buf.is_empty() {
        (&srv)
            .write_all(&from_cli.buf)
            .map_err(|_| Res::SERVER_ERR)?;
        c.bytes_out += from_cli.buf.len() as u64;
    }
    if !from_srv.buf.is_empty() {
        (&c.cli)
            .write_all(&from_srv.buf)
            .map_err(|_| Res::CLIENT_ERR)?;
    }
    let opts = RelayOpts {
        idle: svc.timeouts.get(Timeouts::CONNECTION_SHORT),
        session_end: svc.opts.session_end,
        splice: svc.splice(),
        bufsize: svc.bufsize,
        grace: svc.opts.grace,
    };
    let out = super::tcppm::relay_logged(c, &srv, &opts, grant.limits.as_deref(), &again);
    c.res = out.res;
    c.bytes_out += out.out;
    c.bytes_in += out.inb;
    c.srv = Some(srv);
    Ok(())
}

/// Where a login's host is: the address the first handler resolved when
/// the login goes to the destination it chose, else looked up.
pub(super) fn resolve_login(
    l: &Login,
    known: Option<&parent::Known>,
    family: crate::net::Family,
) -> Result<SocketAddr, Res> {
    match known {
        Some(k) if k.addr.port() == l.port && k.host() == l.host => Ok(k.addr),
        _ => resolve(&l.host, l.port, family),
    }
}

/// Check a login's destination `dst` with the access layer, as CONNECT
/// to the login's host: the grant (its `nolog` and user name already
/// applied to `c`) and what to check again after a reload. A destination
/// that is this service itself is refused (a loop). Shared by the mail
/// and FTP proxies.
pub(super) fn admit_login(
    c: &mut Client,
    l: &Login,
    dst: SocketAddr,
) -> Result<(access::Grant, Recheck), Res> {
    let svc = c.svc().clone();
    let req = Request {
        op: Some(Op::Connect),
        client: c.client_addr,
        local: c.local_addr,
        host: Some(&l.host),
        addr: Some(dst.ip()),
        port: l.port,
        user: l.user.as_deref(),
        password: l.password.as_deref(),
    };
    let grant = access::authorize(&svc, &req)?;
    c.logged |= grant.nolog;
    if grant.user.is_some() {
        c.user.clone_from(&grant.user);
    }
    let again = Recheck::new(&svc, &req)
        .since(c.generation)
        .at_weight(grant.weight);
    if crate::net::Addr::Ip(dst) == svc.listen || Some(dst) == c.local_addr {
        return Err(Res::LOOP);
    }
    Ok((grant, again))
}

/// Connect to `dst` through the grant's parents.
pub(super) fn connect(
    c: &mut Client,
    dst: SocketAddr,
    l: &Login,
    parents: &[parent::Hop],
) -> Result<Stream, Res> {
    let svc = c.svc().clone();
    let want = chain::Want {
        addr: Some(dst),
        host: Some(&l.host),
        user: l.user.as_deref(),
        password: l.password.as_deref(),
        client: c.client_addr,
        local: c.local_addr,
        sends_first: false,
    };
    let chain = match chain::connect(&svc, parents, &want)? {
        chain::Route::Stream(chain) => chain,
        // The mail proxies do not hand clients on (nor does 3proxy's).
        chain::Route::Local { .. } => return Err(Res::NOTIMPL),
    };
    c.hops = parent::local_hops() + chain.hops;
    c.remote_addr = if chain.hops == 0 {
        Some(dst)
    } else {
        chain.stream.peer_addr()
    };
    c.ext_addr = chain.stream.local_addr();
    Ok(chain.stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(arg: &str) -> Option<Login> {
        parse_login(arg.as_bytes(), b'@', true, (None, DEFAULT_PORT))
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
    fn default_host() {
        let d = default_dest(&["-hmail.example:995".to_string()]);
        assert_eq!(d, (Some("mail.example".to_string()), 995));
        let l = parse_login(b"bob", b'@', true, (d.0.as_deref(), d.1)).unwrap();
        assert_eq!((l.host.as_str(), l.port), ("mail.example", 995));
        let l = parse_login(b"bob@other", b'@', true, (d.0.as_deref(), d.1)).unwrap();
        assert_eq!((l.host.as_str(), l.port), ("other", 995));
        assert_eq!(default_dest(&[]), (None, 110));
    }
}
