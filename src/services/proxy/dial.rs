//! Authorizing a request (the ACL, then the request filters) and
//! reaching its origin: the kept connection, a pooled one, or a new one
//! dialed directly or through the grant's parents.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::access::{self, Recheck, Request};
use crate::acl;
use crate::chain;
use crate::client::Client;
use crate::filter::{self, Verdict};
use crate::net::Stream;
use crate::parent;
use crate::proto::http::{self, Framing};
use crate::res::Res;
use crate::resolve::resolve;
use crate::session;
use crate::timeouts::Timeouts;

use super::filt;
use super::pool::{park, still_open, unpark, Origin, Via};
use super::session::{deny_status, parent_fail, Fail, Req, Session};
use super::sock::set_timeouts;

impl Session {
    /// Authorize the request and find its destination address. The kept
    /// origin connection is reused (and nothing resolved) when the request
    /// goes to the same host and port.
    pub(super) fn authorize(&mut self, c: &mut Client, req: &Req) -> Result<SocketAddr, Fail> {
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
                c.granted(&grant);
                c.record.set_nolog(grant.nolog);
                self.grant = Some(grant);
                Ok(())
            }
            Err(res) => {
                let needuser = self.svc.opts.needuser.unwrap_or(1);
                Err(Fail::answer(res, deny_status(res, needuser)))
            }
        }
    }

    /// The `request` and `cliheader` filters, once the request is
    /// authorized (as in 3proxy). A rewrite of the request line changes
    /// what is logged; one of the head, what the origin gets.
    pub(super) fn filter_request(&mut self, c: &mut Client, req: &Req) -> Result<(), Fail> {
        let Some(fs) = self.svc.filters.clone() else {
            return Ok(());
        };
        let deny = || Fail::answer(Res::FILTER_DENY, 503);
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(&fs, c, user.as_deref(), &host, req.port, req.op.bits());
        let mut text = None;
        if fs.has(filter::REQUEST) {
            let mut line = Vec::with_capacity(c.record.text.len() + 2);
            line.extend_from_slice(c.record.text.as_bytes());
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
            c.record.text = t;
        }
        Ok(())
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
    pub(super) fn dial(
        &mut self,
        c: &mut Client,
        req: &Req,
        dst: SocketAddr,
    ) -> Result<Origin, Fail> {
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
        // Straight to the origin: the address connected to, which happy
        // eyeballs may have taken from the other family (no getpeername()).
        c.remote_addr = chain.peer.or_else(|| s.peer_addr());
        // A new connection (a pooled one is not connected again).
        c.record.ops.connects += 1;
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
            peer: c.remote_addr,
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
    pub(super) fn host_or_ip(&self, req: &Req) -> String {
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
                c.remote_addr = o.peer.or(Some(dst));
                c.ext_addr = o.ext;
                c.hops = self.base_hops;
                Ok(o)
            }
            None => self.dial(c, req, dst),
        }
    }

    /// The connection to send the request on: the kept one if it fits, a
    /// pooled one, or a new one. (Not inlined, as the parts of `forward`:
    /// a client thread's stack is as deep as its deepest path, and each
    /// page it ever touched stays resident, so connecting and exchanging
    /// do not stack their frames on one another.)
    #[inline(never)]
    pub(super) fn origin_for(
        &mut self,
        c: &mut Client,
        req: &Req,
        dst: SocketAddr,
    ) -> Result<Origin, Fail> {
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
}
