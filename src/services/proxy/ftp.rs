//! The HTTP proxy's FTP gateway (3proxy's proxy.c with ftp.c;
//! 3proxy.cfg(5) "FTP gateway"): a GET of an `ftp://` URL logs in at the
//! server (the URL's or `Authorization`'s credentials, else anonymous),
//! changes to the path; if that is a directory, the answer is an HTML
//! listing, else the file (TYPE I, RETR) is relayed to the client as the
//! body of a close-delimited answer. Every data connection is checked as
//! `FTP_DATA`, as in 3proxy.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use crate::access::{self, Request};
use crate::chain;
use crate::client::Client;
use crate::escape::{decode, path_into as encode};
use crate::net::Stream;
use crate::parent;
use crate::proto::ftp::{ends_reply, pasv_port};
use crate::res::Res;
use crate::stringtable;
use crate::timeouts::Timeouts;

/// The longest control line kept; longer ones are cut.
const MAX_LINE: usize = 4096;
/// At most this many bytes of listing, server text included, are built.
const MAX_LISTING: usize = 4 << 20;

/// What the gateway needs of the request.
pub(super) struct Want<'a> {
    /// The server, resolved and checked by the session.
    pub dst: SocketAddr,
    pub host: &'a str,
    /// The URL path, %-encoded.
    pub path: &'a str,
    pub user: Option<String>,
    pub password: Option<String>,
    pub parents: &'a [parent::Hop],
    pub weight: u32,
    /// A PUT: the body's length and the part of it read with the head.
    pub upload: Option<(u64, &'a [u8])>,
}

/// A failure: the code and the HTTP status to answer with (None: close
/// without an answer, as 3proxy does for these codes).
pub(super) type Failure = (Res, Option<u16>);

/// The control connection and what was read past the last line.
struct Control {
    s: Stream,
    buf: Vec<u8>,
}

impl Control {
    /// One line, its CRLF included; None at EOF, timeout or error.
    fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(nl + 1);
                return Some(std::mem::replace(&mut self.buf, rest));
            }
            if self.buf.len() >= MAX_LINE {
                let rest = self.buf.split_off(MAX_LINE);
                return Some(std::mem::replace(&mut self.buf, rest));
            }
            let mut b = [0u8; 1024];
            match (&self.s).read(&mut b) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
            }
        }
    }

    /// A whole reply: the final line (its code first), every line added to
    /// `text` when given. None when the server closed or went quiet.
    fn reply(&mut self, mut text: Option<&mut Vec<u8>>) -> Option<Vec<u8>> {
        loop {
            let l = self.line()?;
            if let Some(t) = text.as_deref_mut() {
                t.extend_from_slice(&l);
            }
            if ends_reply(&l) {
                return Some(l);
            }
        }
    }

    fn send(&self, cmd: &str) -> bool {
        (&self.s).write_all(cmd.as_bytes()).is_ok()
    }
}

/// Text for HTML (`crate::escape`), CR and LF dropped.
fn escape(s: &str, out: &mut String) {
    crate::escape::html_into(&s.replace(['\r', '\n'], ""), out);
}

/// Serve the request; Ok(true) when the client connection may be kept.
pub(super) fn serve(c: &mut Client, w: &Want<'_>, timeouts: &Timeouts) -> Result<bool, Failure> {
    let svc = c.svc().clone();
    let long = timeouts.get(Timeouts::STRING_LONG);
    let path = decode(w.path);
    // 3proxy sends at most 512 bytes of a path in a command.
    if path.contains(['\r', '\n']) || path.len() > 512 {
        return Err((Res::HTTP_BAD_TARGET, Some(400)));
    }
    let want = chain::Want {
        addr: Some(w.dst),
        host: Some(w.host),
        client: c.client_addr,
        local: c.local_addr,
        ..chain::Want::default()
    };
    let mut s = match chain::connect(&svc, w.parents, &want) {
        Ok(chain::Route::Stream(ch)) => {
            c.hops += ch.hops;
            ch.stream
        }
        Ok(chain::Route::Local { .. }) => return Err((Res::NOTIMPL, Some(501))),
        Err(res) => return Err((res, Some(502))),
    };
    // `ssl_cli` (modes 0 and 1, as for ftppr): the control connection is
    // implicit FTPS; the data connections stay in clear, as 3proxy's.
    crate::session::tls_to_dest(c, &mut s, w.host, crate::session::DestAt::Reached, false)
        .map_err(|res| (res, Some(502)))?;
    c.remote_addr = s.peer_addr();
    c.ext_addr = s.local_addr();
    c.record.ops.connects += 1;
    let _ = s.set_timeout(Some(long));
    let mut ctl = Control { s, buf: Vec::new() };
    login(&mut ctl, w)?;

    // A directory if CWD takes it (3proxy asks with a trailing '/').
    let mut dir = path.clone();
    if !dir.ends_with('/') {
        dir.push('/');
    }
    let mut cwd_text = Vec::new();
    if !ctl.send(&format!("CWD {dir}\r\n")) {
        return Err((Res::FTP_CWD_SEND, None));
    }
    let cwd = ctl
        .reply(Some(&mut cwd_text))
        .ok_or((Res::FTP_CWD_NO_REPLY, None))?;
    if cwd[0] == b'2' {
        if w.upload.is_some() {
            // A directory cannot be stored to.
            return Err((Res::FTP_NO_DATA_CONN, Some(409)));
        }
        return listing(c, &mut ctl, w, &dir, &cwd_text, long);
    }
    if !ctl.send("TYPE I\r\n") {
        return Err((Res::FTP_TYPE_SEND, None));
    }
    match ctl.reply(None) {
        None => return Err((Res::FTP_TYPE_NO_REPLY, None)),
        Some(r) if r[0] != b'2' => return Err((Res::FTP_TYPE_REFUSED, None)),
        Some(_) => {}
    }
    let file = path.trim_end_matches('/');
    if let Some((len, early)) = w.upload {
        let data = command(c, &mut ctl, w, &format!("STOR {file}\r\n"))?;
        return store(c, &mut ctl, data, len, early, timeouts);
    }
    let data = command(c, &mut ctl, w, &format!("RETR {file}\r\n"))?;
    // StringsPlugin's text for it, if any: 3proxy heads a file with the
    // line that opens a tunnel.
    let head = svc
        .strings
        .as_deref()
        .and_then(|t| t.proxy(stringtable::ESTABLISHED))
        .unwrap_or(b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\n");
    (&c.cli)
        .write_all(head)
        .map_err(|_| (Res::FTP_CLIENT_SEND, None))?;
    c.record.bytes_in += head.len() as u64;
    let _ = data.set_timeout(Some(timeouts.get(Timeouts::CONNECTION_LONG)));
    let mut b = vec![0u8; 16 * 1024];
    loop {
        match (&data).read(&mut b) {
            Ok(0) => break,
            Ok(n) => {
                if (&c.cli).write_all(&b[..n]).is_err() {
                    return Err((Res::FTP_CLIENT_SEND, None));
                }
                c.record.bytes_in += n as u64;
            }
            Err(_) => return Err((Res::SERVER_ERR, None)),
        }
    }
    Ok(false)
}

/// A PUT's body (`len` bytes, `early` of them read with the head) to the
/// data connection of a STOR; the answer waits for the server's final
/// reply, so the client learns whether the file was stored (3proxy
/// answers 200 before the upload).
fn store(
    c: &mut Client,
    ctl: &mut Control,
    data: Stream,
    len: u64,
    early: &[u8],
    timeouts: &Timeouts,
) -> Result<bool, Failure> {
    let idle = timeouts.get(Timeouts::CONNECTION_LONG);
    let _ = data.set_timeout(Some(idle));
    let _ = c.cli.set_read_timeout(Some(idle));
    let first = early.len().min(len as usize);
    (&data)
        .write_all(&early[..first])
        .map_err(|_| (Res::SERVER_ERR, Some(502)))?;
    c.record.bytes_out += first as u64;
    let mut left = len - first as u64;
    let mut b = vec![0u8; 16 * 1024];
    while left > 0 {
        let want = b.len().min(left as usize);
        match (&c.cli).read(&mut b[..want]) {
            // Cut short: the server keeps what came (as any FTP upload
            // does); the client gets no answer.
            Ok(0) | Err(_) => return Err((Res::CLIENT_ERR, None)),
            Ok(n) => {
                (&data)
                    .write_all(&b[..n])
                    .map_err(|_| (Res::SERVER_ERR, Some(502)))?;
                c.record.bytes_out += n as u64;
                left -= n as u64;
            }
        }
    }
    // The end of the data connection is the end of the file.
    drop(data);
    let _ = ctl.s.set_timeout(Some(timeouts.get(Timeouts::STRING_LONG)));
    match ctl.reply(None) {
        None => return Err((Res::FTP_NO_FINAL_REPLY, Some(502))),
        Some(r) if r[0] != b'2' => return Err((Res::FTP_BAD_FINAL_REPLY, Some(502))),
        Some(_) => {}
    }
    let head = b"HTTP/1.0 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (&c.cli)
        .write_all(head)
        .map_err(|_| (Res::FTP_CLIENT_SEND, None))?;
    c.record.bytes_in += head.len() as u64;
    Ok(false)
}

/// `uri` without the password of an `ftp://user:password@host/` URL:
/// `ftp://user@host/`. Other URIs, and ftp:// ones without a password,
/// are returned as they are.
pub(super) fn hide_password(uri: &str) -> std::borrow::Cow<'_, str> {
    if !uri
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("ftp://"))
    {
        return uri.into();
    }
    let auth_end = uri[6..].find(['/', '?', '#']).map_or(uri.len(), |i| i + 6);
    let authority = &uri[6..auth_end];
    let Some(at) = authority.rfind('@') else {
        return uri.into();
    };
    let Some(colon) = authority[..at].find(':') else {
        return uri.into();
    };
    format!("{}{}", &uri[..6 + colon], &uri[6 + at..]).into()
}

/// 3proxy's ftplogin: a 2xx greeting, USER, and PASS when asked.
fn login(ctl: &mut Control, w: &Want<'_>) -> Result<(), Failure> {
    let g = ctl.reply(None).ok_or((Res::FTP_NO_GREETING, None))?;
    if g[0] != b'2' {
        return Err((Res::FTP_BAD_GREETING, Some(502)));
    }
    let user = w.user.as_deref().unwrap_or("anonymous");
    if user.contains(['\r', '\n']) || !ctl.send(&format!("USER {user}\r\n")) {
        return Err((Res::FTP_USER_SEND, Some(502)));
    }
    let r = ctl.reply(None).ok_or((Res::FTP_USER_NO_REPLY, Some(502)))?;
    match r[0] {
        b'2' => return Ok(()),
        b'3' => {}
        _ => return Err((Res::FTP_LOGIN_REFUSED, Some(401))),
    }
    let pass = match (&w.user, &w.password) {
        (Some(_), Some(p)) => p.as_str(),
        (Some(_), None) => "",
        (None, _) => "3proxy@",
    };
    if pass.contains(['\r', '\n']) || !ctl.send(&format!("PASS {pass}\r\n")) {
        return Err((Res::FTP_PASS_SEND, Some(502)));
    }
    let r = ctl.reply(None).ok_or((Res::FTP_PASS_NO_REPLY, Some(401)))?;
    if r[0] != b'2' {
        return Err((Res::FTP_LOGIN_REFUSED, Some(401)));
    }
    Ok(())
}

/// 3proxy's ftpcommand: PASV, the data connection (checked as
/// FTP_DATA), the command, and a 1xx answer to it. Any failure is 780,
/// answered 404.
fn command(c: &mut Client, ctl: &mut Control, w: &Want<'_>, cmd: &str) -> Result<Stream, Failure> {
    let fail = (Res::FTP_NO_DATA_CONN, Some(404));
    if !ctl.send("PASV\r\n") {
        return Err(fail);
    }
    let r = ctl.reply(None).ok_or(fail)?;
    if r.len() < 7 || r[0] != b'2' {
        return Err(fail);
    }
    let port = pasv_port(&r).ok_or(fail)?;
    let ip = ctl.s.peer_addr().ok_or(fail)?.ip();
    let dst = SocketAddr::new(ip, port);
    let req = Request {
        host: Some(w.host),
        addr: Some(ip),
        port,
        ..c.request(access::Op::FtpData)
    };
    let svc = c.svc().clone();
    let grant = access::authorize_at(&svc, &req, w.weight).map_err(|res| (res, Some(404)))?;
    let want = chain::Want {
        addr: Some(dst),
        client: c.client_addr,
        local: c.local_addr,
        ..chain::Want::default()
    };
    let data = match chain::connect(&svc, &grant.parents, &want) {
        Ok(chain::Route::Stream(ch)) => ch.stream,
        _ => return Err(fail),
    };
    if !ctl.send(cmd) {
        return Err(fail);
    }
    let r = ctl.reply(None).ok_or(fail)?;
    if r[0] != b'1' {
        return Err(fail);
    }
    Ok(data)
}

/// A directory: LIST, turned into an HTML page with a link per entry,
/// sent with a Content-Length so the connection can be kept.
fn listing(
    c: &mut Client,
    ctl: &mut Control,
    w: &Want<'_>,
    dir: &str,
    cwd_text: &[u8],
    wait: Duration,
) -> Result<bool, Failure> {
    let data = command(c, ctl, w, "LIST\r\n")?;
    let _ = data.set_timeout(Some(wait));
    let mut page = String::from("<pre><hr>\n");
    if dir != "/" {
        page.push_str("[<A HREF=\"..\">..</A>]\n");
    }
    if cwd_text.len() > 4 {
        escape(&String::from_utf8_lossy(cwd_text), &mut page);
        page.push_str("\n<hr>");
    }
    let mut lines = Control {
        s: data,
        buf: Vec::new(),
    };
    while let Some(l) = lines.line() {
        if page.len() > MAX_LISTING {
            break;
        }
        entry(&String::from_utf8_lossy(&l), dir, &mut page);
    }
    drop(lines);
    page.push_str("<hr>");
    // The transfer's final answer (226) ends the page, as in 3proxy.
    let mut end = Vec::new();
    let done = ctl.reply(Some(&mut end));
    escape(&String::from_utf8_lossy(&end), &mut page);
    page.push('\n');
    // A listing 3proxy would stream goes out under StringsPlugin's head
    // for it, if any, without a length: the close ends it.
    let svc = c.svc().clone();
    let streamed = (page.len() > stringtable::LONG_LISTING)
        .then(|| svc.strings.as_deref()?.proxy(stringtable::LISTING_HEAD))
        .flatten();
    let head = match streamed {
        Some(h) => h.to_vec(),
        None => format!(
            "HTTP/1.0 200 OK\r\nContent-Type: text/html\r\nConnection: keep-alive\r\nContent-Length: {}\r\n\r\n",
            page.len()
        )
        .into_bytes(),
    };
    let sent = (&c.cli)
        .write_all(&head)
        .and_then(|()| (&c.cli).write_all(page.as_bytes()));
    if sent.is_err() {
        return Err((Res::FTP_CLIENT_SEND, None));
    }
    c.record.bytes_in += (head.len() + page.len()) as u64;
    match done {
        None => Err((Res::FTP_NO_FINAL_REPLY, None)),
        Some(r) if r[0] != b'2' && r[0] != b'1' => Err((Res::FTP_BAD_FINAL_REPLY, None)),
        Some(_) => Ok(streamed.is_none()),
    }
}

/// One line of a LIST answer as 3proxy shows it: the mode, the date, the
/// size (or DIR, LINK), and the name as a link. Unix `ls -l` lines and
/// DOS lines (`date time <DIR>|size name`); other lines are left out.
fn entry(line: &str, dir: &str, page: &mut String) {
    let line = line.trim_end_matches(['\r', '\n']);
    let words: Vec<&str> = line.split_whitespace().collect();
    let (mode, date, size, name) = if line.starts_with(|c: char| c.is_ascii_digit()) {
        // DOS: 12-01-26  09:00PM  <DIR>  name
        if words.len() < 4 {
            return;
        }
        let isdir = words[2] == "<DIR>";
        if !isdir && !words[2].starts_with(|c: char| c.is_ascii_digit()) {
            return;
        }
        let name = nth_rest(line, 3);
        let mode = if isdir { "d---------" } else { "----------" };
        (mode, format!("{} {}", words[0], words[1]), words[2], name)
    } else {
        // Unix: mode links owner group size month day time|year name
        if words.len() < 9 || words[0].len() != 10 {
            return;
        }
        let name = nth_rest(line, 8);
        (words[0], words[5..8].join(" "), words[4], name)
    };
    let isdir = mode.starts_with('d');
    let link = mode.starts_with('l');
    page.push_str(mode);
    page.push(' ');
    page.push_str(&date);
    if isdir {
        page.push_str("       DIR");
    } else if link {
        page.push_str("      LINK");
    } else {
        let size = &size[..size.len().min(10)];
        page.push_str(&format!("{size:>10}"));
    }
    let (shown, target) = match name.split_once(" -> ") {
        Some((n, t)) if link => (n, t),
        _ => (name, name),
    };
    page.push_str(" <A HREF=\"");
    if !target.starts_with('/') {
        encode(dir, page);
    }
    encode(target, page);
    if isdir {
        page.push('/');
    }
    page.push_str("\">");
    escape(shown, page);
    page.push_str("</A>");
    if link && target != shown {
        page.push_str(" -&gt; ");
        escape(target, page);
    }
    page.push('\n');
}

/// The rest of `line` from its `n`th word on (a name may hold blanks).
fn nth_rest(line: &str, n: usize) -> &str {
    let mut rest = line.trim_start();
    for _ in 0..n {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        rest = rest[end..].trim_start();
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_lines() {
        let mut p = String::new();
        entry(
            "-rw-r--r--   1 ftp ftp   1234 Dec 01 21:00 a b.txt\r\n",
            "/pub/",
            &mut p,
        );
        entry(
            "drwxr-xr-x   2 ftp ftp   4096 Jan 02  2025 sub\r\n",
            "/",
            &mut p,
        );
        entry(
            "lrwxrwxrwx   1 ftp ftp      3 Dec 01 21:00 l -> x\r\n",
            "/",
            &mut p,
        );
        entry(
            "12-01-26  09:00PM       <DIR>          Docs\r\n",
            "/",
            &mut p,
        );
        entry("total 12\r\n", "/", &mut p);
        assert_eq!(
            p,
            "-rw-r--r-- Dec 01 21:00      1234 <A HREF=\"/pub/a%20b.txt\">a b.txt</A>\n\
             drwxr-xr-x Jan 02 2025       DIR <A HREF=\"/sub/\">sub</A>\n\
             lrwxrwxrwx Dec 01 21:00      LINK <A HREF=\"/x\">l</A> -&gt; x\n\
             d--------- 12-01-26 09:00PM       DIR <A HREF=\"/Docs/\">Docs</A>\n"
        );
    }

    #[test]
    fn passwords_are_not_logged() {
        assert_eq!(
            hide_password("ftp://alice:secret@h:21/pub/a.txt"),
            "ftp://alice@h:21/pub/a.txt"
        );
        assert_eq!(hide_password("FTP://a:b:c@h/"), "FTP://a@h/");
        assert_eq!(hide_password("ftp://alice@h/x"), "ftp://alice@h/x");
        assert_eq!(hide_password("ftp://h:2121/a@b"), "ftp://h:2121/a@b");
        assert_eq!(hide_password("http://u:p@h/"), "http://u:p@h/");
        assert_eq!(hide_password("/path"), "/path");
    }

    #[test]
    fn decoding() {
        assert_eq!(decode("/a%20b/%zz%4"), "/a b/%zz%4");
    }
}
