//! Forwarding a request to its origin: the head and the body (filtered
//! or streamed), `Expect: 100-continue` and interim answers, a retry on
//! a kept connection the origin closed, and the ftp:// gateway.

use std::net::SocketAddr;
use std::time::Duration;

use crate::access;
use crate::acl;
use crate::client::Client;
use crate::filter::{self, Filters, Verdict};
use crate::proto::http::{self, ChunkScanner, Framing, ResponseHead};
use crate::res::Res;

use super::answer::{cli_res, send_res, srv_res};
use super::body::{copy_chunked, copy_exact, is_bad_chunk, Side};
use super::filt;
use super::ftp;
use super::head::{read_response, HeadBuf, SMALL};
use super::pool::Origin;
use super::session::{Fail, Next, Req, Session};
use super::sock::{readable_within, set_read_timeout, set_write_timeout, write_all_v};

/// How long to wait for an origin's `100 Continue` before sending the body
/// anyway (an origin may ignore `Expect`, RFC 9110 section 10.1.1).
const CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// Most interim (1xx) responses relayed for one request; one more is
/// answered 502. Real origins send one or two (100, 102, 103).
const MAX_INTERIM: u32 = 16;

impl Session {
    /// Forward a request to its origin and the response back.
    pub(super) fn forward(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
    ) -> Result<Next, Fail> {
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
        o: Origin,
        dst: SocketAddr,
        body: (usize, bool),
        scanner: ChunkScanner,
    ) -> Result<Next, Fail> {
        let mut small = [0u8; SMALL];
        let mut sb = HeadBuf::new(&mut small);
        let r = self.exchange_on(c, cb, &mut sb, req, o, dst, body, scanner);
        // The reads of the origin's heads (and what came with them).
        c.record.ops.reads += sb.reads;
        r
    }

    /// [`Session::exchange`], the origin's heads read into `sb`.
    #[allow(clippy::too_many_arguments)]
    fn exchange_on(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        sb: &mut HeadBuf<'_>,
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
        let mut interim = 0;
        let with_head = filtered.as_deref().unwrap_or(&cb.data()[..now]);
        let (reused, sent) = self.send_head(c, req, &mut o, dst, with_head, retryable)?;
        c.record.bytes_out += sent as u64;
        cb.consume(now);
        let early = if more_body && req.expect_continue {
            self.await_continue(c, &o, sb, req, &mut interim)?
        } else {
            None
        };
        let mut body_done = !more_body;
        if early.is_none() && more_body {
            let first = chunked_first.as_deref();
            self.send_body(c, cb, req, &o, now, first, &mut scanner)?;
            body_done = true;
        }
        let h = match early {
            Some(h) => h,
            None => {
                let may_retry = reused && retryable;
                self.final_response(c, sb, req, &mut o, dst, may_retry, &mut interim)?
            }
        };
        self.respond(c, cb, sb, req, o, h, body_done)
    }

    /// Write the head on `o`, and `body` (the body bytes that leave with
    /// it); a kept connection the origin closed meanwhile is replaced by
    /// a new one when the request may be sent twice (`retryable`).
    /// Returns whether `o` had served a request before, and the bytes
    /// written.
    fn send_head(
        &mut self,
        c: &mut Client,
        req: &Req,
        o: &mut Origin,
        dst: SocketAddr,
        body: &[u8],
        retryable: bool,
    ) -> Result<(bool, usize), Fail> {
        loop {
            let reused = std::mem::replace(&mut o.used, true);
            let head = self.head_for(o, req.port);
            let sent = head.len() + body.len();
            match write_all_v(&o.s, head, body) {
                Ok(()) => {
                    c.record.ops.writes += 1;
                    return Ok((reused, sent));
                }
                // A kept connection the origin closed meanwhile: once more
                // on a new one.
                Err(_) if reused && retryable => *o = self.dial(c, req, dst)?,
                Err(e) => return Err(Fail::answer(srv_res(&e), 502)),
            }
        }
    }

    /// `Expect: 100-continue`: if the origin answers within a while, read
    /// the answer. A 100 is passed on (None: send the body); a final
    /// answer is returned (the origin does not want the body). None too
    /// when the origin says nothing.
    fn await_continue(
        &mut self,
        c: &mut Client,
        o: &Origin,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        interim: &mut u32,
    ) -> Result<Option<ResponseHead>, Fail> {
        if !readable_within(&o.s, CONTINUE_WAIT) {
            return Ok(None);
        }
        // The origin answered the Expect: 100 (send the body) or a
        // final status (it does not want the body).
        let h =
            read_response(&o.s, sb, req.head_method, &mut self.resp_out).map_err(|e| e.fail())?;
        if h.is_interim() {
            self.send_interim(c, sb, &h, req.version, interim)?;
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Send the rest of the request body, from the client to the origin:
    /// as it is framed (`now` bytes of a length already went with the
    /// head), or, when `chunked_first` has a chunked body's first bytes,
    /// decoded through the `clidata` filters.
    #[allow(clippy::too_many_arguments)]
    fn send_body(
        &mut self,
        c: &mut Client,
        cb: &mut HeadBuf<'_>,
        req: &Req,
        o: &Origin,
        now: usize,
        chunked_first: Option<&[u8]>,
        scanner: &mut ChunkScanner,
    ) -> Result<(), Fail> {
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
        let sent = match (req.framing, chunked_first) {
            (Framing::Length(n), _) => copy_exact(
                &c.cli,
                &o.s,
                n - now as u64,
                Side::Client,
                lim,
                splice,
                &mut c.record.ops,
            ),
            (_, Some(first)) => {
                let fs = self.filters(filter::CLIDATA).unwrap_or_default();
                let host = acl::normalize_host(&self.host);
                let q = filt::query(&fs, c, c.user.as_deref(), &host, req.port, req.op.bits());
                // Counted here: `q` borrows the client.
                let mut ops = crate::traffic::Ops::default();
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
                    &mut ops,
                    |b| cb.put_back(b),
                );
                c.record.ops.add(ops);
                match r {
                    Ok(n) => Ok(n),
                    Err(filt::StreamErr::Io(s, e)) => Err((s, e)),
                    Err(filt::StreamErr::Denied { .. }) => {
                        return Err(Fail::answer(Res::FILTER_DENY, 503))
                    }
                }
            }
            _ => copy_chunked(
                &c.cli,
                &o.s,
                Side::Client,
                scanner,
                lim,
                &mut c.record.ops,
                |b| cb.put_back(b),
            ),
        };
        match sent {
            Ok(n) => {
                c.record.bytes_out += n;
                if lim.is_some() {
                    self.shaped.1 += n;
                }
                Ok(())
            }
            // The server has the head already: close, without an
            // answer the client could take for the server's.
            Err((Side::Client, e)) if is_bad_chunk(&e) => Err(Fail::silent(Res::HTTP_CHUNK_CLIENT)),
            Err((Side::Client, e)) => Err(Fail::silent(cli_res(&e))),
            Err((Side::Server, e)) => Err(Fail::answer(srv_res(&e), 502)),
        }
    }

    /// Read the origin's final answer, passing interim ones on to the
    /// client. With `may_retry`, a kept connection the origin closed
    /// before it read this request is replaced by a new one to `dst`,
    /// once, and the head sent again on it.
    #[allow(clippy::too_many_arguments)]
    fn final_response(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        o: &mut Origin,
        dst: SocketAddr,
        mut may_retry: bool,
        interim: &mut u32,
    ) -> Result<ResponseHead, Fail> {
        loop {
            match read_response(&o.s, sb, req.head_method, &mut self.resp_out) {
                Ok(h) if h.is_interim() => self.send_interim(c, sb, &h, req.version, interim)?,
                Ok(h) => return Ok(h),
                Err(e) if may_retry && e.nothing_read() => {
                    // The kept connection was closed by the origin
                    // before it read this request: once more on a new
                    // one.
                    may_retry = false;
                    *o = self.dial(c, req, dst)?;
                    o.used = true;
                    let head = self.head_for(o, req.port);
                    write_all_v(&o.s, head, &[]).map_err(|e| Fail::answer(srv_res(&e), 502))?;
                    c.record.bytes_out += head.len() as u64;
                    c.record.ops.writes += 1;
                }
                Err(e) => return Err(e.fail()),
            }
        }
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
        let ops = &mut c.record.ops;
        filt::read_rest(
            &c.cli,
            n - now as u64,
            Side::Client,
            self.shaper(),
            &mut b,
            ops,
        )
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

    /// Pass a 1xx (other than 101) on to the client, with the long write
    /// timeout.
    fn send_interim(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        h: &ResponseHead,
        version: u8,
        count: &mut u32,
    ) -> Result<(), Fail> {
        set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(send_res(&e)))?;
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
        let out = &mut self.resp_out;
        http::end_response_head(out, version, true, true);
        write_all_v(&c.cli, out, &[]).map_err(|e| Fail::silent(send_res(&e)))?;
        c.record.bytes_in += out.len() as u64;
        Ok(())
    }
}
