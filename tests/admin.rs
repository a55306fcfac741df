//! `admin`, the web admin: its pages (start, counters, cfg file, reload),
//! Basic auth and the ACL with operation ADMIN, 404 and 400, and the log
//! records.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::util::*;

/// Service, code, client port, user, text.
const FMT: &str = "L%N %E %c %U %T";

/// The service of these tests.
const ADMIN: Service = Service::tcp("admin", FMT);

/// `GET path` with `extra` fields on a connection of its own; the whole
/// answer.
fn get(port: u16, path: &str, extra: &str) -> Response {
    http_once(
        port,
        format!("GET {path} HTTP/1.0\r\nHost: x\r\n{extra}\r\n").as_bytes(),
    )
}

#[test]
fn admin_start_page_404_and_400() {
    let (_proxy, port, log) =
        ADMIN.start("admin_pages", "timeouts 1 5 2 60 180 1800 15 60 15 5\n", "");
    let r = get(port, "/", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(r.head.contains("Content-Type: text/html"), "{}", r.head);
    assert!(r.text().contains("<a href=\"/C\">"), "{}", r.text());
    assert!(r.text().contains("<a href=\"/F\">"), "{}", r.text());
    expect_log_line(&log, &format!("ADMIN 00000 {} - /", r.client_port));

    let r = get(port, "/nothing-here", "");
    assert_eq!(r.status_line(), "HTTP/1.0 404 Not Found");
    expect_log_line(
        &log,
        &format!("ADMIN 00702 {} - /nothing-here", r.client_port),
    );

    let r = http_once(port, b"\x01\x02 garbage\r\n\r\n");
    assert_eq!(r.status_line(), "HTTP/1.0 400 Bad Request");
    expect_log_line(&log, &format!("ADMIN 00701 {} - -", r.client_port));

    let r = get(port, "/U", "");
    assert_eq!(r.status_line(), "HTTP/1.0 403 Forbidden");

    // A client that never ends its head is answered after the string
    // timeout (2 s here).
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(20));
    s.write_all(b"GET / HTTP/1.0\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    assert!(out.starts_with(b"HTTP/1.0 400"), "{out:?}");
}

#[test]
fn admin_counters_show_tcppm_traffic() {
    let echo = Origin::echo();
    let t = free_port();
    let pre = format!(
        "auth iponly\nallow *\ncountin 7/test<in> D 100 *\n\
         tcppm -i127.0.0.1 {t} 127.0.0.1 {}\n",
        echo.port()
    );
    let (_proxy, port, _log) = ADMIN.start("admin_counters", &pre, "");
    let mut s = connect(localhost(t));
    echo_roundtrip(&mut s, &[b'x'; 1000]);
    drop(s);
    let mut body = String::new();
    let counted = wait_for(
        || {
            let r = get(port, "/C", "");
            assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
            body = r.text();
            body.contains("<td>1000</td>")
        },
        Duration::from_secs(10),
    );
    assert!(counted, "no 1000 bytes counted: {body}");
    assert!(body.contains("<td>countin</td>"), "{body}");
    assert!(body.contains("<td>7/test&lt;in&gt;</td>"), "{body}");
    assert!(
        body.contains(&format!("<td>{}</td>", 100u64 << 20)),
        "{body}"
    );
    assert!(body.contains("<td>day</td>"), "{body}");
}

#[test]
fn admin_cfg_page_escapes_the_text() {
    let (_proxy, port, _log) = ADMIN.start("admin_cfg", "# a <b> & c\n", "");
    let r = get(port, "/F", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(r.text().contains("# a &lt;b&gt; &amp; c"), "{}", r.text());
    assert!(!r.text().contains("<b>"), "{}", r.text());
    assert!(r.text().contains("admin -i127.0.0.1"), "{}", r.text());
}

/// `/F` reads at most what one load may read, 16 MiB: a cfg file grown
/// past it is answered with an error page, not read whole into memory.
#[test]
fn admin_cfg_page_refuses_a_file_over_16_mib() {
    const MAX: u64 = 16 << 20;
    let (proxy, port, log) = ADMIN.start("admin_cfg_big", "writable\n", "");
    let cfg = proxy.dir.cfg_path();
    let grow_to = |len: u64| {
        let have = std::fs::metadata(&cfg).unwrap().len();
        let mut f = std::fs::OpenOptions::new().append(true).open(&cfg).unwrap();
        // Comment lines of 64 bytes, the last one cut to fit.
        let mut left = (len - have) as usize;
        let line = [&[b'#'; 63][..], b"\n"].concat();
        while left > 0 {
            let n = left.min(line.len());
            f.write_all(&line[..n]).unwrap();
            left -= n;
        }
    };
    // At the limit the file is still shown, in the form.
    grow_to(MAX);
    let r = get(port, "/F", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(r.text().contains("<textarea"), "no form");
    assert!(r.body.len() as u64 > MAX, "{} bytes of page", r.body.len());
    expect_log_line(&log, &format!("ADMIN 00000 {} - /F", r.client_port));
    // One byte more and it is not.
    grow_to(MAX + 1);
    let r = get(port, "/F", "");
    assert_eq!(r.status_line(), "HTTP/1.0 500 Internal Server Error");
    assert!(r.text().contains("larger than 16 MiB"), "{}", r.text());
    assert!(r.body.len() < 4096, "{} bytes of page", r.body.len());
    expect_log_line(&log, &format!("ADMIN 00703 {} - /F", r.client_port));
}

#[test]
fn admin_reload_applies_a_changed_cfg() {
    let echo = Origin::echo();
    let (proxy, port, log) = ADMIN.start("admin_reload", "", "");
    let t = free_port();
    let text = format!(
        "log {}\nlogformat \"{FMT}\"\ntcppm -i127.0.0.1 {t} 127.0.0.1 {}\n\
         admin -i127.0.0.1 -p{port}\n",
        p(&log),
        echo.port()
    );
    proxy.dir.write("3proxy.cfg", &text);
    assert!(TcpStream::connect(localhost(t)).is_err());
    let r = get(port, "/R", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(r.text().contains("Reload scheduled"), "{}", r.text());
    assert!(
        wait_for(
            || TcpStream::connect(localhost(t)).is_ok(),
            Duration::from_secs(10)
        ),
        "the added tcppm never came up"
    );
    let mut s = connect(localhost(t));
    echo_roundtrip(&mut s, b"after reload");
}

#[test]
fn admin_acl_deny_asks_for_credentials() {
    let (_proxy, port, log) = ADMIN.start("admin_deny", "auth iponly\ndeny *\n", "");
    let r = get(port, "/C", "");
    assert_eq!(r.status_line(), "HTTP/1.0 401 Authentication Required");
    assert!(
        r.head.contains("WWW-Authenticate: Basic realm=\"proxy\""),
        "{}",
        r.head
    );
    assert!(!r.text().contains("countin"));
    expect_log_line(&log, &format!("ADMIN 00001 {} - /C", r.client_port));
}

#[test]
fn admin_strong_auth_takes_basic_credentials() {
    let (_proxy, port, log) = ADMIN.start(
        "admin_strong",
        "users admin:CL:secret\nauth strong\nallow admin\n",
        "",
    );
    let r = get(port, "/", "");
    assert_eq!(r.status_line(), "HTTP/1.0 401 Authentication Required");
    assert!(r.head.contains("WWW-Authenticate: Basic"), "{}", r.head);

    // admin:wrong
    let r = get(port, "/", "Authorization: Basic YWRtaW46d3Jvbmc=\r\n");
    assert_eq!(r.status_line(), "HTTP/1.0 401 Authentication Required");

    // admin:secret
    let r = get(port, "/", "Authorization: Basic YWRtaW46c2VjcmV0\r\n");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    expect_log_line(&log, &format!("ADMIN 00000 {} admin /", r.client_port));
}

/// `application/x-www-form-urlencoded` for a form field's value.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b' ' => "+".to_string(),
            b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of the `/F` page's textarea, unescaped.
fn textarea(body: &str) -> String {
    let start = body.find("name=\"conffile\">").expect("the cfg form") + 16;
    let end = start + body[start..].find("</textarea>").unwrap();
    body[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// With `writable`, `/F` is 3proxy's form, and posting it to `/U`
/// rewrites the cfg file; a reload (`/R`) then serves the new text.
/// Without `writable`, `/U` is refused and the file is left alone.
#[test]
fn admin_cfg_round_trip_through_the_form() {
    let echo = Origin::echo();
    let (proxy, port, _log) = ADMIN.start("admin_edit", "writable\n# a <b> & \"c\"\n", "");
    let r = get(port, "/F", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(
        r.text().contains("<form method=\"POST\" action=\"/U\""),
        "{}",
        r.text()
    );
    let text = textarea(&r.text());
    let on_disk = std::fs::read_to_string(proxy.dir.join("3proxy.cfg")).unwrap();
    assert_eq!(text, on_disk, "the form holds the file as it is");

    // Add a service and post the form back.
    let t = free_port();
    let new = format!("tcppm -i127.0.0.1 {t} 127.0.0.1 {}\n{text}", echo.port());
    let form = format!("conffile={}", form_encode(&new));
    let r = http_once(
        port,
        format!(
            "POST /U HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .as_bytes(),
    );
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK", "{}", r.text());
    assert!(r.text().contains("Configuration updated"), "{}", r.text());
    assert_eq!(
        std::fs::read_to_string(proxy.dir.join("3proxy.cfg")).unwrap(),
        new
    );
    assert_eq!(textarea(&get(port, "/F", "").text()), new);
    let r = get(port, "/R", "");
    assert_eq!(r.status_line(), "HTTP/1.0 200 OK");
    assert!(
        wait_for(
            || TcpStream::connect(localhost(t)).is_ok(),
            Duration::from_secs(10)
        ),
        "the posted tcppm never came up"
    );
    echo_roundtrip(&mut connect(localhost(t)), b"edited");

    // A form without the field is refused, the file stays.
    let r = http_once(port, b"POST /U HTTP/1.0\r\nContent-Length: 5\r\n\r\nx=abc");
    assert_eq!(r.status_line(), "HTTP/1.0 400 Bad Request");
    assert_eq!(
        std::fs::read_to_string(proxy.dir.join("3proxy.cfg")).unwrap(),
        new
    );
}

#[test]
fn admin_update_without_writable_is_refused() {
    let (proxy, port, log) = ADMIN.start("admin_ro", "", "");
    let before = std::fs::read_to_string(proxy.dir.join("3proxy.cfg")).unwrap();
    let r = http_once(
        port,
        b"POST /U HTTP/1.0\r\nContent-Length: 11\r\n\r\nconffile=x\n",
    );
    assert_eq!(r.status_line(), "HTTP/1.0 403 Forbidden");
    assert!(r.text().contains("writable"), "{}", r.text());
    expect_log_line(&log, &format!("ADMIN 00703 {} - /U", r.client_port));
    assert_eq!(
        std::fs::read_to_string(proxy.dir.join("3proxy.cfg")).unwrap(),
        before
    );
    assert!(!get(port, "/F", "").text().contains("<form"));
}
