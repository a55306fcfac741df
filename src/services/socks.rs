//! `socks`: SOCKS 4, 4a and 5 (3proxy's socks.c, socks(8); RFC 1928,
//! RFC 1929). CONNECT, BIND and UDP ASSOCIATE; addresses IPv4, IPv6 and
//! names; methods "no authentication" and "username/password".
//!
//! The request is read with short per-byte timeouts (BYTE_LONG for the
//! first byte, BYTE_SHORT after it), checked with `access::authorize`, and
//! answered with the reply code 3proxy derives from its result code. The
//! wire helpers at the top are pure and unit-tested; the IO is below them.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::access::{self, Op, Request};
use crate::client::Client;
use crate::conf::Timeouts;
use crate::net::{resolve, Stream};
use crate::relay::{relay, RelayOpts};
use crate::res::Res;

// --- Wire format (pure) ---------------------------------------------------

/// A SOCKS destination: an address, or a name and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    Addr(SocketAddr),
    Name(String, u16),
}

impl Dest {
    pub fn port(&self) -> u16 {
        match self {
            Dest::Addr(a) => a.port(),
            Dest::Name(_, p) => *p,
        }
    }

    /// `host:port` as the log's %T shows it.
    pub fn text(&self) -> String {
        match self {
            Dest::Addr(a) => a.to_string(),
            Dest::Name(n, p) => format!("{n}:{p}"),
        }
    }
}

/// The SOCKS5 reply code for a 3proxy result code (socks.c's mapping).
pub fn v5_rep(res: Res) -> u8 {
    match res.0 {
        0 => 0,
        1..=10 => 2,
        11..=19 => 5,
        20..=29 => 1,
        30..=100 => 4,
        997 => 8,
        n => (n % 10) as u8,
    }
}

/// A SOCKS5 reply: VER REP RSV ATYP BND.ADDR BND.PORT.
pub fn v5_reply(rep: u8, bnd: SocketAddr) -> Vec<u8> {
    let mut b = vec![5, rep, 0];
    put_addr(&mut b, bnd);
    b
}

/// A SOCKS4 reply: 0, 90 (granted) or 91, DSTPORT, DSTIP.
pub fn v4_reply(ok: bool, bnd: SocketAddr) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[1] = if ok { 90 } else { 91 };
    if let SocketAddr::V4(a) = bnd {
        b[2..4].copy_from_slice(&a.port().to_be_bytes());
        b[4..8].copy_from_slice(&a.ip().octets());
    }
    b
}

fn put_addr(b: &mut Vec<u8>, a: SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            b.push(1);
            b.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b.push(4);
            b.extend_from_slice(&ip.octets());
        }
    }
    b.extend_from_slice(&a.port().to_be_bytes());
}

/// Parse the header of a SOCKS5 UDP datagram: RSV(2) FRAG ATYP ADDR PORT.
/// Returns the destination and the offset of the payload.
pub fn parse_udp_header(d: &[u8]) -> Result<(Dest, usize), Res> {
    if d.len() < 4 {
        return Err(Res(484));
    }
    if d[2] != 0 {
        // Fragments are not supported: 3proxy ends the association.
        return Err(Res(483));
    }
    let (dest, end) = match d[3] {
        1 if d.len() >= 10 => {
            let ip = Ipv4Addr::new(d[4], d[5], d[6], d[7]);
            let port = u16::from_be_bytes([d[8], d[9]]);
            (Dest::Addr(SocketAddr::new(IpAddr::V4(ip), port)), 10)
        }
        4 if d.len() >= 22 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&d[4..20]);
            let port = u16::from_be_bytes([d[20], d[21]]);
            (Dest::Addr(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port)), 22)
        }
        3 if d.len() >= 5 => {
            let n = d[4] as usize;
            if d.len() < 5 + n + 2 {
                return Err(Res(484));
            }
            let name = std::str::from_utf8(&d[5..5 + n]).map_err(|_| Res(484))?;
            let port = u16::from_be_bytes([d[5 + n], d[6 + n]]);
            (Dest::Name(name.to_string(), port), 7 + n)
        }
        1 | 3 | 4 => return Err(Res(484)),
        _ => return Err(Res::NOTIMPL_ATYP),
    };
    Ok((dest, end))
}

/// The SOCKS5 UDP header for a datagram from `src`.
pub fn udp_header(src: SocketAddr) -> Vec<u8> {
    let mut b = vec![0, 0, 0];
    put_addr(&mut b, src);
    b
}

/// Pick the SOCKS5 method for the offered ones, given `needuser`
/// (`-u` = 0, default 1, `-u2` = 2). 0xFF: none acceptable.
pub fn choose_method(offered: &[u8], needuser: u32) -> u8 {
    let has = |m| offered.contains(&m);
    match needuser {
        0 if has(0) => 0,
        0 if has(2) => 2,
        1 if has(2) => 2,
        1 if has(0) => 0,
        2 if has(2) => 2,
        _ => 0xFF,
    }
}

// --- Reading the request ---------------------------------------------------

/// What the client asked for.
struct Ask {
    ver: u8,
    cmd: u8,
    dest: Dest,
    user: Option<String>,
    password: Option<String>,
}

/// Reads bytes with BYTE_LONG for the first and BYTE_SHORT after it,
/// mapping a short read to `code`.
struct Reader<'a> {
    s: &'a Stream,
    short: Duration,
}

impl Reader<'_> {
    fn byte(&mut self, code: u32) -> Result<u8, Res> {
        let mut b = [0u8; 1];
        self.exact(&mut b, code)?;
        Ok(b[0])
    }

    fn exact(&mut self, b: &mut [u8], code: u32) -> Result<(), Res> {
        let mut s = self.s;
        s.read_exact(b).map_err(|_| Res(code))?;
        let _ = self.s.set_timeout(Some(self.short));
        Ok(())
    }

    fn port(&mut self) -> Result<u16, Res> {
        let mut p = [0u8; 2];
        self.exact(&mut p, 441)?;
        Ok(u16::from_be_bytes(p))
    }

    /// A NUL-terminated string (SOCKS4 user id, 4a host name), at most 255.
    fn cstr(&mut self) -> Result<String, Res> {
        let mut out = Vec::new();
        loop {
            let b = self.byte(441)?;
            if b == 0 {
                break;
            }
            if out.len() >= 255 {
                return Err(Res(441));
            }
            out.push(b);
        }
        String::from_utf8(out).map_err(|_| Res(441))
    }
}

/// `stage` becomes Some(version) once the client has sent enough to be
/// owed a reply.
fn read_request(c: &mut Client, needuser: u32, stage: &mut Option<u8>) -> Result<Ask, Res> {
    let t = c.svc().timeouts;
    let _ = c.cli.set_timeout(Some(t.get(Timeouts::BYTE_LONG)));
    let mut r = Reader { s: &c.cli, short: t.get(Timeouts::BYTE_SHORT) };
    let ver = r.byte(401)?;
    match ver {
        4 => read_v4(&mut r, stage),
        5 => read_v5(&mut r, &c.cli, needuser, stage),
        _ => Err(Res(401)),
    }
}

fn read_v4(r: &mut Reader<'_>, stage: &mut Option<u8>) -> Result<Ask, Res> {
    let cmd = r.byte(441)?;
    *stage = Some(4);
    if cmd != 1 && cmd != 2 {
        return Err(Res(407));
    }
    let port = r.port()?;
    let mut ip = [0u8; 4];
    r.exact(&mut ip, 441)?;
    let user = r.cstr()?;
    let dest = if ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] != 0 {
        // SOCKS4a: the name follows the user id.
        Dest::Name(r.cstr()?, port)
    } else {
        Dest::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
    };
    Ok(Ask { ver: 4, cmd, dest, user: (!user.is_empty()).then_some(user), password: None })
}

fn read_v5(r: &mut Reader<'_>, s: &Stream, needuser: u32, stage: &mut Option<u8>) -> Result<Ask, Res> {
    let n = r.byte(441)? as usize;
    if n == 0 {
        let _ = (&*s).write_all(&[5, 0xFF]);
        return Err(Res(441));
    }
    let mut methods = vec![0u8; n];
    r.exact(&mut methods, 441)?;
    let m = choose_method(&methods, needuser);
    (&*s).write_all(&[5, m]).map_err(|_| Res(401))?;
    if m == 0xFF {
        return Err(Res(4));
    }
    let (mut user, mut password) = (None, None);
    if m == 2 {
        // RFC 1929. The answer is always success here; a wrong password is
        // refused on the request (REP 2), as 3proxy does.
        if r.byte(412)? != 1 {
            return Err(Res(412));
        }
        let ulen = r.byte(451)? as usize;
        let mut u = vec![0u8; ulen];
        r.exact(&mut u, 441)?;
        let plen = r.byte(445)? as usize;
        let mut p = vec![0u8; plen];
        r.exact(&mut p, 441)?;
        (&*s).write_all(&[1, 0]).map_err(|_| Res(481))?;
        user = Some(String::from_utf8_lossy(&u).into_owned());
        password = Some(String::from_utf8_lossy(&p).into_owned());
    }
    if r.byte(441)? != 5 {
        return Err(Res(401));
    }
    *stage = Some(5);
    let cmd = r.byte(441)?;
    if !(1..=3).contains(&cmd) {
        return Err(Res(407));
    }
    r.byte(447)?;
    let dest = match r.byte(441)? {
        1 => {
            let mut ip = [0u8; 4];
            r.exact(&mut ip, 441)?;
            Dest::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), r.port()?))
        }
        4 => {
            let mut ip = [0u8; 16];
            r.exact(&mut ip, 441)?;
            Dest::Addr(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), r.port()?))
        }
        3 => {
            let n = r.byte(451)? as usize;
            let mut name = vec![0u8; n];
            r.exact(&mut name, 441)?;
            let name = String::from_utf8(name).map_err(|_| Res(441))?;
            if name.is_empty() {
                return Err(Res(431));
            }
            Dest::Name(name, r.port()?)
        }
        _ => return Err(Res::NOTIMPL_ATYP),
    };
    Ok(Ask { ver: 5, cmd, dest, user, password })
}

// --- Serving ---------------------------------------------------------------

/// The client thread's work for one SOCKS client.
pub fn serve(c: &mut Client) {
    let svc = c.svc().clone();
    if svc.opts.proxy_header && !super::tcppm::read_proxy_header(c) {
        return;
    }
    c.service_name = Some("SOCKS");
    let needuser = svc.opts.needuser.unwrap_or(1);
    let mut stage = None;
    let ask = match read_request(c, needuser, &mut stage) {
        Ok(a) => a,
        Err(res) => {
            c.res = res;
            // A client that got as far as its request gets a refusal in its
            // own version; before that, the connection just closes.
            if let Some(ver) = stage {
                let ask = Ask { ver, cmd: 0, dest: Dest::Name(String::new(), 0), user: None, password: None };
                reply(c, &ask, res, None);
            }
            return;
        }
    };
    c.service_name = Some(match (ask.ver, &ask.dest) {
        (4, Dest::Name(..)) => "SOC45",
        (4, _) => "SOCK4",
        _ => "SOCK5",
    });
    c.user = ask.user.clone();
    let op = match ask.cmd {
        1 => Op::Connect,
        2 => Op::Bind,
        _ => Op::UdpAssoc,
    };
    c.text = format!(
        "{} {}",
        match op {
            Op::Connect => "CONNECT",
            Op::Bind => "BIND",
            _ => "UDPMAP",
        },
        ask.dest.text()
    );
    if let Dest::Name(n, _) = &ask.dest {
        c.req_host = Some(n.clone());
    }
    let res = match op {
        Op::Connect => connect(c, &ask),
        Op::Bind => bind(c, &ask),
        _ => udp_associate(c, &ask),
    };
    if let Err(res) = res {
        c.res = res;
        reply(c, &ask, res, None);
    }
}

/// Send the (first) reply. `bnd` None: the client socket's local address.
fn reply(c: &Client, ask: &Ask, res: Res, bnd: Option<SocketAddr>) {
    let svc = c.svc();
    let _ = c.cli.set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
    let unspec = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let bnd = bnd.or(c.local_addr).unwrap_or(unspec);
    let mut w = &c.cli;
    let _ = if ask.ver == 5 {
        w.write_all(&v5_reply(v5_rep(res), bnd))
    } else {
        w.write_all(&v4_reply(res == Res::OK, bnd))
    };
}

/// Resolve and authorize a destination; `None` authorizes the client alone
/// (a UDP association before its first datagram, 3proxy's preauth).
fn authorize(c: &mut Client, ask: &Ask, op: Op, dest: Option<&Dest>) -> Result<Option<SocketAddr>, Res> {
    let svc = c.svc().clone();
    let addr = match dest {
        Some(Dest::Addr(a)) => Some(*a),
        Some(Dest::Name(h, p)) => Some(resolve(h, *p, svc.family)?),
        None => None,
    };
    if dest.is_some() {
        c.req_addr = addr;
    }
    let req = Request {
        op: Some(op),
        client: c.client_addr,
        local: c.local_addr,
        host: match dest {
            Some(Dest::Name(h, _)) => Some(h.as_str()),
            _ => None,
        },
        addr: addr.map(|a| a.ip()),
        port: dest.map_or(0, Dest::port),
        user: ask.user.as_deref(),
        password: ask.password.as_deref(),
    };
    access::authorize(&svc, &req)?;
    Ok(addr)
}

fn connect(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    if ask.dest.port() == 0 {
        return Err(Res(461));
    }
    let dst = authorize(c, ask, Op::Connect, Some(&ask.dest))?.ok_or(Res::NOHOST)?;
    if crate::net::Addr::Ip(dst) == svc.listen || Some(dst) == c.local_addr {
        return Err(Res::LOOP);
    }
    let srv = svc.dialer.connect_ip(dst)?;
    c.remote_addr = srv.peer_addr();
    c.ext_addr = srv.local_addr();
    let bnd = nat(svc.opts.other.as_slice(), 'e', c.ext_addr);
    reply(c, ask, Res::OK, bnd);
    let out = relay(&c.cli, &srv, &relay_opts(c, Timeouts::CONNECTION_LONG));
    c.res = out.res;
    c.bytes_out = out.out;
    c.bytes_in = out.inb;
    c.srv = Some(srv);
    Ok(())
}

fn relay_opts(c: &Client, idle_slot: usize) -> RelayOpts {
    let svc = c.svc();
    RelayOpts {
        idle: svc.timeouts.get(idle_slot),
        session_end: svc.opts.session_end,
        splice: svc.splice(),
        bufsize: svc.bufsize,
        grace: svc.opts.grace,
    }
}

/// `-Ne<ip>` / `-Ni<ip>` / `-N<ip>`: the address reported to the client
/// instead of ours (NAT), keeping the port.
fn nat(other: &[String], which: char, addr: Option<SocketAddr>) -> Option<SocketAddr> {
    let addr = addr?;
    for o in other {
        let Some(v) = o.strip_prefix("-N") else { continue };
        let v = match v.chars().next() {
            Some(w) if (w == 'e' || w == 'i') && w == which => &v[1..],
            Some('e' | 'i') => continue,
            _ => v,
        };
        if let Some(ip) = crate::net::parse_ip(v) {
            return Some(SocketAddr::new(ip, addr.port()));
        }
    }
    Some(addr)
}

fn bind(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    authorize(c, ask, Op::Bind, None)?;
    // Listen on our external address (or the one the client reached us
    // on), any port; report the address really bound (3proxy reports its
    // own service port here, which breaks BIND clients).
    let local_ip = c.local_addr.map(|a| a.ip()).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let ip = match local_ip {
        IpAddr::V4(_) => svc.dialer.ext4.unwrap_or(local_ip),
        IpAddr::V6(_) => svc.dialer.ext6.unwrap_or(local_ip),
    };
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|_| Res::BIND)?;
    let bound = l.local_addr().map_err(|_| Res::BIND)?;
    reply(c, ask, Res::OK, nat(&svc.opts.other, 'e', Some(bound)));
    // Wait for one peer; activity or EOF on the control connection first
    // means the client gave up (460).
    let limit = svc.timeouts.get(Timeouts::CONNECTION_LONG);
    let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN), PollFd::new(c.cli.as_fd(), PollFlags::POLLIN)];
    let ms = limit.as_millis().min(i32::MAX as u128) as i32;
    match poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)) {
        Ok(0) => return Err(Res(460)),
        Ok(_) => {}
        Err(_) => return Err(Res::POLL),
    }
    if fds[1].revents().is_some_and(|r| !r.is_empty()) && !fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
        return Err(Res(460));
    }
    let (peer, paddr) = l.accept().map_err(|_| Res(462))?;
    if let Dest::Addr(want) = ask.dest {
        if !want.ip().is_unspecified() && want.ip() != paddr.ip() {
            return Err(Res(470));
        }
    }
    let _ = peer.set_nodelay(true);
    c.remote_addr = Some(paddr);
    c.ext_addr = Some(bound);
    reply(c, ask, Res::OK, Some(paddr));
    let srv = Stream::Tcp(peer);
    let out = relay(&c.cli, &srv, &relay_opts(c, Timeouts::CONNECTION_SHORT));
    c.res = out.res;
    c.bytes_out = out.out;
    c.bytes_in = out.inb;
    c.srv = Some(srv);
    Ok(())
}

/// UDP ASSOCIATE: relay datagrams between the client and any destination
/// it names, until the control connection closes or goes idle.
fn udp_associate(c: &mut Client, ask: &Ask) -> Result<(), Res> {
    let svc = c.svc().clone();
    // Authorize the association itself (no destination yet): 3proxy's
    // preauth; every datagram's destination is checked below.
    authorize(c, ask, Op::UdpAssoc, None)?;
    let local = c.local_addr.ok_or(Res::PEERNAME)?;
    let client_ip = c.client_addr.map(|a| a.ip()).ok_or(Res::PEERNAME)?;
    let near = UdpSocket::bind(SocketAddr::new(local.ip(), 0)).map_err(|_| Res::BIND)?;
    let far_ip = match local.ip() {
        IpAddr::V4(_) => svc.dialer.ext4.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        IpAddr::V6(_) => svc.dialer.ext6.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    let far = UdpSocket::bind(SocketAddr::new(far_ip, 0)).map_err(|_| Res::BIND)?;
    let near_addr = near.local_addr().map_err(|_| Res::BIND)?;
    c.ext_addr = far.local_addr().ok();
    reply(c, ask, Res::OK, nat(&svc.opts.other, 'i', Some(near_addr)));
    let _ = near.set_nonblocking(true);
    let _ = far.set_nonblocking(true);
    // The client may name the port it will send from.
    let mut client_port = match &ask.dest {
        Dest::Addr(a) if a.ip() == client_ip && a.port() != 0 => Some(a.port()),
        _ => None,
    };
    let idle = svc.timeouts.get(Timeouts::CONNECTION_LONG);
    let idle_ms = idle.as_millis().min(i32::MAX as u128) as i32;
    let mut buf = vec![0u8; 65536 + 300];
    let mut data = vec![0u8; 65536];
    let mut last_dest: Option<(Dest, SocketAddr)> = None;
    let mut last_activity = Instant::now();
    loop {
        let mut fds = [
            PollFd::new(c.cli.as_fd(), PollFlags::POLLIN),
            PollFd::new(near.as_fd(), PollFlags::POLLIN),
            PollFd::new(far.as_fd(), PollFlags::POLLIN),
        ];
        let left = idle.saturating_sub(last_activity.elapsed()).as_millis().min(idle_ms as u128) as i32;
        match poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)) {
            Ok(0) => {
                c.res = Res::IDLE;
                return Ok(());
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return Err(Res::POLL),
        }
        let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
        let (ctl, from_client, from_server) = (ready(0), ready(1), ready(2));
        if ctl {
            // Any byte or EOF on the control connection ends it.
            c.res = Res::OK;
            return Ok(());
        }
        if from_client {
            while let Ok((n, from)) = near.recv_from(&mut buf) {
                if from.ip() != client_ip || client_port.is_some_and(|p| p != from.port()) {
                    continue;
                }
                client_port = Some(from.port());
                last_activity = Instant::now();
                let (dest, off) = parse_udp_header(&buf[..n])?;
                let dst = match &last_dest {
                    Some((d, a)) if *d == dest => *a,
                    _ => {
                        let a = authorize(c, ask, Op::UdpAssoc, Some(&dest))?.ok_or(Res::NOHOST)?;
                        c.remote_addr = Some(a);
                        last_dest = Some((dest, a));
                        a
                    }
                };
                if far.send_to(&buf[off..n], dst).is_ok() {
                    c.bytes_out += (n - off) as u64;
                }
            }
        }
        if from_server {
            while let Ok((n, src)) = far.recv_from(&mut data) {
                let Some(port) = client_port else { continue };
                last_activity = Instant::now();
                let mut out = udp_header(src);
                out.extend_from_slice(&data[..n]);
                if near.send_to(&out, SocketAddr::new(client_ip, port)).is_ok() {
                    c.bytes_in += n as u64;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_codes_follow_3proxy() {
        let cases = [(0, 0), (1, 2), (3, 2), (10, 2), (11, 5), (13, 5), (21, 1), (31, 4), (92, 4), (100, 4), (997, 8), (461, 1), (407, 7)];
        for (res, rep) in cases {
            assert_eq!(v5_rep(Res(res)), rep, "res {res}");
        }
    }

    #[test]
    fn replies_encode_addresses() {
        assert_eq!(v5_reply(0, "1.2.3.4:258".parse().unwrap()), [5, 0, 0, 1, 1, 2, 3, 4, 1, 2]);
        let r = v5_reply(5, "[::1]:80".parse().unwrap());
        assert_eq!(r.len(), 22);
        assert_eq!((r[1], r[3], r[19], r[21]), (5, 4, 1, 80));
        assert_eq!(v4_reply(true, "1.2.3.4:258".parse().unwrap()), [0, 90, 1, 2, 1, 2, 3, 4]);
        assert_eq!(v4_reply(false, "[::1]:1".parse().unwrap()), [0, 91, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn method_choice() {
        assert_eq!(choose_method(&[0], 1), 0);
        assert_eq!(choose_method(&[0, 2], 1), 2);
        assert_eq!(choose_method(&[2], 0), 2);
        assert_eq!(choose_method(&[0, 2], 0), 0);
        assert_eq!(choose_method(&[0], 2), 0xFF);
        assert_eq!(choose_method(&[1], 1), 0xFF);
        assert_eq!(choose_method(&[], 1), 0xFF);
    }

    #[test]
    fn udp_headers() {
        let h = udp_header("10.0.0.1:53".parse().unwrap());
        let mut d = h.clone();
        d.extend_from_slice(b"payload");
        let (dest, off) = parse_udp_header(&d).unwrap();
        assert_eq!(dest, Dest::Addr("10.0.0.1:53".parse().unwrap()));
        assert_eq!(&d[off..], b"payload");
        let mut named = vec![0, 0, 0, 3, 4];
        named.extend_from_slice(b"host");
        named.extend_from_slice(&[0, 7, b'x']);
        let (dest, off) = parse_udp_header(&named).unwrap();
        assert_eq!((dest, off), (Dest::Name("host".into(), 7), 11));
        assert_eq!(parse_udp_header(&[0, 0, 1, 1]).unwrap_err(), Res(483));
        assert!(parse_udp_header(&[0, 0, 0, 1, 1, 2]).is_err());
        assert!(parse_udp_header(&[0, 0, 0, 3, 200, b'a']).is_err());
        assert_eq!(parse_udp_header(&[0, 0, 0, 9, 0, 0, 0, 0]).unwrap_err(), Res::NOTIMPL_ATYP);
    }
}
