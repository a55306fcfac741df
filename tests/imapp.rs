//! `imapp`, the IMAP4 proxy: a whole session through it to an IMAP server
//! the test runs, quoted logins, `delimchar`, the AUTHENTICATE mechanisms
//! on both sides, ACL refusals, commands before the login, malformed
//! logins, a destination that refuses, and the log records.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::util::*;

/// Service, code, client port, proxy user, text, bytes out and in.
const FMT: &str = "L%N %E %c %U %T %O %I";

/// The service of these tests.
const IMAPP: Service = Service::tcp("imapp", FMT);
/// A greeting without capabilities: the proxy asks for them.
const PLAIN_GREETING: &str = "* OK test imap ready\r\n";

/// A tiny IMAP server greeting with `greeting`, offering `caps` (the
/// AUTH= part of its capabilities); it answers CAPABILITY, LOGIN,
/// AUTHENTICATE (PLAIN with its argument, LOGIN with both prompts),
/// SELECT and LOGOUT, and sends every line it receives down the channel.
pub fn imap_server(greeting: &'static str, caps: &'static str) -> (Origin, Receiver<String>) {
    let (tx, rx) = channel();
    let origin = Origin::start("127.0.0.1:0", move |mut s: TcpStream| {
        let tx = tx.clone();
        if s.write_all(greeting.as_bytes()).is_err() {
            return;
        }
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        let mut prompts = 0;
        let mut login_tag = String::new();
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(line.clone());
            let mut words = line.trim_end().splitn(3, ' ');
            let tag = words.next().unwrap_or("").to_string();
            let cmd = words.next().unwrap_or("").to_ascii_uppercase();
            let arg = words.next().unwrap_or("").to_string();
            let reply = if prompts > 0 {
                prompts -= 1;
                if prompts == 1 {
                    "+ UGFzc3dvcmQ6\r\n".to_string()
                } else {
                    format!("{login_tag} OK AUTHENTICATE done\r\n")
                }
            } else {
                match cmd.as_str() {
                    "CAPABILITY" => {
                        format!("* CAPABILITY IMAP4rev1 {caps}\r\n{tag} OK done\r\n")
                    }
                    "LOGIN" => format!("{tag} OK LOGIN done\r\n"),
                    "AUTHENTICATE" if arg == "LOGIN" => {
                        prompts = 2;
                        login_tag = tag.clone();
                        "+ VXNlcm5hbWU6\r\n".to_string()
                    }
                    "AUTHENTICATE" => format!("{tag} OK AUTHENTICATE done\r\n"),
                    "SELECT" => format!("* 2 EXISTS\r\n{tag} OK [READ-WRITE] SELECT done\r\n"),
                    "LOGOUT" => format!("* BYE bye\r\n{tag} OK LOGOUT done\r\n"),
                    _ => format!("{tag} BAD what\r\n"),
                }
            };
            let quit = cmd == "LOGOUT";
            line.clear();
            if s.write_all(reply.as_bytes()).is_err() || quit {
                return;
            }
        }
    });
    (origin, rx)
}

/// The proxy's greeting: STARTTLS is offered unless `-x`.
const GREETING: &str =
    "* OK [CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN AUTH=LOGIN] IMAP4rev1 Proxy Ready\r\n";

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a line at the IMAP server")
}

#[test]
fn imapp_full_session_reaches_the_server_without_the_host() {
    let (origin, rx) = imap_server(PLAIN_GREETING, "");
    let (_proxy, port, log) = IMAPP.start("imapp_session", "", "");
    let mut c = LineClient::connect(port, GREETING);
    let o = origin.port();
    // Answered by the proxy itself.
    assert_eq!(
        c.cmd("a0 CAPABILITY"),
        "* CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN AUTH=LOGIN\r\n"
    );
    assert_eq!(c.line(), "a0 OK CAPABILITY completed\r\n");
    assert_eq!(c.cmd("a1 NOOP"), "a1 BAD need LOGIN first\r\n");
    assert_eq!(
        c.cmd(&format!("a2 LOGIN bob@127.0.0.1:{o} secret")),
        "a2 OK LOGIN done\r\n"
    );
    // No AUTH= capability in the greeting: the proxy asked, then LOGIN.
    assert_eq!(next(&rx), "zz CAPABILITY\r\n");
    assert_eq!(next(&rx), "a2 LOGIN bob secret\r\n");
    assert_eq!(c.cmd("a3 SELECT INBOX"), "* 2 EXISTS\r\n");
    assert_eq!(c.line(), "a3 OK [READ-WRITE] SELECT done\r\n");
    assert_eq!(next(&rx), "a3 SELECT INBOX\r\n");
    assert_eq!(c.cmd("a4 LOGOUT"), "* BYE bye\r\n");
    assert_eq!(c.line(), "a4 OK LOGOUT done\r\n");
    assert_eq!(next(&rx), "a4 LOGOUT\r\n");
    let cport = c.port();
    c.assert_closed();
    // Out: all the server received; in: all it sent.
    let out = "zz CAPABILITY\r\na2 LOGIN bob secret\r\na3 SELECT INBOX\r\na4 LOGOUT\r\n".len();
    let inb = PLAIN_GREETING.len()
        + "* CAPABILITY IMAP4rev1 \r\nzz OK done\r\na2 OK LOGIN done\r\n".len()
        + "* 2 EXISTS\r\na3 OK [READ-WRITE] SELECT done\r\n* BYE bye\r\na4 OK LOGOUT done\r\n"
            .len();
    expect_log_line(
        &log,
        &format!("IMAPP 00000 {cport} - bob@127.0.0.1:{o} {out} {inb}"),
    );
}

#[test]
fn imapp_quoted_login_and_delimchar() {
    let (origin, rx) = imap_server("* OK [CAPABILITY IMAP4rev1] hi\r\n", "");
    let o = origin.port();
    // Process-wide, as in 3proxy: a line after the service counts too.
    let (_proxy, port, log) = IMAPP.start_then("imapp_quoted", "", "", "delimchar #\n");
    let mut c = LineClient::connect(port, GREETING);
    // A quoted name, split at the last '#'; the password goes on as it came.
    assert_eq!(
        c.cmd(&format!("t1 login \"me@corp#127.0.0.1:{o}\" \"pw x\"")),
        "t1 OK LOGIN done\r\n"
    );
    // Capabilities in the greeting: no need to ask.
    assert_eq!(next(&rx), "t1 LOGIN me@corp \"pw x\"\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("t2 LOGOUT"), "* BYE bye\r\n");
    assert_eq!(c.line(), "t2 OK LOGOUT done\r\n");
    assert_eq!(next(&rx), "t2 LOGOUT\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("IMAPP 00000 {cport} - me@corp@127.0.0.1:{o} ")),
        "{rec}"
    );
    // With '#', '@' is part of the name: no server, 694.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("t1 LOGIN bob@127.0.0.1:{o} pw")),
        "t1 NO proxy error\r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("IMAPP 00694 {cport} -  0 0"));
    assert!(rx.try_recv().is_err(), "the server got more");
}

#[test]
fn imapp_logs_in_the_way_the_server_offers() {
    // The server offers AUTH=PLAIN: a client's LOGIN becomes
    // AUTHENTICATE PLAIN with the bare name.
    let (origin, rx) = imap_server(
        "* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] hi\r\n",
        "AUTH=PLAIN",
    );
    let o = origin.port();
    let (_proxy, port, _log) = IMAPP.start("imapp_methods", "", "");
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("p1 LOGIN bob@127.0.0.1:{o} secret")),
        "p1 OK AUTHENTICATE done\r\n"
    );
    // base64 of "\0bob\0secret".
    assert_eq!(next(&rx), "p1 AUTHENTICATE PLAIN AGJvYgBzZWNyZXQ=\r\n");
    drop(c);

    // The client authenticates with LOGIN (prompted by the proxy); the
    // server, asked, offers only AUTH=LOGIN: the proxy answers its prompts.
    let (origin, rx) = imap_server(PLAIN_GREETING, "AUTH=LOGIN");
    let o = origin.port();
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(c.cmd("l1 AUTHENTICATE LOGIN"), "+ VXNlcm5hbWU6\r\n");
    let user = base64(format!("bob@127.0.0.1:{o}").as_bytes());
    assert_eq!(c.cmd(&user), "+ UGFzc3dvcmQ6\r\n");
    assert_eq!(c.cmd("c2VjcmV0"), "l1 OK AUTHENTICATE done\r\n");
    assert_eq!(next(&rx), "zz CAPABILITY\r\n");
    assert_eq!(next(&rx), "l1 AUTHENTICATE LOGIN\r\n");
    assert_eq!(next(&rx), "Ym9i\r\n");
    assert_eq!(next(&rx), "c2VjcmV0\r\n");
    drop(c);

    // AUTHENTICATE PLAIN with its response on the command line, to a
    // server offering nothing: the LOGIN command.
    let (origin, rx) = imap_server(PLAIN_GREETING, "");
    let o = origin.port();
    let mut c = LineClient::connect(port, GREETING);
    let resp = base64(format!("\0bob@127.0.0.1:{o}\0pw").as_bytes());
    assert_eq!(
        c.cmd(&format!("x AUTHENTICATE PLAIN {resp}")),
        "x OK LOGIN done\r\n"
    );
    assert_eq!(next(&rx), "zz CAPABILITY\r\n");
    assert_eq!(next(&rx), "x LOGIN bob pw\r\n");
}

#[test]
fn imapp_proxy_credentials_and_acl() {
    let (origin, rx) = imap_server(PLAIN_GREETING, "");
    let o = origin.port();
    let (_proxy, port, log) = IMAPP.start(
        "imapp_acl",
        &format!("users pu:CL:pp\nauth strong\ndeny * * 127.0.0.2\nallow pu * 127.0.0.1 {o}\n"),
        "",
    );
    // proxyuser:proxypass: in front of the name.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("a LOGIN pu:pp:bob@127.0.0.1:{o} secret")),
        "a OK LOGIN done\r\n"
    );
    assert_eq!(next(&rx), "zz CAPABILITY\r\n");
    assert_eq!(next(&rx), "a LOGIN bob secret\r\n");
    let cport = c.port();
    drop(c);
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("IMAPP 00000 {cport} pu bob@127.0.0.1:{o} ")),
        "{rec}"
    );
    // Without proxy credentials the login password is the proxy's: the
    // name carries no user, so strong auth refuses (3proxy's code 4).
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("b LOGIN bob@127.0.0.1:{o} pp")),
        "b NO proxy error\r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("IMAPP 00004 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
    // A destination the ACL denies: 1, before any connection.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("c LOGIN pu:pp:bob@127.0.0.2:{o} pw")),
        "c NO proxy error\r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("IMAPP 00001 {cport} pu bob@127.0.0.2:{o} 0 0"),
    );
    assert_eq!(origin.peers().len(), 1, "the server was reached again");
}

#[test]
fn imapp_commands_before_login_and_bad_logins() {
    let (_proxy, port, log) = IMAPP.start("imapp_bad", "", "");
    // LOGOUT: answered by the proxy, code 0.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(c.cmd("z LOGOUT"), "* BYE\r\n");
    assert_eq!(c.line(), "z OK LOGOUT completed\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("IMAPP 00000 {cport} -  0 0"));
    // No tag: 692, told with '*'.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(c.cmd("NOOPNOOP"), "* NO proxy error\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("IMAPP 00692 {cport} -  0 0"));
    // A tag too long: 692, told with the last good tag.
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(c.cmd("k NOOP"), "k BAD need LOGIN first\r\n");
    assert_eq!(
        c.cmd(&format!("{} NOOP", "t".repeat(70))),
        "k NO proxy error\r\n"
    );
    c.assert_closed();
    // Malformed logins: 693; a login without a server: 694.
    for (bad, code) in [
        ("LOGIN bob@127.0.0.1", 693),
        ("LOGIN \"bob@127.0.0.1 pw", 693),
        ("AUTHENTICATE PLAIN !!!!", 693),
        ("LOGIN bob pw", 694),
        ("LOGIN bob@127.0.0.1:x pw", 694),
    ] {
        let mut c = LineClient::connect(port, GREETING);
        assert_eq!(c.cmd(&format!("q {bad}")), "q NO proxy error\r\n", "{bad}");
        let cport = c.port();
        c.assert_closed();
        expect_log_line(&log, &format!("IMAPP 00{code} {cport} -  0 0"));
    }
}

#[test]
fn imapp_destination_refusing_or_not_imap() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let o = closed.local_addr().unwrap().port();
    drop(closed);
    let (_proxy, port, log) = IMAPP.start("imapp_refused", "", "");
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("r LOGIN bob@127.0.0.1:{o} pw")),
        "r NO proxy error\r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("IMAPP 00013 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
    // A server greeting otherwise: 696.
    let origin = Origin::start("127.0.0.1:0", |mut s: TcpStream| {
        let _ = s.write_all(b"+OK pop3 here\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let o = origin.port();
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(
        c.cmd(&format!("r LOGIN bob@127.0.0.1:{o} pw")),
        "r NO proxy error\r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("IMAPP 00696 {cport} - bob@127.0.0.1:{o} 0 15"),
    );
}

#[test]
fn imapp_default_host_for_a_login_without_one() {
    let (origin, rx) = imap_server(PLAIN_GREETING, "");
    let o = origin.port();
    let (_proxy, port, log) = IMAPP.start("imapp_default_host", "", &format!("-h127.0.0.1:{o}"));
    let mut c = LineClient::connect(port, GREETING);
    assert_eq!(c.cmd("d LOGIN bob pw"), "d OK LOGIN done\r\n");
    assert_eq!(next(&rx), "zz CAPABILITY\r\n");
    assert_eq!(next(&rx), "d LOGIN bob pw\r\n");
    let cport = c.port();
    drop(c);
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("IMAPP 00000 {cport} - bob@127.0.0.1:{o} ")),
        "{rec}"
    );
}
