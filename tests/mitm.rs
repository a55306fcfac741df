//! `ssl_mitm` with the HTTP proxy inside the intercepted TLS (issue 31):
//! the decrypted stream of a CONNECT, a SOCKS CONNECT or a tcppm session
//! whose client speaks HTTP/1 is served request by request, each one
//! authorized, filtered, limited, sent through its chain and logged as a
//! request of the HTTP proxy; any other stream is relayed as before.
//!
//! The origin is a real nginx over TLS (a certificate of the test's own
//! CA, which the proxy trusts with `ssl_client_ca_file`); the clients are
//! curl and Python's http.client, trusting only the proxy's MITM CA, and
//! rustls where exact bytes matter. nginx's access log says what reached
//! the origin, the proxy's log what was recorded.

use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use crate::tls::{client_config, mitm_ca, tls_origin, Pki};
use crate::util::*;

/// Service, code, user, hops, text.
const FMT: &str = "L%N %E %U %h %T";

/// The size of the file nginx serves at `/files/big.bin`.
const BIG: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// nginx, the TLS origin

/// One request as nginx's access log has it (see the `log_format` in
/// [`Nginx::start`]).
#[derive(Debug, Clone)]
struct Hit {
    /// nginx's connection serial number, and the requests on it so far.
    conn: u64,
    nreq: u64,
    method: String,
    uri: String,
    /// The `X-Probe` field (`-` when absent).
    probe: String,
    /// The `Host` field.
    host: String,
    /// The port nginx was reached on (its TLS ports, or the plain one).
    port: u16,
    status: u16,
    /// The bytes of the request as nginx read them (head and body).
    len: u64,
    /// The request body (when nginx read it: the `/post` location).
    body: String,
}

impl Hit {
    fn parse(line: &str) -> Hit {
        let f: Vec<&str> = line.splitn(10, ' ').collect();
        assert_eq!(
            f.len(),
            10,
            "an access log line of another format: {line:?}"
        );
        let field = |i: usize, name: &str| -> String {
            f[i].strip_prefix(name)
                .unwrap_or_else(|| panic!("field {name} in {line:?}"))
                .to_string()
        };
        Hit {
            conn: f[0].parse().unwrap(),
            nreq: f[1].parse().unwrap(),
            method: f[2].to_string(),
            uri: f[3].to_string(),
            probe: field(4, "probe="),
            host: field(5, "host="),
            port: field(6, "port=").parse().unwrap(),
            status: field(7, "status=").parse().unwrap(),
            len: field(8, "len=").parse().unwrap(),
            body: field(9, "body="),
        }
    }
}

/// An nginx master process (and its worker) serving HTTPS on `port` and
/// `port2`, and plain HTTP on `plain`, with its files in the test's dir
/// (`nginx*`, so that a failing test prints its logs). Stopped on drop.
///
/// Locations: `/files/big.bin` ([`BIG`] bytes of pattern 7), `/post`
/// (passed to an upstream on a unix socket so that nginx reads the body
/// and logs it; answers `posted N bytes`), and every other path answers
/// 200 with `METHOD URI probe=X-PROBE\n`.
struct Nginx {
    child: Child,
    port: u16,
    port2: u16,
    plain: u16,
    access: PathBuf,
    error: PathBuf,
    file: Vec<u8>,
}

impl Nginx {
    /// `extra`: more directives for the server block.
    fn start(dir: &Dir, pki: &Pki, extra: &str) -> Nginx {
        let bin = sbin("nginx");
        let root = dir.join("nginx-root");
        fs::create_dir_all(root.join("files")).unwrap();
        for t in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            fs::create_dir_all(root.join(t)).unwrap();
        }
        let mut file = Vec::new();
        send_pattern(&mut file, 7, BIG).unwrap();
        fs::write(root.join("files/big.bin"), &file).unwrap();
        let (port, port2, plain) = (free_port(), free_port(), free_port());
        let (access, error) = (dir.join("nginx-access.log"), dir.join("nginx-error.log"));
        let r = p(&root);
        // As root, the worker would run as nobody, which may not read a
        // dir of a restrictive umask: keep it root.
        // SAFETY: geteuid only reads the process's credentials.
        let user = if unsafe { libc::geteuid() } == 0 {
            "user root;"
        } else {
            ""
        };
        let conf = format!(
            r#"{user}
worker_processes 1;
error_log {error} info;
pid {r}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {r}/body;
  proxy_temp_path {r}/proxy;
  fastcgi_temp_path {r}/fastcgi;
  uwsgi_temp_path {r}/uwsgi;
  scgi_temp_path {r}/scgi;
  log_format probe '$connection $connection_requests $request_method $request_uri probe=$http_x_probe host=$http_host port=$server_port status=$status len=$request_length body=$request_body';
  server {{
    listen 127.0.0.1:{port} ssl;
    listen 127.0.0.1:{port2} ssl;
    listen 127.0.0.1:{plain};
    ssl_certificate {cert};
    ssl_certificate_key {key};
    access_log {access} probe;
    client_max_body_size 1m;
    client_body_buffer_size 1m;
    default_type text/plain;
    {extra}
    location /files/ {{ alias {r}/files/; }}
    location = /post {{ proxy_pass http://unix:{r}/up.sock:/posted; }}
    location / {{ return 200 "$request_method $request_uri probe=$http_x_probe\n"; }}
  }}
  server {{
    listen unix:{r}/up.sock;
    access_log off;
    location / {{ return 200 "posted $content_length bytes\n"; }}
  }}
}}
"#,
            error = p(&error),
            access = p(&access),
            cert = p(&pki.cert),
            key = p(&pki.key),
        );
        let conf_path = dir.write("nginx.conf", conf);
        let out = fs::File::create(dir.join("nginx-stderr.log")).unwrap();
        let child = Command::new(&bin)
            .args(["-p", r, "-c", p(&conf_path), "-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("run {bin} (tests/deps.sh installs nginx): {e}"));
        let mut n = Nginx {
            child,
            port,
            port2,
            plain,
            access,
            error,
            file,
        };
        let up = wait_for(
            || {
                if n.child.try_wait().unwrap().is_some() {
                    return true;
                }
                [port, port2, plain].iter().all(|&p| {
                    TcpStream::connect_timeout(&localhost(p), Duration::from_millis(200)).is_ok()
                })
            },
            START_TIMEOUT,
        );
        if !up || n.child.try_wait().unwrap().is_some() {
            panic!(
                "nginx did not come up on {port}, {port2}, {plain}:\n{}\n{}",
                fs::read_to_string(&n.error).unwrap_or_default(),
                fs::read_to_string(dir.join("nginx-stderr.log")).unwrap_or_default()
            );
        }
        n
    }

    fn hits(&self) -> Vec<Hit> {
        log_lines(&self.access)
            .iter()
            .map(|l| Hit::parse(l))
            .collect()
    }

    /// Waits for a request to `uri` in the access log and returns it.
    fn wait_hit(&self, uri: &str) -> Hit {
        let mut found = None;
        wait_for(
            || {
                found = self.hits().into_iter().find(|h| h.uri == uri);
                found.is_some()
            },
            LOG_TIMEOUT,
        );
        found.unwrap_or_else(|| {
            panic!(
                "nginx saw no request for {uri}; its access log:\n{}",
                log_lines(&self.access).join("\n")
            )
        })
    }

    /// Whether nginx saw any request whose URI contains `part`.
    fn saw(&self, part: &str) -> bool {
        self.hits().iter().any(|h| h.uri.contains(part))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker and exits (a SIGKILL would
        // leave the worker running).
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: a signal to our own child, which has not been reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let gone = wait_for(
            || self.child.try_wait().ok().flatten().is_some(),
            Duration::from_secs(10),
        );
        if !gone {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!(
                "=== nginx error log ===\n{}",
                fs::read_to_string(&self.error).unwrap_or_default()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The proxy

/// What a test needs: its dir (for nginx), the origin's PKI and the MITM
/// CA the clients trust.
struct Setup {
    dir: Dir,
    pki: Pki,
    /// (mitm.pem, mitm.key)
    ca: (PathBuf, PathBuf),
}

impl Setup {
    fn new(name: &str) -> Setup {
        let dir = Dir::new(name);
        let pki = Pki::new(&dir);
        let ca = mitm_ca(&dir);
        Setup { dir, pki, ca }
    }

    /// Starts 3proxy in the setup's dir: logging to `mitm.log` with
    /// `fmt`, verifying origins of the test CA, signing with the MITM CA;
    /// `acl` (and anything else) before `ssl_mitm`, then `services`,
    /// ready on `ports`. Returns the proxy and the MITM CA's certificate.
    fn proxy(self, fmt: &str, acl: &str, services: &str, ports: &[u16]) -> (Proxy, PathBuf) {
        let log = self.dir.join("mitm.log");
        let cfg = format!(
            "log {}\nlogformat \"{fmt}\"\nssl_client_verify\nssl_client_ca_file {}\n\
             ssl_server_ca_file {}\nssl_server_ca_key {}\n{acl}\nssl_mitm\n{services}",
            p(&log),
            p(&self.pki.ca),
            p(&self.ca.0),
            p(&self.ca.1)
        );
        let ready: Vec<Listen> = ports.iter().map(|&p| Listen::Tcp(localhost(p))).collect();
        (Proxy::start(self.dir, &cfg, &ready), self.ca.0)
    }
}

fn proxy_on(port: u16) -> String {
    format!("proxy -p{port} -i127.0.0.1\n")
}

fn log_of(proxy: &Proxy) -> PathBuf {
    proxy.dir.join("mitm.log")
}

/// A record of [`FMT`].
fn rec(svc: &str, code: &str, user: &str, hops: u32, text: &str) -> String {
    format!("{svc} {code} {user} {hops} {text}")
}

/// Waits for each of `want` in the log, then for a marker request's
/// record, and then asserts that the records that mention `about` are
/// exactly `want`, in that order: one per inner request, and none for the
/// tunnels.
fn expect_records(
    proxy: &Proxy,
    port: u16,
    nginx: &Nginx,
    about: impl Fn(&str) -> bool,
    want: &[String],
) {
    let log = log_of(proxy);
    for w in want {
        expect_log_line(&log, w);
    }
    marker(&log, port, nginx.plain);
    let got: Vec<String> = log_lines(&log).into_iter().filter(|l| about(l)).collect();
    assert_eq!(
        got,
        want,
        "the records; the whole log:\n{}",
        log_lines(&log).join("\n")
    );
}

/// The records that mention `what`.
fn mentions(what: String) -> impl Fn(&str) -> bool {
    move |l| l.contains(&what)
}

static MARKS: AtomicUsize = AtomicUsize::new(0);

/// A plain request through the HTTP proxy on `port` (to nginx's plain
/// port), and its record: records of the sessions that ended before it
/// are in the log by then.
fn marker(log: &Path, port: u16, plain: u16) {
    let n = MARKS.fetch_add(1, Ordering::SeqCst);
    let path = format!("/marker-{n}");
    let mut s = connect(localhost(port));
    write!(
        s,
        "GET http://127.0.0.1:{plain}{path} HTTP/1.1\r\nHost: 127.0.0.1:{plain}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let _ = read_until_closed(&mut s);
    read_log_line(log, &format!("of the marker {path}"), |l| l.contains(&path));
}

// ---------------------------------------------------------------------------
// Clients

/// What curl got: whether it exited 0, the status, the body, stderr.
#[derive(Debug)]
struct Curl {
    ok: bool,
    code: u16,
    body: String,
    err: String,
}

/// curl `args` (the proxy, the URL, ...), trusting only `ca`.
fn curl(ca: &Path, args: &[&str]) -> Curl {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--noproxy",
            "",
            "-w",
            "\n%{http_code}",
        ])
        .args(["--cacert", p(ca)])
        .args(args)
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Curl {
        ok: out.status.success(),
        code: code.trim().parse().unwrap_or(0),
        body: body.to_string(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// curl through the HTTP proxy on `port` to `url`.
fn curl_via(port: u16, ca: &Path, url: &str, more: &[&str]) -> Curl {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut args = vec!["--proxy", proxy.as_str()];
    args.extend_from_slice(more);
    args.push(url);
    curl(ca, &args)
}

/// Asserts curl got `code` and, when given, exactly `body`.
fn assert_served(r: &Curl, code: u16, body: Option<&str>) {
    assert!(
        r.ok && r.code == code,
        "want {code}, got {} (curl exit ok: {}): {}\n{}",
        r.code,
        r.ok,
        r.err,
        r.body
    );
    if let Some(b) = body {
        assert_eq!(r.body, b, "{r:?}");
    }
}

/// Asserts curl got the proxy's 403 page (inside the TLS session).
fn assert_forbidden(r: &Curl) {
    assert_served(r, 403, None);
    assert!(r.body.contains("403 Forbidden"), "the proxy's page: {r:?}");
}

pub(crate) type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Through the HTTP proxy on `port`: `CONNECT host:oport`, then a TLS
/// client inside trusting only `ca`, for `host`.
pub(crate) fn tunnel(port: u16, ca: &Path, host: &str, oport: u16) -> Tls {
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(20));
    write!(
        s,
        "CONNECT {host}:{oport} HTTP/1.1\r\nHost: {host}:{oport}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "the proxy closed: {head:?}");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.0 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let name = ServerName::try_from(host.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(client_config(ca), name).unwrap();
    rustls::StreamOwned::new(conn, s)
}

/// Reads until the peer closes; a close without close_notify (or a
/// reset) ends it too.
fn read_to_close(r: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
            {
                return out
            }
            Err(e) => panic!("read: {e} after {:?}", String::from_utf8_lossy(&out)),
        }
    }
}

/// Reads one HTTP answer with a Content-Length (all the proxy's own
/// answers have one), or what came before the peer closed or went quiet.
fn read_answer(r: &mut impl Read) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match r.read(&mut b) {
            Ok(1) => got.push(b[0]),
            _ => return got,
        }
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    if r.read_exact(&mut body).is_ok() {
        got.extend_from_slice(&body);
    }
    got
}

/// The status of an HTTP answer.
fn status_of(answer: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The tests

/// `deny * * * * HTTP_POST`, `allow *`: the CONNECT (HTTP_CONNECT) passes;
/// inside it curl's GET is served by nginx and its POST is refused 403 by
/// the proxy, never reaching nginx; one record each, none for the tunnel.
#[test]
fn inner_get_is_served_and_inner_post_denied_by_the_acl() {
    let s = Setup::new("mitm_get_post");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let port = free_port();
    let (proxy, ca) = s.proxy(
        FMT,
        "deny * * * * HTTP_POST\nallow *",
        &proxy_on(port),
        &[port],
    );
    let o = nginx.port;
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/get?q=1"),
        &["-H", "X-Probe: g1"],
    );
    assert_served(&r, 200, Some("GET /get?q=1 probe=g1\n"));
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/post"),
        &["-d", "a=1&b=2"],
    );
    assert_forbidden(&r);
    assert!(r.body.contains("access rules"), "{r:?}");

    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00000",
                "-",
                0,
                &format!("GET http://localhost:{o}/get?q=1 HTTP/1.1"),
            ),
            rec(
                "PROXY",
                "00001",
                "-",
                0,
                &format!("POST http://localhost:{o}/post HTTP/1.1"),
            ),
        ],
    );
    let hit = nginx.wait_hit("/get?q=1");
    assert_eq!(
        (hit.method.as_str(), hit.probe.as_str(), hit.status),
        ("GET", "g1", 200)
    );
    assert!(
        !nginx.saw("/post"),
        "the POST reached nginx: {:?}",
        nginx.hits()
    );
}

/// Host and port entries apply to each inner request, with its own
/// destination, while the CONNECT is let through by its operation; and
/// operation lists (HTTP_PUT, HTTP_OTHER for DELETE) pick the methods.
#[test]
fn acl_hosts_ports_and_operations_apply_per_inner_request() {
    let s = Setup::new("mitm_acl");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let (o, o2) = (nginx.port, nginx.port2);
    let port = free_port();
    let acl = format!("allow * * * * HTTP_CONNECT\ndeny * * localhost\ndeny * * * {o2}\nallow *");
    let (proxy, ca) = s.proxy(FMT, &acl, &proxy_on(port), &[port]);
    assert_forbidden(&curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/by-name"),
        &[],
    ));
    let r = curl_via(port, &ca, &format!("https://127.0.0.1:{o}/by-addr"), &[]);
    assert_served(&r, 200, Some("GET /by-addr probe=\n"));
    assert_forbidden(&curl_via(
        port,
        &ca,
        &format!("https://127.0.0.1:{o2}/by-port"),
        &[],
    ));
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions("/by-".into()),
        &[
            rec(
                "PROXY",
                "00001",
                "-",
                0,
                &format!("GET http://localhost:{o}/by-name HTTP/1.1"),
            ),
            rec(
                "PROXY",
                "00000",
                "-",
                0,
                &format!("GET http://127.0.0.1:{o}/by-addr HTTP/1.1"),
            ),
            rec(
                "PROXY",
                "00001",
                "-",
                0,
                &format!("GET http://127.0.0.1:{o2}/by-port HTTP/1.1"),
            ),
        ],
    );
    // The tunnels themselves were allowed and left no record.
    let log = log_lines(&log_of(&proxy));
    assert!(!log.iter().any(|l| l.contains("CONNECT ")), "{log:#?}");
    nginx.wait_hit("/by-addr");
    assert!(
        !nginx.saw("/by-name") && !nginx.saw("/by-port"),
        "{:?}",
        nginx.hits()
    );
    drop(proxy);

    // Operations.
    let s = Setup::new("mitm_acl_ops");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let (proxy, ca) = s.proxy(
        FMT,
        "deny * * * * HTTP_PUT,HTTP_OTHER\nallow *",
        &proxy_on(port),
        &[port],
    );
    let url = |path: &str| format!("https://localhost:{o}/op/{path}");
    assert_served(
        &curl_via(port, &ca, &url("get"), &[]),
        200,
        Some("GET /op/get probe=\n"),
    );
    let head = curl_via(port, &ca, &url("head"), &["-I"]);
    assert_served(&head, 200, None);
    // curl prints the CONNECT's answer, then nginx's to the HEAD: its
    // length, no body.
    assert!(
        head.body.contains("\r\n\r\nHTTP/1.1 200 OK\r\n")
            && head.body.contains("Content-Length: 21\r\n")
            && head.body.ends_with("\r\n\r\n"),
        "{head:?}"
    );
    assert_forbidden(&curl_via(port, &ca, &url("put"), &["-X", "PUT", "-d", "x"]));
    assert_forbidden(&curl_via(port, &ca, &url("delete"), &["-X", "DELETE"]));
    assert_served(
        &curl_via(
            port,
            &ca,
            &format!("https://localhost:{o}/post"),
            &["-d", "op=post"],
        ),
        200,
        Some("posted 7 bytes\n"),
    );
    let t = |m: &str, path: &str| format!("{m} http://localhost:{o}/{path} HTTP/1.1");
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec("PROXY", "00000", "-", 0, &t("GET", "op/get")),
            rec("PROXY", "00000", "-", 0, &t("HEAD", "op/head")),
            rec("PROXY", "00001", "-", 0, &t("PUT", "op/put")),
            rec("PROXY", "00001", "-", 0, &t("DELETE", "op/delete")),
            rec("PROXY", "00000", "-", 0, &t("POST", "post")),
        ],
    );
    assert_eq!(nginx.wait_hit("/post").body, "op=post");
    let methods: Vec<String> = nginx
        .hits()
        .into_iter()
        .filter(|h| !h.uri.starts_with("/marker-"))
        .map(|h| h.method)
        .collect();
    assert_eq!(methods, ["GET", "HEAD", "POST"]);
}

/// The user the CONNECT was authorized as is the user of its inner
/// requests (and of their records), unless an inner request carries a
/// Proxy-Authorization of its own.
#[test]
fn inner_requests_are_checked_as_the_tunnels_user() {
    let s = Setup::new("mitm_user");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let acl = "auth strong\nusers alice:CL:apw bob:CL:bpw\nallow alice\n\
               allow bob * * * HTTP_CONNECT\ndeny *";
    let (proxy, ca) = s.proxy(FMT, acl, &proxy_on(port), &[port]);
    let url = |path: &str| format!("https://localhost:{o}/{path}");
    assert_served(
        &curl_via(port, &ca, &url("alice"), &["--proxy-user", "alice:apw"]),
        200,
        Some("GET /alice probe=\n"),
    );
    // bob may open the tunnel, not ask for anything inside it.
    assert_forbidden(&curl_via(
        port,
        &ca,
        &url("bob"),
        &["--proxy-user", "bob:bpw"],
    ));
    // ... unless the inner request says it is alice's (curl sends -H
    // fields to the server, that is inside the tunnel).
    let alice = "Proxy-Authorization: Basic YWxpY2U6YXB3"; // alice:apw
    assert_served(
        &curl_via(
            port,
            &ca,
            &url("bob-as-alice"),
            &["--proxy-user", "bob:bpw", "-H", alice],
        ),
        200,
        Some("GET /bob-as-alice probe=\n"),
    );
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00000",
                "alice",
                0,
                &format!("GET {}/alice HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00001",
                "bob",
                0,
                &format!("GET {}/bob HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00000",
                "alice",
                0,
                &format!("GET {}/bob-as-alice HTTP/1.1", http(o)),
            ),
        ],
    );
    nginx.wait_hit("/bob-as-alice");
    assert!(
        !nginx.hits().iter().any(|h| h.uri == "/bob"),
        "{:?}",
        nginx.hits()
    );
}

fn http(o: u16) -> String {
    format!("http://localhost:{o}")
}

/// pcre filters see each inner request as a plain proxy request: a
/// `request` deny on the logged line (scheme, host and port included)
/// answers 503 inside the TLS session and nginx is not asked; a `srvdata`
/// rewrite is what the client gets, with the new length.
#[test]
fn pcre_request_and_srvdata_filters_see_inner_requests() {
    let s = Setup::new("mitm_pcre");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let filters = format!(
        "plugin /usr/local/3proxy/libexec/PCREPlugin.ld.so pcre_plugin\n\
         pcre request deny \"^GET http://localhost:{o}/secret/\"\n\
         pcre_rewrite srvdata dunno \"probe=\" \"probe-as-filtered=\""
    );
    let (proxy, ca) = s.proxy(FMT, &filters, &proxy_on(port), &[port]);
    let r = curl_via(port, &ca, &format!("https://localhost:{o}/secret/x"), &[]);
    assert_served(&r, 503, None);
    assert!(r.body.contains("filtering policy"), "{r:?}");
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/open"),
        &["-H", "X-Probe: abc"],
    );
    assert_served(&r, 200, Some("GET /open probe-as-filtered=abc\n"));
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00517",
                "-",
                0,
                &format!("GET {}/secret/x HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00000",
                "-",
                0,
                &format!("GET {}/open HTTP/1.1", http(o)),
            ),
        ],
    );
    assert_eq!(nginx.wait_hit("/open").probe, "abc");
    assert!(!nginx.saw("/secret"), "{:?}", nginx.hits());
}

/// A `cliheader` rewrite changes the head nginx gets for an inner
/// request. (The CONNECT before it goes through the same filter: on main
/// any cliheader filter answers every CONNECT 503, code 517.)
#[test]
fn pcre_cliheader_rewrites_what_nginx_gets_for_an_inner_request() {
    let s = Setup::new("mitm_pcre_cliheader");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let filters = "pcre_rewrite cliheader dunno \"X-Probe: (\\w+)\" \"X-Probe: rewritten-$1\"";
    let (proxy, ca) = s.proxy(FMT, filters, &proxy_on(port), &[port]);
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/rewritten"),
        &["-H", "X-Probe: abc"],
    );
    assert_served(&r, 200, Some("GET /rewritten probe=rewritten-abc\n"));
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[rec(
            "PROXY",
            "00000",
            "-",
            0,
            &format!("GET {}/rewritten HTTP/1.1", http(o)),
        )],
    );
    assert_eq!(nginx.wait_hit("/rewritten").probe, "rewritten-abc");
}

/// A `cliheader` deny judges the CONNECT's own head too, as in 3proxy (it
/// forwards none): a tunnel whose head matches is refused 503; one that
/// does not is opened and its inner requests are judged each.
#[test]
fn pcre_cliheader_judges_the_connect_and_each_inner_head() {
    let s = Setup::new("mitm_pcre_connect");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let filters = "pcre cliheader deny \"X-Bad: yes\"";
    let (proxy, ca) = s.proxy(FMT, filters, &proxy_on(port), &[port]);
    let url = |path: &str| format!("https://localhost:{o}{path}");
    let r = curl_via(port, &ca, &url("/fine"), &[]);
    assert_served(&r, 200, Some("GET /fine probe=\n"));
    let r = curl_via(
        port,
        &ca,
        &url("/tunnel"),
        &["--proxy-header", "X-Bad: yes"],
    );
    assert!(!r.ok, "{r:?}");
    assert!(r.err.contains("503"), "{r:?}");
    let r = curl_via(port, &ca, &url("/inner"), &["-H", "X-Bad: yes"]);
    assert_served(&r, 503, None);
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00000",
                "-",
                0,
                &format!("GET {}/fine HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00517",
                "-",
                0,
                &format!("CONNECT localhost:{o} HTTP/1.1"),
            ),
            rec(
                "PROXY",
                "00517",
                "-",
                0,
                &format!("GET {}/inner HTTP/1.1", http(o)),
            ),
        ],
    );
    assert!(nginx.saw("/fine"));
    assert!(
        !nginx.saw("/tunnel") && !nginx.saw("/inner"),
        "{:?}",
        nginx.hits()
    );
}

/// A plain HTTP proxy (another 3proxy) on `port` for the chains, logging
/// with [`FMT`] to the returned path.
fn parent_proxy(name: &str, port: u16) -> (Proxy, PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("parent.log");
    let cfg = format!("log {}\nlogformat \"{FMT}\"\n{}", p(&log), proxy_on(port));
    (
        Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]),
        log,
    )
}

/// A parent chain of the entry that allows the inner requests: the proxy
/// asks the `connect+` parent for a tunnel to the origin and does TLS
/// with nginx through it; the record counts the hop.
#[test]
fn inner_requests_go_through_the_entrys_parent_chain() {
    let pport = free_port();
    let (parent, plog) = parent_proxy("mitm_chain_parent", pport);
    let s = Setup::new("mitm_chain");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let out = s.dir.join("download.bin");
    let acl = format!("allow *\nparent 1000 connect+ 127.0.0.1 {pport}");
    let (front, ca) = s.proxy(FMT, &acl, &proxy_on(port), &[port]);
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/chained"),
        &["-H", "X-Probe: c"],
    );
    assert_served(&r, 200, Some("GET /chained probe=c\n"));
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/files/big.bin"),
        &["-o", p(&out)],
    );
    assert_served(&r, 200, Some(""));
    assert!(
        fs::read(&out).unwrap() == nginx.file,
        "the file through the chain differs"
    );
    expect_records(
        &front,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00000",
                "-",
                1,
                &format!("GET {}/chained HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00000",
                "-",
                1,
                &format!("GET {}/files/big.bin HTTP/1.1", http(o)),
            ),
        ],
    );
    let hit = nginx.wait_hit("/chained");
    assert_eq!(
        (hit.probe.as_str(), hit.port),
        ("c", o),
        "over TLS: {hit:?}"
    );
    // The parent's tunnels end when the front's origin connections do.
    drop(front);
    let want = rec(
        "PROXY",
        "00000",
        "-",
        0,
        &format!("CONNECT localhost:{o} HTTP/"),
    );
    read_log_line(&plog, "the front's CONNECT", |l| l.starts_with(&want));
    marker(&plog, pport, nginx.plain);
    // A tunnel per curl, and nothing in clear.
    let lines: Vec<String> = log_lines(&plog)
        .into_iter()
        .filter(|l| l.contains(&format!("localhost:{o}")))
        .collect();
    assert!(
        lines.len() == 2 && lines.iter().all(|l| l.starts_with(&want)),
        "the parent's records about the origin: {lines:#?}"
    );
    drop(parent);
}

/// `redirect ADDRESS PORT * * * * HTTP_GET`: inner GETs go through that
/// http parent, as a CONNECT to the origin and TLS with it inside, never
/// in clear; an inner POST (allowed by the next entry) goes directly.
#[test]
fn redirect_sends_inner_gets_through_an_http_parent() {
    let pport = free_port();
    let (parent, plog) = parent_proxy("mitm_redirect_parent", pport);
    let s = Setup::new("mitm_redirect");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let acl = format!("redirect 127.0.0.1 {pport} * * * * HTTP_GET\nallow *");
    let (front, ca) = s.proxy(FMT, &acl, &proxy_on(port), &[port]);
    let r = curl_via(port, &ca, &format!("https://localhost:{o}/redirected"), &[]);
    assert_served(&r, 200, Some("GET /redirected probe=\n"));
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/post"),
        &["-d", "direct"],
    );
    assert_served(&r, 200, Some("posted 6 bytes\n"));
    expect_records(
        &front,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "PROXY",
                "00000",
                "-",
                1,
                &format!("GET {}/redirected HTTP/1.1", http(o)),
            ),
            rec(
                "PROXY",
                "00000",
                "-",
                0,
                &format!("POST {}/post HTTP/1.1", http(o)),
            ),
        ],
    );
    assert_eq!(nginx.wait_hit("/redirected").port, o);
    assert_eq!(nginx.wait_hit("/post").body, "direct");
    drop(front);
    let want = rec(
        "PROXY",
        "00000",
        "-",
        0,
        &format!("CONNECT localhost:{o} HTTP/"),
    );
    read_log_line(&plog, "the front's CONNECT", |l| l.starts_with(&want));
    marker(&plog, pport, nginx.plain);
    // Only the GET went that way, and nothing in clear.
    let lines: Vec<String> = log_lines(&plog)
        .into_iter()
        .filter(|l| l.contains(&format!("localhost:{o}")))
        .collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with(&want),
        "the parent's records: {lines:#?}"
    );
    drop(parent);
}

/// `bandlimin` selecting HTTP_GET slows an intercepted download (the
/// tunnel itself is HTTP_CONNECT, which the rule does not select); the
/// bytes arrive intact.
#[test]
fn bandlimin_holds_an_intercepted_download_to_its_rate() {
    let s = Setup::new("mitm_bandlim");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let out = s.dir.join("download.bin");
    // 4 Mbit/s: 1 MiB takes about 2.1 s.
    let (proxy, ca) = s.proxy(
        FMT,
        "bandlimin 4000000 * * * * HTTP_GET",
        &proxy_on(port),
        &[port],
    );
    let t = Instant::now();
    let r = curl_via(
        port,
        &ca,
        &format!("https://localhost:{o}/files/big.bin"),
        &["-o", p(&out)],
    );
    let took = t.elapsed();
    assert_served(&r, 200, Some(""));
    let got = fs::read(&out).unwrap();
    assert_eq!(got.len() as u64, BIG);
    assert!(got == nginx.file, "the download differs from the file");
    assert!(
        took > Duration::from_millis(1500),
        "1 MiB at 4 Mbit/s took {took:?}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[rec(
            "PROXY",
            "00000",
            "-",
            0,
            &format!("GET {}/files/big.bin HTTP/1.1", http(o)),
        )],
    );
}

/// Python's http.client on one tunnel: three GETs and a POST, each its
/// own record; nginx (keepalive_requests 2) closes the origin connection
/// after the second, and the proxy opens a new one for the third while
/// the client's connection stays.
#[test]
fn keep_alive_serves_four_inner_requests_on_one_tunnel() {
    let s = Setup::new("mitm_keepalive");
    let nginx = Nginx::start(&s.dir, &s.pki, "keepalive_requests 2;");
    let o = nginx.port;
    let port = free_port();
    let script = s.dir.write(
        "client.py",
        r#"import http.client, ssl, sys
port, oport, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
c.set_tunnel("localhost", oport)
reqs = [("GET", "/ka/1", None), ("GET", "/ka/2", None), ("GET", "/ka/3", None),
        ("POST", "/post", b"name=value&n=4")]
for i, (m, path, body) in enumerate(reqs):
    c.request(m, path, body=body, headers={"X-Probe": "ka%d" % i})
    r = c.getresponse()
    data = r.read()
    lport = c.sock.getsockname()[1] if c.sock else 0
    print(r.status, lport, data.decode().strip())
c.close()
"#,
    );
    let (proxy, ca) = s.proxy(FMT, "", &proxy_on(port), &[port]);
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .args([port.to_string(), o.to_string(), p(&ca).to_string()])
        .output()
        .expect("run /usr/bin/python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<(&str, &str, &str)> = stdout
        .lines()
        .map(|l| {
            let mut f = l.splitn(3, ' ');
            (f.next().unwrap(), f.next().unwrap(), f.next().unwrap_or(""))
        })
        .collect();
    let bodies: Vec<(&str, &str)> = lines.iter().map(|l| (l.0, l.2)).collect();
    assert_eq!(
        bodies,
        [
            ("200", "GET /ka/1 probe=ka0"),
            ("200", "GET /ka/2 probe=ka1"),
            ("200", "GET /ka/3 probe=ka2"),
            ("200", "posted 14 bytes"),
        ],
        "{stdout}"
    );
    // One client connection (http.client reconnects when one closes).
    assert!(
        lines.iter().all(|l| l.1 == lines[0].1 && l.1 != "0"),
        "the tunnel was not kept: {stdout}"
    );
    let t = |m: &str, path: &str| format!("{m} {}{path} HTTP/1.1", http(o));
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec("PROXY", "00000", "-", 0, &t("GET", "/ka/1")),
            rec("PROXY", "00000", "-", 0, &t("GET", "/ka/2")),
            rec("PROXY", "00000", "-", 0, &t("GET", "/ka/3")),
            rec("PROXY", "00000", "-", 0, &t("POST", "/post")),
        ],
    );
    let hits: Vec<Hit> = ["/ka/1", "/ka/2", "/ka/3", "/post"]
        .iter()
        .map(|u| nginx.wait_hit(u))
        .collect();
    let probes: Vec<&str> = hits.iter().map(|h| h.probe.as_str()).collect();
    assert_eq!(probes, ["ka0", "ka1", "ka2", "ka3"]);
    assert_eq!(hits[3].body, "name=value&n=4");
    // The origin connection was reused, and replaced once nginx closed it.
    let conns: Vec<(u64, u64)> = hits.iter().map(|h| (h.conn, h.nreq)).collect();
    assert!(
        conns[0].0 == conns[1].0 && conns[2].0 == conns[3].0 && conns[0].0 != conns[2].0,
        "origin connections (serial, request): {conns:?}"
    );
    assert_eq!(
        conns.iter().map(|c| c.1).collect::<Vec<_>>(),
        [1, 2, 1, 2],
        "{conns:?}"
    );
}

/// Streams that are not HTTP/1 from the client are relayed intact, with
/// the tunnel's own record: an origin that greets first; a client that
/// speaks first with binary, with a lower-case `get`. HTTP/2's preface is
/// not relayed blind (its requests would pass unchecked): the proxy
/// offers no ALPN, and a client that sends it anyway is answered 400.
#[test]
fn non_http_streams_are_relayed_intact_with_the_tunnels_record() {
    let s = Setup::new("mitm_relay");
    let (greeter, _sni1) = tls_origin(&s.pki, b"220 greetings from the origin\r\n");
    let (echo, _sni2) = tls_origin(&s.pki, b"");
    let port = free_port();
    let (proxy, ca) = s.proxy(FMT, "", &proxy_on(port), &[port]);

    // A large binary transfer both ways, in pieces the echo returns.
    let mut bulk = Vec::new();
    send_pattern(&mut bulk, 3, 4 * BLOCK as u64).unwrap();
    let exchange = |tls: &mut Tls, first: &[u8]| {
        for piece in std::iter::once(first).chain(bulk.chunks(16 * 1024)) {
            tls.write_all(piece).unwrap();
            let mut back = vec![0u8; piece.len()];
            tls.read_exact(&mut back).unwrap();
            assert!(
                back == piece,
                "after a stream that began {:?}, the echo of {:?} came back as {:?}",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(&piece[..piece.len().min(40)]),
                String::from_utf8_lossy(&back[..back.len().min(200)])
            );
        }
    };

    let mut tls = tunnel(port, &ca, "localhost", greeter);
    let mut hello = [0u8; 31];
    tls.read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"220 greetings from the origin\r\n");
    exchange(&mut tls, b"GET / HTTP/1.1\r\n\r\n");
    drop(tls);

    let firsts: [&[u8]; 2] = [
        b"\x00\x01binary\xff\xfe\r\n\x00",
        b"get / http/1.1\r\nhost: x\r\n\r\n",
    ];
    for first in firsts {
        let mut tls = tunnel(port, &ca, "localhost", echo);
        exchange(&mut tls, first);
        drop(tls);
    }
    // HTTP/2's preface: refused inside the TLS session, not echoed.
    let mut tls = tunnel(port, &ca, "localhost", echo);
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 400 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(tls);
    let log = log_of(&proxy);
    let want_greeter = rec(
        "PROXY",
        "00000",
        "-",
        0,
        &format!("CONNECT localhost:{greeter} HTTP/1.1"),
    );
    let want_echo = rec(
        "PROXY",
        "00000",
        "-",
        0,
        &format!("CONNECT localhost:{echo} HTTP/1.1"),
    );
    expect_log_line(&log, &want_greeter);
    wait_for(
        || log_lines(&log).iter().filter(|l| **l == want_echo).count() == 2,
        LOG_TIMEOUT,
    );
    let preface = read_log_line(&log, "the preface's refusal", |l| {
        l.contains("PRI * HTTP/2.0")
    });
    assert!(
        preface.starts_with("PROXY ") && !preface.starts_with("PROXY 00000 "),
        "{preface}"
    );
    let tunnels: Vec<String> = log_lines(&log)
        .into_iter()
        .filter(|l| l.contains("CONNECT ") || l.contains("http://"))
        .collect();
    assert_eq!(
        tunnels,
        [want_greeter, want_echo.clone(), want_echo],
        "one record per relayed tunnel, none for the refused one"
    );
}

/// The SOCKS path: curl through `socks5h://` under ssl_mitm; the inner
/// GET is served, the inner POST refused; records of the SOCKS service.
#[test]
fn socks_tunnels_serve_inner_requests() {
    let s = Setup::new("mitm_socks");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port_pair();
    let services = format!("{}socks -p{} -i127.0.0.1\n", proxy_on(port), port + 1);
    let (proxy, ca) = s.proxy(
        FMT,
        "deny * * * * HTTP_POST\nallow *",
        &services,
        &[port, port + 1],
    );
    let socks = format!("socks5h://127.0.0.1:{}", port + 1);
    let r = curl(
        &ca,
        &["--proxy", &socks, &format!("https://localhost:{o}/socks")],
    );
    assert_served(&r, 200, Some("GET /socks probe=\n"));
    let r = curl(
        &ca,
        &[
            "--proxy",
            &socks,
            "-d",
            "x=1",
            &format!("https://localhost:{o}/post"),
        ],
    );
    assert_forbidden(&r);
    expect_records(
        &proxy,
        port,
        &nginx,
        mentions(format!("localhost:{o}")),
        &[
            rec(
                "SOCK5",
                "00000",
                "-",
                0,
                &format!("GET {}/socks HTTP/1.1", http(o)),
            ),
            rec(
                "SOCK5",
                "00001",
                "-",
                0,
                &format!("POST {}/post HTTP/1.1", http(o)),
            ),
        ],
    );
    nginx.wait_hit("/socks");
    assert!(!nginx.saw("/post"), "{:?}", nginx.hits());
}

/// The tcppm path: the mapped target is the inner requests' destination
/// (their record names it), whatever the client named; the client's Host
/// goes to nginx as sent.
#[test]
fn tcppm_sessions_serve_inner_requests_for_the_mapped_target() {
    let s = Setup::new("mitm_tcppm");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let (port, lport) = (free_port(), free_port());
    let services = format!(
        "{}tcppm -i127.0.0.1 {lport} localhost {o}\n",
        proxy_on(port)
    );
    let (proxy, ca) = s.proxy(
        FMT,
        "deny * * * * HTTP_POST\nallow *",
        &services,
        &[port, lport],
    );
    let resolve = format!("localhost:{lport}:127.0.0.1");
    let r = curl(
        &ca,
        &[
            "--resolve",
            &resolve,
            &format!("https://localhost:{lport}/mapped"),
        ],
    );
    assert_served(&r, 200, Some("GET /mapped probe=\n"));
    let r = curl(
        &ca,
        &[
            "--resolve",
            &resolve,
            "-d",
            "x",
            &format!("https://localhost:{lport}/post"),
        ],
    );
    assert_forbidden(&r);
    expect_records(
        &proxy,
        port,
        &nginx,
        // Not the startup line, nor the readiness probe's handshake.
        |l| {
            l.starts_with("TCPPM ")
                && !l.contains("Accepting connections")
                && !l.starts_with("TCPPM 08012 ")
        },
        &[
            rec(
                "TCPPM",
                "00000",
                "-",
                0,
                &format!("GET {}/mapped HTTP/1.1", http(o)),
            ),
            rec(
                "TCPPM",
                "00001",
                "-",
                0,
                &format!("POST {}/post HTTP/1.1", http(o)),
            ),
        ],
    );
    let hit = nginx.wait_hit("/mapped");
    // The client's Host goes to the origin unchanged, as 3proxy passes it
    // and as the blind relay did (the record names the mapped target).
    assert_eq!(
        hit.host,
        format!("localhost:{lport}"),
        "the Host field nginx got (the client sent localhost:{lport})"
    );
    assert!(!nginx.saw("/post"), "{:?}", nginx.hits());
}

/// The tlspr path: the client's SNI names the destination (tlspr's `-P`
/// port), its ClientHello is taken by the proxy's own handshake, and the
/// requests inside are served, refused and logged as the HTTP proxy's.
#[test]
fn tlspr_sessions_serve_inner_requests_for_their_sni() {
    let s = Setup::new("mitm_tlspr");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let (port, tport) = (free_port(), free_port());
    let services = format!("{}tlspr -i127.0.0.1 -p{tport} -P{o}\n", proxy_on(port));
    let (proxy, ca) = s.proxy(
        FMT,
        "deny * * * * HTTP_POST\nallow *",
        &services,
        &[port, tport],
    );
    let resolve = format!("localhost:{tport}:127.0.0.1");
    let url = |path: &str| format!("https://localhost:{tport}{path}");
    // Two requests on one connection (curl's -w writes the first one's
    // status between the bodies).
    let r = curl(&ca, &["--resolve", &resolve, &url("/sni1"), &url("/sni2")]);
    assert_served(&r, 200, Some("GET /sni1 probe=\n\n200GET /sni2 probe=\n"));
    let r = curl(&ca, &["--resolve", &resolve, "-d", "x", &url("/post")]);
    assert_forbidden(&r);
    expect_records(
        &proxy,
        port,
        &nginx,
        |l| l.starts_with("TLSPR ") && l.contains("http://"),
        &[
            rec(
                "TLSPR",
                "00000",
                "-",
                0,
                &format!("GET {}/sni1 HTTP/1.1", http(o)),
            ),
            rec(
                "TLSPR",
                "00000",
                "-",
                0,
                &format!("GET {}/sni2 HTTP/1.1", http(o)),
            ),
            rec(
                "TLSPR",
                "00001",
                "-",
                0,
                &format!("POST {}/post HTTP/1.1", http(o)),
            ),
        ],
    );
    assert!(nginx.saw("/sni1") && nginx.saw("/sni2"));
    assert!(!nginx.saw("/post"), "{:?}", nginx.hits());
}

/// A record's fields pinned with a logformat: service, code, the request
/// line in absolute form, the bytes sent to the server (what nginx read)
/// and to the client (what the client read) for that request. A plain
/// request through the same proxy is the control of the byte counts.
#[test]
fn inner_request_record_format() {
    let s = Setup::new("mitm_format");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let port = free_port();
    let (proxy, ca) = s.proxy("L%N %E %T %O %I", "", &proxy_on(port), &[port]);
    let log = log_of(&proxy);

    // The control: a plain HTTP request to nginx's plain port.
    let pl = nginx.plain;
    let mut c = connect(localhost(port));
    write!(
        c,
        "GET http://127.0.0.1:{pl}/plain HTTP/1.1\r\nHost: 127.0.0.1:{pl}\r\nX-Probe: fmt0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let got = read_to_close(&mut c);
    assert_eq!(status_of(&got), 200, "{}", String::from_utf8_lossy(&got));
    let hit = nginx.wait_hit("/plain");
    expect_log_line(
        &log,
        &format!(
            "PROXY 00000 GET http://127.0.0.1:{pl}/plain HTTP/1.1 {} {}",
            hit.len,
            got.len()
        ),
    );

    // The same inside an intercepted tunnel.
    let mut tls = tunnel(port, &ca, "localhost", o);
    write!(
        tls,
        "GET /fixed HTTP/1.1\r\nHost: localhost:{o}\r\nX-Probe: fmt1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let got = read_to_close(&mut tls);
    let text = String::from_utf8_lossy(&got);
    assert_eq!(status_of(&got), 200, "{text}");
    assert!(text.ends_with("\r\n\r\nGET /fixed probe=fmt1\n"), "{text}");
    let hit = nginx.wait_hit("/fixed");
    let want = format!(
        "PROXY 00000 GET http://localhost:{o}/fixed HTTP/1.1 {} {}",
        hit.len,
        got.len()
    );
    expect_log_line(&log, &want);
    marker(&log, port, pl);
    let about: Vec<String> = log_lines(&log)
        .into_iter()
        .filter(|l| l.contains(&format!("localhost:{o}")))
        .collect();
    assert_eq!(about, [want]);
}

/// Inside the TLS session the proxy serves the tunnel's destination
/// only: an absolute URL of another host, an ftp:// URL and a CONNECT are
/// refused (400 or 501), each with a record, and reach nobody.
#[test]
fn inner_requests_for_elsewhere_are_refused() {
    let s = Setup::new("mitm_elsewhere");
    let nginx = Nginx::start(&s.dir, &s.pki, "");
    let o = nginx.port;
    let pl = nginx.plain;
    let port = free_port();
    let (proxy, ca) = s.proxy(FMT, "", &proxy_on(port), &[port]);
    let asks = [
        (
            format!("GET http://127.0.0.1:{pl}/elsewhere HTTP/1.1\r\nHost: 127.0.0.1:{pl}\r\n\r\n"),
            format!("127.0.0.1:{pl}/elsewhere"),
        ),
        (
            "GET ftp://localhost/ftp-inside HTTP/1.1\r\nHost: localhost\r\n\r\n".to_string(),
            "ftp://localhost/ftp-inside".to_string(),
        ),
        (
            format!("CONNECT 127.0.0.1:{pl} HTTP/1.1\r\nHost: 127.0.0.1:{pl}\r\n\r\n"),
            format!("CONNECT 127.0.0.1:{pl}"),
        ),
    ];
    for (req, what) in &asks {
        let mut tls = tunnel(port, &ca, "localhost", o);
        tls.write_all(req.as_bytes()).unwrap();
        let got = read_answer(&mut tls);
        let status = status_of(&got);
        assert!(
            status == 400 || status == 501,
            "{what}: {}",
            String::from_utf8_lossy(&got)
        );
        let line = read_log_line(&log_of(&proxy), &format!("about {what}"), |l| {
            l.contains(what.as_str())
        });
        assert!(
            line.starts_with("PROXY ") && !line.starts_with("PROXY 00000 "),
            "{line}"
        );
    }
    marker(&log_of(&proxy), port, pl);
    let hits = nginx.hits();
    assert!(
        hits.iter().all(|h| h.uri.starts_with("/marker-")),
        "nginx was asked: {hits:?}"
    );
}
