//! socks: SOCKS 4, 4a and 5 through curl and through raw sockets. CONNECT
//! to an HTTP origin in every version, method selection (`-u`, `-u2`),
//! every malformed request with the exact refusal and a closed
//! connection, UDP ASSOCIATE to a UDP echo, BIND with a second client
//! connecting in, IPv6 and name address types, `-N`, and the log record.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// An HTTP/1.1 origin: answers every request with `hello <path>` and
/// closes. Enough for curl.
pub fn http_origin(bind: &str) -> Origin {
    Origin::start(bind, |mut conn| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&head);
        let path = head.split(' ').nth(1).unwrap_or("?");
        let body = format!("hello {path}");
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.shutdown(Shutdown::Both);
    })
}

/// Runs curl through `proxy` (a curl proxy URL) to `url`; returns the body.
pub fn curl(proxy: &str, url: &str) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--proxy", proxy, url])
        .output()
        .expect("run curl (apt-get install curl)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "curl {proxy} {url}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The log format of these tests: service, code, user, text.
const FMT: &str = "L%N %E %U %T";

/// The service of these tests.
const SOCKS: Service = Service::tcp("socks", FMT);

// ---------------------------------------------------------------------------
// CONNECT with curl

#[test]
fn curl_socks5_connect() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s5_curl", "", "");
    let body = curl(
        &format!("socks5://127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/five", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /five");
    expect_log_line(
        &log,
        &format!("SOCK5 00000 - CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn curl_socks5h_sends_the_name() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s5h_curl", "", "");
    let body = curl(
        &format!("socks5h://127.0.0.1:{port}"),
        &format!("http://localhost:{}/name", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /name");
    expect_log_line(
        &log,
        &format!("SOCK5 00000 - CONNECT localhost:{}", origin.port()),
    );
}

#[test]
fn curl_socks4_connect() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s4_curl", "", "");
    let body = curl(
        &format!("socks4://127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/four", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /four");
    expect_log_line(
        &log,
        &format!("SOCK4 00000 - CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn curl_socks4a_sends_the_name_and_logs_soc45() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s4a_curl", "", "");
    let body = curl(
        &format!("socks4a://127.0.0.1:{port}"),
        &format!("http://localhost:{}/fourA", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /fourA");
    expect_log_line(
        &log,
        &format!("SOC45 00000 - CONNECT localhost:{}", origin.port()),
    );
}

#[test]
fn curl_socks4_user_id_is_the_user_name() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s4_user", "", "");
    let body = curl(
        &format!("socks4://alice@127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/u", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /u");
    expect_log_line(
        &log,
        &format!("SOCK4 00000 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn curl_socks5_with_password_under_u2() {
    // -u2 demands username/password; without `auth strong` the name is
    // taken as given (and logged), the password is not checked.
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s5_u2", "", "-u2");
    let body = curl(
        &format!("socks5://bob:secret@127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/pw", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /pw");
    expect_log_line(
        &log,
        &format!("SOCK5 00000 bob CONNECT 127.0.0.1:{}", origin.port()),
    );
    // Without credentials curl offers only "no authentication": refused.
    let err = curl(
        &format!("socks5://127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/pw", origin.port()),
    )
    .unwrap_err();
    assert!(err.contains("(97)") || err.contains("auth"), "{err}");
    read_log_line(&log, "with code 4", |l| l.starts_with("SOCK5 00004"));
}

const STRONG: &str = "users alice:CL:wonderland\nauth strong\n";

#[test]
fn curl_socks5_strong_auth_accepts_the_right_password() {
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) = SOCKS.start("s5_strong_ok", STRONG, "");
    let body = curl(
        &format!("socks5://alice:wonderland@127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/in", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /in");
    expect_log_line(
        &log,
        &format!("SOCK5 00000 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
}

/// Greets with "username/password" only and sends `user`/`pass`; the
/// status is the test's to read.
fn v5_login(port: u16, user: &str, pass: &str) -> TcpStream {
    let mut s = connect(localhost(port));
    s.write_all(&[5, 1, 2]).unwrap();
    expect_bytes(&mut s, &[5, 2]);
    s.write_all(&socks5_credentials(user, pass)).unwrap();
    s
}

/// Logs in, CONNECTs to the echo `origin` and sees `ping` come back.
fn v5_login_and_echo(port: u16, user: &str, pass: &str, origin: &Origin) {
    let mut s = v5_login(port, user, pass);
    expect_bytes(&mut s, &[1, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..4], [5, 0, 0, 1], "granted: {r:?}");
    s.write_all(b"ping").unwrap();
    expect_bytes(&mut s, b"ping");
}

#[test]
fn socks5_strong_auth_refuses_a_wrong_password_in_the_subnegotiation() {
    // `auth strong` decides on the password alone: RFC 1929's failure
    // status, then the close, before any request; the record has the code
    // the request would have had (6 wrong password, 5 unknown user).
    let origin = Origin::echo();
    let (_proxy, port, log) = SOCKS.start("s5_strong_bad", STRONG, "");
    let mut s = v5_login(port, "alice", "bad");
    assert_closed_after(&mut s, &[1, 1]);
    expect_log_line(&log, "SOCK5 00006 alice ");
    let mut s = v5_login(port, "mallory", "wonderland");
    assert_closed_after(&mut s, &[1, 1]);
    expect_log_line(&log, "SOCK5 00005 mallory ");
    assert_eq!(origin.peers(), vec![], "the origin was never reached");
    // The right password: success, and the request goes on as before.
    v5_login_and_echo(port, "alice", "wonderland", &origin);
    assert_eq!(origin.peers().len(), 1);
    // No credentials at all: 4, "not allowed", at the request.
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log, "with code 4", |l| l.starts_with("SOCK5 00004 -"));
}

#[test]
fn socks5_strong_auth_a_refused_user_with_the_right_password_gets_rep_2() {
    // The ACL is checked with the request, as before: the sub-negotiation
    // says success for the right password even though the ACL denies.
    let origin = Origin::echo();
    let pre = format!("{STRONG}deny alice\nallow *\n");
    let (_proxy, port, log) = SOCKS.start("s5_strong_deny", &pre, "");
    let mut s = v5_login(port, "alice", "wonderland");
    expect_bytes(&mut s, &[1, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    expect_log_line(
        &log,
        &format!("SOCK5 00001 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn socks5_iponly_strong_checks_a_wrong_password_with_the_request() {
    // `auth iponly strong`: the ACL may let the client in by its address
    // whatever its password, so the sub-negotiation always says success.
    let origin = Origin::echo();
    let pre = "users alice:CL:wonderland\nauth iponly strong\nallow * 127.0.0.1\n";
    let (_proxy, port, log) = SOCKS.start("s5_iponly_strong", pre, "");
    v5_login_and_echo(port, "alice", "bad", &origin);
    expect_log_line(
        &log,
        &format!("SOCK5 00000 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
    // From an address the ACL does not name, the password decides, at the
    // request: REP 2 and code 6, as before.
    let pre = "users alice:CL:wonderland\nauth iponly strong\nallow * 10.0.0.0/8\nallow alice\n";
    let (_proxy2, port2, log2) = SOCKS.start("s5_iponly_strong2", pre, "");
    let mut s = v5_login(port2, "alice", "bad");
    expect_bytes(&mut s, &[1, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    expect_log_line(
        &log2,
        &format!("SOCK5 00006 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
    v5_login_and_echo(port2, "alice", "wonderland", &origin);
    assert_eq!(origin.peers().len(), 2);
}

#[test]
fn socks5_cache_strong_refuses_early_only_on_a_cache_miss() {
    // `auth cache strong`, `authcache ip`: before alice has logged in from
    // this address a wrong password is refused in the sub-negotiation;
    // after, the address stands for her and any password goes on to the
    // request, as before.
    let origin = Origin::echo();
    let pre = "users alice:CL:wonderland\nauthcache ip 60\nauth cache strong\n";
    let (_proxy, port, log) = SOCKS.start("s5_cache_strong", pre, "");
    let mut s = v5_login(port, "alice", "bad");
    assert_closed_after(&mut s, &[1, 1]);
    expect_log_line(&log, "SOCK5 00006 alice ");
    assert_eq!(origin.peers(), vec![]);
    v5_login_and_echo(port, "alice", "wonderland", &origin);
    v5_login_and_echo(port, "alice", "bad", &origin);
    assert_eq!(origin.peers().len(), 2);
    // Keyed on the destination port, the cache cannot be asked before the
    // request: the wrong password is refused there (REP 2, code 6).
    let pre = "users alice:CL:wonderland\nauthcache ip,dstport 60\nauth cache strong\n";
    let (_proxy2, port2, log2) = SOCKS.start("s5_cache_dstport", pre, "");
    let mut s = v5_login(port2, "alice", "bad");
    expect_bytes(&mut s, &[1, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    expect_log_line(
        &log2,
        &format!("SOCK5 00006 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn socks5_without_strong_never_refuses_in_the_subnegotiation() {
    // `-u2` with the default `auth iponly`, or `auth none`, with a `users`
    // table: the password is not checked, the answer is success.
    let origin = Origin::echo();
    for (name, auth) in [
        ("s5_u2_iponly", "auth iponly\n"),
        ("s5_u2_none", "auth none\n"),
    ] {
        let pre = format!("users alice:CL:wonderland\n{auth}");
        let (_proxy, port, _log) = SOCKS.start(name, &pre, "-u2");
        v5_login_and_echo(port, "alice", "bad", &origin);
    }
    // `auth strong` with no `users` at all: refused with the request, as
    // before (code 5).
    let (_proxy, port, log) = SOCKS.start("s5_strong_nousers", "auth strong\n", "");
    let mut s = v5_login(port, "alice", "bad");
    expect_bytes(&mut s, &[1, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    expect_log_line(
        &log,
        &format!("SOCK5 00005 alice CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn curl_socks4_and_5_through_an_acl() {
    // `deny` gives "not allowed" (REP 2, CD 91).
    let origin = http_origin("127.0.0.1:0");
    let pre = format!("deny * * 127.0.0.1 {}\nallow *\n", origin.port());
    let (_proxy, port, _log) = SOCKS.start("s_acl", &pre, "");
    let url = format!("http://127.0.0.1:{}/", origin.port());
    assert!(curl(&format!("socks5://127.0.0.1:{port}"), &url).is_err());
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    assert_closed_after(&mut s, &[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn host_pattern_sees_an_address_as_its_text() {
    // 3proxy's socks.c makes the host text of an address request its
    // printed form: `*calhost` does not select 127.0.0.1, and `%n` logs
    // it without brackets.
    let origin = http_origin("127.0.0.1:0");
    let (_proxy, port, log) =
        Service::tcp("socks", "L%E %n").start("s_hostpat", "deny * * *calhost\nallow *", "");
    let by_name = curl(
        &format!("socks5h://127.0.0.1:{port}"),
        &format!("http://localhost:{}/n", origin.port()),
    );
    assert!(by_name.is_err(), "localhost matches *calhost: {by_name:?}");
    let body = curl(
        &format!("socks5://127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{}/a", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /a");
    expect_log_line(&log, "00000 127.0.0.1");
}

// ---------------------------------------------------------------------------
// Raw sockets: the exact bytes

/// Everything until the proxy closes must be exactly `want`.
fn assert_closed_after(s: &mut TcpStream, want: &[u8]) {
    let got = read_until_closed(s).expect("the proxy should close the connection");
    assert_eq!(got, want, "bytes before the close");
}

const V5_FAIL_1: [u8; 10] = [5, 1, 0, 1, 0, 0, 0, 0, 0, 0];
const V4_REFUSED: [u8; 8] = [0, 91, 0, 0, 0, 0, 0, 0];

#[test]
fn quick_acks_stay_on_for_both_sockets() {
    // The proxy leaves both of a session's sockets (the client's and the
    // origin's) with the kernel's quick ACKs: held-back ACKs made a peer
    // that writes in two pieces under Nagle wait 40 ms for each (see
    // http::a_request_and_an_answer_written_in_two_parts_are_not_delayed).
    // Each is checked before data has moved on it: after an exchange the
    // kernel may delay ACKs by itself.
    let origin = Origin::echo();
    let (proxy, port, _log) = SOCKS.start("quickack", "", "");
    let mut s = connect(localhost(port));
    let me = s.local_addr().unwrap().port();
    assert!(
        wait_for(
            || proxy.try_tcp_socket(port, me).is_some(),
            Duration::from_secs(5)
        ),
        "the proxy did not accept the client"
    );
    assert!(
        socket2::SockRef::from(&proxy.tcp_socket(port, me))
            .quickack()
            .unwrap(),
        "quick ACKs off for the client's socket"
    );
    s.write_all(&[5, 1, 0]).unwrap();
    expect_bytes(&mut s, &[5, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[..2], [5, 0], "CONNECT reply {reply:?}");
    // The origin's accept thread records the peer a moment after the
    // proxy's connect returned.
    let mut srv = None;
    wait_for(
        || {
            srv = origin
                .peers()
                .iter()
                .find_map(|p| proxy.try_tcp_socket(p.port(), origin.port()));
            srv.is_some()
        },
        Duration::from_secs(5),
    );
    let srv = srv.expect("the proxy's connection to the origin");
    assert!(
        socket2::SockRef::from(&srv).quickack().unwrap(),
        "quick ACKs off for the origin's socket"
    );
    echo_roundtrip(&mut s, b"and the session relays");
}

#[test]
fn an_origin_that_speaks_first_greets_at_once() {
    // SMTP, SSH, FTP servers talk first: the proxy must not hold the
    // handshake's last ACK back for data of its own (the server would not
    // see the connection for up to 200 ms, the delayed-ACK limit).
    let origin = Origin::start("127.0.0.1:0", |mut s| {
        let _ = s.write_all(b"220 ready\r\n");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    let (_proxy, port, _log) = SOCKS.start("server_first", "", "");
    for _ in 0..3 {
        let mut s = socks5_hello(port, None);
        s.write_all(&socks5_request(1, localhost(origin.port())))
            .unwrap();
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(reply[..2], [5, 0], "CONNECT reply {reply:?}");
        let t = Instant::now();
        expect_bytes(&mut s, b"220 ready\r\n");
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "the greeting took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn unknown_version_just_closes() {
    let (_proxy, port, log) = SOCKS.start("bad_version", "", "");
    let mut s = connect(localhost(port));
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert_closed_after(&mut s, b"");
    // The readiness probe left one such record; this client the second.
    assert!(
        wait_for(
            || log_lines(&log)
                .iter()
                .filter(|l| l.starts_with("SOCKS 00401"))
                .count()
                >= 2,
            LOG_TIMEOUT
        ),
        "{:?}",
        log_lines(&log)
    );
}

#[test]
fn v5_zero_methods_gets_no_acceptable_method() {
    let (_proxy, port, _log) = SOCKS.start("zero_methods", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 0]).unwrap();
    assert_closed_after(&mut s, &[5, 0xFF]);
}

#[test]
fn v5_unknown_methods_only_gets_no_acceptable_method() {
    let (_proxy, port, _log) = SOCKS.start("gssapi_only", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 2, 1, 0x80]).unwrap();
    assert_closed_after(&mut s, &[5, 0xFF]);
}

#[test]
fn v5_truncated_greeting_closes() {
    let (_proxy, port, log) = SOCKS.start("short_greeting", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 3, 0]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_closed_after(&mut s, b"");
    read_log_line(&log, "with code 441", |l| l.starts_with("SOCK5 00441"));
}

#[test]
fn v5_silent_client_times_out() {
    // Half a greeting, then nothing: BYTE_SHORT (1 s) ends it.
    let (_proxy, port, _log) = SOCKS.start("silent", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 3, 0]).unwrap();
    let t = std::time::Instant::now();
    assert_closed_after(&mut s, b"");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn v5_request_with_bad_version() {
    let (_proxy, port, log) = SOCKS.start("bad_req_version", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[4, 1, 0, 1, 127, 0, 0, 1, 0, 80]).unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
    read_log_line(&log, "with code 421", |l| l.starts_with("SOCK5 00421"));
}

#[test]
fn v5_unsupported_command_gets_rep_7() {
    let (_proxy, port, log) = SOCKS.start("bad_cmd", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[5, 9, 0, 1, 127, 0, 0, 1, 0, 80]).unwrap();
    assert_closed_after(&mut s, &[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log, "with code 407", |l| l.starts_with("SOCK5 00407"));
}

#[test]
fn v5_unsupported_address_type_gets_rep_8() {
    let (_proxy, port, log) = SOCKS.start("bad_atyp", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[5, 1, 0, 2, 127, 0, 0, 1, 0, 80]).unwrap();
    assert_closed_after(&mut s, &[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log, "with code 997", |l| l.starts_with("SOCK5 00997"));
}

#[test]
fn v5_truncated_request_gets_general_failure() {
    let (_proxy, port, _log) = SOCKS.start("short_req", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[5, 1, 0, 1, 127, 0]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
}

#[test]
fn v5_request_stalled_mid_message_ends_after_byte_short() {
    // The first byte of a message may take BYTE_LONG (5 s); once it has
    // begun, each further byte must come within BYTE_SHORT (1 s).
    let (_proxy, port, _log) = SOCKS.start("stalled_req", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[5, 1, 0, 1, 127, 0]).unwrap();
    let t = Instant::now();
    assert_closed_after(&mut s, &V5_FAIL_1);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(3500),
        "{took:?}"
    );
}

#[test]
fn silent_client_is_closed_after_byte_long() {
    // The socket has BYTE_LONG (2 s here) from the listener before the
    // handler reads it: a client that says nothing is closed after that
    // long, with its record, not kept.
    let (_proxy, port, log) =
        SOCKS.start("silent_first", "timeouts 1 2 30 60 180 1800 15 60\n", "");
    let mut s = connect(localhost(port));
    let t = Instant::now();
    assert_closed_after(&mut s, b"");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_millis(4500),
        "{took:?}"
    );
    read_log_line(&log, "the silent client's record", |l| {
        l.starts_with("SOCKS ")
    });
}

#[test]
fn clients_are_served_after_the_acceptor_waited_longer_than_byte_long() {
    // The listener's receive timeout (BYTE_LONG, 1 s here) also bounds the
    // acceptor's accept(): after it has run out twice with no client, the
    // next client is still accepted and served.
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start(
        "accept_times_out",
        "timeouts 1 1 30 60 180 1800 15 60\n",
        "",
    );
    thread::sleep(Duration::from_millis(2500));
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [5, 0]);
    echo_roundtrip(&mut s, b"after the acceptor's timeouts");
}

#[test]
fn v5_client_may_think_byte_long_before_its_request() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("think_req", "", "");
    let mut s = socks5_hello(port, None);
    thread::sleep(Duration::from_millis(2500));
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [5, 0]);
    echo_roundtrip(&mut s, b"after a pause");
}

#[test]
fn v5_data_sent_with_the_request_is_relayed_first() {
    // A client that does not wait for the replies: greeting, request and
    // its first data in one segment. The data read with the request must
    // reach the origin, before what follows.
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("early_v5", "", "");
    let mut s = connect(localhost(port));
    let mut all = vec![5, 1, 0];
    all.extend(socks5_request(1, localhost(origin.port())));
    all.extend_from_slice(b"early bytes;");
    s.write_all(&all).unwrap();
    expect_bytes(&mut s, &[5, 0]);
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [5, 0]);
    s.write_all(b"late bytes").unwrap();
    expect_bytes(&mut s, b"early bytes;late bytes");
}

#[test]
fn v4_data_sent_with_the_request_is_relayed_first() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("early_v4", "", "");
    let mut s = connect(localhost(port));
    let mut all = socks4_request(1, localhost(origin.port()), b"user");
    all.extend_from_slice(b"early v4;");
    s.write_all(&all).unwrap();
    let mut r = [0u8; 8];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [0, 90]);
    s.write_all(b"late").unwrap();
    expect_bytes(&mut s, b"early v4;late");
}

#[test]
fn record_names_the_destination_as_the_peer() {
    // %R:%r is the server side's peer: the destination when dialed
    // directly.
    let origin = Origin::echo();
    let (_proxy, port, log) = Service::tcp("socks", "L%N %E %R:%r").start("socks_peer", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    echo_roundtrip(&mut s, b"peer");
    drop(s);
    expect_log_line(&log, &format!("SOCK5 00000 127.0.0.1:{}", origin.port()));
}

#[test]
fn v5_truncated_name_gets_general_failure() {
    let (_proxy, port, _log) = SOCKS.start("short_name", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&[5, 1, 0, 3, 200, b'a', b'b']).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
}

#[test]
fn v5_255_byte_name_is_host_unreachable() {
    // The longest name SOCKS5 can carry is no DNS name: REP 4, code 100.
    let (_proxy, port, log) = SOCKS.start("long_name", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request_name(1, &[b'a'; 255], 80))
        .unwrap();
    assert_closed_after(&mut s, &[5, 4, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log, "with code 100", |l| l.starts_with("SOCK5 00100"));
}

#[test]
fn v5_empty_name_is_refused() {
    let (_proxy, port, _log) = SOCKS.start("empty_name", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request_name(1, b"", 80)).unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
}

#[test]
fn v5_port_zero_and_null_address_are_refused() {
    let (_proxy, port, log) = SOCKS.start("port_zero", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, "127.0.0.1:0".parse().unwrap()))
        .unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
    read_log_line(&log, "with code 461", |l| l.starts_with("SOCK5 00461"));
    // 0.0.0.0 would reach this host: refused (431), not connected.
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, "0.0.0.0:80".parse().unwrap()))
        .unwrap();
    assert_closed_after(&mut s, &V5_FAIL_1);
    read_log_line(&log, "with code 431", |l| l.starts_with("SOCK5 00431"));
}

#[test]
fn v5_refused_destination_gets_rep_5() {
    let (_proxy, port, log) = SOCKS.start("refused", "", "");
    let dead = free_port();
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(dead))).unwrap();
    assert_closed_after(&mut s, &[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log, "with code 13", |l| l.starts_with("SOCK5 00013"));
}

#[test]
fn v5_connect_reply_carries_the_outgoing_address() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("bnd_addr", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..8], [5, 0, 0, 1, 127, 0, 0, 1]);
    let bnd = u16::from_be_bytes([r[8], r[9]]);
    echo_roundtrip(&mut s, b"through socks5");
    let peers = origin.peers();
    assert!(
        peers.iter().any(|a| a.port() == bnd),
        "BND.PORT {bnd} should be the port the origin saw: {peers:?}"
    );
}

#[test]
fn dash_ne_reports_the_nat_address() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("nat", "", "-Ne192.0.2.7");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..8], [5, 0, 0, 1, 192, 0, 2, 7]);
    echo_roundtrip(&mut s, b"nat");
}

#[test]
fn v5_ipv6_destination() {
    let origin = Origin::echo_on("[::1]:0");
    let (_proxy, port, log) = SOCKS.start("ipv6", "", "");
    let mut s = socks5_hello(port, None);
    let to = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, origin.port()));
    s.write_all(&socks5_request(1, to)).unwrap();
    let mut r = [0u8; 22];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..4], [5, 0, 0, 4], "reply {r:?}");
    assert_eq!(r[4..20], std::net::Ipv6Addr::LOCALHOST.octets());
    echo_roundtrip(&mut s, b"over ipv6");
    drop(s);
    expect_log_line(
        &log,
        &format!("SOCK5 00000 - CONNECT ::1:{}", origin.port()),
    );
}

#[test]
fn v5_name_destination() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("name", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request_name(1, b"localhost", origin.port()))
        .unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [5, 0]);
    echo_roundtrip(&mut s, b"by name");
}

#[test]
fn v5_unknown_name_is_host_unreachable() {
    let (_proxy, port, _log) = SOCKS.start("no_such_name", "", "");
    let mut s = socks5_hello(port, None);
    s.write_all(&socks5_request_name(1, b"no-such-host.invalid", 80))
        .unwrap();
    assert_closed_after(&mut s, &[5, 4, 0, 1, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn v4_bad_command_is_refused() {
    let (_proxy, port, log) = SOCKS.start("v4_bad_cmd", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[4, 3, 0, 80, 127, 0, 0, 1, 0]).unwrap();
    assert_closed_after(&mut s, &V4_REFUSED);
    read_log_line(&log, "with code 407", |l| l.starts_with("SOCK4 00407"));
}

#[test]
fn v4_truncated_request_is_refused() {
    let (_proxy, port, _log) = SOCKS.start("v4_short", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[4, 1, 0, 80, 127]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_closed_after(&mut s, &V4_REFUSED);
}

#[test]
fn v4a_name_longer_than_255_is_refused() {
    let (_proxy, port, _log) = SOCKS.start("v4a_long", "", "");
    let mut s = connect(localhost(port));
    let mut req = vec![4, 1, 0, 80, 0, 0, 0, 1, 0];
    req.extend_from_slice(&[b'a'; 300]);
    req.push(0);
    s.write_all(&req).unwrap();
    assert_closed_after(&mut s, &V4_REFUSED);
}

#[test]
fn v4_user_id_without_nul_is_refused() {
    let (_proxy, port, _log) = SOCKS.start("v4_long_user", "", "");
    let mut s = connect(localhost(port));
    let mut req = vec![4, 1, 0, 80, 127, 0, 0, 1];
    req.extend_from_slice(&[b'u'; 400]);
    s.write_all(&req).unwrap();
    assert_closed_after(&mut s, &V4_REFUSED);
}

#[test]
fn v4_granted_reply() {
    let origin = Origin::echo();
    let (_proxy, port, _log) = SOCKS.start("v4_ok", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&socks4_request(1, localhost(origin.port()), b""))
        .unwrap();
    let mut r = [0u8; 8];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [0, 90]);
    assert_eq!(r[4..], [127, 0, 0, 1]);
    echo_roundtrip(&mut s, b"socks4");
}

// ---------------------------------------------------------------------------
// Method selection

#[test]
fn default_prefers_password_when_offered() {
    let (_proxy, port, _log) = SOCKS.start("m_default", "", "");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 2, 0, 2]).unwrap();
    expect_bytes(&mut s, &[5, 2]);
    // Offered "no authentication" alone, it is chosen ([5, 0]).
    socks5_hello(port, None);
}

#[test]
fn dash_u_never_asks() {
    let (_proxy, port, _log) = SOCKS.start("m_u", "", "-u");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 2, 0, 2]).unwrap();
    expect_bytes(&mut s, &[5, 0]);
}

#[test]
fn dash_u2_refuses_clients_without_a_password() {
    let (_proxy, port, log) = SOCKS.start("m_u2", "", "-u2");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 1, 0]).unwrap();
    assert_closed_after(&mut s, &[5, 0xFF]);
    read_log_line(&log, "with code 4", |l| l.starts_with("SOCK5 00004"));
    let mut s = connect(localhost(port));
    s.write_all(&[5, 2, 0, 2]).unwrap();
    expect_bytes(&mut s, &[5, 2]);
}

#[test]
fn rfc1929_bad_subnegotiation_version_is_refused() {
    let (_proxy, port, log) = SOCKS.start("m_subneg", "", "-u2");
    let mut s = connect(localhost(port));
    s.write_all(&[5, 1, 2]).unwrap();
    expect_bytes(&mut s, &[5, 2]);
    s.write_all(&[5, 1, b'a', 1, b'b']).unwrap();
    assert_closed_after(&mut s, &[1, 1]);
    read_log_line(&log, "with code 412", |l| l.starts_with("SOCK5 00412"));
}

// ---------------------------------------------------------------------------
// UDP ASSOCIATE

/// A SOCKS5 UDP datagram to `to` carrying `data`.
fn udp_datagram(to: SocketAddr, data: &[u8]) -> Vec<u8> {
    let SocketAddr::V4(a) = to else {
        panic!("v4 only")
    };
    let mut b = vec![0, 0, 0, 1];
    b.extend_from_slice(&a.ip().octets());
    b.extend_from_slice(&a.port().to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Opens an association; returns the control connection and the relay.
fn associate(port: u16, client: &UdpSocket) -> (TcpStream, SocketAddr) {
    let mut ctl = socks5_hello(port, None);
    let from = client.local_addr().unwrap();
    ctl.write_all(&socks5_request(3, localhost(from.port())))
        .unwrap();
    let mut r = [0u8; 10];
    ctl.read_exact(&mut r).unwrap();
    assert_eq!(r[..4], [5, 0, 0, 1], "UDP ASSOCIATE reply {r:?}");
    let relay = SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[8], r[9]])));
    (ctl, relay)
}

#[test]
fn udp_associate_relays_both_ways() {
    let echo = UdpEcho::start();
    let (_proxy, port, log) = SOCKS.start("udp", "", "");
    let client = udp_client();
    let (ctl, relay) = associate(port, &client);
    assert_eq!(relay.ip(), localhost(0).ip());

    let to = localhost(echo.port());
    for msg in [&b"first"[..], b"second", &[7u8; 1400]] {
        client.send_to(&udp_datagram(to, msg), relay).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, relay, "replies come from the relay");
        assert_eq!(&buf[..n], &udp_datagram(to, msg)[..], "header + echo");
    }
    let sources = echo.sources();
    assert!(sources
        .iter()
        .all(|s| s.ip() == to.ip() && s.port() != relay.port()));

    // A name as destination.
    let mut named = vec![0, 0, 0, 3, 9];
    named.extend_from_slice(b"localhost");
    named.extend_from_slice(&echo.port().to_be_bytes());
    named.extend_from_slice(b"by name");
    client.send_to(&named, relay).unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], &udp_datagram(to, b"by name")[..]);

    // Closing the control connection ends the association.
    drop(ctl);
    read_log_line(&log, "UDPMAP end", |l| {
        l.starts_with("SOCK5 00000 - UDPMAP localhost:")
    });
    read_log_line(&log, "UDPMAP first destination", |l| {
        l == format!("SOCK5 00000 - UDPMAP 127.0.0.1:{}", echo.port())
    });
    client.send_to(&udp_datagram(to, b"late"), relay).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        client.recv_from(&mut buf).is_err(),
        "the association should be gone"
    );
}

#[test]
fn udp_fragment_ends_the_association() {
    let echo = UdpEcho::start();
    let (_proxy, port, log) = SOCKS.start("udp_frag", "", "");
    let client = udp_client();
    let (mut ctl, relay) = associate(port, &client);
    let mut d = udp_datagram(localhost(echo.port()), b"frag");
    d[2] = 1;
    client.send_to(&d, relay).unwrap();
    assert_closed_after(&mut ctl, b"");
    read_log_line(&log, "with code 483", |l| l.starts_with("SOCK5 00483"));
}

#[test]
fn udp_from_another_port_is_ignored() {
    // The request named the client's port; datagrams from elsewhere drop.
    let echo = UdpEcho::start();
    let (_proxy, port, _log) = SOCKS.start("udp_port", "", "");
    let client = udp_client();
    let (_ctl, relay) = associate(port, &client);
    let other = udp_client();
    other
        .send_to(&udp_datagram(localhost(echo.port()), b"x"), relay)
        .unwrap();
    client
        .send_to(&udp_datagram(localhost(echo.port()), b"y"), relay)
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert_eq!(buf[n - 1], b'y');
    assert!(wait_for(
        || echo.sources().len() == 1,
        Duration::from_secs(1)
    ));
    assert_eq!(echo.sources().len(), 1, "only the client's datagram");
}

// ---------------------------------------------------------------------------
// BIND

#[test]
fn v5_bind_accepts_one_peer_and_relays() {
    let (_proxy, port, log) = SOCKS.start("bind5", "", "");
    let mut ctl = socks5_hello(port, None);
    ctl.write_all(&socks5_request(2, "0.0.0.0:0".parse().unwrap()))
        .unwrap();
    let mut r = [0u8; 10];
    ctl.read_exact(&mut r).unwrap();
    assert_eq!(r[..4], [5, 0, 0, 1], "first BIND reply {r:?}");
    let bound = SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[8], r[9]])));
    assert_ne!(bound.port(), port, "the bound port, not the service's");
    assert_eq!(bound.ip(), localhost(0).ip());

    let mut peer = connect(bound);
    ctl.read_exact(&mut r).unwrap();
    let seen = SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[8], r[9]])));
    assert_eq!(r[..4], [5, 0, 0, 1], "second BIND reply {r:?}");
    assert_eq!(seen, peer.local_addr().unwrap(), "the peer's address");

    peer.write_all(b"from the peer").unwrap();
    expect_bytes(&mut ctl, b"from the peer");
    ctl.write_all(b"to the peer").unwrap();
    expect_bytes(&mut peer, b"to the peer");
    drop(peer);
    assert_closed_after(&mut ctl, b"");
    drop(ctl);
    read_log_line(&log, "BIND record", |l| l == "SOCK5 00000 - BIND 0.0.0.0:0");
}

#[test]
fn v4_bind_accepts_one_peer() {
    let (_proxy, port, _log) = SOCKS.start("bind4", "", "");
    let mut ctl = connect(localhost(port));
    // Expect the peer from 127.0.0.1, any port.
    ctl.write_all(&socks4_request(2, localhost(0), b""))
        .unwrap();
    let mut r = [0u8; 8];
    ctl.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [0, 90]);
    let bound = SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[2], r[3]])));
    let mut peer = connect(bound);
    ctl.read_exact(&mut r).unwrap();
    assert_eq!(r[..2], [0, 90]);
    assert_eq!(
        u16::from_be_bytes([r[2], r[3]]),
        peer.local_addr().unwrap().port()
    );
    echo_through(&mut ctl, &mut peer);
}

fn echo_through(a: &mut TcpStream, b: &mut TcpStream) {
    a.write_all(b"ping").unwrap();
    expect_bytes(b, b"ping");
    b.write_all(b"pong").unwrap();
    expect_bytes(a, b"pong");
}

#[test]
fn bind_control_close_ends_the_wait() {
    let (_proxy, port, log) = SOCKS.start("bind_gone", "", "");
    let mut ctl = socks5_hello(port, None);
    ctl.write_all(&socks5_request(2, "0.0.0.0:0".parse().unwrap()))
        .unwrap();
    let mut r = [0u8; 10];
    ctl.read_exact(&mut r).unwrap();
    ctl.shutdown(Shutdown::Write).unwrap();
    assert_closed_after(&mut ctl, b"");
    read_log_line(&log, "with code 460", |l| l.starts_with("SOCK5 00460"));
}

#[test]
fn udp_association_ends_at_its_traffic_quota() {
    // `countout` holds for SOCKS UDP as for udppm (one relay serves both):
    // 17 datagrams of 60000 bytes fit in 1 MiB, the 18th passes it and
    // ends the association with code 10; the control connection closes.
    const SIZE: usize = 60_000;
    let echo = UdpEcho::start();
    let dir = Dir::new("udp_quota");
    let pre = format!(
        "counter {}\ncountout 1 D 1 *\n",
        p(&dir.join("3proxy.counters"))
    );
    let (_proxy, port, log) = SOCKS.start_in(dir, &pre, "", "");
    let client = udp_client();
    let (mut ctl, relay) = associate(port, &client);
    let to = localhost(echo.port());
    let msg = vec![0x5au8; SIZE];
    let mut buf = vec![0u8; 65536];
    for _ in 0..17 {
        client.send_to(&udp_datagram(to, &msg), relay).unwrap();
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(n, 10 + SIZE);
    }
    client.send_to(&udp_datagram(to, &msg), relay).unwrap();
    ctl.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(ctl.read(&mut b).expect("the control connection closes"), 0);
    read_log_line(&log, "the association's record, code 10", |l| {
        l == format!("SOCK5 00010 - UDPMAP 127.0.0.1:{}", echo.port())
    });
    assert_eq!(echo.sources().len(), 18, "datagrams that reached the echo");
}

#[test]
fn udp_association_ends_when_a_reload_denies_it() {
    // `force` (the default): after a reload whose ACL refuses the client,
    // its association ends at its next datagram, as a TCP session would.
    let echo = UdpEcho::start();
    let dir = Dir::new("udp_force");
    let log = dir.join("access.log");
    let port = free_port();
    let cfg = |acl: &str| {
        format!(
            "log {}\nlogformat \"{FMT}\"\n{acl}\nsocks -i127.0.0.1 -p{port}\n",
            p(&log)
        )
    };
    let proxy = Proxy::start(dir, &cfg("allow *"), &[Listen::Tcp(localhost(port))]);
    let client = udp_client();
    let (mut ctl, relay) = associate(port, &client);
    let to = localhost(echo.port());
    let mut buf = [0u8; 256];
    client.send_to(&udp_datagram(to, b"before"), relay).unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert!(buf[..n].ends_with(b"before"));

    proxy.dir.write("3proxy.cfg", cfg("deny *"));
    proxy.signal("USR1");
    // The reload has taken effect once a new request is refused.
    assert!(
        wait_for(
            || {
                let mut s = socks5_hello(port, None);
                let _ = s.write_all(&socks5_request(1, localhost(echo.port())));
                let mut r = [0u8; 10];
                s.read_exact(&mut r).is_ok() && r[1] != 0
            },
            START_TIMEOUT
        ),
        "the new ACL never took effect"
    );
    // A new request is refused as soon as the new services run; the
    // sessions' recheck follows the reload's generation a moment later,
    // so a datagram sent in between may still pass: the next one ends it.
    ctl.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut b = [0u8; 1];
    let t = Instant::now();
    let closed = loop {
        client.send_to(&udp_datagram(to, b"after"), relay).unwrap();
        match ctl.read(&mut b) {
            Ok(n) => break n == 0,
            Err(e) if is_timeout(&e) && t.elapsed() < IO_TIMEOUT => continue,
            Err(e) => panic!("the control connection closes: {e}"),
        }
    };
    assert!(closed, "the control connection sent a byte");
    read_log_line(&log, "the association's record, code 1", |l| {
        l == format!("SOCK5 00001 - UDPMAP 127.0.0.1:{}", echo.port())
    });
}

#[test]
fn udp_denied_destination_is_dropped_and_the_association_goes_on() {
    let (echo, other) = (UdpEcho::start(), UdpEcho::start());
    let pre = format!("allow * * 127.0.0.1 {}\ndeny *\n", echo.port());
    let (_proxy, port, log) = SOCKS.start("udp_acl", &pre, "");
    let client = udp_client();
    let (ctl, relay) = associate(port, &client);
    let mut buf = [0u8; 256];
    client
        .send_to(&udp_datagram(localhost(echo.port()), b"allowed"), relay)
        .unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert!(buf[..n].ends_with(b"allowed"));
    client
        .send_to(&udp_datagram(localhost(other.port()), b"denied"), relay)
        .unwrap();
    client
        .send_to(&udp_datagram(localhost(echo.port()), b"again"), relay)
        .unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert!(buf[..n].ends_with(b"again"), "{:?}", &buf[..n]);
    assert!(other.sources().is_empty(), "the denied datagram was sent");
    read_log_line(&log, "the refused destination", |l| {
        l == format!("SOCK5 00001 - UDPMAP 127.0.0.1:{}", other.port())
    });
    drop(ctl);
}
