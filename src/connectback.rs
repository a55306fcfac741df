//! Connect-back (`-r` and `-R`, 3proxy's `proxymain.c`): publishing a
//! service that sits behind NAT through a relay that can be reached.
//!
//! - `-R<host:port>` (the reachable side, normally `tcppm`): besides its
//!   own listener the service listens on host:port for back-connections.
//!   Each client it accepts takes one back-connection (which must pass the
//!   service's ACL), sends it the byte `C`, and uses it as its server
//!   socket. A client that gets none within the CONNECTBACK timeout (a few
//!   tries) ends with code 13.
//! - `-r<host:port>` (the hidden side, normally `proxy` or `socks`): the
//!   service does not listen. It dials host:port, waits up to a minute
//!   for the `C`, and then serves that connection as if it had accepted
//!   it; meanwhile it dials the next one. Like 3proxy it keeps exactly one
//!   back-connection waiting for its `C` at any time (plus the ones being
//!   served), within `maxconn`.
//!
//! The `-r` loop itself is `acceptor::run_dialing`; this module holds the
//! sockets and the handshakes.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::acl::{self, Action, Query, Verdict};
use crate::client::Client;
use crate::conf::Timeouts;
use crate::net::Stream;
use crate::res::Res;
use crate::services::Service;
use crate::sys::sockopt::SockOpts;

/// The command byte the `-R` side sends on a back-connection it takes.
pub const COMMAND: u8 = b'C';

/// How long a `-r` back-connection waits for its `C` before it is closed
/// and dialed again (3proxy's fixed 60 s; it also keeps NAT entries
/// fresh).
const WAIT_COMMAND: Duration = Duration::from_secs(60);

/// Parse the `host:port` of `-r`/`-R` (`[v6]:port` for IPv6); a name is
/// resolved once, when the cfg is read.
pub fn parse_hostport(s: &str) -> Result<SocketAddr, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}': takes host:port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("'{s}': bad port"))?;
    if host.is_empty() {
        return Err(format!("'{s}': takes host:port"));
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip = crate::conf::commands::resolve_once(host)?;
    Ok(SocketAddr::new(ip, port))
}

// --- `-R`: the listening side ---------------------------------------------

/// The back-connection listener of a `-R` service. Shared by its clients
/// (each takes one connection from it) and kept across a reload that
/// leaves the address and options as they were.
#[derive(Debug)]
pub struct BackListener {
    /// The address and options it was made with.
    pub key: String,
    listener: TcpListener,
}

impl BackListener {
    /// Bind and listen on `addr`, with SO_REUSEADDR, SO_REUSEPORT and the
    /// `-oR` options, as 3proxy does.
    pub fn bind(addr: SocketAddr, opts: &SockOpts, backlog: i32) -> io::Result<BackListener> {
        let sock = crate::net::tcp_listener(addr, backlog, opts, None)?;
        // Several clients may wait on it at once: whoever loses the race
        // for a connection must not block in accept().
        sock.set_nonblocking(true)?;
        Ok(BackListener {
            key: key(addr, opts),
            listener: sock,
        })
    }
}

/// What makes two `-R` listeners the same socket.
pub fn key(addr: SocketAddr, opts: &SockOpts) -> String {
    format!("{addr}|{opts:?}")
}

/// The server socket of a client of a `-R` service: wait for a
/// back-connection that passes the ACL and is still open, send it `C`.
/// Err(13) when none came in time; `c.text` then says why.
pub fn server_socket(c: &mut Client) -> Result<Stream, Res> {
    let svc = c.svc().clone();
    let Some(l) = svc.back_listener.as_ref() else {
        return Err(Res::CONNECT);
    };
    let wait = svc
        .timeouts
        .get(Timeouts::CONNECTBACK)
        .max(Duration::from_secs(1));
    let tries = 5 + (svc.maxconn >> 10);
    let mut why = "Connect back not received, check connback client";
    for _ in 0..tries {
        let deadline = Instant::now() + wait;
        let (s, peer) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                c.text = why.to_string();
                return Err(Res::CONNECT);
            }
            let mut fds = [PollFd::new(l.listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, poll_ms(left)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => return Err(Res::CONNECT),
            }
            match l.listener.accept() {
                Ok(x) => break x,
                // Another client took it first.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => {
                    why = "Connect back accept() failed";
                    continue;
                }
            }
        };
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        if !allowed(&svc, c, peer) {
            why = "Connect back ACL failed";
            log::warn!(
                "{} on {}: back-connection from {peer} refused by the ACL",
                svc.def.name,
                svc.listen
            );
            continue;
        }
        // A connection the `-r` side gave up on (it redials after a
        // minute without a `C`) may still wait in the queue: skip it.
        if closed(&s) {
            continue;
        }
        let _ = s.set_nodelay(true);
        let _ = s.set_write_timeout(Some(wait));
        let _ = s.set_read_timeout(None);
        if (&s).write_all(&[COMMAND]).is_err() {
            why = "Connect back sending command failed";
            continue;
        }
        let _ = s.set_write_timeout(None);
        return Ok(Stream::Tcp(s));
    }
    c.text = why.to_string();
    Err(Res::CONNECT)
}

/// 3proxy's `checkACL` for a back-connection: the ACL alone (no `auth`,
/// no limits), with the back-connection's peer as the destination and no
/// operation. An empty ACL allows it.
fn allowed(svc: &Service, c: &Client, peer: SocketAddr) -> bool {
    let (wday, daysec) = clock();
    let q = Query {
        user: None,
        src: c.client_addr.map(|a| a.ip()),
        dst: Some(peer.ip()),
        host: None,
        port: peer.port(),
        op: 0,
        wday,
        daysec,
        weight: 0,
    };
    match acl::check(&svc.access.acl, &q) {
        Verdict::Empty => true,
        Verdict::Matched(i) => svc.access.acl[i].action == Action::Allow,
        Verdict::NoMatch => false,
    }
}

fn clock() -> (u8, u32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let tm = crate::sys::time::local(secs);
    (tm.wday as u8, tm.hour * 3600 + tm.min * 60 + tm.sec.min(59))
}

/// True if the peer has already closed `s` (EOF or reset pending).
fn closed(s: &std::net::TcpStream) -> bool {
    let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
    if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
        return false;
    }
    let mut b = [0u8; 1];
    !matches!(s.peek(&mut b), Ok(1..))
}

// --- `-r`: the dialing side -------------------------------------------------

/// What stops a `-r` loop: `Running::stop` shuts down `a` (a duplicate of
/// its descriptor), which makes it readable. `b` is kept open so that `a`
/// is not readable before.
#[derive(Debug)]
pub struct Wake {
    pub a: UnixStream,
    _b: UnixStream,
}

impl Wake {
    pub fn new() -> io::Result<Wake> {
        let (a, b) = UnixStream::pair()?;
        Ok(Wake { a, _b: b })
    }

    /// Sleep `d`, or less if the service is stopped meanwhile.
    pub fn sleep(&self, d: Duration) {
        let mut fds = [PollFd::new(self.a.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, poll_ms(d));
    }
}

/// Why one dial of a `-r` service gave no client.
#[derive(Debug)]
pub enum DialError {
    /// The service was stopped.
    Stopped,
    /// Connecting, or waiting for the `C`, failed: try again later.
    Failed(String),
}

/// Dial the `-R` side once and wait for its `C`. Ok: the connection to
/// serve as a client, and the peer as its client address.
pub fn dial(
    svc: &Service,
    to: SocketAddr,
    wake: &Wake,
) -> Result<(Stream, Option<SocketAddr>), DialError> {
    let fail =
        |what: &str, e: &dyn std::fmt::Display| DialError::Failed(format!("{what} {to}: {e}"));
    let domain = if to.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = crate::net::in_netns(svc.opts.ns_out.as_deref(), || {
        Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
    })
    .map_err(|e| fail("socket for", &e))?;
    svc.opts.cb_client.apply(sock.as_fd());
    let limit = svc
        .timeouts
        .get(Timeouts::CONNECTBACK)
        .max(Duration::from_secs(1));
    sock.connect_timeout(&SockAddr::from(to), limit)
        .map_err(|e| fail("connect to", &e))?;
    let _ = sock.set_nodelay(true);
    let s: std::net::TcpStream = sock.into();
    // Wait for the command, or for the service to stop.
    let mut fds = [
        PollFd::new(s.as_fd(), PollFlags::POLLIN),
        PollFd::new(wake.a.as_fd(), PollFlags::POLLIN),
    ];
    match poll(&mut fds, poll_ms(WAIT_COMMAND)) {
        Ok(0) => return Err(DialError::Failed(format!("no command from {to} in time"))),
        Ok(_) => {}
        Err(e) => return Err(fail("poll", &e)),
    }
    if fds[1].revents().is_some_and(|r| !r.is_empty()) {
        return Err(DialError::Stopped);
    }
    let mut b = [0u8; 1];
    let _ = s.set_read_timeout(Some(limit));
    match (&s).read(&mut b) {
        Ok(1) if b[0] == COMMAND => {}
        Ok(1) => return Err(DialError::Failed(format!("bad command from {to}"))),
        Ok(_) => {
            return Err(DialError::Failed(format!(
                "{to} closed the back-connection"
            )))
        }
        Err(e) => return Err(fail("read from", &e)),
    }
    let _ = s.set_read_timeout(None);
    let peer = s.peer_addr().ok();
    Ok((Stream::Tcp(s), peer))
}

/// A poll timeout for `d`, at least 1 ms, at most i32::MAX ms.
fn poll_ms(d: Duration) -> PollTimeout {
    let ms = d.as_millis().clamp(1, i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_and_port() {
        assert_eq!(
            parse_hostport("127.0.0.1:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(
            parse_hostport("[::1]:9000").unwrap(),
            "[::1]:9000".parse().unwrap()
        );
        assert!(parse_hostport("127.0.0.1").is_err());
        assert!(parse_hostport("127.0.0.1:0").is_err());
        assert!(parse_hostport(":80").is_err());
        assert!(parse_hostport("127.0.0.1:x").is_err());
    }
}
