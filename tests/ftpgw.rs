//! The HTTP proxy's ftp:// gateway against a real FTP server (pyftpdlib,
//! which tests/deps.sh installs): files, directory listings, logins,
//! refusals, with raw HTTP and with curl.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::util::*;

/// A pyftpdlib server on 127.0.0.1 serving `root`: user alice (password
/// secret, who may also store files), and anonymous (read only) when
/// `anon`. Killed on drop.
struct FtpServer {
    child: Child,
    port: u16,
}

const SERVER: &str = r#"
import sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer
a = DummyAuthorizer()
a.add_user("alice", "secret", sys.argv[1], perm="elrw")
if sys.argv[2] == "anon":
    a.add_anonymous(sys.argv[1])
FTPHandler.authorizer = a
s = FTPServer(("127.0.0.1", 0), FTPHandler)
print(s.socket.getsockname()[1], flush=True)
s.serve_forever()
"#;

impl FtpServer {
    fn start(root: &Path, anon: bool) -> FtpServer {
        // Debian's python3, which python3-pyftpdlib is for.
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", SERVER, p(root), if anon { "anon" } else { "users" }])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (tests/deps.sh installs it and python3-pyftpdlib)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("pyftpdlib did not start (python3-pyftpdlib installed?): {line:?}")
        });
        FtpServer { child, port }
    }
}

impl Drop for FtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The FTP tree: /pub/hello.txt, /pub/big.bin (300 KB), /pub/sub/.
fn tree(dir: &Dir) -> (std::path::PathBuf, Vec<u8>) {
    let root = dir.join("ftproot");
    std::fs::create_dir_all(root.join("pub/sub")).unwrap();
    std::fs::write(root.join("pub/hello.txt"), "hello ftp\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("pub/big.bin"), &big).unwrap();
    std::fs::write(root.join("pub/a <b>.txt"), "odd name").unwrap();
    (root, big)
}

/// The proxy of these tests; the log's records name the service, code,
/// user, host and port asked for, and the request.
const PROXY: Service = Service::tcp("proxy", "L%N %E %U %n:%r %T");

/// Sends `GET url` with `fields` and reads one answer: status, head, body.
fn get(c: &mut HttpClient, url: &str, fields: &str) -> (u16, String, Vec<u8>) {
    c.send(format!("GET {url} HTTP/1.1\r\nHost: x\r\n{fields}\r\n").as_bytes());
    let r = c.read(false);
    (r.status, r.head, r.body)
}

#[test]
fn ftp_gateway_lists_directories_and_fetches_files() {
    let dir = Dir::new("ftpgw");
    let (root, big) = tree(&dir);
    let ftp = FtpServer::start(&root, true);
    let (proxy, port, _) = PROXY.start_in(dir, "", "", "");
    let base = format!("ftp://127.0.0.1:{}", ftp.port);

    // A directory: an HTML page with a link per entry, on a kept
    // connection.
    let mut c = HttpClient::connect(port);
    let (status, head, body) = get(&mut c, &format!("{base}/pub/"), "");
    let page = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{head}{page}");
    assert!(head.contains("Content-Type: text/html"), "{head}");
    assert!(
        page.contains("<A HREF=\"/pub/hello.txt\">hello.txt</A>"),
        "{page}"
    );
    assert!(
        page.contains("       DIR <A HREF=\"/pub/sub/\">sub</A>"),
        "{page}"
    );
    assert!(
        page.contains("    300000 <A HREF=\"/pub/big.bin\">big.bin</A>"),
        "{page}"
    );
    assert!(
        page.contains("<A HREF=\"/pub/a%20%3Cb%3E.txt\">a &lt;b&gt;.txt</A>"),
        "{page}"
    );
    assert!(page.contains("[<A HREF=\"..\">..</A>]"), "{page}");
    // The same connection serves the next request: a file, its bytes to
    // the close.
    let (status, _, body) = get(&mut c, &format!("{base}/pub/big.bin"), "");
    assert_eq!(status, 200);
    assert!(body == big, "big.bin: {} bytes, not the file", body.len());

    // A real client: curl through the proxy.
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-x",
            &format!("http://127.0.0.1:{port}"),
        ])
        .arg(format!("{base}/pub/hello.txt"))
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello ftp\n",
        "{out:?}"
    );

    // No such file: 404.
    let (status, _, _) = get(
        &mut HttpClient::connect(port),
        &format!("{base}/pub/nothere"),
        "",
    );
    assert_eq!(status, 404);
    let log = log_of(&proxy);
    read_log_line(&log, "of the file fetched with curl", |l| {
        l == format!(
            "PROXY 00000 - 127.0.0.1:{} GET {base}/pub/hello.txt HTTP/1.1",
            ftp.port
        )
    });
    read_log_line(&log, "of the missing file", |l| {
        l.starts_with("PROXY 00780 ")
    });
}

#[test]
fn ftp_gateway_logs_in_with_the_urls_or_the_fields_credentials() {
    let dir = Dir::new("ftpgw_login");
    let (root, _) = tree(&dir);
    let ftp = FtpServer::start(&root, false);
    let (proxy, port, _) = PROXY.start_in(dir, "", "", "");
    let at = |login: &str| format!("ftp://{login}127.0.0.1:{}/pub/hello.txt", ftp.port);

    // No anonymous login on this server: 401, asking for a password.
    let (status, head, _) = get(&mut HttpClient::connect(port), &at(""), "");
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("WWW-Authenticate: Basic"), "{head}");
    let (status, _, _) = get(&mut HttpClient::connect(port), &at("alice:wrong@"), "");
    assert_eq!(status, 401);
    let (status, _, body) = get(&mut HttpClient::connect(port), &at("alice:secret@"), "");
    assert_eq!((status, body), (200, b"hello ftp\n".to_vec()));
    // The answer to the 401: Authorization with the FTP login.
    let (status, _, body) = get(
        &mut HttpClient::connect(port),
        &at(""),
        "Authorization: Basic YWxpY2U6c2VjcmV0\r\n",
    );
    assert_eq!((status, body), (200, b"hello ftp\n".to_vec()));
    read_log_line(&log_of(&proxy), "of a refused login", |l| {
        l.starts_with("PROXY 00700 ")
    });
}

#[test]
fn ftp_gateway_checks_ftp_get_and_ftp_data() {
    let dir = Dir::new("ftpgw_acl");
    let (root, _) = tree(&dir);
    let ftp = FtpServer::start(&root, true);
    // The control connection may go, the data connection may not.
    let (_proxy, port, _) = PROXY.start_in(
        dir,
        &format!("allow * * * {} FTP_GET\nallow * * * * HTTP_GET", ftp.port),
        "",
        "",
    );
    let (status, _, _) = get(
        &mut HttpClient::connect(port),
        &format!("ftp://127.0.0.1:{}/pub/hello.txt", ftp.port),
        "",
    );
    assert_eq!(status, 404, "FTP_DATA is refused: no data connection");

    let dir = Dir::new("ftpgw_acl2");
    let (_proxy, port, _) = PROXY.start_in(dir, "deny * * * * FTP_GET\nallow *", "", "");
    let (status, _, _) = get(
        &mut HttpClient::connect(port),
        &format!("ftp://127.0.0.1:{}/pub/hello.txt", ftp.port),
        "",
    );
    assert_eq!(status, 403);
}

#[test]
fn ftp_gateway_stores_a_put_and_answers_after_the_server_does() {
    let dir = Dir::new("ftpgw_put");
    let (root, big) = tree(&dir);
    let ftp = FtpServer::start(&root, true);
    let (_proxy, port, log) = PROXY.start_in(dir, "", "", "");
    // curl uploads an ftp:// URL through an HTTP proxy with PUT.
    let up = _proxy.dir.join("up.bin");
    std::fs::write(&up, &big).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-T", p(&up)])
        .args(["-x", &format!("http://127.0.0.1:{port}")])
        .arg(format!(
            "ftp://alice:secret@127.0.0.1:{}/pub/up.bin",
            ftp.port
        ))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "201", "{out:?}");
    assert_eq!(std::fs::read(root.join("pub/up.bin")).unwrap(), big);
    // Logged without the password, as 3proxy does.
    let line = read_log_line(&log, "the PUT", |l| l.contains("PUT ftp://"));
    assert!(line.starts_with("PROXY 00000 - 127.0.0.1:"), "{line}");
    assert!(line.contains(" PUT ftp://alice@127.0.0.1:"), "{line}");
    assert!(!line.contains("secret"), "{line}");

    // A body that came with the head and the rest after it, by hand.
    let mut s = HttpClient::connect(port);
    let url = format!("ftp://alice:secret@127.0.0.1:{}/pub/small.txt", ftp.port);
    write!(
        s.w,
        "PUT {url} HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello"
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    s.w.write_all(b" world").unwrap();
    let mut l = String::new();
    s.r.read_line(&mut l).unwrap();
    assert_eq!(l, "HTTP/1.0 201 Created\r\n");
    assert_eq!(
        std::fs::read(root.join("pub/small.txt")).unwrap(),
        b"hello world"
    );

    // A directory: 409; a read-only user (anonymous): STOR refused, 404;
    // a chunked body: 411.
    for (url, want) in [
        (
            format!("ftp://alice:secret@127.0.0.1:{}/pub/", ftp.port),
            409,
        ),
        (format!("ftp://127.0.0.1:{}/pub/anon.txt", ftp.port), 404),
    ] {
        let mut s = HttpClient::connect(port);
        write!(
            s.w,
            "PUT {url} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        )
        .unwrap();
        let mut l = String::new();
        s.r.read_line(&mut l).unwrap();
        assert!(l.starts_with(&format!("HTTP/1.1 {want} ")), "{url}: {l}");
    }
    assert!(!root.join("pub/anon.txt").exists());
    let mut s = HttpClient::connect(port);
    write!(
        s.w,
        "PUT ftp://127.0.0.1:{}/pub/c.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        ftp.port
    )
    .unwrap();
    let mut l = String::new();
    s.r.read_line(&mut l).unwrap();
    assert!(l.starts_with("HTTP/1.1 411 "), "{l}");
}

/// StringsPlugin: its proxy entry 8 heads an ftp:// file and its entry 9
/// a listing 3proxy would stream (over 32 KiB), as 3proxy sends them;
/// a short listing keeps its own head, with its length.
#[test]
fn ftp_gateway_heads_files_and_long_listings_with_strings_plugin_texts() {
    let dir = Dir::new("ftpgw_strings");
    let (root, _) = tree(&dir);
    std::fs::create_dir_all(root.join("long")).unwrap();
    let name = |i: usize| format!("{i:03}-{}", "x".repeat(60));
    for i in 0..250 {
        std::fs::write(root.join("long").join(name(i)), "x").unwrap();
    }
    let file_head = "HTTP/1.0 200 Datei folgt\r\n\r\n";
    let list_head = "HTTP/1.0 200 Liste folgt\r\nContent-Type: text/html\r\n\r\n";
    let strings = dir.write(
        "strings",
        crate::strings::strings_file(&[(8, file_head), (9, list_head)], &[]),
    );
    let ftp = FtpServer::start(&root, true);
    let pre = format!("plugin StringsPlugin.ld.so start {}\n", p(&strings));
    let (_proxy, port, _) = PROXY.start_in(dir, &pre, "", "");
    let base = format!("ftp://127.0.0.1:{}", ftp.port);
    let ask = |path: &str| {
        let r = http_once(
            port,
            format!("GET {base}{path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        format!("{}{}", r.head, r.text())
    };

    assert_eq!(ask("/pub/hello.txt"), format!("{file_head}hello ftp\n"));

    let mut c = HttpClient::connect(port);
    let (status, head, _) = get(&mut c, &format!("{base}/pub/"), "");
    assert_eq!(status, 200);
    assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\nContent-Length: "), "{head}");

    let long = ask("/long/");
    assert!(
        long.starts_with(&format!("{list_head}<pre><hr>\n")),
        "{long}"
    );
    assert!(long.len() > 32 * 1024, "{} bytes", long.len());
    let last = name(249);
    assert!(
        long.contains(&format!("<A HREF=\"/long/{last}\">{last}</A>")),
        "{long}"
    );
}
