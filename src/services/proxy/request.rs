//! Reading a request head within its deadlines, and parsing it into a
//! [`Req`] (the log line, the host, the credentials).

use std::time::Instant;

use crate::access;
use crate::client::Client;
use crate::net::parse_ip;
use crate::proto::http::{self, HeadError};
use crate::res::Res;
use crate::timeouts::Timeouts;

use super::ftp;
use super::head::{read_head, HeadBuf, HeadClock, HeadRead};
use super::inside::pin_inside;
use super::session::{Fail, Req, Session};

impl Session {
    /// Read a request head. Ok(None): the client closed (or went quiet)
    /// between requests.
    ///
    /// The head has deadlines, not idle times (a client that sends a byte
    /// now and then must not hold its thread and its `maxconn` slot for
    /// ever): the request line must be in within `cli_want` (STRING_LONG
    /// for a connection's first request, STRING_SHORT between requests),
    /// and the rest of the head within STRING_SHORT after the line. Past
    /// a deadline a client that sent part of a head is answered 408.
    pub(super) fn read_request(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
    ) -> Result<Option<Req>, Fail> {
        let window = self.cli_want;
        let started = Instant::now();
        // Parking: the first wait ends after the linger, not the window
        // (shorter while many sessions linger, `park::Lingering`).
        let linger = self.linger.filter(|l| *l < window);
        let (_lingering, linger) = linger.map(crate::park::Lingering::start).unzip();
        // Inside an intercepted tunnel the tunnel is the session: its
        // requests are not heads of the connection's.
        let watched = self.inside.is_none();
        if watched && c.live.phase() == crate::live::Phase::Busy {
            // After a request: kept alive until the next one.
            c.live.idle(started);
        }
        let mut clock = HeadClock {
            line_by: started + window,
            rest: self.svc.timeouts.get(Timeouts::STRING_SHORT),
            rest_by: None,
            window: linger.unwrap_or(window),
            rto: self.cli_rto,
        };
        loop {
            let live = watched.then_some(&c.live);
            let read = read_head(&c.cli, cb, Some(&mut clock), live);
            self.cli_rto = clock.rto;
            let read = match read {
                Err(HeadRead::Closed { partial } | HeadRead::Io { partial })
                    if c.live.ended_by() == Some(crate::live::EndedBy::Slow) =>
                {
                    // Closed by `minrate`: what was sent is answered.
                    Err(HeadRead::Timeout { partial })
                }
                r => r,
            };
            let end = match read {
                Ok(end) => end,
                Err(HeadRead::Timeout { partial: false }) if linger.is_some() => {
                    self.quiet_since = Some(started);
                    return Ok(None);
                }
                Err(HeadRead::Closed { partial: false })
                | Err(HeadRead::Timeout { partial: false }) => return Ok(None),
                Err(HeadRead::Io { partial: false }) => return Ok(None),
                Err(HeadRead::TooBig) => {
                    c.record.begin();
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::answer(Res::HTTP_HEAD_TOO_LARGE, 431));
                }
                Err(HeadRead::Timeout { partial: true }) => {
                    c.record.begin();
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::answer(Res::IDLE, 408));
                }
                Err(_) => {
                    c.record.begin();
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::silent(Res::HTTP_NO_REQUEST_ERR));
                }
            };
            c.record.begin();
            match self.parse(c, &cb.data()[..end]) {
                Ok(Some(req)) => {
                    if self.inside.is_none() && !c.live.busy() {
                        // Chosen for its slot a moment before its head
                        // was in: it is closed.
                        return Err(Fail::silent(Res::RECLAIMED));
                    }
                    return Ok(Some(req));
                }
                // A blank line was seen but the head is not complete (leading
                // empty lines): read on.
                Ok(None) => cb.scanned = end,
                Err(f) => {
                    set_text_from_raw(c, cb.data());
                    return Err(f);
                }
            }
        }
    }

    #[inline(never)]
    fn parse(&mut self, c: &mut Client, data: &[u8]) -> Result<Option<Req>, Fail> {
        let rw = http::Rewrite {
            strip_forwarding: self.svc.opts.anonymous == Some(0),
            extra: &self.extra,
            delim: self.svc.delimchar,
            login: self.svc.opts.needuser.unwrap_or(1) > 0,
            // Inside an intercepted tunnel a request without Host (HTTP/1.0)
            // names the tunnel's destination.
            redirected_to: self.redirected_to.or(self.inside.as_ref().map(|i| i.addr)),
        };
        let mut h = match http::parse_request(data, &rw, &mut self.req_out) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(e) => {
                let res = match e {
                    HeadError::Syntax => Res::HTTP_BAD_HEAD,
                    HeadError::Scheme => Res::HTTP_SCHEME,
                    HeadError::Framing => Res::HTTP_FRAMING,
                    HeadError::Target => Res::HTTP_BAD_TARGET,
                    HeadError::TooMany => Res::HTTP_HEAD_TOO_LARGE,
                    HeadError::Login => Res::NOHOST,
                };
                let status = match e {
                    HeadError::TooMany => 431,
                    HeadError::Login => 502,
                    _ => 400,
                };
                return Err(Fail::answer(res, status));
            }
        };
        c.hops = self.base_hops;
        if let Some(inside) = self.inside.as_deref() {
            pin_inside(&mut h, inside)?;
        }
        let redirected_to = self
            .redirected_to
            .filter(|_| !h.is_connect() && h.uri.starts_with('/'))
            .or(self.inside.as_ref().map(|i| i.addr));
        c.record.text.clear();
        // One allocation for the line (a new client's text is empty; four
        // pushes would grow it three times).
        c.record.text.reserve(h.method.len() + h.uri.len() + 32);
        c.record.text.push_str(h.method);
        c.record.text.push(' ');
        if redirected_to.is_some() && h.uri.starts_with('/') {
            // As 3proxy logs a transparent request (and one inside an
            // intercepted tunnel): in absolute form.
            c.record.text.push_str("http://");
            if h.host.contains(':') {
                c.record.text.push('[');
                c.record.text.push_str(&h.host);
                c.record.text.push(']');
            } else {
                c.record.text.push_str(&h.host);
            }
            if h.port != 80 {
                c.record.text.push_str(&format!(":{}", h.port));
            }
        }
        if let Some(to) = redirected_to {
            // The destination's port, for the ACL and the connection.
            h.port = to.port();
        }
        // An ftp:// URL's password is not logged (as 3proxy's logurl).
        c.record.text.push_str(&ftp::hide_password(h.uri));
        c.record.text.push_str(if h.version == 0 {
            " HTTP/1.0"
        } else {
            " HTTP/1.1"
        });
        if self.host.is_empty() || *self.host != *h.host {
            self.host.clear();
            self.host.push_str(&h.host);
            self.host_ip = parse_ip(&h.host);
        }
        let literal = self.host_ip;
        // The host as written, an address too: it is what `%n` logs and
        // what the ACL's host patterns see (3proxy's `parsehostname`).
        match &mut c.req_host {
            Some(n) => {
                n.clear();
                n.push_str(&h.host);
            }
            None => c.req_host = Some(h.host.to_string()),
        }
        // `Proxy-Authorization` wins over a login in the URL, as in 3proxy
        // (it reads the URL first, then the fields).
        let login = std::mem::take(&mut h.login);
        let (user, password) = match (h.proxy_auth.and_then(http::basic_credentials), &self.inside)
        {
            (Some((u, p)), _) => (Some(u), Some(p)),
            // Inside an intercepted tunnel: the credentials it was opened with.
            (None, Some(i)) => (i.user.clone(), i.password.clone()),
            (None, None) => (login.user, login.password),
        };
        self.dest_auth = login.dest_auth;
        c.user.clone_from(&user);
        let ftp = h.ftp.map(str::to_string);
        let ftp_login = ftp.as_ref().and_then(|_| {
            self.dest_auth
                .as_deref()
                .and_then(|a| http::basic_credentials(a.as_bytes()))
                .or_else(|| h.auth.and_then(http::basic_credentials))
        });
        // 3proxy's operations for ftp://: GET and PUT are FTP ones.
        let op = match (&ftp, h.method) {
            (Some(_), "GET") => access::Op::FtpGet,
            (Some(_), "PUT") => access::Op::FtpPut,
            _ => op_of(h.method),
        };
        Ok(Some(Req {
            port: h.port,
            version: h.version,
            framing: h.framing,
            keep_alive: h.keep_alive,
            upgrade: h.upgrade,
            expect_continue: h.expect_continue,
            conn_auth: h.conn_auth,
            connect: h.is_connect(),
            head_method: h.method == "HEAD",
            idempotent: http::is_idempotent(h.method),
            op,
            literal,
            redirected_to,
            user,
            password,
            ftp,
            ftp_login,
        }))
    }
}

/// The method's operation name for the ACL (3proxy's HTTP_* ops).
fn op_of(method: &str) -> access::Op {
    use access::Op;
    match method {
        "GET" => Op::HttpGet,
        "POST" | "BITS_POST" => Op::HttpPost,
        "PUT" => Op::HttpPut,
        "HEAD" => Op::HttpHead,
        "CONNECT" => Op::HttpConnect,
        _ => Op::HttpOther,
    }
}

/// The first line of what a client sent, for the log of a bad request.
fn set_text_from_raw(c: &mut Client, data: &[u8]) {
    let line = data.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = &line[..line.len().min(256)];
    c.record.text.clear();
    c.record.text.extend(line.iter().map(|&b| {
        if b.is_ascii_graphic() || b == b' ' {
            b as char
        } else {
            '.'
        }
    }));
}
