//! What the mail proxies (`pop3p`, `imapp`, `smtpp`) and `ftppr` share:
//! reading protocol lines off a socket, and admitting and dialing the
//! destination of a login (`proto::mail` splits the lines and the
//! `name@host[:port]` login, as 3proxy does). Not a service: the services
//! import it.

use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::access::{self, Op, Recheck, Request};
use crate::chain;
use crate::client::{Client, StartTls};
use crate::net::Stream;
use crate::parent;
use crate::proto::mail::{Lines, Login};
use crate::res::Res;
use crate::resolve::resolve;

/// Reading [`Lines`] off a socket; the splitting is `proto::mail`'s.
impl Lines {
    /// One line up to and including `\n`, at most `max` bytes; fewer (maybe
    /// none) when the peer closes or `wait` passes first.
    pub(crate) fn line(&mut self, s: &Stream, max: usize, wait: Duration) -> Vec<u8> {
        let until = Instant::now() + wait;
        self.line_from(max, |chunk| {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let mut r = s;
            r.read(chunk)
        })
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
    crate::session::note_chain(c, &chain);
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
