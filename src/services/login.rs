//! What the mail proxies (`pop3p`, `imapp`, `smtpp`) and `ftppr` share:
//! reading protocol lines off a socket, and admitting and dialing the
//! destination of a login (`proto::mail` splits the lines and the
//! `name@host[:port]` login, as 3proxy does). Not a service: the services
//! import it.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::access::{self, Op, Recheck, Request};
use crate::chain;
use crate::client::{Client, StartTls};
use crate::net::Stream;
use crate::parent;
use crate::proto::mail::{parse_host, Lines, Login};
use crate::res::Res;
use crate::resolve::resolve;
use crate::session::Park;
use crate::timeouts::Timeouts;

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

/// `-hhost[:port]` among a service's options (the last one counts): the
/// destination of logins without a host; a host without a port takes
/// `port`.
pub(super) fn h_option(other: &[String], port: u16) -> Option<(String, u16)> {
    let h = other.iter().rev().find_map(|a| a.strip_prefix("-h"))?;
    parse_host(h.as_bytes(), port)
}

/// The destination of a mail proxy's login without a host: the one the
/// first handler chose (`known`), else `-h`'s (see [`h_option`]); with
/// neither, no host and the service's `port`.
pub(super) fn default_dest(
    other: &[String],
    known: Option<&parent::Known>,
    port: u16,
) -> (Option<String>, u16) {
    match known {
        Some(k) => (Some(k.host()), k.addr.port()),
        None => match h_option(other, port) {
            Some((host, port)) => (Some(host), port),
            None => (None, port),
        },
    }
}

/// A mail or FTP proxy's `%T`: the login's `name@host`, with `:port`
/// when it is not the service's `default` port.
pub(super) fn login_text(name: &str, host: &str, port: u16, default: u16) -> String {
    let mut t = format!("{name}@{host}");
    if port != default {
        t.push_str(&format!(":{port}"));
    }
    t
}

/// Tell the client of a failed session `msg` (its protocol's error
/// line), within the short timeout; whether it arrives does not matter.
pub(super) fn tell_failure(c: &Client, msg: &[u8]) {
    let _ = c
        .cli
        .set_timeout(Some(c.svc().timeouts.get(Timeouts::STRING_SHORT)));
    let _ = (&c.cli).write_all(msg);
}

/// The end of a mail proxy's login: what either side sent after its last
/// line of the dialogue goes on first (the client's counted as `%O`),
/// then the session is relayed with the server.
pub(super) fn relay_rest(
    c: &mut Client,
    srv: Stream,
    from_cli: &Lines,
    from_srv: &Lines,
    grant: &access::Grant,
    again: &Recheck,
) -> Result<(), Res> {
    if !from_cli.buf.is_empty() {
        (&srv)
            .write_all(&from_cli.buf)
            .map_err(|_| Res::SERVER_ERR)?;
        c.record.bytes_out += from_cli.buf.len() as u64;
        c.record.ops.writes += 1;
    }
    if !from_srv.buf.is_empty() {
        (&c.cli)
            .write_all(&from_srv.buf)
            .map_err(|_| Res::CLIENT_ERR)?;
    }
    crate::session::relay_to(
        c,
        srv,
        grant,
        again,
        &[],
        Timeouts::CONNECTION_SHORT,
        Park::Never,
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mail::parse_login;

    #[test]
    fn h_gives_the_host_and_port_of_logins_without_one() {
        let d = default_dest(&["-hmail.example".to_string()], None, 587);
        assert_eq!(d, (Some("mail.example".to_string()), 587));
        let d = default_dest(&["-hmail.example:995".to_string()], None, 110);
        assert_eq!(d, (Some("mail.example".to_string()), 995));
        let l = parse_login(b"bob", b'@', true, (d.0.as_deref(), d.1)).unwrap();
        assert_eq!((l.host.as_str(), l.port), ("mail.example", 995));
        let l = parse_login(b"bob@other", b'@', true, (d.0.as_deref(), d.1)).unwrap();
        assert_eq!((l.host.as_str(), l.port), ("other", 995));
        assert_eq!(default_dest(&[], None, 110), (None, 110));
        // The last -h counts.
        let two = ["-ha:1".to_string(), "-hb:2".to_string()];
        assert_eq!(h_option(&two, 21), Some(("b".to_string(), 2)));
    }

    #[test]
    fn the_port_is_in_the_text_when_it_is_not_the_default() {
        assert_eq!(login_text("bob", "h", 110, 110), "bob@h");
        assert_eq!(login_text("bob", "h", 995, 110), "bob@h:995");
    }
}
