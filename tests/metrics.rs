//! The admin service's monitoring: `/metrics` scraped by a real
//! Prometheus (Debian's `prometheus`, started here with a scrape config in
//! the temp dir) and read back through its HTTP API, so the exposition
//! format is checked by the real parser; the live sessions (`/sessions`,
//! `/S`, `/E`) ending a CONNECT tunnel; and the sessions page in headless
//! Chromium (Debian's `chromium`, driven over the DevTools protocol by
//! `cdp_sessions.js` with Node's own WebSocket), ending a tunnel from the
//! page.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;

/// One HTTP/1.0 request to the admin service; the whole answer.
fn request(port: u16, method: &str, path: &str, extra: &str) -> Response {
    let len = if method == "POST" {
        "Content-Length: 0\r\n"
    } else {
        ""
    };
    let request = format!("{method} {path} HTTP/1.0\r\nHost: x\r\n{len}{extra}\r\n");
    http_once(port, request.as_bytes())
}

/// A CONNECT tunnel through the proxy on `port` to `dst`, as `user`
/// (password `pw`); the proxy's answer is read.
fn tunnel(port: u16, dst: u16, user: &str) -> TcpStream {
    let (s, head) = http_connect(port, dst, &proxy_auth(user, "pw"));
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    s
}

/// The objects of `/sessions` (one per line, as the admin writes them)
/// with `"service":"proxy"`, each as its line.
fn proxy_sessions(admin: u16, auth: &str) -> Vec<String> {
    let r = request(admin, "GET", "/sessions", auth);
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK", "{}", r.head);
    assert!(
        r.head.contains("Content-Type: application/json"),
        "{}",
        r.head
    );
    assert!(r.text().trim_start().starts_with('[') && r.text().trim_end().ends_with(']'));
    r.text()
        .lines()
        .filter(|l| l.contains("\"service\":\"proxy\""))
        .map(str::to_string)
        .collect()
}

/// A number field of one `/sessions` object.
fn field_u64(obj: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    let at = obj
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {obj}"))
        + key.len();
    obj[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// The session of `user` in `/sessions`, with its id.
fn session_of(admin: u16, auth: &str, user: &str) -> (u64, String) {
    let mut found = None;
    let seen = wait_for(
        || {
            found = proxy_sessions(admin, auth)
                .into_iter()
                .find(|l| l.contains(&format!("\"user\":\"{user}\"")));
            found.is_some()
        },
        Duration::from_secs(10),
    );
    assert!(seen, "no session of {user} in /sessions");
    let obj = found.unwrap();
    (field_u64(&obj, "id"), obj)
}

/// The tunnel is closed by the proxy: EOF (or a reset) within the timeout.
fn assert_closed(s: &mut TcpStream) {
    read_until_closed(s).expect("the tunnel should be closed by the proxy");
}

#[test]
fn sessions_json_and_s_show_a_tunnel_and_end_closes_it() {
    let echo = Origin::echo();
    let (pport, aport) = (free_port(), free_port());
    let dir = Dir::new("live_sessions");
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %U %c %n:%r\"\n\
         users alice:CL:pw bob:CL:pw admin:CL:secret\n\
         auth strong\nallow alice,bob\nproxy -i127.0.0.1 -p{pport}\n\
         flush\nallow admin\nadmin -i127.0.0.1 -p{aport}\n",
        p(&log)
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pport)), Listen::Tcp(localhost(aport))],
    );
    let auth = format!("Authorization: Basic {}\r\n", base64("admin:secret"));
    let mut a = tunnel(pport, echo.port(), "alice");
    echo_roundtrip(&mut a, b"hello through the tunnel");
    let aport_cli = a.local_addr().unwrap().port();

    let (id, obj) = session_of(aport, &auth, "alice");
    assert!(
        obj.contains(&format!("\"dest\":\"127.0.0.1:{}\"", echo.port())),
        "{obj}"
    );
    assert!(
        obj.contains(&format!("\"client\":\"127.0.0.1:{aport_cli}\"")),
        "{obj}"
    );
    assert!(obj.contains("\"parent\":null"), "{obj}");
    // The relay's counters are live: the 24 bytes sent went out.
    assert!(field_u64(&obj, "bytes_out") >= 24, "{obj}");

    // 3proxy's XML dump has the client under the proxy service.
    let s = request(aport, "GET", "/S", &auth);
    assert_eq!(s.status_line(), "HTTP/1.0 200 OK");
    assert!(s.head.contains("Content-Type: text/xml"), "{}", s.head);
    assert!(
        s.text().starts_with("<?xml version=\"1.0\"?>"),
        "{}",
        s.text()
    );
    assert!(
        s.text().contains(
            "<name>username</name><type>string</type><description>client username\
             </description><value><![CDATA[alice]]></value>"
        ),
        "{}",
        s.text()
    );
    assert!(s.text().contains("<![CDATA[proxy]]>"), "{}", s.text());
    assert!(s.text().trim_end().ends_with("</services>"), "{}", s.text());

    // Ending needs the admin's ACL, and a POST.
    let r = request(aport, "POST", &format!("/E?id={id}"), "");
    assert!(
        r.status_line().starts_with("HTTP/1.0 401"),
        "{}",
        r.status_line()
    );
    let r = request(aport, "GET", &format!("/E?id={id}"), &auth);
    assert!(
        r.status_line().starts_with("HTTP/1.0 400"),
        "{}",
        r.status_line()
    );
    // Not from another site's page.
    let evil = format!("{auth}Origin: http://evil.example\r\n");
    let r = request(aport, "POST", &format!("/E?id={id}"), &evil);
    assert!(
        r.status_line().starts_with("HTTP/1.0 403"),
        "{}",
        r.status_line()
    );
    echo_roundtrip(&mut a, b"still up");

    let r = request(aport, "POST", &format!("/E?id={id}"), &auth);
    assert_eq!(r.status_line(), "HTTP/1.0 303 See Other", "{}", r.head);
    assert!(r.head.contains("Location: /L"), "{}", r.head);
    assert!(r.head.contains("X-Ended: 1"), "{}", r.head);
    assert_closed(&mut a);
    let line = read_log_line(&log, "of alice's tunnel", |l| {
        l.starts_with("PROXY ") && l.contains(&format!(" {aport_cli} "))
    });
    assert_eq!(
        line,
        format!("PROXY 00080 alice {aport_cli} 127.0.0.1:{}", echo.port())
    );
    // Gone from the registry, and logged once.
    assert!(wait_for(
        || session_of_opt(aport, &auth, "alice").is_none(),
        Duration::from_secs(10)
    ));
    let records = log_lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("PROXY ") && l.contains(&format!(" {aport_cli} ")))
        .count();
    assert_eq!(records, 1, "{}", log_lines(&log).join("\n"));
    // Ending it again ends nothing.
    let r = request(aport, "POST", &format!("/E?id={id}"), &auth);
    assert!(r.head.contains("X-Ended: 0"), "{}", r.head);

    // All of a user's sessions at once; others stay.
    let mut b1 = tunnel(pport, echo.port(), "bob");
    let mut b2 = tunnel(pport, echo.port(), "bob");
    let mut a2 = tunnel(pport, echo.port(), "alice");
    echo_roundtrip(&mut b1, b"1");
    echo_roundtrip(&mut b2, b"2");
    echo_roundtrip(&mut a2, b"3");
    assert!(wait_for(
        || proxy_sessions(aport, &auth).len() == 3,
        Duration::from_secs(10)
    ));
    let r = request(aport, "POST", "/E?user=bob", &auth);
    assert!(r.head.contains("X-Ended: 2"), "{}", r.head);
    assert_closed(&mut b1);
    assert_closed(&mut b2);
    echo_roundtrip(&mut a2, b"alice is still connected");
}

fn session_of_opt(admin: u16, auth: &str, user: &str) -> Option<String> {
    proxy_sessions(admin, auth)
        .into_iter()
        .find(|l| l.contains(&format!("\"user\":\"{user}\"")))
}

#[test]
fn metricsusers_takes_a_number() {
    let dir = Dir::new("metricsusers_bad");
    let r = run_check(&dir, "metricsusers many\nadmin -p1\n");
    let msg = r.assert_cfg_error(&dir.cfg_path(), 1, "metricsusers");
    assert!(msg.contains("'many' is not a number"), "{msg}");
    let ok = run_check(&dir, "metricsusers 5\nadmin -p1\n");
    assert!(ok.status.success(), "{}", ok.stderr);
}

// ---------------------------------------------------------------------------
// Prometheus

/// A Prometheus server scraping `target` every second; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target: u16) -> Prometheus {
        let bin = "/usr/bin/prometheus";
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: run tests/deps.sh as root (Debian package prometheus)"
        );
        let port = free_port();
        let conf = dir.join("prometheus.yml");
        std::fs::write(
            &conf,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: threeproxy\n    static_configs:\n\
                 \x20     - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("prometheus.log")).unwrap(),
            ))
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port }
    }

    /// The answer of `/api/v1/query` for `q`, raw JSON.
    fn query_raw(&self, q: &str) -> Option<String> {
        let mut s = TcpStream::connect(localhost(self.port)).ok()?;
        set_timeouts(&s, Duration::from_secs(5));
        let mut enc = String::new();
        for b in q.bytes() {
            if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                enc.push(b as char);
            } else {
                enc += &format!("%{b:02X}");
            }
        }
        write!(
            s,
            "GET /api/v1/query?query={enc} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        (head.starts_with("HTTP/1.") && head[8..].starts_with(" 200")).then(|| body.to_string())
    }

    /// The value of the one series `q` selects, once Prometheus has it.
    fn value(&self, q: &str) -> Option<f64> {
        let body = self.query_raw(q)?;
        let at = body.find("\"value\":[")? + 9;
        let rest = &body[at..];
        let v = rest.split_once(",\"")?.1.split_once('"')?.0;
        assert_eq!(
            body.matches("\"value\":[").count(),
            1,
            "{q} selects more than one series: {body}"
        );
        v.parse().ok()
    }

    /// Wait until `q` is `want`; panics with the last answer if not.
    fn expect(&self, q: &str, want: f64) {
        let mut last = None;
        let ok = wait_for(
            || {
                last = self.value(q);
                last == Some(want)
            },
            Duration::from_secs(40),
        );
        assert!(
            ok,
            "Prometheus: {q} is {last:?}, want {want}; answer: {:?}",
            self.query_raw(q)
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// FNV-1a, 64 bits, as `threeproxy_cfg_info` labels the cfg.
fn fnv1a(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn tcppm_echo(port: u16, n: usize) {
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    echo_roundtrip(&mut s, &vec![b'm'; n]);
}

#[test]
fn prometheus_scrapes_counters_that_survive_a_reload() {
    let echo = Origin::echo();
    let (t1, t2, t3, pport, aport) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let dead = free_port();
    let dir = Dir::new("metrics_prometheus");
    let log = dir.join("access.log");
    let cfg = format!(
        "log {log}\nlogformat \"L%N %E %U %c %I %O\"\n\
         users alice:CL:pw bob:CL:pw\nmetricsusers 1\nparentretries 2\n\
         auth iponly\nallow *\ntcppm -i127.0.0.1 {t1} 127.0.0.1 {e}\n\
         auth strong\nallow alice,bob\nproxy -i127.0.0.1 -p{pport}\n\
         auth iponly\nflush\nallow *\nparent 1000 connect 127.0.0.1 {pport} alice pw\n\
         tcppm -i127.0.0.1 {t2} 127.0.0.1 {e}\n\
         flush\nallow *\nparent 1000 connect 127.0.0.1 {dead}\n\
         tcppm -i127.0.0.1 {t3} 127.0.0.1 {e}\n\
         flush\nallow *\nadmin -i127.0.0.1 -p{aport}\n",
        log = p(&log),
        e = echo.port()
    );
    let proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(aport)), Listen::Tcp(localhost(pport))],
    );
    // Known traffic: three tcppm sessions of 1000 bytes each way.
    for _ in 0..3 {
        tcppm_echo(t1, 1000);
    }
    // bob's tunnel (200 bytes each way, plus the 39 bytes of
    // "HTTP/1.0 200 Connection established\r\n\r\n" to him), then
    // alice's, through the parent of t2: with metricsusers 1, bob (first)
    // gets series of his own and alice's are summed as "other".
    let mut b = tunnel(pport, echo.port(), "bob");
    echo_roundtrip(&mut b, &[b'b'; 200]);
    drop(b);
    read_log_line(&log, "of bob", |l| l.starts_with("PROXY 00000 bob"));
    tcppm_echo(t2, 300);
    read_log_line(&log, "of alice", |l| l.starts_with("PROXY 00000 alice"));
    // A request without credentials is refused (code 4).
    let mut s = connect(localhost(pport));
    set_timeouts(&s, Duration::from_secs(10));
    s.write_all(b"GET http://127.0.0.1/ HTTP/1.0\r\n\r\n")
        .unwrap();
    let out = read_until_closed(&mut s).unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 407"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // t3's parent is not listening: the attempt fails.
    let mut s = connect(localhost(t3));
    set_timeouts(&s, Duration::from_secs(10));
    read_until_closed(&mut s).unwrap();
    read_log_line(&log, "of the failed parent", |l| {
        l.starts_with("TCPPM ") && !l.starts_with("TCPPM 00000")
    });

    let prom = Prometheus::start(&proxy.dir.join("."), aport);
    let svc = |name: &str, port: u16| format!("service=\"{name}\",port=\"{port}\"");
    let t1s = svc("tcppm", t1);
    prom.expect(&format!("threeproxy_service_accepted_total{{{t1s}}}"), 3.0);
    prom.expect(&format!("threeproxy_service_active{{{t1s}}}"), 0.0);
    prom.expect(
        &format!("threeproxy_service_bytes_out_total{{{t1s}}}"),
        3000.0,
    );
    prom.expect(
        &format!("threeproxy_service_bytes_in_total{{{t1s}}}"),
        3000.0,
    );
    prom.expect(
        &format!("threeproxy_service_results_total{{{t1s},code_class=\"0\"}}"),
        3.0,
    );
    let ps = svc("proxy", pport);
    prom.expect(&format!("threeproxy_service_refused_total{{{ps}}}"), 1.0);
    prom.expect(
        &format!("threeproxy_service_results_total{{{ps},code_class=\"1-10\"}}"),
        1.0,
    );
    prom.expect("threeproxy_user_requests_total{user=\"bob\"}", 1.0);
    prom.expect("threeproxy_user_bytes_out_total{user=\"bob\"}", 200.0);
    prom.expect("threeproxy_user_bytes_in_total{user=\"bob\"}", 239.0);
    prom.expect("threeproxy_user_requests_total{user=\"other\"}", 1.0);
    prom.expect("threeproxy_user_bytes_out_total{user=\"other\"}", 300.0);
    assert_eq!(
        prom.value("count(threeproxy_user_requests_total)"),
        Some(2.0),
        "alice must not have a series of her own"
    );
    let good = format!("threeproxy_parent_attempts_total{{parent=\"connect 127.0.0.1:{pport}\"}}");
    prom.expect(&good, 1.0);
    prom.expect(
        &format!("threeproxy_parent_failures_total{{parent=\"connect 127.0.0.1:{pport}\"}}"),
        0.0,
    );
    // Each of `parentretries` attempts counts.
    prom.expect(
        &format!("threeproxy_parent_attempts_total{{parent=\"connect 127.0.0.1:{dead}\"}}"),
        2.0,
    );
    prom.expect(
        &format!("threeproxy_parent_failures_total{{parent=\"connect 127.0.0.1:{dead}\"}}"),
        2.0,
    );
    prom.expect("threeproxy_reloads_total", 0.0);
    prom.expect("threeproxy_reload_failures_total", 0.0);
    let cfg_path = proxy.dir.cfg_path();
    let hash = fnv1a(&std::fs::read(&cfg_path).unwrap());
    prom.expect(&format!("threeproxy_cfg_info{{hash=\"{hash}\"}}"), 1.0);
    for q in [
        "threeproxy_threads",
        "threeproxy_open_fds",
        "threeproxy_resident_memory_bytes",
    ] {
        let v = prom.value(q).unwrap_or(0.0);
        assert!(v > 0.0, "{q} = {v}");
    }

    // A reload keeps the counters (same service, same port); its cfg
    // differs by a comment, so the hash changes.
    let cfg2 = format!("# reloaded\n{cfg}");
    std::fs::write(&cfg_path, &cfg2).unwrap();
    proxy.signal("USR1");
    prom.expect("threeproxy_reloads_total", 1.0);
    prom.expect(
        &format!("threeproxy_cfg_info{{hash=\"{}\"}}", fnv1a(cfg2.as_bytes())),
        1.0,
    );
    tcppm_echo(t1, 1000);
    prom.expect(&format!("threeproxy_service_accepted_total{{{t1s}}}"), 4.0);
    prom.expect(
        &format!("threeproxy_service_bytes_out_total{{{t1s}}}"),
        4000.0,
    );
    // A refused reload counts as one; the running cfg (and hash) stay.
    std::fs::write(&cfg_path, "nosuchcommand\n").unwrap();
    proxy.signal("USR1");
    prom.expect("threeproxy_reload_failures_total", 1.0);
    prom.expect("threeproxy_reloads_total", 1.0);
    prom.expect(
        &format!("threeproxy_cfg_info{{hash=\"{}\"}}", fnv1a(cfg2.as_bytes())),
        1.0,
    );
    tcppm_echo(t1, 10);
    prom.expect(
        &format!("threeproxy_service_bytes_in_total{{{t1s}}}"),
        4010.0,
    );
}

// ---------------------------------------------------------------------------
// Chromium

#[test]
fn sessions_page_in_chromium_ends_a_tunnel() {
    let chromium = "/usr/bin/chromium";
    assert!(
        Path::new(chromium).exists(),
        "{chromium} is missing: run tests/deps.sh as root (Debian package chromium)"
    );
    let echo = Origin::echo();
    let (pport, aport) = (free_port(), free_port());
    let dir = Dir::new("live_chromium");
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %U %c %n:%r\"\nusers alice:CL:pw\n\
         auth strong\nallow alice\nproxy -i127.0.0.1 -p{pport}\n\
         auth iponly\nflush\nallow *\nadmin -i127.0.0.1 -p{aport}\n",
        p(&log)
    );
    let proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pport)), Listen::Tcp(localhost(aport))],
    );
    let mut a = tunnel(pport, echo.port(), "alice");
    echo_roundtrip(&mut a, b"from the browser test");
    let cport = a.local_addr().unwrap().port();
    let (id, _) = session_of(aport, "", "alice");

    let profile = proxy.dir.join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cdp_sessions.js");
    let out = Command::new("node")
        .arg("--experimental-websocket")
        .arg(&script)
        .arg(chromium)
        .arg(&profile)
        .arg(format!("http://127.0.0.1:{aport}/L"))
        .arg(format!("end-{id}"))
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser run failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |tag: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag} in {stdout}"))
            .to_string()
    };
    let before = page("PAGE1 ");
    let row = format!(
        "{id}\\tproxy:{pport}\\t127.0.0.1:{cport}\\talice\\t127.0.0.1:{}",
        echo.port()
    );
    assert!(before.contains(&row), "want {row} in the page: {before}");
    let after = page("PAGE2 ");
    assert!(after.contains("Live sessions"), "{after}");
    assert!(!after.contains("\\talice\\t"), "{after}");
    assert_closed(&mut a);
    let line = read_log_line(&log, "of the tunnel", |l| {
        l.starts_with("PROXY ") && l.contains(&format!(" {cport} "))
    });
    assert_eq!(
        line,
        format!("PROXY 00080 alice {cport} 127.0.0.1:{}", echo.port())
    );
}

#[test]
fn udp_sessions_are_counted_too() {
    let origin = UdpEcho::start();
    let (uport, aport) = (free_udp_port(), free_port());
    let cfg = format!(
        "udppm -s -i127.0.0.1 {uport} 127.0.0.1 {}\nadmin -i127.0.0.1 -p{aport}\n",
        origin.port()
    );
    let _proxy = Proxy::start(
        Dir::new("metrics_udp"),
        &cfg,
        &[Listen::Udp(uport), Listen::Tcp(localhost(aport))],
    );
    let client = udp_client();
    client.send_to(b"ping", localhost(uport)).unwrap();
    let mut buf = [0u8; 16];
    let (n, _) = client.recv_from(&mut buf).expect("the echo through udppm");
    assert_eq!(&buf[..n], b"ping");
    let s = format!("service=\"udppm\",port=\"{uport}\"");
    let want = [
        format!("threeproxy_service_accepted_total{{{s}}} 1\n"),
        format!("threeproxy_service_active{{{s}}} 0\n"),
        format!("threeproxy_service_results_total{{{s},code_class=\"0\"}} 1\n"),
        format!("threeproxy_service_bytes_out_total{{{s}}} 4\n"),
        format!("threeproxy_service_bytes_in_total{{{s}}} 4\n"),
    ];
    let mut body = String::new();
    let ok = wait_for(
        || {
            body = request(aport, "GET", "/metrics", "").text();
            want.iter().all(|w| body.contains(w.as_str()))
        },
        Duration::from_secs(10),
    );
    assert!(ok, "want {want:?} in:\n{body}");
}

/// The value of the series `name{parent="PARENT"}` in a /metrics text.
fn series(text: &str, name: &str, parent: &str) -> Option<f64> {
    let key = format!("{name}{{parent=\"{parent}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.parse().ok())
}

#[test]
fn parent_health_in_metrics_and_on_the_parents_page() {
    let echo = Origin::echo();
    let (t1, aport, dead) = (free_port(), free_port(), free_port());
    let dir = Dir::new("metrics_parent_health");
    let log = dir.join("access.log");
    // One failure marks the parent down, for 1 s.
    let cfg = format!(
        "log {log}\nlogformat \"L%N %E\"\nauth iponly\nallow *\nparenthealth 1 1 1\n\
         parent 1000 connect 127.0.0.1 {dead}\ntcppm -i127.0.0.1 {t1} 127.0.0.1 {e}\n\
         flush\nallow *\nadmin -i127.0.0.1 -p{aport}\n",
        log = p(&log),
        e = echo.port()
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(aport))]);
    let name = format!("connect 127.0.0.1:{dead}");
    let metrics = || request(aport, "GET", "/metrics", "").text();
    // Up before any attempt.
    let text = metrics();
    assert_eq!(
        series(&text, "threeproxy_parent_up", &name),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "threeproxy_parent_down_since_seconds", &name),
        Some(0.0),
        "{text}"
    );
    // Nothing listens there: the attempt fails, the parent is down.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut s = connect(localhost(t1));
    set_timeouts(&s, Duration::from_secs(10));
    read_until_closed(&mut s).unwrap();
    read_log_line(&log, "of the failed parent", |l| {
        l.starts_with("TCPPM ") && !l.starts_with("TCPPM 00000")
    });
    let text = metrics();
    assert_eq!(
        series(&text, "threeproxy_parent_up", &name),
        Some(0.0),
        "{text}"
    );
    let since = series(&text, "threeproxy_parent_down_since_seconds", &name).unwrap();
    assert!(since >= before - 1.0 && since <= before + 10.0, "{text}");
    // Both attempts of `parentretries` (2 by default) failed.
    assert_eq!(
        series(&text, "threeproxy_parent_consecutive_failures", &name),
        Some(2.0),
        "{text}"
    );
    let page = request(aport, "GET", "/P", "");
    assert!(page.status_line().contains("200"), "{}", page.head);
    assert!(
        page.text()
            .contains(&format!("<tr><td>{name}</td><td>down</td>")),
        "{}",
        page.text()
    );
    assert!(request(aport, "GET", "/", "")
        .text()
        .contains("href=\"/P\""));
    // Prometheus's own parser reads the gauges.
    let prom = Prometheus::start(&proxy.dir.join("."), aport);
    prom.expect(&format!("threeproxy_parent_up{{parent=\"{name}\"}}"), 0.0);
    prom.expect(
        &format!("threeproxy_parent_consecutive_failures{{parent=\"{name}\"}}"),
        2.0,
    );
    // The parent comes up (a CONNECT proxy that echoes): once its hold
    // is over it is drawn again, works, and is up.
    let _parent = Origin::start(&format!("127.0.0.1:{dead}"), |mut conn| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let _ = conn.write_all(b"HTTP/1.0 200 OK\r\n\r\n");
        let mut buf = [0u8; 4096];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    assert!(
        wait_for(
            || {
                let mut s = connect(localhost(t1));
                set_timeouts(&s, Duration::from_secs(10));
                let _ = s.write_all(b"up?");
                let mut b = [0u8; 3];
                s.read_exact(&mut b).is_ok() && &b == b"up?"
            },
            Duration::from_secs(10)
        ),
        "the parent was not used again"
    );
    let text = metrics();
    assert_eq!(
        series(&text, "threeproxy_parent_up", &name),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "threeproxy_parent_down_since_seconds", &name),
        Some(0.0),
        "{text}"
    );
    assert!(request(aport, "GET", "/P", "")
        .text()
        .contains(&format!("<tr><td>{name}</td><td>up</td>")));
    prom.expect(&format!("threeproxy_parent_up{{parent=\"{name}\"}}"), 1.0);
}
