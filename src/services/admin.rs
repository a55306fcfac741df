//! `admin`: the web admin (3proxy's webadmin.c). An HTTP/1.0 server of a
//! few pages, one request per connection:
//!
//! * `/` the start page, linking the others;
//! * `/C` the traffic counters: each `countin`/`countout`/`countall` rule
//!   with its users, limit, period, current value and times; `/CD<n>` and
//!   `/CS<n>` are 3proxy's links to switch a counter off and on, shown but
//!   answered as `/C` (a counter cannot be switched off here);
//! * `/R` schedules a reload, exactly as SIGUSR1 does;
//! * `/F` the cfg file's text, HTML-escaped; with `writable` in the cfg,
//!   inside 3proxy's form that posts it to `/U`;
//! * `/U` (POST, form field `conffile`): with `writable`, the cfg file is
//!   rewritten in place with the posted text (3proxy's webadmin.c);
//!   without it, 403. The new text takes effect at the next reload
//!   (`/R`).
//!
//! * `/S` 3proxy's XML dump of the running services and their connected
//!   clients (webadmin.c's `/S`, built on the live registry), `/SX` its
//!   style sheet;
//! * `/metrics` the counters in Prometheus's text exposition format
//!   (`crate::metrics`);
//! * `/P` the parents' health (`crate::health`): up or down, for how
//!   long, failures in a row;
//! * `/sessions` the live sessions as JSON, `/L` as a page with "end"
//!   buttons, which post to `/E?id=N` or `/E?user=NAME` (ends that one
//!   session, or all of the user's; answered 303 to `/L`).
//!
//! Any other path is 404; a request that is not `GET` or `POST` with a
//! parsable head is 400.
//!
//! Access: `auth` and the ACL with operation ADMIN; the user and password
//! come from a Basic `Authorization` header. Any refusal is answered 401
//! with `WWW-Authenticate: Basic realm="proxy"`, as 3proxy does (a refusal
//! by a limit, code 10, is let through, also as 3proxy). With `-s` only
//! the read-only pages are served (start, counters, `/S`, `/metrics`,
//! `/P`, `/sessions`, `/L`). The log record's `%T` is the
//! path asked for.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::access::{Op, Request};
use crate::client::Client;
use crate::limit::{CountKind, Period};
use crate::res::Res;
use crate::timeouts::Timeouts;

/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// The longest form `/U` takes.
const MAX_FORM: usize = 4 << 20;

/// The request could not be read or parsed (3proxy's 701/702).
const BAD_REQUEST: Res = Res::ADMIN_BAD_REQUEST;
/// A path with no page.
const NOT_FOUND: Res = Res::ADMIN_NOT_FOUND;
/// `/U`: rewriting the cfg is refused.
const FORBIDDEN: Res = Res::ADMIN_FORBIDDEN;
/// `/E`: how long the answer waits for the ended sessions to be gone.
const END_WAIT: Duration = Duration::from_secs(3);

/// The cfg file the running configuration came from; None when it came
/// from standard input or the command line.
static CFG: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Record where the running cfg is read from (for `/F`).
pub fn set_cfg(path: Option<PathBuf>) {
    *CFG.lock().unwrap_or_else(|e| e.into_inner()) = path;
}

/// `writable` in the running cfg: `/U` may rewrite the cfg file.
static WRITABLE: AtomicBool = AtomicBool::new(false);

/// Record whether the running cfg said `writable`.
pub fn set_writable(on: bool) {
    WRITABLE.store(on, Ordering::Relaxed);
}

fn cfg_path() -> Option<PathBuf> {
    CFG.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Escape text for HTML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Read the request head: up to the empty line, within `wait`; `early`
/// is what the client sent before a local redirection handed it here.
fn read_head(c: &Client, early: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let until = Instant::now() + wait;
    let mut buf = early.to_vec();
    loop {
        if crate::proto::http::find_head_end(&buf, 0).is_some() {
            return Some(buf);
        }
        if buf.len() >= MAX_HEAD {
            return None;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.cli.set_read_timeout(Some(left)).is_err() {
            return None;
        }
        let mut chunk = [0u8; 1024];
        let mut r = &c.cli;
        match r.read(&mut chunk) {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => return None,
        }
    }
}

struct Head {
    method: String,
    path: String,
    user: Option<String>,
    password: Option<String>,
    /// Content-Length, when given.
    length: Option<usize>,
    /// The Host and Origin headers, when given (`/E` refuses a POST from
    /// another site's page).
    host: Option<String>,
    origin: Option<String>,
    /// Bytes of the head, blank line included.
    len: usize,
}

fn parse_head(buf: &[u8]) -> Option<Head> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let method = req.method?.to_string();
    let path = req.path?.to_string();
    if !path.starts_with('/') {
        return None;
    }
    let (mut user, mut password, mut length) = (None, None, None);
    let (mut host, mut origin) = (None, None);
    for h in req.headers.iter() {
        let text = || String::from_utf8_lossy(h.value).trim().to_string();
        if h.name.eq_ignore_ascii_case("host") {
            host = Some(text());
        } else if h.name.eq_ignore_ascii_case("origin") {
            origin = Some(text());
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("authorization") {
            if let Some((u, p)) = crate::proto::http::basic_credentials(h.value) {
                user = Some(u);
                password = Some(p);
            }
        }
    }
    Some(Head {
        method,
        path,
        user,
        password,
        length,
        host,
        origin,
        len,
    })
}

fn respond(c: &Client, status: &str, extra: &str, body: &str) {
    respond_as(c, status, "text/html; charset=utf-8", extra, body)
}

fn respond_as(c: &Client, status: &str, ctype: &str, extra: &str, body: &str) {
    let out = format!(
        "HTTP/1.0 {status}\r\nConnection: close\r\nCache-Control: no-cache\r\n\
         Content-Type: {ctype}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut w = &c.cli;
    let _ = w.write_all(out.as_bytes());
}

fn page(title: &str, content: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>threeproxy: {t}</title></head>\n<body>\n\
         <p><a href=\"/\">Home</a> | <a href=\"/C\">Counters</a> | \
         <a href=\"/L\">Sessions</a> | <a href=\"/S\">Running services</a> | \
         <a href=\"/F\">Configuration</a> | <a href=\"/R\">Reload</a></p>\n\
         <h1>{t}</h1>\n{content}</body></html>\n",
        t = escape(title)
    )
}

fn error_page(c: &mut Client, res: Res, status: &str, extra: &str, what: &str) {
    c.res = res;
    respond(
        c,
        status,
        extra,
        &page(status, &format!("<p>{}</p>\n", escape(what))),
    );
}

pub fn serve(
    c: &mut Client,
    early: &[u8],
    _: Option<&crate::parent::Known>,
) -> crate::parent::Next {
    let redirected = c.redirected;
    serve_request(c, early, redirected);
    crate::parent::Next::Done
}

fn serve_request(c: &mut Client, early: &[u8], redirected: bool) {
    let svc = c.svc().clone();
    let wait = Duration::from_secs(u64::from(svc.timeouts.0[Timeouts::STRING_SHORT]).max(1));
    let Some(buf) = read_head(c, early, wait) else {
        c.text = "-".into();
        return error_page(c, BAD_REQUEST, "400 Bad Request", "", "Unreadable request.");
    };
    let Some(head) = parse_head(&buf) else {
        c.text = "-".into();
        return error_page(c, BAD_REQUEST, "400 Bad Request", "", "Malformed request.");
    };
    c.text = head.path.clone();
    if head.method != "GET" && head.method != "POST" {
        return error_page(
            c,
            BAD_REQUEST,
            "400 Bad Request",
            "",
            "Only GET and POST are answered.",
        );
    }
    c.user = head.user.clone();
    let req = Request {
        user: head.user.as_deref(),
        password: head.password.as_deref(),
        ..c.request(Op::Admin)
    };
    if let Err(res) = crate::access::authorize(&svc, &req) {
        if res != Res::QUOTA {
            return error_page(
                c,
                res,
                "401 Authentication Required",
                "WWW-Authenticate: Basic realm=\"proxy\"\r\n",
                "Access denied.",
            );
        }
    }
    let limited = redirected || svc.opts.s_option.is_some();
    let path = head.path.split('?').next().unwrap_or("");
    let body = match path {
        "/" => page(
            "Web admin",
            "<ul>\n<li><a href=\"/C\">Traffic counters</a></li>\n\
             <li><a href=\"/L\">Live sessions</a></li>\n\
             <li><a href=\"/P\">Parents</a></li>\n\
             <li><a href=\"/S\">Running services (XML)</a></li>\n\
             <li><a href=\"/metrics\">Metrics (Prometheus)</a></li>\n\
             <li><a href=\"/F\">Configuration file</a></li>\n\
             <li><a href=\"/R\">Reload the configuration</a></li>\n</ul>\n",
        ),
        p if p.starts_with("/C") && (p.len() == 2 || p[2..].starts_with(['D', 'S'])) => {
            page("Traffic counters", &counters(&svc))
        }
        "/metrics" => {
            c.res = Res::OK;
            let body = crate::metrics::render(
                crate::live::count(),
                crate::park::count(),
                &parent_health(),
            );
            return respond_as(
                c,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                "",
                &body,
            );
        }
        "/sessions" => {
            c.res = Res::OK;
            let body = sessions_json(&crate::live::snapshot());
            return respond_as(c, "200 OK", "application/json", "", &body);
        }
        "/S" => {
            c.res = Res::OK;
            let body = services_xml(&crate::live::snapshot());
            return respond_as(
                c,
                "200 OK",
                "text/xml; charset=utf-8",
                "Content-Disposition: inline; filename=running.xml\r\n",
                &body,
            );
        }
        "/SX" => {
            c.res = Res::OK;
            return respond_as(c, "200 OK", "text/css", "", XML_STYLE);
        }
        "/P" => page("Parents", &parents_page()),
        "/L" => page(
            "Live sessions",
            &sessions_page(&crate::live::snapshot(), c.live.id()),
        ),
        _ if limited => {
            return error_page(c, NOT_FOUND, "404 Not Found", "", "No such page.");
        }
        "/R" => {
            ::log::warn!("admin: reload asked for by {:?}", c.client_addr);
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGUSR1);
            page("Reload", "<p>Reload scheduled.</p>\n")
        }
        "/F" => match cfg_path().map(std::fs::read) {
            Some(Ok(text)) if WRITABLE.load(Ordering::Relaxed) => page(
                "Configuration file",
                &format!(
                    "<p>Careful: the text below replaces the file, and takes effect at the \
                     next reload.</p>\n<form method=\"POST\" action=\"/U\" \
                     enctype=\"application/x-www-form-urlencoded\">\
                     <textarea cols=\"80\" rows=\"30\" name=\"conffile\">{}</textarea><br>\
                     <input type=\"submit\"></form>\n",
                    escape(&String::from_utf8_lossy(&text))
                ),
            ),
            Some(Ok(text)) => page(
                "Configuration file",
                &format!("<pre>{}</pre>\n", escape(&String::from_utf8_lossy(&text))),
            ),
            _ => page(
                "Configuration file",
                "<p>The configuration file cannot be read.</p>\n",
            ),
        },
        "/E" if head.method != "POST" => {
            return error_page(
                c,
                BAD_REQUEST,
                "400 Bad Request",
                "",
                "Ending sessions takes a POST.",
            );
        }
        "/E" if !same_site(&head) => {
            return error_page(
                c,
                FORBIDDEN,
                "403 Forbidden",
                "",
                "Sessions are ended only from this admin service's own pages.",
            );
        }
        "/E" => {
            let query = head.path.split_once('?').map_or("", |(_, q)| q);
            let id = form_field(query.as_bytes(), b"id")
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok());
            let user = form_field(query.as_bytes(), b"user")
                .map(|v| String::from_utf8_lossy(&v).into_owned());
            let ended = match (id, &user) {
                (Some(id), _) => {
                    if crate::live::end(id) {
                        vec![id]
                    } else {
                        Vec::new()
                    }
                }
                (None, Some(u)) => crate::live::end_user(u),
                (None, None) => {
                    return error_page(
                        c,
                        BAD_REQUEST,
                        "400 Bad Request",
                        "",
                        "Say which sessions: /E?id=N or /E?user=NAME.",
                    );
                }
            };
            let n = ended.len();
            // The sessions' threads see their sockets close at once; give
            // them a moment to end, so the page redirected to no longer
            // lists them.
            crate::live::wait_gone(&ended, END_WAIT);
            ::log::warn!(
                "admin: {n} session(s) ended by {:?} ({})",
                c.client_addr,
                head.path
            );
            c.res = Res::OK;
            return respond(
                c,
                "303 See Other",
                &format!("Location: /L\r\nX-Ended: {n}\r\n"),
                &page(
                    "Sessions ended",
                    &format!("<p>Ended {n} session(s). <a href=\"/L\">Back</a></p>\n"),
                ),
            );
        }
        "/U" => match update(c, &head, &buf, wait) {
            Ok(()) => page(
                "Configuration updated",
                "<p>The file is written; <a href=\"/R\">reload</a> to apply it.</p>\n",
            ),
            Err((res, status, why)) => return error_page(c, res, status, "", why),
        },
        _ => {
            return error_page(c, NOT_FOUND, "404 Not Found", "", "No such page.");
        }
    };
    c.res = Res::OK;
    respond(c, "200 OK", "", &body);
}

/// A POST from a page of this admin service, or from no page at all (a
/// script): a browser names the page's site in `Origin`, which must then
/// be the `Host` asked for, so another site's page cannot make an
/// administrator's browser end sessions.
fn same_site(head: &Head) -> bool {
    let Some(origin) = head.origin.as_deref() else {
        return true;
    };
    let site = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    site.is_some() && site == head.host.as_deref()
}

/// `/U`: read the posted form and rewrite the cfg file with its
/// `conffile` field, in place (the file keeps its owner and mode, as
/// 3proxy rewrites the file it opened).
fn update(
    c: &Client,
    head: &Head,
    buf: &[u8],
    wait: Duration,
) -> Result<(), (Res, &'static str, &'static str)> {
    const NOT_WRITABLE: &str = "The configuration file is not writable: the cfg needs 'writable'.";
    let path = match cfg_path() {
        Some(p) if WRITABLE.load(Ordering::Relaxed) => p,
        _ => return Err((FORBIDDEN, "403 Forbidden", NOT_WRITABLE)),
    };
    let bad = (
        BAD_REQUEST,
        "400 Bad Request",
        "Expected a POST of the form field 'conffile'.",
    );
    let n = match head.length {
        Some(n) if head.method == "POST" && n <= MAX_FORM => n,
        _ => return Err(bad),
    };
    let mut body = buf[head.len.min(buf.len())..].to_vec();
    let until = Instant::now() + wait;
    while body.len() < n {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.cli.set_read_timeout(Some(left)).is_err() {
            return Err(bad);
        }
        let mut chunk = [0u8; 16 * 1024];
        match (&c.cli).read(&mut chunk) {
            Ok(0) => return Err(bad),
            Ok(k) => body.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(bad),
        }
    }
    body.truncate(n);
    let text = form_field(&body, b"conffile").ok_or(bad)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|_| (FORBIDDEN, "403 Forbidden", NOT_WRITABLE))?;
    f.write_all(&text).map_err(|_| {
        (
            FORBIDDEN,
            "403 Forbidden",
            "Writing the configuration file failed.",
        )
    })?;
    ::log::warn!("admin: the cfg file was rewritten by {:?}", c.client_addr);
    Ok(())
}

/// A field of an `application/x-www-form-urlencoded` body, decoded (`+`
/// is a blank, `%XX` a byte).
fn form_field(body: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let raw = body.split(|&b| b == b'&').find_map(|kv| {
        let eq = kv.iter().position(|&b| b == b'=')?;
        (&kv[..eq] == name).then(|| &kv[eq + 1..])
    })?;
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let digit = |k: usize| raw.get(i + k).copied().and_then(hex);
                match (digit(1), digit(2)) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

/// A string as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_string(), json_str)
}

fn unix_secs(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn age(t: std::time::SystemTime) -> f64 {
    t.elapsed().map_or(0.0, |d| d.as_secs_f64())
}

/// `/sessions`: one object per live session.
fn sessions_json(all: &[crate::live::View]) -> String {
    let mut out = String::from("[");
    for (i, v) in all.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let client = v.info.client.map(|a| a.to_string());
        let parent = v.info.parent.map(|a| a.to_string());
        out += &format!(
            "\n{{\"id\":{},\"service\":{},\"port\":{},\"client\":{},\"user\":{},\
             \"dest\":{},\"parent\":{},\"bytes_out\":{},\"bytes_in\":{},\
             \"start\":{:.3},\"age\":{:.3},\"ended\":{}}}",
            v.id,
            json_str(v.service),
            v.port,
            json_opt(client.as_deref()),
            json_opt(v.info.user.as_deref()),
            json_opt(v.info.dest().as_deref()),
            json_opt(parent.as_deref()),
            v.bytes_out,
            v.bytes_in,
            unix_secs(v.start),
            age(v.start),
            v.ended
        );
    }
    out += "\n]\n";
    out
}

/// Percent-encode a query value.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// The parents' health for `/metrics`.
fn parent_health() -> Vec<crate::metrics::ParentHealth> {
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    crate::health::views(now)
        .into_iter()
        .map(|v| crate::metrics::ParentHealth {
            up: !v.down,
            down_since: v.down_for.and_then(|d| wall.checked_sub(d)).map(unix_secs),
            fails: v.fails,
            name: v.name,
        })
        .collect()
}

/// `/P`: each parent of the running cfg (and of cfgs whose sessions
/// still run) with its health.
fn parents_page() -> String {
    let all = crate::health::views(Instant::now());
    let mut out = format!(
        "<p>{} parent(s). <a href=\"/P\">Refresh</a> | \
         <a href=\"/metrics\">Metrics</a></p>\n\
         <table border=\"1\" id=\"parents\">\n<tr><th>Parent</th><th>State</th>\
         <th>Down for (s)</th><th>Failures in a row</th></tr>\n",
        all.len()
    );
    for v in &all {
        let state = match (v.down, v.held) {
            (false, _) => "up",
            (true, true) => "down",
            (true, false) => "down, being tried again",
        };
        let down_for = v
            .down_for
            .map_or_else(|| "-".to_string(), |d| d.as_secs().to_string());
        out += &format!(
            "<tr><td>{}</td><td>{state}</td><td>{down_for}</td><td>{}</td></tr>\n",
            escape(&v.name),
            v.fails
        );
    }
    out += "</table>\n";
    out
}

/// `/L`: the live sessions with "end" buttons (`me`: this request's own
/// session, which has none).
fn sessions_page(all: &[crate::live::View], me: u64) -> String {
    let mut out = format!(
        "<p>{} live session(s). <a href=\"/L\">Refresh</a> | \
         <a href=\"/sessions\">JSON</a></p>\n\
         <table border=\"1\" id=\"sessions\">\n<tr><th>Id</th><th>Service</th><th>Client</th>\
         <th>User</th><th>Destination</th><th>Parent</th><th>Bytes out</th><th>Bytes in</th>\
         <th>Age (s)</th><th>End</th></tr>\n",
        all.len()
    );
    for v in all {
        let opt = |s: Option<String>| s.map_or_else(|| "-".to_string(), |s| escape(&s));
        let mut end = String::new();
        if v.ended {
            end += "ending";
        } else if v.id != me {
            end += &format!(
                "<form method=\"POST\" action=\"/E?id={id}\" style=\"display:inline\">\
                 <button type=\"submit\" id=\"end-{id}\">End</button></form>",
                id = v.id
            );
            if let Some(u) = &v.info.user {
                end += &format!(
                    " <form method=\"POST\" action=\"/E?user={}\" style=\"display:inline\">\
                     <button type=\"submit\" class=\"end-user\">End all of {}</button></form>",
                    escape(&url_encode(u)),
                    escape(u)
                );
            }
        }
        out += &format!(
            "<tr id=\"session-{}\"><td>{}</td><td>{}:{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{end}</td></tr>\n",
            v.id,
            v.id,
            escape(v.service),
            v.port,
            opt(v.info.client.map(|a| a.to_string())),
            opt(v.info.user.clone()),
            opt(v.info.dest()),
            opt(v.info.parent.map(|a| a.to_string())),
            v.bytes_out,
            v.bytes_in,
            age(v.start)
        );
    }
    out += "</table>\n";
    out
}

/// A time as ctime(3) writes it, without its newline (3proxy's
/// datetime values in `/S`).
fn ctime(t: std::time::SystemTime) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = unix_secs(t) as i64;
    let tm = crate::sys::time::local(secs);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS[tm.wday as usize % 7],
        MONTHS[(tm.mon as usize + 11) % 12],
        tm.mday,
        tm.hour,
        tm.min,
        tm.sec,
        tm.year
    )
}

/// An address as 3proxy's `/S` writes one: `[ip]:port`.
fn sa(a: std::net::SocketAddr) -> String {
    format!("[{}]:{}", a.ip(), a.port())
}

/// One `<parameter>` of `/S` with a plain value, at `level` tabs.
fn xml_param(out: &mut String, level: usize, name: &str, ty: &str, what: &str, value: &str) {
    for _ in 0..level {
        out.push('\t');
    }
    // CDATA cannot hold its own end marker: split it where it occurs.
    let value = value.replace("]]>", "]]]]><![CDATA[>");
    out.push_str(&format!(
        "<parameter><name>{name}</name><type>{ty}</type><description>{what}</description>\
         <value><![CDATA[{value}]]></value>\n</parameter>"
    ));
}

/// `/S`: the running services, each with its connected clients, in the
/// XML 3proxy's webadmin.c writes (items of parameters with name, type,
/// description and value), for the properties threeproxy has.
fn services_xml(all: &[crate::live::View]) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\"?>\r\n<?xml-stylesheet href=\"/SX\" type=\"text/css\"?>\r\n\
         <services>\r\n<description>Services currently running and connected clients\
         </description>\r\n<item>",
    );
    let services: Vec<_> = crate::running::all()
        .iter()
        .filter(|r| !r.stopped())
        .map(|r| r.current())
        .collect();
    for (i, svc) in services.iter().enumerate() {
        if i > 0 {
            out.push_str("</item>\n<item>");
        }
        let port = svc.port();
        let children: Vec<&crate::live::View> = all
            .iter()
            .filter(|v| v.service == svc.def.name && v.port == port)
            .collect();
        xml_param(
            &mut out,
            0,
            "servicetype",
            "string",
            "type of the service/client",
            svc.def.name,
        );
        xml_param(
            &mut out,
            0,
            "childcount",
            "integer",
            "number of servers connected",
            &children.len().to_string(),
        );
        xml_param(
            &mut out,
            0,
            "maxchild",
            "integer",
            "max concurrent connections",
            &svc.maxconn.to_string(),
        );
        if let crate::net::Addr::Ip(a) = &svc.listen {
            xml_param(
                &mut out,
                0,
                "intsa",
                "sa",
                "ip address of internal interface",
                &sa(*a),
            );
        }
        if children.is_empty() {
            continue;
        }
        out.push_str(
            "<parameter><name>child</name><type>client</type>\
             <description>connected clients</description>\n<item>",
        );
        for (j, v) in children.iter().enumerate() {
            if j > 0 {
                out.push_str("</item>\n<item>");
            }
            let l = 1;
            xml_param(
                &mut out,
                l,
                "servicetype",
                "string",
                "type of the client",
                v.service,
            );
            xml_param(
                &mut out,
                l,
                "starttime",
                "datetime",
                "client started seconds",
                &ctime(v.start),
            );
            if let Some(h) = &v.info.host_text() {
                xml_param(
                    &mut out,
                    l,
                    "hostname",
                    "string",
                    "name of the requested host",
                    h,
                );
            }
            if let Some(u) = &v.info.user {
                xml_param(&mut out, l, "username", "string", "client username", u);
            }
            if let Some(a) = v.info.client {
                xml_param(&mut out, l, "clisa", "sa", "client sa", &sa(a));
            }
            if let Some(a) = v.info.parent {
                xml_param(&mut out, l, "srvsa", "sa", "target server sa", &sa(a));
            }
            xml_param(
                &mut out,
                l,
                "bytesin",
                "unsigned64",
                "bytes from server to client",
                &v.bytes_in.to_string(),
            );
            xml_param(
                &mut out,
                l,
                "bytesout",
                "unsigned64",
                "bytes from client to server",
                &v.bytes_out.to_string(),
            );
        }
        out.push_str("</item></parameter>");
    }
    out.push_str("</item></services>\r\n");
    out
}

/// `/SX`: the style sheet `/S` names, so a browser shows the dump as
/// boxes (our own rules, in the spirit of 3proxy's).
const XML_STYLE: &str = "services { display: block; margin: 10px auto; width: 80%; \
font-family: sans-serif; font-size: small; }\n\
item { display: block; margin-bottom: 10px; border: 2px solid #ccc; padding: 10px; }\n\
parameter { display: block; padding: 2px; margin-top: 6px; border: 1px solid grey; }\n\
name { display: inline; margin-right: 5px; font-weight: bold; }\n\
type { display: inline; margin-right: 5px; font-size: x-small; font-style: italic; }\n\
description { display: inline; margin-right: 5px; }\n\
value { display: block; }\n";

fn kind_name(k: CountKind) -> &'static str {
    match k {
        CountKind::In => "countin",
        CountKind::Out => "countout",
        CountKind::All => "countall",
        CountKind::NoIn => "nocountin",
        CountKind::NoOut => "nocountout",
        CountKind::NoAll => "nocountall",
    }
}

fn period_name(p: Period) -> &'static str {
    match p {
        Period::Minutely => "minute",
        Period::Hourly => "hour",
        Period::Daily => "day",
        Period::Weekly => "week",
        Period::Monthly => "month",
        Period::Annually => "year",
        Period::Never => "never reset",
    }
}

fn when(t: i64) -> String {
    if t == 0 {
        return "never".into();
    }
    let tm = crate::sys::time::local(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.year, tm.mon, tm.mday, tm.hour, tm.min, tm.sec
    )
}

fn counters(svc: &crate::service::Service) -> String {
    let mut out = String::from(
        "<table border=\"1\">\n<tr><th>Rule</th><th>Number/comment</th><th>Users</th>\
         <th>Limit (bytes)</th><th>Period</th><th>Counted (bytes)</th>\
         <th>Reset</th><th>Updated</th></tr>\n",
    );
    for v in svc.access.limits.counter_views() {
        let users = match &v.users {
            None => "ANY".to_string(),
            Some(u) => escape(&u.join(", ")),
        };
        out += &format!("<tr><td>{}</td>", kind_name(v.kind));
        match &v.counter {
            None => {
                out += &format!(
                    "<td>-</td><td>{users}</td><td colspan=\"5\">excluded from counting</td></tr>\n"
                )
            }
            Some(c) => {
                out += &format!(
                    "<td>{}/{}</td><td>{users}</td><td>{}</td><td>{}</td><td>{}</td>\
                     <td>{}</td><td>{}</td></tr>\n",
                    c.number,
                    escape(&c.comment),
                    c.limit,
                    period_name(c.period),
                    c.traf,
                    when(c.cleared),
                    when(c.updated)
                )
            }
        }
    }
    out += "</table>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_decode() {
        let body = b"a=1&conffile=log+x%0D%0A%25%zz&b=2";
        assert_eq!(form_field(body, b"conffile").unwrap(), b"log x\r\n%%zz");
        assert_eq!(form_field(body, b"a").unwrap(), b"1");
        assert!(form_field(body, b"c").is_none());
    }

    #[test]
    fn ending_takes_a_same_site_post() {
        let h = |extra: &str| {
            let raw = format!("POST /E?id=1 HTTP/1.0\r\nHost: 10.0.0.1:81\r\n{extra}\r\n");
            parse_head(raw.as_bytes()).unwrap()
        };
        assert!(same_site(&h("")));
        assert!(same_site(&h("Origin: http://10.0.0.1:81\r\n")));
        assert!(!same_site(&h("Origin: http://evil.example\r\n")));
        assert!(!same_site(&h("Origin: null\r\n")));
    }

    #[test]
    fn json_and_query_values_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(json_opt(None), "null");
        assert_eq!(url_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        // A user name with markup and a query's own characters survives
        // the round trip through the end button's URL.
        let u = "<x&y=z>";
        let q = format!("user={}", url_encode(u));
        assert_eq!(form_field(q.as_bytes(), b"user").unwrap(), u.as_bytes());
    }

    #[test]
    fn xml_values_cannot_end_their_cdata() {
        let mut out = String::new();
        xml_param(
            &mut out,
            1,
            "username",
            "string",
            "client username",
            "a]]>b",
        );
        assert_eq!(
            out,
            "\t<parameter><name>username</name><type>string</type><description>client \
             username</description><value><![CDATA[a]]]]><![CDATA[>b]]></value>\n</parameter>"
        );
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
    }

    #[test]
    fn parses_basic_auth() {
        let h = parse_head(b"GET /C HTTP/1.0\r\nAuthorization: Basic dTpw\r\n\r\n").unwrap();
        assert_eq!(h.path, "/C");
        assert_eq!(h.user.as_deref(), Some("u"));
        assert_eq!(h.password.as_deref(), Some("p"));
        assert!(parse_head(b"GARBAGE\r\n\r\n").is_none());
    }
}
