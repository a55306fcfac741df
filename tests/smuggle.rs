//! Issue #11: HTTP framing a proxy and an origin could read two ways.
//!
//! A `Connection` field that names a field which frames or routes the
//! message (requests refused with 400, responses with 502), chunk-size lines
//! outside the grammar (both directions), heads that trickle in byte by
//! byte (408 after STRING_LONG / STRING_SHORT), endless interim responses,
//! `Content-Length` lists, and a repeated `Proxy-Authorization`.
//!
//! The tools here are deliberately raw: [`Raw`] writes exact bytes and
//! reads exactly what comes back; [`Recorder`] is an origin that records
//! every byte of every connection the proxy opens to it, and either parses
//! requests naively (by Content-Length only, as a back end that ignores
//! Transfer-Encoding would) or plays a script of raw bytes. Table-driven
//! tests run every row and then fail with the list of rows that
//! misbehaved, so one run shows the whole picture.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

// ---------------------------------------------------------------------------
// Bytes

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains_ci(hay: &[u8], needle: &str) -> bool {
    let hay = hay.to_ascii_lowercase();
    find(&hay, needle.to_ascii_lowercase().as_bytes()).is_some()
}

/// Just past the first `\r\n\r\n`.
fn head_end(b: &[u8]) -> Option<usize> {
    find(b, b"\r\n\r\n").map(|i| i + 4)
}

/// The number at the start of `v` (a lenient reading of `5, 5`).
fn leading_number(v: &str) -> Option<usize> {
    let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Length of the chunked body at the start of `b`, read leniently (the
/// size is the leading hex digits of its line, the rest of the line is
/// ignored), as many back ends read it. None while incomplete, or if a
/// line has no hex digit at all.
fn chunked_len(b: &[u8]) -> Option<usize> {
    let mut pos = 0;
    loop {
        let eol = pos + find(&b[pos..], b"\r\n")?;
        let line = &b[pos..eol];
        let hex: String = line
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .map(|&c| c as char)
            .collect();
        let size = usize::from_str_radix(&hex, 16).ok()?;
        pos = eol + 2;
        if size == 0 {
            // Trailer lines up to the empty one.
            loop {
                let eol = pos + find(&b[pos..], b"\r\n")?;
                let empty = eol == pos;
                pos = eol + 2;
                if empty {
                    return Some(pos);
                }
            }
        }
        if b.len() < pos + size + 2 {
            return None;
        }
        pos += size + 2;
    }
}

// ---------------------------------------------------------------------------
// A response as a client reads it

#[derive(Clone)]
struct Resp {
    status: u16,
    head: String,
    /// As received (a chunked body is not decoded).
    body: Vec<u8>,
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}",
            text(&[self.head.as_bytes(), &self.body].concat())
        )
    }
}

impl Resp {
    fn fields(&self, name: &str) -> Vec<&str> {
        field_values(&self.head, name)
    }
}

/// One response at the start of `b`, and how many bytes it took. `eof`: no
/// more bytes will come (ends a body without framing).
fn parse_resp(b: &[u8], eof: bool) -> Option<(Resp, usize)> {
    let he = head_end(b)?;
    let head = text(&b[..he]);
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let rest = &b[he..];
    let body_len = if (100..200).contains(&status) || status == 204 || status == 304 {
        0
    } else if field_values(&head, "transfer-encoding")
        .iter()
        .any(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        chunked_len(rest)?
    } else if let Some(n) = field_values(&head, "content-length")
        .first()
        .and_then(|v| leading_number(v))
    {
        if rest.len() < n {
            return None;
        }
        n
    } else if eof {
        rest.len()
    } else {
        return None;
    };
    Some((
        Resp {
            status,
            head,
            body: rest[..body_len].to_vec(),
        },
        he + body_len,
    ))
}

/// Splits `b` into the responses it holds (the last one may be cut).
fn responses(b: &[u8]) -> Vec<Resp> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some((r, used)) = parse_resp(&b[pos..], true) {
        out.push(r);
        pos += used;
        if pos >= b.len() {
            break;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The raw client

/// A client connection to the proxy that writes exact bytes and reads
/// exactly what comes back.
struct Raw {
    s: TcpStream,
    /// Read and not yet handed out.
    buf: Vec<u8>,
    eof: bool,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        Raw {
            s: connect(localhost(port)),
            buf: Vec::new(),
            eof: false,
        }
    }

    /// The client's own port (the `%c` of its log records).
    fn port(&self) -> u16 {
        self.s.local_addr().unwrap().port()
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("write to the proxy");
    }

    /// Reads once more into `buf`. Ok(false) at EOF (a reset counts).
    fn fill(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        self.s
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .unwrap();
        let mut chunk = [0u8; 16384];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    self.eof = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Everything until EOF, or until nothing came for `idle`. Returns the
    /// bytes (with any read before) and whether EOF was seen.
    fn rest(&mut self, idle: Duration) -> (Vec<u8>, bool) {
        while let Ok(true) = self.fill(idle) {}
        (std::mem::take(&mut self.buf), self.eof)
    }

    /// One complete response, within `timeout`. Err says what came instead.
    fn response_within(&mut self, timeout: Duration) -> Result<Resp, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((r, used)) = parse_resp(&self.buf, self.eof) {
                self.buf.drain(..used);
                return Ok(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let why = match self.fill(left) {
                Ok(true) => continue,
                Ok(false) => "EOF",
                Err(e) if is_timeout(&e) => "no complete response in time",
                Err(_) => "a read error",
            };
            return Err(format!("{why} after {:?}", text(&self.buf)));
        }
    }

    fn response(&mut self) -> Result<Resp, String> {
        self.response_within(IO_TIMEOUT)
    }
}

// ---------------------------------------------------------------------------
// The recording origin

/// What the recording origin does with what it receives.
#[derive(Clone)]
enum Mode {
    /// Parse requests and answer each `200` with the body `saw PATH`,
    /// keeping the connection. Bodies are framed by Content-Length only
    /// (a head without one is followed by the next request), unless
    /// `chunked`: then `Transfer-Encoding: chunked` is read leniently too.
    Parse { chunked: bool },
    /// After each complete request head (its body ignored): these steps;
    /// the connection stays open.
    Script(Arc<Vec<Step>>),
}

#[derive(Clone)]
enum Step {
    Send(Vec<u8>),
    /// A gap between writes.
    Pause(Duration),
}

/// One connection the proxy opened to the origin.
#[derive(Default)]
struct ConnRec {
    bytes: Mutex<Vec<u8>>,
    /// The proxy closed it (EOF or reset seen).
    eof: AtomicBool,
    /// The request heads the origin answered.
    heads: Mutex<Vec<String>>,
}

struct Recorder {
    origin: Origin,
    conns: Arc<Mutex<Vec<Arc<ConnRec>>>>,
}

impl Recorder {
    fn parse() -> Recorder {
        Recorder::start(Mode::Parse { chunked: false })
    }

    fn parse_chunked() -> Recorder {
        Recorder::start(Mode::Parse { chunked: true })
    }

    fn script(steps: Vec<Step>) -> Recorder {
        Recorder::start(Mode::Script(Arc::new(steps)))
    }

    /// Answers each request head with `bytes` in one write, keeping the
    /// connection.
    fn answer(bytes: &[u8]) -> Recorder {
        Recorder::script(vec![Step::Send(bytes.to_vec())])
    }

    fn start(mode: Mode) -> Recorder {
        let conns: Arc<Mutex<Vec<Arc<ConnRec>>>> = Arc::new(Mutex::new(Vec::new()));
        let all = Arc::clone(&conns);
        let origin = Origin::start("127.0.0.1:0", move |conn| {
            let rec = Arc::new(ConnRec::default());
            all.lock().unwrap().push(Arc::clone(&rec));
            serve_recorded(conn, &rec, &mode);
        });
        Recorder { origin, conns }
    }

    fn port(&self) -> u16 {
        self.origin.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }

    fn conns(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    fn conn(&self, i: usize) -> Arc<ConnRec> {
        Arc::clone(&self.conns.lock().unwrap()[i])
    }

    /// The bytes of connection `i`.
    fn bytes(&self, i: usize) -> Vec<u8> {
        self.conn(i).bytes.lock().unwrap().clone()
    }

    /// Every byte of every connection, in connection order.
    fn all_bytes(&self) -> Vec<u8> {
        let conns = self.conns.lock().unwrap().clone();
        conns
            .iter()
            .flat_map(|c| c.bytes.lock().unwrap().clone())
            .collect()
    }

    /// Every request head answered, in connection order.
    fn heads(&self) -> Vec<String> {
        let conns = self.conns.lock().unwrap().clone();
        conns
            .iter()
            .flat_map(|c| c.heads.lock().unwrap().clone())
            .collect()
    }

    /// Waits until the proxy has closed every connection to the origin.
    fn all_closed_within(&self, t: Duration) -> bool {
        wait_for(
            || {
                self.conns
                    .lock()
                    .unwrap()
                    .iter()
                    .all(|c| c.eof.load(Ordering::SeqCst))
            },
            t,
        )
    }

    fn closed_within(&self, i: usize, t: Duration) -> bool {
        let c = self.conn(i);
        wait_for(|| c.eof.load(Ordering::SeqCst), t)
    }

    /// What the origin got, for failure messages.
    fn describe(&self) -> String {
        let conns = self.conns.lock().unwrap().clone();
        let mut s = format!("{} origin connection(s)", conns.len());
        for (i, c) in conns.iter().enumerate() {
            s.push_str(&format!(
                "\n  #{i} (closed by the proxy: {}): {:?}",
                c.eof.load(Ordering::SeqCst),
                text(&c.bytes.lock().unwrap())
            ));
        }
        s
    }
}

fn serve_recorded(mut conn: TcpStream, rec: &ConnRec, mode: &Mode) {
    let mut data = Vec::new();
    let mut cursor = 0;
    let mut chunk = [0u8; 16384];
    loop {
        match conn.read(&mut chunk) {
            Ok(0) => {
                rec.eof.store(true, Ordering::SeqCst);
                return;
            }
            Ok(n) => {
                data.extend_from_slice(&chunk[..n]);
                rec.bytes.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => return,
            Err(_) => {
                rec.eof.store(true, Ordering::SeqCst);
                return;
            }
        }
        // Every request now complete gets its answer.
        while let Some(he) = head_end(&data[cursor..]) {
            let head = text(&data[cursor..cursor + he]);
            match mode {
                Mode::Parse { chunked } => {
                    let body = &data[cursor + he..];
                    let is_chunked = *chunked
                        && field_values(&head, "transfer-encoding")
                            .iter()
                            .any(|v| v.to_ascii_lowercase().contains("chunked"));
                    let len = if is_chunked {
                        chunked_len(body)
                    } else {
                        let n = field_values(&head, "content-length")
                            .first()
                            .and_then(|v| leading_number(v))
                            .unwrap_or(0);
                        (body.len() >= n).then_some(n)
                    };
                    let Some(len) = len else { break };
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    rec.heads.lock().unwrap().push(head);
                    cursor += he + len;
                    let answer = format!("saw {path}");
                    let _ = conn.write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                            answer.len()
                        )
                        .as_bytes(),
                    );
                }
                Mode::Script(steps) => {
                    rec.heads.lock().unwrap().push(head);
                    cursor += he;
                    for step in steps.iter() {
                        match step {
                            Step::Send(b) => {
                                let _ = conn.write_all(b);
                            }
                            Step::Pause(d) => thread::sleep(*d),
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The proxy

/// Result code, user, client address and port, service, destination, bytes
/// out and in, request: the code of each client's records is found by its
/// port.
const FORMAT: &str = "L%N %E %U %C:%c %n %Q:%q %O %I %T";

/// How long a client waits in silence for the rest of an answer that must
/// end in the proxy closing the connection. On success the EOF ends the
/// wait at once; the bound only has to outlast a loaded machine (a full
/// suite beside other builds made one second too short).
const UNTIL_EOF: Duration = Duration::from_secs(5);

/// The ACL of most tests.
const OPEN: &str = "auth none\nallow *";

struct Px {
    proxy: Proxy,
    port: u16,
}

impl Px {
    /// A `proxy` service with `pre` (timeouts, maxconn, auth and ACL)
    /// before its line.
    fn start(name: &str, pre: &str) -> Px {
        let (proxy, port, _) = Service::tcp("proxy", FORMAT).start(name, pre, "");
        Px { proxy, port }
    }

    fn open(name: &str) -> Px {
        Px::start(name, OPEN)
    }

    fn client(&self) -> Raw {
        Raw::connect(self.port)
    }

    fn log(&self) -> std::path::PathBuf {
        log_of(&self.proxy)
    }

    /// The result code of the first record of each client (by its port),
    /// waiting for all of them at once; None for a client with no record.
    fn codes(&self, clients: &[u16]) -> Vec<Option<u32>> {
        let log = self.log();
        let find = |lines: &[String], port: u16| {
            let at = format!(" 127.0.0.1:{port} ");
            lines
                .iter()
                .find(|l| l.contains(&at))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        };
        wait_for(
            || {
                let lines = log_lines(&log);
                clients.iter().all(|&p| find(&lines, p).is_some())
            },
            LOG_TIMEOUT,
        );
        let lines = log_lines(&log);
        clients.iter().map(|&p| find(&lines, p)).collect()
    }

    /// Asserts the first record of `client` has result code `code`.
    fn expect_code(&self, client: u16, code: u32) {
        let got = self.codes(&[client])[0];
        assert_eq!(
            got,
            Some(code),
            "log code of client port {client}; the log has:\n{}",
            log_lines(&self.log()).join("\n")
        );
    }

    /// Checks the codes of many rows: `(row, client port, code)`; returns
    /// one failure line per row whose code differs.
    fn check_codes(&self, rows: &[(String, u16, u32)]) -> Vec<String> {
        let ports: Vec<u16> = rows.iter().map(|r| r.1).collect();
        let got = self.codes(&ports);
        rows.iter()
            .zip(got)
            .filter(|((_, _, want), got)| *got != Some(*want))
            .map(|((row, _, want), got)| format!("{row} -- log code {got:?}, want {want}"))
            .collect()
    }
}

/// Panics listing the failed rows, if any. Each failure starts with its
/// row's name and ` -- `.
fn assert_rows(what: &str, total: usize, failures: &[String]) {
    let mut rows: Vec<&str> = failures
        .iter()
        .map(|f| f.split(" -- ").next().unwrap_or(f))
        .collect();
    rows.sort();
    rows.dedup();
    assert!(
        failures.is_empty(),
        "{what}: {} of {total} rows failed:\n{}",
        rows.len(),
        failures.join("\n")
    );
}

/// The client got exactly one answer with `status` and `Connection:
/// close`, then EOF. Err describes what came instead.
fn refused_with(c: &mut Raw, status: u16) -> Result<(), String> {
    let r = c.response()?;
    if r.status != status {
        return Err(format!(
            "got {} instead of {status}: {:?}",
            r.status, r.head
        ));
    }
    if r.fields("connection") != ["close"] {
        return Err(format!("no `Connection: close` in {:?}", r.head));
    }
    let (rest, eof) = c.rest(Duration::from_secs(2));
    if !rest.is_empty() || !eof {
        return Err(format!("after the {status}: {:?}, EOF {eof}", text(&rest)));
    }
    Ok(())
}

/// One failure line per row whose origin received any byte (no
/// connection, or only empty ones, is fine). Called after the log wait, so
/// bytes the proxy sent have had time to arrive.
fn check_untouched(origins: &[(String, Recorder)]) -> Vec<String> {
    origins
        .iter()
        .filter(|(_, o)| !o.all_bytes().is_empty())
        .map(|(row, o)| format!("{row} -- the origin received bytes: {}", o.describe()))
        .collect()
}

// ---------------------------------------------------------------------------
// D1: requests whose Connection field names a framing or routing field

/// Names that must never be hop-by-hop: dropping them would change where
/// the message ends or where it goes.
const FRAMING_NAMES: [&str; 4] = ["content-length", "transfer-encoding", "host", "expect"];

fn title_case(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The ways a `Connection` field can name `n`.
fn connection_variants(n: &str) -> Vec<(String, String)> {
    vec![
        ("alone".into(), format!("Connection: {n}\r\n")),
        ("after close".into(), format!("Connection: close, {n}\r\n")),
        (
            "second Connection field".into(),
            format!("Connection: keep-alive\r\nConnection: {n}\r\n"),
        ),
        (
            "upper case".into(),
            format!("Connection: {}\r\n", n.to_ascii_uppercase()),
        ),
        (
            "blanks, mid-list, title case".into(),
            format!(
                "Connection: keep-alive ,\t {} \t, x-other\r\n",
                title_case(n)
            ),
        ),
    ]
}

/// A request naming `name` in `conn`, with the named field itself when
/// `present`.
fn naming_request(o: u16, conn: &str, name: &str, present: bool) -> Vec<u8> {
    let host = format!("Host: 127.0.0.1:{o}\r\n");
    let (method, fields, body) = match (name, present) {
        ("content-length", true) => ("POST", format!("{host}Content-Length: 5\r\n"), "hello"),
        ("transfer-encoding", true) => (
            "POST",
            format!("{host}Transfer-Encoding: chunked\r\n"),
            "5\r\nhello\r\n0\r\n\r\n",
        ),
        ("expect", true) => (
            "POST",
            format!("{host}Expect: 100-continue\r\nContent-Length: 5\r\n"),
            "hello",
        ),
        ("host", false) => ("GET", String::new(), ""),
        _ => ("GET", host, ""),
    };
    format!("{method} http://127.0.0.1:{o}/d1 HTTP/1.1\r\n{fields}{conn}\r\n{body}").into_bytes()
}

#[test]
fn connection_naming_a_framing_or_routing_field_is_refused() {
    let px = Px::open("conn_names_refused");
    let mut failures = Vec::new();
    let mut logged = Vec::new();
    let mut origins = Vec::new();
    let mut total = 0;
    for name in FRAMING_NAMES {
        for (variant, conn) in connection_variants(name) {
            for present in [true, false] {
                total += 1;
                let row = format!(
                    "{name} ({variant}, field {}) {conn:?}",
                    if present { "present" } else { "absent" }
                );
                let origin = Recorder::parse();
                let mut c = px.client();
                c.send(&naming_request(origin.port(), &conn, name, present));
                match refused_with(&mut c, 400) {
                    Ok(()) => logged.push((row.clone(), c.port(), 514)),
                    Err(e) => failures.push(format!("{row} -- {e}")),
                }
                origins.push((row, origin));
            }
        }
    }
    failures.extend(px.check_codes(&logged));
    failures.extend(check_untouched(&origins));
    assert_rows("Connection naming a framing field", total, &failures);
}

#[test]
fn connection_naming_other_fields_still_forwards_without_them() {
    let px = Px::open("conn_names_allowed");
    // (Connection and other fields, a field line the origin must not get.)
    let rows = [
        ("Connection: te\r\nTE: trailers\r\n", "te:"),
        ("Connection: trailer\r\nTrailer: X-T\r\n", "trailer:"),
        (
            "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n",
            "keep-alive:",
        ),
        // Nothing to drop here; the answer closes.
        ("Connection: close\r\n", ""),
        ("Connection: x-custom\r\nX-Custom: 1\r\n", "x-custom:"),
        (
            "Connection: close, X-CUSTOM\r\nX-Custom: 1\r\n",
            "x-custom:",
        ),
        (
            "Connection: keep-alive\r\nConnection: x-custom\r\nX-Custom: 1\r\n",
            "x-custom:",
        ),
    ];
    let mut failures = Vec::new();
    for (fields, banned) in rows {
        let row = format!("{fields:?}");
        let origin = Recorder::parse();
        let mut c = px.client();
        let o = origin.port();
        c.send(
            format!("GET http://127.0.0.1:{o}/d1 HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n{fields}\r\n")
                .as_bytes(),
        );
        match c.response() {
            Ok(r) if r.status == 200 && r.body == b"saw /d1" => {}
            Ok(r) => failures.push(format!("{row} -- got {:?} {:?}", r.head, text(&r.body))),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        let heads = origin.heads();
        if heads.len() != 1 {
            failures.push(format!("{row} -- {}", origin.describe()));
        } else if !banned.is_empty()
            && heads[0]
                .split("\r\n")
                .any(|l| l.to_ascii_lowercase().starts_with(banned))
        {
            failures.push(format!(
                "{row} -- the origin got {banned:?}: {:?}",
                heads[0]
            ));
        }
    }
    assert_rows("Connection naming an ordinary field", rows.len(), &failures);
}

#[test]
fn proxy_connection_naming_content_length_is_not_refused() {
    let px = Px::open("proxy_conn_cl");
    let origin = Recorder::parse();
    let mut c = px.client();
    let o = origin.port();
    c.send(
        format!(
            "POST http://127.0.0.1:{o}/pc HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n\
             Proxy-Connection: content-length\r\nContent-Length: 5\r\n\r\nhello"
        )
        .as_bytes(),
    );
    let r = c.response().unwrap();
    assert_eq!((r.status, text(&r.body)), (200, "saw /pc".into()), "{r:?}");
    let got = origin.bytes(0);
    let he = head_end(&got).expect("a head at the origin");
    let head = text(&got[..he]);
    assert_eq!(field_values(&head, "content-length"), ["5"], "{head}");
    assert_eq!(text(&got[he..]), "hello", "{}", origin.describe());
}

/// Client A smuggles a request for `/store` in a body whose framing field
/// its `Connection` field names; client B then asks for `/victim` through
/// the same origin pool. `framing`: the fields and body of A's request,
/// given the smuggled bytes.
fn smuggle_through_the_pool(name: &str, framing: impl Fn(&str) -> (String, String)) {
    let px = Px::open(name);
    let origin = Recorder::parse();
    let elsewhere = Recorder::parse();
    let o = origin.port();
    let smuggled = format!(
        "POST /store HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\nX-Who: attacker\r\nContent-Length: 100\r\n\r\ncomment="
    );
    let (fields, body) = framing(&smuggled);
    let mut a = px.client();
    let a_port = a.port();
    a.send(
        format!(
            "POST http://127.0.0.1:{o}/a HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n{fields}\r\n{body}"
        )
        .as_bytes(),
    );
    let a_got = a.response();
    let (a_rest, a_closed) = a.rest(Duration::from_millis(500));
    if !a_closed {
        // A was served and kept: it moves on to another origin, which
        // parks its connection to this one in the shared pool.
        a.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", elsewhere.url("/")).as_bytes());
        let _ = a.response();
    }
    drop(a);
    let mut b = px.client();
    b.send(
        format!("GET http://127.0.0.1:{o}/victim HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\nCookie: secret=1\r\n\r\n")
            .as_bytes(),
    );
    let b_got = b.response_within(Duration::from_secs(5));
    let seen = origin.all_bytes();
    let summary = format!(
        "A got {a_got:?} then {:?} (closed: {a_closed})\nB got {b_got:?}\n{}",
        text(&a_rest),
        origin.describe()
    );
    match &a_got {
        Ok(r) => assert_eq!(r.status, 400, "A must be refused\n{summary}"),
        Err(e) => panic!("A got no answer: {e}\n{summary}"),
    }
    assert!(
        a_rest.is_empty() && a_closed,
        "A: EOF after the 400\n{summary}"
    );
    let b = b_got.unwrap_or_else(|e| panic!("B got no answer: {e}\n{summary}"));
    assert_eq!(
        (b.status, text(&b.body)),
        (200, "saw /victim".to_string()),
        "{summary}"
    );
    assert!(
        find(&seen, b"/store").is_none() && !contains_ci(&seen, "x-who"),
        "the smuggled request reached the origin\n{summary}"
    );
    let with_cookie: Vec<String> = origin
        .heads()
        .into_iter()
        .filter(|h| h.contains("secret=1"))
        .collect();
    assert!(
        with_cookie.len() == 1 && with_cookie[0].starts_with("GET /victim "),
        "B's cookie must be in its own request only: {with_cookie:?}\n{summary}"
    );
    assert_eq!(
        seen.windows(8).filter(|w| w == b"secret=1").count(),
        1,
        "{summary}"
    );
    px.expect_code(a_port, 514);
}

#[test]
fn smuggled_request_in_a_content_length_body_never_reaches_another_client() {
    smuggle_through_the_pool("smuggle_cl", |smuggled| {
        (
            format!(
                "Connection: content-length\r\nContent-Length: {}\r\n",
                smuggled.len()
            ),
            smuggled.to_string(),
        )
    });
}

#[test]
fn smuggled_request_in_a_chunked_body_never_reaches_another_client() {
    smuggle_through_the_pool("smuggle_te", |smuggled| {
        (
            "Connection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n".to_string(),
            format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len()),
        )
    });
}

// ---------------------------------------------------------------------------
// D2: responses whose Connection field names their framing field

#[test]
fn response_connection_naming_its_framing_is_502_and_not_pooled() {
    let px = Px::open("resp_conn_names");
    let rows = [
        "Connection: content-length\r\nContent-Length: 5\r\n\r\nHELLO",
        "Connection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHELLO\r\n0\r\n\r\n",
        "Connection: close, Content-Length\r\nContent-Length: 5\r\n\r\nHELLO",
        "Connection: CONTENT-LENGTH\r\nContent-Length: 5\r\n\r\nHELLO",
    ];
    let mut failures = Vec::new();
    let mut logged = Vec::new();
    for rest in rows {
        let row = format!("{rest:?}");
        let origin = Recorder::answer(format!("HTTP/1.1 200 OK\r\n{rest}").as_bytes());
        let mut c = px.client();
        c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
        let (got, eof) = c.rest(UNTIL_EOF);
        if !got.starts_with(b"HTTP/1.1 502 ") || find(&got, b"HELLO").is_some() || !eof {
            failures.push(format!(
                "{row} -- the client got {:?}, EOF {eof}",
                text(&got)
            ));
            continue;
        }
        logged.push((row.clone(), c.port(), 522));
        if !origin.closed_within(0, Duration::from_secs(5)) {
            failures.push(format!(
                "{row} -- the proxy kept the origin connection open"
            ));
            continue;
        }
        // The next client to this origin gets a connection of its own.
        let mut c2 = px.client();
        c2.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r2")).as_bytes());
        let _ = c2.rest(Duration::from_secs(1));
        if origin.conns() != 2 {
            failures.push(format!(
                "{row} -- the second client did not get a new connection: {}",
                origin.describe()
            ));
        }
    }
    failures.extend(px.check_codes(&logged));
    assert_rows(
        "response Connection naming its framing",
        rows.len(),
        &failures,
    );
}

#[test]
fn response_connection_naming_an_ordinary_field_is_relayed_without_it() {
    let px = Px::open("resp_conn_custom");
    let origin = Recorder::answer(
        b"HTTP/1.1 200 OK\r\nConnection: x-custom\r\nX-Custom: 1\r\nContent-Length: 5\r\n\r\nHELLO",
    );
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
    let r = c.response().unwrap();
    assert_eq!((r.status, text(&r.body)), (200, "HELLO".into()), "{r:?}");
    assert!(r.fields("x-custom").is_empty(), "{}", r.head);
}

// ---------------------------------------------------------------------------
// D3: chunk-size lines

/// Size lines outside the grammar (with their line end).
const BAD_SIZE_LINES: [&str; 15] = [
    "0x17\r\n",
    "5garbage\r\n",
    "5 garbage\r\n",
    "+5\r\n",
    "-5\r\n",
    " 5\r\n",
    "5;\r\n",
    "5;=x\r\n",
    "5;a=\r\n",
    "5;a=\"x\r\n",
    "5;a\x01\r\n",
    "5\n",
    "5\r\r\n",
    "11111111111111111\r\n",
    "5;a b\r\n",
];

fn chunked_head(o: u16) -> String {
    format!("POST http://127.0.0.1:{o}/up HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\nTransfer-Encoding: chunked\r\n\r\n")
}

#[test]
fn invalid_chunk_size_lines_in_one_write_are_400() {
    let px = Px::open("bad_chunks_at_once");
    let mut failures = Vec::new();
    let mut logged = Vec::new();
    let mut origins = Vec::new();
    for line in BAD_SIZE_LINES {
        let row = format!("{line:?}");
        let origin = Recorder::parse_chunked();
        let mut c = px.client();
        c.send(format!("{}{line}hello\r\n0\r\n\r\n", chunked_head(origin.port())).as_bytes());
        match refused_with(&mut c, 400) {
            Ok(()) => logged.push((row.clone(), c.port(), 537)),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        origins.push((row, origin));
    }
    failures.extend(px.check_codes(&logged));
    failures.extend(check_untouched(&origins));
    assert_rows(
        "bad chunk-size lines with the head",
        BAD_SIZE_LINES.len(),
        &failures,
    );
}

#[test]
fn invalid_chunk_size_line_after_the_head_went_out_closes_both_sides() {
    let px = Px::open("bad_chunks_later");
    let mut failures = Vec::new();
    for line in BAD_SIZE_LINES {
        let row = format!("{line:?}");
        let origin = Recorder::parse_chunked();
        let o = origin.port();
        let mut c = px.client();
        c.send(chunked_head(o).as_bytes());
        // Let the head go out first (a client's pause between writes):
        // up to 200 ms, less if the origin has it sooner.
        wait_for(
            || origin.conns() > 0 && head_end(&origin.bytes(0)).is_some(),
            Duration::from_millis(200),
        );
        // The bad line, a body a lenient origin would take as complete,
        // and a request behind it.
        let _ = c.s.write_all(
            format!(
                "{line}hello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n\r\n"
            )
            .as_bytes(),
        );
        let (got, eof) = c.rest(Duration::from_secs(2));
        let answer_ok =
            got.is_empty() || (got.starts_with(b"HTTP/1.1 400 ") && responses(&got).len() == 1);
        if !answer_ok || !eof {
            failures.push(format!(
                "{row} -- the client got {:?}, EOF {eof}",
                text(&got)
            ));
        }
        if !origin.all_closed_within(Duration::from_secs(5)) {
            failures.push(format!(
                "{row} -- an origin connection was left open: {}",
                origin.describe()
            ));
        }
        if find(&origin.all_bytes(), b"GET /smuggled").is_some() {
            failures.push(format!(
                "{row} -- the origin got the smuggled request: {}",
                origin.describe()
            ));
        }
    }
    assert_rows(
        "bad chunk-size lines after the head",
        BAD_SIZE_LINES.len(),
        &failures,
    );
}

#[test]
fn valid_chunk_size_lines_are_relayed_unchanged() {
    let px = Px::open("good_chunks");
    let rows = [
        "5\r\nhello\r\n0\r\n\r\n",
        "5;name\r\nhello\r\n0\r\n\r\n",
        "5;name=val\r\nhello\r\n0\r\n\r\n",
        "5 ; name = \"q\\\"uoted\"\r\nhello\r\n0\r\n\r\n",
        "5\t;x\r\nhello\r\n0\r\n\r\n",
        "0005\r\nhello\r\n0\r\n\r\n",
        "A\r\nhelloworld\r\n0\r\n\r\n",
        "5 \r\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        "5\r\nhello\r\n3;x=y\r\nabc\r\n0;last\r\n\r\n",
    ];
    let mut failures = Vec::new();
    for body in rows {
        let row = format!("{body:?}");
        let origin = Recorder::parse_chunked();
        let mut c = px.client();
        c.send(format!("{}{body}", chunked_head(origin.port())).as_bytes());
        match c.response() {
            Ok(r) if r.status == 200 && r.body == b"saw /up" => {}
            Ok(r) => failures.push(format!("{row} -- got {:?} {:?}", r.head, text(&r.body))),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        let got = if origin.conns() == 1 {
            origin.bytes(0)
        } else {
            Vec::new()
        };
        match head_end(&got) {
            Some(he) if got[he..] == *body.as_bytes() => {}
            _ => failures.push(format!(
                "{row} -- the origin did not get the body as sent: {}",
                origin.describe()
            )),
        }
    }
    assert_rows("valid chunk-size lines", rows.len(), &failures);
}

#[test]
fn response_with_an_invalid_first_chunk_size_is_502() {
    let px = Px::open("resp_bad_chunk");
    let origin = Recorder::answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x17\r\nHTTP/1.1 200 Smuggled\r\n\r\n0\r\n\r\n",
    );
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
    let (got, eof) = c.rest(UNTIL_EOF);
    assert!(
        got.starts_with(b"HTTP/1.1 502 ") && eof,
        "the client got {:?}, EOF {eof}",
        text(&got)
    );
    assert!(find(&got, b"Smuggled").is_none(), "{}", text(&got));
    assert!(
        origin.closed_within(0, Duration::from_secs(5)),
        "{}",
        origin.describe()
    );
    px.expect_code(c.port(), 533);
}

#[test]
fn response_with_an_invalid_later_chunk_size_is_cut() {
    let px = Px::open("resp_bad_later_chunk");
    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    let origin = Recorder::script(vec![
        Step::Send(format!("{head}5\r\nhello\r\n").into_bytes()),
        Step::Pause(Duration::from_millis(300)),
        Step::Send(b"5garbage\r\nworld\r\n0\r\n\r\n".to_vec()),
    ]);
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
    let (got, eof) = c.rest(Duration::from_millis(1500));
    let shown = text(&got);
    assert!(
        got.starts_with(b"HTTP/1.1 200 ") && find(&got, b"5\r\nhello\r\n").is_some(),
        "the head and the first chunk: {shown:?}"
    );
    assert!(
        find(&got, b"garbage").is_none() && find(&got, b"world").is_none(),
        "bytes of the bad chunk reached the client: {shown:?}"
    );
    assert_eq!(
        shown.matches("HTTP/1.1 ").count(),
        1,
        "one response only: {shown:?}"
    );
    assert!(eof, "the client connection must be closed: {shown:?}");
    assert!(
        origin.closed_within(0, Duration::from_secs(5)),
        "{}",
        origin.describe()
    );
}

// ---------------------------------------------------------------------------
// D4: slowloris

/// STRING_SHORT 2 s, STRING_LONG 3 s.
const SLOW_TIMEOUTS: &str = "timeouts 1 5 2 3 180 1800 15 60 15 5 5";

/// What a slow client saw.
#[derive(Debug)]
struct Trickled {
    /// The client's port.
    port: u16,
    got: Vec<u8>,
    /// When the proxy closed, since connecting.
    closed_at: Option<Duration>,
}

/// Connects, sends `at_once`, then one byte of `slow` every `gap` until
/// the proxy closes or `stop_after` (since connecting) has passed. The gap
/// is spent reading, so an answer is seen when it comes. `connected` is
/// told once the first bytes are out.
fn trickle(
    port: u16,
    at_once: &[u8],
    slow: impl Iterator<Item = u8>,
    gap: Duration,
    stop_after: Duration,
    connected: Option<mpsc::Sender<()>>,
) -> Trickled {
    let mut s = connect(localhost(port));
    let me = s.local_addr().unwrap().port();
    let start = Instant::now();
    let _ = s.write_all(at_once);
    if let Some(tx) = connected {
        let _ = tx.send(());
    }
    let mut got = Vec::new();
    let mut slow = slow;
    let mut buf = [0u8; 4096];
    let mut next_write = start;
    while start.elapsed() < stop_after {
        if Instant::now() >= next_write {
            if let Some(b) = slow.next() {
                let _ = s.write_all(&[b]);
            }
            next_write += gap;
        }
        let wait = next_write
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(wait)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                return Trickled {
                    port: me,
                    got,
                    closed_at: Some(start.elapsed()),
                }
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Trickled {
                    port: me,
                    got,
                    closed_at: Some(start.elapsed()),
                }
            }
            Err(_) => {}
        }
    }
    Trickled {
        port: me,
        got,
        closed_at: None,
    }
}

/// A head that never ends: `prefix`, then field lines for ever.
fn endless(prefix: String) -> impl Iterator<Item = u8> {
    prefix
        .into_bytes()
        .into_iter()
        .chain(b"X-Pad: p\r\n".iter().copied().cycle())
}

/// The slow client got a 408 that closes, and the connection closed
/// between `min` and `max` after it connected.
fn assert_408(t: &Trickled, min: Duration, max: Duration) {
    let shown = text(&t.got);
    let r = responses(&t.got);
    assert!(
        r.len() == 1 && r[0].status == 408 && r[0].fields("connection") == ["close"],
        "want one `408` with `Connection: close`, got {shown:?} (closed at {:?})",
        t.closed_at
    );
    let at = t
        .closed_at
        .unwrap_or_else(|| panic!("the proxy never closed; got {shown:?}"));
    assert!(
        at >= min && at <= max,
        "closed {at:?} after connecting, want {min:?}..{max:?}"
    );
}

#[test]
fn slowloris_request_line_gets_408() {
    let origin = Recorder::parse();
    let px = Px::start("slow_line", &format!("{SLOW_TIMEOUTS}\n{OPEN}"));
    let head = format!(
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\nX-A: b\r\n",
        origin.port()
    );
    let t = trickle(
        px.port,
        b"",
        endless(head),
        Duration::from_millis(250),
        Duration::from_secs(12),
        None,
    );
    assert_408(&t, Duration::from_secs(2), Duration::from_millis(6500));
    assert_eq!(origin.conns(), 0, "{}", origin.describe());
    px.expect_code(t.port, 92);
}

#[test]
fn slowloris_header_fields_get_408() {
    let origin = Recorder::parse();
    let px = Px::start("slow_fields", &format!("{SLOW_TIMEOUTS}\n{OPEN}"));
    let line = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n", origin.port());
    let t = trickle(
        px.port,
        line.as_bytes(),
        endless("Host: x\r\nX-A: b\r\n".to_string()),
        Duration::from_millis(250),
        Duration::from_secs(12),
        None,
    );
    assert_408(&t, Duration::from_millis(1800), Duration::from_secs(4));
    assert_eq!(origin.conns(), 0, "{}", origin.describe());
    px.expect_code(t.port, 92);
}

#[test]
fn slow_clients_at_maxconn_do_not_lock_out_others() {
    let origin = Recorder::parse();
    let px = Px::start(
        "slow_maxconn",
        &format!("{SLOW_TIMEOUTS}\nmaxconn 10\n{OPEN}"),
    );
    let (tx, rx) = mpsc::channel();
    let slow: Vec<_> = (0..10)
        .map(|_| {
            let (port, tx) = (px.port, tx.clone());
            let head = format!(
                "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\nX-A: b\r\n",
                origin.port()
            );
            thread::spawn(move || {
                trickle(
                    port,
                    b"",
                    endless(head),
                    Duration::from_millis(250),
                    Duration::from_secs(15),
                    Some(tx),
                )
            })
        })
        .collect();
    for _ in 0..10 {
        rx.recv_timeout(IO_TIMEOUT)
            .expect("a slow client connected");
    }
    // The slow clients hold every slot; a normal client comes.
    let t = Instant::now();
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/normal")).as_bytes());
    let r = c.response_within(Duration::from_secs(8));
    let took = t.elapsed();
    let r = r.unwrap_or_else(|e| panic!("the normal client after {took:?}: {e}"));
    assert_eq!((r.status, text(&r.body)), (200, "saw /normal".into()));
    assert!(took < Duration::from_secs(8), "took {took:?}");
    // `reclaim`: the normal client took a slow client's slot (closed
    // unanswered, code 81); the others got their 408.
    let mut reclaimed = 0;
    for (i, h) in slow.into_iter().enumerate() {
        let t = h.join().unwrap();
        let r = responses(&t.got);
        if t.got.is_empty() && t.closed_at.is_some() {
            reclaimed += 1;
            continue;
        }
        assert!(
            r.len() == 1 && r[0].status == 408 && t.closed_at.is_some(),
            "slow client {i}: {:?} (closed at {:?})",
            text(&t.got),
            t.closed_at
        );
    }
    assert_eq!(reclaimed, 1, "one slot reclaimed for the normal client");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[test]
fn silent_client_is_closed_without_answer() {
    let px = Px::start("slow_silent", &format!("{SLOW_TIMEOUTS}\n{OPEN}"));
    let mut c = px.client();
    let t = Instant::now();
    let (got, eof) = c.rest(Duration::from_secs(6));
    let took = t.elapsed();
    assert!(got.is_empty() && eof, "got {:?}, EOF {eof}", text(&got));
    assert!(
        took >= Duration::from_millis(2500) && took <= Duration::from_secs(5),
        "closed after {took:?}"
    );
    px.expect_code(c.port(), 508);
}

#[test]
fn keep_alive_idle_between_requests() {
    let origin = Recorder::parse();
    let px = Px::start("slow_keepalive", &format!("{SLOW_TIMEOUTS}\n{OPEN}"));
    let get = |path: &str| format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url(path));
    let mut c = px.client();
    c.send(get("/one").as_bytes());
    let r = c.response().unwrap();
    assert_eq!(text(&r.body), "saw /one");
    // The client thinks for 1 s (reading, so an early close would show).
    let (got, eof) = c.rest(Duration::from_secs(1));
    assert!(
        got.is_empty() && !eof,
        "during the pause: {:?}, EOF {eof}",
        text(&got)
    );
    c.send(get("/two").as_bytes());
    let r = c.response().unwrap();
    assert_eq!(text(&r.body), "saw /two");
    // 2.5 s of quiet: past STRING_SHORT, the proxy closes without a word.
    let (got, eof) = c.rest(Duration::from_millis(2500));
    assert!(got.is_empty(), "unasked: {:?}", text(&got));
    let _ = c.s.write_all(get("/three").as_bytes());
    let (got, eof2) = c.rest(Duration::from_secs(2));
    assert!(
        got.is_empty() && (eof || eof2),
        "the third request: {:?}, EOF {eof}/{eof2}",
        text(&got)
    );
    assert!(
        !origin.heads().iter().any(|h| h.contains("/three")),
        "{}",
        origin.describe()
    );
}

// ---------------------------------------------------------------------------
// Interim responses

const PROCESSING: &str = "HTTP/1.1 102 Processing\r\n\r\n";

fn interim_origin(n: usize) -> Recorder {
    Recorder::answer(
        format!(
            "{}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            PROCESSING.repeat(n)
        )
        .as_bytes(),
    )
}

#[test]
fn more_than_16_interim_responses_is_502() {
    let px = Px::open("interim_20");
    let origin = interim_origin(20);
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/i")).as_bytes());
    let (got, eof) = c.rest(UNTIL_EOF);
    let shown = text(&got);
    let interims = PROCESSING.repeat(16);
    assert!(
        shown.starts_with(&interims),
        "16 interim responses first: {shown:?}"
    );
    assert!(
        shown[interims.len()..].starts_with("HTTP/1.1 502 "),
        "then a 502: {shown:?}"
    );
    assert!(eof, "then EOF: {shown:?}");
    px.expect_code(c.port(), 522);
}

#[test]
fn sixteen_interim_responses_pass() {
    let px = Px::open("interim_16");
    let origin = interim_origin(16);
    let mut c = px.client();
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/i")).as_bytes());
    for i in 0..16 {
        let r = c.response().unwrap();
        assert_eq!(
            (r.status, r.head.as_str()),
            (102, PROCESSING),
            "interim {i}"
        );
    }
    let r = c.response().unwrap();
    assert_eq!((r.status, text(&r.body)), (200, "ok".into()), "{r:?}");
}

// ---------------------------------------------------------------------------
// Content-Length lists

#[test]
fn request_content_length_list_reaches_the_origin_as_one_field() {
    let px = Px::open("req_cl_list");
    let rows = [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
    ];
    let mut failures = Vec::new();
    for fields in rows {
        let row = format!("{fields:?}");
        let origin = Recorder::parse();
        let o = origin.port();
        let mut c = px.client();
        c.send(
            format!(
                "POST http://127.0.0.1:{o}/cl HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n{fields}\r\nhello"
            )
            .as_bytes(),
        );
        match c.response() {
            Ok(r) if r.status == 200 && r.body == b"saw /cl" => {}
            Ok(r) => failures.push(format!("{row} -- got {:?}", r.head)),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        let got = if origin.conns() == 1 {
            origin.bytes(0)
        } else {
            Vec::new()
        };
        let he = head_end(&got).unwrap_or(got.len());
        let head = text(&got[..he]);
        let lines: Vec<&str> = head
            .split("\r\n")
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length"))
            .collect();
        if lines != ["Content-Length: 5"] || got[he..] != *b"hello" {
            failures.push(format!(
                "{row} -- want one `Content-Length: 5` and the body: {}",
                origin.describe()
            ));
        }
    }
    assert_rows("request Content-Length lists", rows.len(), &failures);
}

#[test]
fn response_content_length_list_reaches_the_client_as_one_field() {
    let px = Px::open("resp_cl_list");
    let rows = [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
    ];
    let mut failures = Vec::new();
    for fields in rows {
        let row = format!("{fields:?}");
        let origin = Recorder::answer(format!("HTTP/1.1 200 OK\r\n{fields}\r\nHELLO").as_bytes());
        let mut c = px.client();
        c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
        match c.response() {
            Ok(r) => {
                let lines: Vec<&str> = r
                    .head
                    .split("\r\n")
                    .filter(|l| l.to_ascii_lowercase().starts_with("content-length"))
                    .collect();
                if r.status != 200 || lines != ["Content-Length: 5"] || r.body != b"HELLO" {
                    failures.push(format!("{row} -- got {:?} {:?}", r.head, text(&r.body)));
                }
            }
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
    }
    assert_rows("response Content-Length lists", rows.len(), &failures);
}

#[test]
fn differing_content_lengths_are_refused_both_ways() {
    let px = Px::open("cl_differ");
    let rows = [
        "Content-Length: 5, 6\r\n",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
    ];
    let mut failures = Vec::new();
    let mut logged = Vec::new();
    let mut origins = Vec::new();
    for fields in rows {
        // A request.
        let row = format!("request {fields:?}");
        let origin = Recorder::parse();
        let o = origin.port();
        let mut c = px.client();
        c.send(
            format!("POST http://127.0.0.1:{o}/cl HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n{fields}\r\nhello!")
                .as_bytes(),
        );
        match refused_with(&mut c, 400) {
            Ok(()) => logged.push((row.clone(), c.port(), 514)),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        origins.push((row, origin));
        // A response.
        let row = format!("response {fields:?}");
        let origin = Recorder::answer(format!("HTTP/1.1 200 OK\r\n{fields}\r\nHELLO!").as_bytes());
        let mut c = px.client();
        c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/r")).as_bytes());
        let (got, eof) = c.rest(UNTIL_EOF);
        if !got.starts_with(b"HTTP/1.1 502 ") || find(&got, b"HELLO").is_some() || !eof {
            failures.push(format!(
                "{row} -- the client got {:?}, EOF {eof}",
                text(&got)
            ));
        }
    }
    failures.extend(px.check_codes(&logged));
    failures.extend(check_untouched(&origins));
    assert_rows("differing Content-Lengths", rows.len() * 2, &failures);
}

// ---------------------------------------------------------------------------
// Proxy-Authorization

const ALICE_ACL: &str = "auth strong\nusers alice:CL:secret\nallow alice";
/// alice:secret and alice:wrong.
const VALID: &str = "Proxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\n";
const INVALID: &str = "Proxy-Authorization: Basic YWxpY2U6d3Jvbmc=\r\n";

#[test]
fn two_proxy_authorization_fields_are_refused() {
    let px = Px::start("two_proxy_auth", ALICE_ACL);
    let rows = [
        ("valid, invalid", format!("{VALID}{INVALID}")),
        ("invalid, valid", format!("{INVALID}{VALID}")),
        ("valid, valid", format!("{VALID}{VALID}")),
    ];
    let mut failures = Vec::new();
    let mut logged = Vec::new();
    let mut origins = Vec::new();
    for (row, fields) in &rows {
        let origin = Recorder::parse();
        let mut c = px.client();
        c.send(
            format!(
                "GET {} HTTP/1.1\r\nHost: x\r\n{fields}\r\n",
                origin.url("/a")
            )
            .as_bytes(),
        );
        match refused_with(&mut c, 400) {
            Ok(()) => logged.push((row.to_string(), c.port(), 512)),
            Err(e) => failures.push(format!("{row} -- {e}")),
        }
        origins.push((row.to_string(), origin));
    }
    failures.extend(px.check_codes(&logged));
    failures.extend(check_untouched(&origins));
    assert_rows("two Proxy-Authorization fields", rows.len(), &failures);
}

#[test]
fn one_proxy_authorization_field_is_accepted() {
    let px = Px::start("one_proxy_auth", ALICE_ACL);
    let origin = Recorder::parse();
    let mut c = px.client();
    c.send(
        format!(
            "GET {} HTTP/1.1\r\nHost: x\r\n{VALID}\r\n",
            origin.url("/a")
        )
        .as_bytes(),
    );
    let r = c.response().unwrap();
    assert_eq!((r.status, text(&r.body)), (200, "saw /a".into()), "{r:?}");
    assert!(
        !contains_ci(&origin.all_bytes(), "proxy-authorization"),
        "{}",
        origin.describe()
    );
}

// The framing scorecard: every variant through the proxy (issue #17).
mod scorecard;
