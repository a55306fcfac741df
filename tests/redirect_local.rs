//! Local redirections (`parent WEIGHT TYPE 0.0.0.0 0`): a client of
//! `socks`, `proxy`, `tcppm` or `tlspr` handed, in the same process, to
//! the handler of TYPE, which checks the ACL again (skipping the entries
//! that redirect locally), speaks its own protocol to the client and
//! writes the session's record. Each test runs the real binary, talks
//! through real sockets to origins the test starts, and checks what the
//! user sees, what the origin got, and the record (code, hops).

use std::io::Write;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::ftppr::{ftp_server, Seen};
use crate::imapp::imap_server;
use crate::pop3p::pop3_server;
use crate::smtpp::smtp_server;
use crate::socks::http_origin;
use crate::util::*;

/// Service, code, hops, client port, text.
const FMT: &str = "L%N %E %h %c %T";

/// The SOCKS service most tests hand their clients over from.
const SOCKS: Service = Service::tcp("socks", FMT);

/// CONNECTs go to the handler of `kind`; its own pass takes `allow *`.
fn redirect(kind: &str) -> String {
    format!("allow * * * * CONNECT\nparent 1000 {kind} 0.0.0.0 0\nallow *\n")
}

fn socks_on(port: u16) -> String {
    format!("socks -i127.0.0.1 -p{port}\n")
}

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a line at the origin")
}

#[test]
fn socks_to_pop3_logs_in_at_the_requested_server() {
    let (origin, rx) = pop3_server();
    let (_p, pa, log) = SOCKS.start("rl_pop3", &redirect("pop3"), "");
    // The SOCKS CONNECT names the POP3 server; USER needs no @host.
    let mut c = LineClient::on(socks5_to(pa, origin.port()));
    assert_eq!(c.line(), "+OK Proxy\r\n");
    assert_eq!(c.cmd("USER bob"), "+OK user\r\n");
    assert_eq!(next(&rx), "USER bob\r\n");
    assert_eq!(c.cmd("PASS secret"), "+OK pass\r\n");
    assert_eq!(next(&rx), "PASS secret\r\n");
    assert_eq!(c.cmd("STAT"), "+OK 2 320\r\n");
    assert_eq!(c.cmd("QUIT"), "+OK bye\r\n");
    let cport = c.port();
    drop(c);
    // The POP3 handler's record: one hop (the redirection), its text.
    let rec = record_of(&log, FMT, cport);
    assert_eq!(
        rec,
        format!("SOCK5 00000 1 {cport} bob@127.0.0.1:{}", origin.port())
    );
}

#[test]
fn socks_to_pop3_login_with_a_host_goes_there() {
    // `USER name@host` still picks its own server; the port is the one
    // the SOCKS request asked for.
    let (origin, rx) = pop3_server();
    let (_p, pa, log) = SOCKS.start("rl_pop3_at", &redirect("pop3"), "");
    let mut c = LineClient::on(socks5_to(pa, origin.port()));
    assert_eq!(c.line(), "+OK Proxy\r\n");
    assert_eq!(c.cmd("USER carol@localhost"), "+OK user\r\n");
    assert_eq!(next(&rx), "USER carol\r\n");
    let cport = c.port();
    drop(c);
    let rec = record_of(&log, FMT, cport);
    assert_eq!(
        rec,
        format!("SOCK5 00000 1 {cport} carol@localhost:{}", origin.port())
    );
}

#[test]
fn socks_to_smtp_auth_login_without_a_host() {
    let (origin, rx) = smtp_server("AUTH LOGIN PLAIN");
    let (_p, pa, log) = SOCKS.start("rl_smtp", &redirect("smtp"), "");
    let mut c = LineClient::on(socks5_to(pa, origin.port()));
    assert_eq!(c.line(), "220 Proxy\r\n");
    assert_eq!(c.cmd("EHLO me"), "250-Proxy\r\n");
    // AUTH PLAIN LOGIN, 8BITMIME, STARTTLS, DSN.
    for _ in 0..4 {
        c.line();
    }
    assert_eq!(c.cmd("AUTH LOGIN"), "334 VXNlcm5hbWU6\r\n");
    assert_eq!(c.cmd(&base64(b"bob")), "334 UGFzc3dvcmQ6\r\n");
    // The proxy logs in at the server with the name and password: its
    // answer is the client's.
    assert_eq!(c.cmd(&base64(b"pw")), "235 ok\r\n");
    let seen: Vec<String> = (0..4).map(|_| next(&rx)).collect();
    assert!(seen[0].starts_with("EHLO ["), "{seen:?}");
    assert_eq!(
        seen[1..],
        [
            "AUTH LOGIN\r\n".to_string(),
            format!("{}\r\n", base64(b"bob")),
            format!("{}\r\n", base64(b"pw"))
        ]
    );
    assert_eq!(c.cmd("MAIL FROM:<bob@example.org>"), "250 ok\r\n");
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    let cport = c.port();
    drop(c);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} bob@127.0.0.1:{}", origin.port())
    );
}

#[test]
fn socks_to_imap_login_without_a_host() {
    let (origin, rx) = imap_server("* OK [CAPABILITY IMAP4rev1] test imap\r\n", "");
    let (_p, pa, log) = SOCKS.start("rl_imap", &redirect("imap"), "");
    let mut c = LineClient::on(socks5_to(pa, origin.port()));
    assert!(c.line().starts_with("* OK [CAPABILITY"));
    assert_eq!(c.cmd("a1 LOGIN bob pw"), "a1 OK LOGIN done\r\n");
    assert_eq!(next(&rx), "a1 LOGIN bob pw\r\n");
    assert_eq!(c.cmd("a2 LOGOUT"), "* BYE bye\r\n");
    assert_eq!(c.line(), "a2 OK LOGOUT done\r\n");
    let cport = c.port();
    drop(c);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} bob@127.0.0.1:{}", origin.port())
    );
}

#[test]
fn socks_to_ftp_login_and_a_listing() {
    let (origin, rx) = ftp_server();
    let (_p, pa, log) = SOCKS.start("rl_ftp", &redirect("ftp"), "");
    let mut c = LineClient::on(socks5_to(pa, origin.port()));
    assert_eq!(c.line(), "220 Ready\r\n");
    assert_eq!(c.cmd("USER bob"), "331 ok\r\n");
    assert_eq!(c.cmd("PASS pw"), "230-welcome\r\n");
    assert_eq!(c.line(), "230 logged in\r\n");
    let seen: Vec<String> = rx
        .try_iter()
        .filter_map(|s| match s {
            Seen::Line(l) => Some(l),
            Seen::Stored(_) => None,
        })
        .collect();
    assert_eq!(seen, ["USER bob\r\n", "PASS pw\r\n"]);
    // A data connection through the proxy, as for an ftppr client.
    let pasv = c.cmd("PASV");
    assert!(pasv.starts_with("227 "), "{pasv}");
    let nums: Vec<u16> = pasv
        .split(['(', ')'])
        .nth(1)
        .unwrap()
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let mut d = connect(localhost(nums[4] * 256 + nums[5]));
    c.send("LIST");
    assert_eq!(c.line(), "125 data\r\n");
    let listing = read_until_closed(&mut d).unwrap();
    assert!(
        String::from_utf8_lossy(&listing).contains("file.bin"),
        "{listing:?}"
    );
    assert_eq!(c.line(), "226 done\r\n");
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    let cport = c.port();
    drop(c);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} bob@127.0.0.1:{}", origin.port())
    );
}

#[test]
fn tcppm_to_http_serves_proxy_requests() {
    let origin = http_origin("127.0.0.1:0");
    let pa = free_port();
    // The mapping's own destination does not matter: the HTTP handler
    // takes its requests' destinations.
    let body = redirect("http") + &format!("tcppm -i127.0.0.1 {pa} 127.0.0.1 9\n");
    let (_p, log) = start(Dir::new("rl_tcppm_http"), FMT, &body, &[pa]);
    let mut s = connect(localhost(pa));
    let url = format!("http://127.0.0.1:{}/mapped", origin.port());
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let got = String::from_utf8(read_until_closed(&mut s).unwrap()).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("hello /mapped"), "{got}");
    let cport = s.local_addr().unwrap().port();
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("TCPPM 00000 1 {cport} GET {url} HTTP/1.1")
    );
}

#[test]
fn tcppm_to_socks5_takes_a_socks_request() {
    let echo = Origin::echo();
    let pa = free_port();
    let body = redirect("socks5") + &format!("tcppm -i127.0.0.1 {pa} 127.0.0.1 9\n");
    let (_p, log) = start(Dir::new("rl_tcppm_socks"), FMT, &body, &[pa]);
    let mut s = socks5_to(pa, echo.port());
    echo_roundtrip(&mut s, b"through tcppm and socks");
    let cport = s.local_addr().unwrap().port();
    drop(s);
    // The SOCKS handler names the record by the version spoken.
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} CONNECT 127.0.0.1:{}", echo.port())
    );
}

/// A TLS 1.2 ClientHello record naming `sni`.
pub fn client_hello(sni: &str) -> Vec<u8> {
    let n = sni.len();
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&((n + 5) as u16).to_be_bytes());
    ext.extend_from_slice(&((n + 3) as u16).to_be_bytes());
    ext.push(0);
    ext.extend_from_slice(&(n as u16).to_be_bytes());
    ext.extend_from_slice(sni.as_bytes());
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0xc0, 0x2f, 1, 0]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[test]
fn socks_to_tls_checks_the_sni_and_relays_to_the_destination() {
    let echo = Origin::echo();
    let pa = free_port();
    let body = format!(
        "allow * * * * CONNECT\nparent 1000 tls 0.0.0.0 0\ndeny * * blocked.test\nallow *\n{}",
        socks_on(pa)
    );
    let (_p, log) = start(Dir::new("rl_tls"), FMT, &body, &[pa]);
    // The hello goes to the destination the SOCKS request named; the
    // echo sends it back, then the rest of the session.
    let mut s = socks5_to(pa, echo.port());
    echo_roundtrip(&mut s, &client_hello("localhost"));
    echo_roundtrip(&mut s, b"application data");
    let cport = s.local_addr().unwrap().port();
    drop(s);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} TLSv1.2 localhost -")
    );
    // The SNI is the name the ACL sees: a denied one is not relayed.
    let mut s = socks5_to(pa, echo.port());
    s.write_all(&client_hello("blocked.test")).unwrap();
    assert_eq!(read_until_closed(&mut s).unwrap(), b"");
    let cport = s.local_addr().unwrap().port();
    let rec = record_of(&log, FMT, cport);
    assert!(
        rec.starts_with("SOCK5 00001 1 ") && rec.ends_with(" TLSv1.2 blocked.test -"),
        "{rec}"
    );
}

#[test]
fn tlspr_to_tcp_relays_the_hello_to_the_sni_destination() {
    let echo = Origin::echo();
    let pa = free_port();
    let body = redirect("tcp") + &format!("tlspr -i127.0.0.1 -p{pa} -P{}\n", echo.port());
    let (_p, log) = start(Dir::new("rl_tlspr_tcp"), FMT, &body, &[pa]);
    let mut s = connect(localhost(pa));
    echo_roundtrip(&mut s, &client_hello("localhost"));
    echo_roundtrip(&mut s, b"more");
    let cport = s.local_addr().unwrap().port();
    drop(s);
    // tcppm's record: the destination as named.
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("TLSPR 00000 1 {cport} localhost")
    );
}

#[test]
fn socks_to_admin_serves_the_start_page_only() {
    let (_p, pa, log) = SOCKS.start("rl_admin", &redirect("admin"), "");
    let get = |path: &str| {
        let mut s = socks5_to(pa, 80);
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .unwrap();
        let got = String::from_utf8(read_until_closed(&mut s).unwrap()).unwrap();
        (got, s.local_addr().unwrap().port())
    };
    let (page, cport) = get("/");
    assert!(page.starts_with("HTTP/1.0 200 OK\r\n"), "{page}");
    assert!(page.contains("Web admin"), "{page}");
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00000 1 {cport} /")
    );
    // A redirected client gets what `-s` allows: no cfg file.
    let (page, cport) = get("/F");
    assert!(page.starts_with("HTTP/1.0 404"), "{page}");
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00702 1 {cport} /F")
    );
}

#[test]
fn proxy_connect_to_pop3_and_a_plain_request_refused() {
    let (origin, rx) = pop3_server();
    let pa = free_port();
    let body = format!(
        "allow * * * * HTTP_CONNECT\nparent 1000 pop3 0.0.0.0 0\nallow * * * * HTTP_GET\nparent 1000 pop3 0.0.0.0 0\nallow *\nproxy -i127.0.0.1 -p{pa}\n"
    );
    let (_p, log) = start(Dir::new("rl_proxy_pop3"), FMT, &body, &[pa]);
    let mut c = LineClient::on(connect(localhost(pa)));
    c.send(&format!(
        "CONNECT 127.0.0.1:{0} HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\n",
        origin.port()
    ));
    assert_eq!(c.line(), "HTTP/1.0 200 Connection established\r\n");
    assert_eq!(c.line(), "\r\n");
    assert_eq!(c.line(), "+OK Proxy\r\n");
    assert_eq!(c.cmd("USER bob"), "+OK user\r\n");
    assert_eq!(next(&rx), "USER bob\r\n");
    let cport = c.port();
    drop(c);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("PROXY 00000 1 {cport} bob@127.0.0.1:{}", origin.port())
    );
    // Only a tunnel can be handed over: a GET is refused with 501.
    let mut s = connect(localhost(pa));
    s.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        .unwrap();
    let got = String::from_utf8_lossy(&read_until_closed(&mut s).unwrap()).into_owned();
    assert!(
        got.starts_with("HTTP/1.1 501") || got.starts_with("HTTP/1.0 501"),
        "{got}"
    );
    let cport = s.local_addr().unwrap().port();
    let rec = record_of(&log, FMT, cport);
    assert!(rec.starts_with("PROXY 00999 "), "{rec}");
}

#[test]
fn dns_is_refused_as_a_tcp_local_redirection() {
    let echo = Origin::echo();
    let pa = free_port();
    let body = format!("allow *\nparent 1000 dns 0.0.0.0 0\n{}", socks_on(pa));
    let (p, log) = start(Dir::new("rl_dns"), FMT, &body, &[pa]);
    let mut s = socks5_hello(pa, None);
    let cport = s.local_addr().unwrap().port();
    s.write_all(&socks5_request(1, localhost(echo.port())))
        .unwrap();
    let reply = read_socks5_reply(&mut s).unwrap();
    // 999: "general failure" to the SOCKS client.
    assert_eq!(reply[1], 1);
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("SOCK5 00999 0 {cport} CONNECT 127.0.0.1:{}", echo.port())
    );
    assert!(
        wait_for(|| p.stderr().contains("UDP only"), Duration::from_secs(5)),
        "{}",
        p.stderr()
    );
    assert!(echo.peers().is_empty());
}

#[test]
fn a_redirection_to_the_same_handler_does_not_loop() {
    // tcppm's own pass skips the entry that sent the client there: with
    // nothing else allowed, the client is refused (3), not sent round.
    let echo = Origin::echo();
    let pa = free_port();
    let body = format!(
        "allow *\nparent 1000 tcp 0.0.0.0 0\ntcppm -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        echo.port()
    );
    let (_p, log) = start(Dir::new("rl_loop"), FMT, &body, &[pa]);
    let mut s = connect(localhost(pa));
    assert_eq!(read_until_closed(&mut s).unwrap(), b"");
    let cport = s.local_addr().unwrap().port();
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("TCPPM 00003 1 {cport} 127.0.0.1")
    );
    assert!(echo.peers().is_empty());
}

#[test]
fn a_redirection_that_comes_round_again_is_stopped() {
    // An `extip` first: the entry is not skipped on the second pass, so
    // every pass redirects again. The hand-offs stop at 15 with 101.
    let echo = Origin::echo();
    let pa = free_port();
    let body = format!(
        "allow *\nparent 1000 extip 127.0.0.1 0\nparent 1000 tcp 0.0.0.0 0\ntcppm -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        echo.port()
    );
    let (mut p, log) = start(Dir::new("rl_loop_guard"), FMT, &body, &[pa]);
    let mut s = connect(localhost(pa));
    assert_eq!(read_until_closed(&mut s).unwrap(), b"");
    let cport = s.local_addr().unwrap().port();
    assert_eq!(
        record_of(&log, FMT, cport),
        format!("TCPPM 00101 16 {cport} local redirection loop")
    );
    assert!(echo.peers().is_empty());
    assert!(p.is_running());
}
