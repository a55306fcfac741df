//! `socks`: SOCKS 4, 4a and 5 (3proxy's socks.c, socks(8); RFC 1928,
//! RFC 1929). CONNECT, BIND and UDP ASSOCIATE; addresses IPv4, IPv6 and
//! names; methods "no authentication" and "username/password".
//!
//! The request is read with short per-byte timeouts (BYTE_LONG for the
//! first byte of each message, BYTE_SHORT after it), checked with
//! `access::authorize`, and answered with the reply code 3proxy derives
//! from its result code (`socks::v5_rep`). The wire format, the reader of
//! the client's handshake included, is in `proto::socks`, shared with the
//! parent chain.
//!
//! Who is owed a reply: nothing before the version byte is known (an
//! unknown version just closes); a SOCKS5 client whose greeting is cut
//! short just closes too, one with no acceptable method gets `05 FF`, one
//! whose RFC 1929 credentials the `auth` chain is sure to refuse
//! (`access::refuses_credentials`) gets `01 01`. From the request on,
//! every refusal is a reply in the client's version (`00 5B` or
//! `05 REP`), then the connection closes. Once the first reply
//! has said "granted", later failures (a BIND peer that never comes, a bad
//! UDP datagram) end the session with only a log record, except the BIND
//! second reply, which RFC 1928 sends for failure as well.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::socket::MsgFlags;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::access::{self, Grant, Op, Recheck, Request};
use crate::chain;
use crate::client::Client;
use crate::net::Stream;
use crate::parent;
use crate::proto::socks::{
    parse_udp_header, read_from, udp_header, v4_reply, v5_rep, v5_reply, Ask, Dest, Peer, Reader,
    Source, CMD_BIND, CMD_CONNECT,
};
use crate::res::Res;
use crate::resolve::resolve;
use crate::session::{DestAt, Park};
use crate::timeouts::Timeouts;
use crate::udprelay::{self, Step};

// --- Reading the request ---------------------------------------------------

/// The client's socket as the handshake's [`Source`]. A read first tries
/// without waiting, so the socket's timeout is set only when the reader
/// really has to wait (a setsockopt() per change otherwise).
struct Socket<'a> {
    s: &'a Stream,
    /// The read timeout now set on the socket (None: none yet).
    now: Option<Duration>,
}

impl Source for Socket<'_> {
    fn recv(&mut self, room: &mut [u8], wait: Duration) -> io::Result<usize> {
        // With the right timeout set already, one blocking recv() does
        // it (it returns at once with what is there).
        let first = if self.now == Some(wait) {
            MsgFlags::empty()
        } else {
            MsgFlags::MSG_DONTWAIT
        };
        match recv(self.s, room, first) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !first.is_empty() => {
                if self.now != Some(wait) {
                    let _ = self.s.set_read_timeout(Some(wait));
                    self.now = Some(wait);
                }
                recv(self.s, room, MsgFlags::empty())
            }
            r => r,
        }
    }
}

/// recv() with flags; through the session for a TLS client.
fn recv(s: &Stream, buf: &mut [u8], flags: MsgFlags) -> io::Result<usize> {
    s.recv_flags(buf, flags)
}

/// Write a handshake message. Its few bytes fit the empty send buffer of
/// a new connection, so they go without waiting and without a timeout to
/// set; only if they do not (a peer that stopped reading after flooding
/// us) does the write wait, for at most STRING_SHORT.
fn send_small(c: &Client, bytes: &[u8]) -> io::Result<()> {
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let sent = loop {
        match c.cli.send_flags(&[io::IoSlice::new(bytes)], flags) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 0,
            r => break r?,
        }
    };
    if sent == bytes.len() {
        return Ok(());
    }
    let wait = c.svc().timeouts.get(Timeouts::STRING_SHORT);
    socket2::SockRef::from(&c.cli).set_write_timeout(Some(wait))?;
    let mut w = &c.cli;
    w.write_all(&bytes[sent..])
}

impl Peer for &Client {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        send_small(self, bytes)
    }

    fn refuses(&self, user: &str, password: &str) -> Option<Res> {
        let req = Request {
            client: self.client_addr,
            local: self.local_addr,
            user: Some(user),
            password: Some(password),
            ..Request::default()
        };
        access::refuses_credentials(self.svc(), &req)
    }
}

/// Read the greeting and request. `ver` becomes the version once it is
/// known; `owed` becomes true once the client is owed a reply to its
/// request in that version; `refused` gets the user name of a SOCKS5
/// client refused in its username/password sub-negotiation (to log).
fn read_request(
    c: &Client,
    early: &[u8],
    known: Option<Duration>,
    needuser: u32,
    ver: &mut Option<u8>,
    owed: &mut bool,
    refused: &mut Option<String>,
) -> Result<Ask, Res> {
    // `known`: the receive timeout the socket has now, if known (from
    // its listener: `Client::cli_read_timeout`).
    let known = known.filter(|_| early.is_empty());
    let t = &c.svc().timeouts;
    let src = Socket {
        s: &c.cli,
        now: known,
    };
    let (long, short) = (t.get(Timeouts::BYTE_LONG), t.get(Timeouts::BYTE_SHORT));
    let mut r = Reader::new(src, early, long, short);
    read_from(&mut r, &mut { c }, needuser, ver, owed, refused)
}

// --- Serving ---------------------------------------------------------------

/// The client thread's work for one SOCKS client.
pub fn serve(c: &mut Client, early: &[u8], _: Option<&parent::Known>) -> parent::Next {
    serve_request(c, early);
    c.next()
}

fn serve_request(c: &mut Client, early: &[u8]) {
    let svc = c.svc().clone();
    let needuser = svc.opts.needuser.unwrap_or(1);
    let (mut ver, mut owed, mut refused) = (None, false, None);
    // The timeout the socket has from the listener (taken: this handler
    // is the first to read it, and sets others).
    let known = c.cli_read_timeout.take();
    let ask = read_request(c, early, known, needuser, &mut ver, &mut owed, &mut refused);
    c.service_name = match ver {
        Some(4) => Some("SOCK4"),
        Some(_) => Some("SOCK5"),
        None => None,
    };
    let ask = match ask {
        Ok(a) => {
            // The request is in: busy (the auth and the connection are
            // not the client's to be quick with).
            c.live.busy();
            a
        }
        Err(res) => {
            c.record.res = res;
            if refused.is_some() {
                c.user = refused;
            }
            if let (Some(ver), true) = (ver, owed) {
                refuse(c, ver, res);
            }
            return;
        }
    };
    if ask.ver == 4 && matches!(ask.dest, Dest::Name(..)) {
        c.service_name = Some("SOC45");
    }
    c.user = ask.user.clone();
    let verb = match ask.cmd {
        CMD_CONNECT => "CONNECT ",
        CMD_BIND => "BIND ",
        _ => "UDPMAP ",
    };
    c.record.text = ask.dest.text_after(verb);
    // An address is logged by `%n` as its printed form, as 3proxy's
    // socks.c keeps it as the request's host text.
    c.req_host = Some(host_text(&ask.dest));
    let res = match ask.cmd {
        CMD_CONNECT => connect(c, &ask),
        CMD_BIND => bind(c, &ask),
        _ => udp_associate(c, &ask),
    };
    if let Err(res) = res {
        c.record.res = res;
        refuse(c, ask.ver, res);
    }
}

/// Send a reply. `bnd` None: the client socket's local address.
fn reply(c: &Client, ver: u8, res: Res, bnd: Option<SocketAddr>) {
    let unspec = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let bnd = bnd.or(c.local_addr).unwrap_or(unspec);
    let _ = if ver == 5 {
        send_small(c, &v5_reply(v5_rep(res), bnd))
    } else {
        send_small(c, &v4_reply(res == Res::OK, bnd))
    };
}

/// A refusal carries no address: 0.0.0.0:0.
fn refuse(c: &Client, ver: u8, res: Res) {
    let unspec = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    reply(c, ver, res, Some(unspec));
}

/// Resolve a destination: a name through the resolver, an address as is.
/// A name that no DNS name can be (over 253 bytes) is not looked up.
fn resolve_dest(c: &Client, dest: &Dest) -> Result<SocketAddr, Res> {
    match dest {
        Dest::Addr(a) => Ok(*a),
        Dest::Name(h, _) if h.len() > 253 => Err(Res::NOHOST),
        Dest::Name(h, p) => resolve(h, *p, c.svc().family),
    }
}

/// Authorize `op` to `dest` (resolved to `addr`); `None` authorizes the
/// client alone (a UDP association before its first datagram, 3proxy's
/// preauth).
fn authorize(
    c: &Client,
    ask: &Ask,
    op: Op,
    dest: Option<(&Dest, SocketAddr)>,
    weight: u32,
) -> Result<Grant, Res> {
    let req = Request {
        host: match dest {
            Some((Dest::Name(h, _), _)) => Some(h.as_str()),
            _ => None,
        },
        addr: dest.map(|(_, a)| a.ip()),
        port: dest.map_or(0, |(d, _)| d.port()),
        user: ask.user.as_deref(),
        password: ask.password.as_deref(),
        ..c.request(op)
    };
    access::authorize_at(c.svc(), &req, weight)
}

/// The request's host as 3proxy's socks.c keeps it: the name, or the
/// address printed.
fn host_text(dest: &Dest) -> String {
    match dest {
        Dest::Name(n, _) => n.clone(),
        Dest::Addr(a) => crate::addr::ip_text(a.ip()),
    }
}

/// What to check again after a reload (`force`) for a CONNECT or BIND.
fn recheck(c: &Client, ask: &Ask, op: Op, dest: (&Dest, SocketAddr)) -> Recheck {
    let req = Request {
        host: match dest.0 {
            Dest::Name(h, _) => Some(h.as_str()),
            Dest::Addr(_) => None,
        },
        addr: Some(dest.1.ip()),
        port: dest.0.port(),
        user: ask.user.as_deref(),
        password: ask.password.as_deref(),
        ..c.request(op)
    };
    Recheck::new(c.svc(), &req).since(c.generation)
}

fn connect(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    let dst = resolve_dest(c, &ask.dest)?;
    c.req_addr = Some(dst);
    if dst.port() == 0 {
        return Err(Res::SOCKS_PORT_ZERO);
    }
    if dst.ip().is_unspecified() {
        // 0.0.0.0 would reach this host on Linux: never a destination.
        return Err(Res::SOCKS_NULL_ADDR);
    }
    let grant = authorize(c, ask, Op::Connect, Some((&ask.dest, dst)), 0)?;
    crate::session::keep(c, &grant);
    if crate::net::Addr::Ip(dst) == svc.listen || Some(dst) == c.local_addr {
        return Err(Res::LOOP);
    }
    let want = chain::Want {
        addr: Some(dst),
        host: match &ask.dest {
            Dest::Name(h, _) => Some(h.as_str()),
            Dest::Addr(_) => None,
        },
        user: ask.user.as_deref(),
        password: ask.password.as_deref(),
        client: c.client_addr,
        local: c.local_addr,
    };
    let (srv, peer) = match chain::connect(&svc, &grant.parents, &want)? {
        chain::Route::Stream(chain) => {
            c.hops = c.local_hops + chain.hops;
            (chain.stream, chain.peer)
        }
        chain::Route::Local { kind, hops } => {
            // Say "granted", then the rest of the connection is the next
            // handler's (3proxy's childfunc going on), with what the client
            // sent after its request and the destination it asked for.
            let name = match &ask.dest {
                Dest::Name(h, _) => Some(h.clone()),
                Dest::Addr(_) => None,
            };
            c.hand_over(parent::Handoff::to(
                kind,
                hops,
                ask.early.clone(),
                name,
                dst,
            ))?;
            reply(c, ask.ver, Res::OK, None);
            return Ok(());
        }
    };
    // Straight to the destination: the address connected to (the other
    // family's after happy eyeballs), no getpeername() needed.
    c.remote_addr = peer.or_else(|| srv.peer_addr());
    c.record.ops.connects += 1;
    c.ext_addr = srv.local_addr();
    // `ssl_cli`: TLS with the destination before the reply (modes 0, 1;
    // a failure is refused as any other) or after it (mode 2).
    let mut srv = srv;
    let host = match &ask.dest {
        Dest::Name(h, _) => h.clone(),
        Dest::Addr(_) => crate::addr::ip_text(dst.ip()),
    };
    crate::session::tls_to_dest(c, &mut srv, &host, DestAt::Reached, true)?;
    let bnd = nat(svc.opts.nat_ext, c.ext_addr);
    reply(c, ask.ver, Res::OK, bnd);
    if let Err(res) = crate::session::tls_to_dest(c, &mut srv, &host, DestAt::Answered, true) {
        // The reply said "granted": nothing more goes to the client.
        c.record.res = res;
        c.srv = Some(srv);
        return Ok(());
    }
    if let Err(res) = crate::session::intercept(c, &mut srv, &host_text(&ask.dest), &ask.early) {
        // The reply said "granted": nothing more goes to the client.
        c.record.res = res;
        c.srv = Some(srv);
        return Ok(());
    }
    if svc.mitm.is_some() {
        // `ssl_mitm`: HTTP inside is served by the HTTP proxy.
        let inside = crate::services::proxy::Inside {
            host,
            port: dst.port(),
            addr: dst,
            user: ask.user.clone(),
            password: ask.password.clone(),
        };
        let hops = c.hops.saturating_sub(c.local_hops);
        match crate::services::proxy::serve_inside(c, srv, inside, &grant.parents, hops) {
            Some(back) => srv = back,
            None => return Ok(()),
        }
    }
    let again = recheck(c, ask, Op::Connect, (&ask.dest, dst)).at_weight(grant.weight);
    // The client has its reply only now: the relay waits for its bytes.
    crate::session::relay_to(
        c,
        srv,
        &grant,
        &again,
        &ask.early,
        Timeouts::CONNECTION_LONG,
        Park::AfterReply,
    );
    Ok(())
}

/// `-Ne`/`-Ni`/`-N`: report `nat`'s address instead of ours (IP-to-IP
/// NAT), keeping the port.
fn nat(nat: Option<IpAddr>, addr: Option<SocketAddr>) -> Option<SocketAddr> {
    let addr = addr?;
    Some(match nat {
        Some(ip) => SocketAddr::new(ip, addr.port()),
        None => addr,
    })
}

fn bind(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    // The destination of a BIND is the peer expected to connect in; an
    // unspecified address (or port) accepts anyone.
    let want = resolve_dest(c, &ask.dest)?;
    c.req_addr = Some(want);
    let grant = authorize(c, ask, Op::Bind, Some((&ask.dest, want)), 0)?;
    crate::session::keep(c, &grant);
    // Listen on our external address if one is set, else on the address
    // the client reached us on, any port; and report the address really
    // bound (3proxy reports its own service port here, which breaks BIND
    // clients).
    let local_ip = c
        .local_addr
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let ext = match local_ip {
        IpAddr::V4(_) => svc.dialer.ext4,
        IpAddr::V6(_) => svc.dialer.ext6,
    };
    let ip = ext.filter(|e| !e.is_unspecified()).unwrap_or(local_ip);
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|_| Res::BIND)?;
    let bound = l.local_addr().map_err(|_| Res::BIND)?;
    c.ext_addr = Some(bound);
    reply(c, ask.ver, Res::OK, nat(svc.opts.nat_ext, Some(bound)));
    match accept_peer(c, &l, want) {
        Ok(srv) => {
            reply(c, ask.ver, Res::OK, srv.peer_addr());
            let again = recheck(c, ask, Op::Bind, (&ask.dest, want)).at_weight(grant.weight);
            crate::session::relay_to(
                c,
                srv,
                &grant,
                &again,
                &ask.early,
                Timeouts::CONNECTION_SHORT,
                Park::WhenQuiet,
            );
        }
        Err(res) => {
            c.record.res = res;
            // RFC 1928: the second reply also reports a failure. A client
            // that closed or spoke first gets nothing.
            if res != Res::SOCKS_BIND_NO_PEER {
                refuse(c, ask.ver, res);
            }
        }
    }
    Ok(())
}

/// Wait up to CONNECTION_LONG for one peer on `l`. Activity or EOF on the
/// control connection first means the client gave up (460).
fn accept_peer(c: &mut Client, l: &TcpListener, want: SocketAddr) -> Result<Stream, Res> {
    let limit = c.svc().timeouts.get(Timeouts::CONNECTION_LONG);
    let start = Instant::now();
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Res::SOCKS_BIND_NO_PEER);
        }
        let mut fds = [
            PollFd::new(l.as_fd(), PollFlags::POLLIN),
            PollFd::new(c.cli.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, poll_ms(left)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return Err(Res::POLL),
        }
        let peer_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
        let cli_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
        if cli_ready && !peer_ready {
            return Err(Res::SOCKS_BIND_NO_PEER);
        }
        if peer_ready {
            break;
        }
    }
    let (peer, paddr) = l.accept().map_err(|_| Res::SOCKS_BIND_ACCEPT)?;
    c.remote_addr = Some(paddr);
    if !want.ip().is_unspecified() && want.ip() != paddr.ip() {
        return Err(Res::SOCKS_BIND_WRONG_PEER);
    }
    let _ = peer.set_nodelay(true);
    Ok(Stream::Tcp(peer))
}

/// A poll timeout for `d`, at most i32::MAX ms.
fn poll_ms(d: Duration) -> PollTimeout {
    let ms = d.as_millis().clamp(1, i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// `-U` bits: log a record per destination change (1), authorize every
/// new destination (2). The default is both.
const UDP_LOG: u32 = 1;
const UDP_AUTH: u32 = 2;

/// UDP ASSOCIATE: relay datagrams between the client and any destination
/// it names, until the control connection closes or the association is
/// idle for CONNECTION_LONG.
fn udp_associate(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    // Its records are datagram ones (TrafficPlugin's `udp` rules).
    c.record.datagram = true;
    // Authorize the association itself (no destination yet): 3proxy's
    // preauth; the destinations are checked as the datagrams name them.
    let grant = authorize(c, ask, Op::UdpAssoc, None, 0)?;
    crate::session::keep(c, &grant);
    // Parents: the association is made with the chain's last hop (a
    // socks5 parent), whose relay then carries the datagrams.
    let want = chain::Want {
        user: ask.user.as_deref(),
        password: ask.password.as_deref(),
        client: c.client_addr,
        local: c.local_addr,
        ..chain::Want::default()
    };
    let up = chain::udp_associate(&svc, &grant.parents, &want)?;
    let local = c.local_addr.ok_or(Res::PEERNAME)?;
    let client_ip = c.client_addr.map(|a| a.ip()).ok_or(Res::PEERNAME)?;
    let near = UdpSocket::bind(SocketAddr::new(local.ip(), 0)).map_err(|_| Res::BIND)?;
    // The far socket speaks the family of the parent's relay, or else
    // that of the client's side.
    let far_v4 = match &up {
        Some(u) => u.relay.is_ipv4(),
        None => local.is_ipv4(),
    };
    let far_ip = match (far_v4, up.as_ref().and_then(|u| u.source)) {
        (true, Some(ip @ IpAddr::V4(_))) | (false, Some(ip @ IpAddr::V6(_))) => ip,
        (true, _) => svc.dialer.ext4.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        (false, _) => svc.dialer.ext6.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    let far = UdpSocket::bind(SocketAddr::new(far_ip, 0)).map_err(|_| Res::BIND)?;
    let near_addr = near.local_addr().map_err(|_| Res::BIND)?;
    c.ext_addr = far.local_addr().ok();
    if near.set_nonblocking(true).is_err() || far.set_nonblocking(true).is_err() {
        return Err(Res::SOCKET);
    }
    reply(c, ask.ver, Res::OK, nat(svc.opts.nat_int, Some(near_addr)));
    // The client may name the port it will send from.
    let client_port = match &ask.dest {
        Dest::Addr(a) if a.ip() == client_ip && a.port() != 0 => Some(a.port()),
        _ => None,
    };
    let again = Recheck::new(
        &svc,
        &Request {
            user: ask.user.as_deref(),
            password: ask.password.as_deref(),
            ..c.request(Op::UdpAssoc)
        },
    )
    .since(c.generation)
    .at_weight(grant.weight);
    let opts = udprelay::Opts {
        idle: svc.timeouts.get(Timeouts::CONNECTION_LONG),
        idle_on_out: true,
        single: false,
        limits: grant.limits.as_deref(),
        recheck: Some(&again),
        since: c.generation,
    };
    let mut u = Udp {
        near,
        far,
        client_ip,
        client_port,
        mode: svc.opts.udp_mode.unwrap_or(UDP_LOG | UDP_AUTH),
        weight: grant.weight,
        last: None,
        up: up.map(|u| {
            c.hops = c.local_hops + u.hops;
            (u.control, u.relay)
        }),
        c,
        ask,
    };
    // The bytes are counted in the record as they pass (a record per
    // destination takes its own), not from the relay's totals.
    let res = udprelay::relay(&mut u, &opts, &mut udprelay::Counts::default());
    u.c.record.res = res;
    Ok(())
}

/// One association's sockets and state.
struct Udp<'a> {
    /// Faces the client; `far` faces the destinations.
    near: UdpSocket,
    far: UdpSocket,
    client_ip: IpAddr,
    /// Fixed by the request or by the first datagram.
    client_port: Option<u16>,
    mode: u32,
    /// The association's ACL weight, carried from check to check.
    weight: u32,
    /// The current destination, where it resolved to, and whether it was
    /// allowed.
    last: Option<(Dest, SocketAddr, bool)>,
    /// Through a socks5 parent: its control connection and UDP relay.
    /// Datagrams then go to the relay with their SOCKS header as the
    /// client wrote it, and come back from it with the parent's header.
    up: Option<(Stream, SocketAddr)>,
    c: &'a mut Client,
    ask: &'a Ask,
}

impl udprelay::Assoc for Udp<'_> {
    fn client_fd(&self) -> BorrowedFd<'_> {
        self.near.as_fd()
    }

    fn dest_fd(&self) -> BorrowedFd<'_> {
        self.far.as_fd()
    }

    /// The client's control connection, then the parent's.
    fn control_fd(&self, i: usize) -> Option<BorrowedFd<'_>> {
        match i {
            0 => Some(self.c.cli.as_fd()),
            _ => self.up.as_ref().map(|(s, _)| s.as_fd()),
        }
    }

    fn controlled(&mut self, i: usize) -> Res {
        match i {
            // Any byte or EOF on the control connection ends it.
            0 => Res::OK,
            // The parent ended the association.
            _ => Res::PARENT_NO_UDP,
        }
    }

    fn outbound(&mut self, buf: &mut [u8]) -> Step {
        let (n, from) = match self.near.recv_from(buf) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Step::Stray,
            Err(_) => return Step::Empty,
        };
        if from.ip() != self.client_ip || self.client_port.is_some_and(|p| p != from.port()) {
            return Step::Stray;
        }
        self.client_port = Some(from.port());
        let (dest, off) = match parse_udp_header(&buf[..n]) {
            Ok(x) => x,
            Err(res) => return Step::End(res),
        };
        let Some(dst) = self.route(dest) else {
            return Step::Moved(0);
        };
        let sent = match self.up.as_ref().map(|u| u.1) {
            Some(r) => self.far.send_to(&buf[..n], r),
            None => self.far.send_to(&buf[off..n], dst),
        };
        if n > off && sent.is_ok() {
            self.c.record.bytes_out += (n - off) as u64;
            self.c.record.ops.writes += 1;
            return Step::Moved(n - off);
        }
        Step::Moved(0)
    }

    fn inbound(&mut self, buf: &mut [u8]) -> Step {
        const HDR: usize = udprelay::HEADROOM;
        let (n, src) = match self.far.recv_from(&mut buf[HDR..]) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Step::Stray,
            Err(_) => return Step::Empty,
        };
        let Some(port) = self.client_port else {
            return Step::Stray;
        };
        let to = SocketAddr::new(self.client_ip, port);
        if let Some((_, r)) = &self.up {
            // From the parent's relay only; its header stays.
            if src != *r {
                return Step::Stray;
            }
            let Ok((_, off)) = parse_udp_header(&buf[HDR..HDR + n]) else {
                return Step::Stray;
            };
            if self.near.send_to(&buf[HDR..HDR + n], to).is_ok() {
                self.c.record.bytes_in += (n - off) as u64;
                self.c.record.ops.reads += 1;
                return Step::Moved(n - off);
            }
            return Step::Moved(0);
        }
        let h = udp_header(src);
        let start = HDR - h.len();
        buf[start..HDR].copy_from_slice(&h);
        if self.near.send_to(&buf[start..HDR + n], to).is_ok() {
            self.c.record.bytes_in += n as u64;
            self.c.record.ops.reads += 1;
            return Step::Moved(n);
        }
        Step::Moved(0)
    }
}

impl Udp<'_> {
    /// Write a record for the destination so far; the association's own
    /// record still comes when it ends.
    fn record(&mut self) {
        self.c.end_record();
        self.c.record.open();
    }

    /// Where a datagram for `dest` goes, or None to drop it. A new
    /// destination is resolved and, per `-U`, authorized and logged; the
    /// first one always is both.
    fn route(&mut self, dest: Dest) -> Option<SocketAddr> {
        if let Some((d, a, ok)) = &self.last {
            if *d == dest {
                return ok.then_some(*a);
            }
        }
        let first = self.last.is_none();
        let left_allowed = self.last.as_ref().is_some_and(|l| l.2);
        if left_allowed && self.mode & UDP_LOG != 0 {
            // The record of the destination we leave.
            self.record();
        }
        let addr = resolve_dest(self.c, &dest);
        let ok = match addr {
            Ok(a) if first || self.mode & UDP_AUTH != 0 => authorize(
                self.c,
                self.ask,
                Op::UdpAssoc,
                Some((&dest, a)),
                self.weight,
            )
            .map(|g| {
                self.weight = g.weight;
                a
            }),
            other => other,
        };
        self.c.record.text = format!("UDPMAP {}", dest.text());
        self.c.req_host = Some(host_text(&dest));
        let addr = addr.ok();
        self.c.req_addr = addr;
        self.c.remote_addr = addr;
        let pass = match ok {
            Ok(_) => true,
            Err(res) => {
                if self.mode & UDP_LOG != 0 || first {
                    self.c.record.res = res;
                    self.record();
                }
                false
            }
        };
        self.last = Some((
            dest,
            addr.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)),
            pass,
        ));
        pass.then_some(self.last.as_ref()?.1)
    }
}
