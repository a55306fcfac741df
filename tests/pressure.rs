//! Under pressure (issue 34): a service at `maxconn` gives a waiting
//! client the slot of an idle kept-alive client first, then of the
//! slowest head (`reclaim`), never of a busy one; heads and handshakes
//! slower than `minrate` are closed after its grace. Against a real
//! nginx origin, with curl as the ordinary client.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// The services' records: code, client port, request text.
const FMT: &str = "L%N %E %c %T";

/// A plain nginx origin answering `200 ok\n` on every path.
struct Nginx {
    child: Child,
    port: u16,
}

impl Nginx {
    fn start(dir: &Dir) -> Nginx {
        let root = dir.join("nginx-root");
        for t in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            fs::create_dir_all(root.join(t)).unwrap();
        }
        let port = free_port();
        let r = p(&root);
        // SAFETY: geteuid only reads the process's credentials.
        let user = if unsafe { libc::geteuid() } == 0 {
            "user root;"
        } else {
            ""
        };
        let conf = format!(
            r#"{user}
worker_processes 1;
error_log {r}/error.log info;
pid {r}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {r}/body;
  proxy_temp_path {r}/proxy;
  fastcgi_temp_path {r}/fastcgi;
  uwsgi_temp_path {r}/uwsgi;
  scgi_temp_path {r}/scgi;
  server {{
    listen 127.0.0.1:{port};
    default_type text/plain;
    location / {{ return 200 "ok\n"; }}
  }}
}}
"#
        );
        let conf_path = dir.write("nginx.conf", conf);
        let child = Command::new(sbin("nginx"))
            .args(["-p", r, "-c", p(&conf_path), "-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx (tests/deps.sh installs it)");
        assert!(
            wait_for(
                || TcpStream::connect(localhost(port)).is_ok(),
                Duration::from_secs(10)
            ),
            "nginx did not start"
        );
        Nginx { child, port }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl through the proxy (HTTP, or SOCKS5 with `socks`): the status and
/// how long it took.
fn curl(proxy: &str, url: &str) -> (u16, Duration) {
    let t = Instant::now();
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(["-x", proxy, url])
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, t.elapsed())
}

/// A connection that has sent `sent` and waits; its local port.
fn opened(port: u16, sent: &[u8]) -> (TcpStream, u16) {
    let mut s = connect(localhost(port));
    s.write_all(sent).unwrap();
    let p = s.local_addr().unwrap().port();
    (s, p)
}

/// Whether the proxy closed `s` (EOF or a reset) within `wait`; what it
/// sent before.
fn closed_within(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if is_timeout(&e) => return None,
            Err(_) => return Some(got),
        }
    }
}

/// A kept-alive client that made one request and is now idle.
fn idle_client(port: u16, origin: u16) -> (TcpStream, u16) {
    let mut s = connect(localhost(port));
    let req =
        format!("GET http://127.0.0.1:{origin}/idle HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before its answer");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let p = s.local_addr().unwrap().port();
    (s, p)
}

/// The record of the client on port `cport` with code `code`.
fn record(log: &std::path::Path, cport: u16, code: &str) -> String {
    read_log_line(log, &format!("the record {code} of port {cport}"), |l| {
        l.split(' ').nth(2) == Some(&cport.to_string()) && l.split(' ').nth(1) == Some(code)
    })
}

/// The reclaim order at `maxconn`: a kept-alive client between requests
/// goes before an older slow head; then the oldest slow head, not a
/// younger one; a tunnel in the middle of its relay never. Each closed
/// connection has one record with code 81.
#[test]
fn reclaim_takes_the_idle_client_then_the_oldest_slow_head() {
    let dir = Dir::new("reclaim_order");
    let nginx = Nginx::start(&dir);
    let echo = Origin::echo();
    // A grace longer than the test: only reclaim closes anything.
    let (_proxy, port, log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "maxconn 4\nminrate 100 600\nauth iponly\nallow *",
        "",
        "",
    );
    let (mut old_head, old_port) = opened(port, b"GET / HTTP/1.1\r\nX-Slow: ");
    thread::sleep(Duration::from_millis(100));
    let (mut idle, idle_port) = idle_client(port, nginx.port);
    let mut tunnel = connect(localhost(port));
    let connect_req = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port());
    tunnel.write_all(connect_req.as_bytes()).unwrap();
    set_timeouts(&tunnel, Duration::from_secs(5));
    let mut head = [0u8; 39];
    tunnel.read_exact(&mut head).unwrap();
    assert!(
        head.starts_with(b"HTTP/1.0 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    echo_roundtrip(&mut tunnel, b"before");
    let (mut young_head, _) = opened(port, b"GET / HT");
    thread::sleep(Duration::from_millis(700));
    // Full (4 of 4): the next client takes the idle one's slot.
    let url = format!("http://127.0.0.1:{}/new", nginx.port);
    let proxy = format!("http://127.0.0.1:{port}");
    assert_eq!(curl(&proxy, &url).0, 200);
    assert_eq!(
        closed_within(&mut idle, Duration::from_secs(5)),
        Some(Vec::new())
    );
    assert!(closed_within(&mut old_head, Duration::from_millis(300)).is_none());
    let rec = record(&log, idle_port, "00081");
    // Its own record of the close: no request text.
    assert!(
        rec.trim_end().ends_with(&format!(" 00081 {idle_port}")),
        "{rec}"
    );
    // The curl connection is gone; fill its slot again with a waiting
    // head, then the next client takes the oldest head's slot.
    let (mut filler, _) = opened(port, b"GET");
    thread::sleep(Duration::from_millis(700));
    assert_eq!(curl(&proxy, &url).0, 200);
    assert_eq!(
        closed_within(&mut old_head, Duration::from_secs(5)),
        Some(Vec::new())
    );
    let rec = record(&log, old_port, "00081");
    assert!(rec.ends_with("GET / HTTP/1.1"), "{rec}");
    assert!(closed_within(&mut young_head, Duration::from_millis(200)).is_none());
    assert!(closed_within(&mut filler, Duration::from_millis(10)).is_none());
    // The tunnel still carries bytes, both ways.
    echo_roundtrip(&mut tunnel, b"after the reclaims");
    let records = log_lines(&log);
    assert_eq!(
        records.iter().filter(|l| l.contains(" 00081 ")).count(),
        2,
        "{records:?}"
    );
}

/// With `reclaim 0` a full service queues the new client, as 3proxy
/// does: the idle client keeps its connection.
#[test]
fn reclaim_off_queues_as_3proxy() {
    let dir = Dir::new("reclaim_off");
    let nginx = Nginx::start(&dir);
    let (_proxy, port, _log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "maxconn 1\nreclaim 0\nauth iponly\nallow *",
        "",
        "",
    );
    let (mut idle, _) = idle_client(port, nginx.port);
    let mut next = connect(localhost(port));
    let req = format!(
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n\r\n",
        nginx.port
    );
    next.write_all(req.as_bytes()).unwrap();
    assert!(
        closed_within(&mut next, Duration::from_millis(1500)).is_none(),
        "served at once"
    );
    assert!(closed_within(&mut idle, Duration::from_millis(10)).is_none());
    // The idle client leaves: the queued one is served.
    idle.shutdown(Shutdown::Both).unwrap();
    next.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 12];
    next.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
}

/// `minrate`: after its grace, a head below the rate is closed (an HTTP
/// client with part of a head gets a 408), a silent client too, and a
/// SOCKS client that has not finished its handshake; a head that keeps
/// the rate is served; every close has code 82.
#[test]
fn minrate_closes_slow_heads_and_spares_steady_ones() {
    let dir = Dir::new("minrate");
    let nginx = Nginx::start(&dir);
    let socks_port = free_port();
    let (_proxy, port, log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "minrate 100 1\nauth iponly\nallow *",
        "",
        &format!("socks -i127.0.0.1 -p{socks_port}"),
    );
    let t0 = Instant::now();
    let (mut slow, slow_port) = opened(port, b"GET / HTTP/1.1\r\n");
    let (mut silent, silent_port) = opened(port, b"");
    // Silent: a SOCKS client that began its greeting would be closed by
    // BYTE_SHORT (1 s) first.
    let (mut socks, socks_cport) = opened(socks_port, b"");
    // A head of 16 fields sent at 300 bytes a second.
    let steady = thread::spawn(move || {
        let mut s = connect(localhost(port));
        let line = format!("GET http://127.0.0.1:{}/steady HTTP/1.1\r\n", nginx.port);
        s.write_all(line.as_bytes()).unwrap();
        for i in 0..16 {
            thread::sleep(Duration::from_millis(200));
            let field = format!("X-Field-{i:02}: {}\r\n", "v".repeat(45));
            s.write_all(field.as_bytes()).unwrap();
        }
        s.write_all(b"\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).unwrap();
        drop(nginx);
        buf
    });
    let answer = closed_within(&mut slow, Duration::from_secs(5)).expect("closed");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(
        answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(
        closed_within(&mut silent, Duration::from_secs(3)),
        Some(Vec::new())
    );
    assert!(closed_within(&mut socks, Duration::from_secs(3)).is_some());
    assert_eq!(&steady.join().unwrap(), b"HTTP/1.1 200");
    for cport in [slow_port, silent_port, socks_cport] {
        record(&log, cport, "00082");
    }
}

/// The slowloris of issue 34 at a small `maxconn`: 3 x maxconn clients
/// trickle endless request lines and 1 x maxconn say nothing, while curl
/// makes an HTTP request and a SOCKS request every 0.2 s: every one is
/// answered, none slower than a second; every crowd connection is
/// closed, and the proxy's threads come back down.
#[test]
fn a_slowloris_crowd_at_maxconn_does_not_stop_curl() {
    let dir = Dir::new("slowloris");
    let nginx = Nginx::start(&dir);
    let socks_port = free_port();
    let maxconn = 40;
    let (proxy, port, _log) = Service::tcp("proxy", FMT).start_in(
        dir,
        &format!("maxconn {maxconn}\nbacklog 512\nauth iponly\nallow *"),
        "",
        &format!("socks -i127.0.0.1 -p{socks_port}"),
    );
    let base_threads = proxy.threads();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let crowd = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut slow: Vec<TcpStream> = Vec::new();
            let mut silent: Vec<TcpStream> = Vec::new();
            for i in 0..4 * maxconn {
                let s = connect(localhost(port));
                if i % 4 == 3 {
                    silent.push(s);
                } else {
                    let mut s = s;
                    let _ = s.write_all(b"GET /");
                    slow.push(s);
                }
            }
            let total = slow.len() + silent.len();
            // One byte each every half second until told to stop.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut slow {
                    let _ = s.write_all(b"a");
                }
                thread::sleep(Duration::from_millis(500));
            }
            // Every one was closed by the proxy.
            let mut closed = 0;
            for mut s in slow.into_iter().chain(silent) {
                if closed_within(&mut s, Duration::from_secs(10)).is_some() {
                    closed += 1;
                }
            }
            (closed, total)
        })
    };
    thread::sleep(Duration::from_millis(300));
    let url = format!("http://127.0.0.1:{}/", nginx.port);
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{socks_port}");
    let mut worst = (Duration::ZERO, 0);
    let until = Instant::now() + Duration::from_secs(8);
    let mut n = 0;
    while Instant::now() < until {
        for via in [&http, &socks] {
            let (code, took) = curl(via, &url);
            assert_eq!(code, 200, "request {n} via {via} after {took:?}");
            worst = worst.max((took, n));
            n += 1;
        }
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (closed, total) = crowd.join().unwrap();
    assert_eq!(closed, total, "crowd connections left open");
    assert!(
        worst.0 < Duration::from_secs(1),
        "slowest request (took, number) {worst:?}"
    );
    assert!(
        wait_for(
            || proxy.threads() <= base_threads + 40,
            Duration::from_secs(30)
        ),
        "threads {} (at start {base_threads})",
        proxy.threads()
    );
}

/// A connection from `from` to the proxy's `port`.
fn connect_from(from: &str, port: u16) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let src: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&src.into()).unwrap();
    s.connect(&localhost(port).into()).unwrap();
    s.into()
}

/// `connlim` by source applies when a connection is accepted, before
/// its head: a host's connections past the limit are closed at once
/// (code 10), even while the ones it holds send nothing, and another
/// host is served meanwhile.
#[test]
fn connlim_by_source_applies_before_the_head() {
    let dir = Dir::new("connlim_early");
    let nginx = Nginx::start(&dir);
    let (_proxy, port, log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "connlim 3 0 * 127.0.0.3\nauth iponly\nallow *",
        "",
        "",
    );
    // Four connections from one host: which of them is the fourth to
    // be counted is up to the threads, so look for the one closed.
    let mut held: Vec<TcpStream> = (0..4).map(|_| connect_from("127.0.0.3", port)).collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut closed = Vec::new();
    while closed.is_empty() && Instant::now() < deadline {
        for (i, s) in held.iter_mut().enumerate() {
            if let Some(got) = closed_within(s, Duration::from_millis(10)) {
                assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
                closed.push(i);
            }
        }
    }
    assert_eq!(
        closed.len(),
        1,
        "exactly one of four is refused: {closed:?}"
    );
    let over = held.remove(closed[0]);
    let rec = record(&log, over.local_addr().unwrap().port(), "00010");
    assert!(rec.ends_with(" connlim"), "{rec}");
    for s in &mut held {
        assert!(closed_within(s, Duration::from_millis(10)).is_none());
    }
    // Another host is not limited.
    let url = format!("http://127.0.0.1:{}/", nginx.port);
    let mut other = connect_from("127.0.0.4", port);
    let req = format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    other.write_all(req.as_bytes()).unwrap();
    let got = closed_within(&mut other, Duration::from_secs(5)).expect("answered");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // A held connection that leaves frees its place.
    held.pop();
    thread::sleep(Duration::from_millis(200));
    let mut again = connect_from("127.0.0.3", port);
    again.write_all(req.as_bytes()).unwrap();
    let got = closed_within(&mut again, Duration::from_secs(5)).expect("answered");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

/// A crowd that connects again as soon as it is closed, against a
/// `maxconn` of 10: new clients are taken in at the door, so curl's
/// requests are never queued behind the crowd, and a slot
/// goes to curl, whose request is whole, before any of the crowd; the
/// crowd's waiting connections are closed below minrate (82, one record
/// each).
#[test]
fn a_reconnecting_crowd_does_not_queue_curl() {
    let dir = Dir::new("door");
    let nginx = Nginx::start(&dir);
    let (proxy, port, log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "maxconn 10\nbacklog 64\nminrate 100 1\nauth iponly\nallow *",
        "",
        "",
    );
    let base_threads = proxy.threads();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let crowd: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                // Fifteen connections each, a byte every 0.3 s, each
                // opened again when the proxy closes it.
                let open = || {
                    let mut s = connect(localhost(port));
                    let _ = s.write_all(b"G");
                    s.set_nonblocking(true).unwrap();
                    s
                };
                let mut conns: Vec<TcpStream> = (0..15).map(|_| open()).collect();
                let mut reopened = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for s in &mut conns {
                        let mut b = [0u8; 512];
                        let gone = match s.read(&mut b) {
                            Ok(_) => true,
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        };
                        if gone || s.write_all(b"a").is_err() {
                            *s = open();
                            reopened += 1;
                        }
                    }
                    thread::sleep(Duration::from_millis(300));
                }
                reopened
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let url = format!("http://127.0.0.1:{}/", nginx.port);
    let http = format!("http://127.0.0.1:{port}");
    let mut worst = (Duration::ZERO, 0);
    for n in 0..30 {
        let (code, took) = curl(&http, &url);
        assert_eq!(code, 200, "request {n} after {took:?}");
        worst = worst.max((took, n));
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reopened: u32 = crowd.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(
        worst.0 < Duration::from_millis(800),
        "slowest request (took, number) {worst:?}"
    );
    assert!(reopened >= 60, "the crowd was closed {reopened} times");
    let text = std::fs::read_to_string(&log).unwrap();
    let slow = text
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some("00082"))
        .count();
    assert!(slow >= 40, "{slow} records of 82:\n{text}");
    assert!(
        wait_for(
            || proxy.threads() <= base_threads + 10,
            Duration::from_secs(30)
        ),
        "threads {} (at start {base_threads})",
        proxy.threads()
    );
}

/// More clients than the door holds (four times maxconn, at least 256):
/// for each one more, the held client that has sent least and waited
/// longest (at least 0.1 s) is closed with 81; curl still gets in.
#[test]
fn a_full_door_closes_the_client_worth_least() {
    let dir = Dir::new("door_full");
    let nginx = Nginx::start(&dir);
    let (_proxy, port, log) = Service::tcp("proxy", FMT).start_in(
        dir,
        "maxconn 2\nbacklog 400\nminrate 100 30\nauth iponly\nallow *",
        "",
        "",
    );
    // 300 that say nothing: 2 in the slots, 256 at the door, and 42 for
    // which as many of the oldest held are closed.
    let silent: Vec<TcpStream> = (0..300).map(|_| connect(localhost(port))).collect();
    let url = format!("http://127.0.0.1:{}/", nginx.port);
    let (code, took) = curl(&format!("http://127.0.0.1:{port}"), &url);
    assert_eq!(code, 200);
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        wait_for(
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                text.lines()
                    .filter(|l| l.split(' ').nth(1) == Some("00081"))
                    .count()
                    >= 42
            },
            Duration::from_secs(5)
        ),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The oldest held were closed, the newest is still waiting.
    let mut silent = silent;
    assert_eq!(
        closed_within(&mut silent[2], Duration::from_millis(50)),
        Some(Vec::new())
    );
    assert!(closed_within(&mut silent[299], Duration::from_millis(50)).is_none());
}
