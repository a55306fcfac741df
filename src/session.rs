//! What every TCP session shares, whatever its service: the PROXY
//! protocol header a `-H` service reads first, and the relay that ends a
//! session (its options from the service, logdump records, limits, the
//! reload recheck, the byte counters). The services call these; nothing
//! here knows a protocol.

use std::io::Write;

use crate::access::{self, Grant, Recheck, Request};
use crate::client::Client;
use crate::net::Stream;
use crate::relay::{relay_parking, DataFilter, Dump, Hooks, Outcome, RelayOpts};
use crate::res::Res;
use crate::service::Service;
use crate::timeouts::Timeouts;

/// `-H`: take the PROXY header off the client socket; the addresses it
/// names replace the connection's own in the log. False if the header was
/// bad: the session then ends with a log line saying why.
pub fn read_proxy_header(c: &mut Client) -> bool {
    // A client handed from one service to another (SOCKS to the HTTP
    // proxy) had its header read by the first.
    if c.header_read {
        return true;
    }
    c.header_read = true;
    let svc = c.svc().clone();
    let _ = c
        .cli
        .set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
    match crate::proto::proxy_v1::read(&c.cli) {
        Ok(Some((src, dst))) => {
            c.client_addr = Some(src);
            c.local_addr = Some(dst);
            c.publish();
            true
        }
        Ok(None) => true,
        Err(why) => {
            c.record.res = Res::BAD_REQUEST;
            c.record.text = format!("bad PROXY header: {why}");
            false
        }
    }
}

/// The `connlim` rules the client's address alone decides, taken before
/// anything of a head is read (`access::hold_connlim`). False if one is
/// over its limit: the session then ends with code 10, closed unanswered.
pub fn hold_connlim(c: &mut Client) -> bool {
    match access::hold_connlim(c.svc(), c.client_addr) {
        Ok(h) => {
            c.conn_hold = h.map(Box::new);
            true
        }
        Err(res) => {
            c.record.res = res;
            c.record.text = "connlim".into();
            false
        }
    }
}

/// `ssl_serv`: the TLS handshake with the client, within the STRING_SHORT
/// timeout, before the service's handler reads anything. False if it
/// failed: the session then ends with its one log record and a code.
pub fn accept_tls(c: &mut Client) -> bool {
    let svc = c.svc().clone();
    let Some(cfg) = svc.tls_server.clone() else {
        return true;
    };
    let deadline = std::time::Instant::now() + svc.timeouts.get(Timeouts::STRING_SHORT);
    match c.cli.accept_tls(cfg, deadline) {
        Ok(()) => {
            // The handshake ran deep; an idle session should not keep
            // those stack pages.
            crate::sys::mem::release_stack_below_here();
            true
        }
        Err(e) => {
            use crate::net::HandshakeError as H;
            c.record.res = match e {
                H::NotTls(_) => Res::TLS_NOT_TLS,
                H::Timeout => Res::TLS_TIMEOUT,
                H::Certificate(_) => Res::TLS_CLIENT_CERT,
                H::Failed(_) => Res::TLS_HANDSHAKE,
            };
            c.record.text = e.to_string();
            false
        }
    }
}

/// `ssl_mitm`: once the tunnel to `host` (the destination as the client
/// named it) is open on `srv`, TLS with the origin over it (the
/// `ssl_client_*` settings, `host` as SNI and the name checked under
/// `ssl_client_verify`, within the CHAIN timeout), then TLS with the
/// client, serving the certificate made for `host` (within STRING_SHORT).
/// The relay then moves the plaintext between the two. Nothing to do
/// without `ssl_mitm`. Err 8011 (the origin) or 8012 (the client), with
/// why in the record's text. `early`, what the client sent before its
/// tunnel was open, must be empty: the handshake reads the socket.
pub fn intercept(c: &mut Client, srv: &mut Stream, host: &str, early: &[u8]) -> Result<(), Res> {
    intercept_with(c, srv, host, early, &[])
}

/// [`intercept`] for `tlspr`, which read the client's ClientHello
/// (`hello`) to route by its SNI: the client's handshake takes it first.
pub fn intercept_hello(
    c: &mut Client,
    srv: &mut Stream,
    host: &str,
    hello: &[u8],
) -> Result<(), Res> {
    intercept_with(c, srv, host, &[], hello)
}

fn intercept_with(
    c: &mut Client,
    srv: &mut Stream,
    host: &str,
    early: &[u8],
    hello: &[u8],
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let Some(m) = svc.mitm.as_deref() else {
        return Ok(());
    };
    let fail = with_why;
    if !early.is_empty() {
        return Err(fail(
            c,
            Res::TLS_MITM,
            format!(
                "ssl_mitm: the client sent {} bytes before its tunnel was open",
                early.len()
            ),
        ));
    }
    mitm_origin(c, m, srv, host)?;
    let cfg = match m.server_config(host) {
        Ok(cfg) => cfg,
        Err(e) => return Err(fail(c, Res::TLS_MITM, e)),
    };
    let deadline = std::time::Instant::now() + svc.timeouts.get(Timeouts::STRING_SHORT);
    let accepted = if hello.is_empty() {
        c.cli.accept_tls(cfg, deadline)
    } else {
        c.cli.accept_tls_after(cfg, hello, deadline)
    };
    if let Err(e) = accepted {
        return Err(fail(c, Res::TLS_MITM, format!("ssl_mitm: the client: {e}")));
    }
    crate::sys::mem::release_stack_below_here();
    Ok(())
}

/// `ssl_mitm`'s TLS with the origin over `srv` (the tunnel's connection,
/// or a new one an inner request made): the `ssl_client_*` settings,
/// `host` as SNI and the name checked, within the CHAIN timeout. Err 8011
/// (or 8012 for a name no certificate can be made for), with why in the
/// record's text.
pub fn mitm_origin(
    c: &mut Client,
    m: &crate::tls::mitm::Mitm,
    srv: &mut Stream,
    host: &str,
) -> Result<(), Res> {
    if srv.is_tls() {
        let why = "ssl_mitm: the origin is behind a parent over TLS (no TLS inside TLS)";
        return Err(with_why(c, Res::TLS_PARENT, why.into()));
    }
    let name = crate::tls::mitm::leaf_name(host)
        .and_then(|n| rustls::pki_types::ServerName::try_from(n).ok());
    let Some(name) = name else {
        let why = format!("ssl_mitm: '{host}' is not a name to certify");
        return Err(with_why(c, Res::TLS_MITM, why));
    };
    let limit = c.svc().timeouts.get(Timeouts::CHAIN);
    if let Err(e) = srv.connect_tls(m.client.clone(), name, std::time::Instant::now() + limit) {
        return Err(with_why(
            c,
            Res::TLS_PARENT,
            format!("ssl_mitm: the origin: {e}"),
        ));
    }
    Ok(())
}

/// Where a session is, for `ssl_cli`'s handshake with the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestAt {
    /// The chain reached the destination; the client has not been
    /// answered yet (3proxy's modes 0 and 1: on connect, after auth).
    Reached,
    /// A tunnel's client was told it is open; its data comes next
    /// (3proxy's mode 2: before data).
    Answered,
}

/// `ssl_cli` with `ssl_client_mode` 0-2: TLS with the destination itself
/// over `srv`, the stream the chain reached it by, within the CHAIN
/// timeout, asking for `ssl_client_sni` or else `host` (the destination's
/// name as the client or the cfg gave it, or its IP address: no SNI, the
/// address checked under `ssl_client_verify`). Modes 0 and 1 do it at
/// [`DestAt::Reached`] in every session; mode 2 only in a tunnel
/// (`tunnel`: CONNECT, SOCKS CONNECT, tcppm) at [`DestAt::Answered`], as
/// 3proxy's before-data hook skips other operations. A tunnel under
/// `ssl_mitm` is left to the interception, which reaches the origin over
/// TLS itself. Nothing to do otherwise. Err 8011 with why in the
/// record's text.
pub fn tls_to_dest(
    c: &mut Client,
    srv: &mut Stream,
    host: &str,
    at: DestAt,
    tunnel: bool,
) -> Result<(), Res> {
    let svc = c.svc().clone();
    let Some(t) = dest_tls_due(&svc, at, tunnel) else {
        return Ok(());
    };
    if srv.is_tls() {
        let why = "ssl_cli: the destination is behind a parent over TLS (no TLS inside TLS)";
        return Err(with_why(c, Res::TLS_PARENT, why.into()));
    }
    let Some(name) = t.server_name(host) else {
        let why = format!("ssl_cli: '{host}' is not a name to ask a server for");
        return Err(with_why(c, Res::TLS_PARENT, why));
    };
    let deadline = std::time::Instant::now() + svc.timeouts.get(Timeouts::CHAIN);
    if let Err(e) = srv.connect_tls(t.config.clone(), name, deadline) {
        let why = format!("ssl_cli: the destination {host}: {e}");
        return Err(with_why(c, Res::TLS_PARENT, why));
    }
    crate::sys::mem::release_stack_below_here();
    Ok(())
}

/// The TLS settings [`tls_to_dest`] would handshake with at `at`, if it
/// would.
pub fn dest_tls_due(svc: &Service, at: DestAt, tunnel: bool) -> Option<&crate::tls::Client> {
    let t = svc.tls_client.as_deref().filter(|t| t.to_server)?;
    let due = match t.mode() {
        2 => tunnel && at == DestAt::Answered,
        _ => at == DestAt::Reached,
    };
    (due && !(tunnel && svc.mitm.is_some())).then_some(t)
}

/// Add why a session failed to its record's text; `res` back.
pub fn with_why(c: &mut Client, res: Res, why: String) -> Res {
    if c.record.text.is_empty() {
        c.record.text = why;
    } else {
        c.record.text = format!("{} ({why})", c.record.text);
    }
    res
}

/// The relay's options for a session of `svc`, idle for at most its
/// `idle_slot` timeout.
pub fn relay_opts(svc: &Service, idle_slot: usize) -> RelayOpts {
    RelayOpts {
        idle: svc.timeouts.get(idle_slot),
        session_end: svc.opts.session_end,
        splice: svc.splice(),
        bufsize: svc.bufsize,
        grace: svc.opts.grace,
        deadline: None,
        linger: None,
        client_answered: false,
    }
}

/// The linger of a session that may park: the service's `parklinger`,
/// unless that is 0 (off).
fn linger(svc: &Service) -> Option<std::time::Duration> {
    Some(svc.park_linger).filter(|d| !d.is_zero())
}

/// Whether a session relayed by [`relay_to`] may park.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Park {
    /// Never: the handler does more after the relay (the mail proxies
    /// answer the client by its result).
    Never,
    /// When it goes quiet for the service's `parklinger`, for a handler
    /// that does nothing after the relay but return: the session is left
    /// in `c.parked` (the handler returns as if done, and the client
    /// thread parks it); it ends, and writes its record, after it comes
    /// back.
    WhenQuiet,
    /// [`Park::WhenQuiet`] for a client that was just answered (a SOCKS
    /// reply): when it sent nothing after its request (`early` empty),
    /// the relay waits for its first bytes instead of trying to read them
    /// at once (`RelayOpts::client_answered`).
    AfterReply,
}

/// Send `early` (what the client sent before its session began) to
/// `srv`, then relay the client's session with it, idle for at most the
/// `idle_slot` timeout (a `Timeouts` slot), with logdump records, limits
/// and the reload recheck, parking as `park` says; the tail of every TCP
/// session: tcppm, socks (CONNECT and BIND), tlspr, the mail proxies.
pub fn relay_to(
    c: &mut Client,
    srv: Stream,
    grant: &Grant,
    recheck: &Recheck,
    early: &[u8],
    idle_slot: usize,
    park: Park,
) {
    let svc = c.svc().clone();
    if !early.is_empty() {
        let _ = srv.set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
        if (&srv).write_all(early).is_err() {
            c.record.res = Res::SERVER_ERR;
            c.srv = Some(srv);
            return;
        }
        let _ = srv.set_timeout(None);
    }
    c.record.bytes_out += early.len() as u64;
    let opts = RelayOpts {
        deadline: grant.radius.as_ref().and_then(|r| r.deadline),
        linger: linger(&svc).filter(|_| park != Park::Never),
        client_answered: park == Park::AfterReply && early.is_empty(),
        ..relay_opts(&svc, idle_slot)
    };
    let limits = grant.limits.clone();
    relay_owned(c, srv, opts, limits, Some(recheck.clone()), Finish::Plain);
}

/// Relay the client's session with `srv` under its limits and recheck,
/// writing `logdump` records while it runs; the start of the final record
/// is the time of the last of them. It never parks.
pub fn relay_logged(
    c: &mut Client,
    srv: &crate::net::Stream,
    opts: &RelayOpts,
    limits: Option<&crate::limit::SessionLimits>,
    recheck: &Recheck,
) -> Outcome {
    begin(c);
    // The admin page may end the session: it shuts this socket down too.
    let _attached = c.live.attach_server(srv);
    let opts = RelayOpts {
        linger: None,
        ..*opts
    };
    match run_logged(c, srv, &opts, limits, Some(recheck), None) {
        Ok(out) => out,
        // Not without a linger.
        Err(_) => Outcome {
            res: Res::POLL,
            out: 0,
            inb: 0,
            ops: Default::default(),
        },
    }
}

/// The relay is about to start: the live registry and the accounting
/// learn what the session knows.
fn begin(c: &mut Client) {
    c.publish();
    c.sync_live();
    c.acct_refresh();
}

/// What a relay that may park ends with, once it is over: the tail of
/// the handler that started it.
pub enum Finish {
    /// The result and the bytes go into the session's one record
    /// (`relay_to`).
    Plain,
    /// An HTTP proxy's tunnel (CONNECT): the request ends as the proxy's
    /// `end_request` ends it: what the shaper did not count is counted,
    /// then the record (unless its grant said `nolog`).
    Http {
        /// The relay's bytes are shaped (and so counted) as they move.
        shaping: bool,
        /// Bytes of the request counted already (in, out).
        shaped: (u64, u64),
    },
}

impl Finish {
    fn apply(self, c: &mut Client, out: Outcome, limits: Option<&crate::limit::SessionLimits>) {
        c.record.res = out.res;
        c.record.bytes_out += out.out;
        c.record.bytes_in += out.inb;
        c.record.ops.add(out.ops);
        let Finish::Http {
            shaping,
            mut shaped,
        } = self
        else {
            return;
        };
        if shaping {
            shaped.0 += out.inb;
            shaped.1 += out.out;
        }
        if let Some(l) = limits {
            l.add(
                c.record.bytes_in.saturating_sub(shaped.0),
                c.record.bytes_out.saturating_sub(shaped.1),
            );
        }
        c.end_record();
    }
}

/// Relay the client's session with `srv` (which it owns from here on),
/// parking it after `opts.linger` without traffic: then the session is
/// left in `c.parked` and None returned. Else the relay is over,
/// `finish` applied, and `srv` in `c.srv`.
pub fn relay_owned(
    c: &mut Client,
    srv: Stream,
    opts: RelayOpts,
    limits: Option<std::sync::Arc<crate::limit::SessionLimits>>,
    recheck: Option<Recheck>,
    finish: Finish,
) {
    if c.ext_from_srv && c.ext_addr.is_none() && c.svc().log.is_some() {
        // Records written while the relay holds `srv` (`logdump`) show it.
        c.ext_addr = srv.local_addr();
    }
    begin(c);
    // The admin page may end the session: it shuts this socket down too,
    // also while it is parked.
    let attached = c.live.attach_server(&srv);
    let run = run_logged(c, &srv, &opts, limits.as_deref(), recheck.as_ref(), None);
    ParkedRelay {
        attached,
        srv,
        paused: None,
        opts,
        limits,
        recheck,
        finish,
    }
    .ended(c, run);
}

/// The relay with the session's hooks: `logdump` records, limits, the
/// recheck (None: no recheck and no `logdump`, as the HTTP proxy's tunnels
/// under `noforce`), data filters, live counters. Err: it parked.
fn run_logged(
    c: &mut Client,
    srv: &Stream,
    opts: &RelayOpts,
    limits: Option<&crate::limit::SessionLimits>,
    recheck: Option<&Recheck>,
    from: Option<crate::relay::Paused>,
) -> Result<Outcome, crate::relay::Paused> {
    let (out_at, in_at) = match recheck {
        Some(_) => c.svc().logdump,
        None => (0, 0),
    };
    let mut since = c.record.start;
    // The record's own reads, writes and connects so far go into the
    // first `logdump` record, if one is written.
    let mut before = std::mem::take(&mut c.record.ops);
    let out = {
        let client: &Client = c;
        let mut write = |o: u64, i: u64, mut ops: crate::traffic::Ops| {
            ops.add(std::mem::take(&mut before));
            client.write_dump(o, i, ops, since);
            since = std::time::SystemTime::now();
        };
        let dump = (out_at > 0 || in_at > 0).then_some(Dump {
            out_at,
            in_at,
            write: &mut write,
        });
        // `clidata`/`srvdata` filters, matched against what the session
        // knows of its request.
        let svc = client.svc();
        let host = client.req_host.as_deref().map(crate::acl::normalize_host);
        let filter = svc
            .filters
            .as_deref()
            .filter(|f| recheck.is_some() && f.has(crate::filter::CLIDATA | crate::filter::SRVDATA))
            .map(|filters| {
                let (wday, daysec) = if filters.timed() {
                    crate::access::local_clock(std::time::SystemTime::now())
                } else {
                    (0, 0)
                };
                DataFilter {
                    filters,
                    query: crate::acl::Query {
                        wday,
                        daysec,
                        user: client.user.as_deref(),
                        src: client.client_addr.map(|a| a.ip()),
                        dst: client.req_addr.map(|a| a.ip()),
                        host: host.as_deref(),
                        port: client.req_addr.map_or(0, |a| a.port()),
                        ..Default::default()
                    },
                    max: svc.filtermaxsize,
                }
            });
        let hooks = Hooks {
            limits,
            recheck,
            dump,
            filter,
            live: Some(client.live.bytes()),
        };
        relay_parking(&client.cli, srv, opts, hooks, from)
    };
    c.record.start = since;
    c.record.ops.add(before);
    out
}

/// A relay parked in the lot (`park`), with everything the rest of its
/// session needs but the `Client`.
struct ParkedRelay {
    /// Declared before `srv`: it forgets the socket before it closes.
    attached: crate::live::Attached,
    srv: Stream,
    /// None only until the first park.
    paused: Option<crate::relay::Paused>,
    opts: RelayOpts,
    /// Held until the session ends (its drop updates the counters and
    /// frees its `connlim` places).
    limits: Option<std::sync::Arc<crate::limit::SessionLimits>>,
    recheck: Option<Recheck>,
    finish: Finish,
}

impl ParkedRelay {
    /// The relay returned: the session is over, or it parks.
    fn ended(mut self, c: &mut Client, run: Result<Outcome, crate::relay::Paused>) {
        match run {
            Ok(out) => {
                let ParkedRelay {
                    attached,
                    srv,
                    limits,
                    finish,
                    ..
                } = self;
                finish.apply(c, out, limits.as_deref());
                drop(attached);
                c.srv = Some(srv);
            }
            Err(p) => {
                self.paused = Some(p);
                c.parked = Some(Box::new(self));
            }
        }
    }
}

impl crate::client::Tail for ParkedRelay {
    fn fds<'a>(&'a self, cli: &'a Stream) -> Vec<std::os::fd::BorrowedFd<'a>> {
        use std::os::fd::AsFd;
        let mut v = Vec::with_capacity(2);
        if let Some(p) = &self.paused {
            if p.watch_client() {
                v.push(cli.as_fd());
            }
            if p.watch_server() {
                v.push(self.srv.as_fd());
            }
        }
        v
    }

    fn deadline(&self) -> std::time::Instant {
        match &self.paused {
            Some(p) => p.deadline(&self.opts),
            None => std::time::Instant::now(),
        }
    }

    fn generation(&self) -> u64 {
        self.paused
            .as_ref()
            .map_or_else(crate::generation::generation, |p| p.generation())
    }

    fn resume(
        mut self: Box<Self>,
        c: &mut Client,
        how: crate::client::Resumed,
    ) -> crate::parent::Next {
        if !how.may_park {
            self.opts.linger = None;
        }
        let from = self.paused.take();
        let run = run_logged(
            c,
            &self.srv,
            &self.opts,
            self.limits.as_deref(),
            self.recheck.as_ref(),
            from,
        );
        self.ended(c, run);
        c.next()
    }
}

/// Ask the access layer about `req` for the client; keep what the grant
/// says for the session ([`keep`]) and what to check again after a
/// reload (`force`), from the settings the client was accepted with.
pub fn admit(c: &mut Client, req: &Request<'_>) -> Result<(Grant, Recheck), Res> {
    // The head or login is in: what follows is not the client's to be
    // quick with (an auth server's answer, the connection).
    c.live.busy();
    let svc = c.svc().clone();
    let grant = access::authorize(&svc, req)?;
    keep(c, &grant);
    let again = Recheck::new(&svc, req)
        .since(c.generation)
        .at_weight(grant.weight);
    Ok((grant, again))
}

/// Keep what a grant says for the session: `nolog` drops its record, and
/// a name from `auth dnsname` or the auth cache is the one logged.
pub fn keep(c: &mut Client, grant: &Grant) {
    c.record.set_nolog(grant.nolog);
    if grant.user.is_some() {
        c.user.clone_from(&grant.user);
    }
    c.publish();
    c.granted(grant);
}

/// A connection reached its destination through `chain`: the hops and
/// addresses its record shows, and one connect more (TrafficPlugin's `p`
/// form). Straight to the destination, the peer is the address connected
/// to (no getpeername()): the one asked for, or its other family's after
/// happy eyeballs.
pub fn note_chain(c: &mut Client, chain: &crate::chain::Chain) {
    c.record.ops.connects += 1;
    c.hops = c.local_hops + chain.hops;
    c.remote_addr = chain.peer_addr();
    c.ext_addr = chain.stream.local_addr();
    c.publish();
}

/// [`note_chain`] for a handler that leaves the stream in `c.srv` (or
/// relays it with [`relay_to`], which does) until the record is written:
/// our address on it is asked for then, and only if there is a log
/// (`Client::ext_from_srv`).
pub fn note_chain_ext_later(c: &mut Client, chain: &crate::chain::Chain) {
    c.record.ops.connects += 1;
    c.hops = c.local_hops + chain.hops;
    c.remote_addr = chain.peer_addr();
    c.ext_addr = None;
    c.ext_from_srv = true;
    c.publish();
}
