//! StringsPlugin (`plugin .../StringsPlugin.ld.so start FILE`): the texts
//! its file replaces go out byte for byte where 3proxy sends them (the
//! HTTP proxy's 403 and 407 pages seen by curl and by a raw client, the
//! CONNECT answer, the admin pages), the others stay as they were; the
//! file is read again at a reload; a missing file is a cfg error; a file
//! whose sections do not match 3proxy's tables warns once (an error with
//! `-t --strict`) and what it has is used.

use std::io::Write;
use std::process::Command;

use crate::socks::http_origin;
use crate::util::*;

const PLUGIN: &str = "plugin /usr/local/3proxy/libexec/StringsPlugin.ld.so start";

/// Entries in 3proxy 1.0.0's proxy and admin tables.
const PROXY_COUNT: usize = 18;
const ADMIN_COUNT: usize = 8;

/// `text` (bytes to send, CR LF line ends) as a strings file writes it:
/// each CR LF is a `\n` at the end of a line of the file.
fn as_file(text: &str) -> String {
    let mut out = text.replace("\r\n", "\\n\n");
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// A strings file whose proxy and admin entries are those given (by
/// index, as the bytes they must send), the others left empty (built in).
pub fn strings_file(proxy: &[(usize, &str)], admin: &[(usize, &str)]) -> String {
    let section = |name: &str, count: usize, entries: &[(usize, &str)]| {
        let mut out = format!("[--{name}--]\n");
        for i in 0..count {
            if let Some((_, text)) = entries.iter().find(|(n, _)| *n == i) {
                out += &as_file(text);
            }
            out += "[end]\n";
        }
        out + &format!("[/--{name}--]\n")
    };
    format!(
        "# a strings file\n{}\n{}",
        section("proxy", PROXY_COUNT, proxy),
        section("admin", ADMIN_COUNT, admin)
    )
}

const FORBIDDEN: &str = "HTTP/1.0 403 Доступ запрещён\r\nConnection: close\r\n\
    Content-type: text/html; charset=utf-8\r\n\r\n\
    <html><body><h2>403: доступ запрещён правилами</h2></body></html>\r\n";

const AUTH: &str = "HTTP/1.0 407 Proxy Authentication Required\r\n\
    Proxy-Authenticate: Basic realm=\"proxy\"\r\nConnection: close\r\n\
    Content-type: text/html; charset=utf-8\r\n\r\n\
    <html><body><h2>407: bitte anmelden</h2></body></html>\r\n";

/// `request` on a connection of its own: every byte until the close.
fn raw(port: u16, request: &[u8]) -> Vec<u8> {
    let mut s = connect(localhost(port));
    s.write_all(request).unwrap();
    read_until_closed(&mut s).unwrap()
}

/// curl through the proxy at `port` to `url` with `args`: stdout as
/// bytes (`-i`: the answer's head as it came, then its body).
fn curl(port: u16, args: &[&str], url: &str) -> (Vec<u8>, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-x"])
        .arg(format!("http://127.0.0.1:{port}"))
        .args(args)
        .arg(url)
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    assert!(
        out.status.success(),
        "curl {args:?} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn replaced_403_and_407_pages_go_out_byte_for_byte() {
    let dir = Dir::new("strings_pages");
    let origin = http_origin("127.0.0.1:0");
    let o = origin.port();
    let strings = dir.write("strings", strings_file(&[(11, FORBIDDEN), (7, AUTH)], &[]));
    let port = free_port();
    let cfg = format!(
        "{PLUGIN} {}\nusers u:CL:p\nauth strong\nallow u * 127.0.0.1 {o}\ndeny *\n\
         proxy -i127.0.0.1 -p{port}\n",
        p(&strings)
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let creds = proxy_auth("u", "p");

    // No credentials: 407 (code 4). Credentials, a destination the ACL
    // denies: 403 (code 1). Each exactly the file's bytes, then the close.
    let get = |to: u16, fields: &str| {
        format!("GET http://127.0.0.1:{to}/x HTTP/1.1\r\nHost: 127.0.0.1:{to}\r\n{fields}\r\n")
    };
    assert_eq!(text(&raw(port, get(o, "").as_bytes())), AUTH);
    assert_eq!(text(&raw(port, get(9, &creds).as_bytes())), FORBIDDEN);
    // A kept-alive client's next request is not served after it: the
    // page has no length, the close ends it.
    let two = format!("{}{}", get(9, &creds), get(o, &creds));
    assert_eq!(text(&raw(port, two.as_bytes())), FORBIDDEN);

    // A real client sees the same bytes.
    let url = |to: u16| format!("http://127.0.0.1:{to}/x");
    assert_eq!(text(&curl(port, &["-i"], &url(o)).0), AUTH);
    assert_eq!(
        text(&curl(port, &["-i", "-U", "u:p"], &url(9)).0),
        FORBIDDEN
    );

    // A page the file leaves empty is the built-in one, byte for byte.
    let body = "<html><head><title>400 Bad Request</title></head>\r\n<body><h2>400 Bad \
                Request</h2><p>The proxy could not understand this request.</p></body></html>\r\n";
    let want = format!(
        "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/html; \
         charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(text(&raw(port, b"GET\r\n\r\n")), want);

    // What succeeds is untouched.
    let (out, _) = curl(port, &["-U", "u:p"], &url(o));
    assert_eq!(text(&out), "hello /x");
}

#[test]
fn the_connect_answer_is_replaced() {
    let dir = Dir::new("strings_connect");
    let echo = Origin::echo();
    let web = http_origin("127.0.0.1:0");
    let open = "HTTP/1.0 200 Tunnel offen\r\nX-Strings: 1\r\n\r\n";
    let strings = dir.write("strings", strings_file(&[(8, open)], &[]));
    let port = free_port();
    let cfg = format!("{PLUGIN} {}\nproxy -i127.0.0.1 -p{port}\n", p(&strings));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let (mut s, head) = http_connect(port, echo.port(), "");
    assert_eq!(head, open);
    echo_roundtrip(&mut s, b"through the tunnel");

    // curl takes it for a tunnel and goes through.
    let url = format!("http://127.0.0.1:{}/t", web.port());
    let (out, err) = curl(port, &["-v", "-p"], &url);
    assert_eq!(text(&out), "hello /t");
    assert!(err.contains("< HTTP/1.0 200 Tunnel offen"), "{err}");
}

#[test]
fn a_reload_reads_the_file_again_and_one_without_the_line_restores_the_pages() {
    let dir = Dir::new("strings_reload");
    let strings = dir.write(
        "strings",
        strings_file(&[(11, "HTTP/1.0 403 one\r\n\r\n")], &[]),
    );
    let port = free_port();
    let service = format!("auth iponly\ndeny *\nproxy -i127.0.0.1 -p{port}\n");
    let cfg = format!("{PLUGIN} {}\n{service}", p(&strings));
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let ask = || text(&raw(port, b"GET http://127.0.0.1:9/ HTTP/1.0\r\n\r\n"));
    assert_eq!(ask(), "HTTP/1.0 403 one\r\n\r\n");

    proxy.dir.write(
        "strings",
        strings_file(&[(11, "HTTP/1.0 403 two\r\n\r\n")], &[]),
    );
    proxy.signal("USR1");
    let mut got = String::new();
    let changed = wait_for(
        || {
            got = ask();
            got != "HTTP/1.0 403 one\r\n\r\n"
        },
        START_TIMEOUT,
    );
    assert!(changed, "the reload kept the old text");
    assert_eq!(got, "HTTP/1.0 403 two\r\n\r\n");

    proxy.dir.write("3proxy.cfg", &service);
    proxy.signal("USR1");
    let restored = wait_for(
        || {
            got = ask();
            got != "HTTP/1.0 403 two\r\n\r\n"
        },
        START_TIMEOUT,
    );
    assert!(restored, "the texts stayed after the line was gone");
    assert!(
        got.starts_with("HTTP/1.1 403 Forbidden\r\nConnection: close\r\n"),
        "{got}"
    );
    assert!(got.contains("\r\nContent-Length: "), "{got}");
}

#[test]
fn a_strings_file_that_cannot_be_read_is_a_cfg_error() {
    let dir = Dir::new("strings_missing");
    let missing = dir.join("no-such-strings");
    let cfg = format!(
        "internal 127.0.0.1\n{PLUGIN} {}\nproxy -p{}\n",
        p(&missing),
        free_port()
    );
    for flags in [&[][..], &["-t"]] {
        let f = run_cfg(&dir, flags, &cfg);
        let msg = f.assert_cfg_error(&dir.cfg_path(), 2, "plugin");
        assert!(
            msg.contains(&format!(
                "StringsPlugin cannot read its strings file '{}': No such file or directory",
                missing.display()
            )),
            "{flags:?}: {msg}"
        );
    }
    let f = run_cfg(
        &dir,
        &["-t"],
        "plugin /usr/local/3proxy/libexec/StringsPlugin.ld.so start\n",
    );
    let msg = f.assert_cfg_error(&dir.cfg_path(), 1, "plugin");
    assert!(msg.contains("needs its strings file"), "{msg}");
}

#[test]
fn a_file_unlike_3proxys_tables_warns_once_and_is_used() {
    let dir = Dir::new("strings_count");
    // Three proxy strings where 3proxy has 18; no admin section.
    let short = "[--proxy--]\nHTTP/1.0 400 kaputt\\n\\n\n[end]\n[end]\n[end]\n[/--proxy--]\n";
    let strings = dir.write("strings", short);
    let port = free_port();
    let cfg = format!(
        "internal 127.0.0.1\n{PLUGIN} {}\nproxy -p{port}\n",
        p(&strings)
    );
    let want = format!(
        "{}:2: plugin: StringsPlugin: '{}': [--proxy--] has 3 strings where 3proxy has 18 \
         (entries 3-17 stay built in); there is no [--admin--] section (the admin texts \
         stay built in)",
        dir.cfg_path().display(),
        strings.display()
    );
    let checked = run_cfg(&dir, &["-t"], &cfg);
    assert_eq!(checked.status.code(), Some(0), "{}", checked.stderr);
    let warnings: Vec<&str> = checked
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(
        warnings,
        [format!("3proxy: warning: {want}")],
        "{}",
        checked.stderr
    );
    let strict = run_cfg(&dir, &["-t", "--strict"], &cfg);
    assert_eq!(strict.status.code(), Some(1), "{}", strict.stderr);
    assert!(
        strict
            .stderr
            .lines()
            .any(|l| l == format!("3proxy: {want} (an error with --strict)")),
        "{}",
        strict.stderr
    );

    // Served: the string it has replaces its entry.
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    assert_eq!(
        text(&raw(port, b"GET\r\n\r\n")),
        "HTTP/1.0 400 kaputt\r\n\r\n"
    );
    assert!(proxy.stderr().contains(&want), "{}", proxy.stderr());
}

#[test]
fn admin_pages_take_the_replaced_login_frame_and_style() {
    let dir = Dir::new("strings_admin");
    let login = "HTTP/1.0 401 Authentication Required\r\n\
                 WWW-Authenticate: Basic realm=\"proxy\"\r\nConnection: close\r\n\r\nwer bist du?\r\n";
    let head = "HTTP/1.0 200 OK\r\nConnection: close\r\nContent-type: text/html\r\n\r\n\
                <html><title>%s</title><h2>%s %s: Verwaltung, 100%%</h2>\r\n";
    let tail = "<p>Ende</p></html>\r\n";
    let style = "HTTP/1.0 200 OK\r\nContent-type: text/css\r\n\r\nitem { color: red; }\r\n";
    let strings = dir.write(
        "strings",
        strings_file(&[], &[(0, login), (1, head), (4, style), (5, tail)]),
    );
    let port = free_port();
    let cfg = format!(
        "{PLUGIN} {}\nusers admin:CL:pw\nauth strong\nallow admin\nadmin -i127.0.0.1 -p{port}\n",
        p(&strings)
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let get = |path: &str, auth: &str| {
        text(&raw(
            port,
            format!("GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").as_bytes(),
        ))
    };
    assert_eq!(get("/", ""), login);

    let auth = format!("Authorization: Basic {}\r\n", base64("admin:pw"));
    let page = get("/", &auth);
    let version = env!("CARGO_PKG_VERSION");
    let start = format!(
        "HTTP/1.0 200 OK\r\nConnection: close\r\nContent-type: text/html\r\n\r\n\
         <html><title>threeproxy</title><h2>threeproxy {version}: Verwaltung, 100%</h2>\r\n\
         <h1>Web admin</h1>\n<ul>\n<li><a href=\"/C\">Traffic counters</a></li>\n"
    );
    assert!(page.starts_with(&start), "{page}");
    assert!(page.ends_with(&format!("</ul>\n{tail}")), "{page}");
    assert_eq!(get("/SX", &auth), style);

    // `/S` keeps its own start and end (entries 2 and 3 are empty).
    let xml = get("/S", &auth);
    assert!(xml.starts_with("HTTP/1.0 200 OK\r\n"), "{xml}");
    assert!(xml.contains("\r\nContent-Length: "), "{xml}");
    assert!(xml.contains("\r\n\r\n<?xml version=\"1.0\"?>\r\n"), "{xml}");
    assert!(xml.ends_with("</item></services>\r\n"), "{xml}");
}
