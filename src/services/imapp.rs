//! `imapp`: the IMAP4 proxy (3proxy's imapp.c). The client is greeted as
//! by an IMAP server and logs in with `tag LOGIN name@host[:port] password`
//! (or `AUTHENTICATE PLAIN` / `AUTHENTICATE LOGIN` carrying that name);
//! the proxy connects to `host` (port 143 by default), checks that it
//! greets with `* OK`, logs in there as `name` with the client's tag, and
//! from then relays both ways: the server's tagged answer to the login and
//! everything after it pass untouched.
//!
//! The login is split at its last `delimchar` (`@` by default), with the
//! proxy's own `proxyuser:proxypass:` in front of the name as in pop3p; a
//! login password is also the proxy password when the name gave none.
//! `-hhost[:port]` is the destination of a login without a host.
//!
//! Towards the server the proxy logs in the way the server offers: with
//! `AUTHENTICATE PLAIN` if its capabilities (from the greeting's
//! `[CAPABILITY ...]`, else asked with `zz CAPABILITY`) name AUTH=PLAIN,
//! else `AUTHENTICATE LOGIN` if they name AUTH=LOGIN, else `LOGIN`; a
//! client's own AUTHENTICATE method is kept when the server offers it.
//!
//! Before the login, CAPABILITY and LOGOUT are answered and any other
//! command gets `tag BAD need LOGIN first`; STARTTLS is offered (not with
//! `-x`) and hands the client to tlspr, which does it with the server.
//! Result codes are 3proxy's: 691 the greeting could not be sent, 692 no
//! command or no tag, 693 a malformed login, 694 a login naming no usable
//! server, 695 no greeting from the server, 696 the greeting is not
//! `* OK`, 697 CAPABILITY failed, 698 an AUTHENTICATE exchange with the
//! client failed, 699 logging in at the server failed. A session ending
//! with a code of 1 to 99 or 692 to 699 is told `tag NO proxy error`. The
//! record's `%T` is `name@host`, with `:port` when it is not 143.

use std::io::Write;

use super::login::{
    connect, default_dest, login_text, relay_rest, starttls_offered, tell_failure, to_tlspr,
};
use crate::client::{Client, StartTls};
use crate::net::Stream;
use crate::parent;
use crate::proto::http::base64_encode;
use crate::proto::imap::{cstr, de64, parse_login_args, parse_plain, CRED_MAX};
use crate::proto::mail::{chomp, has_cap, parse_login, Lines};
use crate::proto::starts_ci;
use crate::res::Res;
use crate::timeouts::Timeouts;

/// The destination port when the login names none.
pub const DEFAULT_PORT: u16 = 143;
/// The longest client command line read (3proxy's buffer less its slack).
const CLIENT_LINE: usize = 2038;
/// The longest server line read.
const SERVER_LINE: usize = 1023;
/// The longest tag (3proxy's buffer less the NUL).
const TAG_MAX: usize = 62;
/// The greeting and the CAPABILITY answer, with and without STARTTLS.
const GREETING: [&[u8]; 2] = [
    b"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN AUTH=LOGIN] IMAP4rev1 Proxy Ready\r\n",
    b"* OK [CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN AUTH=LOGIN] IMAP4rev1 Proxy Ready\r\n",
];
const CAPABILITY: [&[u8]; 2] = [
    b"* CAPABILITY IMAP4rev1 AUTH=PLAIN AUTH=LOGIN\r\n",
    b"* CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN AUTH=LOGIN\r\n",
];
/// What asks a server for its capabilities.
const ASK_CAPS: &[u8] = b"zz CAPABILITY\r\n";

/// How a login is made: the LOGIN command or an AUTHENTICATE mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Command,
    Plain,
    Login,
}

/// The server's capabilities that matter: (AUTH=PLAIN, AUTH=LOGIN).
type Caps = (bool, bool);

/// The method to use at a server offering `caps`, for a client that used
/// `client`.
fn choose(client: Method, caps: Caps) -> Method {
    let (plain, login) = caps;
    match client {
        Method::Plain if !plain => {
            if login {
                Method::Login
            } else {
                Method::Command
            }
        }
        Method::Login if !login => {
            if plain {
                Method::Plain
            } else {
                Method::Command
            }
        }
        Method::Command if plain => Method::Plain,
        Method::Command if login => Method::Login,
        m => m,
    }
}

fn caps_of(line: &[u8]) -> Caps {
    (has_cap(line, b"AUTH=PLAIN"), has_cap(line, b"AUTH=LOGIN"))
}

/// What the client logged in with.
struct Creds {
    tag: Vec<u8>,
    user: Vec<u8>,
    pass: Vec<u8>,
    method: Method,
}

/// `parent imap 0.0.0.0 0` in another service's ACL: greet the client as
/// imapp does (`early`, what it sent before, is read first); a login
/// without a host goes to the destination the first handler chose. The
/// ACL is checked again with the entries that redirect locally skipped.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve(c: &mut Client, early: &[u8], known: Option<&parent::Known>) -> parent::Next {
    let mut tag = Vec::new();
    let mut login = None;
    if let Err(res) = run(c, &mut tag, &mut login, early, known) {
        c.record.res = res;
    }
    if let Some((name, host, port)) = &login {
        c.record.text = login_text(name, host, *port, DEFAULT_PORT);
    }
    if matches!(c.record.res.0, 1..=99 | 692..=699) {
        let tag = if tag.is_empty() { &b"*"[..] } else { &tag };
        let mut msg = tag[..tag.len().min(60)].to_vec();
        msg.extend_from_slice(b" NO proxy error\r\n");
        tell_failure(c, &msg);
    }
    c.next()
}

/// Send `msg` to the client with the short timeout.
fn say(s: &Stream, msg: &[u8]) -> std::io::Result<()> {
    let mut w = s;
    w.write_all(msg)
}

/// Read the client's commands until it logs in; None when it logged out.
/// What the client did before it logged in.
enum Start {
    Login(Creds),
    Logout,
    /// It asked for STARTTLS and was told to begin.
    Tls,
}

/// Read the client's commands until it logs in, logs out or (when
/// offered) asks for STARTTLS.
fn client_login(c: &Client, from_cli: &mut Lines, tag: &mut Vec<u8>) -> Result<Start, Res> {
    let tls = starttls_offered(c);
    let short = c.svc().timeouts.get(Timeouts::STRING_SHORT);
    let cli = &c.cli;
    let read_line = |from_cli: &mut Lines| from_cli.line(cli, CLIENT_LINE, short);
    loop {
        let line = read_line(from_cli);
        if line.len() < 4 {
            return Err(Res::IMAP_NO_COMMAND);
        }
        let line = chomp(&line);
        let sp = line.iter().position(|&b| b == b' ');
        let Some(sp) = sp.filter(|&sp| sp <= TAG_MAX) else {
            return Err(Res::IMAP_NO_COMMAND);
        };
        *tag = line[..sp].to_vec();
        let cmd = &line[sp + 1..];
        let reply = |text: &str| {
            let mut m = tag[..tag.len().min(60)].to_vec();
            m.extend_from_slice(text.as_bytes());
            m
        };
        if starts_ci(cmd, b"LOGOUT") {
            let _ = say(cli, b"* BYE\r\n");
            let _ = say(cli, &reply(" OK LOGOUT completed\r\n"));
            return Ok(Start::Logout);
        }
        if tls && starts_ci(cmd, b"STARTTLS") {
            say(cli, &reply(" OK Begin TLS negotiation\r\n")).map_err(|_| Res::IMAP_AUTH_FAILED)?;
            return Ok(Start::Tls);
        }
        if starts_ci(cmd, b"CAPABILITY") {
            let mut m = CAPABILITY[tls as usize].to_vec();
            m.extend(reply(" OK CAPABILITY completed\r\n"));
            let _ = say(cli, &m);
            continue;
        }
        if starts_ci(cmd, b"LOGIN ") {
            let (user, pass) = parse_login_args(&cmd[6..]).ok_or(Res::IMAP_BAD_LOGIN)?;
            return Ok(Start::Login(Creds {
                tag: tag.clone(),
                user,
                pass,
                method: Method::Command,
            }));
        }
        if starts_ci(cmd, b"AUTHENTICATE PLAIN") {
            let initial = cmd[18..].strip_prefix(b" ").filter(|r| !r.is_empty());
            let resp = match initial {
                Some(r) => r.to_vec(),
                None => {
                    say(cli, b"+ \r\n").map_err(|_| Res::IMAP_AUTH_FAILED)?;
                    let l = read_line(from_cli);
                    if l.is_empty() {
                        return Err(Res::IMAP_AUTH_FAILED);
                    }
                    chomp(&l).to_vec()
                }
            };
            let raw = de64(&resp, 2047).ok_or(Res::IMAP_BAD_LOGIN)?;
            let (user, pass) = parse_plain(&raw).ok_or(Res::IMAP_BAD_LOGIN)?;
            return Ok(Start::Login(Creds {
                tag: tag.clone(),
                user,
                pass,
                method: Method::Plain,
            }));
        }
        if starts_ci(cmd, b"AUTHENTICATE LOGIN") {
            let initial = cmd[18..].strip_prefix(b" ").filter(|r| !r.is_empty());
            let ask = |prompt: &[u8], from_cli: &mut Lines| -> Result<Vec<u8>, Res> {
                say(cli, prompt).map_err(|_| Res::IMAP_AUTH_FAILED)?;
                let l = read_line(from_cli);
                if l.is_empty() {
                    return Err(Res::IMAP_AUTH_FAILED);
                }
                let v = de64(chomp(&l), CRED_MAX).ok_or(Res::IMAP_BAD_LOGIN)?;
                Ok(cstr(&v).to_vec())
            };
            let user = match initial {
                Some(r) => cstr(&de64(r, CRED_MAX).ok_or(Res::IMAP_BAD_LOGIN)?).to_vec(),
                None => ask(b"+ VXNlcm5hbWU6\r\n", from_cli)?,
            };
            let pass = ask(b"+ UGFzc3dvcmQ6\r\n", from_cli)?;
            return Ok(Start::Login(Creds {
                tag: tag.clone(),
                user,
                pass,
                method: Method::Login,
            }));
        }
        let _ = say(cli, &reply(" BAD need LOGIN first\r\n"));
    }
}

/// Read the server's capabilities after a greeting without them.
fn ask_caps(srv: &Stream, from_srv: &mut Lines, long: std::time::Duration) -> Result<Caps, Res> {
    say(srv, ASK_CAPS).map_err(|_| Res::IMAP_CAPA_FAILED)?;
    let mut caps = (false, false);
    loop {
        let l = from_srv.line(srv, SERVER_LINE, long);
        if l.len() < 3 {
            return Err(Res::IMAP_CAPA_FAILED);
        }
        if starts_ci(&l, b"* CAPABILITY") {
            let (p, g) = caps_of(&l);
            caps = (caps.0 | p, caps.1 | g);
        } else if starts_ci(&l, b"zz ") {
            return Ok(caps);
        }
    }
}

/// Log in at the server as `name` with `how`; what was sent: bytes, and
/// writes.
fn server_login(
    srv: &Stream,
    from_srv: &mut Lines,
    long: std::time::Duration,
    creds: &Creds,
    name: &[u8],
    how: Method,
) -> Result<(u64, u64), Res> {
    let failed = |_| Res::IMAP_LOGIN_FAILED;
    let (mut sent, mut writes) = (0u64, 0u64);
    let mut send = |b: &[u8]| -> Result<(), Res> {
        if b.is_empty() {
            // 3proxy fails on a send of nothing (an empty name or password).
            return Err(Res::IMAP_LOGIN_FAILED);
        }
        say(srv, b).map_err(failed)?;
        sent += b.len() as u64;
        writes += 1;
        Ok(())
    };
    let tag = &creds.tag;
    match how {
        Method::Plain => {
            let mut raw = vec![0u8];
            raw.extend_from_slice(name);
            raw.push(0);
            raw.extend_from_slice(&creds.pass);
            let mut m = tag.clone();
            m.extend_from_slice(b" AUTHENTICATE PLAIN ");
            m.extend_from_slice(base64_encode(&raw).as_bytes());
            m.extend_from_slice(b"\r\n");
            send(&m)?;
        }
        Method::Login => {
            let mut m = tag.clone();
            m.extend_from_slice(b" AUTHENTICATE LOGIN\r\n");
            send(&m)?;
            for v in [name, &creds.pass[..]] {
                let l = from_srv.line(srv, SERVER_LINE, long);
                if !l.starts_with(b"+") {
                    return Err(Res::IMAP_LOGIN_FAILED);
                }
                send(base64_encode(v).as_bytes())?;
                send(b"\r\n")?;
            }
        }
        Method::Command => {
            let mut m = tag.clone();
            m.extend_from_slice(b" LOGIN ");
            m.extend_from_slice(name);
            m.push(b' ');
            send(&m)?;
            send(&creds.pass)?;
            send(b"\r\n")?;
        }
    }
    Ok((sent, writes))
}

fn run(
    c: &mut Client,
    tag: &mut Vec<u8>,
    login: &mut Option<(String, String, u16)>,
    early: &[u8],
    known: Option<&parent::Known>,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let short = svc.timeouts.get(Timeouts::STRING_SHORT);
    let long = svc.timeouts.get(Timeouts::STRING_LONG);
    let _ = c.cli.set_timeout(Some(short));
    say(&c.cli, GREETING[starttls_offered(c) as usize]).map_err(|_| Res::IMAP_GREET_FAILED)?;
    let mut from_cli = Lines::with(early);
    let creds = match client_login(c, &mut from_cli, tag)? {
        Start::Login(creds) => creds,
        Start::Logout => return Ok(()),
        Start::Tls => {
            return to_tlspr(c, StartTls::Imap, std::mem::take(&mut from_cli.buf));
        }
    };
    let (dhost, dport) = default_dest(&svc.opts.other, known, DEFAULT_PORT);
    let with_creds = svc.opts.needuser.unwrap_or(1) > 0;
    let mut l = parse_login(
        &creds.user,
        svc.delimchar,
        with_creds,
        (dhost.as_deref(), dport),
    )
    .ok_or(Res::IMAP_BAD_DEST)?;
    if l.password.is_none() && !creds.pass.is_empty() {
        l.password = Some(String::from_utf8_lossy(&creds.pass).into_owned());
    }
    *login = Some((l.name.clone(), l.host.clone(), l.port));
    c.req_host = Some(l.host.clone());
    c.user.clone_from(&l.user);
    let dst = super::login::resolve_login(&l, known, svc.family).map_err(|_| Res::IMAP_BAD_DEST)?;
    c.req_addr = Some(dst);
    let (grant, again) = super::login::admit_login(c, &l, dst)?;
    let srv = connect(c, dst, &l, &grant.parents)?;
    let _ = srv.set_timeout(Some(short));
    let mut from_srv = Lines::default();
    let result = greet_and_login(&srv, &mut from_srv, long, &creds, l.name.as_bytes());
    c.record.bytes_in += from_srv.total;
    c.record.ops.reads += from_srv.reads;
    let (sent, writes) = result?;
    c.record.bytes_out += sent;
    c.record.ops.writes += writes;
    relay_rest(c, srv, &from_cli, &from_srv, &grant, &again)
}

/// The server's greeting, its capabilities, and the login there; the
/// bytes sent and the writes.
fn greet_and_login(
    srv: &Stream,
    from_srv: &mut Lines,
    long: std::time::Duration,
    creds: &Creds,
    name: &[u8],
) -> Result<(u64, u64), Res> {
    let greeting = from_srv.line(srv, SERVER_LINE, long);
    if greeting.len() < 4 {
        return Err(Res::IMAP_NO_GREETING);
    }
    if !starts_ci(&greeting, b"* OK") {
        return Err(Res::IMAP_BAD_GREETING);
    }
    let marker = b"[CAPABILITY ";
    let (caps, asked) = match greeting.windows(marker.len()).position(|w| w == marker) {
        Some(at) => (caps_of(&greeting[at..]), (0, 0)),
        None => (ask_caps(srv, from_srv, long)?, (ASK_CAPS.len() as u64, 1)),
    };
    let (sent, writes) =
        server_login(srv, from_srv, long, creds, name, choose(creds.method, caps))?;
    Ok((asked.0 + sent, asked.1 + writes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_follows_the_server() {
        use Method::*;
        assert_eq!(choose(Command, (false, false)), Command);
        assert_eq!(choose(Command, (true, true)), Plain);
        assert_eq!(choose(Command, (false, true)), Login);
        assert_eq!(choose(Plain, (false, true)), Login);
        assert_eq!(choose(Plain, (false, false)), Command);
        assert_eq!(choose(Login, (true, false)), Plain);
        assert_eq!(choose(Login, (true, true)), Login);
        assert!(has_cap(b"* CAPABILITY imap4rev1 auth=plain", b"AUTH=PLAIN"));
    }
}
