//! `smtpp`: the SMTP proxy (3proxy's smtpp.c). The client is greeted as by
//! an SMTP server and chooses the destination with its login: `AUTH LOGIN`
//! or `AUTH PLAIN` naming `name@host[:port]` (port 587 by default). The
//! proxy connects to `host`, checks that it greets with `220`, says
//! `EHLO [its own address]`, logs in as `name` with the client's password
//! (AUTH LOGIN if the server offers it, else AUTH PLAIN), and from then
//! relays both ways: the server's answer to the login is the client's
//! answer to its AUTH.
//!
//! Before AUTH, `HELO` gets `250 Proxy`, `EHLO` the proxy's capabilities
//! (AUTH PLAIN LOGIN, 8BITMIME, DSN, and STARTTLS unless `-x`: it hands
//! the client to tlspr, which does STARTTLS with the server) and `QUIT`
//! `221 Proxy`. With
//! `-hhost[:port]` a login without a host goes there, and a client that
//! sends any other command goes there unauthenticated: the command is
//! the first thing the server gets after the proxy's EHLO. Without `-h`
//! such a command is answered `571 need AUTH first`.
//!
//! The login is split at its last `delimchar`; with `-u` not 0,
//! `proxyuser:proxypass:name@host` carries the proxy's own credentials
//! for `auth` (op CONNECT). Result codes are 3proxy's: 611 the greeting
//! could not be sent, 662 no AUTH (or command) came, 663-668 a bad AUTH
//! LOGIN / AUTH PLAIN exchange, 671 no banner from the server, 672 the
//! banner is not `220`, is another proxy's, or EHLO got no answer, 673
//! EHLO could not be sent, 680-682 the server refused the AUTH steps, 683
//! the credentials are too long. A session ending with a code of 1 to 99
//! or 662 to 699 is told `571 `. The record's `%T` is `name@host`, with
//! `:port` when it is not 587.

use std::io::Write;

use super::login;
use crate::client::{Client, StartTls};
use crate::net::Stream;
use crate::parent;
use crate::proto::http::base64_encode;
use crate::proto::mail::{parse_login, Lines, Login};
use crate::proto::smtp::{decode, split_plain, MAX_CRED};
use crate::proto::starts_ci;
use crate::res::Res;
use crate::timeouts::Timeouts;

/// The destination port when the login names none.
pub const DEFAULT_PORT: u16 = 587;
/// The longest client line read before the relay.
const CLIENT_LINE: usize = 310;
/// The longest server line read before the relay.
const SERVER_LINE: usize = 319;

/// The answer to EHLO, without and with STARTTLS.
const EHLO_REPLY: [&[u8]; 2] = [
    b"250-Proxy\r\n250-AUTH PLAIN LOGIN\r\n250-8BITMIME\r\n250 DSN\r\n",
    b"250-Proxy\r\n250-AUTH PLAIN LOGIN\r\n250-8BITMIME\r\n250-STARTTLS\r\n250 DSN\r\n",
];

/// How the client chose its destination.
enum Start {
    /// AUTH: the login, the password for the server, and the code of a
    /// bad login (for a host that does not resolve).
    Auth(Login, Vec<u8>, Res),
    /// A command with `-h`'s destination: sent on as it came.
    Command(Login, Vec<u8>),
    /// STARTTLS, answered with its go-ahead.
    Tls,
}

/// `parent smtp 0.0.0.0 0` in another service's ACL: greet the client as
/// smtpp does (`early`, what it sent before, is read first), with the
/// destination the first handler chose in the place of `-h`: a login
/// without a host, or a command before AUTH, goes there (3proxy's smtppchild
/// with a host known). The ACL is checked again with the entries that
/// redirect locally skipped.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve(c: &mut Client, early: &[u8], known: Option<&parent::Known>) -> parent::Next {
    let mut login = None;
    if let Err(res) = run(c, &mut login, early, known) {
        c.record.res = res;
    }
    if let Some(l) = &login {
        c.record.text = login::login_text(&l.name, &l.host, l.port, DEFAULT_PORT);
    }
    if matches!(c.record.res.0, 1..=99 | 662..=699) {
        login::tell_failure(c, b"571 \r\n");
    }
    c.next()
}

/// Greet the client and read until it logs in (or, with `-h`, sends a
/// command); None when it quits.
fn greet(
    c: &mut Client,
    from_cli: &mut Lines,
    known: Option<&parent::Known>,
) -> Result<Option<Start>, Res> {
    let svc = c.svc().clone();
    let short = svc.timeouts.get(Timeouts::STRING_SHORT);
    let _ = c.cli.set_timeout(Some(short));
    (&c.cli)
        .write_all(b"220 Proxy\r\n")
        .map_err(|_| Res::SMTP_GREET_FAILED)?;
    let (dhost, dport) = login::default_dest(&svc.opts.other, known, DEFAULT_PORT);
    let default = (dhost.as_deref(), dport);
    let creds = svc.opts.needuser.unwrap_or(1) > 0;
    let tls = login::starttls_offered(c);
    let say = |m: &[u8]| {
        let _ = (&c.cli).write_all(m);
    };
    let mut line = from_cli.line(&c.cli, CLIENT_LINE, short);
    let plain = loop {
        if line.len() <= 4 {
            return Err(Res::SMTP_NO_AUTH);
        }
        if starts_ci(&line, b"AUTH PLAIN") {
            break true;
        }
        if starts_ci(&line, b"AUTH LOGIN") {
            break false;
        }
        if starts_ci(&line, b"QUIT") {
            say(b"221 Proxy\r\n");
            return Ok(None);
        } else if starts_ci(&line, b"HELO ") {
            say(b"250 Proxy\r\n");
        } else if starts_ci(&line, b"EHLO ") {
            say(EHLO_REPLY[tls as usize]);
        } else if tls && starts_ci(&line, b"STARTTLS") {
            (&c.cli)
                .write_all(b"220 2.0.0 Ready to start TLS\r\n")
                .map_err(|_| Res::SMTP_EHLO_FAILED)?;
            return Ok(Some(Start::Tls));
        } else if let Some(host) = &dhost {
            let l = Login {
                user: None,
                password: None,
                name: String::new(),
                host: host.clone(),
                port: dport,
            };
            return Ok(Some(Start::Command(l, line)));
        } else {
            say(b"571 need AUTH first\r\n");
        }
        line = from_cli.line(&c.cli, CLIENT_LINE, short);
    };
    if plain {
        let raw = if line.len() > 13 {
            decode(&line[11..])
        } else {
            say(b"334\r\n");
            let l = from_cli.line(&c.cli, CLIENT_LINE, short);
            if l.len() < 3 {
                return Err(Res::SMTP_NO_PLAIN);
            }
            decode(&l)
        };
        let raw = raw.ok_or(Res::SMTP_BAD_PLAIN)?;
        let (name, pass) = split_plain(&raw).ok_or(Res::SMTP_BAD_PLAIN)?;
        let l = parse_login(name, svc.delimchar, creds, default).ok_or(Res::SMTP_BAD_PLAIN)?;
        return Ok(Some(Start::Auth(l, pass.to_vec(), Res::SMTP_BAD_PLAIN)));
    }
    say(b"334 VXNlcm5hbWU6\r\n");
    let l = from_cli.line(&c.cli, CLIENT_LINE, short);
    if l.len() < 3 {
        return Err(Res::SMTP_NO_USERNAME);
    }
    let name = decode(&l)
        .filter(|n| !n.is_empty())
        .ok_or(Res::SMTP_BAD_USERNAME)?;
    let login = parse_login(&name, svc.delimchar, creds, default).ok_or(Res::SMTP_BAD_USERNAME)?;
    say(b"334 UGFzc3dvcmQ6\r\n");
    let l = from_cli.line(&c.cli, CLIENT_LINE, short);
    if l.len() < 2 {
        return Err(Res::SMTP_NO_PASSWORD);
    }
    let pass = decode(&l).ok_or(Res::SMTP_BAD_PASSWORD)?;
    Ok(Some(Start::Auth(login, pass, Res::SMTP_BAD_USERNAME)))
}

/// One server reply (its lines while the fourth byte is `-`); the last
/// line read and all the lines (short or empty when the server is silent).
fn reply(c: &mut Client, srv: &Stream, from_srv: &mut Lines) -> (Vec<u8>, Vec<u8>) {
    let long = c.svc().timeouts.get(Timeouts::STRING_LONG);
    let before = (from_srv.total, from_srv.reads);
    let mut all = Vec::new();
    let mut line;
    loop {
        line = from_srv.line(srv, SERVER_LINE, long);
        all.extend_from_slice(&line);
        if !(line.len() > 3 && line[3] == b'-') {
            break;
        }
    }
    c.record.bytes_in += from_srv.total - before.0;
    c.record.ops.reads += from_srv.reads - before.1;
    (line, all)
}

fn send(c: &mut Client, srv: &Stream, data: &[u8], err: Res) -> Result<(), Res> {
    (&*srv).write_all(data).map_err(|_| err)?;
    c.record.bytes_out += data.len() as u64;
    c.record.ops.writes += 1;
    Ok(())
}

fn run(
    c: &mut Client,
    login: &mut Option<Login>,
    early: &[u8],
    known: Option<&parent::Known>,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let short = svc.timeouts.get(Timeouts::STRING_SHORT);
    let mut from_cli = Lines::with(early);
    let Some(start) = greet(c, &mut from_cli, known)? else {
        return Ok(());
    };
    let (l, password, command, bad) = match start {
        Start::Auth(l, p, bad) => {
            *login = Some(l.clone());
            (l, Some(p), None, bad)
        }
        Start::Command(l, cmd) => (l, None, Some(cmd), Res::SMTP_BAD_USERNAME),
        Start::Tls => {
            return login::to_tlspr(c, StartTls::Smtp, std::mem::take(&mut from_cli.buf));
        }
    };
    c.req_host = Some(l.host.clone());
    c.user.clone_from(&l.user);
    let dst = login::resolve_login(&l, known, svc.family).map_err(|_| bad)?;
    c.req_addr = Some(dst);
    let (grant, again) = login::admit_login(c, &l, dst)?;
    let srv = login::connect(c, dst, &l, &grant.parents)?;
    let mut from_srv = Lines::default();
    let (_, banner) = reply(c, &srv, &mut from_srv);
    if banner.len() < 3 {
        return Err(Res::SMTP_NO_BANNER);
    }
    if !banner.starts_with(b"220") || starts_ci(banner.get(4..).unwrap_or(&[]), b"PROXY") {
        return Err(Res::SMTP_BAD_BANNER);
    }
    let _ = srv.set_timeout(Some(short));
    let me = srv
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    send(
        c,
        &srv,
        format!("EHLO [{me}]\r\n").as_bytes(),
        Res::SMTP_EHLO_FAILED,
    )?;
    let (last, caps) = reply(c, &srv, &mut from_srv);
    if last.len() < 3 {
        return Err(Res::SMTP_BAD_BANNER);
    }
    let has = |w: &[u8]| caps.windows(w.len()).any(|x| x == w);
    let (login_ok, plain_ok) = (has(b"LOGIN"), has(b"PLAIN"));
    if let Some(pass) = &password {
        if pass.is_empty() || !(login_ok || plain_ok) {
            let _ = (&c.cli).write_all(b"235 auth required\r\n");
        }
        let long = svc.timeouts.get(Timeouts::STRING_LONG);
        let mut ok_334 = |c: &mut Client, err: Res| {
            let before = (from_srv.total, from_srv.reads);
            let r = from_srv.line(&srv, SERVER_LINE, long);
            c.record.bytes_in += from_srv.total - before.0;
            c.record.ops.reads += from_srv.reads - before.1;
            if r.len() < 4 || !r.starts_with(b"334") {
                return Err(err);
            }
            Ok(())
        };
        if login_ok {
            send(c, &srv, b"AUTH LOGIN\r\n", Res::SERVER_ERR)?;
            ok_334(c, Res::SMTP_LOGIN_USER_REFUSED)?;
            let user = base64_encode(l.name.as_bytes());
            let pass = base64_encode(pass);
            if user.len() > SERVER_LINE || pass.len() > SERVER_LINE {
                return Err(Res::SMTP_TOO_LONG);
            }
            send(c, &srv, format!("{user}\r\n").as_bytes(), Res::SERVER_ERR)?;
            ok_334(c, Res::SMTP_LOGIN_PASS_REFUSED)?;
            send(c, &srv, format!("{pass}\r\n").as_bytes(), Res::SERVER_ERR)?;
        } else if plain_ok {
            send(c, &srv, b"AUTH PLAIN\r\n", Res::SERVER_ERR)?;
            ok_334(c, Res::SMTP_PLAIN_REFUSED)?;
            if l.name.len() + 2 + pass.len() > MAX_CRED {
                return Err(Res::SMTP_TOO_LONG);
            }
            let mut raw = vec![0];
            raw.extend_from_slice(l.name.as_bytes());
            raw.push(0);
            raw.extend_from_slice(pass);
            let line = format!("{}\r\n", base64_encode(&raw));
            send(c, &srv, line.as_bytes(), Res::SERVER_ERR)?;
        }
    }
    if let Some(cmd) = &command {
        send(c, &srv, cmd, Res::SERVER_ERR)?;
    }
    login::relay_rest(c, srv, &from_cli, &from_srv, &grant, &again)
}
