//! `ssl_cli` with `ssl_client_mode` 0-2 (issue #13): TLS from the proxy
//! to the destination itself while the client speaks in clear, for the
//! HTTP proxy (plain http:// requests and CONNECT), SOCKS and the mail
//! proxies. Origins are real TLS servers: `openssl s_server -www` (its
//! page lists the TLS session it served, so it only comes back over TLS),
//! a keep-alive HTTPS server in Python's standard library (it names the
//! connection and the SNI of each request), Dovecot's POP3S; raw
//! listeners show the first byte on the wire. Certificates are the
//! throwaway CA of `tls::Pki`; verification is on wherever it can be.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::tls::Pki;
use crate::util::*;

const FMT: &str = "L%N %E %C %T";

/// What `openssl s_server -www` writes only into a page it served over
/// TLS (the ciphers of the session's library).
const S_SERVER_PAGE: &str = "Ciphers supported in s_server binary";

/// A child process killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `openssl s_server -www` with `pki`'s server certificate on a free port
/// of 127.0.0.1, once it accepts connections.
fn s_server(pki: &Pki) -> (Server, u16) {
    let port = free_port();
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-cert", p(&pki.cert), "-key", p(&pki.key)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server (tests/deps.sh installs openssl)");
    let s = Server(child);
    assert!(
        wait_for(
            || std::net::TcpStream::connect(localhost(port)).is_ok(),
            START_TIMEOUT
        ),
        "s_server did not listen on {port}"
    );
    (s, port)
}

/// curl with `args`: (HTTP status, body, stderr).
fn curl(args: &[&str]) -> (String, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        code.to_string(),
        body.to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The cfg lines that verify origins against `pki`'s CA.
fn verify(pki: &Pki) -> String {
    format!("ssl_client_verify\nssl_client_ca_file {}\n", p(&pki.ca))
}

#[test]
fn a_plain_http_request_is_fetched_from_its_origin_over_tls() {
    let dir = Dir::new("sslcli_get");
    let pki = Pki::new(&dir);
    let (_origin, oport) = s_server(&pki);
    let port = free_port();
    let cfg = format!(
        "{}ssl_cli\nallow *\nproxy -p{port} -i127.0.0.1\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let (code, body, err) = curl(&[
        "-x",
        &format!("http://127.0.0.1:{port}"),
        &format!("http://localhost:{oport}/"),
    ]);
    assert_eq!(code, "200", "{err}");
    assert!(body.contains(S_SERVER_PAGE), "{body}");
    // The session s_server describes was TLS 1.3 or 1.2, never clear.
    assert!(
        body.contains("TLSv1.3") || body.contains("TLSv1.2"),
        "{body}"
    );
    read_log_line(&log_of(&proxy), "the request's record", |l| {
        l.starts_with("PROXY 00000 127.0.0.1 GET http://localhost:")
    });
}

#[test]
fn the_origin_hop_begins_with_a_client_hello_in_modes_0_and_1_not_2() {
    for (mode, tls) in [("0", true), ("1", true), ("2", false)] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let oport = listener.local_addr().unwrap().port();
        let dir = Dir::new(&format!("sslcli_wire{mode}"));
        let port = free_port();
        let cfg = format!("ssl_client_mode {mode}\nssl_cli\nallow *\nproxy -p{port} -i127.0.0.1\n");
        let _proxy = start(dir, FMT, &cfg, &[port]).0;
        let mut c = connect(localhost(port));
        c.write_all(
            format!("GET http://127.0.0.1:{oport}/ HTTP/1.1\r\nHost: 127.0.0.1:{oport}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut peer =
            accept_within(&listener, Duration::from_secs(10)).expect("the origin dialled");
        set_timeouts(&peer, Duration::from_secs(10));
        let mut first = [0u8; 3];
        peer.read_exact(&mut first).unwrap();
        if tls {
            assert_eq!(
                first,
                [0x16, 0x03, 0x01],
                "mode {mode}: a TLS handshake record"
            );
        } else {
            // Mode 2 is TLS before a tunnel's data only, as in 3proxy.
            assert_eq!(&first, b"GET", "mode {mode}: the request in clear");
        }
    }
}

#[test]
fn an_untrusted_origin_is_refused_with_8011_and_502() {
    let dir = Dir::new("sslcli_untrusted");
    let pki = Pki::new(&dir);
    let (_origin, oport) = s_server(&pki);
    let port = free_port();
    // Verification with the built-in roots only: the test CA is not one.
    let cfg = format!("ssl_client_verify\nssl_cli\nallow *\nproxy -p{port} -i127.0.0.1\n");
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let proxy_url = format!("http://127.0.0.1:{port}");
    let url = format!("http://localhost:{oport}/");
    let (code, body, _) = curl(&["-x", &proxy_url, &url]);
    assert_eq!(code, "502");
    assert!(!body.contains(S_SERVER_PAGE));
    read_log_line(&log_of(&proxy), "GET with 08011", |l| {
        l.starts_with("PROXY 08011 127.0.0.1 GET ") && l.contains("certificate")
    });
    // A tunnel in mode 0: refused before the 200.
    let (_, _, err) = curl(&["-p", "-x", &proxy_url, &url]);
    assert!(err.contains("CONNECT tunnel failed, response 502"), "{err}");
    read_log_line(&log_of(&proxy), "CONNECT with 08011", |l| {
        l.starts_with("PROXY 08011 127.0.0.1 CONNECT ")
    });
}

#[test]
fn connect_and_socks_tunnels_speak_tls_to_the_target_in_modes_0_and_2() {
    for mode in ["0", "2"] {
        let dir = Dir::new(&format!("sslcli_tunnels{mode}"));
        let pki = Pki::new(&dir);
        let (_origin, oport) = s_server(&pki);
        let (hport, sport) = (free_port(), free_port());
        let cfg = format!(
            "{}ssl_client_mode {mode}\nssl_cli\nallow *\n\
             proxy -p{hport} -i127.0.0.1\nsocks -p{sport} -i127.0.0.1\n",
            verify(&pki)
        );
        let proxy = start(dir, FMT, &cfg, &[hport, sport]).0;
        let url = format!("http://localhost:{oport}/");
        // CONNECT: curl speaks plain HTTP inside the tunnel.
        let (code, body, err) = curl(&["-p", "-x", &format!("http://127.0.0.1:{hport}"), &url]);
        assert_eq!(code, "200", "mode {mode}: {err}");
        assert!(body.contains(S_SERVER_PAGE), "mode {mode}: {body}");
        // SOCKS5 with the name, then SOCKS4 with the address.
        let (code, body, err) = curl(&["-x", &format!("socks5h://127.0.0.1:{sport}"), &url]);
        assert_eq!(code, "200", "mode {mode}: {err}");
        assert!(body.contains(S_SERVER_PAGE), "mode {mode}: {body}");
        let (code, body, err) = curl(&[
            "-x",
            &format!("socks4://127.0.0.1:{sport}"),
            &format!("http://127.0.0.1:{oport}/"),
        ]);
        assert_eq!(code, "200", "mode {mode}: {err}");
        assert!(body.contains(S_SERVER_PAGE), "mode {mode}: {body}");
        let log = log_of(&proxy);
        read_log_line(&log, "CONNECT's record", |l| {
            l.starts_with("PROXY 00000 127.0.0.1 CONNECT localhost:")
        });
        read_log_line(&log, "SOCKS5's record", |l| {
            l.starts_with("SOCK5 00000 127.0.0.1 CONNECT localhost:")
        });
        read_log_line(&log, "SOCKS4's record", |l| {
            l.starts_with("SOCK4 00000 127.0.0.1 CONNECT 127.0.0.1:")
        });
    }
}

#[test]
fn in_mode_2_a_failed_handshake_closes_the_open_tunnel_with_8011() {
    let dir = Dir::new("sslcli_mode2_fail");
    let pki = Pki::new(&dir);
    let (_origin, oport) = s_server(&pki);
    let port = free_port();
    let cfg = format!(
        "ssl_client_verify\nssl_client_mode 2\nssl_cli\nallow *\nsocks -p{port} -i127.0.0.1\n"
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    // SOCKS5, no auth, CONNECT localhost:oport: granted, then closed.
    let request = socks5_request_name(1, b"localhost", oport);
    let mut c = socks5_open(port, None, &request).expect("granted before the handshake (mode 2)");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert_eq!(rest, b"", "then closed");
    read_log_line(&log_of(&proxy), "with 08011", |l| {
        l.starts_with("SOCK5 08011 127.0.0.1 CONNECT localhost:")
    });
}

/// A keep-alive HTTPS origin (Python's http.server over its ssl module,
/// `pki`'s certificate): each answer names the connection it came on
/// (the proxy's port) and the SNI that connection asked for.
fn named_origin(dir: &Dir, pki: &Pki) -> (Server, u16) {
    let script = dir.write(
        "origin.py",
        r#"import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        sni = getattr(self.connection, "sni", None)
        body = ("conn=%d sni=%s\n" % (self.client_address[1], sni)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
def note(sock, name, c):
    sock.sni = name
ctx.sni_callback = note
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#,
    );
    let mut child = Command::new("/usr/bin/python3")
        .arg(script)
        .args([p(&pki.cert), p(&pki.key)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 (tests/deps.sh installs it)");
    let mut out = child.stdout.take().unwrap();
    let s = Server(child);
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let port = String::from_utf8_lossy(&line)
        .trim()
        .parse()
        .expect("the origin's port");
    (s, port)
}

#[test]
fn the_pool_reuses_a_tls_origin_connection_only_for_the_same_name() {
    let dir = Dir::new("sslcli_pool");
    let pki = Pki::new(&dir);
    let (_origin, oport) = named_origin(&dir, &pki);
    let port = free_port();
    let cfg = format!(
        "{}ssl_cli\nallow *\nproxy -p{port} -i127.0.0.1\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    // One client, keep-alive: localhost, then the same address by IP (no
    // SNI: another TLS destination), then localhost again.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-x"])
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(format!("http://localhost:{oport}/a"))
        .arg(format!("http://127.0.0.1:{oport}/b"))
        .arg(format!("http://localhost:{oport}/c"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conn = |l: &str| l.split(' ').next().unwrap().to_string();
    assert!(lines[0].ends_with(" sni=localhost"), "{text}");
    assert!(lines[1].ends_with(" sni=None"), "{text}");
    assert!(lines[2].ends_with(" sni=localhost"), "{text}");
    assert_ne!(
        conn(lines[0]),
        conn(lines[1]),
        "another name, another connection: {text}"
    );
    assert_eq!(
        conn(lines[0]),
        conn(lines[2]),
        "the parked one is taken again: {text}"
    );
    let log = log_of(&proxy);
    for path in ["a", "b", "c"] {
        read_log_line(&log, "each request's record", |l| {
            l.starts_with("PROXY 00000 ") && l.contains(&format!("/{path} HTTP/1.1"))
        });
    }
}

#[test]
fn services_where_ssl_cli_makes_no_sense_are_refused_by_name() {
    let dir = Dir::new("sslcli_refused");
    let cfg_path = dir.cfg_path();
    let port = free_port();
    for (svc, mode, why) in [
        ("ftppr", "2", "use ssl_client_mode 0 or 1"),
        ("pop3p", "2", "use ssl_client_mode 0 or 1"),
        ("smtpp", "2", "use ssl_client_mode 0 or 1"),
    ] {
        let cfg = format!("ssl_client_mode {mode}\nssl_cli\n{svc} -p{port} -i127.0.0.1\n");
        let msg = run_cfg(&dir, &[], &cfg).assert_cfg_error(&cfg_path, 3, svc);
        assert!(msg.contains(why), "{msg}");
    }
}

#[test]
fn tlspr_puts_the_clients_tls_inside_its_own_to_the_server() {
    // client --TLS(inner)--> tlspr --TLS(outer, ours)--> tcppm ssl_serv,
    // which takes the outer session off --inner--> openssl s_server. The
    // page comes back only if the inner session went through whole, and
    // the log of the terminating tcppm shows the outer one arrived.
    let dir = Dir::new("sslcli_tlspr");
    let pki = Pki::new(&dir);
    let (_origin, oport) = s_server(&pki);
    let (outer, tlspr) = (free_port(), free_port());
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"{FMT}\"\nnsrecord localhost 127.0.0.1\n\
         ssl_server_cert {}\nssl_server_key {}\nssl_serv\n\
         tcppm -i127.0.0.1 {outer} 127.0.0.1 {oport}\nssl_noserv\n\
         {}ssl_cli\ntlspr -i127.0.0.1 -p{tlspr} -P{outer}\n",
        p(&log),
        p(&pki.cert),
        p(&pki.key),
        verify(&pki)
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(outer)), Listen::Tcp(localhost(tlspr))],
    );
    let (code, body, err) = curl(&[
        "--cacert",
        p(&pki.ca),
        "--resolve",
        &format!("localhost:{tlspr}:127.0.0.1"),
        &format!("https://localhost:{tlspr}/"),
    ]);
    assert_eq!(code, "200", "{err}");
    assert!(body.contains(S_SERVER_PAGE), "{body}");
    // (The harness's readiness probes leave records of their own: 100
    // for tlspr, 8013 for the TLS service; the client's are the 0s.)
    let session = |svc: &'static str| {
        move |l: &str| l.starts_with(svc) && l.contains(" 00000 ") && !l.contains("Accepting")
    };
    let tcppm = read_log_line(&log, "the terminating tcppm", session("TCPPM "));
    assert!(tcppm.starts_with("TCPPM 00000 127.0.0.1"), "{tcppm}");
    let rec = read_log_line(&log, "tlspr", session("TLSPR "));
    assert_eq!(rec, "TLSPR 00000 127.0.0.1 TLSv1.3 localhost h2");
}

#[test]
fn pop3p_logs_in_to_a_pop3s_server_for_a_client_in_clear() {
    use std::io::BufRead;
    let dir = Dir::new("sslcli_pop3s");
    let pki = Pki::new(&dir);
    let dovecot = crate::starttls::Dovecot::start(&dir, &pki);
    let port = free_port();
    // -x: no STARTTLS offered to the client; the server hop is TLS anyway.
    let cfg = format!(
        "{}ssl_cli\nallow *\npop3p -p{port} -i127.0.0.1 -x\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut line = || {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };
    assert!(line().starts_with("+OK"), "the proxy's greeting");
    (&s).write_all(format!("USER bob@localhost:{}\r\n", dovecot.pop3s).as_bytes())
        .unwrap();
    assert!(line().starts_with("+OK"), "USER taken by the server");
    (&s).write_all(b"PASS secret\r\n").unwrap();
    let l = line();
    assert!(l.starts_with("+OK Logged in"), "{l}");
    (&s).write_all(b"QUIT\r\n").unwrap();
    assert!(line().starts_with("+OK"));
    // Dovecot says the login came over TLS.
    let dlog = proxy.dir.join("dovecot/dovecot.log");
    read_log_line(&dlog, "bob's login over TLS", |l| {
        l.contains("pop3-login: Info: Login: user=<bob>") && l.contains(", TLS,")
    });
    read_log_line(&log_of(&proxy), "pop3p's record", |l| {
        l.starts_with("POP3P 00000 127.0.0.1 ")
    });
}

#[test]
fn through_an_http_parent_connect_is_tls_inside_its_tunnel_and_a_plain_request_is_8011() {
    let dir = Dir::new("sslcli_http_parent");
    let pki = Pki::new(&dir);
    let (_origin, oport) = s_server(&pki);
    let (back, port) = (free_port(), free_port());
    // The parent: a plain proxy of ours, without ssl_cli.
    let cfg = format!(
        "allow *\nproxy -p{back} -i127.0.0.1\n{}ssl_cli\n\
         flush\nallow *\nparent 1000 http 127.0.0.1 {back}\nproxy -p{port} -i127.0.0.1\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[back, port]).0;
    let proxy_url = format!("http://127.0.0.1:{port}");
    let url = format!("http://localhost:{oport}/");
    let (code, body, err) = curl(&["-p", "-x", &proxy_url, &url]);
    assert_eq!(code, "200", "{err}");
    assert!(body.contains(S_SERVER_PAGE), "{body}");
    let (code, body, _) = curl(&["-x", &proxy_url, &url]);
    assert_eq!(code, "502");
    assert!(!body.contains(S_SERVER_PAGE));
    let log = log_of(&proxy);
    read_log_line(&log, "the refusal", |l| {
        l.starts_with("PROXY 08011 127.0.0.1 GET ") && l.contains("an http proxy")
    });
}

#[test]
fn imapp_logs_in_to_an_imaps_server_for_a_client_in_clear() {
    use std::io::BufRead;
    let dir = Dir::new("sslcli_imaps");
    let pki = Pki::new(&dir);
    let dovecot = crate::starttls::Dovecot::start(&dir, &pki);
    let port = free_port();
    let cfg = format!(
        "{}ssl_cli\nallow *\nimapp -p{port} -i127.0.0.1 -x\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut line = || {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };
    assert!(line().starts_with("* OK"), "the proxy's greeting");
    (&s).write_all(format!("a1 LOGIN bob@localhost:{} secret\r\n", dovecot.imaps).as_bytes())
        .unwrap();
    // Dovecot's answer, perhaps after untagged lines.
    let ok = (0..10).map(|_| line()).find(|l| l.starts_with("a1 "));
    assert!(
        ok.as_deref().is_some_and(|l| l.starts_with("a1 OK")),
        "{ok:?}"
    );
    (&s).write_all(b"a2 LOGOUT\r\n").unwrap();
    let dlog = proxy.dir.join("dovecot/dovecot.log");
    read_log_line(&dlog, "bob's login over TLS", |l| {
        l.contains("imap-login: Info: Login: user=<bob>") && l.contains(", TLS,")
    });
    read_log_line(&log_of(&proxy), "imapp's record", |l| {
        l.starts_with("IMAPP 00000 127.0.0.1 ")
    });
}

#[test]
fn smtpp_sends_mail_through_an_smtps_server_for_a_client_in_clear() {
    use std::io::BufRead;
    let dir = Dir::new("sslcli_smtps");
    let pki = Pki::new(&dir);
    // aiosmtpd with implicit TLS (SMTPS) only: a clear client gets nothing.
    let sport = free_port();
    let child = Command::new("/usr/bin/python3")
        .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{sport}")])
        .args(["--smtpscert", p(&pki.cert), "--smtpskey", p(&pki.key)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m aiosmtpd (tests/deps.sh installs python3-aiosmtpd)");
    let _smtpd = Server(child);
    assert!(wait_for(
        || std::net::TcpStream::connect(localhost(sport)).is_ok(),
        START_TIMEOUT
    ));
    let port = free_port();
    // -h: a client that sends mail without AUTH goes to that server.
    let cfg = format!(
        "{}ssl_cli\nallow *\nsmtpp -p{port} -i127.0.0.1 -x -hlocalhost:{sport}\n",
        verify(&pki)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut line = || {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };
    assert!(line().starts_with("220"), "the proxy's greeting");
    for (cmd, want) in [
        ("MAIL FROM:<a@example.org>", "250"),
        ("RCPT TO:<b@example.org>", "250"),
        ("DATA", "354"),
        ("Subject: over SMTPS\r\n\r\nhello\r\n.", "250"),
        ("QUIT", "221"),
    ] {
        (&s).write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
        let l = line();
        assert!(l.starts_with(want), "{cmd}: {l}");
    }
    read_log_line(&log_of(&proxy), "smtpp's record", |l| {
        l.starts_with("SMTPP 00000 127.0.0.1 ")
    });
}
