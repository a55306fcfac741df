//! TLS from clients (`ssl_serv`, issue #13) with real clients: curl as an
//! HTTPS-proxy client, `openssl s_client`, and rustls for exact byte
//! counts. A throwaway CA, server and client certificates are made with
//! the openssl CLI in each test's temp dir; no test skips verification.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::http::HttpOrigin;
use crate::util::*;

/// The log format of these tests: service, code, client, text.
const FMT: &str = "L%N %E %C %T";

/// Certificates made for one test.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A key of no certificate here.
    other_key: PathBuf,
}

fn openssl(dir: &Dir, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir.join("."))
        .output()
        .expect("run openssl (tests/deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    pub fn new(dir: &Dir) -> Pki {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=threeproxy test CA",
        ]);
        openssl(dir, &ca);
        for (name, cn, usage) in [
            ("srv", "localhost", "serverAuth"),
            ("cli", "client", "clientAuth"),
        ] {
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            let mut req = vec!["req", "-nodes"];
            req.extend(ec);
            let subj = format!("/CN={cn}");
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(dir, &req);
            dir.write(
                &ext,
                format!(
                    "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                     keyUsage=digitalSignature\nextendedKeyUsage={usage}\n"
                ),
            );
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &pem,
                    "-extfile",
                    &ext,
                ],
            );
        }
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                "other.key",
            ],
        );
        Pki {
            ca: dir.join("ca.pem"),
            cert: dir.join("srv.pem"),
            key: dir.join("srv.key"),
            client_cert: dir.join("cli.pem"),
            client_key: dir.join("cli.key"),
            other_key: dir.join("other.key"),
        }
    }

    /// The cfg lines of a TLS service.
    fn serv(&self) -> String {
        format!(
            "ssl_server_cert {}\nssl_server_key {}\nssl_serv\n",
            p(&self.cert),
            p(&self.key)
        )
    }
}

/// curl through the HTTPS proxy on `port`, trusting only `ca`: (exit
/// status success, stdout, stderr).
fn curl_https(port: u16, ca: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(["--proxy", &format!("https://127.0.0.1:{port}")])
        .args(["--proxy-cacert", p(ca)])
        .args(args)
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A rustls client's settings trusting only the CAs of `ca` (a PEM file).
pub(crate) fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Arc::new(cfg)
}

/// A rustls client session to `port`, trusting only `ca`.
fn tls_connect(ca: &Path, port: u16) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(client_config(ca), name).unwrap();
    let sock = connect(localhost(port));
    set_timeouts(&sock, Duration::from_secs(30));
    rustls::StreamOwned::new(conn, sock)
}

fn sha(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x} {}", Sha256::digest(b), b.len())
}

#[test]
fn https_proxy_get_post_keepalive_and_connect_with_curl() {
    let dir = Dir::new("tls_https_proxy");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let port = free_port();
    let cfg = format!("{}proxy -p{port} -i127.0.0.1\n", pki.serv());
    let proxy = start(dir, FMT, &cfg, &[port]).0;

    let (ok, body, err) = curl_https(port, &pki.ca, &[&origin.url("/hello")]);
    assert!(ok, "{err}");
    assert_eq!(body, "hello");

    let (ok, body, err) = curl_https(
        port,
        &pki.ca,
        &["--data-binary", "abc over tls", &origin.url("/sha")],
    );
    assert!(ok, "{err}");
    assert_eq!(body, sha(b"abc over tls"));

    // Two requests on one TLS connection: curl connects once.
    let (ok, out, err) = curl_https(
        port,
        &pki.ca,
        &[
            "-w",
            " [%{num_connects}]",
            &origin.url("/hello"),
            &origin.url("/len/5"),
        ],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("hello [1]"), "{out}");
    assert!(
        out.ends_with(" [0]"),
        "the second request reconnected: {out}"
    );

    // A large body, byte-exact (the proxy's body path over TLS).
    let len = 64 * BLOCK as u64;
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60"])
        .args(["--proxy", &format!("https://127.0.0.1:{port}")])
        .args(["--proxy-cacert", p(&pki.ca)])
        .arg(origin.url(&format!("/pattern/{len}")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = hash_to_eof(&mut &out.stdout[..]).unwrap();
    assert_eq!(got, pattern_digest(7, len));

    // A plain CONNECT tunnel inside the TLS connection to the proxy.
    let (ok, body, err) = curl_https(port, &pki.ca, &["-p", &origin.url("/hello")]);
    assert!(ok, "{err}");
    assert_eq!(body, "hello");
    let log = log_of(&proxy);
    read_log_line(&log, "of the CONNECT", |l| {
        l.starts_with("PROXY 00000 ") && l.contains("CONNECT 127.0.0.1:")
    });
    read_log_line(&log, "of the POST", |l| {
        l.starts_with("PROXY 00000 ") && l.contains("POST http://127.0.0.1:")
    });
}

#[test]
fn auth_strong_answers_407_over_tls() {
    let dir = Dir::new("tls_auth");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let port = free_port();
    let cfg = format!(
        "users alice:CL:secret\nauth strong\n{}proxy -p{port} -i127.0.0.1\n",
        pki.serv()
    );
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let (ok, out, err) = curl_https(
        port,
        &pki.ca,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &origin.url("/hello"),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "407");
    let (ok, body, err) = curl_https(
        port,
        &pki.ca,
        &["--proxy-user", "alice:secret", &origin.url("/hello")],
    );
    assert!(ok, "{err}");
    assert_eq!(body, "hello");
}

#[test]
fn tcppm_over_tls_with_openssl_s_client() {
    let dir = Dir::new("tls_s_client");
    let pki = Pki::new(&dir);
    let echo = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "{}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        pki.serv(),
        echo.port()
    );
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-verify_return_error",
            "-servername",
            "localhost",
        ])
        .args([
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
            p(&pki.ca),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let line = b"hello through tls\n";
    stdin.write_all(line).unwrap();
    stdin.flush().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut got = vec![0u8; line.len()];
        let r = stdout.read_exact(&mut got).map(|_| got);
        let _ = tx.send(r);
    });
    let got = rx.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(got.expect("echo in time").expect("echo read"), line);
}

#[test]
fn tcppm_over_tls_moves_large_transfers_exactly() {
    let dir = Dir::new("tls_large");
    let pki = Pki::new(&dir);
    let len = 64 * BLOCK as u64; // 4 MiB each way
    let (origin, rx) = Origin::hash_sink(len, 7);
    let port = free_port();
    let cfg = format!(
        "{}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        pki.serv(),
        origin.port()
    );
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = tls_connect(&pki.ca, port);
    // Both directions at once: the origin sends while it reads.
    send_pattern(&mut s, 3, len).expect("send through TLS");
    s.conn.send_close_notify();
    s.flush().unwrap();
    let up = recv_nonempty(&rx, Duration::from_secs(60));
    assert_eq!(up, pattern_digest(3, len), "client to origin");
    let down = hash_to_eof(&mut s).expect("read through TLS");
    assert_eq!(down, pattern_digest(7, len), "origin to client");
}

#[test]
fn plain_http_to_a_tls_port_is_closed_and_logged() {
    let dir = Dir::new("tls_plain");
    let pki = Pki::new(&dir);
    let port = free_port();
    let cfg = format!("{}proxy -p{port} -i127.0.0.1\n", pki.serv());
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    s.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let got = read_until_closed(&mut s).expect("closed, not timed out");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    let line = read_log_line(&log_of(&proxy), "with 08014", |l| {
        l.starts_with("PROXY 08014 ")
    });
    assert!(line.contains("did not speak TLS"), "{line}");
}

#[test]
fn a_silent_client_times_out_in_the_handshake() {
    let dir = Dir::new("tls_timeout");
    let pki = Pki::new(&dir);
    let port = free_port();
    // STRING_SHORT (the third timeout) is 1 s.
    let cfg = format!("timeouts 1 5 1\n{}proxy -p{port} -i127.0.0.1\n", pki.serv());
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let t = Instant::now();
    let got = read_until_closed(&mut s).expect("closed");
    assert!(got.is_empty());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    read_log_line(&log_of(&proxy), "with 08015", |l| {
        l.starts_with("PROXY 08015 ")
    });
}

#[test]
fn client_certificates_required_by_ssl_server_verify() {
    let dir = Dir::new("tls_mtls");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let port = free_port();
    let cfg = format!(
        "ssl_server_verify\nssl_server_ca_file {}\n{}proxy -p{port} -i127.0.0.1\n",
        p(&pki.ca),
        pki.serv()
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let (ok, body, _) = curl_https(port, &pki.ca, &[&origin.url("/hello")]);
    assert!(!ok, "served without a client certificate: {body}");
    read_log_line(&log_of(&proxy), "with 08016", |l| {
        l.starts_with("PROXY 08016 ")
    });
    let (ok, body, err) = curl_https(
        port,
        &pki.ca,
        &[
            "--proxy-cert",
            p(&pki.client_cert),
            "--proxy-key",
            p(&pki.client_key),
            &origin.url("/hello"),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(body, "hello");
    assert_eq!(
        origin.conns(),
        1,
        "only the client with a certificate got through"
    );
}

#[test]
fn tls_cfg_errors_name_the_line() {
    let dir = Dir::new("tls_cfg_errors");
    let pki = Pki::new(&dir);
    let cfg_path = dir.cfg_path();
    let port = free_port();
    // A key of another certificate: the service's line.
    let cfg = format!(
        "ssl_server_cert {}\nssl_server_key {}\nssl_serv\nproxy -p{port} -i127.0.0.1\n",
        p(&pki.cert),
        p(&pki.other_key)
    );
    let msg = run_cfg(&dir, &[], &cfg).assert_cfg_error(&cfg_path, 4, "proxy");
    assert!(msg.contains("ssl_server_key"), "{msg}");
    // ssl_serv without a certificate.
    let cfg = format!("ssl_serv\nproxy -p{port} -i127.0.0.1\n");
    let msg = run_cfg(&dir, &[], &cfg).assert_cfg_error(&cfg_path, 2, "proxy");
    assert!(msg.contains("ssl_server_cert"), "{msg}");
    // A file that cannot be read: its own line.
    let msg = run_cfg(&dir, &[], "maxconn 5\nssl_server_cert /nonexistent/c.pem\n")
        .assert_cfg_error(&cfg_path, 2, "ssl_server_cert");
    assert!(msg.contains("/nonexistent/c.pem"), "{msg}");
    // A key file that is a certificate.
    let cfg = format!("ssl_server_key {}\n", p(&pki.cert));
    run_cfg(&dir, &[], &cfg).assert_cfg_error(&cfg_path, 1, "ssl_server_key");
    // Weak and unknown protocol versions.
    let msg = run_cfg(&dir, &[], "ssl_server_min_proto_version TLSv1.1\n").assert_cfg_error(
        &cfg_path,
        1,
        "ssl_server_min_proto_version",
    );
    assert!(msg.contains("weak"), "{msg}");
    let msg = run_cfg(&dir, &[], "ssl_client_max_proto_version TLSv2\n").assert_cfg_error(
        &cfg_path,
        1,
        "ssl_client_max_proto_version",
    );
    assert!(msg.contains("unknown protocol version"), "{msg}");
    // A CA directory with no certificate in it.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let msg = run_cfg(&dir, &[], format!("ssl_client_ca_dir {}\n", p(&empty))).assert_cfg_error(
        &cfg_path,
        1,
        "ssl_client_ca_dir",
    );
    assert!(msg.contains("no PEM CA certificate"), "{msg}");
}

#[test]
fn a_3proxy_https_cfg_with_ssl_plugin_starts_and_serves() {
    // As 3proxy's users write it: the plugin line names a file that need
    // not exist here (TLS is built in).
    let dir = Dir::new("tls_plugin_cfg");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let (port, plain) = (free_port(), free_port());
    let cfg = format!(
        "plugin /usr/local/3proxy/libexec/SSLPlugin.ld.so ssl_plugin\n\
         ssl_server_cert {}\nssl_server_key {}\nssl_serv\n\
         proxy -p{port} -i127.0.0.1\nssl_noserv\nproxy -p{plain} -i127.0.0.1\n",
        p(&pki.cert),
        p(&pki.key)
    );
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let (ok, body, err) = curl_https(port, &pki.ca, &[&origin.url("/hello")]);
    assert!(ok, "{err}");
    assert_eq!(body, "hello");
    // Below ssl_noserv: plain HTTP.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--proxy"])
        .arg(format!("http://127.0.0.1:{plain}"))
        .arg(origin.url("/hello"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello");
}

/// The resident memory of `n` idle sessions through a tcppm, TLS or not:
/// each session has moved a few bytes and then waits.
fn idle_cost_kb(tls: bool, n: usize) -> (u64, u64) {
    let dir = Dir::new(if tls { "tls_idle" } else { "tls_idle_plain" });
    let pki = Pki::new(&dir);
    let echo = Origin::echo();
    let port = free_port();
    let serv = if tls { pki.serv() } else { String::new() };
    let cfg = format!(
        "maxconn 1000\n{serv}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        echo.port()
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let before = proxy.rss_kb();
    let mut keep: Vec<Box<dyn Send>> = Vec::new();
    for _ in 0..n {
        if tls {
            let mut s = tls_connect(&pki.ca, port);
            echo_roundtrip(&mut s, b"ping");
            keep.push(Box::new(s));
        } else {
            let mut s = connect(localhost(port));
            set_timeouts(&s, Duration::from_secs(30));
            echo_roundtrip(&mut s, b"ping");
            keep.push(Box::new(s));
        }
    }
    let after = proxy.rss_kb();
    drop(keep);
    (before, after)
}

#[test]
fn idle_tls_sessions_cost_little() {
    let n = 100;
    let (pb, pa) = idle_cost_kb(false, n);
    let (tb, ta) = idle_cost_kb(true, n);
    let plain = pa.saturating_sub(pb) / n as u64;
    let tls = ta.saturating_sub(tb) / n as u64;
    println!("idle sessions, VmRSS per session: plain {plain} KB, TLS {tls} KB ({n} each)");
    // A TLS session holds rustls's state (about 20 KB), but no relay
    // buffers while idle and not the stack pages its handshake touched
    // (given back after it): a bound, not a benchmark.
    assert!(
        tls <= 3 * plain.max(16),
        "TLS {tls} KB against plain {plain} KB"
    );
}

/// Two of our processes: `back`, a proxy under ssl_serv, and `front`,
/// whose cfg is `client` with BACK replaced by back's port and FRONT by
/// the `front` service line (which has a parent ending in `s` at BACK).
fn chain_pair(name: &str, pki: &Pki, client: &str, front: &str) -> (Proxy, Proxy) {
    chain_pair_to("proxy", name, pki, client, front)
}

/// [`chain_pair`] with `back_service` (`proxy`, `socks`) as the back.
fn chain_pair_to(
    back_service: &str,
    name: &str,
    pki: &Pki,
    client: &str,
    front: &str,
) -> (Proxy, Proxy) {
    let back_port = free_port();
    let back = start(
        Dir::new(&format!("{name}_back")),
        FMT,
        &format!("{}{back_service} -p{back_port} -i127.0.0.1\n", pki.serv()),
        &[back_port],
    )
    .0;
    let front_port = front
        .split_whitespace()
        .find_map(|w| w.strip_prefix("-p").and_then(|p| p.parse().ok()))
        .expect("front -pPORT");
    let front = start(
        Dir::new(&format!("{name}_front")),
        FMT,
        &client
            .replace("BACK", &back_port.to_string())
            .replace("FRONT", front),
        &[front_port],
    )
    .0;
    (back, front)
}

#[test]
fn https_and_connect_plus_s_parents_speak_tls_to_our_ssl_serv() {
    let dir = Dir::new("tls_parent");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let echo = Origin::echo();
    let fport = free_port();
    // An `https` parent under the HTTP proxy, its certificate checked.
    let client = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nallow *\nparent 1000 https 127.0.0.1 BACK\nFRONT\n",
        p(&pki.ca)
    );
    let (back, front) = chain_pair(
        "tls_parent_https",
        &pki,
        &client,
        &format!("proxy -p{fport} -i127.0.0.1"),
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--proxy"])
        .arg(format!("http://127.0.0.1:{fport}"))
        .arg(origin.url("/hello"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_log_line(&log_of(&back), "of the request over TLS", |l| {
        l.starts_with("PROXY 00000 ") && l.contains("GET http://127.0.0.1:")
    });
    drop(front);

    // tcppm through a `connect+s` parent: CONNECT inside TLS.
    let tport = free_port();
    let client = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nallow *\nparent 1000 connect+s 127.0.0.1 BACK\nFRONT\n",
        p(&pki.ca)
    );
    let (back, _front) = chain_pair(
        "tls_parent_connect",
        &pki,
        &client,
        &format!(
            "tcppm -p{tport} -i127.0.0.1 {tport} 127.0.0.1 {}",
            echo.port()
        ),
    );
    let mut s = connect(localhost(tport));
    set_timeouts(&s, Duration::from_secs(30));
    echo_roundtrip(&mut s, b"through two proxies and TLS");
    drop(s);
    read_log_line(&log_of(&back), "of the CONNECT over TLS", |l| {
        l.starts_with("PROXY 00000 ") && l.contains("CONNECT 127.0.0.1:")
    });
}

#[test]
fn a_socks5s_parent_reaches_socks_under_ssl_serv() {
    let dir = Dir::new("tls_parent_socks");
    let pki = Pki::new(&dir);
    let echo = Origin::echo();
    let tport = free_port();
    let client = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nallow *\nparent 1000 socks5s 127.0.0.1 BACK\nFRONT\n",
        p(&pki.ca)
    );
    let (back, _front) = chain_pair_to(
        "socks",
        "tls_parent_socks",
        &pki,
        &client,
        &format!(
            "tcppm -p{tport} -i127.0.0.1 {tport} 127.0.0.1 {}",
            echo.port()
        ),
    );
    let mut s = connect(localhost(tport));
    set_timeouts(&s, Duration::from_secs(30));
    echo_roundtrip(&mut s, b"socks5 inside TLS");
    echo_roundtrip(&mut s, &vec![b'z'; 300_000]);
    drop(s);
    read_log_line(&log_of(&back), "of the SOCKS5 session over TLS", |l| {
        l.starts_with("SOCK5 00000 ")
    });
}

#[test]
fn a_tls_parent_hop_starts_with_a_client_hello() {
    // A raw listener as the parent: the first byte is a TLS handshake
    // record (0x16), not an HTTP request.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let pport = listener.local_addr().unwrap().port();
    let dir = Dir::new("tls_parent_wire");
    let port = free_port();
    let cfg = format!("allow *\nparent 1000 https 127.0.0.1 {pport}\nproxy -p{port} -i127.0.0.1\n");
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut c = connect(localhost(port));
    set_timeouts(&c, Duration::from_secs(30));
    c.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        .unwrap();
    let mut peer = accept_within(&listener, Duration::from_secs(10)).expect("the parent dialled");
    set_timeouts(&peer, Duration::from_secs(10));
    let mut first = [0u8; 3];
    peer.read_exact(&mut first).unwrap();
    assert_eq!(first, [0x16, 0x03, 0x01], "a TLS handshake record");
}

#[test]
fn a_parent_whose_certificate_is_not_trusted_is_refused_with_8011() {
    let dir = Dir::new("tls_parent_untrusted");
    let pki = Pki::new(&dir);
    let origin = HttpOrigin::start();
    let fport = free_port();
    // Verification on, with the built-in roots only: our test CA is not
    // among them.
    let client = "ssl_client_verify\nallow *\nparent 1000 https 127.0.0.1 BACK\nFRONT\n";
    let (_back, front) = chain_pair(
        "tls_parent_untrusted",
        &pki,
        client,
        &format!("proxy -p{fport} -i127.0.0.1"),
    );
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--proxy",
        ])
        .arg(format!("http://127.0.0.1:{fport}"))
        .arg(origin.url("/hello"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "502");
    read_log_line(&log_of(&front), "with 08011", |l| {
        l.starts_with("PROXY 08011 ")
    });
    assert_eq!(origin.conns(), 0);
}

/// A TLS origin of the test's own (rustls, `pki`'s server certificate):
/// each client gets `greeting`, then its bytes echoed. The SNI of every
/// handshake that finished is sent on the channel.
pub(crate) fn tls_origin(
    pki: &Pki,
    greeting: &'static [u8],
) -> (u16, std::sync::mpsc::Receiver<Option<String>>) {
    tls_origin_with(pki, greeting, false)
}

/// [`tls_origin`], asking for a client certificate of `pki`'s CA when
/// `client_cert`.
fn tls_origin_with(
    pki: &Pki,
    greeting: &'static [u8],
    client_cert: bool,
) -> (u16, std::sync::mpsc::Receiver<Option<String>>) {
    let certs: Vec<_> = CertificateDer::pem_file_iter(&pki.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&pki.key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap();
    let cfg = if client_cert {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&pki.ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        cfg.with_client_cert_verifier(v)
    } else {
        cfg.with_no_client_auth()
    };
    let cfg = Arc::new(cfg.with_single_cert(certs, key).unwrap());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(sock) = sock else { return };
            let (cfg, tx) = (cfg.clone(), tx.clone());
            std::thread::spawn(move || {
                set_timeouts(&sock, Duration::from_secs(30));
                let conn = rustls::ServerConnection::new(cfg).unwrap();
                let mut s = rustls::StreamOwned::new(conn, sock);
                while s.conn.is_handshaking() {
                    if s.conn.complete_io(&mut s.sock).is_err() {
                        return;
                    }
                }
                let _ = tx.send(s.conn.server_name().map(str::to_string));
                if s.write_all(greeting).is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    if s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

#[test]
fn ssl_cli_tcppm_speaks_tls_to_the_destination_with_its_name_as_sni() {
    let dir = Dir::new("tls_cli_tcppm");
    let pki = Pki::new(&dir);
    let (oport, sni) = tls_origin(&pki, b"hello from the tls origin\n");
    let port = free_port();
    let cfg = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nssl_cli\n\
         tcppm -i127.0.0.1 {port} localhost {oport}\n",
        p(&pki.ca)
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut got = vec![0u8; 26];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, b"hello from the tls origin\n");
    s.write_all(b"plain in, tls out\n").unwrap();
    let mut echo = vec![0u8; 18];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(echo, b"plain in, tls out\n");
    assert_eq!(
        sni.recv_timeout(Duration::from_secs(30))
            .unwrap()
            .as_deref(),
        Some("localhost")
    );
    drop(s);
    read_log_line(&log_of(&proxy), "tcppm's record", |l| {
        l.starts_with("TCPPM 00000 ")
    });
}

#[test]
fn ssl_cli_sends_ssl_client_sni_and_modes_1_and_2_do_the_same() {
    for mode in ["1", "2"] {
        let dir = Dir::new(&format!("tls_cli_sni{mode}"));
        let pki = Pki::new(&dir);
        let (oport, sni) = tls_origin(&pki, b"hi\n");
        let port = free_port();
        // No verification (3proxy's default): the name is sent anyway.
        let cfg = format!(
            "ssl_client_sni example.test\nssl_client_mode {mode}\nssl_client\n\
             tcppm -i127.0.0.1 {port} 127.0.0.1 {oport}\n"
        );
        let _proxy = start(dir, FMT, &cfg, &[port]).0;
        let mut s = connect(localhost(port));
        set_timeouts(&s, Duration::from_secs(30));
        let mut got = [0u8; 3];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi\n");
        assert_eq!(
            sni.recv_timeout(Duration::from_secs(30))
                .unwrap()
                .as_deref(),
            Some("example.test"),
            "mode {mode}"
        );
    }
}

#[test]
fn ssl_cli_with_an_untrusted_destination_is_refused_with_8011() {
    let dir = Dir::new("tls_cli_untrusted");
    let pki = Pki::new(&dir);
    let (oport, sni) = tls_origin(&pki, b"must not be seen\n");
    let port = free_port();
    // Verification with the built-in roots only: the test CA is not one.
    let cfg = format!("ssl_client_verify\nssl_cli\ntcppm -i127.0.0.1 {port} localhost {oport}\n");
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got, b"", "the client gets nothing of the origin");
    read_log_line(&log_of(&proxy), "with 08011", |l| {
        l.starts_with("TCPPM 08011 ")
    });
    assert!(sni.try_recv().is_err(), "no handshake finished");
}

#[test]
fn ssl_cli_mode_3_is_tls_to_parents_only_for_any_tcp_service() {
    // Mode 3 stays as it was: TLS to parents, any TCP service (tlspr and
    // ftppr too, which modes 0-2 refuse: tests/sslcli.rs).
    let (port, fport) = (free_port(), free_port());
    let cfg = format!(
        "ssl_cli\nssl_client_mode 3\nproxy -p{port} -i127.0.0.1\nftppr -p{fport} -i127.0.0.1\n"
    );
    let _ = start(Dir::new("tls_cli_mode3"), FMT, &cfg, &[port]).0;
}

#[test]
fn ssl_cli_presents_ssl_client_cert_to_a_destination_that_asks() {
    let dir = Dir::new("tls_cli_client_cert");
    let pki = Pki::new(&dir);
    let (oport, sni) = tls_origin_with(&pki, b"client known\n", true);
    let (port, port2) = (free_port(), free_port());
    // With the certificate the origin greets; without it, it refuses the
    // handshake and the session ends with 8011 (TLS 1.2: the refusal comes
    // before the origin's Finished, inside our handshake).
    let cfg = format!(
        "ssl_client_cert {}\nssl_client_key {}\nssl_client_max_proto_version TLSv1.2\n\
         ssl_cli\ntcppm -i127.0.0.1 {port} 127.0.0.1 {oport}\n\
         ssl_client_cert\nssl_client_key\ntcppm -i127.0.0.1 {port2} 127.0.0.1 {oport}\n",
        p(&pki.client_cert),
        p(&pki.client_key)
    );
    let (proxy, _) = start(dir, FMT, &cfg, &[port, port2]);
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let mut got = [0u8; 13];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"client known\n");
    assert!(sni.recv_timeout(Duration::from_secs(30)).is_ok());
    let mut s = connect(localhost(port2));
    set_timeouts(&s, Duration::from_secs(30));
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got, b"");
    read_log_line(&log_of(&proxy), "with 08011", |l| {
        l.starts_with("TCPPM 08011 ")
    });
}

/// A CA of its own for `ssl_mitm` to sign with, in `dir`: (mitm.pem,
/// mitm.key), PKCS#8 as OpenSSL 3 writes it.
pub(crate) fn mitm_ca(dir: &Dir) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "mitm.key",
            "-out",
            "mitm.pem",
            "-subj",
            "/CN=threeproxy MITM CA",
        ],
    );
    (dir.join("mitm.pem"), dir.join("mitm.key"))
}

/// What the TLS origin of the MITM tests says to every client: an HTTP
/// answer, so curl is served.
const MITM_HELLO: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n";

/// Through the HTTP proxy on `port`: CONNECT to `host:oport`, then TLS
/// inside trusting only `ca`, as `host`. The origin's greeting and the
/// leaf certificate the client was served.
fn leaf_via_connect(port: u16, ca: &Path, host: &str, oport: u16) -> (Vec<u8>, Vec<u8>) {
    let mut tls = crate::mitm::tunnel(port, ca, host, oport);
    let mut got = vec![0u8; MITM_HELLO.len()];
    tls.read_exact(&mut got).unwrap();
    let leaf = tls.conn.peer_certificates().unwrap()[0].to_vec();
    (got, leaf)
}

/// The cfg of an intercepting HTTP proxy on `port` and SOCKS on `port + 1`
/// (take them from free_port_pair) signing with `ca`,
/// caching in `cache`, trusting origins of `origin_ca` (the built-in
/// roots if None).
fn mitm_cfg(port: u16, ca: &(PathBuf, PathBuf), cache: &Path, origin_ca: Option<&Path>) -> String {
    let trust = origin_ca.map_or(String::new(), |c| format!("ssl_client_ca_file {}\n", p(c)));
    format!(
        "ssl_client_verify\n{trust}ssl_server_ca_file {}\nssl_server_ca_key {}\n\
         ssl_certcache {}/\nssl_mitm\nproxy -p{port} -i127.0.0.1\n\
         socks -p{} -i127.0.0.1\n",
        p(&ca.0),
        p(&ca.1),
        p(cache),
        port + 1
    )
}

#[test]
fn ssl_mitm_serves_a_leaf_of_its_ca_cached_and_reused_after_a_restart() {
    let keep = Dir::new("tls_mitm_cache");
    let pki = Pki::new(&keep);
    let ca = mitm_ca(&keep);
    let cache = keep.join("cache");
    std::fs::create_dir(&cache).unwrap();
    let (oport, _sni) = tls_origin(&pki, MITM_HELLO);
    let port = free_port_pair();
    let cfg = mitm_cfg(port, &ca, &cache, Some(&pki.ca));
    let proxy = start(Dir::new("tls_mitm_a"), FMT, &cfg, &[port]).0;

    // curl trusts only our MITM CA: the origin's own certificate (of
    // another CA) would fail; the leaf it sees is ours, for the name.
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "30"])
        .args(["--proxy", &format!("http://127.0.0.1:{port}")])
        .args(["--cacert", p(&ca.0)])
        .arg(format!("https://localhost:{oport}/"))
        .output()
        .expect("run curl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "curl failed:\n{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert!(err.contains("issuer: CN=threeproxy MITM CA"), "{err}");
    assert!(err.contains("subject: CN=localhost"), "{err}");

    // The cache gained the name's file, 0600, holding the leaf served.
    let file = cache.join("localhost.pem");
    let meta = std::fs::metadata(&file).expect("the cache file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let cached = CertificateDer::from_pem_file(&file).unwrap().to_vec();
    let (got, leaf1) = leaf_via_connect(port, &ca.0, "localhost", oport);
    assert_eq!(got, MITM_HELLO);
    assert_eq!(sha(&leaf1), sha(&cached), "the second request reuses it");

    // SOCKS CONNECT is intercepted too, with the same leaf.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(["--proxy", &format!("socks5h://127.0.0.1:{}", port + 1)])
        .args(["--cacert", p(&ca.0)])
        .arg(format!("https://localhost:{oport}/"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");

    // Another name, another file; an IP address is certified as one.
    let (_, leaf_ip) = leaf_via_connect(port, &ca.0, "127.0.0.1", oport);
    assert_ne!(sha(&leaf_ip), sha(&leaf1));
    assert!(cache.join("127.0.0.1.pem").exists());
    drop(proxy);

    // After a restart the cached leaf is served again, unchanged.
    let port = free_port_pair();
    let cfg = mitm_cfg(port, &ca, &cache, Some(&pki.ca));
    let proxy = start(Dir::new("tls_mitm_b"), FMT, &cfg, &[port]).0;
    let (_, leaf2) = leaf_via_connect(port, &ca.0, "localhost", oport);
    assert_eq!(sha(&leaf2), sha(&leaf1), "the cached leaf after a restart");
    read_log_line(&log_of(&proxy), "the tunnel's record", |l| {
        l.starts_with("PROXY 00000 ") && l.contains("CONNECT localhost:")
    });

    // A CA of another key: the cached leaf is not its own; a new one is
    // made (and replaces the file).
    let other = Dir::new("tls_mitm_other_ca");
    let ca2 = mitm_ca(&other);
    let port = free_port_pair();
    let cfg = mitm_cfg(port, &ca2, &cache, Some(&pki.ca));
    let _proxy = start(Dir::new("tls_mitm_c"), FMT, &cfg, &[port]).0;
    let (_, leaf3) = leaf_via_connect(port, &ca2.0, "localhost", oport);
    assert_ne!(sha(&leaf3), sha(&leaf1));
    let cached = CertificateDer::from_pem_file(&file).unwrap().to_vec();
    assert_eq!(sha(&leaf3), sha(&cached));
}

#[test]
fn ssl_mitm_refuses_an_untrusted_origin_with_8011() {
    let keep = Dir::new("tls_mitm_untrusted");
    let pki = Pki::new(&keep);
    let ca = mitm_ca(&keep);
    let cache = keep.join("cache");
    std::fs::create_dir(&cache).unwrap();
    let (oport, sni) = tls_origin(&pki, MITM_HELLO);
    let port = free_port_pair();
    // The built-in roots only: the origin's CA is not one of them.
    let proxy = start(
        Dir::new("tls_mitm_u"),
        FMT,
        &mitm_cfg(port, &ca, &cache, None),
        &[port],
    )
    .0;
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(["--proxy", &format!("http://127.0.0.1:{port}")])
        .args(["--cacert", p(&ca.0)])
        .arg(format!("https://localhost:{oport}/"))
        .output()
        .expect("run curl");
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let line = read_log_line(&log_of(&proxy), "with 08011", |l| {
        l.starts_with("PROXY 08011 ")
    });
    assert!(line.contains("ssl_mitm: the origin"), "{line}");
    assert!(
        sni.try_recv().is_err(),
        "no handshake with the origin finished"
    );
    assert!(!cache.join("localhost.pem").exists(), "nothing certified");
    // Bytes sent with the CONNECT, before its answer: they cannot start
    // the session the proxy accepts, so the tunnel ends with 8012.
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(30));
    let head = format!("CONNECT localhost:{oport} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(&[head.as_bytes(), b"\x16\x03\x01\x00\x05hello"].concat())
        .unwrap();
    let got = read_until_closed(&mut s).unwrap_or_default();
    assert!(
        got.starts_with(b"HTTP/1.0 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let line = read_log_line(&log_of(&proxy), "with 08012", |l| {
        l.starts_with("PROXY 08012 ")
    });
    assert!(line.contains("before its tunnel was open"), "{line}");
}

#[test]
fn ssl_mitm_cfg_errors_and_the_warning_without_verification() {
    let dir = Dir::new("tls_mitm_cfg");
    let ca = mitm_ca(&dir);
    let cfg_path = dir.cfg_path();
    let port = free_port();
    // No CA at all.
    let msg = run_cfg(&dir, &[], format!("ssl_mitm\nproxy -p{port} -i127.0.0.1\n"))
        .assert_cfg_error(&cfg_path, 2, "proxy");
    assert!(
        msg.contains("ssl_server_ca_file") && msg.contains("ssl_certcache"),
        "{msg}"
    );
    // A cache directory without its trailing slash, or missing.
    let d = dir.join("cache");
    std::fs::create_dir(&d).unwrap();
    let msg = run_cfg(&dir, &[], format!("ssl_certcache {}\n", p(&d))).assert_cfg_error(
        &cfg_path,
        1,
        "ssl_certcache",
    );
    assert!(msg.contains("must end in /"), "{msg}");
    run_cfg(&dir, &[], "ssl_certcache /nonexistent/\n").assert_cfg_error(
        &cfg_path,
        1,
        "ssl_certcache",
    );
    // The CA as 3proxy.pem and 3proxy.key in the cache, with no
    // ssl_client_verify: it loads, with one warning naming the line.
    std::fs::copy(&ca.0, d.join("3proxy.pem")).unwrap();
    std::fs::copy(&ca.1, d.join("3proxy.key")).unwrap();
    let cfg = format!(
        "ssl_certcache {}/\nssl_mitm\nproxy -p{port} -i127.0.0.1\n",
        p(&d)
    );
    let r = run_check(&dir, &cfg);
    assert!(r.status.success(), "{}", r.stderr);
    let at = format!("{}:3:", cfg_path.display());
    let warned: Vec<_> = r.stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warned.len(), 1, "{}", r.stderr);
    assert!(
        warned[0].contains(&at) && warned[0].contains("ssl_client_verify"),
        "{}",
        warned[0]
    );
    let r = run_check(&dir, &format!("ssl_client_verify\n{cfg}"));
    assert!(
        r.status.success() && !r.stderr.contains("warning"),
        "{}",
        r.stderr
    );
    // ssl_mitm and ssl_serv exclude each other, as in 3proxy.
    run_cfg(&dir, &[], "ssl_serv\nssl_mitm\n").assert_cfg_error(&cfg_path, 2, "ssl_mitm");
    run_cfg(&dir, &[], "ssl_mitm\nssl_serv\n").assert_cfg_error(&cfg_path, 2, "ssl_serv");
}

/// `openssl s_client` to `port` trusting `pki`'s CA, with `args`, its
/// input closed at once: (handshake done, what it printed).
fn s_client(port: u16, pki: &Pki, args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-verify_return_error",
            "-servername",
            "localhost",
        ])
        .args([
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
            p(&pki.ca),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.contains("Cipher is "), text)
}

#[test]
fn ssl_server_cipher_list_and_ciphersuites_choose_what_is_negotiated() {
    let dir = Dir::new("tls_suites_server");
    let pki = Pki::new(&dir);
    let echo = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "ssl_server_cipher_list ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE+AES256:!aRSA\n\
         ssl_server_ciphersuites TLS_CHACHA20_POLY1305_SHA256\n\
         {}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        pki.serv(),
        echo.port()
    );
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    for (args, want) in [
        (
            ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"],
            Some("Cipher is ECDHE-ECDSA-AES256-GCM-SHA384"),
        ),
        (
            ["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            Some("Cipher is ECDHE-ECDSA-CHACHA20-POLY1305"),
        ),
        (
            ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
            None,
        ),
        (
            ["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
            Some("Cipher is TLS_CHACHA20_POLY1305_SHA256"),
        ),
        (["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"], None),
    ] {
        let (ok, text) = s_client(port, &pki, &args);
        match want {
            Some(w) => assert!(ok && text.contains(w), "{args:?}: {text}"),
            None => assert!(!ok, "{args:?} must fail: {text}"),
        }
    }
    read_log_line(&log_of(&proxy), "a refused suite's 8013", |l| {
        l.starts_with("TCPPM 08013 ")
    });
}

#[test]
fn ssl_client_cipher_list_limits_what_the_proxy_offers_the_origin() {
    // The origin's certificate is ECDSA: with RSA suites only (and TLS
    // 1.2) there is nothing in common, and the session ends with 8011.
    for (list, works) in [("aRSA", false), ("aECDSA+CHACHA20", true)] {
        let dir = Dir::new("tls_suites_client");
        let pki = Pki::new(&dir);
        let (oport, _sni) = tls_origin(&pki, b"hi\n");
        let port = free_port();
        let cfg = format!(
            "ssl_client_max_proto_version TLSv1.2\nssl_client_cipher_list {list}\n\
             ssl_cli\ntcppm -i127.0.0.1 {port} localhost {oport}\n"
        );
        let proxy = start(dir, FMT, &cfg, &[port]).0;
        let mut s = connect(localhost(port));
        set_timeouts(&s, Duration::from_secs(30));
        if works {
            let mut got = [0u8; 3];
            s.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"hi\n", "{list}");
        } else {
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            assert_eq!(got, b"", "{list}");
            read_log_line(&log_of(&proxy), "with 08011", |l| {
                l.starts_with("TCPPM 08011 ")
            });
        }
    }
}

#[test]
fn cipher_names_not_offered_are_cfg_errors_naming_them() {
    let dir = Dir::new("tls_suites_cfg");
    let cfg_path = dir.cfg_path();
    for (line, cmd, word) in [
        (
            "ssl_server_cipher_list HIGH:RC4-SHA",
            "ssl_server_cipher_list",
            "RC4-SHA",
        ),
        (
            "ssl_client_cipher_list ECDHE+NOPE",
            "ssl_client_cipher_list",
            "NOPE",
        ),
        (
            "ssl_client_ciphersuites TLS_AES_128_CCM_SHA256",
            "ssl_client_ciphersuites",
            "TLS_AES_128_CCM_SHA256",
        ),
        (
            "ssl_server_ciphersuites ECDHE-RSA-AES128-GCM-SHA256",
            "ssl_server_ciphersuites",
            "ECDHE-RSA-AES128-GCM-SHA256",
        ),
    ] {
        let msg =
            run_cfg(&dir, &[], format!("maxconn 5\n{line}\n")).assert_cfg_error(&cfg_path, 2, cmd);
        assert!(msg.contains(&format!("'{word}'")), "{msg}");
    }
    // OpenSSL's usual string is taken: the weak parts select nothing here.
    let r = run_check(&dir, "ssl_server_cipher_list HIGH:!aNULL:!MD5:@STRENGTH\n");
    assert!(r.status.success(), "{}", r.stderr);
}

/// A TLS origin that offers ALPN `x-test` and tells each client what its
/// handshake agreed on (`-` for nothing), in a line.
fn alpn_origin(pki: &Pki) -> u16 {
    let certs: Vec<_> = CertificateDer::pem_file_iter(&pki.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&pki.key).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    cfg.alpn_protocols = vec![b"x-test".to_vec()];
    let cfg = Arc::new(cfg);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(sock) = sock else { return };
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                set_timeouts(&sock, Duration::from_secs(30));
                let conn = rustls::ServerConnection::new(cfg).unwrap();
                let mut s = rustls::StreamOwned::new(conn, sock);
                while s.conn.is_handshaking() {
                    if s.conn.complete_io(&mut s.sock).is_err() {
                        return;
                    }
                }
                // To the client, since the harness's readiness probe
                // makes handshakes of its own.
                let agreed = s.conn.alpn_protocol().unwrap_or(b"-").to_vec();
                let _ = s.write_all(&[&agreed[..], b"\n"].concat());
                let _ = s.flush();
            });
        }
    });
    port
}

#[test]
fn ssl_client_alpn_is_offered_and_ca_dirs_and_stores_are_trusted() {
    let dir = Dir::new("tls_alpn_cadir");
    let pki = Pki::new(&dir);
    // An OpenSSL-style directory: the CA under a hash-like name, and a
    // file that holds no certificate.
    let cadir = dir.join("cadir");
    std::fs::create_dir(&cadir).unwrap();
    std::fs::copy(&pki.ca, cadir.join("0123abcd.0")).unwrap();
    std::fs::write(cadir.join("README"), "not a certificate\n").unwrap();
    let oport = alpn_origin(&pki);
    for (trust, offer, want) in [
        (
            format!("ssl_client_ca_dir {}", p(&cadir)),
            "ssl_client_alpn h2 x-test",
            "x-test\n",
        ),
        (
            format!("ssl_client_ca_store file:{}", p(&pki.ca)),
            "ssl_client_alpn",
            "-\n",
        ),
        (format!("ssl_client_ca_store {}", p(&cadir)), "", "-\n"),
    ] {
        let port = free_port();
        let cfg = format!(
            "ssl_client_verify\n{trust}\n{offer}\nssl_cli\n\
             tcppm -i127.0.0.1 {port} localhost {oport}\n"
        );
        let _proxy = start(Dir::new("tls_alpn_p"), FMT, &cfg, &[port]).0;
        let mut s = connect(localhost(port));
        set_timeouts(&s, Duration::from_secs(30));
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got)
            .unwrap_or_else(|e| panic!("{trust}: {e}"));
        assert_eq!(String::from_utf8_lossy(&got), want, "{trust} {offer}");
    }
}

#[test]
fn ssl_mitm_in_tcppm_serves_its_leaf_for_the_mapped_name() {
    let keep = Dir::new("tls_mitm_tcppm");
    let pki = Pki::new(&keep);
    let ca = mitm_ca(&keep);
    let (oport, sni) = tls_origin(&pki, b"from the origin\n");
    let port = free_port();
    // No cache directory: memory only.
    let cfg = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nssl_server_ca_file {}\n\
         ssl_server_ca_key {}\nssl_mitm\ntcppm -i127.0.0.1 {port} localhost {oport}\n",
        p(&pki.ca),
        p(&ca.0),
        p(&ca.1)
    );
    let _proxy = start(Dir::new("tls_mitm_t"), FMT, &cfg, &[port]).0;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca.0).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let sock = connect(localhost(port));
    set_timeouts(&sock, Duration::from_secs(30));
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut got = [0u8; 16];
    tls.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"from the origin\n");
    tls.write_all(b"echo me\n").unwrap();
    let mut echo = [0u8; 8];
    tls.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"echo me\n");
    assert_eq!(
        sni.recv_timeout(Duration::from_secs(30))
            .unwrap()
            .as_deref(),
        Some("localhost"),
        "the origin is asked for the mapped name"
    );
}

/// A TLS session parks like a plain one (`parklinger`): the rustls state
/// moves with the stream, and the session goes on after it, both ways,
/// with a transfer larger than one TLS record.
#[test]
fn a_quiet_tls_session_parks_and_carries_on() {
    use crate::park::wait_parked;
    let dir = Dir::new("tls_park");
    let pki = Pki::new(&dir);
    let origin = Origin::echo();
    let (port, aport) = (free_port(), free_port());
    let cfg = format!(
        "parklinger 100\nadmin -i127.0.0.1 -p{aport}\n{}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        pki.serv(),
        origin.port()
    );
    let _proxy = start(dir, FMT, &cfg, &[port]).0;
    let mut s = tls_connect(&pki.ca, port);
    echo_roundtrip(&mut s, b"before parking");
    wait_parked(aport, 1, Duration::from_secs(5));
    echo_roundtrip(&mut s, b"after parking");
    wait_parked(aport, 1, Duration::from_secs(5));
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    s.write_all(&big).unwrap();
    s.flush().unwrap();
    let mut back = vec![0u8; big.len()];
    s.read_exact(&mut back).unwrap();
    assert!(
        back == big,
        "100 kB through a parked TLS session came back changed"
    );
}

/// Chromium's own HTTPS-proxy setting (`--proxy-server=https://...`):
/// the browser speaks TLS to the proxy, trusting its certificate by the
/// key's pin alone (not by ignoring errors), and loads a plain page through
/// it and an https page through CONNECT inside that TLS session.
#[test]
fn chromium_loads_pages_through_the_https_proxy() {
    let chromium = "/usr/bin/chromium";
    assert!(
        Path::new(chromium).exists(),
        "{chromium} is missing: run tests/deps.sh as root (Debian package chromium)"
    );
    let dir = Dir::new("tls_chromium");
    let pki = Pki::new(&dir);
    // The pin: base64 of the SHA-256 of the server key's SubjectPublicKeyInfo.
    let pin = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in {} -pubkey -noout | openssl pkey -pubin -outform der \
             | openssl dgst -sha256 -binary | base64",
            p(&pki.cert)
        ))
        .output()
        .expect("run openssl");
    let pin = String::from_utf8_lossy(&pin.stdout).trim().to_string();
    assert_eq!(pin.len(), 44, "a SHA-256 in base64: {pin:?}");
    // A TLS origin with the same certificate, serving a file.
    dir.write("page.html", "<p>over TLS inside the proxy's TLS</p>\n");
    let sport = free_port();
    let mut s_server = Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("127.0.0.1:{sport}"))
        .args(["-cert", p(&pki.cert), "-key", p(&pki.key)])
        .current_dir(dir.join("."))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl s_server");
    let origin = HttpOrigin::start();
    let port = free_port();
    let cfg = format!("{}proxy -p{port} -i127.0.0.1\n", pki.serv());
    let proxy = start(dir, FMT, &cfg, &[port]).0;
    assert!(
        wait_for(
            || TcpStream::connect(localhost(sport)).is_ok(),
            START_TIMEOUT
        ),
        "openssl s_server did not listen"
    );
    let profile = proxy.dir.join("chromium-profile");
    let dump = |url: &str| {
        let out = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                // Loopback too goes through the proxy.
                "--proxy-bypass-list=<-loopback>",
            ])
            .arg(format!("--user-data-dir={}", p(&profile)))
            .arg(format!("--proxy-server=https://127.0.0.1:{port}"))
            .arg(format!("--ignore-certificate-errors-spki-list={pin}"))
            .args(["--timeout=20000", "--dump-dom", url])
            .output()
            .expect("run chromium");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let plain = dump(&origin.url("/hello"));
    let secure = dump(&format!("https://127.0.0.1:{sport}/page.html"));
    let _ = s_server.kill();
    let _ = s_server.wait();
    assert!(plain.contains(">hello</pre>"), "the plain page: {plain:?}");
    assert!(
        secure.contains("<p>over TLS inside the proxy's TLS</p>"),
        "the https page: {secure:?}"
    );
    // Both went through the proxy, and succeeded there.
    let get = format!("GET {}", origin.url("/hello"));
    let connect = format!("CONNECT 127.0.0.1:{sport}");
    for want in [get, connect] {
        read_log_line(&log_of(&proxy), &format!("00000 with {want:?}"), |l| {
            l.starts_with("PROXY 00000 ") && l.contains(&want)
        });
    }
}
