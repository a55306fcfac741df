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
//! Before USER, QUIT is answered `+OK`, CAPA lists STLS, STLS hands the
//! client to tlspr (which takes the server's name from the client's TLS
//! SNI and does STLS with it), and any other command gets
//! `-ERR need USER first`; `-x` offers no STLS (3proxy's `nostarttls`).
//! Result codes are
//! 3proxy's: 611 the greeting could not be sent, 612 no command came, 614
//! not a USER command, 615 a bad login, 621 no banner from the server, 622
//! the banner is not `+OK` or is another proxy's, 623 USER could not be
//! sent. A session ending with a code of 1 to 99 or 612 to 699 is told
//! `-ERR`. The record's `%T` is `name@host`, with `:port` when it is not
//! 110.

use std::io::Write;

use super::login::{
    admit_login, connect, default_dest, login_text, relay_rest, resolve_login, starttls_offered,
    tell_failure, to_tlspr,
};
use crate::client::{Client, StartTls};
use crate::parent;
use crate::proto::mail::{parse_login, Lines, Login};
use crate::proto::starts_ci;
use crate::res::Res;
use crate::timeouts::Timeouts;

/// The destination port when the login names none.
pub const DEFAULT_PORT: u16 = 110;
/// The longest client command line read (3proxy's buffer less its slack).
const CLIENT_LINE: usize = 310;
/// The longest server banner line read.
const SERVER_LINE: usize = 319;

/// `parent pop3 0.0.0.0 0` in another service's ACL: greet the client
/// as pop3p does (`early`, what it sent before, is read first); a `USER`
/// without a host logs in at the destination the first handler chose
/// (3proxy's parseconnusername with a host known). The ACL is checked
/// again with the entries that redirect locally skipped.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve(c: &mut Client, early: &[u8], known: Option<&parent::Known>) -> parent::Next {
    let mut login = None;
    if let Err(res) = run(c, &mut login, early, known) {
        c.record.res = res;
    }
    if let Some(l) = &login {
        c.record.text = login_text(&l.name, &l.host, l.port, DEFAULT_PORT);
    }
    if matches!(c.record.res.0, 1..=99 | 612..=699) {
        tell_failure(c, b"-ERR\r\n");
    }
    c.next()
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
        .map_err(|_| Res::POP3_GREET_FAILED)?;
    let mut from_cli = Lines::with(early);
    let mut line = from_cli.line(&c.cli, CLIENT_LINE, short);
    let tls = starttls_offered(c);
    while line.len() > 4 && !starts_ci(&line, b"USER") {
        if starts_ci(&line, b"QUIT") {
            let _ = (&c.cli).write_all(b"+OK\r\n");
            return Ok(());
        }
        if tls && starts_ci(&line, b"CAPA") {
            let _ = (&c.cli).write_all(b"+OK Capability list follows\r\nSTLS\r\n.\r\n");
            line = from_cli.line(&c.cli, CLIENT_LINE, short);
            continue;
        }
        if tls && starts_ci(&line, b"STLS") {
            (&c.cli)
                .write_all(b"+OK Begin TLS negotiation\r\n")
                .map_err(|_| Res::POP3_USER_FAILED)?;
            return to_tlspr(c, StartTls::Pop3, std::mem::take(&mut from_cli.buf));
        }
        let _ = (&c.cli).write_all(b"-ERR need USER first\r\n");
        line = from_cli.line(&c.cli, CLIENT_LINE, short);
    }
    if line.len() < 6 {
        return Err(Res::POP3_NO_COMMAND);
    }
    let end = line
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(line.len());
    let line = &line[..end];
    if !starts_ci(line, b"USER ") {
        return Err(Res::POP3_NOT_USER);
    }
    let (dhost, dport) = default_dest(&svc.opts.other, known, DEFAULT_PORT);
    let creds = svc.opts.needuser.unwrap_or(1) > 0;
    let l = parse_login(&line[5..], svc.delimchar, creds, (dhost.as_deref(), dport))
        .ok_or(Res::POP3_BAD_LOGIN)?;
    c.req_host = Some(l.host.clone());
    c.user.clone_from(&l.user);
    let l = login.insert(l);
    let dst = resolve_login(l, known, svc.family).map_err(|_| Res::POP3_BAD_LOGIN)?;
    c.req_addr = Some(dst);
    let (grant, again) = admit_login(c, l, dst)?;
    let srv = connect(c, dst, l, &grant.parents)?;
    let mut from_srv = Lines::default();
    let banner = from_srv.line(&srv, SERVER_LINE, svc.timeouts.get(Timeouts::STRING_LONG));
    c.record.bytes_in += from_srv.total;
    c.record.ops.reads += from_srv.reads;
    if banner.len() < 3 {
        return Err(Res::POP3_NO_BANNER);
    }
    if !starts_ci(&banner, b"+OK") || starts_ci(banner.get(4..).unwrap_or(&[]), b"PROXY") {
        return Err(Res::POP3_BAD_BANNER);
    }
    let _ = srv.set_timeout(Some(short));
    if l.name.is_empty() {
        return Err(Res::POP3_USER_FAILED);
    }
    let user = format!("USER {}\r\n", l.name);
    (&srv)
        .write_all(user.as_bytes())
        .map_err(|_| Res::POP3_USER_FAILED)?;
    c.record.bytes_out += user.len() as u64;
    c.record.ops.writes += 1;
    relay_rest(c, srv, &from_cli, &from_srv, &grant, &again)
}
