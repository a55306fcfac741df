//! `smtpp`, the SMTP proxy: a whole session through it to an SMTP server
//! the test runs (AUTH LOGIN and AUTH PLAIN), `delimchar`, ACL refusals,
//! commands before AUTH, `-h`, a destination that refuses, and the log
//! records.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::util::*;

/// Service, code, client port, proxy user, text, bytes out and in.
const FMT: &str = "L%N %E %c %U %T %O %I";
const BANNER: &str = "220-test.example ESMTP\r\n220 ready\r\n";
/// The proxy's greeting.
const READY: &str = "220 Proxy\r\n";

/// The service of these tests.
const SMTPP: Service = Service::tcp("smtpp", FMT);

/// A tiny SMTP server offering `auth` in its EHLO answer: it answers the
/// commands of a session and sends every line it receives down the
/// channel.
pub fn smtp_server(auth: &'static str) -> (Origin, Receiver<String>) {
    let (tx, rx) = channel();
    let origin = Origin::start("127.0.0.1:0", move |mut s: TcpStream| {
        let tx = tx.clone();
        if s.write_all(BANNER.as_bytes()).is_err() {
            return;
        }
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        let mut data = false;
        let mut auth_steps = 0;
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(line.clone());
            let reply: String = if data {
                if line == ".\r\n" {
                    data = false;
                    "250 queued\r\n".into()
                } else {
                    String::new()
                }
            } else if auth_steps > 0 {
                auth_steps -= 1;
                if auth_steps > 0 {
                    "334 UGFzc3dvcmQ6\r\n".into()
                } else {
                    "235 ok\r\n".into()
                }
            } else {
                match line.get(..4).unwrap_or("").to_ascii_uppercase().as_str() {
                    "EHLO" => format!("250-test.example\r\n250-{auth}\r\n250 SIZE 1000\r\n"),
                    "AUTH" if line.starts_with("AUTH LOGIN") => {
                        auth_steps = 2;
                        "334 VXNlcm5hbWU6\r\n".into()
                    }
                    "AUTH" => {
                        auth_steps = 1;
                        "334 \r\n".into()
                    }
                    "MAIL" | "RCPT" => "250 ok\r\n".into(),
                    "DATA" => {
                        data = true;
                        "354 go\r\n".into()
                    }
                    "QUIT" => "221 bye\r\n".into(),
                    _ => "500 what\r\n".into(),
                }
            };
            let quit = line.starts_with("QUIT");
            line.clear();
            if s.write_all(reply.as_bytes()).is_err() || quit {
                return;
            }
        }
    });
    (origin, rx)
}

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a line at the SMTP server")
}

/// MAIL, RCPT, DATA and QUIT through the proxy; what the server got.
fn mail(c: &mut LineClient, rx: &Receiver<String>) -> Vec<String> {
    assert_eq!(c.reply_to("MAIL FROM:<a@x>"), "250 ok\r\n");
    assert_eq!(c.reply_to("RCPT TO:<b@y>"), "250 ok\r\n");
    assert_eq!(c.reply_to("DATA"), "354 go\r\n");
    assert_eq!(c.reply_to("Subject: hi\r\n\r\nbody\r\n."), "250 queued\r\n");
    assert_eq!(c.reply_to("QUIT"), "221 bye\r\n");
    (0..7).map(|_| next(rx)).collect()
}

const MAIL_LINES: [&str; 7] = [
    "MAIL FROM:<a@x>\r\n",
    "RCPT TO:<b@y>\r\n",
    "DATA\r\n",
    "Subject: hi\r\n",
    "\r\n",
    "body\r\n",
    ".\r\n",
];

#[test]
fn smtpp_full_session_with_auth_login() {
    let (origin, rx) = smtp_server("AUTH LOGIN PLAIN");
    let (_proxy, port, log) = SMTPP.start("smtpp_session", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    assert_eq!(
        c.reply_to("EHLO me"),
        "250-Proxy\r\n250-AUTH PLAIN LOGIN\r\n250-8BITMIME\r\n250-STARTTLS\r\n250 DSN\r\n"
    );
    assert_eq!(c.reply_to("AUTH LOGIN"), "334 VXNlcm5hbWU6\r\n");
    assert_eq!(
        c.reply_to(&base64(format!("bob@127.0.0.1:{o}").as_bytes())),
        "334 UGFzc3dvcmQ6\r\n"
    );
    // The server's answer to the proxy's login is the client's.
    assert_eq!(c.reply_to(&base64(b"secret")), "235 ok\r\n");
    assert_eq!(next(&rx), "EHLO [127.0.0.1]\r\n");
    assert_eq!(next(&rx), "AUTH LOGIN\r\n");
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"bob")));
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"secret")));
    let got = mail(&mut c, &rx);
    let mut want: Vec<String> = MAIL_LINES.iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want);
    assert_eq!(next(&rx), "QUIT\r\n");
    let cport = c.port();
    c.assert_closed();
    // Out: all the server received; in: all it sent.
    want.insert(
        0,
        "EHLO [127.0.0.1]\r\nAUTH LOGIN\r\nYm9i\r\nc2VjcmV0\r\n".to_string(),
    );
    want.push("QUIT\r\n".into());
    let out: usize = want.iter().map(|s| s.len()).sum();
    let inb = BANNER.len()
        + "250-test.example\r\n250-AUTH LOGIN PLAIN\r\n250 SIZE 1000\r\n".len()
        + "334 VXNlcm5hbWU6\r\n334 UGFzc3dvcmQ6\r\n235 ok\r\n".len()
        + "250 ok\r\n250 ok\r\n354 go\r\n250 queued\r\n221 bye\r\n".len();
    expect_log_line(
        &log,
        &format!("SMTPP 00000 {cport} - bob@127.0.0.1:{o} {out} {inb}"),
    );
}

#[test]
fn smtpp_auth_plain_in_one_line_logs_in_with_plain() {
    // The server offers PLAIN only: the proxy logs in with it.
    let (origin, rx) = smtp_server("AUTH PLAIN");
    let (_proxy, port, log) = SMTPP.start("smtpp_plain", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.reply_to("HELO me"), "250 Proxy\r\n");
    let login = format!("\0me@corp@127.0.0.1:{o}\0pw");
    assert_eq!(
        c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes()))),
        "235 ok\r\n"
    );
    assert_eq!(next(&rx), "EHLO [127.0.0.1]\r\n");
    assert_eq!(next(&rx), "AUTH PLAIN\r\n");
    // Split at the last '@'.
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"\0me@corp\0pw")));
    assert_eq!(mail(&mut c, &rx), MAIL_LINES);
    let cport = c.port();
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("SMTPP 00000 {cport} - me@corp@127.0.0.1:{o} ")),
        "{rec}"
    );
}

#[test]
fn smtpp_auth_plain_asked_for_and_delimchar() {
    let (origin, rx) = smtp_server("AUTH LOGIN");
    let (_proxy, port, log) = SMTPP.start_then("smtpp_delim", "", "", "delimchar #\n");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.reply_to("AUTH PLAIN"), "334\r\n");
    let login = format!("\0a@b#127.0.0.1:{o}\0pw");
    assert_eq!(c.reply_to(&base64(login.as_bytes())), "235 ok\r\n");
    assert_eq!(next(&rx), "EHLO [127.0.0.1]\r\n");
    assert_eq!(next(&rx), "AUTH LOGIN\r\n");
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"a@b")));
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"pw")));
    let cport = c.port();
    assert_eq!(c.reply_to("QUIT"), "221 bye\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("SMTPP 00000 {cport} - a@b@127.0.0.1:{o} ")),
        "{rec}"
    );
    // With '#' the '@' is part of the name: no host, a bad login.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.reply_to("AUTH LOGIN"), "334 VXNlcm5hbWU6\r\n");
    assert_eq!(
        c.reply_to(&base64(format!("bob@127.0.0.1:{o}").as_bytes())),
        "571 \r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("SMTPP 00664 {cport} -  0 0"));
}

#[test]
fn smtpp_acl_refuses_a_destination() {
    let (origin, rx) = smtp_server("AUTH LOGIN");
    let o = origin.port();
    let (_proxy, port, log) = SMTPP.start(
        "smtpp_acl",
        &format!("auth iponly\ndeny * * 127.0.0.1 {o}\nallow *\n"),
        "",
    );
    let mut c = LineClient::connect(port, READY);
    let login = format!("\0bob@127.0.0.1:{o}\0pw");
    assert_eq!(
        c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes()))),
        "571 \r\n"
    );
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("SMTPP 00001 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
    assert!(origin.peers().is_empty(), "the server was reached");
    assert!(rx.try_recv().is_err());
}

#[test]
fn smtpp_proxy_credentials_in_the_login() {
    let (origin, rx) = smtp_server("AUTH LOGIN");
    let o = origin.port();
    let (_proxy, port, log) =
        SMTPP.start("smtpp_creds", "users pu:CL:pp\nauth strong\nallow pu\n", "");
    let mut c = LineClient::connect(port, READY);
    let login = format!("\0pu:pp:bob@127.0.0.1:{o}\0pw");
    assert_eq!(
        c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes()))),
        "235 ok\r\n"
    );
    assert_eq!(next(&rx), "EHLO [127.0.0.1]\r\n");
    assert_eq!(next(&rx), "AUTH LOGIN\r\n");
    assert_eq!(next(&rx), format!("{}\r\n", base64(b"bob")));
    let cport = c.port();
    assert_eq!(c.reply_to("QUIT"), "221 bye\r\n");
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("SMTPP 00000 {cport} pu bob@127.0.0.1:{o} ")),
        "{rec}"
    );
    // A wrong proxy password: refused before any connection.
    let mut c = LineClient::connect(port, READY);
    let login = format!("\0pu:no:bob@127.0.0.1:{o}\0pw");
    assert_eq!(
        c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes()))),
        "571 \r\n"
    );
    let cport = c.port();
    c.assert_closed();
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SMTPP 00006 {cport} pu bob@127.0.0.1:{o} 0 0")
    );
    assert_eq!(origin.peers().len(), 1, "the server was reached");
}

#[test]
fn smtpp_commands_before_auth_and_bad_logins() {
    // `-x`: no STARTTLS, which is then refused like any other command.
    let (_proxy, port, log) = SMTPP.start("smtpp_before_auth", "", "-x");
    // Without -h anything but HELO, EHLO, QUIT and AUTH is refused.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(
        c.reply_to("EHLO me"),
        "250-Proxy\r\n250-AUTH PLAIN LOGIN\r\n250-8BITMIME\r\n250 DSN\r\n"
    );
    assert_eq!(c.reply_to("MAIL FROM:<a@x>"), "571 need AUTH first\r\n");
    assert_eq!(c.reply_to("STARTTLS"), "571 need AUTH first\r\n");
    // Too short to be a command: the session ends.
    assert_eq!(c.reply_to("XY"), "571 \r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("SMTPP 00662 {cport} -  0 0"));
    // QUIT: a polite goodbye, code 0.
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.reply_to("QUIT"), "221 Proxy\r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("SMTPP 00000 {cport} -  0 0"));
    // Not base64, no name, AUTH PLAIN with an authzid, no host.
    let cases: [(&[&str], u32); 5] = [
        (&["AUTH LOGIN", "!!!"], 664),
        (&["AUTH LOGIN", "=="], 664),
        (&["AUTH LOGIN", &base64(b"bob@127.0.0.1"), "%%%"], 666),
        (&["AUTH PLAIN", &base64(b"z\0bob@127.0.0.1\0pw")], 668),
        (&[&format!("AUTH PLAIN {}", base64(b"\0bob\0pw"))], 668),
    ];
    for (lines, code) in cases {
        let mut c = LineClient::connect(port, READY);
        let mut last = String::new();
        for l in lines {
            last = c.reply_to(l);
        }
        assert_eq!(last, "571 \r\n", "{lines:?}");
        let cport = c.port();
        c.assert_closed();
        let rec = record_of(&log, FMT, cport);
        assert!(
            rec.starts_with(&format!("SMTPP {code:05} {cport} ")),
            "{lines:?}: {rec}"
        );
    }
}

#[test]
fn smtpp_destination_refusing_the_connection() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let o = closed.local_addr().unwrap().port();
    drop(closed);
    let (_proxy, port, log) = SMTPP.start("smtpp_refused", "", "");
    let mut c = LineClient::connect(port, READY);
    let login = format!("\0bob@127.0.0.1:{o}\0pw");
    let reply = c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes())));
    assert_eq!(reply, "571 \r\n");
    let cport = c.port();
    c.assert_closed();
    expect_log_line(
        &log,
        &format!("SMTPP 00013 {cport} - bob@127.0.0.1:{o} 0 0"),
    );
}

#[test]
fn smtpp_server_that_is_not_smtp() {
    // Greets with 554: 672, and the client is told.
    let origin = Origin::start("127.0.0.1:0", |mut s: TcpStream| {
        let _ = s.write_all(b"554 go away\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let o = origin.port();
    let (_proxy, port, log) = SMTPP.start("smtpp_not_smtp", "", "");
    let mut c = LineClient::connect(port, READY);
    let login = format!("\0bob@127.0.0.1:{o}\0pw");
    let reply = c.reply_to(&format!("AUTH PLAIN {}", base64(login.as_bytes())));
    assert_eq!(reply, "571 \r\n");
    let cport = c.port();
    c.assert_closed();
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SMTPP 00672 {cport} - bob@127.0.0.1:{o} 0 13")
    );
}

#[test]
fn smtpp_default_host_takes_commands_without_auth() {
    let (origin, rx) = smtp_server("SIZE");
    let o = origin.port();
    let (_proxy, port, log) = SMTPP.start("smtpp_default_host", "", &format!("-h127.0.0.1:{o}"));
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.reply_to("EHLO me").lines().count(), 5);
    // The first other command goes to the server after the proxy's EHLO.
    let got = mail(&mut c, &rx);
    assert_eq!(got[0], "EHLO [127.0.0.1]\r\n");
    assert_eq!(got[1..], MAIL_LINES[..6]);
    assert_eq!(next(&rx), ".\r\n");
    assert_eq!(next(&rx), "QUIT\r\n");
    let cport = c.port();
    c.assert_closed();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with(&format!("SMTPP 00000 {cport} -  ")),
        "{rec}"
    );
}
