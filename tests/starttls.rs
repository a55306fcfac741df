//! STARTTLS and tlspr's certificate checks against real servers: Dovecot
//! (IMAP and POP3) and aiosmtpd (SMTP) from Debian, `openssl s_server`
//! for `-c3`/`-c4`; the client is `openssl s_client` throughout.
//!
//! tlspr `-Ximap`/`-Xpop3`/`-Xsmtp` speaks STARTTLS with both sides; the
//! mail proxies offer it (unless `-x`) and hand a client that asks to
//! tlspr, which does the server's side. TLS then runs end to end between
//! the client and the server: the proxy reads the ClientHello's SNI as
//! the destination and relays bytes.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::tls::Pki;
use crate::util::*;

const FMT: &str = "logformat \"L%N %E %T\"";

/// Dovecot on free ports of 127.0.0.1 (IMAP, POP3, both with STARTTLS
/// and `pki`'s server certificate, and POP3S, IMAPS), user bob, password secret.
/// Its log is `dovecot/dovecot.log` in the test dir.
pub(crate) struct Dovecot {
    child: Child,
    imap: u16,
    pop3: u16,
    pub(crate) pop3s: u16,
    pub(crate) imaps: u16,
}

impl Dovecot {
    pub(crate) fn start(dir: &Dir, pki: &Pki) -> Dovecot {
        let (imap, pop3) = (free_port(), free_port());
        let (pop3s, imaps) = (free_port(), free_port());
        let root = dir.join("dovecot");
        for d in ["run", "state", "home"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // The mail processes run as nobody and need the home.
        let _ = Command::new("chmod")
            .args(["777", p(&root.join("home"))])
            .status();
        std::fs::write(root.join("passwd"), "bob:{PLAIN}secret::::::\n").unwrap();
        let r = |n: &str| p(&root.join(n)).to_string();
        let conf = format!(
            "protocols = imap pop3\nlisten = 127.0.0.1\nbase_dir = {run}\nstate_dir = {state}\n\
             log_path = {log}\nssl = yes\nssl_cert = <{cert}\nssl_key = <{key}\n\
             auth_mechanisms = plain login\ndisable_plaintext_auth = no\n\
             passdb {{\n  driver = passwd-file\n  args = {passwd}\n}}\n\
             userdb {{\n  driver = static\n  args = uid=nobody gid=nogroup home={home}/%u\n}}\n\
             mail_location = maildir:{home}/%u/Maildir\n\
             service imap-login {{\n  chroot =\n  inet_listener imap {{\n    port = {imap}\n  }}\n  \
             inet_listener imaps {{\n    port = {imaps}\n    ssl = yes\n  }}\n}}\n\
             service pop3-login {{\n  chroot =\n  inet_listener pop3 {{\n    port = {pop3}\n  }}\n  \
             inet_listener pop3s {{\n    port = {pop3s}\n    ssl = yes\n  }}\n}}\n\
             service anvil {{\n  chroot =\n}}\n",
            run = r("run"),
            state = r("state"),
            log = r("dovecot.log"),
            cert = p(&pki.cert),
            key = p(&pki.key),
            passwd = r("passwd"),
            home = r("home"),
        );
        std::fs::write(root.join("dovecot.conf"), conf).unwrap();
        let child = Command::new(sbin("dovecot"))
            .args(["-F", "-c", p(&root.join("dovecot.conf"))])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dovecot (tests/deps.sh installs dovecot-imapd and dovecot-pop3d)");
        let d = Dovecot {
            child,
            imap,
            pop3,
            pop3s,
            imaps,
        };
        for port in [imap, pop3] {
            assert!(
                wait_for(|| greets(port), START_TIMEOUT),
                "dovecot did not greet on {port}:\n{}",
                std::fs::read_to_string(root.join("dovecot.log")).unwrap_or_default()
            );
        }
        d
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Something listening on `port` sends a first line.
fn greets(port: u16) -> bool {
    let Ok(s) = std::net::TcpStream::connect(localhost(port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).is_ok() && !l.is_empty()
}

/// aiosmtpd (Debian's python3-aiosmtpd) on a free port: STARTTLS with
/// `pki`'s certificate when `tls`, messages printed on its stdout.
struct Smtpd {
    child: Child,
    port: u16,
}

impl Smtpd {
    fn start(pki: &Pki, tls: bool) -> Smtpd {
        let port = free_port();
        let mut cmd = Command::new("/usr/bin/python3");
        cmd.args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}")]);
        if tls {
            cmd.args(["--tlscert", p(&pki.cert), "--tlskey", p(&pki.key)]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m aiosmtpd (tests/deps.sh installs python3-aiosmtpd)");
        let s = Smtpd { child, port };
        assert!(
            wait_for(|| greets(port), START_TIMEOUT),
            "aiosmtpd did not greet on {port}"
        );
        s
    }
}

impl Drop for Smtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `openssl s_client` to the proxy on `port` with `args`, trusting `ca`,
/// SNI `localhost`; `input` is typed once the session is up. Returns
/// what it printed (stdout and stderr).
fn s_client(port: u16, ca: &Path, args: &[&str], input: &str) -> String {
    let mut c = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-CAfile", p(ca)])
        .args(["-verify_return_error", "-ign_eof", "-crlf", "-quiet"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl (tests/deps.sh installs it)");
    let mut stdin = c.stdin.take().unwrap();
    let input = input.to_string();
    // Typed after a pause: s_client reads its input once the handshake is
    // done, and a client that has sent everything waits for the answers.
    let feeder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        let _ = stdin.write_all(input.as_bytes());
        std::thread::sleep(Duration::from_millis(1500));
        drop(stdin);
    });
    let out = wait_output(c, Duration::from_secs(20));
    let _ = feeder.join();
    out
}

/// The output of `c`, killed if it runs longer than `limit`.
fn wait_output(mut c: Child, limit: Duration) -> String {
    let (mut o, mut e) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
    let ot = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut o, &mut s);
        s
    });
    let et = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
        s
    });
    if !wait_for(|| matches!(c.try_wait(), Ok(Some(_))), limit) {
        let _ = c.kill();
    }
    let _ = c.wait();
    format!("{}{}", ot.join().unwrap(), et.join().unwrap())
}

/// Our proxy running `services` (each line with its `-pPORT`).
fn proxy(name: &str, services: &str) -> (Proxy, PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("access.log");
    let cfg = format!("log {}\n{FMT}\n{services}", p(&log));
    let ports: Vec<Listen> = services
        .lines()
        .filter_map(|l| l.split(" -p").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .map(|port| Listen::Tcp(localhost(port)))
        .collect();
    (Proxy::start(dir, &cfg, &ports), log)
}

#[test]
fn tlspr_x_imap_does_starttls_with_both_sides() {
    let pki_dir = Dir::new("stls_imap_pki");
    let pki = Pki::new(&pki_dir);
    let dovecot = Dovecot::start(&pki_dir, &pki);
    let port = free_port();
    let (_proxy, log) = proxy(
        "stls_imap",
        &format!("tlspr -i127.0.0.1 -p{port} -Ximap -P{}\n", dovecot.imap),
    );
    let out = s_client(
        port,
        &pki.ca,
        &["-starttls", "imap"],
        "a1 LOGIN bob secret\na2 LOGOUT\n",
    );
    // Dovecot's own answers, over TLS with its certificate (verified).
    assert!(out.contains("a1 OK"), "{out}");
    assert!(out.contains("a2 OK Logout completed"), "{out}");
    assert!(!out.contains("verify error"), "{out}");
    read_log_line(&log, "the session", |l| ended_well(l, "TLSPR"));
}

/// The record of a STARTTLS session of `service` that ended after the
/// server's goodbye and close_notify: code 0, also when the client's
/// close_notify in reply reached the server as it closed, so that it
/// reset the connection (a reset read ends the server's side; see
/// tcppm::a_server_that_resets_after_its_last_bytes_ends_the_session_with_0).
fn ended_well(l: &str, service: &str) -> bool {
    l.starts_with(&format!("{service} 00000 TLSv1.3 localhost"))
}

#[test]
fn pop3p_and_imapp_hand_a_starttls_client_to_tlspr() {
    let pki_dir = Dir::new("stls_mail_pki");
    let pki = Pki::new(&pki_dir);
    let dovecot = Dovecot::start(&pki_dir, &pki);
    let (pp, ip) = (free_port(), free_port());
    let (_proxy, log) = proxy(
        "stls_mail",
        &format!(
            "pop3p -i127.0.0.1 -p{pp} -P{}\nimapp -i127.0.0.1 -p{ip} -P{}\n",
            dovecot.pop3, dovecot.imap
        ),
    );
    let out = s_client(
        pp,
        &pki.ca,
        &["-starttls", "pop3"],
        "USER bob\nPASS secret\nQUIT\n",
    );
    assert!(out.contains("+OK Logged in."), "{out}");
    assert!(!out.contains("verify error"), "{out}");
    read_log_line(&log, "the POP3 session", |l| ended_well(l, "POP3P"));
    let out = s_client(
        ip,
        &pki.ca,
        &["-starttls", "imap"],
        "a1 LOGIN bob secret\na2 LOGOUT\n",
    );
    assert!(out.contains("a1 OK"), "{out}");
    assert!(out.contains("a2 OK Logout completed"), "{out}");
    read_log_line(&log, "the IMAP session", |l| ended_well(l, "IMAPP"));
}

#[test]
fn smtpp_hands_a_starttls_client_to_tlspr_and_the_mail_arrives() {
    let pki_dir = Dir::new("stls_smtp_pki");
    let pki = Pki::new(&pki_dir);
    let smtpd = Smtpd::start(&pki, true);
    let port = free_port();
    let (_proxy, log) = proxy(
        "stls_smtp",
        &format!("smtpp -i127.0.0.1 -p{port} -P{}\n", smtpd.port),
    );
    let out = s_client(
        port,
        &pki.ca,
        &["-starttls", "smtp"],
        "EHLO client.example\nMAIL FROM:<a@example.org>\nRCPT TO:<b@example.org>\n\
         DATA\nSubject: through the proxy\n\nhello\n.\nQUIT\n",
    );
    assert!(out.contains("250 OK"), "{out}");
    assert!(out.contains("221 Bye"), "{out}");
    read_log_line(&log, "the SMTP session", |l| ended_well(l, "SMTPP"));
}

#[test]
fn a_server_without_starttls_is_refused_with_363() {
    let pki_dir = Dir::new("stls_none_pki");
    let pki = Pki::new(&pki_dir);
    let smtpd = Smtpd::start(&pki, false);
    let port = free_port();
    let (_proxy, log) = proxy(
        "stls_none",
        &format!("tlspr -i127.0.0.1 -p{port} -Xsmtp -P{}\n", smtpd.port),
    );
    let out = s_client(port, &pki.ca, &["-starttls", "smtp"], "QUIT\n");
    // The client is told with a TLS alert (handshake failure).
    assert!(out.contains("alert handshake failure"), "{out}");
    read_log_line(&log, "the refusal", |l| l.starts_with("TLSPR 00363 "));
}

#[test]
fn with_x_no_starttls_is_offered() {
    let port = free_port();
    let (_proxy, _log) = proxy("stls_x", &format!("pop3p -i127.0.0.1 -p{port} -x\n"));
    let s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let mut r = BufReader::new(s.try_clone().unwrap());
    let line = |r: &mut BufReader<std::net::TcpStream>| {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };
    assert_eq!(line(&mut r), "+OK Proxy\r\n");
    (&s).write_all(b"CAPA\r\n").unwrap();
    assert_eq!(line(&mut r), "-ERR need USER first\r\n");
    (&s).write_all(b"STLS\r\n").unwrap();
    assert_eq!(line(&mut r), "-ERR need USER first\r\n");
}

/// `openssl s_server -www` on a free port with `pki`'s certificate and
/// `args` (a protocol, a client certificate request).
fn s_server(pki: &Pki, args: &[&str]) -> (Child, u16) {
    let port = free_port();
    let c = Command::new("openssl")
        .args(["s_server", "-accept", &port.to_string(), "-www", "-quiet"])
        .args(["-cert", p(&pki.cert), "-key", p(&pki.key)])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    assert!(
        wait_for(
            || std::net::TcpStream::connect(localhost(port)).is_ok(),
            START_TIMEOUT
        ),
        "s_server did not listen"
    );
    (c, port)
}

#[test]
fn c3_needs_a_server_certificate_it_can_see() {
    let pki_dir = Dir::new("c3_pki");
    let pki = Pki::new(&pki_dir);
    let (mut s12, p12) = s_server(&pki, &["-tls1_2"]);
    let (mut s13, p13) = s_server(&pki, &["-tls1_3"]);
    let (a, b) = (free_port(), free_port());
    let (_proxy, log) = proxy(
        "c3",
        &format!("tlspr -i127.0.0.1 -p{a} -c3 -P{p12}\ntlspr -i127.0.0.1 -p{b} -c3 -P{p13}\n"),
    );
    // TLS 1.2: the certificate is seen, the page comes.
    let out = s_client(a, &pki.ca, &[], "GET / HTTP/1.0\n\n");
    assert!(out.contains("HTTP/1.0 200 ok"), "{out}");
    read_log_line(&log, "the 1.2 session", |l| {
        l.starts_with("TLSPR 00000 TLSv1.2 localhost")
    });
    // TLS 1.3 hides it: refused with 370.
    let out = s_client(b, &pki.ca, &[], "GET / HTTP/1.0\n\n");
    assert!(!out.contains("HTTP/1.0 200 ok"), "{out}");
    read_log_line(&log, "the 1.3 refusal", |l| {
        l.starts_with("TLSPR 00370 TLSv1.3 localhost")
    });
    let _ = (s12.kill(), s13.kill(), s12.wait(), s13.wait());
}

#[test]
fn c4_needs_a_client_certificate_asked_for_and_sent() {
    let pki_dir = Dir::new("c4_pki");
    let pki = Pki::new(&pki_dir);
    let ca = p(&pki.ca).to_string();
    let (mut asks, pa) = s_server(&pki, &["-tls1_2", "-verify", "1", "-CAfile", &ca]);
    let (mut plain, pp) = s_server(&pki, &["-tls1_2"]);
    let (a, b) = (free_port(), free_port());
    let (_proxy, log) = proxy(
        "c4",
        &format!("tlspr -i127.0.0.1 -p{a} -c4 -P{pa}\ntlspr -i127.0.0.1 -p{b} -c4 -P{pp}\n"),
    );
    let cert = ["-cert", p(&pki.client_cert), "-key", p(&pki.client_key)];
    let out = s_client(a, &pki.ca, &cert, "GET / HTTP/1.0\n\n");
    assert!(out.contains("HTTP/1.0 200 ok"), "{out}");
    read_log_line(&log, "the session with a certificate", |l| {
        l.starts_with("TLSPR 00000 TLSv1.2 localhost")
    });
    // Asked, but none sent: 375.
    let out = s_client(a, &pki.ca, &[], "GET / HTTP/1.0\n\n");
    assert!(!out.contains("HTTP/1.0 200 ok"), "{out}");
    read_log_line(&log, "the session without one", |l| {
        l.starts_with("TLSPR 00375 ")
    });
    // Never asked: 374.
    let out = s_client(b, &pki.ca, &cert, "GET / HTTP/1.0\n\n");
    assert!(!out.contains("HTTP/1.0 200 ok"), "{out}");
    read_log_line(&log, "the server that does not ask", |l| {
        l.starts_with("TLSPR 00374 ")
    });
    let _ = (asks.kill(), plain.kill(), asks.wait(), plain.wait());
}
