//! `pop3p`, the POP3 proxy: a whole session through it to a POP3 server
//! the test runs, `delimchar`, proxy credentials in the login, ACL
//! refusals, commands before USER, a destination that refuses, and the
//! log records.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::util::*;

/// Service, code, client port, proxy user, text, bytes out and in.
const FMT: &str = "L%N %E %c %U %T %O %I";
const BANNER: &[u8] = b"+OK test pop3 ready\r\n";
/// The proxy's greeting.
const READY: &str = "+OK Proxy\r\n";

/// The service of these tests.
const POP3P: Service = Service::tcp("pop3p", FMT);

/// A tiny POP3 server: greets, answers USER, PASS, STAT and QUIT, and
/// sends every line it receives down the channel.
pub fn pop3_server() -> (Origin, Receiver<String>) {
    let (tx, rx) = channel();
    let origin = Origin::start("127.0.0.1:0", move |mut s: TcpStream| {
        let tx = tx.clone();
        if s.write_all(BANNER).is_err() {
            return;
        }
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(line.clone());
            let reply: &[u8] = match line.get(..4).unwrap_or("") {
                "USER" => b"+OK user\r\n",
                "PASS" => b"+OK pass\r\n",
                "STAT" => b"+OK 2 320\r\n",
                "QUIT" => b"+OK bye\r\n",
                _ => b"-ERR what\r\n",
            };
            let quit = line.starts_with("QUIT");
            line.clear();
            if s.write_all(reply).is_err() || quit {
                return;
            }
        }
    });
    (origin, rx)
}

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a line at the POP3 server")
}

#[test]
fn pop3p_full_session_reaches_the_server_without_the_host() {
    let (origin, rx) = pop3_server();
    let (_proxy, port, log) = POP3P.start("pop3p_session", "", "");
    let mut c = LineClient::connect(port, READY);
    let o = origin.port();
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "+OK user\r\n");
    assert_eq!(next(&rx), "USER bob\r\n");
    assert_eq!(c.cmd("PASS secret"), "+OK pass\r\n");
    assert_eq!(next(&rx), "PASS secret\r\n");
    assert_eq!(c.cmd("STAT"), "+OK 2 320\r\n");
    assert_eq!(next(&rx), "STAT\r\n");
    assert_eq!(c.cmd("QUIT"), "+OK bye\r\n");
    assert_eq!(next(&rx), "QUIT\r\n");
    let cport = c.port();
    c.assert_closed();
    // Out: what the server received; in: its banner and four answers.
    let out = "USER bob\r\nPASS secret\r\nSTAT\r\nQUIT\r\n".len();
    let inb = BANNER.len() + "+OK user\r\n+OK pass\r\n+OK 2 320\r\n+OK bye\r\n".len();
    expect_log_line(
        &log,
        &format!("POP3P 00000 {cport} - bob@127.0.0.1:{o} {out} {inb}"),
    );
}

#[test]
fn pop3p_login_and_pipelined_commands_in_one_write() {
    let (origin, rx) = pop3_server();
    let (_proxy, port, _log) = POP3P.start("pop3p_pipelined", "", "");
    let mut c = LineClient::connect(port, READY);
    let o = origin.port();
    c.s.write_all(format!("user me@corp@127.0.0.1:{o}\r\nPASS x\r\n").as_bytes())
        .unwrap();
    assert_eq!(c.line(), "+OK user\r\n");
    assert_eq!(c.line(), "+OK pass\r\n");
    // Split at the last '@'.
    assert_eq!(next(&rx), "USER me@corp\r\n");
    assert_eq!(next(&rx), "PASS x\r\n");
}

#[test]
fn pop3p_delimchar_changes_the_separator() {
    let (origin, rx) = pop3_server();
    // Process-wide, as in 3proxy: a line after the service counts too.
    let (_proxy, port, log) = POP3P.start_then("pop3p_delim", "", "", "delimchar #\n");
    let mut c = LineClient::connect(port, READY);
    let o = origin.port();
    assert_eq!(
        c.cmd(&format!("USER me@corp#127.0.0.1:{o}")),
        "+OK user\r\n"
    );
    assert_eq!(next(&rx), "USER me@corp\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "+OK bye\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("POP3P 00000 {cport} - me@corp@127.0.0.1:{o} ")),
        "{rec}"
    );
    // With '#' the '@' is part of the name: no host, a bad login.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    assert!(record_of(&log, FMT, cport).starts_with(&format!("POP3P 00615 {cport} ")));
}

#[test]
fn pop3p_proxy_credentials_in_the_login() {
    let (origin, rx) = pop3_server();
    let (_proxy, port, log) =
        POP3P.start("pop3p_creds", "users pu:CL:pp\nauth strong\nallow pu\n", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    assert_eq!(
        c.cmd(&format!("USER pu:pp:bob@127.0.0.1:{o}")),
        "+OK user\r\n"
    );
    assert_eq!(next(&rx), "USER bob\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "+OK bye\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("POP3P 00000 {cport} pu bob@127.0.0.1:{o} ")),
        "{rec}"
    );
    // A wrong password: refused before any connection.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER pu:no:bob@127.0.0.1:{o}")), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    // 3proxy's code for a wrong password.
    assert_eq!(rec, format!("POP3P 00006 {cport} pu bob@127.0.0.1:{o} 0 0"));
    assert_eq!(next(&rx), "QUIT\r\n");
    assert!(rx.try_recv().is_err(), "the server was reached");
    assert_eq!(origin.peers().len(), 1, "the server was reached");
}

#[test]
fn pop3p_acl_refuses_a_destination() {
    let (origin, rx) = pop3_server();
    let o = origin.port();
    let (_proxy, port, log) = POP3P.start(
        "pop3p_acl",
        &format!("auth iponly\ndeny * * 127.0.0.1 {o}\nallow *\n"),
        "",
    );
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("POP3P 00001 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
    assert!(origin.peers().is_empty(), "the server was reached");
    assert!(rx.try_recv().is_err());
}

#[test]
fn pop3p_commands_before_user() {
    let (_proxy, port, log) = POP3P.start("pop3p_before_user", "", "");
    // Anything but USER and QUIT: asked for USER, as often as it comes.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd("CAPA"), "+OK Capability list follows\r\n");
    assert_eq!(c.line(), "STLS\r\n");
    assert_eq!(c.line(), ".\r\n");
    assert_eq!(c.cmd("NOOP"), "-ERR need USER first\r\n");
    // Too short to be a command: the session ends.
    assert_eq!(c.cmd("XY"), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("POP3P 00612 {cport} -  0 0"));
    // QUIT: a polite goodbye, code 0.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd("QUIT"), "+OK\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("POP3P 00000 {cport} -  0 0"));
    // USER glued to something else.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd("USERX bob@h"), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("POP3P 00614 {cport} -  0 0"));
    // No host, a bad port: a bad login.
    for bad in ["USER bob", "USER bob@127.0.0.1:x", "USER @127.0.0.1"] {
        let mut c = LineClient::connect(port, READY);
        assert_eq!(c.cmd(bad), "-ERR\r\n", "{bad}");
        let cport = c.port();
        c.assert_closed();
        expect_log_line(&log, &format!("POP3P 00615 {cport} -  0 0"));
    }
}

#[test]
fn pop3p_destination_refusing_the_connection() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let o = closed.local_addr().unwrap().port();
    drop(closed);
    let (_proxy, port, log) = POP3P.start("pop3p_refused", "", "");
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("POP3P 00013 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
}

#[test]
fn pop3p_server_that_is_not_pop3() {
    // Greets with -ERR: 622, and the client is told.
    let origin = Origin::start("127.0.0.1:0", |mut s: TcpStream| {
        let _ = s.write_all(b"-ERR go away\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let o = origin.port();
    let (_proxy, port, log) = POP3P.start("pop3p_not_pop3", "", "");
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "-ERR\r\n");
    let cport = c.port();
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert_eq!(rec, format!("POP3P 00622 {cport} - bob@127.0.0.1:{o} 0 14"));
}

#[test]
fn pop3p_default_host_for_a_login_without_one() {
    let (origin, rx) = pop3_server();
    let o = origin.port();
    let (_proxy, port, log) = POP3P.start("pop3p_default_host", "", &format!("-h127.0.0.1:{o}"));
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd("USER bob"), "+OK user\r\n");
    assert_eq!(next(&rx), "USER bob\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "+OK bye\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("POP3P 00000 {cport} - bob@127.0.0.1:{o} ")),
        "{rec}"
    );
}
