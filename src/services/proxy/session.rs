//! The HTTP proxy's session types: what one client connection keeps
//! between its requests (`Session`), what a request carries through the
//! exchange (`Req`), how it ends (`Next`) and how it fails (`Fail`), and
//! where the requests of an intercepted tunnel go (`Inside`). Every part
//! of the proxy works on these; this file imports none of them, and none
//! imports the request loop in mod.rs, which calls them all.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access::{self, Grant, Recheck};
use crate::client::Client;
use crate::parent;
use crate::proto::http::Framing;
use crate::res::Res;
use crate::service::Service;
use crate::timeouts::Timeouts;

use super::fields::forwarding_fields;
use super::head::{HeadRead, RespErr};
use super::pool::{park, Origin};

/// What one client connection keeps between its requests.
pub(super) struct Session {
    pub(super) svc: Arc<Service>,
    /// The forwarded request head being sent.
    pub(super) req_out: Vec<u8>,
    /// The response head being sent.
    pub(super) resp_out: Vec<u8>,
    /// Fields added to every forwarded request (`Forwarded`, `Via`, ...).
    pub(super) extra: Vec<u8>,
    /// The kept origin connection.
    pub(super) origin: Option<Origin>,
    /// `transparent`: where the redirected client meant to go.
    pub(super) redirected_to: Option<SocketAddr>,
    /// The current request's destination host.
    pub(super) host: String,
    /// `host` read as an IP literal (kept with it: a kept-alive client's
    /// requests name one host, which is then parsed once).
    pub(super) host_ip: Option<IpAddr>,
    /// What the access layer granted the current request (its limits are
    /// held until the request ends).
    pub(super) grant: Option<Grant>,
    /// Bytes of the current request the limiter counted already (in, out).
    pub(super) shaped: (u64, u64),
    /// `force`: what a tunnel (CONNECT, Upgrade) was authorized for, to
    /// check again after a reload.
    /// Boxed: only tunnels have one, and a kept-alive client's session
    /// waits with it between requests (issue 19).
    pub(super) recheck: Option<Box<Recheck>>,
    /// The connection's ACL weight: each request's check starts from the
    /// one before it (3proxy's `param->weight`).
    pub(super) weight: u32,
    /// The request head in absolute form, for an `http` parent.
    pub(super) abs_out: Vec<u8>,
    /// `Basic ...` for the current request's destination, from credentials
    /// in its URL: `Authorization` for the origin, `Proxy-Authorization`
    /// for an `http` parent that has none of its own.
    pub(super) dest_auth: Option<String>,
    /// Hops a SOCKS local redirection took before this handler (`%h`).
    pub(super) base_hops: u32,
    /// The client socket's timeouts are set lazily: a read or a write
    /// that can proceed at once needs none, which saves a connection that
    /// makes one request both setsockopt() calls. `cli_rto` is the read
    /// timeout set (None: not yet), `cli_want` the one the next read of a
    /// request head must have (STRING_LONG first, then STRING_SHORT),
    /// `cli_wto` whether the write timeout (STRING_LONG) is set.
    pub(super) cli_rto: Option<Duration>,
    pub(super) cli_want: Duration,
    pub(super) cli_wto: bool,
    /// STRING_LONG.
    pub(super) long: Duration,
    /// `parklinger` between requests (None: the connection does not
    /// park): the socket's read timeout while the next head has not
    /// begun, so that a quiet client is noticed without a poll().
    pub(super) linger: Option<Duration>,
    /// Set when the wait for the next head ended after `linger` with
    /// nothing read: since when it waited. The connection then parks.
    pub(super) quiet_since: Option<Instant>,
    /// `ssl_mitm`: the requests come from inside an intercepted tunnel
    /// and go to its destination over TLS (`inside`).
    pub(super) inside: Option<Box<Inside>>,
}

/// The parts of a request head the exchange needs after the head buffer
/// moved on.
pub(super) struct Req {
    pub(super) port: u16,
    pub(super) version: u8,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
    pub(super) upgrade: bool,
    pub(super) expect_continue: bool,
    pub(super) connect: bool,
    pub(super) head_method: bool,
    pub(super) idempotent: bool,
    /// `Authorization: NTLM|Negotiate`.
    pub(super) conn_auth: bool,
    pub(super) op: access::Op,
    /// The host is an IP literal.
    pub(super) literal: Option<IpAddr>,
    /// `transparent`: an origin-form request of a redirected client,
    /// which goes where the client meant to (its `Host` names it for the
    /// ACL and the log only).
    pub(super) redirected_to: Option<SocketAddr>,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    /// An ftp:// request: its path, for the FTP gateway.
    pub(super) ftp: Option<String>,
    /// The FTP login: the URL's credentials, else `Authorization`'s.
    pub(super) ftp_login: Option<(String, String)>,
}

/// How a request ended, for the connection.
pub(super) enum Next {
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
pub(super) struct Fail {
    pub(super) res: Res,
    pub(super) status: Option<u16>,
    /// Not a failure: the tunnel's chain is a local redirection to the
    /// handler of this type, with these hops (see `Session::tunnel`).
    pub(super) handoff: Option<(parent::Kind, u32)>,
}

impl Fail {
    pub(super) fn answer(res: Res, status: u16) -> Fail {
        Fail {
            res,
            status: Some(status),
            handoff: None,
        }
    }
    pub(super) fn silent(res: Res) -> Fail {
        Fail {
            res,
            status: None,
            handoff: None,
        }
    }
}

impl RespErr {
    /// The answer to give when no usable response head came.
    pub(super) fn fail(&self) -> Fail {
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
    pub(super) fn new(svc: Arc<Service>, c: &mut Client) -> Session {
        let redirected_to = c.original_dst();
        let extra = forwarding_fields(&svc, c);
        Session::with(svc, extra, redirected_to, c.hops)
    }

    /// A session before its first request: what a connection brings
    /// (its forwarding fields, where a redirected client meant to go,
    /// the hops a local redirection took), nothing learnt yet.
    pub(super) fn with(
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
}

impl Drop for Session {
    /// The client left: its kept origin connection can serve others.
    fn drop(&mut self) {
        if let Some(o) = self.origin.take() {
            park(&self.svc, o);
        }
    }
}

/// The status for an access-control refusal (3proxy's mapping).
pub(super) fn deny_status(res: Res, needuser: u32) -> u16 {
    match res {
        Res::QUOTA => 503,
        // Credentials missing or wrong (not a `deny`): ask for them.
        r if r.is_auth() && r != Res::ACL_DENY && needuser > 0 => 407,
        _ => 403,
    }
}

/// The answer when the destination could not be reached (through the
/// parents): 3proxy's codes 30-79 are a parent's failure.
pub(super) fn parent_fail(res: Res) -> Fail {
    let status = match res {
        // A `*` parent needs the client's credentials.
        r if r.is_auth() => 407,
        Res::NOTIMPL => 501,
        // socket() failed: the proxy is out of descriptors (or memory)
        // for now, which says nothing of the server (3proxy: 502).
        Res::SOCKET => 503,
        _ => 502,
    };
    Fail::answer(res, status)
}

/// Where every request of an intercepted tunnel goes, and who opened it.
pub struct Inside {
    /// The destination as the client named it (the CONNECT's host, the
    /// SOCKS destination, tcppm's target): the ACL's host, the record's,
    /// and the name asked and checked in the TLS handshake with it.
    pub host: String,
    pub port: u16,
    /// The address the tunnel reached.
    pub addr: SocketAddr,
    /// The credentials the tunnel was authorized with: each inner request
    /// is asked about with them, unless it brings its own.
    pub user: Option<String>,
    pub password: Option<String>,
}
