//! The response to the client: its head and body (as they come, or
//! through the `srvdata` filters), a `101` upgrade, the keeping of the
//! origin connection, and the end of a failed request.

use crate::acl;
use crate::client::Client;
use crate::filter::{self, Filters, Verdict};
use crate::net::Stream;
use crate::proto::http::{self, ChunkScanner, Framing, ResponseHead};
use crate::res::Res;
use crate::timeouts::Timeouts;

use super::answer::{linger, send_error, send_page, send_res, srv_res};
use super::body::{copy_chunked, copy_exact, copy_to_eof, is_bad_chunk, Side};
use super::filt;
use super::head::HeadBuf;
use super::pool::Origin;
use super::session::{Fail, Next, Req, Session};
use super::sock::{send_lazy, set_write_timeout, write_all_v};

impl Session {
    /// Send the final response head and body to the client; keep the
    /// origin connection if the exchange ended cleanly.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn respond(
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
            c.record.bytes_in += (self.resp_out.len() + n) as u64;
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
                    let clean = self.respond_filtered(c, sb, req, &o.s, n, &fs)?;
                    let reuse = body_done && h.keep_alive && clean;
                    return Ok(self.done_response(c, o, reuse, client_keep));
                }
                Framing::Close | Framing::Chunked if max > 0 => {
                    // Only a chunked body ends where the next response
                    // can begin.
                    let chunked = h.framing == Framing::Chunked;
                    let clean = self.respond_streamed(c, sb, req, &o.s, chunked, &fs)?;
                    let reuse = chunked && body_done && h.keep_alive && clean;
                    return Ok(self.done_response(c, o, reuse, client_keep && chunked));
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
        c.record.bytes_in += (self.resp_out.len() + now) as u64;
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
                Framing::Length(n) => copy_exact(
                    &o.s,
                    &c.cli,
                    n - now as u64,
                    Side::Server,
                    lim,
                    splice,
                    &mut c.record.ops,
                ),
                Framing::Chunked => copy_chunked(
                    &o.s,
                    &c.cli,
                    Side::Server,
                    &mut scanner,
                    lim,
                    &mut c.record.ops,
                    |_| clean = false,
                ),
                _ => copy_to_eof(&o.s, &c.cli, lim, splice, &mut c.record.ops),
            };
            match moved {
                Ok(n) => {
                    c.record.bytes_in += n;
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

    /// A response body of length `n`, up to `filtermaxsize`, from the
    /// origin `srv`: read whole, run the `srvdata` filters, send with its
    /// new length (as 3proxy does). Ok(whether nothing came after it).
    #[inline(never)]
    fn respond_filtered(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        srv: &Stream,
        n: u64,
        fs: &Filters,
    ) -> Result<bool, Fail> {
        let now = (sb.data().len() as u64).min(n) as usize;
        let mut body = sb.data()[..now].to_vec();
        sb.consume(now);
        let clean = sb.data().is_empty();
        if (now as u64) < n {
            srv.ack_now();
        }
        let ops = &mut c.record.ops;
        filt::read_rest(
            srv,
            n - now as u64,
            Side::Server,
            self.shaper(),
            &mut body,
            ops,
        )
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
        c.record.bytes_in += (self.resp_out.len() + body.len()) as u64;
        Ok(clean)
    }

    /// A response body from the origin `srv` that ends when it closes, or
    /// `chunked`: streamed through the `srvdata` filters,
    /// `filtermaxsize` bytes at a time (a chunked one decoded, and sent
    /// in new chunks). Ok(whether nothing came after the body).
    #[inline(never)]
    fn respond_streamed(
        &mut self,
        c: &mut Client,
        sb: &mut HeadBuf<'_>,
        req: &Req,
        srv: &Stream,
        chunked: bool,
        fs: &Filters,
    ) -> Result<bool, Fail> {
        let first = sb.data().to_vec();
        sb.consume(first.len());
        srv.ack_now();
        set_write_timeout(&c.cli, &mut self.cli_wto, self.long)
            .map_err(|e| Fail::silent(send_res(&e)))?;
        let host = acl::normalize_host(&self.host);
        let user = c.user.clone();
        let q = filt::query(fs, c, user.as_deref(), &host, req.port, req.op.bits());
        let mut clean = true;
        // Counted here: `q` borrows the client.
        let mut ops = crate::traffic::Ops::default();
        let r = if chunked {
            filt::stream_chunked(
                fs,
                filter::SRVDATA,
                &q,
                self.svc.filtermaxsize,
                srv,
                Side::Server,
                &c.cli,
                &self.resp_out,
                &first,
                self.shaper(),
                &mut ops,
                |_| clean = false,
            )
        } else {
            filt::stream_to_eof(
                fs,
                filter::SRVDATA,
                &q,
                self.svc.filtermaxsize,
                srv,
                &c.cli,
                &self.resp_out,
                &first,
                self.shaper(),
                &mut ops,
            )
        };
        c.record.ops.add(ops);
        match r {
            Ok(n) => c.record.bytes_in += n,
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
        Ok(clean)
    }

    /// A response went out whole: keep the origin connection when the
    /// exchange ended cleanly and the origin allows it (`reuse`), and say
    /// whether the client's connection goes on.
    fn done_response(&mut self, c: &mut Client, o: Origin, reuse: bool, client_keep: bool) -> Next {
        if reuse {
            self.origin = Some(o);
        }
        c.record.res = Res::OK;
        if client_keep {
            Next::KeepAlive
        } else {
            Next::Close
        }
    }

    /// Answer an error (when nothing was answered yet), log the request,
    /// and close the connection gracefully. The answer is StringsPlugin's
    /// page for the code when its file has one (sent as it is: it has no
    /// length, the close ends it), else the built-in page.
    pub(super) fn finish_error(&mut self, c: &mut Client, f: Fail) {
        c.record.res = f.res;
        self.origin = None;
        if let Some(status) = f.status {
            let _ = set_write_timeout(&c.cli, &mut self.cli_wto, self.long);
            let needuser = self.svc.opts.needuser.unwrap_or(1) > 0;
            let replaced = self.svc.strings.as_deref();
            c.record.bytes_in += match replaced.and_then(|t| t.proxy_error(f.res, needuser)) {
                Some(page) => send_page(&c.cli, page),
                None => send_error(&c.cli, status, f.res),
            } as u64;
        }
        c.end_record();
        if f.status.is_some() {
            linger(&c.cli, self.svc.timeouts.get(Timeouts::LINGER));
        }
    }
}
