//! `ssl_mitm`: the HTTP proxy inside an intercepted TLS tunnel.
//!
//! Once `session::intercept` has done TLS with the origin and with the
//! client, the proxy waits for whichever side speaks first
//! ([`first_speaker`]). A client that starts with an HTTP/1 request line
//! is served by the request loop, as 3proxy 1.0.0 hands the decrypted
//! stream to its HTTP proxy: each inner request is authorized, filtered,
//! logged and limited as any request of the service, and goes to the
//! tunnel's destination over TLS ([`Inside`]). Anything else (a server
//! that greets first, a protocol that is not HTTP) is relayed as before,
//! with the tunnel's own record.
//!
//! The CONNECT (the SOCKS CONNECT, the tcppm session) that opened the
//! tunnel writes no record when its stream is HTTP: its requests do, as
//! in 3proxy.

use std::time::{Duration, Instant};

use crate::client::Client;
use crate::net::Stream;
use crate::parent::Parents;
use crate::proto::http::RequestHead;
use crate::res::Res;
use crate::timeouts::Timeouts;

use super::head::{HeadBuf, SMALL};
use super::pool::{Origin, Via};
use super::session::{parent_fail, Fail, Inside, Session};

/// Who spoke first in an intercepted tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum First {
    /// The client, with what starts an HTTP/1 request line.
    Http,
    /// The server, or the client with something else, or an end: relay.
    Other,
    /// Nobody, within the wait.
    Quiet,
}

/// Whether `b`, the first plaintext a client sent in its tunnel, starts
/// an HTTP/1 request: a method token of capitals (`GET`, `PROPFIND`) and
/// a space, or the start of one (a record may end inside the method).
fn looks_like_http(b: &[u8]) -> bool {
    const LONGEST_METHOD: usize = 20;
    let n = b
        .iter()
        .take(LONGEST_METHOD + 1)
        .take_while(|c| c.is_ascii_uppercase() || **c == b'-')
        .count();
    if n == 0 || n > LONGEST_METHOD {
        return false;
    }
    n == b.len() || b[n] == b' '
}

/// Wait up to `within` for the first plaintext of either side of an
/// intercepted tunnel, without taking it: the client's, if it looks like
/// HTTP, is read again by the request loop; anything else by the relay.
/// Records that carry no data (a TLS 1.3 ticket) are taken in and do not
/// count.
pub(super) fn first_speaker(cli: &Stream, srv: &Stream, within: Duration) -> First {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::socket::MsgFlags;
    use std::os::fd::AsFd;
    let deadline = Instant::now() + within;
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    let mut b = [0u8; 24];
    // What a non-blocking look at one side says: Some(first) when it
    // decides, None when it has nothing yet.
    let look = |s: &Stream, b: &mut [u8], client: bool| match s.recv_flags(b, flags) {
        Ok(n) if client && n > 0 && looks_like_http(&b[..n]) => Some(First::Http),
        Ok(_) => Some(First::Other),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => None,
        Err(_) => Some(First::Other),
    };
    let mut cli_now = true;
    let mut srv_now = true;
    loop {
        if cli_now || cli.ready() {
            if let Some(f) = look(cli, &mut b, true) {
                return f;
            }
        }
        if srv_now || srv.ready() {
            if let Some(f) = look(srv, &mut b, false) {
                return f;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return First::Quiet;
        }
        // Either side may owe its peer records (a ticket's reply).
        let _ = cli.flush_nb();
        let _ = srv.flush_nb();
        let mut fds = [
            PollFd::new(cli.as_fd(), PollFlags::POLLIN),
            PollFd::new(srv.as_fd(), PollFlags::POLLIN),
        ];
        let ms = PollTimeout::try_from(left.as_millis().clamp(1, i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, ms) {
            Ok(0) => return First::Quiet,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return First::Other,
        }
        let woke = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        cli_now = woke(&fds[0]);
        srv_now = woke(&fds[1]);
    }
}

/// [`first_speaker`] of an intercepted tunnel's client and `srv`, within
/// the STRING_LONG timeout; a tunnel nobody spoke in ends with 92 and why
/// in the record's text.
pub(super) fn wait_first(c: &mut Client, srv: &Stream) -> First {
    let within = c.svc().timeouts.get(Timeouts::STRING_LONG);
    let first = first_speaker(&c.cli, srv, within);
    if first == First::Quiet {
        let why = "ssl_mitm: nothing came in the tunnel".into();
        c.record.res = crate::session::with_why(c, Res::IDLE, why);
    }
    first
}

/// After a SOCKS or tcppm tunnel was intercepted on `srv`: if its client
/// speaks HTTP, serve its requests here (they write the records; the
/// tunnel writes none) and return None; otherwise give `srv` back for the
/// relay. `parents`: the chain the tunnel took (the inner requests that
/// an ACL entry of the same chain allows keep its connection).
pub fn serve_inside(
    c: &mut Client,
    srv: Stream,
    inside: Inside,
    parents: &Parents,
    hops: u32,
) -> Option<Stream> {
    match wait_first(c, &srv) {
        First::Http => {}
        First::Other => return Some(srv),
        First::Quiet => {
            c.srv = Some(srv);
            return None;
        }
    }
    let svc = c.svc().clone();
    let via = (!parents.is_empty()).then(|| {
        Box::new(Via {
            parents: parents.clone(),
            http: false,
            auth: None,
            user: inside.user.clone(),
            password: inside.password.clone(),
        })
    });
    let o = Origin {
        ext: srv.local_addr(),
        s: srv,
        host: inside.host.clone(),
        port: inside.port,
        addr: inside.addr,
        peer: c.remote_addr,
        used: false,
        bound: false,
        via,
        hops,
    };
    // On the heap, as the proxy's own sessions are.
    let mut s = Box::new(Session::new(svc, c));
    s.enter_inside(c, o, inside);
    s.serve_loop(c, &[], false, true);
    None
}

/// An inner request of an intercepted tunnel goes to the tunnel's
/// destination, whatever its `Host` says: its head's host and port become
/// the tunnel's. One that names another destination (an absolute URI of
/// another authority, ftp://) is refused 400, and a CONNECT inside the
/// tunnel 501.
pub(super) fn pin_inside(h: &mut RequestHead<'_>, inside: &Inside) -> Result<(), Fail> {
    if h.is_connect() {
        return Err(Fail::answer(Res::NOTIMPL, 501));
    }
    let same = h.host.eq_ignore_ascii_case(&inside.host) && h.port == inside.port;
    if h.ftp.is_some() || (!h.uri.starts_with('/') && !same) {
        return Err(Fail::answer(Res::HTTP_BAD_TARGET, 400));
    }
    h.host = std::borrow::Cow::Owned(inside.host.clone());
    h.port = inside.port;
    Ok(())
}

impl Session {
    /// Serve the requests of the intercepted tunnel `o` from now on: they
    /// go to its destination, and `o` is the kept connection to it. The
    /// tunnel writes no record of its own.
    pub(super) fn enter_inside(&mut self, c: &mut Client, mut o: Origin, inside: Inside) {
        if let Some(v) = &mut o.via {
            // An `http` last hop was asked for a tunnel: the connection
            // reaches one destination now.
            v.http = false;
        }
        // The tunnel's destination is every request's (not a NAT
        // redirection's, which the tunnel went to already).
        self.redirected_to = None;
        self.host.clone_from(&inside.host);
        self.host_ip = crate::net::parse_ip(&inside.host);
        self.inside = Some(Box::new(inside));
        self.origin = Some(o);
        c.drop_record();
        // The handshakes set the client socket's timeouts their own way.
        self.cli_rto = None;
        self.cli_wto = false;
    }

    /// A new connection `o` for an inner request, made through the
    /// grant's chain: ask an `http` last hop for a tunnel to the
    /// destination (an intercepted request never goes to a parent in
    /// clear), then TLS with the destination through it.
    pub(super) fn reach_inside(
        &mut self,
        c: &mut Client,
        o: &mut Origin,
        port: u16,
    ) -> Result<(), Fail> {
        if o.via.as_ref().is_some_and(|v| v.http) {
            let mut small = [0u8; SMALL];
            let mut sb = HeadBuf::new(&mut small);
            self.parent_connect(c, o, &mut sb, port)?;
            if !sb.data().is_empty() {
                let why = "ssl_mitm: the destination spoke before the TLS handshake".into();
                return Err(parent_fail(crate::session::with_why(
                    c,
                    Res::TLS_PARENT,
                    why,
                )));
            }
            if let Some(v) = &mut o.via {
                v.http = false;
            }
        }
        self.tls_inside(c, &mut o.s).map_err(parent_fail)
    }

    /// TLS with the destination of an intercepted tunnel on `s`, a new
    /// connection an inner request made (through `http_parent`, a tunnel
    /// it was asked for first): the `ssl_client_*` settings of
    /// `ssl_mitm`, the destination's name asked and checked.
    fn tls_inside(&self, c: &mut Client, s: &mut Stream) -> Result<(), Res> {
        let (Some(m), Some(inside)) = (self.svc.mitm.as_deref(), self.inside.as_deref()) else {
            return Ok(());
        };
        crate::session::mitm_origin(c, m, s, &inside.host)?;
        crate::sys::mem::release_stack_below_here();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_an_http_request_line_from_other_first_bytes() {
        for b in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST /x HTTP/1.1",
            b"PROPFIND ",
            b"M-SEARCH * HTTP/1.1",
            b"GE",
            b"G",
        ] {
            assert!(looks_like_http(b), "{:?}", String::from_utf8_lossy(b));
        }
        for b in [
            &b""[..],
            b"get / HTTP/1.1",
            b"\x16\x03\x01",
            b"\x00\x01binary",
            b"GET/ HTTP/1.1",
            b" GET /",
            b"<?xml version",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZ ",
        ] {
            assert!(!looks_like_http(b), "{:?}", String::from_utf8_lossy(b));
        }
    }

    #[test]
    fn the_first_speaker_of_a_socket_pair() {
        use super::super::sock::testing::tcp_pair;
        use std::io::Write;
        // The client speaks HTTP first.
        let (cli, cli_peer) = tcp_pair();
        let (srv, _srv_peer) = tcp_pair();
        (&cli_peer).write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let d = Duration::from_secs(5);
        assert_eq!(first_speaker(&cli, &srv, d), First::Http);
        // The bytes are still there for the request loop.
        let mut b = [0u8; 4];
        assert_eq!(cli.peek(&mut b).unwrap(), 4);
        // The server greets first.
        let (cli, _cli_peer) = tcp_pair();
        let (srv, srv_peer) = tcp_pair();
        (&srv_peer).write_all(b"220 hello\r\n").unwrap();
        assert_eq!(first_speaker(&cli, &srv, d), First::Other);
        // The client sends something else.
        let (cli, cli_peer) = tcp_pair();
        let (srv, _srv_peer) = tcp_pair();
        (&cli_peer).write_all(b"\x00\x01").unwrap();
        assert_eq!(first_speaker(&cli, &srv, d), First::Other);
        // Nobody.
        let (cli, _cli_peer) = tcp_pair();
        let (srv, _srv_peer) = tcp_pair();
        let short = Duration::from_millis(50);
        assert_eq!(first_speaker(&cli, &srv, short), First::Quiet);
    }
}
