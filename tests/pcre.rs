//! `pcre` filters on the HTTP proxy (3proxy.cfg(5) "PCRE FILTERING"):
//! deny on each type, allow/dunno order, rewrites of heads and bodies
//! (a body word split across two writes of the origin), options, and the
//! cfg errors for what the linear-time matcher does not build.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::util::*;

/// Origin routes: `/page` (a Content-Length body `hello secret world`,
/// field `X-Server: leaky`), `/split` (the same body in two writes, the
/// word cut in two), `/close` (the split body ended by closing),
/// `/closebig` (300 `a`, `sec`, pause, `ret`, 300 `b`, ended by closing),
/// `/echo` (the request body back). Every request head it gets is kept.
fn origin() -> (Origin, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    let o = Origin::start("127.0.0.1:0", move |mut conn| {
        let mut buf = Vec::new();
        let mut b = [0u8; 4096];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match conn.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&b[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        seen.lock().unwrap().push(head.clone());
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut body = buf[end..].to_vec();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        while chunked && !body.ends_with(b"0\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&b[..n]),
            }
        }
        if chunked {
            body = dechunk(&body);
        }
        while body.len() < len {
            match conn.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&b[..n]),
            }
        }
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        let path = path.rsplit_once('/').map_or("", |(_, p)| p).to_string();
        let pause = || thread::sleep(Duration::from_millis(50));
        let fixed = |c: &mut TcpStream, body: &[u8]| {
            let h = format!(
                "HTTP/1.1 200 OK\r\nX-Server: leaky\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = c.write_all(h.as_bytes());
            let _ = c.write_all(body);
        };
        match path.as_str() {
            "echo" => fixed(&mut conn, &body),
            "split" => {
                let h =
                    "HTTP/1.1 200 OK\r\nContent-Length: 18\r\nConnection: close\r\n\r\nhello sec";
                let _ = conn.write_all(h.as_bytes());
                pause();
                let _ = conn.write_all(b"ret world");
            }
            "close" => {
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello sec");
                pause();
                let _ = conn.write_all(b"ret world");
            }
            "chunked" => {
                let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n9\r\nhello sec\r\n";
                let _ = conn.write_all(h.as_bytes());
                pause();
                let _ = conn.write_all(b"9\r\nret world\r\n0\r\n\r\n");
            }
            "closebig" => {
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                let _ = conn.write_all(&[b'a'; 300]);
                let _ = conn.write_all(b"sec");
                pause();
                let _ = conn.write_all(b"ret");
                let _ = conn.write_all(&[b'b'; 300]);
            }
            _ => fixed(&mut conn, b"hello secret world"),
        }
    });
    (o, heads)
}

/// The data of a chunked body (no extensions, no trailers).
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

struct Setup {
    proxy: Proxy,
    port: u16,
    origin: Origin,
    heads: Arc<Mutex<Vec<String>>>,
}

fn setup(name: &str, filters: &str) -> Setup {
    let (origin, heads) = origin();
    let (proxy, port, _) = Service::tcp("proxy", "L%E %T").start(name, filters, "");
    Setup {
        proxy,
        port,
        origin,
        heads,
    }
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.origin.port())
    }

    /// Send a request (`extra` fields, `body`) for `path`; the whole answer.
    fn ask(&self, method: &str, path: &str, extra: &str, body: &str) -> (u16, String, String) {
        let len = if body.is_empty() && method == "GET" {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let req = format!(
            "{method} {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}{len}Connection: close\r\n\r\n{body}",
            self.url(path)
        );
        let r = http_once(self.port, req.as_bytes());
        (r.status, r.head.clone(), r.text())
    }

    fn get(&self, path: &str) -> (u16, String, String) {
        self.ask("GET", path, "", "")
    }

    fn log(&self) -> std::path::PathBuf {
        log_of(&self.proxy)
    }

    fn expect_log(&self, code: &str, method: &str, path: &str) {
        expect_log_line(
            &self.log(),
            &format!("{code} {method} {} HTTP/1.1", self.url(path)),
        );
    }

    fn origin_saw(&self, what: &str) -> bool {
        self.heads.lock().unwrap().iter().any(|h| h.contains(what))
    }
}

fn assert_denied(r: &(u16, String, String)) {
    assert_eq!(r.0, 503, "{r:?}");
    assert!(r.2.contains("filtering policy"), "{r:?}");
}

#[test]
fn deny_on_the_request_line() {
    let s = setup("pcre_req", "pcre request deny /forbidden/");
    assert_denied(&s.get("forbidden/x"));
    s.expect_log("00517", "GET", "forbidden/x");
    assert!(!s.origin_saw("forbidden"), "the origin must not be asked");
    let r = s.get("page");
    assert_eq!((r.0, r.2.as_str()), (200, "hello secret world"));
    s.expect_log("00000", "GET", "page");
}

#[test]
fn deny_on_a_client_header() {
    let s = setup("pcre_clihdr", "pcre cliheader deny \"X-Bad: yes\"");
    assert_denied(&s.ask("GET", "page", "X-Bad: yes\r\n", ""));
    s.expect_log("00517", "GET", "page");
    assert!(s.heads.lock().unwrap().is_empty());
    assert_eq!(s.ask("GET", "page", "X-Bad: no\r\n", "").0, 200);
}

#[test]
fn deny_on_a_server_header() {
    let s = setup("pcre_srvhdr", "pcre srvheader deny \"X-Server: leaky\"");
    let r = s.get("page");
    assert_denied(&r);
    assert!(!r.2.contains("secret"));
    s.expect_log("00517", "GET", "page");
}

#[test]
fn deny_on_a_body_word() {
    let s = setup(
        "pcre_data",
        "pcre srvdata deny secret\npcre clidata deny password",
    );
    // A body with a length, and one ended by closing, split in two writes.
    assert_denied(&s.get("page"));
    s.expect_log("00517", "GET", "page");
    assert_denied(&s.get("close"));
    s.expect_log("00517", "GET", "close");
    // The client's body.
    assert_denied(&s.ask("POST", "echo", "", "my password"));
    s.expect_log("00517", "POST", "echo");
    let r = s.ask("POST", "echo", "", "my name");
    assert_eq!((r.0, r.2.as_str()), (200, "my name"));
}

#[test]
fn a_deny_after_the_head_went_out_closes_with_19() {
    // A window of 64 bytes: the head and the first `a`s leave before the
    // word comes; the client gets a cut body.
    let s = setup("pcre_late", "filtermaxsize 64\npcre srvdata deny secret");
    let (status, _, body) = s.get("closebig");
    assert_eq!(status, 200);
    assert!(
        body.len() < 300 && body.bytes().all(|b| b == b'a'),
        "{body}"
    );
    s.expect_log("00019", "GET", "closebig");
}

#[test]
fn allow_and_dunno_in_order() {
    let s = setup(
        "pcre_order",
        "pcre srvdata dunno hello\npcre srvdata allow world\npcre srvdata deny secret\n\
         pcre request deny *",
    );
    // `request deny *` refuses everything: the srvdata rules are not asked.
    assert_denied(&s.get("page"));
    drop(s);
    let s = setup(
        "pcre_order2",
        "pcre srvdata dunno hello\npcre srvdata allow world\npcre srvdata deny secret",
    );
    // `dunno` matched and went on; `allow` matched and stopped the chain.
    let r = s.get("page");
    assert_eq!((r.0, r.2.as_str()), (200, "hello secret world"));
    // Without `world` the deny is reached.
    assert_denied(&s.ask("POST", "echo", "", "a secret"));
    let s2 = setup(
        "pcre_order3",
        "pcre srvdata deny secret\npcre srvdata allow world",
    );
    assert_denied(&s2.get("page"));
}

#[test]
fn the_ace_selects_the_requests() {
    // Only requests to port 1 are filtered: this one passes.
    let s = setup("pcre_ace", "pcre srvdata deny secret * * * 1");
    assert_eq!(s.get("page").0, 200);
    let s = setup(
        "pcre_ace2",
        "pcre srvdata deny secret * * * 1\npcre_extend deny * 127.0.0.1",
    );
    assert_denied(&s.get("page"));
    // Weekdays: today's only, so the clock must be asked.
    let out = std::process::Command::new("date")
        .arg("+%w")
        .output()
        .unwrap();
    let today = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let s = setup(
        "pcre_ace3",
        &format!("pcre srvdata deny secret * * * * * {today}"),
    );
    assert_denied(&s.get("page"));
}

#[test]
fn rewrite_a_header_and_a_body_word() {
    let s = setup(
        "pcre_rewrite",
        "pcre_rewrite cliheader dunno \"X-Name: (\\w+)\" \"X-Name: got-$1\"\n\
         pcre_rewrite srvheader dunno leaky \"fixed\\r\\nX-Extra: $0\"\n\
         pcre_rewrite srvdata dunno secret [removed]",
    );
    let (status, head, body) = s.ask("GET", "page", "X-Name: alice\r\n", "");
    assert_eq!((status, body.as_str()), (200, "hello [removed] world"));
    assert!(
        head.contains("\r\nX-Server: fixed\r\nX-Extra: leaky\r\n"),
        "{head}"
    );
    assert!(head.contains("Content-Length: 21\r\n"), "{head}");
    assert!(s.origin_saw("X-Name: got-alice\r\n"), "{:?}", s.heads);
    // The word cut in two by the origin's writes, with a length and
    // without.
    let (status, head, body) = s.get("split");
    assert_eq!(
        (status, body.as_str()),
        (200, "hello [removed] world"),
        "{head}"
    );
    let (status, _, body) = s.get("close");
    assert_eq!((status, body.as_str()), (200, "hello [removed] world"));
    s.expect_log("00000", "GET", "close");
}

#[test]
fn a_split_word_is_found_in_a_body_longer_than_the_window() {
    // `filtermaxsize 64`: 32 bytes are held back between reads, and the
    // word comes in two writes 300 bytes into the body.
    let s = setup(
        "pcre_window",
        "filtermaxsize 64\npcre_rewrite srvdata dunno secret [removed]",
    );
    let (status, _, body) = s.get("closebig");
    assert_eq!(status, 200);
    let want = format!("{}[removed]{}", "a".repeat(300), "b".repeat(300));
    assert_eq!(body, want);
}

#[test]
fn a_rewrite_cannot_change_the_framing() {
    let s = setup(
        "pcre_framing",
        "pcre_rewrite srvheader dunno \"X-Server: leaky\" \"Content-Length: 2\"",
    );
    assert_denied(&s.get("page"));
}

#[test]
fn options_caseless() {
    let s = setup("pcre_case0", "pcre srvdata deny SECRET");
    assert_eq!(s.get("page").0, 200);
    let s = setup(
        "pcre_case1",
        "pcre_options PCRE_CASELESS\npcre srvdata deny SECRET",
    );
    assert_denied(&s.get("page"));
    let s = setup(
        "pcre_case2",
        "pcre_options PCRE2_CASELESS PCRE2_DOTALL\npcre srvdata deny HELLO.SECRET",
    );
    assert_denied(&s.get("page"));
}

#[test]
fn plugin_pcre_plugin_is_built_in() {
    // 3proxy 1.0 does not open the file for pcre_plugin.
    let dir = Dir::new("pcre_plugin");
    let port = free_port();
    let r = run_check(
        &dir,
        &format!("plugin /nonexistent/PCREPlugin.so pcre_plugin\nproxy -p{port} -i127.0.0.1\n"),
    );
    assert!(r.status.success(), "{}", r.stderr);
}

#[test]
fn cfg_errors_name_the_construct_and_the_line() {
    let dir = Dir::new("pcre_errors");
    let path = dir.cfg_path();
    let r = run_check(&dir, "log\npcre srvdata deny \"(a)\\1\"\n");
    let msg = r.assert_cfg_error(&path, 2, "pcre");
    assert!(msg.contains("back-reference"), "{msg}");
    let r = run_check(&dir, "pcre_rewrite srvdata dunno \"a(?=b)\" x\n");
    let msg = r.assert_cfg_error(&path, 1, "pcre_rewrite");
    assert!(msg.contains("look-around"), "{msg}");
    let r = run_check(&dir, "log\nlog\npcre_options PCRE_CASELESS PCRE_NOTEMPTY\n");
    let msg = r.assert_cfg_error(&path, 3, "pcre_options");
    assert!(msg.contains("'PCRE_NOTEMPTY' has no equivalent"), "{msg}");
    let r = run_check(&dir, "pcre_options PCRE_BOGUS\n");
    let msg = r.assert_cfg_error(&path, 1, "pcre_options");
    assert!(msg.contains("unknown option 'PCRE_BOGUS'"), "{msg}");
    let r = run_check(&dir, "pcre_extend deny *\n");
    r.assert_cfg_error(&path, 1, "pcre_extend");
}

/// A tcppm to `origin_port` with `filters` before it.
fn tcppm(name: &str, filters: &str, origin_port: u16) -> (Proxy, u16) {
    let port = free_port();
    let body = format!("{filters}\ntcppm -i127.0.0.1 {port} 127.0.0.1 {origin_port}\n");
    (start(Dir::new(name), "L%E %N", &body, &[port]).0, port)
}

/// Read from `s` until `n` bytes came (or the peer closed).
fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    while got.len() < n {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&b[..k]),
        }
    }
    got
}

#[test]
fn relayed_data_is_filtered_both_ways_and_a_pause_lets_it_through() {
    // The echo answers what it got, and the client waits for the answer
    // with its side open: the filters must not hold the bytes for ever.
    let origin = Origin::echo();
    let (_proxy, port) = tcppm(
        "pcre_tcppm",
        "pcre_rewrite clidata dunno password [hidden]\npcre_rewrite srvdata dunno hidden HIDDEN",
        origin.port(),
    );
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    s.write_all(b"my password is x").unwrap();
    assert_eq!(read_n(&mut s, 16), b"my [HIDDEN] is x");
    s.write_all(b" and again password").unwrap();
    assert_eq!(read_n(&mut s, 19), b" and again [HIDDEN]");
}

#[test]
fn relayed_data_deny_ends_the_session_with_19() {
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        let _ = conn.write_all(b"a secret");
        let _ = read_until_closed(&mut conn);
    });
    let (proxy, port) = tcppm("pcre_tcppm_deny", "pcre srvdata deny secret", origin.port());
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let got = read_until_closed(&mut s).unwrap_or_default();
    assert_eq!(got, b"");
    read_log_line(&log_of(&proxy), "with 00019", |l| l == "00019 TCPPM");
}

#[test]
fn chunked_bodies_are_decoded_filtered_and_chunked_again() {
    let s = setup(
        "pcre_chunked",
        "pcre_rewrite srvdata dunno secret [removed]\npcre_rewrite clidata dunno password [hidden]",
    );
    // The word is cut between two chunks, in two writes of the origin.
    let (status, head, body) = s.get("chunked");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
    assert_eq!(dechunk(body.as_bytes()), b"hello [removed] world");
    // The client's chunked body, the word cut between two chunks.
    let mut c = connect(localhost(s.port));
    set_timeouts(&c, Duration::from_secs(10));
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         7\r\nmy pass\r\n",
        s.url("echo")
    );
    c.write_all(req.as_bytes()).unwrap();
    thread::sleep(Duration::from_millis(50));
    c.write_all(b"4\r\nword\r\n0\r\n\r\n").unwrap();
    let got = String::from_utf8(read_until_closed(&mut c).unwrap_or_default()).unwrap();
    assert!(got.ends_with("\r\n\r\nmy [hidden]"), "{got}");
}
