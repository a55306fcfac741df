//! `auto` (SOCKS, HTTP proxy and tlspr on one port) and `tlspr` (the TLS
//! SNI proxy): real curl and openssl clients through the proxy to origins
//! the tests start, ACL refusals, garbage and hellos without a name, and
//! the log records.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::socks::{curl, http_origin};
use crate::util::*;

/// Log format of these tests (`L`: local time stamps, not printed):
/// service, code, client port, text.
const FMT: &str = "L%N %E %c %T";

/// The services of these tests.
const AUTO: Service = Service::tcp("auto", FMT);
const TLSPR: Service = Service::tcp("tlspr", FMT);

// ---------------------------------------------------------------------------
// auto

#[test]
fn auto_serves_socks5_socks4_and_http_on_one_port() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = AUTO.start("auto_all", "", "");
    let url = format!("http://127.0.0.1:{}/x", origin.port());
    for scheme in ["socks5", "socks4", "http"] {
        let body = curl(&format!("{scheme}://127.0.0.1:{port}"), &url).unwrap();
        assert_eq!(body, "hello /x", "through {scheme}");
    }
    // CONNECT through the HTTP side.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-p", "-x"])
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(format!("http://127.0.0.1:{}/tunnel", origin.port()))
        .output()
        .expect("run curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello /tunnel");
    // Each is logged under the handler that served it.
    for (name, text) in [
        ("SOCK5", "CONNECT 127.0.0.1"),
        ("SOCK4", "CONNECT 127.0.0.1"),
        ("PROXY", "GET http://127.0.0.1"),
        ("PROXY", "CONNECT 127.0.0.1"),
    ] {
        read_log_line(&log, &format!("{name} {text}"), |l| {
            l.starts_with(&format!("{name} 00000 ")) && l.contains(text)
        });
    }
}

#[test]
fn auto_keeps_the_first_bytes_of_a_raw_socks5_request() {
    // Greeting, request and data in one write: nothing may be lost to
    // the protocol detection.
    let origin = Origin::echo();
    let (_proxy, port, _log) = AUTO.start("auto_raw", "", "");
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let mut msg = vec![5, 1, 0];
    msg.extend(socks5_request(1, localhost(origin.port())));
    msg.extend_from_slice(b"early");
    s.write_all(&msg).unwrap();
    let mut reply = [0u8; 12];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..4], &[5, 0, 5, 0], "method choice, then granted");
    let mut echoed = [0u8; 5];
    s.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"early");
}

#[test]
fn auto_closes_a_silent_client_with_801() {
    // CONNECTION_SHORT (the fifth timeout) is 1 second.
    let (_proxy, port, log) =
        AUTO.start("auto_silent", "timeouts 1 5 30 60 1 1800 15 60 15 5\n", "");
    let mut s = connect(localhost(port));
    let cport = s.local_addr().unwrap().port();
    set_timeouts(&s, Duration::from_secs(10));
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "closed without a byte");
    assert_eq!(record_of(&log, FMT, cport), format!("AUTO 00801 {cport} "));
}

#[test]
fn auto_hands_tls_to_tlspr() {
    let tls = TlsOrigin::start("auto_tls_origin");
    let (_proxy, port, log) = AUTO.start("auto_tls", "", &format!("-P{}", tls.port));
    let body = curl_https(port).unwrap();
    assert!(body.contains("s_server"), "{body}");
    read_log_line(&log, "TLSPR 00000", |l| {
        l.starts_with("TLSPR 00000 ") && l.contains(" localhost ")
    });
}

// ---------------------------------------------------------------------------
// tlspr

/// `openssl s_server -www` on 127.0.0.1 with a fresh self-signed cert
/// for CN=localhost: answers each HTTPS request with its status page.
struct TlsOrigin {
    child: Child,
    port: u16,
    _dir: Dir,
}

impl TlsOrigin {
    fn start(name: &str) -> TlsOrigin {
        let dir = Dir::new(name);
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes"])
            .args(["-subj", "/CN=localhost", "-days", "1", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (tests/deps.sh installs it)");
        assert!(made.success(), "openssl req");
        let port = free_port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run openssl s_server");
        let up = wait_for(
            || TcpStream::connect(localhost(port)).is_ok(),
            Duration::from_secs(10),
        );
        assert!(up, "openssl s_server did not start on {port}");
        TlsOrigin {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for TlsOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl https://localhost:PORT/ with "localhost" pointing at 127.0.0.1:
/// the name goes in the SNI; the body or curl's error.
fn curl_https(port: u16) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "-k", "--max-time", "10", "--resolve"])
        .arg(format!("localhost:{port}:127.0.0.1"))
        .arg(format!("https://localhost:{port}/"))
        .output()
        .expect("run curl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn tlspr_relays_a_handshake_to_the_sni_host() {
    let tls = TlsOrigin::start("tlspr_ok_origin");
    let (_proxy, port, log) = TLSPR.start("tlspr_ok", "", &format!("-P{} -c", tls.port));
    let body = curl_https(port).unwrap();
    assert!(body.contains("s_server"), "{body}");
    let rec = read_log_line(&log, "TLSPR 00000", |l| {
        l.starts_with("TLSPR 00000 ") && l.contains(" localhost ")
    });
    assert!(rec.contains(" TLSv1.3 localhost "), "{rec}");
}

#[test]
fn tlspr_check_level_2_accepts_a_server_hello() {
    let tls = TlsOrigin::start("tlspr_c2_origin");
    let (_proxy, port, log) = TLSPR.start("tlspr_c2", "", &format!("-P{} -c2", tls.port));
    let body = curl_https(port).unwrap();
    assert!(body.contains("s_server"), "{body}");
    read_log_line(&log, "TLSPR 00000", |l| {
        l.starts_with("TLSPR 00000 ") && l.contains(" TLSv1.3 localhost ")
    });
}

#[test]
fn tlspr_acl_denying_the_sni_host_refuses() {
    let tls = TlsOrigin::start("tlspr_acl_origin");
    let (_proxy, port, log) = TLSPR.start(
        "tlspr_acl",
        "deny * * localhost\nallow *\n",
        &format!("-P{}", tls.port),
    );
    assert!(curl_https(port).is_err(), "the handshake must fail");
    let rec = read_log_line(&log, "a refusal of localhost", |l| {
        l.starts_with("TLSPR ") && l.contains(" localhost ")
    });
    assert!(rec.starts_with("TLSPR 00001 "), "{rec}");
}

/// Send `bytes`, then expect the proxy to close; the session's record.
fn garbage(log: &Path, port: u16, bytes: &[u8]) -> String {
    let mut s = connect(localhost(port));
    let cport = s.local_addr().unwrap().port();
    set_timeouts(&s, Duration::from_secs(10));
    s.write_all(bytes).unwrap();
    assert!(read_until_closed(&mut s).unwrap().is_empty());
    record_of(log, FMT, cport)
}

#[test]
fn tlspr_closes_on_garbage() {
    let (_proxy, port, log) = TLSPR.start("tlspr_junk", "", "-c");
    // Not a TLS record: version byte is not 3.
    let rec = garbage(&log, port, b"GET / HTTP/1.0\r\n\r\n");
    assert!(rec.starts_with("TLSPR 00303 "), "{rec}");
    assert!(rec.ends_with(" NONEv0.0 - -"), "{rec}");
    // A handshake record too short to be a hello.
    let rec = garbage(&log, port, &[22, 3, 1, 0, 4, 1, 0, 0, 0]);
    assert!(rec.starts_with("TLSPR 00311 "), "{rec}");
    // A record longer than the buffer.
    let rec = garbage(&log, port, &[22, 3, 1, 0xff, 0xff]);
    assert!(rec.starts_with("TLSPR 00304 "), "{rec}");
}

#[test]
fn tlspr_without_check_has_nowhere_to_send_garbage() {
    let (_proxy, port, log) = TLSPR.start("tlspr_junk0", "", "");
    let rec = garbage(&log, port, b"GET / HTTP/1.0\r\n\r\n");
    assert!(rec.starts_with("TLSPR 00100 "), "{rec}");
}

#[test]
fn tlspr_hello_without_sni_is_closed_with_100() {
    let tls = TlsOrigin::start("tlspr_nosni_origin");
    let (_proxy, port, log) = TLSPR.start("tlspr_nosni", "", &format!("-P{} -c", tls.port));
    let out = Command::new("openssl")
        .args(["s_client", "-noservername", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    assert!(!out.status.success(), "the handshake must fail");
    let rec = read_log_line(&log, "a hello without a name", |l| {
        l.starts_with("TLSPR ") && l.contains(" TLSv")
    });
    assert!(rec.starts_with("TLSPR 00100 "), "{rec}");
    assert!(rec.contains(" TLSv1.3 - "), "{rec}");
}

#[test]
fn tlspr_options_out_of_range_are_refused_by_the_cfg() {
    let dir = Dir::new("tlspr_opts");
    for opt in ["-c5", "-Xftp", "-X"] {
        let out = run_check(&dir, &format!("tlspr -p1443 {opt}\n"));
        assert!(!out.status.success(), "{opt} accepted");
    }
    assert!(run_check(
        &dir,
        "tlspr -P443 -c2\ntlspr -p1444 -c4 -XIMAP\nauto -P8443\n"
    )
    .status
    .success());
}

#[test]
fn tlspr_goes_through_a_parent() {
    let tls = TlsOrigin::start("tlspr_parent_origin");
    let (sport, port) = (free_port(), free_port());
    let body = format!(
        "socks -i127.0.0.1 -p{sport}\n\
         allow *\nparent 1000 socks5 127.0.0.1 {sport}\ntlspr -i127.0.0.1 -p{port} -P{}\n",
        tls.port
    );
    let (_proxy, log) = start(Dir::new("tlspr_parent"), FMT, &body, &[sport, port]);
    let body = curl_https(port).unwrap();
    assert!(body.contains("s_server"), "{body}");
    // The parent carried the session to the SNI host's address.
    let to = format!("CONNECT 127.0.0.1:{}", tls.port);
    read_log_line(&log, &to, |l| {
        l.starts_with("SOCK5 00000 ") && l.contains(&to)
    });
    read_log_line(&log, "TLSPR 00000", |l| {
        l.starts_with("TLSPR 00000 ") && l.contains(" localhost ")
    });
}
