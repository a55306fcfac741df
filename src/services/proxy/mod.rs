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
//! - this file: `serve` and the request loop (`requests`, one request's
//!   course: read it, tunnel or forward it, end it);
//! - `session`: what the parts share: `Session`, `Req`, `Next`, `Fail`,
//!   `Inside` (no part imports from this file, which imports them all);
//! - `parked`: a kept-alive client parked between requests (`parklinger`);
//! - `request`: reading a request head and parsing it;
//! - `dial`: authorizing a request, and finding or dialing its origin;
//! - `tunnel`: `CONNECT` (the tunnel, a hand-over, the relay);
//! - `exchange`: forwarding a request (its head, body, interim answers);
//! - `respond`: the response back to the client, and a failed request's end;
//! - `answer`: the error answers, and the result codes of IO errors;
//! - `fields`: the forwarding fields (`Forwarded`, `Via`, ...);
//! - `inside`: `ssl_mitm`, the requests inside an intercepted tunnel;
//! - `head`: head buffers and reading a head within its deadlines;
//! - `body`: copying a body by its framing, under the session's limits;
//! - `filt`: the `pcre` filters on requests, responses and bodies;
//! - `ftp`: the ftp:// gateway;
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
//! Invariants: one log record per request (`Client::end_record`); the
//! proxy and the origin always agree where a request ends (ambiguous
//! framing is refused by `http`); an error answer is sent only before any
//! byte of the response went to the client, and always closes the
//! connection.

mod answer;
mod body;
mod dial;
mod exchange;
mod fields;
mod filt;
mod ftp;
mod head;
mod inside;
mod parked;
mod pool;
mod request;
mod respond;
mod session;
mod sock;
mod tunnel;

pub use inside::serve_inside;
pub use session::Inside;

use std::sync::Arc;

use crate::client::Client;
use crate::filter::Filters;
use crate::limit::SessionLimits;
use crate::parent::{self};
use crate::res::Res;
use crate::timeouts::Timeouts;

use head::{HeadBuf, SMALL_REQUEST};
use parked::ParkedHttp;
use pool::park;
use session::{Next, Session};

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
                if c.record.is_closed() {
                    // The last request's line is in its record; the next
                    // request writes its own (an idle client's memory).
                    c.record.text = String::new();
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

impl Session {
    /// [`requests`] on this session: the parts that feed the loop
    /// (`inside`, `parked`) call it as a method, so that no part imports
    /// from this file (`tests/layers.rs`: no import cycles).
    fn serve_loop(self: Box<Self>, c: &mut Client, early: &[u8], first: bool, may_park: bool) {
        requests(c, self, early, first, may_park);
    }

    /// Read and serve one request. False when the connection is done.
    fn one_request(&mut self, c: &mut Client, cb: &mut HeadBuf<'_>, first: bool) -> bool {
        let req = match self.read_request(c, cb) {
            Ok(Some(r)) => r,
            Ok(None) => {
                if first {
                    // Closed or timed out before a request: 3proxy's 508/507.
                    c.record.res = Res::HTTP_NO_REQUEST;
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
    fn shaper(&self) -> Option<&SessionLimits> {
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
                c.record.bytes_in.saturating_sub(self.shaped.0),
                c.record.bytes_out.saturating_sub(self.shaped.1),
            );
        }
        c.end_record();
    }

    /// The service's filters, when it has some of type `kind`.
    fn filters(&self, kind: u8) -> Option<Arc<Filters>> {
        self.svc.filters.as_ref().filter(|f| f.has(kind)).cloned()
    }
}
