//! Entry points for the fuzz targets (`fuzz/`, cargo-fuzz) and the corpus
//! replay test (`tests/fuzz_corpus.rs`): one plain function per parser
//! that reads untrusted bytes, each taking the input as it comes.
//!
//! Each runs the parser the way the proxy runs it and checks the parser's
//! own invariants, panicking with a message when one does not hold (a
//! parser itself must never panic): a parsed head re-serialised to what
//! the proxy would send parses again to the same head; the bytes taken
//! and the bytes left add up to the input; what is read twice, or in
//! pieces, reads the same. Nothing here is used by the proxy.
//!
//! [`TARGETS`] lists them by the names of the fuzz targets and of the
//! corpus directories (`fuzz/corpus/NAME/`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use crate::conf;
use crate::logformat::{LogFormat, LogRecord, LOOP_CAP};
use crate::net::Stream;
use crate::proto::http::{self, ChunkScanner, Rewrite};
use crate::proto::socks::{self, Dest};
use crate::proto::{dns, ftp, imap, mail, proxy_v1, smtp, tls};
use crate::stringtable::{self, ADMIN_COUNT, PROXY_COUNT};

/// A target's entry point: it takes the input as it comes.
pub type Target = fn(&[u8]);

/// Every target: its name and its entry point.
pub const TARGETS: &[(&str, Target)] = &[
    ("cfg", cfg),
    ("chunked", chunked),
    ("dns_proxy", dns_proxy),
    ("dns_reply", dns_reply),
    ("http_request", http_request),
    ("http_response", http_response),
    ("logformat", logformat),
    ("mail_ftp", mail_ftp),
    ("proxy_header", proxy_header),
    ("radius", radius),
    ("socks_client", socks_client),
    ("socks_server", socks_server),
    ("strings_file", strings_file),
    ("tls_hello", tls_hello),
];

/// Most bytes a target looks at: more is cut (a socket pair holds them
/// without a reader, and libFuzzer's default is 4096 anyway).
const MAX_INPUT: usize = 64 * 1024;

fn cut(data: &[u8]) -> &[u8] {
    &data[..data.len().min(MAX_INPUT)]
}

// --- cfg -------------------------------------------------------------------

/// The separator between the files of a cfg input: the first part is
/// `main.cfg`, the next ones are `f1`, `f2`, ... (what its `include f1`
/// and `$f1` read).
pub const CFG_FILE_SEPARATOR: &[u8] = b"\n%%\n";

/// Commands the cfg target runs: those whose handlers change nothing but
/// the `State` (no socket, no file, no process setting, no name lookup).
/// The others are only tokenized.
const PURE_COMMANDS: &[&str] = &[
    "allow",
    "auth",
    "authcache",
    "backlog",
    "bandlimin",
    "bandlimout",
    "connlim",
    "delimchar",
    "deny",
    "fakeresolve",
    "filtermaxsize",
    "flush",
    "force",
    "logformat",
    "maxconn",
    "maxseg",
    "nobandlimin",
    "nobandlimout",
    "noconnlim",
    "noforce",
    "nolog",
    "nscache",
    "nscache6",
    "nsrecord",
    "parentretries",
    "parklinger",
    "pcre_options",
    "service",
    "stacksize",
    "timeouts",
    "users",
    "weight",
];

/// Files from memory, and only [`PURE_COMMANDS`] run.
struct MemEnv {
    files: HashMap<String, Vec<u8>>,
    ran: usize,
}

impl conf::Env for MemEnv {
    fn open(&mut self, path: &str) -> std::io::Result<Box<dyn Read + '_>> {
        match self.files.get(path) {
            Some(b) => Ok(Box::new(&b[..])),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    fn dispatch(&mut self, state: &mut conf::State, args: &[String]) -> Result<(), String> {
        assert!(!args.is_empty(), "an empty command line was dispatched");
        self.ran += 1;
        if PURE_COMMANDS.contains(&args[0].as_str()) {
            conf::commands::dispatch(state, args)
        } else {
            Ok(())
        }
    }
}

/// Quote a word so the tokenizer reads it back as exactly that word.
fn cfg_quote(word: &str) -> String {
    format!("\"{}\"", word.replace('"', "\"\""))
}

/// The cfg loader (`conf::run`: lines, comments, `include`, `$FILE`,
/// `end`) and the tokenizer, on a cfg and the files it names.
pub fn cfg(data: &[u8]) {
    let data = cut(data);
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(i) = find(rest, CFG_FILE_SEPARATOR) {
        parts.push(&rest[..i]);
        rest = &rest[i + CFG_FILE_SEPARATOR.len()..];
    }
    parts.push(rest);
    let main = parts[0];
    let files: HashMap<String, Vec<u8>> = parts[1..]
        .iter()
        .enumerate()
        .map(|(i, b)| (format!("f{}", i + 1), b.to_vec()))
        .collect();

    // The tokenizer on every line of every part: quoting each word it
    // gives and reading the line again gives the same words.
    for part in &parts {
        for line in part.split(|&b| b == b'\n') {
            let Ok(line) = std::str::from_utf8(line) else {
                continue;
            };
            let mut load = |p: &str| match files.get(p) {
                Some(b) => String::from_utf8(b.clone()).map_err(|_| "not UTF-8".to_string()),
                None => Err(format!("{p}: no such file")),
            };
            let Ok(words) = conf::token::tokenize(line, &mut load) else {
                continue;
            };
            let quoted: Vec<String> = words.iter().map(|w| cfg_quote(w)).collect();
            let again = conf::token::tokenize(&quoted.join(" "), &mut |p| {
                panic!("a quoted $ was read as a file: {p:?}")
            });
            assert_eq!(again.as_ref(), Ok(&words), "line {line:?}");
        }
    }

    // The loader, with files from memory.
    let mut state = conf::State::new(true);
    let mut env = MemEnv { files, ran: 0 };
    let r = conf::run_in(&mut state, "main.cfg", main, &mut env);
    let lines = |b: &[u8]| b.split(|&c| c == b'\n').count();
    let most_lines = parts.iter().map(|p| lines(p)).max().unwrap_or(1);
    for w in &state.warnings {
        assert!(!w.chars().any(char::is_control), "warning {w:?}");
    }
    if let Err(e) = r {
        assert!(
            e.line >= 1 && e.line <= most_lines,
            "line {} of at most {most_lines}: {e}",
            e.line
        );
        let shown = e.to_string();
        assert!(!shown.chars().any(char::is_control), "error {shown:?}");
        // Every piece of input in a message is cut: no message grows with
        // the input.
        assert!(
            shown.chars().count() <= 4096 + 1000 * 4 + 400,
            "error {shown:?}"
        );
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// --- HTTP ------------------------------------------------------------------

/// The request head parser (`proto::http::parse_request`) as the proxy
/// runs it: a complete head either is refused or gives the head to send
/// to the origin, and that head, parsed again, is the same request and is
/// forwarded unchanged.
pub fn http_request(data: &[u8]) {
    let data = cut(data);
    // The first byte picks the rewrite options; the rest is the head.
    let Some((&opts, buf)) = data.split_first() else {
        return;
    };
    let rw = Rewrite {
        strip_forwarding: opts & 1 != 0,
        extra: if opts & 2 != 0 {
            b"Via: 1.1 fuzz\r\n"
        } else {
            b""
        },
        delim: if opts & 4 != 0 { b'#' } else { 0 },
        login: opts & 8 != 0,
        redirected_to: (opts & 16 != 0).then(|| SocketAddr::from(([10, 0, 0, 1], 8080))),
    };
    let mut out = Vec::new();
    let Ok(Some(h)) = http::parse_request(buf, &rw, &mut out) else {
        return;
    };
    // Lengths: the head is a prefix of the input, and no shorter prefix
    // is a whole head.
    assert!(h.len <= buf.len(), "head of {} in {}", h.len, buf.len());
    assert_eq!(buf[h.len - 1], b'\n', "a head ends with LF");
    let mut again = Vec::new();
    let short = http::parse_request(&buf[..h.len], &rw, &mut again);
    assert!(
        matches!(&short, Ok(Some(s)) if *s == h) && again == out,
        "the head alone reads differently: {short:?}"
    );
    if h.is_connect() {
        assert!(out.is_empty(), "CONNECT forwards no head");
        return;
    }
    // What the origin gets: one head, nothing after it.
    assert!(out.ends_with(b"\r\n\r\n"), "sent head {:?}", text(&out));
    assert_eq!(
        http::find_head_end(&out, 0),
        Some(out.len()),
        "sent head {:?}",
        text(&out)
    );
    // A transparent client's HTTP/1.0 request without Host goes on
    // without one (an HTTP/1.1 one gets the destination as its Host):
    // the second reading knows where it was going too.
    let plain = Rewrite {
        delim: rw.delim,
        redirected_to: rw.redirected_to,
        ..Rewrite::default()
    };
    // Read with room for the fields the rewrite adds: a client's head of
    // MAX_HEADERS fields goes on with a few more.
    let mut out2 = Vec::new();
    let h2 = match http::parse_request_slots(&out, &plain, &mut out2, 2 * http::MAX_HEADERS) {
        Ok(Some(h2)) => h2,
        r => panic!(
            "the head sent to the origin does not parse: {r:?}\nin:  {:?}\nout: {:?}",
            text(buf),
            text(&out)
        ),
    };
    let same = h2.method == h.method
        && h2.version == h.version
        && h2.len == out.len()
        && h2.framing == h.framing
        && h2.port == h.port
        && h2.host.eq_ignore_ascii_case(&h.host)
        && h2.upgrade == h.upgrade
        && h2.expect_continue == h.expect_continue
        // Connection is hop-by-hop: whatever the client says of its own
        // connection, the proxy asks to keep its origin connection (for
        // the pool), and the next hop must read it so.
        && h2.keep_alive;
    assert!(
        same,
        "the origin reads another request\nin:  {:?}\nout: {:?}\n{h:?}\n{h2:?}",
        text(buf),
        text(&out)
    );
    // Forwarding it again changes nothing (no field added twice, none
    // lost), but for the fields this proxy adds.
    if rw.extra.is_empty() {
        assert_eq!(
            text(&out2),
            text(&out),
            "a second proxy forwards another head"
        );
    }
}

/// The response head parser (`proto::http::parse_response` and
/// `end_response_head`): the head passed to the client parses to the
/// same status and framing.
pub fn http_response(data: &[u8]) {
    let data = cut(data);
    let Some((&opts, buf)) = data.split_first() else {
        return;
    };
    let head_req = opts & 1 != 0;
    let client_version = (opts >> 1) & 1;
    let mut out = Vec::new();
    let Ok(Some(r)) = http::parse_response(buf, head_req, &mut out) else {
        return;
    };
    assert!(
        r.len <= buf.len() && r.len > 0,
        "head of {} in {}",
        r.len,
        buf.len()
    );
    let mut again = Vec::new();
    let short = http::parse_response(&buf[..r.len], head_req, &mut again);
    assert!(
        short == Ok(Some(r)) && again == out,
        "the head alone reads differently"
    );
    assert!(out.ends_with(b"\r\n"), "status and fields end in CRLF");
    http::end_response_head(&mut out, client_version, r.keep_alive, r.is_interim());
    assert_eq!(
        http::find_head_end(&out, 0),
        Some(out.len()),
        "sent head {:?}",
        text(&out)
    );
    let mut out2 = Vec::new();
    let r2 = match http::parse_response_slots(&out, head_req, &mut out2, 2 * http::MAX_HEADERS) {
        Ok(Some(r2)) => r2,
        e => panic!(
            "the head sent to the client does not parse: {e:?}\nin:  {:?}\nout: {:?}",
            text(buf),
            text(&out)
        ),
    };
    // The client frames the body as we do. (A close-delimited body stays
    // close-delimited; a response we will not reuse says `close`.)
    assert!(
        r2.status == r.status && r2.len == out.len() && r2.framing == r.framing,
        "the client reads another response\nin:  {:?}\nout: {:?}\n{r:?}\n{r2:?}",
        text(buf),
        text(&out)
    );
    if !r.keep_alive && !r.is_interim() {
        assert!(!r2.keep_alive, "a connection we close looks reusable");
    }
}

/// The chunked body scanner (`proto::http::ChunkScanner`): bytes fed in
/// two pieces scan as when fed at once; the payload it finds, framed
/// again as one chunk, scans to the same payload; nothing is taken past
/// the end of the body.
pub fn chunked(data: &[u8]) {
    let data = cut(data);
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let whole = scan(&[body]);
    let at = usize::from(split).min(body.len());
    let pieces = scan(&[&body[..at], &body[at..]]);
    assert_eq!(whole, pieces, "fed in two pieces at {at}");
    let (res, payload, done) = whole;
    let Ok(taken) = res else { return };
    assert!(taken <= body.len() && payload.len() <= taken);
    if !done {
        assert_eq!(taken, body.len(), "an unfinished body takes every byte");
        return;
    }
    // Framed again as one chunk: the same payload, every byte taken.
    let mut again = Vec::new();
    if !payload.is_empty() {
        again.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
        again.extend_from_slice(&payload);
        again.extend_from_slice(b"\r\n");
    }
    again.extend_from_slice(b"0\r\n\r\n");
    let (res2, payload2, done2) = scan(&[&again]);
    assert_eq!(res2, Ok(again.len()));
    assert!(done2 && payload2 == payload, "re-framed payload differs");
}

/// Scan `pieces` in order: the bytes taken in all (or the error), the
/// payload, and whether the body ended.
fn scan(pieces: &[&[u8]]) -> (Result<usize, ()>, Vec<u8>, bool) {
    let mut sc = ChunkScanner::new();
    let mut payload = Vec::new();
    let mut taken = 0;
    for p in pieces {
        if sc.done() {
            break;
        }
        match sc.feed_into(p, Some(&mut payload)) {
            Ok(n) => {
                assert!(n <= p.len());
                if !sc.done() {
                    assert_eq!(n, p.len(), "stopped early without ending");
                }
                taken += n;
            }
            Err(()) => return (Err(()), Vec::new(), false),
        }
    }
    if sc.done() {
        // Once done, nothing more is body.
        assert_eq!(sc.feed(b"0\r\n\r\n"), Ok(0));
    }
    (Ok(taken), payload, sc.done())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// --- SOCKS -----------------------------------------------------------------

/// The SOCKS server's handshake (`proto::socks::read_from`, as
/// services::socks runs it: 4, 4a and 5 with RFC 1929): what a request
/// asks for, encoded again, reads as the same request; the bytes read and
/// the early data add up to the input.
pub fn socks_server(data: &[u8]) {
    let data = cut(data);
    let Some((&opts, input)) = data.split_first() else {
        return;
    };
    let needuser = u32::from(opts % 3);
    let (ask, sent) = socks::read_handshake(input, needuser);
    // The server only ever answers the greeting and the RFC 1929
    // exchange here: at most 2 + 2 bytes.
    assert!(sent.len() <= 4, "sent {sent:?}");
    let Ok(ask) = ask else { return };
    assert!(ask.ver == 4 || ask.ver == 5);
    assert!(ask.early.len() <= input.len());
    // The request itself, as a client would send it: parse it again.
    let used = input.len() - ask.early.len();
    assert_eq!(
        &input[used..],
        &ask.early[..],
        "early data is the tail of the input"
    );
    if let Dest::Name(n, _) = &ask.dest {
        assert!(!n.is_empty() && n.len() <= 255, "name {n:?}");
    }
    let again = match ask.ver {
        4 if ask.user.as_ref().is_some_and(|u| u.len() > 255) => return,
        4 if ask.cmd == 1 => socks::v4_connect(&ask.dest, ask.user.as_deref().unwrap_or("")),
        4 => return,
        _ => {
            let mut m = vec![5, 1, 0];
            if ask.user.is_some() {
                m = vec![5, 1, 2, 1];
                for f in [&ask.user, &ask.password] {
                    let f = f.as_deref().unwrap_or("").as_bytes();
                    if f.len() > 255 {
                        return; // lossy UTF-8 made it longer
                    }
                    m.push(f.len() as u8);
                    m.extend_from_slice(f);
                }
            }
            socks::v5_request(ask.cmd, &ask.dest).map(|r| [m, r].concat())
        }
    };
    let again = again.expect("a parsed request encodes");
    let (ask2, _) = socks::read_handshake(&again, needuser);
    let ask2 = ask2.unwrap_or_else(|e| panic!("re-encoded request refused: {e:?} {again:?}"));
    assert!(
        ask2.ver == ask.ver && ask2.cmd == ask.cmd && ask2.dest == ask.dest,
        "{ask:?} re-read as {ask2:?}"
    );
    assert!(ask2.early.is_empty());
}

/// The client side of a SOCKS parent (`proto::socks::client_*`): the
/// parent's replies come from the input over a socket. A handshake that
/// succeeds took exactly the reply's bytes: what follows is left for the
/// relay, byte for byte.
pub fn socks_client(data: &[u8]) {
    let data = cut(data);
    let Some((&opts, reply)) = data.split_first() else {
        return;
    };
    let Ok((ours, mut theirs)) = std::os::unix::net::UnixStream::pair() else {
        return;
    };
    if theirs.write_all(reply).is_err() || theirs.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let _ = ours.set_read_timeout(Some(Duration::from_secs(5)));
    let s = Stream::Unix(ours);
    let creds = ("user".to_string(), "pass".to_string());
    let creds = (opts & 1 != 0).then_some(&creds);
    let short = opts & 2 != 0;
    let dest = if opts & 4 != 0 {
        Dest::Name("example.test".into(), 443)
    } else {
        Dest::Addr(SocketAddr::from(([192, 0, 2, 1], 443)))
    };
    let (r, want): (Result<(), _>, Option<usize>) = match (opts >> 3) % 3 {
        0 => (
            socks::client_v4_connect(&s, &dest, creds, short),
            Some(if short { 3 } else { 8 }),
        ),
        1 => {
            let r = socks::client_v5_connect(&s, &dest, creds, short);
            (r, v5_reply_len(reply, creds.is_some(), short))
        }
        _ => {
            let r = socks::client_v5_udp(&s, creds);
            (r.map(|_| ()), v5_reply_len(reply, creds.is_some(), false))
        }
    };
    if r.is_err() {
        return;
    }
    let want = want.expect("a reply that cannot be one was taken");
    let mut left = Vec::new();
    let mut rd = &s;
    let _ = rd.read_to_end(&mut left);
    assert_eq!(
        left,
        reply[want.min(reply.len())..],
        "the handshake took {} bytes, not {want}",
        reply.len() - left.len()
    );
}

/// How long a SOCKS5 parent's greeting answer, RFC 1929 answer and
/// reply are, read independently of the client code.
fn v5_reply_len(r: &[u8], creds: bool, short: bool) -> Option<usize> {
    let mut at = 2;
    if *r.get(1)? == 2 && creds {
        at += 2;
    }
    let head = r.get(at..at + 4)?;
    let rest = match head[3] {
        1 if short => 0,
        1 => 6,
        4 => 18,
        3 => 1 + usize::from(*r.get(at + 4)?) + 2,
        _ => return None,
    };
    Some(at + 4 + rest)
}

// --- TLS, DNS, PROXY --------------------------------------------------------

/// tlspr's ClientHello reader (`proto::tls::parse_hello`): the SNI and
/// ALPN it finds, put in a hello of our own, read back the same.
pub fn tls_hello(data: &[u8]) {
    let data = cut(data);
    for kind in [1, 2] {
        let mut lv = -1;
        let Ok(h) = tls::parse_hello(kind, data, &mut lv) else {
            continue;
        };
        assert!((0..=255).contains(&lv), "version {lv}");
        if kind == 2 {
            assert!(h.sni.is_none(), "a ServerHello has no SNI");
        }
        if let Some(sni) = &h.sni {
            assert!(!sni.is_empty() && sni.len() <= 255);
            assert!(find(data, sni).is_some());
        }
        if let Some(alpn) = &h.alpn {
            assert!(alpn.len() <= 31);
        }
        let built = client_hello(h.sni.as_deref(), h.alpn.as_deref());
        let mut lv2 = -1;
        if kind == 1 {
            let h2 = tls::parse_hello(1, &built, &mut lv2)
                .unwrap_or_else(|e| panic!("our own hello refused: {e}"));
            assert_eq!(h2, h, "our own hello read back");
        }
    }
}

/// A ClientHello record with this SNI and ALPN protocol.
fn client_hello(sni: Option<&[u8]>, alpn: Option<&[u8]>) -> Vec<u8> {
    let mut ext = Vec::new();
    if let Some(n) = sni {
        let l = n.len() as u16;
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&(l + 5).to_be_bytes());
        ext.extend_from_slice(&(l + 3).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&l.to_be_bytes());
        ext.extend_from_slice(n);
    }
    if let Some(p) = alpn {
        let l = p.len() as u16;
        ext.extend_from_slice(&[0, 16]);
        ext.extend_from_slice(&(l + 3).to_be_bytes());
        ext.extend_from_slice(&(l + 1).to_be_bytes());
        ext.push(p.len() as u8);
        ext.extend_from_slice(p);
    }
    // Padding, so even a hello without extensions has 64 bytes.
    ext.extend_from_slice(&[0, 21, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// dnspr's query reader (`proto::dns::Question`): the question lies
/// inside the datagram, and the replies built from it are DNS messages
/// that carry the query's ID and question.
pub fn dns_proxy(data: &[u8]) {
    let data = cut(data);
    let Ok(q) = dns::Question::parse(data) else {
        return;
    };
    assert!(q.end <= data.len() && q.end >= 17, "end {}", q.end);
    for (reply, answers) in [
        (q.nxdomain_reply(), 0),
        (q.addr_reply(IpAddr::from([192, 0, 2, 7]), 60), 1),
        (q.ptr_reply(), 1),
    ] {
        assert_eq!(reply[..2], data[..2], "the reply carries the query's ID");
        assert_eq!(&reply[12..q.end], &data[12..q.end], "and its question");
        assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), answers);
        assert_eq!(
            reply.len(),
            q.end + if answers == 0 { 0 } else { 12 } + rdata_len(&reply, q.end, answers)
        );
    }
    // A plain name (what dnspr answers itself) asked as A or PTR gives a
    // message a DNS library reads back.
    let (a, ptr) = (
        q.addr_reply(IpAddr::from([192, 0, 2, 7]), 60),
        q.ptr_reply(),
    );
    for (reply, qtype) in [(a, 1), (ptr, 12)] {
        if q.plain && q.qtype == qtype && data[q.end - 2..q.end] == [0, 1] {
            let p = simple_dns::Packet::parse(&reply);
            assert!(p.is_ok(), "reply {reply:?}: {p:?}");
        }
    }
}

fn rdata_len(reply: &[u8], end: usize, answers: u16) -> usize {
    if answers == 0 {
        return 0;
    }
    usize::from(u16::from_be_bytes([reply[end + 10], reply[end + 11]]))
}

/// The resolver's reply check (`proto::dns::Query::check`): an answer is
/// taken only from a response to our query (ID, name, type, class), and
/// is of the type asked.
pub fn dns_reply(data: &[u8]) {
    let data = cut(data);
    let Some((&opts, reply)) = data.split_first() else {
        return;
    };
    let qt = match opts % 3 {
        0 => dns::Qt::A,
        1 => dns::Qt::Aaaa,
        _ => dns::Qt::Ptr,
    };
    let Ok(q) = dns::Query::new("www.example.test", qt) else {
        panic!("a valid name is refused");
    };
    let mut msg = reply.to_vec();
    // The input's ID is replaced by the query's (random) one, unless the
    // option says to keep it: then the reply must be dropped, most of
    // the time.
    if msg.len() >= 2 && opts & 0x80 == 0 {
        msg[..2].copy_from_slice(&q.id.to_be_bytes());
    }
    let got = q.check(&msg);
    if msg.len() < 2 || u16::from_be_bytes([msg[0], msg[1]]) != q.id {
        assert!(got.is_none(), "a reply with another ID was taken");
        return;
    }
    let Some(got) = got else { return };
    let p = simple_dns::Packet::parse(&msg).expect("a taken reply parses");
    assert_eq!(p.questions.len(), 1);
    if let dns::Reply::Done(dns::Answer::Addr(ip, _)) = got {
        let want_v6 = matches!(qt, dns::Qt::Aaaa);
        assert_eq!(ip.is_ipv6(), want_v6, "an answer of the wrong type");
        assert!(!matches!(qt, dns::Qt::Ptr));
    }
}

/// The PROXY protocol v1 header (`proto::proxy_v1`): a header that
/// parses, written again, parses to the same addresses; `proxy_v1::read`
/// takes the header line off a socket and not one byte after it.
pub fn proxy_header(data: &[u8]) {
    let data = cut(data);
    if let Ok(Some((src, dst))) = proxy_v1::parse(data) {
        assert_eq!(src.is_ipv6(), dst.is_ipv6());
        let fam = if src.is_ipv6() { "TCP6" } else { "TCP4" };
        let line = format!(
            "PROXY {fam} {} {} {} {}\r\n",
            src.ip(),
            dst.ip(),
            src.port(),
            dst.port()
        );
        assert!(line.len() <= proxy_v1::MAX_LINE, "{line:?}");
        assert_eq!(proxy_v1::parse(line.as_bytes()), Ok(Some((src, dst))));
    }
    let Ok((ours, mut theirs)) = std::os::unix::net::UnixStream::pair() else {
        return;
    };
    if theirs.write_all(data).is_err() || theirs.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let _ = ours.set_read_timeout(Some(Duration::from_secs(5)));
    let s = Stream::Unix(ours);
    let r = proxy_v1::read(&s);
    let mut left = Vec::new();
    let mut rd = &s;
    let _ = rd.read_to_end(&mut left);
    let line_end = data.iter().position(|&b| b == b'\n').map(|i| i + 1);
    if let Ok(h) = r {
        let end = line_end.expect("a header without its line end was taken");
        assert!(end <= proxy_v1::MAX_LINE);
        assert_eq!(left, data[end..], "read took more than the header line");
        assert_eq!(proxy_v1::parse(&data[..end]), Ok(h));
    }
}

// --- logformat, mail and FTP ------------------------------------------------

/// `logformat` (`LogFormat::parse` and `render`): the first line is the
/// format, the next ones the user, host and text a record carries. A
/// record is rendered the same twice and stays within 3proxy's cap.
pub fn logformat(data: &[u8]) {
    let data = cut(data);
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let fmt = lines.next().unwrap_or_default();
    let user = lines.next();
    let host = lines.next();
    let detail = lines.next().unwrap_or_default();
    let f = LogFormat::parse(fmt);
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut rec = LogRecord::blank("PROXY", when);
    rec.user = user;
    rec.req_host = host;
    rec.text = detail;
    rec.client = Some(SocketAddr::from(([10, 1, 2, 3], 40000)));
    rec.remote = Some("[2001:db8::1]:443".parse().expect("an address"));
    rec.bytes_in = u64::MAX;
    rec.bytes_out = 12345;
    rec.res = 99999;
    rec.now = when + Duration::from_millis(1500);
    let mut out = Vec::new();
    f.render(&rec, &mut out);
    let mut out2 = b"prefix".to_vec();
    f.render(&rec, &mut out2);
    assert_eq!(&out2[6..], &out[..], "render appends, the same each time");
    assert!(
        out.len() <= LOOP_CAP + 512,
        "a record of {} bytes from {} bytes of input",
        out.len(),
        data.len()
    );
}

/// StringsPlugin's file (`stringtable::parse`): a string it keeps is not
/// empty and holds no NUL, and CR and LF only as the CR LF a `\n` made
/// (each line lost its own end); the same file reads the same twice.
pub fn strings_file(data: &[u8]) {
    let data = cut(data);
    let p = stringtable::parse(data);
    let kept = (0..PROXY_COUNT)
        .filter_map(|i| p.strings.proxy(i))
        .chain((0..ADMIN_COUNT).filter_map(|i| p.strings.admin(i)));
    for s in kept {
        assert!(!s.is_empty(), "an empty string replaces an entry");
        assert!(!s.contains(&0), "a NUL in {s:?}");
        for (i, &b) in s.iter().enumerate() {
            match b {
                b'\r' => assert_eq!(s.get(i + 1), Some(&b'\n'), "a CR alone in {s:?}"),
                b'\n' => assert_eq!(s[..i].last(), Some(&b'\r'), "an LF alone in {s:?}"),
                _ => {}
            }
        }
    }
    assert!(p.problems.len() <= 8, "{:?}", p.problems);
    assert_eq!(stringtable::parse(data).strings, p.strings);
}

/// The line readers and login parsers of pop3p, imapp, smtpp and ftppr
/// (`proto::mail`, `proto::ftp`, the AUTH decoders of `proto::imap` and
/// `proto::smtp`): lines read from a buffer or a socket add up to the
/// input; a login that parses, written again, parses the same.
pub fn mail_ftp(data: &[u8]) {
    let data = cut(data);
    // Lines from what an earlier handler read.
    let mut early = mail::Lines::with(data);
    let mut lines = Vec::new();
    while let Some(l) = early.buffered() {
        assert_eq!(l.last(), Some(&b'\n'));
        lines.push(l);
    }
    let rest = early.buf.clone();
    assert!(!rest.contains(&b'\n'));
    assert_eq!([lines.concat(), rest].concat(), data, "lines add up");

    // Lines from a socket, at most 100 bytes each.
    if let Ok((ours, mut theirs)) = std::os::unix::net::UnixStream::pair() {
        if theirs.write_all(data).is_ok() && theirs.shutdown(std::net::Shutdown::Write).is_ok() {
            let _ = ours.set_read_timeout(Some(Duration::from_secs(5)));
            let s = Stream::Unix(ours);
            let mut rd = mail::Lines::default();
            let mut got = Vec::new();
            loop {
                let l = rd.line_from(100, |chunk| (&s).read(chunk));
                if l.is_empty() {
                    break;
                }
                assert!(l.len() <= 100);
                assert!(l.len() == 100 || l.ends_with(b"\n") || rd.buf.is_empty());
                got.extend_from_slice(&l);
            }
            assert_eq!(got, data, "socket lines add up");
            assert_eq!(rd.total, data.len() as u64);
        }
    }

    for l in &lines {
        let arg = l.strip_suffix(b"\n").unwrap_or(l);
        let arg = arg.strip_suffix(b"\r").unwrap_or(arg);
        mail_login(arg);
        if let Some(raw) = smtp::decode(arg) {
            if let Some((name, pass)) = smtp::split_plain(&raw) {
                assert!(name.len() + pass.len() < raw.len());
            }
        }
        if let Some(raw) = imap::de64(arg, 319) {
            assert!(raw.len() <= 319);
            if let Some((u, p)) = imap::parse_plain(&raw) {
                assert!(!u.contains(&0) && !p.contains(&0));
            }
        }
        if let Some((u, p)) = imap::parse_login_args(arg) {
            assert!(u.len() + p.len() < arg.len());
        }
    }
}

/// `USER name@host[:port]` as pop3p (and imapp, smtpp) and ftppr split it.
fn mail_login(arg: &[u8]) {
    let default = (Some("default.test"), 110);
    for creds in [false, true] {
        let Some(l) = mail::parse_login(arg, b'@', creds, default) else {
            continue;
        };
        assert!(!l.host.is_empty() && l.host.len() <= 253 * 3 && l.port > 0);
        let f = ftp::parse_login(arg, b'@', creds, Some(("default.test", 110)));
        let f = f.expect("ftppr refuses what pop3p takes");
        assert!(f.host == l.host && f.port == l.port && f.name == l.name);
        assert!(f.user == l.user && f.password == l.password);
        // Written again as name@host:port: the same login.
        if creds || std::str::from_utf8(arg).is_err() || l.host.contains(['[', ']', '@']) {
            continue;
        }
        let host = if l.host.contains(':') {
            format!("[{}]", l.host)
        } else {
            l.host.clone()
        };
        let again = format!("{}@{host}:{}", l.name, l.port);
        let l2 = mail::parse_login(again.as_bytes(), b'@', false, default);
        assert_eq!(l2.as_ref(), Some(&l), "{again:?}");
    }
}

// --- RADIUS ----------------------------------------------------------------

/// RADIUS datagrams as the proxy reads them: an answer to its
/// Access-Request (`radius::authenticate`) and a Disconnect/CoA request
/// (`radiusdae`). The input is tried as it comes (almost never signed
/// right: it must be refused, never panic) and as the attributes of a
/// packet signed with the secret, so the attribute reader is reached: a
/// signed packet is taken, or refused only for its attributes.
pub fn radius(data: &[u8]) {
    use crate::proto::radius::{self as r, Builder, Fault};
    use md5::{Digest, Md5};
    let data = cut(data);
    let secret = b"fuzz secret";
    let mut b = Builder::new(r::ACCESS_REQUEST, 7, [1; 16]);
    b.add(r::attr::USER_NAME, b"user");
    let req = b.finish_access(secret);
    let _ = r::parse_reply(data, &req, secret);
    let _ = r::parse_dae(data, secret);
    if data.len() + 20 > r::MAX_PACKET {
        return;
    }
    let len = (data.len() + 20) as u16;
    let sign = |code: u8, id: u8, auth: &[u8]| {
        let mut pkt = vec![code, id];
        pkt.extend_from_slice(&len.to_be_bytes());
        pkt.extend_from_slice(auth);
        pkt.extend_from_slice(data);
        let mut h = Md5::new();
        h.update(&pkt);
        h.update(secret);
        pkt[4..20].copy_from_slice(&h.finalize());
        pkt
    };
    // An Access-Accept: MD5(code, id, length, request authenticator,
    // attributes, secret).
    let accept = sign(r::ACCESS_ACCEPT, req[1], &req[4..20]);
    match r::parse_reply(&accept, &req, secret) {
        Ok(reply) => {
            assert_eq!(reply.code, r::ACCESS_ACCEPT);
            for c in &reply.class {
                assert!(c.len() <= 253, "a Class longer than an attribute");
            }
        }
        Err(f) => assert!(
            matches!(f, Fault::Attributes | Fault::MessageAuthenticator),
            "a signed Access-Accept refused for {f:?}"
        ),
    }
    // A Disconnect-Request: MD5 over the packet with a zero
    // authenticator, and the secret.
    let dae = sign(r::DISCONNECT_REQUEST, 9, &[0; 16]);
    match r::parse_dae(&dae, secret) {
        Ok(d) => {
            assert_eq!((d.code, d.id), (r::DISCONNECT_REQUEST, 9));
            assert_eq!(&d.authenticator[..], &dae[4..20]);
        }
        Err(f) => assert!(
            matches!(f, Fault::Attributes | Fault::MessageAuthenticator),
            "a signed Disconnect-Request refused for {f:?}"
        ),
    }
}
