//! `proxy`: the HTTP/1.x forward proxy (3proxy's proxy.c, proxy(8)).
//!
//! One client thread serves one client connection, request after request:
//! read a request head, authorize it (`access::authorize`, once per
//! request), then either tunnel (`CONNECT`, and an `Upgrade` the origin
//! accepted) through the spine's relay, or forward the request to the
//! origin and the response back, bodies streamed by their framing. The
//! origin connection is kept while the next request goes to the same host
//! and port; when the client moves on or leaves, a clean one is parked in
//! a pool shared by the service's clients (`pool`) instead of being
//! closed. Heads are parsed and rewritten by `http` (pure); this module
//! does the IO, in parts:
//!
//! - this file: the session (`serve`, `Session`: read a request,
//!   authorize it, find or dial its origin, tunnel or exchange, respond),
//!   and the error answers with their result codes;
//! - `head`: head buffers and reading a head within its deadlines;
//! - `body`: copying a body by its framing, under the session's limits;
//! - `pool`: the idle origin connections shared by a service's clients;
//! - `sock`: the socket calls (sendmsg of two slices, timeouts).
//!
//! Speed and memory, by design:
//! - Sockets stay blocking, with read/write timeouts set when they change
//!   (not per request): a read that can proceed never waits for a poll().
//! - A head and the body bytes read with it leave in one writev.
//! - A client thread has a small stack (48 KiB by default), and every page
//!   of it the thread touched stays resident while the thread lives. So
//!   heads are read into small buffers on the stack (`head`), a `Session`
//!   lives on the heap, and the deep paths (connecting, exchanging,
//!   responding) are `#[inline(never)]`, so that their frames do not stack
//!   on one another. An idle keep-alive client holds no head or body
//!   buffer: bodies move through 64 KiB buffers borrowed from the shared
//!   pool (`bufpool`) only while a body moves.
//!
//! Invariants: one log record per request (`Client::log_record`); the
//! proxy and the origin always agree where a request ends (ambiguous
//! framing is refused by `http`); an error answer is sent only before any
//! byte of the response went to the client, and always closes the
//! connection.

mod body;
mod filt;
mod ftp;
mod head;
mod inside;
mod pool;
mod sock;

use inside::pin_inside;
pub use inside::{serve_inside, Inside};

use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::access::{self, Grant, Recheck, Request};
use crate::acl;
use crate::chain;
use crate::client::Client;
use crate::filter::{self, Filters, Verdict};
use crate::limit::Session as Limits;
use crate::net::{parse_ip, resolve, Stream};
use crate::parent::{self};
use crate::proto::http::{self, ChunkScanner, Framing, HeadError, ResponseHead};
use crate::res::Res;
use crate::service::Service;
use crate::session;
use crate::timeouts::Timeouts;

use body::{copy_chunked, copy_exact, copy_to_eof, is_bad_chunk, is_quota, Side};
use head::{read_head, read_response, HeadBuf, HeadClock, HeadRead, RespErr, SMALL, SMALL_REQUEST};
use pool::{park, still_open, unpark, Origin, Via};
use sock::{
    readable_within, send_lazy, set_read_timeout, set_timeouts, set_write_timeout, write_all_v,
};

/// How long to wait for an origin's `100 Continue` before sending the body
/// anyway (an origin may ignore `Expect`, RFC 9110 section 10.1.1).
const CONTINUE_WAIT: Duration = Duration::from_secs(1);
/// Most interim (1xx) responses relayed for one request; one more is
/// answered 502. Real origins send one or two (100, 102, 103).
const MAX_INTERIM: u32 = 16;

/// The client thread's work for one proxy client. `early` is what the
/// client sent before it was handed over, when it comes through a local
/// redirection (`parent http|connect|connect+ 0.0.0.0 0` in another
/// service's ACL). A CONNECT tunnel redirected locally (`parent pop3
/// 0.0.0.0 0`, ...) returns the hand-off to that handler.
pub fn serve(c: &mut Client, early: &[u8], _: Option<&parent::Known>) -> parent::Next {
    serve_requests(c, early);
    c.next()
}

fn serve_requests(c: &mut Client, early: &[u8]) {
    let svc = c.svc().clone();
    // On the heap: its frame would be on every path of the thread.
    let s = Box::new(Session::new(svc, c));
    requests(c, s, early, true, true);
}

/// Serve requests until the connection is done, or until it has been
/// quiet between two requests for `parklinger` (if `may_park`): then the
/// session is left in `c.parked` ([`ParkedHttp`]).
fn requests(c: &mut Client, mut s: Box<Session>, early: &[u8], mut first: bool, may_park: bool) {
    let mut small = [0u8; SMALL_REQUEST];
    let mut cb = HeadBuf::new(&mut small);
    cb.put_back(early);
    let linger = Some(s.svc.park_linger).filter(|d| may_park && !d.is_zero());
    if !first {
        s.linger = linger;
    }
    loop {
        let more = s.one_request(c, &mut cb, first);
        if !more {
            if let Some(since) = s.quiet_since.take() {
                // Quiet for the linger before its next request (the
                // head's first read timed out then): park until it comes,
                // or the end of the wait for it. The kept origin
                // connection goes to the pool meanwhile, where others
                // may use it.
                if let Some(k) = s.origin.take() {
                    park(&s.svc, k);
                }
                let deadline = since + s.cli_want;
                if c.logged {
                    // The last request's line is in its record; the next
                    // request writes its own (an idle client's memory).
                    c.text = String::new();
                }
                c.parked = Some(Box::new(ParkedHttp::keep(s, deadline, c)));
            }
            return;
        }
        if first {
            // Between requests a client gets STRING_S, as in 3proxy.
            first = false;
            s.cli_want = s.svc.timeouts.get(Timeouts::STRING_SHORT);
            s.linger = linger;
        }
        cb.rest();
    }
}

/// A kept-alive connection parked between two requests (`parklinger`):
/// what its [`Session`] carries from one request to the next, and no
/// more. The rest of a session (head buffers, the current request's
/// host, grant and credentials) is made anew for each request anyway,
/// so a parked client keeps 100-odd bytes here instead of a whole
/// session and its strings (issue 19: an idle client's memory).
struct ParkedHttp {
    svc: Arc<Service>,
    /// The forwarding fields as made for the connection, when they cannot
    /// be made again alike (`-a1` makes up its address once per
    /// connection); None: made again from the client on resume.
    extra: Option<Vec<u8>>,
    redirected_to: Option<SocketAddr>,
    weight: u32,
    base_hops: u32,
    cli_rto: Option<Duration>,
    cli_want: Duration,
    cli_wto: bool,
    /// `ssl_mitm`: the intercepted tunnel whose requests these are.
    inside: Option<Box<Inside>>,
    /// The end of the wait for the next request (STRING_SHORT after the
    /// last response).
    deadline: Instant,
}

impl ParkedHttp {
    /// What `s` carries over; `s` is dropped (its origin connection went
    /// to the pool already).
    fn keep(mut s: Box<Session>, deadline: Instant, c: &Client) -> ParkedHttp {
        ParkedHttp {
            svc: s.svc.clone(),
            extra: Some(std::mem::take(&mut s.extra)).filter(|_| !remade_alike(&s.svc, c)),
            redirected_to: s.redirected_to,
            weight: s.weight,
            base_hops: s.base_hops,
            cli_rto: s.cli_rto,
            cli_want: s.cli_want,
            cli_wto: s.cli_wto,
            inside: s.inside.take(),
            deadline,
        }
    }

    /// The session again, as [`ParkedHttp::keep`] found it between two
    /// requests; `linger` is set by [`requests`].
    fn session(self, c: &Client) -> Box<Session> {
        let extra = self
            .extra
            .unwrap_or_else(|| forwarding_fields(&self.svc, c));
        let mut s = Box::new(Session::with(
            self.svc,
            extra,
            self.redirected_to,
            self.base_hops,
        ));
        s.weight = self.weight;
        s.cli_rto = self.cli_rto;
        s.cli_want = self.cli_want;
        s.cli_wto = self.cli_wto;
        s.inside = self.inside;
        s
    }
}

impl crate::client::Tail for ParkedHttp {
    fn fds<'a>(&'a self, cli: &'a Stream) -> Vec<std::os::fd::BorrowedFd<'a>> {
        use std::os::fd::AsFd;
        vec![cli.as_fd()]
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn generation(&self) -> u64 {
        // Each request is authorized anew: nothing to check after a
        // reload.
        crate::generation::generation()
    }

    fn resume(self: Box<Self>, c: &mut Client, how: crate::client::Resumed) -> parent::Next {
        let may_park = how.may_park;
        // Woken by the client's socket: its next request (or its close)
        // is there, and asking costs a poll a request.
        if !how.ready && !readable_within(&c.cli, Duration::ZERO) {
            if Instant::now() >= self.deadline {
                // No next request: the connection ends, with no record
                // (as when a thread's wait for it times out).
                return c.next();
            }
            if may_park {
                // Woken for nothing (a reload): back to the lot.
                c.parked = Some(self);
                return c.next();
            }
        }
        // The session made again at this shallow point of the stack (as
        // `Session::new` is), with room for the heads.
        let s = self.session(c);
        requests(c, s, &[], false, may_park);
        c.next()
    }
}

/// What one client connection keeps between its requests.
struct Session {
    svc: Arc<Service>,
    /// The forwarded request head being sent.
    req_out: Vec<u8>,
    /// The response head being sent.
    resp_out: Vec<u8>,
    /// Fields added to every forwarded request (`Forwarded`, `Via`, ...).
    extra: Vec<u8>,
    /// The kept origin connection.
    origin: Option<Origin>,
    /// `transparent`: where the redirected client meant to go.
    redirected_to: Option<SocketAddr>,
    /// The current request's destination host.
    host: String,
    /// `host` read as an IP literal (kept with it: a kept-alive client's
    /// requests name one host, which is then parsed once).
    host_ip: Option<IpAddr>,
    /// What the access layer granted the current request (its limits are
    /// held until the request ends).
    grant: Option<Grant>,
    /// Bytes of the current request the limiter counted already (in, out).
    shaped: (u64, u64),
    /// `force`: what a tunnel (CONNECT, Upgrade) was authorized for, to
    /// check again after a reload.
    /// Boxed: only tunnels have one, and a kept-alive client's session
    /// waits with it between requests (issue 19).
    recheck: Option<Box<Recheck>>,
    /// The connection's ACL weight: each request's check starts from the
    /// one before it (3proxy's `param->weight`).
    weight: u32,
    /// The request head in absolute form, for an `http` parent.
    abs_out: Vec<u8>,
    /// `Basic ...` for the current request's destination, from credentials
    /// in its URL: `Authorization` for the origin, `Proxy-Authorization`
    /// for an `http` parent that has none of its own.
    dest_auth: Option<String>,
    /// Hops a SOCKS local redirection took before this handler (`%h`).
    base_hops: u32,
    /// The client socket's timeouts are set lazily: a read or a write
    /// that can proceed at once needs none, which saves a connection that
    /// makes one request both setsockopt() calls. `cli_rto` is the read
    /// timeout set (None: not yet), `cli_want` the one the next read of a
    /// request head must have (STRING_LONG first, then STRING_SHORT),
    /// `cli_wto` whether the write timeout (STRING_LONG) is set.
    cli_rto: Option<Duration>,
    cli_want: Duration,
    cli_wto: bool,
    /// STRING_LONG.
    long: Duration,
    /// `parklinger` between requests (None: the connection does not
    /// park): the socket's read timeout while the next head has not
    /// begun, so that a quiet client is noticed without a poll().
    linger: Option<Duration>,
    /// Set when the wait for the next head ended after `linger` with
    /// nothing read: since when it waited. The connection then parks.
    quiet_since: Option<Instant>,
    /// `ssl_mitm`: the requests come from inside an intercepted tunnel
    /// and go to its destination over TLS (`inside`).
    inside: Option<Box<Inside>>,
}

/// The parts of a request head the exchange needs after the head buffer
/// moved on.
struct Req {
    port: u16,
    version: u8,
    framing: Framing,
    keep_alive: bool,
    upgrade: bool,
    expect_continue: bool,
    connect: bool,
    head_method: bool,
    idempotent: bool,
    /// `Authorization: NTLM|Negotiate`.
    conn_auth: bool,
    op: access::Op,
    /// The host is an IP literal.
    literal: Option<IpAddr>,
    /// `transparent`: an origin-form request of a redirected client,
    /// which goes where the client meant to (its `Host` names it for the
    /// ACL and the log only).
    redirected_to: Option<SocketAddr>,
    user: Option<String>,
    password: Option<String>,
    /// An ftp:// request: its path, for the FTP gateway.
    ftp: Option<String>,
    /// The FTP login: the URL's credentials, else `Authorization`'s.
    ftp_login: Option<(String, String)>,
}

/// How a request ended, for the connection.
enum Next {
    /// Serve the next request.
    KeepAlive,
    Close,
    /// A CONNECT went to a local redirection: the connection is the next
    /// handler's, which writes the record.
    HandedOver,
    /// A CONNECT tunnel that ended its request itself (its record is
    /// written), or parked (`parklinger`): it writes the record when it
    /// ends. The connection is done either way.
    Tunneled,
    /// A CONNECT whose intercepted TLS carries HTTP: its requests are
    /// served next, and write the records (the CONNECT writes none).
    Inside,
}

/// A failure with the 3proxy code and, when no response was sent yet,
/// the HTTP status to answer with.
struct Fail {
    res: Res,
    status: Option<u16>,
    /// Not a failure: the tunnel's chain is a local redirection to the
    /// handler of this type, with these hops (see `Session::tunnel`).
    handoff: Option<(parent::Kind, u32)>,
}

impl Fail {
    fn answer(res: Res, status: u16) -> Fail {
        Fail {
            res,
            status: Some(status),
            handoff: None,
        }
    }
    fn silent(res: Res) -> Fail {
        Fail {
            res,
            status: None,
            handoff: None,
        }
    }
}

impl RespErr {
    /// The answer to give when no usable response head came.
    fn fail(&self) -> Fail {
        match self {
            RespErr::Head(HeadRead::Timeout { .. }) => Fail::answer(Res::IDLE, 504),
            RespErr::Head(HeadRead::TooBig) => Fail::answer(Res::HTTP_HEAD_TOO_LARGE, 502),
            RespErr::Head(HeadRead::Io { .. }) => Fail::answer(Res::SERVER_ERR, 502),
            RespErr::Head(HeadRead::Closed { .. }) | RespErr::Bad => {
                Fail::answer(Res::HTTP_BAD_REPLY, 502)
            }
        }
    }
}

impl Session {
    fn new(svc: Arc<Service>, c: &mut Client) -> Session {
        let redirected_to = c.original_dst();
        let extra = forwarding_fields(&svc, c);
        Session::with(svc, extra, redirected_to, c.hops)
    }

    /// A session before its first request: what a connection brings
    /// (its forwarding fields, where a redirected client meant to go,
    /// the hops a local redirection took), nothing learnt yet.
    fn with(
        svc: Arc<Service>,
        extra: Vec<u8>,
        redirected_to: Option<SocketAddr>,
        base_hops: u32,
    ) -> Session {
        let long = svc.timeouts.get(Timeouts::STRING_LONG);
        // Room for usual heads now, at a shallow point of the stack: a
        // realloc deep in the response path would touch one more page.
        Session {
            svc,
            req_out: Vec::with_capacity(512),
            resp_out: Vec::with_capacity(512),
            extra,
            origin: None,
            host: String::new(),
            host_ip: None,
            grant: None,
            shaped: (0, 0),
            recheck: None,
            weight: 0,
            abs_out: Vec::new(),
            dest_auth: None,
            base_hops,
            redirected_to,
            cli_rto: None,
            cli_want: long,
            cli_wto: false,
            long,
            linger: None,
            quiet_since: None,
            inside: None,
        }
    }

    /// Read and serve one request. False when the connection is done.
    fn one_request(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>, first: bool) -> bool {
        let req = match self.read_request(c, cb) {
            Ok(Some(r)) => r,
            Ok(None) => {
                if first {
                    // Closed or timed out before a request: 3proxy's 508/507.
                    c.res = Res::HTTP_NO_REQUEST;
                }
                return false;
            }
            Err(f) => {
                self.finish_error(c, f);
                return false;
            }
        };
        let result = if req.connect {
            self.tunnel(c, cb, &req)
        } else {
            self.forward(c, cb, &req)
        };
        let more = match result {
            Ok(Next::HandedOver | Next::Tunneled) => false,
            Ok(Next::Inside) => true,
            Ok(next) => {
                self.end_request(c);
                matches!(next, Next::KeepAlive)
            }
            Err(f) => {
                self.finish_error(c, f);
                false
            }
        };
        self.grant = None;
        self.recheck = None;
        self.shaped = (0, 0);
        more
    }

    /// The limits to shape bodies with, if any.
    fn shaper(&self) -> Option<&Limits> {
        self.grant
            .as_ref()
            .and_then(|g| g.limits.as_deref())
            .filter(|l| l.shapes())
    }

    /// Count the request's traffic (what the shaper did not count) and
    /// write its log record, unless the ACL said `nolog`.
    fn end_request(&mut self, c: &mut Client) {
        if let Some(l) = self.grant.as_ref().and_then(|g| g.limits.as_deref()) {
            l.add(
                c.bytes_in.saturating_sub(self.shaped.0),
                c.bytes_out.saturating_sub(self.shaped.1),
            );
        }
        if self.grant.as_ref().is_some_and(|g| g.nolog) {
            c.skip_record();
        } else {
            c.log_record();
        }
    }

    /// Read a request head. Ok(None): the client closed (or went quiet)
    /// between requests.
    ///
    /// The head has deadlines, not idle times (a client that sends a byte
    /// now and then must not hold its thread and its `maxconn` slot for
    /// ever): the request line must be in within `cli_want` (STRING_LONG
    /// for a connection's first request, STRING_SHORT between requests),
    /// and the rest of the head within STRING_SHORT after the line. Past
    /// a deadline a client that sent part of a head is answered 408.
    fn read_request(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>) -> Result<Option<Req>, Fail> {
        let window = self.cli_want;
        let started = Instant::now();
        // Parking: the first wait ends after the linger, not the window
        // (shorter while many sessions linger, `park::Lingering`).
        let linger = self.linger.filter(|l| *l < window);
        let (_lingering, linger) = linger.map(crate::park::Lingering::start).unzip();
        let mut clock = HeadClock {
            line_by: started + window,
            rest: self.svc.timeouts.get(Timeouts::STRING_SHORT),
            rest_by: None,
            window: linger.unwrap_or(window),
            rto: self.cli_rto,
        };
        loop {
            let read = read_head(&c.cli, cb, Some(&mut clock));
            self.cli_rto = clock.rto;
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
                    c.logged = false;
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::answer(Res::HTTP_HEAD_TOO_LARGE, 431));
                }
                Err(HeadRead::Timeout { partial: true }) => {
                    c.logged = false;
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::answer(Res::IDLE, 408));
                }
                Err(_) => {
                    c.logged = false;
                    set_text_from_raw(c, cb.data());
                    return Err(Fail::silent(Res::HTTP_NO_REQUEST_ERR));
                }
            };
            c.logged = false;
            match self.parse(c, &cb.data()[..end]) {
                Ok(Some(req)) => return Ok(Some(req)),
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
        c.text.clear();
        // One allocation for the line (a new client's text is empty; four
        // pushes would grow it three times).
        c.text.reserve(h.method.len() + h.uri.len() + 32);
        c.text.push_str(h.method);
        c.text.push(' ');
        if redirected_to.is_some() && h.uri.starts_with('/') {
            // As 3proxy logs a transparent request (and one inside an
            // intercepted tunnel): in absolute form.
            c.text.push_str("http://");
            if h.host.contains(':') {
                c.text.push('[');
                c.text.push_str(&h.host);
                c.text.push(']');
            } else {
                c.text.push_str(&h.host);
            }
            if h.port != 80 {
                c.text.push_str(&format!(":{}", h.port));
            }
        }
        if let Some(to) = redirected_to {
            // The destination's port, for the ACL and the connection.
            h.port = to.port();
        }
        // An ftp:// URL's password is not logged (as 3proxy's logurl).
        c.text.push_str(&ftp::hide_password(h.uri));
        c.text.push_str(if h.version == 0 {
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
            _ => http::op_of(h.method),
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

    /// Authorize the request and find its destination address. The kept
    /// origin connection is reused (and nothing resolved) when the request
    /// goes to the same host and port.
    fn authorize(&mut self, c: &mut Client, req: &Req) -> Result<SocketAddr, Fail> {
        let needuser = self.svc.opts.needuser.unwrap_or(1);
        if needuser > 1 && req.user.is_none() {
            // `-u2`: a user name is required before the ACL is asked.
            return Err(Fail::answer(Res::AUTH_NO_USER, 407));
        }
        let kept = self
            .origin
            .as_ref()
            .filter(|o| {
                !req.connect && o.port == req.port && o.host.eq_ignore_ascii_case(&self.host)
            })
            .map(|o| o.addr);
        let dst = match (req.redirected_to, kept, req.literal) {
            (Some(to), _, _) => Ok(to),
            (None, Some(a), _) => Ok(a),
            (None, None, Some(ip)) => Ok(SocketAddr::new(ip, req.port)),
            (None, None, None) => resolve(&self.host, req.port, self.svc.family),
        };
        // This request's destination before the grant: `log radius`
        // sends its Start from there, and a kept-alive connection's
        // previous request must not lend it its own.
        c.req_addr = dst.as_ref().ok().copied();
        self.ask_acl(c, req, c.req_addr)?;
        let dst = dst.map_err(|res| Fail::answer(res, 502))?;
        // The live registry shows the request's user and destination
        // while it is served.
        c.publish();
        if c.is_self(dst) {
            return Err(Fail::answer(Res::LOOP, 503));
        }
        Ok(dst)
    }

    /// Ask the access layer about the request; keep its grant (and, for a
    /// tunnel, what to check again after a reload).
    fn ask_acl(&mut self, c: &mut Client, req: &Req, dst: Option<SocketAddr>) -> Result<(), Fail> {
        let ask = Request {
            host: Some(&self.host),
            addr: dst.map(|a| a.ip()),
            port: req.port,
            user: req.user.as_deref(),
            password: req.password.as_deref(),
            ..c.request(req.op)
        };
        match access::authorize_at(&self.svc, &ask, self.weight) {
            Ok(grant) => {
                if grant.user.is_some() {
                    c.user.clone_from(&grant.user);
                }
                self.weight = grant.weight;
                if req.connect || req.upgrade {
                    self.recheck = Some(Box::new(
                        Recheck::new(&self.svc, &ask)
                            .since(c.generation)
                            .at_weight(grant.weight),
                    ));
                }
                c.acct_start(&grant);
                self.grant = Some(grant);
                Ok(())
            }
            Err(res) => {
                let needuser = self.svc.opts.needuser.unwrap_or(1);
                Err(Fail::answer(res, deny_status(res, needuser)))
            }
        }
    }

    /// Whether the kept connection `o` can carry this request: a direct
    /// one to the same host and port, when the request has no parents; one
    /// made through the same parents for the same client credentials, to
    /// the same destination, or to any with an `http` last hop.
    fn fits(&self, o: &Origin, req: &Req, dst: SocketAddr) -> bool {
        let same_dest = o.addr == dst && o.host.eq_ignore_ascii_case(&self.host);
        let parents = self.grant.as_ref().map(|g| &g.parents);
        match &o.via {
            None => same_dest && parents.is_none_or(|p| p.is_empty()),
            Some(v) => {
                parents.is_some_and(|p| Arc::ptr_eq(&v.parents, p))
                    && v.user == req.user
                    && v.password == req.password
                    && (v.http || same_dest)
            }
        }
    }

    /// A new connection for the request to `dst`: directly, or through the
    /// grant's parents (the kept one, if any, is left alone).
    fn dial(&mut self, c: &mut Client, req: &Req, dst: SocketAddr) -> Result<Origin, Fail> {
        self.dial_via(c, req, dst, false)
    }

    fn dial_via(
        &mut self,
        c: &mut Client,
        req: &Req,
        dst: SocketAddr,
        redirected: bool,
    ) -> Result<Origin, Fail> {
        let parents = self
            .grant
            .as_ref()
            .map(|g| g.parents.clone())
            .unwrap_or_default();
        let want = chain::Want {
            addr: Some(dst),
            host: req.literal.is_none().then_some(self.host.as_str()),
            user: req.user.as_deref(),
            password: req.password.as_deref(),
            client: c.client_addr,
            local: c.local_addr,
        };
        let chain = match chain::connect(&self.svc, &parents, &want) {
            Ok(chain::Route::Stream(chain)) => chain,
            Ok(chain::Route::Local {
                kind: parent::Kind::Http,
                hops,
                ..
            }) if !redirected => {
                // `parent http 0.0.0.0 0`: this handler serves the request
                // itself, with the ACL entries that redirect locally
                // skipped (3proxy's second pass).
                let o = {
                    let was = std::mem::replace(&mut c.redirected, true);
                    let o = self
                        .ask_acl(c, req, Some(dst))
                        .and_then(|()| self.dial_via(c, req, dst, true));
                    c.redirected = was;
                    o
                };
                // A tunnel the second pass hands over counts this hop too.
                let mut o = o.map_err(|mut f| {
                    if let Some((_, h)) = &mut f.handoff {
                        *h += hops;
                    }
                    f
                })?;
                o.hops += hops;
                c.hops = self.base_hops + o.hops;
                return Ok(o);
            }
            // Another type: only a tunnel can be handed to its handler
            // (as in 3proxy); `tunnel` does it.
            Ok(chain::Route::Local { kind, hops })
                if req.connect && kind != parent::Kind::Http && parent::takes_tcp(kind) =>
            {
                return Err(Fail {
                    res: Res::OK,
                    status: None,
                    handoff: Some((kind, hops)),
                })
            }
            Ok(chain::Route::Local { .. }) => return Err(Fail::answer(Res::NOTIMPL, 501)),
            Err(res) => return Err(parent_fail(res)),
        };
        let mut s = chain.stream;
        if !req.connect && self.inside.is_none() {
            // `ssl_cli`: the request goes to the origin over TLS (a
            // tunnel's handshake waits for `established`).
            self.tls_to_origin(c, &mut s, req, chain.http_parent)?;
        }
        let t = self.svc.timeouts.get(Timeouts::STRING_LONG);
        set_timeouts(&s, t, t).map_err(|_| Fail::answer(Res::SOCKET, 502))?;
        c.remote_addr = if parents.is_empty() {
            Some(dst)
        } else {
            s.peer_addr()
        };
        let ext = s.local_addr();
        c.ext_addr = ext;
        c.hops = self.base_hops + chain.hops;
        let via = (!parents.is_empty()).then(|| {
            Box::new(Via {
                parents,
                http: chain.http_parent,
                auth: chain
                    .credentials
                    .as_ref()
                    .filter(|_| chain.http_parent)
                    .map(|(u, p)| format!("Basic {}", http::basic_auth(u, p))),
                user: req.user.clone(),
                password: req.password.clone(),
            })
        });
        let mut o = Origin {
            s,
            host: self.host.clone(),
            port: dst.port(),
            addr: dst,
            ext,
            used: false,
            bound: false,
            via,
            hops: chain.hops,
        };
        if self.inside.is_some() {
            // Over TLS to the intercepted tunnel's destination.
            self.reach_inside(c, &mut o, req.port)?;
        }
        Ok(o)
    }

    /// `ssl_cli` with `ssl_client_mode` 0-2: TLS with the destination
    /// itself on `s` when it is due (see [`session::tls_to_dest`]). An
    /// `http` parent as the last hop fetches the request itself: there is
    /// no destination to reach over TLS through it, and the request is
    /// refused with 8011 rather than sent in clear.
    fn tls_to_origin(
        &mut self,
        c: &mut Client,
        s: &mut Stream,
        req: &Req,
        http_parent: bool,
    ) -> Result<(), Fail> {
        let at = session::DestAt::Reached;
        if session::dest_tls_due(&self.svc, at, req.connect).is_none() {
            return Ok(());
        }
        if http_parent {
            let why = "ssl_cli: the last parent is an http proxy, which reaches the \
                       destination itself (in clear)";
            let res = session::with_why(c, Res::TLS_PARENT, why.into());
            return Err(parent_fail(res));
        }
        let host = self.host_or_ip(req);
        session::tls_to_dest(c, s, &host, at, req.connect).map_err(parent_fail)
    }

    /// The destination's name as the client wrote it, or its address
    /// (unbracketed): what `ssl_cli` asks the server for.
    fn host_or_ip(&self, req: &Req) -> String {
        match req.literal {
            Some(ip) => ip.to_string(),
            None => self.host.clone(),
        }
    }

    /// An idle connection to `dst` for this host from the shared pool, or
    /// a new one.
    /// (Only direct connections are pooled.)
    fn connect(&mut self, c: &mut Client, req: &Req, dst: SocketAddr) -> Result<Origin, Fail> {
        let direct = self.grant.as_ref().is_none_or(|g| g.parents.is_empty());
        // A request that can be sent twice is sent on a pooled connection
        // without looking first (a peek costs a system call): if the
        // origin had closed it, the request goes again on a new one.
        let look = !(req.idempotent && req.framing == Framing::None);
        let tls = self.inside.is_some()
            || session::dest_tls_due(&self.svc, session::DestAt::Reached, false).is_some();
        match direct
            .then(|| unpark(&self.svc, dst, &self.host, tls, look))
            .flatten()
        {
            Some(o) => {
                c.remote_addr = Some(dst);
                c.ext_addr = o.ext;
                c.hops = self.base_hops;
                Ok(o)
            }
            None => self.dial(c, req, dst),
        }
    }

    /// `CONNECT host:port`: answer 200 and relay until both sides are done.
    #[inline(never)]
    fn tunnel(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>, req: &Req) -> Result<Next, Fail> {
        let head_len = cb.head_len;
        cb.consume(head_len);
        let dst = self.authorize(c, req)?;
        self.filter_request(c, req)?;
        if let Some(k) = self.origin.take() {
            park(&self.svc, k);
        }
        let o = match self.dial(c, req, dst) {
            Ok(o) => o,
            Err(Fail {
                handoff: Some((kind, hops)),
                ..
            }) => return self.hand_over(c, cb, req, dst, kind, hops),
            Err(f) => return Err(f),
        };
        let mut o = o;
        self.established(c, &mut o, req)?;
        if let Err(res) = session::tls_to_dest(
            c,
            &mut o.s,
            &self.host_or_ip(req),
            session::DestAt::Answered,
            true,
        ) {
            // The client was told the tunnel is open: it is closed.
            c.res = res;
            c.srv = Some(o.s);
            return Ok(Next::Close);
        }
        if let Err(res) = crate::session::intercept(c, &mut o.s, &self.host, cb.data()) {
            c.res = res;
            c.srv = Some(o.s);
            return Ok(Next::Close);
        }
        if self.svc.mitm.is_some() {
            let within = self.svc.timeouts.get(Timeouts::STRING_LONG);
            match inside::first_speaker(&c.cli, &o.s, within) {
                inside::First::Http => {
                    let inside = Inside {
                        host: self.host.clone(),
                        port: req.port,
                        addr: o.addr,
                        user: req.user.clone(),
                        password: req.password.clone(),
                    };
                    self.enter_inside(c, o, inside);
                    return Ok(Next::Inside);
                }
                inside::First::Quiet => {
                    let why = "ssl_mitm: nothing came in the tunnel".into();
                    c.res = session::with_why(c, Res::IDLE, why);
                    c.srv = Some(o.s);
                    return Ok(Next::Close);
                }
                inside::First::Other => {}
            }
        }
        self.tunnel_relay(c, cb, o.s)
    }

    /// The relay of a CONNECT tunnel, which parks when it goes quiet
    /// (`parklinger`, `session::relay_owned`); the request then ends when
    /// the session does, as `end_request` would end it.
    fn tunnel_relay(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        srv: Stream,
    ) -> Result<Next, Fail> {
        let linger = Some(self.svc.park_linger).filter(|d| !d.is_zero());
        if linger.is_none() {
            self.relay(c, cb, &srv)?;
            c.srv = Some(srv);
            return Ok(Next::Close);
        }
        let early = cb.data();
        if !early.is_empty() {
            write_all_v(&srv, early, &[]).map_err(|e| Fail::silent(srv_res(&e)))?;
            c.bytes_out += early.len() as u64;
            let n = early.len();
            cb.consume(n);
        }
        let grant = self.grant.as_ref();
        let opts = crate::relay::RelayOpts {
            // `auth radius`: the user's Session-Timeout.
            deadline: grant
                .and_then(|g| g.radius.as_ref())
                .and_then(|r| r.deadline),
            linger,
            ..crate::session::relay_opts(&self.svc, Timeouts::CONNECTION_LONG)
        };
        let finish = crate::session::Finish::Http {
            shaping: self.shaper().is_some(),
            shaped: self.shaped,
            nolog: grant.is_some_and(|g| g.nolog),
        };
        let limits = grant.and_then(|g| g.limits.clone());
        // With `force`, a reload whose ACL refuses the tunnel ends it.
        let again = self.recheck.as_deref().cloned();
        crate::session::relay_owned(c, srv, opts, limits, again, finish);
        Ok(Next::Tunneled)
    }

    /// A CONNECT whose chain is `parent TYPE 0.0.0.0 0`: say the tunnel
    /// is open, then the connection goes to the handler of `kind` with the
    /// destination asked for and what the client sent after its head.
    #[inline(never)]
    fn hand_over(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
        dst: SocketAddr,
        kind: parent::Kind,
        hops: u32,
    ) -> Result<Next, Fail> {
        const ESTABLISHED: &[u8] = b"HTTP/1.0 200 Connection established\r\n\r\n";
        send_lazy(&c.cli, ESTABLISHED, &[], &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(cli_res(&e)))?;
        let early = cb.data().to_vec();
        let n = early.len();
        cb.consume(n);
        let dest = parent::Known {
            name: req.literal.is_none().then(|| self.host.clone()),
            addr: dst,
        };
        c.hand_over(parent::Handoff {
            kind,
            hops,
            early,
            dest: Some(dest),
        })
        .map_err(Fail::silent)?;
        Ok(Next::HandedOver)
    }

    /// Tell the client its tunnel is open (after asking an `http` parent
    /// for it).
    #[inline(never)]
    fn established(&mut self, c: &mut Client, o: &mut Origin, req: &Req) -> Result<(), Fail> {
        // Bytes an `http` parent sent after its own answer: the tunnel's.
        let mut small = [0u8; SMALL];
        let mut sb = HeadBuf::new(&mut small);
        if o.via.as_ref().is_some_and(|v| v.http) {
            self.parent_connect(c, o, &mut sb, req.port)?;
        }
        // `ssl_cli` (modes 0, 1): TLS with the destination before the
        // answer, so that a failure is answered 502. The destination
        // speaks second in TLS: bytes already here are not TLS.
        let at = session::DestAt::Reached;
        if session::dest_tls_due(&self.svc, at, true).is_some() {
            if !sb.data().is_empty() {
                let why = "ssl_cli: the destination spoke before the TLS handshake";
                let res = session::with_why(c, Res::TLS_PARENT, why.into());
                return Err(parent_fail(res));
            }
            let host = self.host_or_ip(req);
            session::tls_to_dest(c, &mut o.s, &host, at, true).map_err(parent_fail)?;
        }
        // 3proxy's exact answer: some clients match on it.
        const ESTABLISHED: &[u8] = b"HTTP/1.0 200 Connection established\r\n\r\n";
        let early = sb.data();
        send_lazy(&c.cli, ESTABLISHED, early, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(cli_res(&e)))?;
        c.bytes_in += (ESTABLISHED.len() + early.len()) as u64;
        Ok(())
    }

    /// CONNECT through an `http` last hop: ask it for a tunnel (with its
    /// credentials), as a `connect` parent would be asked. Whatever follows
    /// its answer's head is left in `sb`.
    fn parent_connect(
        &mut self,
        c: &mut Client,
        o: &Origin,
        sb: &mut HeadBuf<'_>,
        port: u16,
    ) -> Result<(), Fail> {
        let auth = o
            .via
            .as_ref()
            .and_then(|v| v.auth.as_deref())
            .or(self.dest_auth.as_deref());
        self.abs_out.clear();
        self.abs_out.extend_from_slice(b"CONNECT ");
        http::put_authority(&mut self.abs_out, &self.host, port, 0);
        self.abs_out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        http::put_authority(&mut self.abs_out, &self.host, port, 0);
        self.abs_out.extend_from_slice(b"\r\n");
        if let Some(a) = auth {
            self.abs_out.extend_from_slice(b"Proxy-Authorization: ");
            self.abs_out.extend_from_slice(a.as_bytes());
            self.abs_out.extend_from_slice(b"\r\n");
        }
        self.abs_out.extend_from_slice(b"\r\n");
        write_all_v(&o.s, &self.abs_out, &[]).map_err(|_| parent_fail(Res::PARENT_CONNECT_SEND))?;
        c.bytes_out += self.abs_out.len() as u64;
        let h = read_response(&o.s, sb, true, &mut self.resp_out)
            .map_err(|_| parent_fail(Res::PARENT_CONNECT_REPLY))?;
        if !(200..300).contains(&h.status) {
            return Err(parent_fail(Res::PARENT_CONNECT_REFUSED));
        }
        sb.consume(h.len);
        Ok(())
    }

    /// Relay raw bytes both ways (a tunnel or an upgraded connection).
    /// Bytes the client sent after the head go to the server first.
    fn relay(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>, srv: &Stream) -> Result<(), Fail> {
        let early = cb.data();
        if !early.is_empty() {
            write_all_v(srv, early, &[]).map_err(|e| Fail::silent(srv_res(&e)))?;
            c.bytes_out += early.len() as u64;
            let n = early.len();
            cb.consume(n);
        }
        let opts = crate::relay::RelayOpts {
            // `auth radius`: the user's Session-Timeout.
            deadline: self
                .grant
                .as_ref()
                .and_then(|g| g.radius.as_ref())
                .and_then(|r| r.deadline),
            ..crate::session::relay_opts(&self.svc, Timeouts::CONNECTION_LONG)
        };
        // With `force`, a reload whose ACL refuses the tunnel ends it.
        let out = match &self.recheck {
            Some(again) => crate::session::relay_logged(c, srv, &opts, self.shaper(), again),
            None => {
                c.publish();
                let _attached = c.live.attach_server(srv);
                let hooks = crate::relay::Hooks {
                    limits: self.shaper(),
                    live: Some(c.live.bytes()),
                    ..Default::default()
                };
                crate::relay::relay_hooked(&c.cli, srv, &opts, hooks)
            }
        };
        if self.shaper().is_some() {
            self.shaped.0 += out.inb;
            self.shaped.1 += out.out;
        }
        c.res = out.res;
        c.bytes_out += out.out;
        c.bytes_in += out.inb;
        Ok(())
    }

    /// The service's filters, when it has some of type `kind`.
    fn filters(&self, kind: u8) -> Option<Arc<Filters>> {
        self.svc.filters.as_ref().filter(|f| f.has(kind)).cloned()
    }

    /// The `request` and `cliheader` filters, once the request is
    /// authorized (as in 3proxy). A rewrite of the request line changes
    /// what is logged; one of the head, what the origin gets.
    fn filter_request(&mut self, c: &mut Client, req: &Req) -> Result<(), Fail> {
        let Some(fs) = self.svc.filters.clone() else {
            return Ok(());
        };
        let deny = || Fail::answer(Res::FILTER_DENY, 503);
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(&fs, c, user.as_deref(), &host, req.port, req.op.bits());
        let mut text = None;
        if fs.has(filter::REQUEST) {
            let mut line = Vec::with_capacity(c.text.len() + 2);
            line.extend_from_slice(c.text.as_bytes());
            line.extend_from_slice(b"\r\n");
            if fs.check(filter::REQUEST, &q, &mut line) == Verdict::Deny {
                return Err(deny());
            }
            let l = line.strip_suffix(b"\r\n").unwrap_or(&line);
            text = Some(String::from_utf8_lossy(l).into_owned());
        }
        if fs.has(filter::CLIHEADER) {
            filt::head(&fs, filter::CLIHEADER, &q, &mut self.req_out, true, 1)
                .map_err(|()| deny())?;
        }
        if let Some(t) = text {
            c.text = t;
        }
        Ok(())
    }

    /// Forward a request to its origin and the response back.
    fn forward(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>, req: &Req) -> Result<Next, Fail> {
        let dst = self.authorize(c, req)?;
        self.filter_request(c, req)?;
        let head_len = cb.head_len;
        cb.consume(head_len);
        if let Some(path) = &req.ftp {
            return self.ftp(c, cb, req, dst, path);
        }
        // The body bytes that came with the head leave with it.
        let mut scanner = ChunkScanner::new();
        let (now, more_body) = match req.framing {
            Framing::None | Framing::Close => (0, false),
            Framing::Length(n) => {
                let now = (cb.data().len() as u64).min(n);
                (now as usize, now < n)
            }
            Framing::Chunked => {
                let now = scanner
                    .feed(cb.data())
                    .map_err(|()| Fail::answer(Res::HTTP_CHUNK_CLIENT, 400))?;
                (now, !scanner.done())
            }
        };
        let o = self.origin_for(c, req, dst)?;
        self.exchange(c, cb, req, o, dst, (now, more_body), scanner)
    }

    /// An ftp:// GET or PUT through the FTP gateway (`ftp`). Other
    /// methods, a GET with a body and a chunked PUT are not served (501,
    /// 411).
    #[inline(never)]
    fn ftp(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
        dst: SocketAddr,
        path: &str,
    ) -> Result<Next, Fail> {
        let upload = match (req.op, req.framing) {
            (access::Op::FtpGet, Framing::None) => None,
            (access::Op::FtpPut, Framing::None) => Some(0),
            (access::Op::FtpPut, Framing::Length(n)) => Some(n),
            (access::Op::FtpPut, Framing::Chunked) => return Err(Fail::answer(Res::NOTIMPL, 411)),
            _ => return Err(Fail::answer(Res::NOTIMPL, 501)),
        };
        let parents = self
            .grant
            .as_ref()
            .map(|g| g.parents.clone())
            .unwrap_or_default();
        let _ = set_write_timeout(&c.cli, &mut self.cli_wto, self.long);
        let (user, password) = match &req.ftp_login {
            Some((u, p)) => (Some(u.clone()), Some(p.clone())),
            None => (None, None),
        };
        let want = ftp::Want {
            dst,
            host: &self.host,
            path,
            user,
            password,
            parents: &parents,
            weight: self.weight,
            upload: upload.map(|n| (n, cb.data())),
        };
        match ftp::serve(c, &want, &self.svc.timeouts) {
            Ok(true) if req.keep_alive => Ok(Next::KeepAlive),
            Ok(_) => Ok(Next::Close),
            Err((res, status)) => Err(Fail {
                res,
                status,
                handoff: None,
            }),
        }
    }

    /// The connection to send the request on: the kept one if it fits, a
    /// pooled one, or a new one. (Not inlined, as the parts of `forward`:
    /// a client thread's stack is as deep as its deepest path, and each
    /// page it ever touched stays resident, so connecting and exchanging
    /// do not stack their frames on one another.)
    #[inline(never)]
    fn origin_for(&mut self, c: &mut Client, req: &Req, dst: SocketAddr) -> Result<Origin, Fail> {
        // Only a request that can be sent twice is retried; anything else
        // goes on a kept connection only if it still looks open.
        let retryable = req.idempotent && req.framing == Framing::None;
        let mut o = match self.origin.take() {
            Some(o) if self.fits(&o, req, dst) => {
                if retryable || still_open(&o) {
                    c.hops = self.base_hops + o.hops;
                    o
                } else {
                    self.connect(c, req, dst)?
                }
            }
            Some(o) => {
                park(&self.svc, o);
                self.connect(c, req, dst)?
            }
            None => self.connect(c, req, dst)?,
        };
        o.bound |= req.conn_auth;
        Ok(o)
    }

    /// Send the request (head, body) on `o` and relay the response.
    /// `body`: the body bytes at the front of `cb` that belong to this
    /// request, and whether more is to come.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
        mut o: Origin,
        dst: SocketAddr,
        body: (usize, bool),
        mut scanner: ChunkScanner,
    ) -> Result<Next, Fail> {
        let (mut now, mut more_body) = body;
        // A body for `clidata` filters, read whole (when it has a length
        // up to `filtermaxsize`, as in 3proxy).
        let mut filtered: Option<Vec<u8>> = None;
        if let (Some(fs), Framing::Length(n)) = (self.filters(filter::CLIDATA), req.framing) {
            if n > 0 && n <= self.svc.filtermaxsize as u64 {
                filtered = Some(self.client_body(c, cb, req, &fs, n, now)?);
                (now, more_body) = (0, false);
            }
        }
        // A chunked body for them is decoded and streamed after the head,
        // from its first byte.
        let mut chunked_first: Option<Vec<u8>> = None;
        if req.framing == Framing::Chunked
            && self.svc.filtermaxsize > 0
            && self.filters(filter::CLIDATA).is_some()
        {
            chunked_first = Some(cb.data()[..now].to_vec());
            cb.consume(now);
            (now, more_body) = (0, true);
        }
        let retryable = req.idempotent && req.framing == Framing::None;
        let mut small = [0u8; SMALL];
        let mut sb = HeadBuf::new(&mut small);
        let mut early = None;
        let mut interim = 0;
        let (reused, head_len) = loop {
            let reused = std::mem::replace(&mut o.used, true);
            let head = self.head_for(&o, req.port);
            let head_len = head.len() + filtered.as_ref().map_or(0, Vec::len);
            let body = filtered.as_deref().unwrap_or(&cb.data()[..now]);
            match write_all_v(&o.s, head, body) {
                Ok(()) => break (reused, head_len),
                // A kept connection the origin closed meanwhile: once more
                // on a new one.
                Err(_) if reused && retryable => o = self.dial(c, req, dst)?,
                Err(e) => return Err(Fail::answer(srv_res(&e), 502)),
            }
        };
        c.bytes_out += (head_len + now) as u64;
        cb.consume(now);
        if more_body && req.expect_continue && readable_within(&o.s, CONTINUE_WAIT) {
            // The origin answered the Expect: 100 (send the body) or a
            // final status (it does not want the body).
            let h = read_response(&o.s, &mut sb, req.head_method, &mut self.resp_out)
                .map_err(|e| e.fail())?;
            if h.is_interim() {
                set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
                    .map_err(|e| Fail::silent(send_res(&e)))?;
                send_interim(
                    &mut self.resp_out,
                    c,
                    &mut sb,
                    &h,
                    req.version,
                    &mut interim,
                )?;
            } else {
                early = Some(h);
            }
        }
        let mut body_done = !more_body;
        if early.is_none() && more_body {
            // The body is read from the client with its timeout, and the
            // head acknowledged at once (a client may hold the body until
            // then: `Stream::ack_now`).
            c.cli.ack_now();
            if self.cli_rto != Some(self.cli_want) {
                set_read_timeout(&c.cli, self.cli_want).map_err(|e| Fail::silent(cli_res(&e)))?;
                self.cli_rto = Some(self.cli_want);
            }
            let lim = self.shaper();
            let splice = self.svc.splice();
            let sent = match (req.framing, &chunked_first) {
                (Framing::Length(n), _) => {
                    copy_exact(&c.cli, &o.s, n - now as u64, Side::Client, lim, splice)
                }
                (_, Some(first)) => {
                    let fs = self.filters(filter::CLIDATA).unwrap_or_default();
                    let host = acl::normalize_host(&self.host);
                    let q = filt::query(&fs, c, c.user.as_deref(), &host, req.port, req.op.bits());
                    let r = filt::stream_chunked(
                        &fs,
                        filter::CLIDATA,
                        &q,
                        self.svc.filtermaxsize,
                        &c.cli,
                        Side::Client,
                        &o.s,
                        b"",
                        first,
                        lim,
                        |b| cb.put_back(b),
                    );
                    match r {
                        Ok(n) => Ok(n),
                        Err(filt::StreamErr::Io(s, e)) => Err((s, e)),
                        Err(filt::StreamErr::Denied { .. }) => {
                            return Err(Fail::answer(Res::FILTER_DENY, 503))
                        }
                    }
                }
                _ => copy_chunked(&c.cli, &o.s, Side::Client, &mut scanner, lim, |b| {
                    cb.put_back(b)
                }),
            };
            match sent {
                Ok(n) => {
                    c.bytes_out += n;
                    if lim.is_some() {
                        self.shaped.1 += n;
                    }
                }
                // The server has the head already: close, without an
                // answer the client could take for the server's.
                Err((Side::Client, e)) if is_bad_chunk(&e) => {
                    return Err(Fail::silent(Res::HTTP_CHUNK_CLIENT))
                }
                Err((Side::Client, e)) => return Err(Fail::silent(cli_res(&e))),
                Err((Side::Server, e)) => return Err(Fail::answer(srv_res(&e), 502)),
            }
            body_done = true;
        }
        let mut may_retry = reused && retryable;
        let h = match early {
            Some(h) => h,
            None => loop {
                match read_response(&o.s, &mut sb, req.head_method, &mut self.resp_out) {
                    Ok(h) if h.is_interim() => {
                        set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
                            .map_err(|e| Fail::silent(send_res(&e)))?;
                        send_interim(
                            &mut self.resp_out,
                            c,
                            &mut sb,
                            &h,
                            req.version,
                            &mut interim,
                        )?
                    }
                    Ok(h) => break h,
                    Err(e) if may_retry && e.nothing_read() => {
                        // The kept connection was closed by the origin
                        // before it read this request: once more on a new
                        // one.
                        may_retry = false;
                        o = self.dial(c, req, dst)?;
                        o.used = true;
                        let head = self.head_for(&o, req.port);
                        write_all_v(&o.s, head, &[]).map_err(|e| Fail::answer(srv_res(&e), 502))?;
                        c.bytes_out += head.len() as u64;
                    }
                    Err(e) => return Err(e.fail()),
                }
            },
        };
        self.respond(c, cb, &mut sb, req, o, h, body_done)
    }

    /// The head to send on `o`: the rewritten request, or for an `http`
    /// parent the same in absolute form, with the parent's credentials.
    fn head_for(&mut self, o: &Origin, port: u16) -> &[u8] {
        match &o.via {
            Some(v) if v.http => {
                http::absolute_form(
                    &self.req_out,
                    &self.host,
                    port,
                    v.auth.as_deref().or(self.dest_auth.as_deref()),
                    &mut self.abs_out,
                );
                &self.abs_out
            }
            _ => match &self.dest_auth {
                Some(a) => {
                    http::with_field(
                        &self.req_out,
                        b"Authorization",
                        a.as_bytes(),
                        &mut self.abs_out,
                    );
                    &self.abs_out
                }
                None => &self.req_out,
            },
        }
    }

    /// Send the final response head and body to the client; keep the
    /// origin connection if the exchange ended cleanly.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        o: Origin,
        h: ResponseHead,
        body_done: bool,
    ) -> Result<Next, Fail> {
        sb.consume(h.len);
        if let Some(fs) = self.filters(filter::SRVHEADER) {
            let host = acl::normalize_host(&self.host);
            let user = c.user.clone();
            let q = filt::query(&fs, c, user.as_deref(), &host, req.port, req.op.bits());
            filt::head(&fs, filter::SRVHEADER, &q, &mut self.resp_out, false, 2)
                .map_err(|()| Fail::answer(Res::FILTER_DENY, 503))?;
        }
        if h.status == 101 {
            if !req.upgrade {
                return Err(Fail::answer(Res::HTTP_BAD_REPLY, 502));
            }
            http::end_response_head(&mut self.resp_out, req.version, true, true);
            let n = sb.data().len();
            send_lazy(
                &c.cli,
                &self.resp_out,
                sb.data(),
                &mut self.cli_wto,
                self.long,
            )
            .map_err(|e| Fail::silent(send_res(&e)))?;
            c.bytes_in += (self.resp_out.len() + n) as u64;
            sb.consume(n);
            self.relay(c, cb, &o.s)?;
            c.srv = Some(o.s);
            return Ok(Next::Close);
        }
        let client_keep = req.keep_alive && body_done && h.framing != Framing::Close;
        http::end_response_head(&mut self.resp_out, req.version, client_keep, false);
        if let Some(fs) = self.filters(filter::SRVDATA) {
            let max = self.svc.filtermaxsize;
            match h.framing {
                Framing::Length(n) if n > 0 && n <= max as u64 => {
                    return self.respond_filtered(c, sb, req, o, &h, &fs, body_done, client_keep);
                }
                Framing::Close | Framing::Chunked if max > 0 => {
                    return self.respond_streamed(c, sb, req, o, &h, &fs, body_done, client_keep)
                }
                _ => {}
            }
        }
        let mut scanner = ChunkScanner::new();
        let avail = sb.data();
        let (now, done) = match h.framing {
            Framing::None => (0, true),
            Framing::Length(n) => {
                let now = (avail.len() as u64).min(n);
                (now as usize, now == n)
            }
            Framing::Chunked => {
                let now = scanner
                    .feed(avail)
                    .map_err(|()| Fail::answer(Res::HTTP_CHUNK_SERVER, 502))?;
                (now, scanner.done())
            }
            Framing::Close => (avail.len(), false),
        };
        send_lazy(
            &c.cli,
            &self.resp_out,
            &avail[..now],
            &mut self.cli_wto,
            self.long,
        )
        .map_err(|e| Fail::silent(send_res(&e)))?;
        c.bytes_in += (self.resp_out.len() + now) as u64;
        sb.consume(now);
        let mut clean = sb.data().is_empty();
        if !done {
            // The rest is written to the client with its timeout; what
            // came is acknowledged at once (`Stream::ack_now`).
            o.s.ack_now();
            set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
                .map_err(|e| Fail::silent(send_res(&e)))?;
            let lim = self.shaper();
            let splice = self.svc.splice();
            let moved = match h.framing {
                Framing::Length(n) => {
                    copy_exact(&o.s, &c.cli, n - now as u64, Side::Server, lim, splice)
                }
                Framing::Chunked => {
                    copy_chunked(&o.s, &c.cli, Side::Server, &mut scanner, lim, |_| {
                        clean = false
                    })
                }
                _ => copy_to_eof(&o.s, &c.cli, lim, splice),
            };
            match moved {
                Ok(n) => {
                    c.bytes_in += n;
                    if lim.is_some() {
                        self.shaped.0 += n;
                    }
                }
                Err((Side::Client, e)) => return Err(Fail::silent(send_res(&e))),
                Err((Side::Server, e)) if is_bad_chunk(&e) => {
                    return Err(Fail::silent(Res::HTTP_CHUNK_SERVER))
                }
                Err((Side::Server, e)) => return Err(Fail::silent(srv_res(&e))),
            }
        }
        Ok(self.done_response(c, o, body_done && h.keep_alive && clean, client_keep))
    }

    /// Read the request body of length `n` whole (`now` bytes of it are
    /// in `cb`) and run the `clidata` filters on it; the forwarded head
    /// gets the new length.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn client_body(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
        fs: &Filters,
        n: u64,
        now: usize,
    ) -> Result<Vec<u8>, Fail> {
        let mut b = cb.data()[..now].to_vec();
        cb.consume(now);
        if (now as u64) < n {
            c.cli.ack_now();
        }
        if self.cli_rto != Some(self.cli_want) {
            set_read_timeout(&c.cli, self.cli_want).map_err(|e| Fail::silent(cli_res(&e)))?;
            self.cli_rto = Some(self.cli_want);
        }
        filt::read_rest(&c.cli, n - now as u64, Side::Client, self.shaper(), &mut b)
            .map_err(|(_, e)| Fail::silent(cli_res(&e)))?;
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(fs, c, user.as_deref(), &host, req.port, req.op.bits());
        if fs.check(filter::CLIDATA, &q, &mut b) == Verdict::Deny {
            return Err(Fail::answer(Res::FILTER_DENY, 503));
        }
        if b.len() as u64 != n {
            filt::set_length(&mut self.req_out, b.len());
        }
        Ok(b)
    }

    /// A response body of a length up to `filtermaxsize`: read whole, run
    /// the `srvdata` filters, send with its new length (as 3proxy does).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn respond_filtered(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        o: Origin,
        h: &ResponseHead,
        fs: &Filters,
        body_done: bool,
        client_keep: bool,
    ) -> Result<Next, Fail> {
        let Framing::Length(n) = h.framing else {
            return Err(Fail::answer(Res::HTTP_BAD_REPLY, 502));
        };
        let now = (sb.data().len() as u64).min(n) as usize;
        let mut body = sb.data()[..now].to_vec();
        sb.consume(now);
        let clean = sb.data().is_empty();
        if (now as u64) < n {
            o.s.ack_now();
        }
        filt::read_rest(&o.s, n - now as u64, Side::Server, self.shaper(), &mut body)
            .map_err(|(_, e)| Fail::answer(srv_res(&e), 502))?;
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(fs, c, user.as_deref(), &host, req.port, req.op.bits());
        if fs.check(filter::SRVDATA, &q, &mut body) == Verdict::Deny {
            return Err(Fail::answer(Res::FILTER_DENY, 503));
        }
        if body.len() as u64 != n {
            filt::set_length(&mut self.resp_out, body.len());
        }
        set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(send_res(&e)))?;
        write_all_v(&c.cli, &self.resp_out, &body).map_err(|e| Fail::silent(send_res(&e)))?;
        c.bytes_in += (self.resp_out.len() + body.len()) as u64;
        Ok(self.done_response(c, o, body_done && h.keep_alive && clean, client_keep))
    }

    /// A response body that ends when the origin closes, or chunked:
    /// streamed through the `srvdata` filters, `filtermaxsize` bytes at a
    /// time (a chunked one decoded, and sent in new chunks).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn respond_streamed(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        o: Origin,
        h: &ResponseHead,
        fs: &Filters,
        body_done: bool,
        client_keep: bool,
    ) -> Result<Next, Fail> {
        let first = sb.data().to_vec();
        sb.consume(first.len());
        o.s.ack_now();
        set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(send_res(&e)))?;
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(fs, c, user.as_deref(), &host, req.port, req.op.bits());
        let mut clean = true;
        let r = if h.framing == Framing::Chunked {
            filt::stream_chunked(
                fs,
                filter::SRVDATA,
                &q,
                self.svc.filtermaxsize,
                &o.s,
                Side::Server,
                &c.cli,
                &self.resp_out,
                &first,
                self.shaper(),
                |_| clean = false,
            )
        } else {
            filt::stream_to_eof(
                fs,
                filter::SRVDATA,
                &q,
                self.svc.filtermaxsize,
                &o.s,
                &c.cli,
                &self.resp_out,
                &first,
                self.shaper(),
            )
        };
        match r {
            Ok(n) => c.bytes_in += n,
            Err(filt::StreamErr::Io(Side::Server, e)) if is_bad_chunk(&e) => {
                return Err(Fail::silent(Res::HTTP_CHUNK_SERVER))
            }
            Err(filt::StreamErr::Denied { head_sent: false }) => {
                return Err(Fail::answer(Res::FILTER_DENY, 503))
            }
            Err(filt::StreamErr::Denied { head_sent: true }) => {
                return Err(Fail::silent(Res::FILTER))
            }
            Err(filt::StreamErr::Io(Side::Client, e)) => return Err(Fail::silent(send_res(&e))),
            Err(filt::StreamErr::Io(Side::Server, e)) => return Err(Fail::silent(srv_res(&e))),
        }
        // Only a chunked body ends where the next response can begin.
        let chunked = h.framing == Framing::Chunked;
        let reuse = chunked && body_done && h.keep_alive && clean;
        Ok(self.done_response(c, o, reuse, client_keep && chunked))
    }

    /// A response went out whole: keep the origin connection when the
    /// exchange ended cleanly and the origin allows it (`reuse`), and say
    /// whether the client's connection goes on.
    fn done_response(&mut self, c: &mut Client, o: Origin, reuse: bool, client_keep: bool) -> Next {
        if reuse {
            self.origin = Some(o);
        }
        c.res = Res::OK;
        if client_keep {
            Next::KeepAlive
        } else {
            Next::Close
        }
    }

    /// Answer an error (when nothing was answered yet), log the request,
    /// and close the connection gracefully.
    fn finish_error(&mut self, c: &mut Client, f: Fail) {
        c.res = f.res;
        self.origin = None;
        if let Some(status) = f.status {
            let _ = set_write_timeout(&c.cli, &mut self.cli_wto, self.long);
            c.bytes_in += send_error(&c.cli, status, f.res) as u64;
        }
        c.log_record();
        if f.status.is_some() {
            linger(&c.cli, self.svc.timeouts.get(Timeouts::LINGER));
        }
    }
}

impl Drop for Session {
    /// The client left: its kept origin connection can serve others.
    fn drop(&mut self) {
        if let Some(o) = self.origin.take() {
            park(&self.svc, o);
        }
    }
}

/// Pass a 1xx (other than 101) on to the client.
fn send_interim(
    out: &mut Vec<u8>,
    c: &mut Client,
    sb: &mut HeadBuf<'_>,
    h: &ResponseHead,
    version: u8,
    count: &mut u32,
) -> Result<(), Fail> {
    *count += 1;
    if *count > MAX_INTERIM {
        // An origin that never gets to its final answer would hold the
        // client (and this thread) for as long as it likes.
        return Err(Fail::answer(Res::HTTP_BAD_REPLY, 502));
    }
    sb.consume(h.len);
    if version == 0 {
        // HTTP/1.0 clients do not expect interim answers.
        return Ok(());
    }
    http::end_response_head(out, version, true, true);
    write_all_v(&c.cli, out, &[]).map_err(|e| Fail::silent(send_res(&e)))?;
    c.bytes_in += out.len() as u64;
    Ok(())
}

/// The status for an access-control refusal (3proxy's mapping).
fn deny_status(res: Res, needuser: u32) -> u16 {
    match res {
        Res::QUOTA => 503,
        // Credentials missing or wrong (not a `deny`): ask for them.
        r if r.is_auth() && r != Res::ACL_DENY && needuser > 0 => 407,
        _ => 403,
    }
}

/// The answer when the destination could not be reached (through the
/// parents): 3proxy's codes 30-79 are a parent's failure.
fn parent_fail(res: Res) -> Fail {
    let status = match res {
        // A `*` parent needs the client's credentials.
        r if r.is_auth() => 407,
        Res::NOTIMPL => 501,
        _ => 502,
    };
    Fail::answer(res, status)
}

/// Write an error answer (for the failure `res`); the byte count sent.
fn send_error(cli: &Stream, status: u16, res: Res) -> usize {
    let (reason, why) = match status {
        502 if res.is_parent() => ("Bad Gateway", "Failed to connect parent proxy."),
        400 => (
            "Bad Request",
            "The proxy could not understand this request.",
        ),
        403 => (
            "Forbidden",
            "The proxy's access rules do not allow this request.",
        ),
        407 => (
            "Proxy Authentication Required",
            "This proxy needs a valid user name and password.",
        ),
        401 => (
            "Unauthorized",
            "The FTP server refused the login: give a user name and password.",
        ),
        404 => ("Not Found", "The FTP server has no such file."),
        409 => (
            "Conflict",
            "The FTP path is a directory: a file cannot be stored there.",
        ),
        411 => (
            "Length Required",
            "An upload through the FTP gateway needs a Content-Length.",
        ),
        431 => (
            "Request Header Fields Too Large",
            "The request head is larger than the proxy accepts.",
        ),
        501 => (
            "Not Implemented",
            "The proxy does not support this request.",
        ),
        503 if res == Res::FILTER_DENY => (
            "Service Unavailable",
            "This request violates the proxy's filtering policy.",
        ),
        503 => (
            "Service Unavailable",
            "The proxy cannot serve this request now (a limit, or a loop).",
        ),
        504 => ("Gateway Timeout", "The server did not answer in time."),
        408 => (
            "Request Timeout",
            "The request head did not arrive in time.",
        ),
        _ => (
            "Bad Gateway",
            "The proxy could not reach the server, or the server's answer was broken.",
        ),
    };
    let body = format!(
        "<html><head><title>{status} {reason}</title></head>\r\n<body><h2>{status} {reason}</h2><p>{why}</p></body></html>\r\n"
    );
    let auth = match status {
        407 => "Proxy-Authenticate: Basic realm=\"proxy\"\r\n",
        401 => "WWW-Authenticate: Basic realm=\"FTP Server\"\r\n",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\n{auth}Connection: close\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    match write_all_v(cli, head.as_bytes(), body.as_bytes()) {
        Ok(()) => head.len() + body.len(),
        Err(_) => 0,
    }
}

/// After an error answer: stop sending, then read and drop what the client
/// still sends for a moment, so closing does not reset the connection and
/// destroy the answer before the client read it.
fn linger(cli: &Stream, max: Duration) {
    let _ = cli.shutdown(Shutdown::Write);
    let wait = max.clamp(Duration::from_millis(100), Duration::from_secs(2));
    let _ = set_read_timeout(cli, wait);
    let mut sink = [0u8; 1024];
    let mut total = 0;
    let mut r = cli;
    while total < 256 * 1024 {
        match r.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

/// The fields every forwarded request of this client gets: by default
/// `Forwarded`, with `-a1`/`-a2` `Via` and `X-Forwarded-For`, with `-a`
/// none (3proxy's `anonymous`).
fn forwarding_fields(svc: &Service, c: &Client) -> Vec<u8> {
    use std::io::Write as _;
    let host = hostname();
    let port = svc.port();
    // One allocation per client: written in place, no intermediate strings.
    let mut v = Vec::with_capacity(64 + host.len());
    let _ = match (svc.opts.anonymous, c.client_addr) {
        (Some(0), _) => Ok(()),
        (Some(2), Some(a)) => write!(
            v,
            "Via: 1.1 {host}:{port} (3proxy)\r\nX-Forwarded-For: {}\r\n",
            a.ip()
        ),
        // Made up once per connection: a parked client keeps these
        // (`remade_alike` names the arms that cannot be made again).
        (Some(_), _) => write!(
            v,
            "Via: 1.1 {host}:{port} (3proxy)\r\nX-Forwarded-For: {}\r\n",
            random_ipv4(c)
        ),
        (None, Some(SocketAddr::V4(a))) => {
            put_forwarded_v4(&mut v, a, host, port);
            Ok(())
        }
        (None, Some(SocketAddr::V6(a))) => write!(
            v,
            "Forwarded: for=\"[{}]:{}\";by=\"{host}:{port}\"\r\n",
            a.ip(),
            a.port()
        ),
        (None, None) => write!(v, "Forwarded: by=\"{host}:{port}\"\r\n"),
    };
    v
}

/// [`forwarding_fields`] gives the same fields again for `c`: all but a
/// made-up address (`-a1`, or `-a2` without a client address), which is
/// the connection's own.
fn remade_alike(svc: &Service, c: &Client) -> bool {
    match svc.opts.anonymous {
        None | Some(0) => true,
        Some(2) => c.client_addr.is_some(),
        Some(_) => false,
    }
}

/// `Forwarded: for="A:P";by="HOST:PORT"` for an IPv4 client, written by
/// hand: `write!` costs ~1,900 instructions here, for every new client.
fn put_forwarded_v4(v: &mut Vec<u8>, a: std::net::SocketAddrV4, host: &str, port: u16) {
    v.extend_from_slice(b"Forwarded: for=\"");
    for (i, o) in a.ip().octets().iter().enumerate() {
        if i > 0 {
            v.push(b'.');
        }
        put_decimal(v, u16::from(*o));
    }
    v.push(b':');
    put_decimal(v, a.port());
    v.extend_from_slice(b"\";by=\"");
    v.extend_from_slice(host.as_bytes());
    v.push(b':');
    put_decimal(v, port);
    v.extend_from_slice(b"\"\r\n");
}

/// `n` in decimal.
fn put_decimal(v: &mut Vec<u8>, n: u16) {
    let mut digits = [0u8; 5];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    v.extend_from_slice(&digits[i..]);
}

fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| {
                h.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            })
            .unwrap_or_else(|| "localhost".into())
    })
}

/// `-a1`: a made-up client address, different per connection.
fn random_ipv4(c: &Client) -> std::net::Ipv4Addr {
    let t = c
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let p = c.client_addr.map_or(7, |a| u64::from(a.port()));
    let mut x = t ^ (p << 32) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let b = (x as u32).to_be_bytes();
    // Keep clear of 0.x and 127.x.
    std::net::Ipv4Addr::new(b[0].clamp(1, 126), b[1], b[2], b[3].max(1))
}

/// The first line of what a client sent, for the log of a bad request.
fn set_text_from_raw(c: &mut Client, data: &[u8]) {
    let line = data.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = &line[..line.len().min(256)];
    c.text.clear();
    c.text.extend(line.iter().map(|&b| {
        if b.is_ascii_graphic() || b == b' ' {
            b as char
        } else {
            '.'
        }
    }));
}

/// The code of an IO error on a body's socket: a used-up quota, a
/// timeout, or `other` (the side's error code).
fn io_res(e: &io::Error, other: Res) -> Res {
    if is_quota(e) {
        Res::QUOTA
    } else if crate::net::is_timeout(e) {
        Res::IDLE
    } else {
        other
    }
}

fn cli_res(e: &io::Error) -> Res {
    io_res(e, Res::CLIENT_ERR)
}

fn srv_res(e: &io::Error) -> Res {
    io_res(e, Res::SERVER_ERR)
}

/// Sending to the client failed: 521, or 92 on a timeout.
fn send_res(e: &io::Error) -> Res {
    if crate::net::is_timeout(e) {
        Res::IDLE
    } else {
        Res::HTTP_SEND_CLIENT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_v4_is_what_write_gave() {
        use std::io::Write as _;
        for (ip, p, port) in [
            ([127, 0, 0, 1], 80u16, 3128u16),
            ([0, 0, 0, 0], 1, 1),
            ([255, 255, 255, 255], 65535, 65535),
            ([10, 20, 100, 9], 40000, 8080),
        ] {
            let a = std::net::SocketAddrV4::new(ip.into(), p);
            let mut want = Vec::new();
            write!(want, "Forwarded: for=\"{a}\";by=\"box.lan:{port}\"\r\n").unwrap();
            let mut got = Vec::new();
            put_forwarded_v4(&mut got, a, "box.lan", port);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }
}
