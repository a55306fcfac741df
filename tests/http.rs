//! The HTTP proxy service `proxy`: request forms, bodies of every framing,
//! keep-alive on both sides, CONNECT and Upgrade tunnels, the refusals
//! that stop request smuggling, error answers, access control, and the
//! per-request log. Origins are small HTTP/1.1 servers in this file.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::util::*;

// ---------------------------------------------------------------------------
// A test origin

/// A threaded HTTP/1.1 origin with keep-alive. Routes (by path):
/// `/hello`, `/len/N` (N bytes of stream 7, Content-Length), `/chunked/N`
/// (the same, chunked), `/close/N` (the same, ended by closing), `/sha`
/// (answers the SHA-256 and length of the request body), `/head` (answers
/// the request head it got), `/status/N`, `/ws` (101, then echo),
/// `/silent` (never answers), `/continue` (sends `100 Continue` first).
pub struct HttpOrigin {
    origin: Origin,
    heads: Arc<Mutex<Vec<String>>>,
}

impl HttpOrigin {
    pub fn start() -> HttpOrigin {
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        let origin = Origin::start("127.0.0.1:0", move |conn| {
            let _ = serve_http(conn, &seen);
        });
        HttpOrigin { origin, heads }
    }

    pub fn port(&self) -> u16 {
        self.origin.port()
    }

    /// Connections accepted so far.
    pub fn conns(&self) -> usize {
        self.origin.peers().len()
    }

    /// Request heads received so far.
    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }
}

/// The bytes `/len/N`, `/chunked/N` and `/close/N` send.
fn body_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 23) as u8).collect()
}

fn serve_http(conn: TcpStream, seen: &Mutex<Vec<String>>) -> io::Result<()> {
    let mut r = BufReader::new(conn.try_clone()?);
    let mut w = conn;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 {
                return Ok(());
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        seen.lock().unwrap().push(head.clone());
        let mut parts = head.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let field = |n: &str| field_values(&head, n).pop().unwrap_or("").to_string();
        if path == "/continue" && field("expect").eq_ignore_ascii_case("100-continue") {
            w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        // The request body, digested.
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        if field("transfer-encoding").contains("chunked") {
            got = dechunk(&mut r, |b| hasher.update(b))?;
        } else if let Ok(n) = field("content-length").parse::<u64>() {
            let mut left = n;
            let mut buf = vec![0u8; 65536];
            while left > 0 {
                let k = r.read(&mut buf[..left.min(65536) as usize])?;
                if k == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..k]);
                left -= k as u64;
            }
            got = n;
        }
        let close = field("connection").eq_ignore_ascii_case("close");
        let conn_field = if close { "Connection: close\r\n" } else { "" };
        let head_only = method == "HEAD";
        let route_path = path.split('?').next().unwrap_or("");
        let mut seg = route_path.trim_start_matches('/').splitn(2, '/');
        let route = seg.next().unwrap_or("");
        let arg: usize = seg.next().and_then(|a| a.parse().ok()).unwrap_or(0);
        match route {
            "len" | "hello" | "head" | "sha" => {
                let body = match route {
                    "len" => body_bytes(arg),
                    "hello" => b"hello".to_vec(),
                    "head" => head.clone().into_bytes(),
                    _ => format!("{:x} {got}", hasher.finalize()).into_bytes(),
                };
                let h = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{conn_field}\r\n",
                    body.len()
                );
                w.write_all(h.as_bytes())?;
                if !head_only {
                    w.write_all(&body)?;
                }
            }
            "pattern" => {
                let h = format!("HTTP/1.1 200 OK\r\nContent-Length: {arg}\r\n{conn_field}\r\n");
                w.write_all(h.as_bytes())?;
                send_pattern(&mut w, 7, arg as u64)?;
            }
            "chunked" => {
                w.write_all(
                    format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{conn_field}\r\n")
                        .as_bytes(),
                )?;
                let body = body_bytes(arg);
                for (i, piece) in body.chunks(1000 + arg % 7).enumerate() {
                    let ext = if i % 2 == 0 { ";x=1" } else { "" };
                    w.write_all(format!("{:x}{ext}\r\n", piece.len()).as_bytes())?;
                    w.write_all(piece)?;
                    w.write_all(b"\r\n")?;
                }
                w.write_all(b"0\r\nX-Trailer: yes\r\n\r\n")?;
            }
            "close" => {
                w.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
                w.write_all(&body_bytes(arg))?;
                return Ok(());
            }
            "status" => {
                let h = format!("HTTP/1.1 {arg} X\r\nContent-Length: 5\r\n{conn_field}\r\n");
                w.write_all(h.as_bytes())?;
                if !(head_only || arg == 204 || arg == 304 || arg < 200) {
                    w.write_all(b"12345")?;
                }
            }
            "ws" => {
                w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")?;
                let mut buf = [0u8; 4096];
                loop {
                    let n = r.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    w.write_all(&buf[..n])?;
                }
            }
            "silent" => {
                thread::sleep(Duration::from_secs(20));
                return Ok(());
            }
            "continue" => {
                let body = format!("{:x} {got}", hasher.finalize());
                let h = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                w.write_all(h.as_bytes())?;
            }
            _ => w.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?,
        }
        if close {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------
// The proxy and its clients

/// The service of most tests: the log's records name the service, code,
/// user, client, host, destination, bytes out and in, and the request.
const PROXY: Service = Service::tcp("proxy", "L%N %E %U %C %n %Q:%q %O %I %T");

/// Runs curl through the proxy; returns (status code, body).
fn curl(proxy_port: u16, args: &[&str]) -> (u16, Vec<u8>) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "--max-time",
            "60",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(["-x", &format!("http://127.0.0.1:{proxy_port}")])
        .args(args)
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    let mut body = out.stdout;
    let nl = body
        .iter()
        .rposition(|&b| b == b'\n')
        .expect("curl's status line");
    let code = String::from_utf8_lossy(&body[nl + 1..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(nl);
    (code, body)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ---------------------------------------------------------------------------
// Methods and request forms

#[test]
fn get_head_post_put_with_curl() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("curl_methods", "", "");
    assert_eq!(
        curl(port, &[&origin.url("/hello")]),
        (200, b"hello".to_vec())
    );
    let (code, body) = curl(port, &["-I", &origin.url("/len/10")]);
    assert_eq!(code, 200);
    assert!(
        text(&body).contains("Content-Length: 10"),
        "{}",
        text(&body)
    );
    let (code, body) = curl(port, &["--data-binary", "abc", &origin.url("/sha")]);
    assert_eq!(code, 200);
    let sha = format!("{:x} 3", Sha256::digest(b"abc"));
    assert_eq!(text(&body), sha);
    let (code, body) = curl(
        port,
        &["-X", "PUT", "--data-binary", "abc", &origin.url("/sha")],
    );
    assert_eq!((code, text(&body)), (200, sha));
    let heads = origin.heads();
    let lines: Vec<&str> = heads.iter().map(|h| h.lines().next().unwrap()).collect();
    assert_eq!(
        lines,
        [
            "GET /hello HTTP/1.1",
            "HEAD /len/10 HTTP/1.1",
            "POST /sha HTTP/1.1",
            "PUT /sha HTTP/1.1"
        ]
    );
}

#[test]
fn raw_requests_are_rewritten_for_the_origin() {
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start("rewrite", "", "");
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "GET http://127.0.0.1:{}/head?q=1 HTTP/1.1\r\nHost: wrong\r\nConnection: keep-alive, X-Hop\r\n\
             X-Hop: 1\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 300\r\nTE: trailers\r\nX-End: 2\r\n\r\n",
            origin.port()
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert_eq!(r.status, 200);
    let head = text(&r.body);
    let mut lines = head.split("\r\n");
    assert_eq!(lines.next(), Some("GET /head?q=1 HTTP/1.1"));
    assert_eq!(
        lines.next(),
        Some(format!("Host: 127.0.0.1:{}", origin.port()).as_str())
    );
    assert_eq!(lines.next(), Some("X-End: 2"));
    let fwd = lines.next().unwrap();
    assert!(fwd.starts_with("Forwarded: for=\"127.0.0.1:"), "{head}");
    assert!(fwd.contains(&format!(":{port}\"")), "{head}");
    assert_eq!(lines.next(), Some(""));
    // Origin-form, routed by Host (3proxy's transparent form).
    c.send(
        format!(
            "GET /head HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
            origin.port()
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert!(text(&r.body).starts_with(&format!(
        "GET /head HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
        origin.port()
    )));
    // One log line per request, %T is the request line.
    let log = log_of(&proxy);
    let line = read_log_line(&log, "the origin-form request", |l| {
        l.ends_with("GET /head HTTP/1.1")
    });
    assert!(line.starts_with("PROXY 00000 - 127.0.0.1 "), "{line}");
    read_log_line(&log, "the absolute-form request", |l| {
        l.ends_with(&format!(
            "GET http://127.0.0.1:{}/head?q=1 HTTP/1.1",
            origin.port()
        ))
    });
}

#[test]
fn anonymous_modes() {
    let origin = HttpOrigin::start();
    let url = origin.url("/head");
    let send = |port: u16| {
        let mut c = HttpClient::connect(port);
        c.send(format!("GET {url} HTTP/1.1\r\nVia: 1.0 x\r\nX-Forwarded-For: 10.9.9.9\r\nForwarded: for=y\r\n\r\n").as_bytes());
        text(&c.read(false).body)
    };
    let (_p0, port, _) = PROXY.start("anon", "", "-a");
    let h = send(port);
    assert!(!h.contains("Via") && !h.contains("Forwarded"), "{h}");
    let (_p1, port, _) = PROXY.start("anon1", "", "-a1");
    let h = send(port);
    assert!(
        h.contains("\r\nVia: 1.1 ")
            && h.contains("\r\nX-Forwarded-For: ")
            && !h.contains("X-Forwarded-For: 127.0.0.1"),
        "{h}"
    );
    let (_p2, port, _) = PROXY.start("anon2", "", "-a2");
    let h = send(port);
    assert!(h.contains("\r\nX-Forwarded-For: 127.0.0.1\r\n"), "{h}");
}

#[test]
fn head_204_304_have_no_body_and_keep_the_connection() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("nobody", "", "");
    let mut c = HttpClient::connect(port);
    c.send(format!("HEAD {} HTTP/1.1\r\n\r\n", origin.url("/len/100")).as_bytes());
    let r = c.read(true);
    assert_eq!((r.status, r.field("content-length")), (200, Some("100")));
    for code in [204, 304] {
        let r = c.get(&origin.url(&format!("/status/{code}")));
        assert_eq!(r.status, code);
    }
    assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    assert_eq!(origin.conns(), 1);
}

#[test]
fn ipv6_literal_in_brackets() {
    require_ipv6();
    let origin6 = Origin::start("[::1]:0", |conn| {
        let _ = serve_http(conn, &Mutex::new(Vec::new()));
    });
    let (_proxy, port, _) = PROXY.start("v6", "", "");
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://[::1]:{}/hello", origin6.port()));
    assert_eq!((r.status, r.body), (200, b"hello".to_vec()));
}

// ---------------------------------------------------------------------------
// Bodies

const BIG: u64 = 64 * 1024 * 1024;

#[test]
fn download_64mb_intact() {
    download_64mb("download", false);
}

#[test]
fn download_64mb_intact_with_splice() {
    download_64mb("download_s", true);
}

/// `splice`: with `-s`, and splice(2) must have moved the body.
fn download_64mb(name: &str, splice: bool) {
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start(name, "", if splice { "-s" } else { "" });
    let trace = splice.then(|| Strace::attach(&proxy, "splice"));
    let mut c = HttpClient::connect(port);
    set_timeouts(&c.w, Duration::from_secs(60));
    c.send(
        format!(
            "GET {} HTTP/1.1\r\n\r\n",
            origin.url(&format!("/pattern/{BIG}"))
        )
        .as_bytes(),
    );
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        c.r.read_line(&mut head).unwrap();
    }
    assert!(head.contains(&format!("Content-Length: {BIG}")), "{head}");
    let got = hash_to_eof(&mut (&mut c.r).take(BIG)).unwrap();
    assert_eq!(got, pattern_digest(7, BIG));
    // The connection is still good.
    assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    if let Some(trace) = trace {
        trace.assert_moved(BIG);
    }
}

#[test]
fn upload_64mb_intact() {
    upload_64mb("upload", false);
}

#[test]
fn upload_64mb_intact_with_splice() {
    upload_64mb("upload_s", true);
}

/// `splice`: with `-s`, and splice(2) must have moved the body.
fn upload_64mb(name: &str, splice: bool) {
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start(name, "", if splice { "-s" } else { "" });
    let trace = splice.then(|| Strace::attach(&proxy, "splice"));
    let mut c = HttpClient::connect(port);
    set_timeouts(&c.w, Duration::from_secs(60));
    c.send(
        format!(
            "POST {} HTTP/1.1\r\nContent-Length: {BIG}\r\n\r\n",
            origin.url("/sha")
        )
        .as_bytes(),
    );
    send_pattern(&mut c.w, 3, BIG).unwrap();
    let r = c.read(false);
    let want = pattern_digest(3, BIG);
    let hex: String = want.sha256.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(text(&r.body), format!("{hex} {BIG}"));
    if let Some(trace) = trace {
        trace.assert_moved(BIG);
    }
}

#[test]
fn chunked_both_ways() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("chunked", "", "");
    let mut c = HttpClient::connect(port);
    // Download: relayed as it is, trailers included, then reused.
    c.send(format!("GET {} HTTP/1.1\r\n\r\n", origin.url("/chunked/100000")).as_bytes());
    let r = c.read(false);
    assert_eq!(r.field("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, body_bytes(100000));
    // Upload, with the first chunk in the same packet as the head.
    let mut req = format!(
        "POST {} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        origin.url("/sha")
    )
    .into_bytes();
    let data = body_bytes(300000);
    let mut chunks = data.chunks(70001);
    let first = chunks.next().unwrap();
    req.extend_from_slice(format!("{:x}\r\n", first.len()).as_bytes());
    req.extend_from_slice(first);
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    for piece in chunks {
        c.send(format!("{:x};e=1\r\n", piece.len()).as_bytes());
        c.send(piece);
        c.send(b"\r\n");
    }
    c.send(b"0\r\n\r\n");
    let r = c.read(false);
    assert_eq!(text(&r.body), format!("{:x} 300000", Sha256::digest(&data)));
    assert_eq!(origin.conns(), 1);
    // And with curl.
    let (code, body) = curl(
        port,
        &[
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            "hello",
            &origin.url("/sha"),
        ],
    );
    assert_eq!(
        (code, text(&body)),
        (200, format!("{:x} 5", Sha256::digest(b"hello")))
    );
}

#[test]
fn close_delimited_response_closes_the_client() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("closedelim", "", "");
    let mut c = HttpClient::connect(port);
    c.send(format!("GET {} HTTP/1.1\r\n\r\n", origin.url("/close/5000")).as_bytes());
    let r = c.read(false);
    assert_eq!((r.status, r.field("connection")), (200, Some("close")));
    assert_eq!(r.body, body_bytes(5000));
}

#[test]
fn splice_moves_bodies_of_every_framing() {
    // -s: Content-Length bodies (small ones are copied, big ones spliced)
    // and close-delimited ones; chunked ones are copied, as they must be
    // parsed. The connection goes on after each.
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start("splice_bodies", "", "-s");
    let trace = Strace::attach(&proxy, "splice");
    let mut c = HttpClient::connect(port);
    for n in [0, 10, 16383, 16384, 16385, 200_000, 1_000_003] {
        assert_eq!(
            c.get(&origin.url(&format!("/len/{n}"))).body,
            body_bytes(n),
            "{n}"
        );
        assert_eq!(
            c.get(&origin.url(&format!("/chunked/{n}"))).body,
            body_bytes(n),
            "{n}"
        );
        let body = body_bytes(n);
        c.send(
            format!(
                "POST {} HTTP/1.1\r\nContent-Length: {n}\r\n\r\n",
                origin.url("/sha")
            )
            .as_bytes(),
        );
        c.send(&body);
        let want = format!("{:x} {n}", Sha256::digest(&body));
        assert_eq!(text(&c.read(false).body), want);
    }
    c.send(format!("GET {} HTTP/1.1\r\n\r\n", origin.url("/close/300000")).as_bytes());
    let r = c.read(false);
    assert_eq!(r.field("connection"), Some("close"));
    assert_eq!(r.body, body_bytes(300_000));
    // The big bodies went through splice(2): the largest alone is more
    // than the copies could account for.
    trace.assert_moved(1_000_003);
}

#[test]
fn http10_client() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("http10", "", "");
    let mut c = HttpClient::connect(port);
    c.send(format!("GET {} HTTP/1.0\r\n\r\n", origin.url("/hello")).as_bytes());
    let r = c.read(false);
    assert_eq!((r.status, r.field("connection")), (200, Some("close")));
    c.assert_closed();
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "GET {} HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n",
            origin.url("/hello")
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert_eq!((r.status, r.field("connection")), (200, Some("keep-alive")));
    c.send(format!("GET {} HTTP/1.0\r\n\r\n", origin.url("/hello")).as_bytes());
    assert_eq!(c.read(false).body, b"hello");
}

// ---------------------------------------------------------------------------
// Keep-alive, pipelining, 100-continue

#[test]
fn keep_alive_reuses_one_origin_connection_per_host() {
    let a = HttpOrigin::start();
    let b = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("reuse", "", "");
    let mut c = HttpClient::connect(port);
    for _ in 0..3 {
        assert_eq!(c.get(&a.url("/hello")).body, b"hello");
    }
    // Another method to the same host stays on the same connection too.
    c.send(
        format!(
            "POST {} HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
            a.url("/sha")
        )
        .as_bytes(),
    );
    assert_eq!(c.read(false).status, 200);
    assert_eq!(a.conns(), 1);
    assert_eq!(c.get(&b.url("/hello")).body, b"hello");
    assert_eq!(b.conns(), 1);
    // Back to the first host: its connection waited in the shared pool.
    assert_eq!(c.get(&a.url("/hello")).body, b"hello");
    assert_eq!(a.conns(), 1);
    // curl, another client, with two URLs on one connection: it takes the
    // connection to b the first client parked.
    let (code, body) = curl(port, &[&b.url("/hello"), &b.url("/hello")]);
    assert_eq!((code, text(&body)), (200, "hello\n200hello".to_string()));
    assert_eq!(b.conns(), 1);
}

#[test]
fn origin_connections_are_shared_between_clients() {
    let a = HttpOrigin::start();
    let b = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("pool", "", "");
    // Client 1 leaves a's connection in the pool when it moves on to b.
    let mut c1 = HttpClient::connect(port);
    assert_eq!(c1.get(&a.url("/hello")).body, b"hello");
    assert_eq!(c1.get(&b.url("/hello")).body, b"hello");
    let mut c2 = HttpClient::connect(port);
    assert_eq!(c2.get(&a.url("/hello")).body, b"hello");
    assert_eq!(a.conns(), 1);
    // Two clients at once to one host need two connections.
    let mut c3 = HttpClient::connect(port);
    c3.send(
        format!(
            "POST {} HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
            a.url("/sha")
        )
        .as_bytes(),
    );
    assert_eq!(c2.get(&a.url("/hello")).body, b"hello");
    c3.send(b"hi");
    assert_eq!(c3.read(false).status, 200);
    assert_eq!(a.conns(), 2);
    // Connection-bound authentication never crosses clients.
    let mut c4 = HttpClient::connect(port);
    c4.send(
        format!(
            "GET {} HTTP/1.1\r\nAuthorization: NTLM TlRMTVNTUAABAAAA\r\n\r\n",
            b.url("/hello")
        )
        .as_bytes(),
    );
    assert_eq!(c4.read(false).status, 200);
    assert_eq!(c4.get(&a.url("/hello")).body, b"hello");
    // c4's connection to b (b's second; c1 holds the first) was not
    // parked, so c5 needs a third.
    let mut c5 = HttpClient::connect(port);
    assert_eq!(c5.get(&b.url("/hello")).body, b"hello");
    assert_eq!(b.conns(), 3);
}

#[test]
fn retries_once_when_the_kept_connection_was_closed() {
    // An origin that answers one request per connection but says nothing
    // about closing (it looks reusable).
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            line.clear();
        }
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    });
    let (_proxy, port, _) = PROXY.start("retry", "", "");
    let mut c = HttpClient::connect(port);
    let url = format!("http://127.0.0.1:{}/", origin.port());
    assert_eq!(c.get(&url).body, b"ok");
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.get(&url).body, b"ok");
    assert_eq!(origin.peers().len(), 2);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("pipeline", "", "");
    let mut c = HttpClient::connect(port);
    let mut all = Vec::new();
    for path in ["/len/3", "/sha", "/len/5", "/hello"] {
        if path == "/sha" {
            all.extend_from_slice(
                format!(
                    "POST {} HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
                    origin.url(path)
                )
                .as_bytes(),
            );
        } else {
            all.extend_from_slice(format!("GET {} HTTP/1.1\r\n\r\n", origin.url(path)).as_bytes());
        }
    }
    c.send(&all);
    assert_eq!(c.read(false).body, body_bytes(3));
    assert_eq!(
        text(&c.read(false).body),
        format!("{:x} 3", Sha256::digest(b"abc"))
    );
    assert_eq!(c.read(false).body, body_bytes(5));
    assert_eq!(c.read(false).body, b"hello");
}

#[test]
fn expect_100_continue_passes_through() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("continue", "", "");
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "PUT {} HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
            origin.url("/continue")
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert_eq!(r.status, 100);
    c.send(b"data");
    let r = c.read(false);
    assert_eq!(
        (r.status, text(&r.body)),
        (200, format!("{:x} 4", Sha256::digest(b"data")))
    );
    // curl waits for the 100 before it sends the body (here up to 10 s,
    // so that a 100 the proxy held back shows as a 10 s wait even on a
    // loaded machine); the origin's 100 must come through at once.
    let dir = Dir::new("continue_file");
    let data = body_bytes(2_000_000);
    let file = dir.write("body", &data);
    let t = Instant::now();
    let at_file = format!("@{}", p(&file));
    let (code, body) = curl(
        port,
        &[
            "-H",
            "Expect: 100-continue",
            "--expect100-timeout",
            "10",
            "-X",
            "PUT",
            "--data-binary",
            &at_file,
            &origin.url("/continue"),
        ],
    );
    assert_eq!(
        (code, text(&body)),
        (200, format!("{:x} 2000000", Sha256::digest(&data)))
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Tunnels

#[test]
fn connect_tunnels_bytes() {
    let echo = Origin::echo();
    let (proxy, port, _) = PROXY.start("connect", "", "");
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\nearly",
            echo.port(),
            echo.port()
        )
        .as_bytes(),
    );
    let mut line = String::new();
    c.r.read_line(&mut line).unwrap();
    assert_eq!(line, "HTTP/1.0 200 Connection established\r\n");
    c.r.read_line(&mut line).unwrap();
    let mut back = [0u8; 5];
    c.r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"early");
    c.send(b"more bytes");
    let mut back = [0u8; 10];
    c.r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"more bytes");
    c.w.shutdown(Shutdown::Write).unwrap();
    c.assert_closed();
    read_log_line(&log_of(&proxy), "the CONNECT", |l| {
        l.ends_with(&format!("CONNECT 127.0.0.1:{} HTTP/1.1", echo.port()))
    });
}

#[test]
fn connect_to_a_tls_origin_with_curl() {
    let dir = Dir::new("tls_origin");
    let key = dir.join("key.pem");
    let cert = dir.join("cert.pem");
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-keyout", p(&key), "-out", p(&cert)])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "openssl req failed");
    let tls_port = free_port();
    let mut server = Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-www",
            "-accept",
            &tls_port.to_string(),
            "-key",
            p(&key),
            "-cert",
            p(&cert),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run openssl s_server");
    assert!(wait_for(
        || TcpStream::connect(localhost(tls_port)).is_ok(),
        START_TIMEOUT
    ));
    let (_proxy, port, _) = PROXY.start("tls", "", "");
    let (code, body) = curl(port, &["-k", &format!("https://127.0.0.1:{tls_port}/")]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code, 200, "{}", text(&body));
    assert!(text(&body).contains("s_server"), "{}", text(&body));
}

#[test]
fn websocket_upgrade_passes_through() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("upgrade", "", "");
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "GET {} HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
            origin.url("/ws")
        )
        .as_bytes(),
    );
    let r = c.read(true);
    assert_eq!(r.status, 101, "{}", r.head);
    assert_eq!(r.field("upgrade"), Some("websocket"));
    let got = origin.heads();
    assert!(
        got[0].contains("\r\nUpgrade: websocket\r\n")
            && got[0].contains("\r\nConnection: upgrade\r\n"),
        "{}",
        got[0]
    );
    c.send(b"\x81\x05hello");
    let mut back = [0u8; 7];
    c.r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"\x81\x05hello");
}

// ---------------------------------------------------------------------------
// Refusals: smuggling shapes, oversized heads

/// Sends `req`, expects `status` and a closed connection, and that the
/// origin saw no request.
fn refused(name: &str, req: impl Fn(u16) -> Vec<u8>, status: u16) {
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start(name, "", "");
    let mut c = HttpClient::connect(port);
    c.send(&req(origin.port()));
    let r = c.read(false);
    assert_eq!(r.status, status, "{}", r.head);
    assert_eq!(r.field("connection"), Some("close"));
    assert!(text(&r.body).contains(&status.to_string()));
    c.assert_closed();
    assert!(
        origin.heads().is_empty(),
        "the origin got {:?}",
        origin.heads()
    );
    read_log_line(&log_of(&proxy), "a refusal record", |l| {
        l.starts_with("PROXY 005")
    });
}

fn post(port: u16, fields: &str, body: &str) -> Vec<u8> {
    format!("POST http://127.0.0.1:{port}/sha HTTP/1.1\r\n{fields}\r\n{body}").into_bytes()
}

#[test]
fn refuses_content_length_with_transfer_encoding() {
    refused(
        "cl_te",
        |o| {
            post(
                o,
                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            )
        },
        400,
    );
}

#[test]
fn refuses_differing_content_lengths() {
    refused(
        "cl_cl",
        |o| post(o, "Content-Length: 4\r\nContent-Length: 5\r\n", "abcde"),
        400,
    );
}

#[test]
fn refuses_obs_fold() {
    refused(
        "obsfold",
        |o| post(o, "X-A: 1\r\n folded\r\nContent-Length: 1\r\n", "a"),
        400,
    );
}

#[test]
fn refuses_unknown_transfer_coding() {
    refused(
        "te_gzip",
        |o| post(o, "Transfer-Encoding: gzip\r\n", ""),
        400,
    );
}

#[test]
fn refuses_oversized_heads() {
    let big = "a".repeat(70 * 1024);
    refused(
        "bighead",
        move |o| format!("GET http://127.0.0.1:{o}/ HTTP/1.1\r\nX-Big: {big}\r\n\r\n").into_bytes(),
        431,
    );
}

#[test]
fn refuses_garbage_and_https_urls() {
    refused("garbage", |_| b"HELLO WORLD\r\n\r\n".to_vec(), 400);
    refused(
        "https_url",
        |o| format!("GET https://127.0.0.1:{o}/ HTTP/1.1\r\n\r\n").into_bytes(),
        400,
    );
    refused("no_host", |_| b"GET / HTTP/1.1\r\n\r\n".to_vec(), 400);
}

#[test]
fn refuses_a_bad_chunk_size_and_closes() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("badchunk", "", "");
    let mut c = HttpClient::connect(port);
    c.send(&post(
        origin.port(),
        "Transfer-Encoding: chunked\r\n",
        "zz\r\nhello\r\n0\r\n\r\n",
    ));
    let r = c.read(false);
    assert_eq!(r.status, 400);
    c.assert_closed();
    // A bad size after the head went out: the origin sees the connection
    // close; the client gets no answer it could mistake for the origin's.
    let mut c = HttpClient::connect(port);
    c.send(&post(
        origin.port(),
        "Transfer-Encoding: chunked\r\n",
        "5\r\nhello\r\n",
    ));
    thread::sleep(Duration::from_millis(100));
    c.send(b"zz\r\n");
    let rest = read_until_closed(&mut c.r).unwrap();
    assert!(rest.is_empty(), "{}", text(&rest));
}

// ---------------------------------------------------------------------------
// Error answers

#[test]
fn dead_origin_is_502() {
    let dead = free_port();
    let (proxy, port, _) = PROXY.start("dead", "", "");
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://127.0.0.1:{dead}/"));
    assert_eq!(r.status, 502);
    c.assert_closed();
    read_log_line(&log_of(&proxy), "a 13 record", |l| {
        l.starts_with("PROXY 00013")
    });
}

#[test]
fn silent_origin_is_504() {
    let origin = HttpOrigin::start();
    // STRING_LONG (the 4th value) is how long the origin may think.
    let (proxy, port, _) = PROXY.start("silent", "timeouts 1 5 30 1 180 1800 15 60 15 5 1", "");
    let mut c = HttpClient::connect(port);
    let t = Instant::now();
    let r = c.get(&origin.url("/silent"));
    assert_eq!(r.status, 504);
    assert!(t.elapsed() < Duration::from_secs(5));
    c.assert_closed();
    read_log_line(&log_of(&proxy), "a 92 record", |l| {
        l.starts_with("PROXY 00092")
    });
}

#[test]
fn origin_that_breaks_is_502() {
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        let mut b = [0u8; 1024];
        let _ = conn.read(&mut b);
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Le");
    });
    let (_proxy, port, _) = PROXY.start("broken", "", "");
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://127.0.0.1:{}/", origin.port()));
    assert_eq!(r.status, 502);
}

#[test]
fn loop_to_itself_is_503() {
    let (_proxy, port, _) = PROXY.start("loop", "", "");
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://127.0.0.1:{port}/"));
    assert_eq!(r.status, 503);
}

#[test]
fn auth_strong_asks_then_accepts_the_password() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("auth", "auth strong\nusers u:CL:p\nallow u\ndeny *", "");
    let mut c = HttpClient::connect(port);
    let r = c.get(&origin.url("/hello"));
    assert_eq!(r.status, 407);
    assert_eq!(r.field("proxy-authenticate"), Some("Basic realm=\"proxy\""));
    c.assert_closed();
    let mut c = HttpClient::connect(port);
    // u:wrong
    c.send(
        format!(
            "GET {} HTTP/1.1\r\nProxy-Authorization: Basic dTp3cm9uZw==\r\n\r\n",
            origin.url("/hello")
        )
        .as_bytes(),
    );
    assert_eq!(c.read(false).status, 407);
    let mut c = HttpClient::connect(port);
    // u:p
    c.send(
        format!(
            "GET {} HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\n\r\n",
            origin.url("/head")
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert_eq!(r.status, 200);
    assert!(
        !text(&r.body).contains("Proxy-Authorization"),
        "{}",
        text(&r.body)
    );
    let (code, _) = curl(port, &["-U", "u:p", &origin.url("/hello")]);
    assert_eq!(code, 200);
}

#[test]
fn acl_deny_is_403() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start(
        "deny",
        &format!("deny * * 127.0.0.1 {}\nallow *", origin.port()),
        "",
    );
    let mut c = HttpClient::connect(port);
    let r = c.get(&origin.url("/hello"));
    assert_eq!(r.status, 403);
    c.assert_closed();
    assert!(origin.heads().is_empty());
}

/// A host pattern sees the host as the client wrote it, as in 3proxy:
/// `*calhost` refuses `localhost` but not the address `127.0.0.1`, and
/// `%n` logs that address as written (no brackets; an IPv6 literal has
/// them, as 3proxy prints a host with a ':').
#[test]
fn host_pattern_sees_the_request_text_and_n_logs_it() {
    let origin = HttpOrigin::start();
    let (proxy, port, _) = PROXY.start("hostpat", "deny * * *calhost\nallow *", "");
    let log = log_of(&proxy);
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://localhost:{}/hello", origin.port()));
    assert_eq!(r.status, 403, "localhost matches *calhost");
    let mut c = HttpClient::connect(port);
    let r = c.get(&origin.url("/hello"));
    assert_eq!(
        (r.status, r.body),
        (200, b"hello".to_vec()),
        "127.0.0.1 is not a name ending in calhost"
    );
    let line = read_log_line(&log, "of the 127.0.0.1 request", |l| {
        l.starts_with("PROXY 00000 ") && l.contains(" GET http://127.0.0.1:")
    });
    let host = line.split_whitespace().nth(4).unwrap();
    assert_eq!(host, "127.0.0.1", "%n in {line:?}");
}

// ---------------------------------------------------------------------------
// Concurrency

#[test]
fn a_slow_client_does_not_hold_up_others() {
    let origin = HttpOrigin::start();
    let (_proxy, port, _) = PROXY.start("slow", "", "");
    let url = origin.url("/hello");
    let slow = thread::spawn(move || {
        let mut c = HttpClient::connect(port);
        for b in format!("GET {url} HTTP/1.1\r\n\r\n").bytes().take(4) {
            c.send(&[b]);
            thread::sleep(Duration::from_secs(1));
        }
    });
    thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    for _ in 0..20 {
        let mut c = HttpClient::connect(port);
        assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    }
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    slow.join().unwrap();
}

// ---------------------------------------------------------------------------
// Limits and log options from the access layer

#[test]
fn bandlimin_slows_a_download() {
    let origin = HttpOrigin::start();
    // 4 Mbit/s: 1 MB takes about 2 s.
    let (_proxy, port, _) = PROXY.start("bandlim", "bandlimin 4000000 *", "");
    let mut c = HttpClient::connect(port);
    let t = Instant::now();
    let r = c.get(&origin.url("/len/1000000"));
    assert_eq!(r.body, body_bytes(1_000_000));
    let took = t.elapsed();
    assert!(took > Duration::from_millis(1200), "took {took:?}");
}

#[test]
fn nolog_requests_leave_no_record() {
    let origin = HttpOrigin::start();
    let cfg = "allow * * * * HTTP_HEAD\nnolog\nallow *";
    let (proxy, port, _) = PROXY.start("nolog", cfg, "");
    let mut c = HttpClient::connect(port);
    c.send(format!("HEAD {} HTTP/1.1\r\n\r\n", origin.url("/hello")).as_bytes());
    assert_eq!(c.read(true).status, 200);
    assert_eq!(c.get(&origin.url("/len/7")).body, body_bytes(7));
    let log = log_of(&proxy);
    read_log_line(&log, "the GET", |l| l.ends_with("/len/7 HTTP/1.1"));
    assert!(
        !log_lines(&log).iter().any(|l| l.contains("HEAD ")),
        "{:?}",
        log_lines(&log)
    );
}

#[test]
fn a_request_after_a_nolog_one_has_its_own_record() {
    // `nolog` is the request's, not the connection's: the next request
    // on the same connection, refused before any ACL entry is reached,
    // is logged.
    let origin = HttpOrigin::start();
    let cfg = "allow * * * * HTTP_HEAD\nnolog\nallow *";
    let (proxy, port, _) = PROXY.start("nolog_next", cfg, "");
    let mut c = HttpClient::connect(port);
    c.send(format!("HEAD {} HTTP/1.1\r\n\r\n", origin.url("/hello")).as_bytes());
    assert_eq!(c.read(true).status, 200);
    c.send(b"GET /no-host HTTP/1.1\r\n\r\n");
    assert_eq!(c.read(false).status, 400);
    let log = log_of(&proxy);
    let line = read_log_line(&log, "the bad request", |l| l.contains("/no-host"));
    assert!(line.starts_with("PROXY 00"), "{line}");
    assert!(
        !log_lines(&log).iter().any(|l| l.contains("HEAD ")),
        "{:?}",
        log_lines(&log)
    );
}

// ---------------------------------------------------------------------------
// Parent proxies

/// Service, code, hops, user, client address, text.
const CHAIN_FMT: &str = "L%N %E %h %U %C:%c %T";

/// client -> A -http-> B: B is our proxy with `auth strong` for user
/// carol (password pw1), A has B as its `http` parent and gives it
/// carol's name with `password`. Returns A's port, then A and B with
/// their logs.
fn carol_chain(
    name: &str,
    password: &str,
) -> (
    u16,
    (Proxy, std::path::PathBuf),
    (Proxy, std::path::PathBuf),
) {
    let (pa, pb) = (free_port(), free_port());
    let b_cfg = format!(
        "users carol:CL:pw1\nauth strong\nallow carol\n{}",
        proxy_on(pb)
    );
    let b = start(Dir::new(&format!("{name}_b")), CHAIN_FMT, &b_cfg, &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 http 127.0.0.1 {pb} carol {password}\n{}",
        proxy_on(pa)
    );
    let a = start(Dir::new(&format!("{name}_a")), CHAIN_FMT, &a_cfg, &[pa]);
    (pa, a, b)
}

fn proxy_on(port: u16) -> String {
    format!("proxy -i127.0.0.1 -p{port}\n")
}

/// The records of `log` whose text contains `what`, once there are `n`.
fn records(log: &std::path::Path, what: &str, n: usize) -> Vec<String> {
    let get = || -> Vec<String> {
        log_lines(log)
            .into_iter()
            .filter(|l| l.contains(what))
            .collect()
    };
    wait_for(|| get().len() >= n, LOG_TIMEOUT);
    get()
}

/// The client address:port of a [`CHAIN_FMT`] record.
fn client_of(record: &str) -> String {
    record.split(' ').nth(4).unwrap_or("").to_string()
}

#[test]
fn requests_through_an_http_parent_keep_their_chain() {
    // client -> A -http-> B (our own proxy, with auth) -> origins. A sends
    // B absolute-form requests with B's credentials; the connection to B
    // serves the next requests, to any host.
    let origin = HttpOrigin::start();
    let other = HttpOrigin::start();
    let (pa, (_a, log_a), (_b, log_b)) = carol_chain("ph", "pw1");

    let mut c = HttpClient::connect(pa);
    let r = c.get(&origin.url("/head"));
    assert_eq!(r.status, 200);
    let head = text(&r.body);
    // B rewrote the request for the origin: origin form, no credentials.
    assert!(head.starts_with("GET /head HTTP/1.1\r\n"), "{head}");
    assert!(!head.contains("Proxy-Authorization"), "{head}");
    // Origin form from the client works too (transparent use).
    c.send(
        format!(
            "GET /len/9 HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
            origin.port()
        )
        .as_bytes(),
    );
    assert_eq!(c.read(false).body, body_bytes(9));
    // Another host: the same connection to B.
    assert_eq!(c.get(&other.url("/hello")).body, b"hello");
    // POST with a body.
    c.send(
        format!(
            "POST {} HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde",
            other.url("/sha")
        )
        .as_bytes(),
    );
    let r = c.read(false);
    assert!(text(&r.body).ends_with(" 5"), "{}", text(&r.body));
    drop(c);

    let at_b = records(&log_b, "http://127.0.0.1:", 4);
    assert_eq!(at_b.len(), 4, "{at_b:?}");
    assert!(
        at_b.iter().all(|l| l.starts_with("PROXY 00000 0 carol ")),
        "{at_b:?}"
    );
    assert!(
        at_b[0].ends_with(&format!("GET {} HTTP/1.1", origin.url("/head"))),
        "{at_b:?}"
    );
    assert!(
        at_b[1].ends_with(&format!(
            "GET http://127.0.0.1:{}/len/9 HTTP/1.1",
            origin.port()
        )),
        "{at_b:?}"
    );
    let from = client_of(&at_b[0]);
    assert!(
        at_b.iter().all(|l| client_of(l) == from),
        "one connection from A: {at_b:?}"
    );
    let at_a = records(&log_a, " HTTP/1.1", 4);
    assert!(
        at_a.iter().all(|l| l.starts_with("PROXY 00000 1 ")),
        "{at_a:?}"
    );
}

#[test]
fn an_http_parent_refusing_the_credentials_is_its_answer() {
    // A parent's own answer (here 407) reaches the client as it is.
    let origin = HttpOrigin::start();
    let (pa, _a, _b) = carol_chain("ph407", "wrong");
    let mut c = HttpClient::connect(pa);
    assert_eq!(c.get(&origin.url("/hello")).status, 407);
    assert!(origin.heads().is_empty());
}

#[test]
fn requests_through_a_socks5_parent() {
    // client -> A -socks5-> B -> origin: the chain reaches one host and
    // serves the client's next requests to it; another host takes a new
    // chain.
    let origin = HttpOrigin::start();
    let other = HttpOrigin::start();
    let (pa, pb) = (free_port(), free_port());
    let (_b, log_b) = start(
        Dir::new("ps_b"),
        CHAIN_FMT,
        &format!("socks -i127.0.0.1 -p{pb}\n"),
        &[pb],
    );
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        proxy_on(pa)
    );
    let (_a, log_a) = start(Dir::new("ps_a"), CHAIN_FMT, &a_cfg, &[pa]);
    let mut c = HttpClient::connect(pa);
    for _ in 0..3 {
        assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    }
    assert_eq!(c.get(&other.url("/len/100")).body, body_bytes(100));
    drop(c);
    assert_eq!(origin.conns(), 1);
    let connects = records(&log_b, "CONNECT 127.0.0.1:", 2);
    assert_eq!(connects.len(), 2, "{connects:?}");
    assert!(connects[0].starts_with("SOCK5 00000 0 - "), "{connects:?}");
    let at_a = records(&log_a, "http://127.0.0.1:", 4);
    assert!(
        at_a.iter().all(|l| l.starts_with("PROXY 00000 1 ")),
        "{at_a:?}"
    );
    // The origin saw B: the socks5 parent connected, not A.
    assert!(origin.heads()[0].starts_with("GET /hello HTTP/1.1"));
}

#[test]
fn connect_through_parents() {
    let echo = Origin::echo();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (_b, log_b) = start(Dir::new("pc_b"), CHAIN_FMT, &proxy_on(pb), &[pb]);
    let (_c, log_c) = start(
        Dir::new("pc_c"),
        CHAIN_FMT,
        &format!("socks -i127.0.0.1 -p{pc}\n"),
        &[pc],
    );
    // A: CONNECT through the http parent B; another entry (by port) sends
    // CONNECTs through the socks5 parent C.
    let a_cfg = format!(
        "allow * * * {}\nparent 1000 http 127.0.0.1 {pb} u p\nallow *\nparent 1000 socks5 127.0.0.1 {pc}\n{}",
        echo.port(),
        proxy_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pc_a"), CHAIN_FMT, &a_cfg, &[pa]);
    for host in ["127.0.0.1", "localhost"] {
        let mut c = HttpClient::connect(pa);
        c.send(format!("CONNECT {host}:{} HTTP/1.1\r\n\r\nearly", echo.port()).as_bytes());
        let mut line = String::new();
        c.r.read_line(&mut line).unwrap();
        assert_eq!(line, "HTTP/1.0 200 Connection established\r\n");
        c.r.read_line(&mut line).unwrap();
        let mut back = [0u8; 5];
        c.r.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"early");
        echo_roundtrip(&mut c.w, b"through B");
    }
    let at_b = records(&log_b, "CONNECT ", 2);
    assert!(
        at_b.iter()
            .any(|l| l.contains(&format!("CONNECT localhost:{} HTTP/1.1", echo.port()))),
        "{at_b:?}"
    );
    // B was given the parent credentials: u is its logged user.
    assert!(
        at_b.iter().all(|l| l.starts_with("PROXY 00000 0 u ")),
        "{at_b:?}"
    );
    // Now through C: a port the first entry does not match.
    let other = Origin::echo();
    let mut c = HttpClient::connect(pa);
    c.send(format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", other.port()).as_bytes());
    let mut line = String::new();
    c.r.read_line(&mut line).unwrap();
    assert_eq!(line, "HTTP/1.0 200 Connection established\r\n");
    c.r.read_line(&mut line).unwrap();
    echo_roundtrip(&mut c.w, b"through C");
    drop(c);
    records(&log_c, &format!("CONNECT 127.0.0.1:{}", other.port()), 1);
    let at_a = records(&log_a, "CONNECT ", 3);
    assert!(
        at_a.iter().all(|l| l.starts_with("PROXY 00000 1 ")),
        "{at_a:?}"
    );
}

#[test]
fn a_local_http_redirection_serves_the_request_here() {
    // `parent http 0.0.0.0 0` in the proxy's own ACL: the request is
    // served by this handler, on a second ACL pass that skips the entry.
    let origin = HttpOrigin::start();
    let pa = free_port();
    let cfg = format!(
        "allow *\nparent 1000 http 0.0.0.0 0\nallow *\n{}",
        proxy_on(pa)
    );
    let (_a, log) = start(Dir::new("plocal"), CHAIN_FMT, &cfg, &[pa]);
    let mut c = HttpClient::connect(pa);
    assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    assert_eq!(c.get(&origin.url("/hello")).body, b"hello");
    let rec = records(&log, "/hello", 2);
    assert!(
        rec.iter().all(|l| l.starts_with("PROXY 00000 1 ")),
        "{rec:?}"
    );
    // Alone, it cannot be served: refused as when no entry matches (407),
    // not looped.
    let pb = free_port();
    let cfg = format!("allow *\nparent 1000 http 0.0.0.0 0\n{}", proxy_on(pb));
    let (_b, _log) = start(Dir::new("plocal2"), CHAIN_FMT, &cfg, &[pb]);
    let mut c = HttpClient::connect(pb);
    assert_eq!(c.get(&origin.url("/hello")).status, 407);
}

#[test]
fn a_parent_that_is_down_is_502() {
    let origin = HttpOrigin::start();
    let down = free_port();
    let pa = free_port();
    let a_cfg = format!(
        "allow *\nparent 1000 http 127.0.0.1 {down}\n{}",
        proxy_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pdown_a"), CHAIN_FMT, &a_cfg, &[pa]);
    let mut c = HttpClient::connect(pa);
    assert_eq!(c.get(&origin.url("/hello")).status, 502);
    c.assert_closed();
    records(&log_a, "/hello", 1)
        .iter()
        .for_each(|l| assert!(l.starts_with("PROXY 00013 "), "{l}"));
    // A parent that answers nonsense: 3proxy's parent codes, and the page
    // says so.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            drop(s);
        }
    });
    let pa2 = free_port();
    let a2_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {bad}\n{}",
        proxy_on(pa2)
    );
    let (_a2, log_a2) = start(Dir::new("pdown_a2"), CHAIN_FMT, &a2_cfg, &[pa2]);
    let mut c = HttpClient::connect(pa2);
    let r = c.get(&origin.url("/hello"));
    assert_eq!(r.status, 502);
    assert!(
        text(&r.body).contains("Failed to connect parent proxy"),
        "{}",
        text(&r.body)
    );
    let rec = records(&log_a2, "/hello", 1);
    assert!(rec[0].starts_with("PROXY 00052 "), "{rec:?}");
    assert!(origin.heads().is_empty());
}

// ---------------------------------------------------------------------------
// Reload

#[test]
fn force_cuts_connect_and_upgrade_tunnels() {
    // After a reload whose ACL denies them, a CONNECT tunnel and an
    // upgraded connection end when data next moves (`force`, the default).
    let echo = Origin::echo();
    let origin = HttpOrigin::start();
    let dir = Dir::new("force_tunnels");
    let port = free_port();
    let log = dir.join("proxy.log");
    let cfg = |acl: &str| {
        format!(
            "log {}\nlogformat \"L%N %E %T\"\n{acl}\nproxy -p{port} -i127.0.0.1\n",
            p(&log)
        )
    };
    let text = cfg("allow *");
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(port))]);

    let mut tunnel = HttpClient::connect(port);
    tunnel.send(format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port()).as_bytes());
    let r = tunnel.read(true);
    assert_eq!(r.status, 200);
    echo_roundtrip(&mut tunnel.w, b"before");
    let mut ws = HttpClient::connect(port);
    ws.send(
        format!(
            "GET {} HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            origin.url("/ws")
        )
        .as_bytes(),
    );
    assert_eq!(ws.read(true).status, 101);
    ws.send(b"before");
    let mut b = [0u8; 6];
    ws.r.read_exact(&mut b).unwrap();

    proxy
        .dir
        .write("3proxy.cfg", cfg("deny * * 127.0.0.1\nallow *"));
    proxy.signal("USR1");
    let refused = || {
        let mut c = HttpClient::connect(port);
        c.send(format!("GET {} HTTP/1.1\r\n\r\n", origin.url("/hello")).as_bytes());
        c.try_read(false).is_ok_and(|r| r.status == 403)
    };
    assert!(
        wait_for(refused, START_TIMEOUT),
        "the new ACL never took effect"
    );
    for (c, name) in [(&mut tunnel, "CONNECT"), (&mut ws, "Upgrade")] {
        set_timeouts(&c.w, IO_TIMEOUT);
        let _ = c.w.write_all(b"after");
        let mut buf = [0u8; 5];
        let alive = matches!(c.r.read_exact(&mut buf), Ok(())) && &buf == b"after";
        assert!(!alive, "the denied {name} tunnel went on");
    }
    // Each ends with the refusal's code (1: denied).
    read_log_line(&log, "the CONNECT's record", |l| {
        l.starts_with("PROXY 00001 CONNECT ")
    });
    read_log_line(&log, "the Upgrade's record", |l| {
        l.starts_with("PROXY 00001 GET ") && l.contains("/ws")
    });
}

// ---------------------------------------------------------------------------
// Credentials in the request URL

/// The head the `/head` route echoed, for a raw `GET uri` through `port`.
fn head_via(port: u16, uri: &str, fields: &str) -> (u16, String) {
    let mut c = HttpClient::connect(port);
    c.send(format!("GET {uri} HTTP/1.1\r\nHost: ignored\r\n{fields}\r\n").as_bytes());
    let r = c.read(false);
    (r.status, text(&r.body))
}

#[test]
fn url_credentials_go_to_the_origin_as_authorization() {
    let origin = HttpOrigin::start();
    let op = origin.port();
    let (_proxy, port, _) = PROXY.start("url_creds", "", "");
    // A raw request: the credentials leave the request line and Host.
    let (status, head) = head_via(
        port,
        &format!("http://alice:secret@127.0.0.1:{op}/head"),
        "",
    );
    assert_eq!(status, 200);
    assert!(
        head.starts_with(&format!("GET /head HTTP/1.1\r\nHost: 127.0.0.1:{op}\r\n")),
        "{head}"
    );
    assert_eq!(
        field_values(&head, "authorization"),
        ["Basic YWxpY2U6c2VjcmV0"]
    );
    assert!(!head.contains("alice") && !head.contains('@'), "{head}");
    // Percent-encoded, with an `@` in the user name: split at the last `@`.
    let (_, head) = head_via(port, &format!("http://a%40b.c:pw@127.0.0.1:{op}/head"), "");
    assert_eq!(field_values(&head, "authorization"), ["Basic YUBiLmM6cHc="]);
    // The client's own Authorization stays; the URL's comes after it.
    let (_, head) = head_via(
        port,
        &format!("http://alice:secret@127.0.0.1:{op}/head"),
        "Authorization: Bearer t\r\n",
    );
    assert_eq!(
        field_values(&head, "authorization"),
        ["Bearer t", "Basic YWxpY2U6c2VjcmV0"]
    );
    // curl sends URL credentials as a field itself; the origin sees them
    // once, the same way.
    let url = format!("http://alice:secret@127.0.0.1:{op}/head");
    let (code, body) = curl(port, &[&url]);
    assert_eq!(code, 200);
    let head = text(&body);
    assert_eq!(
        field_values(&head, "authorization"),
        ["Basic YWxpY2U6c2VjcmV0"]
    );
    assert!(head.starts_with("GET /head HTTP/1.1\r\n"), "{head}");
    // Nothing before the `@`: 3proxy's 100, 502, and nothing sent.
    let before = origin.heads().len();
    let mut c = HttpClient::connect(port);
    let r = c.get(&format!("http://@127.0.0.1:{op}/head"));
    assert_eq!(r.status, 502);
    assert_eq!(origin.heads().len(), before);
}

#[test]
fn url_login_form_authenticates_against_users() {
    let origin = HttpOrigin::start();
    let op = origin.port();
    let (_proxy, port, _) = PROXY.start(
        "url_login",
        "auth strong\nusers alice:CL:pw\nallow alice\ndeny *",
        "",
    );
    let (status, head) = head_via(
        port,
        &format!("http://alice:pw:eu:ep@127.0.0.1:{op}/head"),
        "",
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(field_values(&head, "authorization"), ["Basic ZXU6ZXA="]);
    assert!(!head.contains("alice"), "{head}");
    let (status, _) = head_via(
        port,
        &format!("http://alice:bad:eu:ep@127.0.0.1:{op}/head"),
        "",
    );
    assert_eq!(status, 407);
    // Two fields only are the destination's credentials, not a login.
    let (status, _) = head_via(port, &format!("http://alice:pw@127.0.0.1:{op}/head"), "");
    assert_eq!(status, 407);
    // Proxy-Authorization wins over the URL's login (alice:bad).
    let (status, _) = head_via(
        port,
        &format!("http://alice:pw:eu:ep@127.0.0.1:{op}/head"),
        "Proxy-Authorization: Basic YWxpY2U6YmFk\r\n",
    );
    assert_eq!(status, 407);
    // CONNECT takes the same form.
    let echo = Origin::echo();
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "CONNECT alice:pw:eu:ep@127.0.0.1:{} HTTP/1.1\r\n\r\n",
            echo.port()
        )
        .as_bytes(),
    );
    assert_eq!(c.read(true).status, 200);
    echo_roundtrip(&mut c.w, b"tunnel");
    let mut c = HttpClient::connect(port);
    c.send(
        format!(
            "CONNECT alice:no:eu:ep@127.0.0.1:{} HTTP/1.1\r\n\r\n",
            echo.port()
        )
        .as_bytes(),
    );
    assert_eq!(c.read(true).status, 407);
}

#[test]
fn url_login_form_is_plain_credentials_with_u() {
    // `-u`: the service never asks for a user, so all of
    // `pu:pp:eu:ep` is for the destination (user pu, password pp:eu:ep).
    let origin = HttpOrigin::start();
    let op = origin.port();
    let (_proxy, port, _) = PROXY.start("url_login_u", "", "-u");
    let (status, head) = head_via(port, &format!("http://pu:pp:eu:ep@127.0.0.1:{op}/head"), "");
    assert_eq!(status, 200);
    assert_eq!(
        field_values(&head, "authorization"),
        ["Basic cHU6cHA6ZXU6ZXA="]
    );
}

#[test]
fn delimchar_splits_url_credentials() {
    let origin = HttpOrigin::start();
    let op = origin.port();
    let (_proxy, port, _) = PROXY.start("url_delimchar", "delimchar #", "");
    let (status, head) = head_via(port, &format!("http://a@b.c:pw#127.0.0.1:{op}/head"), "");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.starts_with(&format!("GET /head HTTP/1.1\r\nHost: 127.0.0.1:{op}\r\n")),
        "{head}"
    );
    assert_eq!(field_values(&head, "authorization"), ["Basic YUBiLmM6cHc="]);
    // An `@` and no `#`: no host to split off.
    let (status, _) = head_via(port, &format!("http://u:p@127.0.0.1:{op}/head"), "");
    assert_eq!(status, 502);
}

#[test]
fn url_credentials_go_to_an_http_parent_as_proxy_authorization() {
    // A parent that records the head it got and answers 200.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let tx = Mutex::new(tx);
    let parent = Origin::start("127.0.0.1:0", move |conn| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let _ = tx.lock().unwrap().send(head);
        let mut w = conn;
        let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    });
    let (_proxy, port, _) = PROXY.start(
        "url_creds_parent",
        &format!("allow *\nparent 1000 http 127.0.0.1 {}", parent.port()),
        "",
    );
    // Nothing listens there: only the parent is asked.
    let dst = free_port();
    let (status, _) = head_via(port, &format!("http://alice:secret@127.0.0.1:{dst}/x"), "");
    assert_eq!(status, 200);
    let head = rx
        .recv_timeout(IO_TIMEOUT)
        .expect("the parent got a request");
    assert!(
        head.starts_with(&format!("GET http://127.0.0.1:{dst}/x HTTP/1.1\r\n")),
        "{head}"
    );
    assert_eq!(
        field_values(&head, "proxy-authorization"),
        ["Basic YWxpY2U6c2VjcmV0"]
    );
    assert!(field_values(&head, "authorization").is_empty(), "{head}");
}

/// A client that writes a POST's head and its body apart, with Nagle's
/// algorithm on, sends the body once the head is acknowledged; the origin
/// here answers the same way (head, then body, then it closes). On these
/// new connections neither waits for a delayed ACK of ours (40 ms each
/// way when the proxy held its ACKs back to let them ride on its next
/// bytes). Kept connections: the next test.
#[test]
fn a_request_and_an_answer_written_in_two_parts_are_not_delayed() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let oport = l.local_addr().unwrap().port();
    let origin = thread::spawn(move || {
        for _ in 0..5 {
            let Ok((c, _)) = l.accept() else { return };
            c.set_nodelay(false).unwrap();
            c.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut w = c;
            let Some(body) = read_rest_and_body(&mut r) else {
                return;
            };
            let answer = format!("{} {}", String::from_utf8_lossy(&body), body.len());
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                answer.len()
            );
            w.write_all(head.as_bytes()).unwrap();
            w.write_all(answer.as_bytes()).unwrap();
        }
    });
    let dir = Dir::new("http_split_writes");
    let port = free_port();
    let cfg = format!("log /dev/null\nproxy -i127.0.0.1 -p{port}\n");
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut s = connect(localhost(port));
        s.set_nodelay(false).unwrap();
        set_timeouts(&s, IO_TIMEOUT);
        let head = format!(
            "POST http://127.0.0.1:{oport}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(b"abcde").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
        assert!(out.ends_with("abcde 5"), "{out}");
        times.push(t.elapsed());
    }
    origin.join().unwrap();
    times.sort();
    assert!(
        times[2] < Duration::from_millis(25),
        "requests took {times:?}: held by a delayed ACK"
    );
}

/// The rest of a message's head (an origin reads a request's whole
/// head; a client, having read the status line, the response's fields),
/// then the body its Content-Length names. None at the end of the
/// connection.
fn read_rest_and_body(r: &mut BufReader<std::net::TcpStream>) -> Option<Vec<u8>> {
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    Some(body)
}

/// The same on connections kept for many requests, both of them: after an
/// exchange or two Linux delays its ACKs on a kept connection (expecting
/// them to ride on the next bytes), so a client that writes a POST's head
/// and body apart, and an origin that writes its answer's head and body
/// apart, each with Nagle's algorithm on, would wait up to 40 ms for an
/// ACK of ours before their second write. The proxy acknowledges a head
/// at once when it has to wait for the rest (`Stream::ack_now`).
#[test]
fn kept_connections_written_to_in_two_parts_are_not_delayed() {
    const N: usize = 20;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let oport = l.local_addr().unwrap().port();
    let origin = thread::spawn(move || {
        let Ok((c, _)) = l.accept() else { return 0 };
        c.set_nodelay(false).unwrap();
        c.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut w = c;
        let mut served = 0;
        loop {
            let Some(body) = read_rest_and_body(&mut r) else {
                return served;
            };
            let answer = format!("{} {served}", String::from_utf8_lossy(&body));
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                answer.len()
            );
            w.write_all(head.as_bytes()).unwrap();
            w.write_all(answer.as_bytes()).unwrap();
            served += 1;
        }
    });
    let dir = Dir::new("http_split_writes_kept");
    let port = free_port();
    let cfg = format!("log /dev/null\nproxy -i127.0.0.1 -p{port}\n");
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let s = connect(localhost(port));
    s.set_nodelay(false).unwrap();
    set_timeouts(&s, IO_TIMEOUT);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut times = Vec::new();
    for i in 0..N {
        let t = Instant::now();
        let head = format!(
            "POST http://127.0.0.1:{oport}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Content-Length: 5\r\n\r\n"
        );
        w.write_all(head.as_bytes()).unwrap();
        w.write_all(b"abcde").unwrap();
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200 "), "request {i}: {status}");
        let body = read_rest_and_body(&mut r).expect("a response");
        assert_eq!(body, format!("abcde {i}").as_bytes(), "request {i}");
        times.push(t.elapsed());
    }
    drop((r, w));
    assert_eq!(origin.join().unwrap(), N, "one origin connection for all");
    times.sort();
    assert!(
        times[N / 2] < Duration::from_millis(20),
        "requests took {times:?}: held by a delayed ACK"
    );
}
