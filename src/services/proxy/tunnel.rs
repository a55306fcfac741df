//! `CONNECT`: the tunnel (through an `http` parent, with `ssl_cli` or
//! `ssl_mitm`), its hand-over to a local handler, and the relay of a
//! tunnel or an upgraded connection.

use std::net::SocketAddr;

use crate::client::Client;
use crate::filter;
use crate::net::Stream;
use crate::parent;
use crate::proto::http;
use crate::res::Res;
use crate::service::Service;
use crate::session;
use crate::stringtable;
use crate::timeouts::Timeouts;

use super::answer::{cli_res, srv_res};
use super::head::{read_response, HeadBuf, SMALL};
use super::inside;
use super::pool::{park, Origin};
use super::session::parent_fail;
use super::session::Inside;
use super::session::{Fail, Next, Req, Session};
use super::sock::{send_lazy, write_all_v};

impl Session {
    /// `CONNECT host:port`: answer 200 and relay until both sides are done.
    #[inline(never)]
    pub(super) fn tunnel(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
    ) -> Result<Next, Fail> {
        let head_len = cb.head_len;
        if self.filters(filter::CLIHEADER).is_some() {
            // A CONNECT forwards no head; `cliheader` filters still judge
            // the client's, as in 3proxy (a rewrite goes nowhere).
            self.req_out.clear();
            self.req_out.extend_from_slice(&cb.data()[..head_len]);
        }
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
            c.record.res = res;
            c.srv = Some(o.s);
            return Ok(Next::Close);
        }
        if let Err(res) = crate::session::intercept(c, &mut o.s, &self.host, cb.data()) {
            c.record.res = res;
            c.srv = Some(o.s);
            return Ok(Next::Close);
        }
        if self.svc.mitm.is_some() {
            match inside::wait_first(c, &o.s) {
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
            c.record.bytes_out += early.len() as u64;
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
        let line = established_line(&self.svc);
        send_lazy(&c.cli, line, &[], &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(cli_res(&e)))?;
        let early = cb.data().to_vec();
        let n = early.len();
        cb.consume(n);
        let name = req.literal.is_none().then(|| self.host.clone());
        c.hand_over(parent::Handoff::to(kind, hops, early, name, dst))
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
        let early = sb.data();
        let line = established_line(&self.svc);
        send_lazy(&c.cli, line, early, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(cli_res(&e)))?;
        c.record.bytes_in += (line.len() + early.len()) as u64;
        Ok(())
    }

    /// CONNECT through an `http` last hop: ask it for a tunnel (with its
    /// credentials), as a `connect` parent would be asked. Whatever follows
    /// its answer's head is left in `sb`.
    pub(super) fn parent_connect(
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
        c.record.bytes_out += self.abs_out.len() as u64;
        c.record.ops.writes += 1;
        let h = read_response(&o.s, sb, true, &mut self.resp_out);
        c.record.ops.reads += std::mem::take(&mut sb.reads);
        let h = h.map_err(|_| parent_fail(Res::PARENT_CONNECT_REPLY))?;
        if !(200..300).contains(&h.status) {
            return Err(parent_fail(Res::PARENT_CONNECT_REFUSED));
        }
        sb.consume(h.len);
        Ok(())
    }

    /// Relay raw bytes both ways (a tunnel or an upgraded connection).
    /// Bytes the client sent after the head go to the server first.
    pub(super) fn relay(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        srv: &Stream,
    ) -> Result<(), Fail> {
        let early = cb.data();
        if !early.is_empty() {
            write_all_v(srv, early, &[]).map_err(|e| Fail::silent(srv_res(&e)))?;
            c.record.bytes_out += early.len() as u64;
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
        c.record.res = out.res;
        c.record.bytes_out += out.out;
        c.record.bytes_in += out.inb;
        c.record.ops.add(out.ops);
        Ok(())
    }
}

/// The answer that opens a tunnel: 3proxy's exact line (some clients
/// match on it), or StringsPlugin's text for it.
fn established_line(svc: &Service) -> &[u8] {
    const ESTABLISHED: &[u8] = b"HTTP/1.0 200 Connection established\r\n\r\n";
    svc.strings
        .as_deref()
        .and_then(|t| t.proxy(stringtable::ESTABLISHED))
        .unwrap_or(ESTABLISHED)
}
