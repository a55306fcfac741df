//! What the mail proxies (`pop3p`, `imapp`, `smtpp`) and `ftppr` share:
//! reading protocol lines, splitting a `name@host[:port]` login as 3proxy
//! does (its last `delimchar`), and admitting and dialing the login's
//! destination. Not a service: the services import it.

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::access::{self, Op, Recheck, Request};
use crate::chain;
use crate::client::{Client, StartTls};
use crate::net::{resolve, Stream};
use crate::parent;
use crate::res::Res;

/// Lines read from a socket, with what came after them kept for the relay.
#[derive(Default)]
pub(crate) struct Lines {
    pub(crate) buf: Vec<u8>,
    /// Bytes read from the socket in all.
    pub(crate) total: u64,
}

impl Lines {
    /// A reader with `early` already read (by the handler that handed the
    /// client over).
    pub(crate) fn with(early: &[u8]) -> Lines {
        Lines {
            buf: early.to_vec(),
            total: 0,
        }
    }

    /// A whole line already read, if there is one.
    pub(crate) fn buffered(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        Some(self.buf.drain(..=end).collect())
    }

    /// One line up to and including `\n`, at most `max` bytes; fewer (maybe
    /// none) when the peer closes or `wait` passes first.
    pub(crate) fn line(&mut self, s: &Stream, max: usize, wait: Duration) -> Vec<u8> {
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
pub(crate) struct Login {
    /// The proxy's own credentials (`proxyuser:proxypass:name`).
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// The name for the POP3 server.
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) port: u16,
}

pub(super) fn starts_ci(line: &[u8], word: &[u8]) -> bool {
    line.len() >= word.len() && line[..word.len()].eq_ignore_ascii_case(word)
}

pub(super) fn text(b: &[u8]) -> String {
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
pub(super) fn proxy_credentials(name: &[u8], l: &mut Login) {
    let mut parts = name.splitn(3, |&b| b == b':');
    if let (Some(u), Some(p), Some(n)) = (parts.next(), parts.next(), parts.next()) {
        l.user = (!u.is_empty()).then(|| text(u));
        l.password = (!p.is_empty()).then(|| text(p));
        l.name = text(n);
    }
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
        host: Some(&l.host),
        addr: Some(dst.ip()),
        port: l.port,
        user: l.user.as_deref(),
        password: l.password.as_deref(),
        ..c.request(Op::Connect)
    };
    let (grant, again) = crate::session::admit(c, &req)?;
    if crate::net::Addr::Ip(dst) == svc.listen || Some(dst) == c.local_addr {
        return Err(Res::LOOP);
    }
    Ok((grant, again))
}

/// Connect to `dst` through the grant's parents (and TLS with it under
/// `ssl_cli`).
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
    };
    let chain = match chain::connect(&svc, parents, &want)? {
        chain::Route::Stream(chain) => chain,
        // The mail proxies do not hand clients on (nor does 3proxy's).
        chain::Route::Local { .. } => return Err(Res::NOTIMPL),
    };
    crate::session::note_chain(c, &chain, dst);
    // `ssl_cli`: the server speaks TLS from its first byte (POP3S, IMAPS,
    // SMTPS), the client in clear.
    let mut s = chain.stream;
    crate::session::tls_to_dest(c, &mut s, &l.host, crate::session::DestAt::Reached, false)?;
    Ok(s)
}

/// Whether a mail proxy offers STARTTLS: unless `-x` (3proxy's
/// `nostarttls`; a standalone program always has it).
pub(super) fn starttls_offered(c: &Client) -> bool {
    !c.svc().opts.other.iter().any(|a| a == "-x")
}

/// The client asked for STARTTLS (and was told to go ahead): hand it to
/// tlspr, which takes the destination from its ClientHello's SNI and
/// does STARTTLS with the server (3proxy's hand-over to tlsprchild).
/// `rest` is what the client sent after its command.
pub(super) fn to_tlspr(c: &mut Client, proto: StartTls, rest: Vec<u8>) -> Result<(), Res> {
    c.starttls = Some(proto);
    c.hand_over(parent::Handoff {
        kind: parent::Kind::Tls,
        // Not a redirection through the ACL: no hop.
        hops: 0,
        early: rest,
        dest: None,
    })
}
