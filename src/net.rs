//! Sockets as the services see them: a stream that is TCP or unix, a
//! listener of either kind, name resolution by family, and the outgoing
//! connect with its timeout, source address, device and options
//! (3proxy's `doconnect`, `getip46`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

pub use crate::addr::{is_timeout, parse_ip, read_exact_by, Family};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::res::Res;
use crate::sys::sockopt::SockOpts;
pub use crate::tls::HandshakeError;
use crate::tls::TlsStream;

/// A connected byte stream: the client's or the server's side of a session.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A TLS session over a TCP or unix stream (`ssl_serv`): reads and
    /// writes carry plaintext; the descriptor is the socket's.
    Tls(Box<TlsStream<Stream>>),
}

/// How long a close_notify may take to leave when a TLS direction ends.
const CLOSE_NOTIFY_LIMIT: Duration = Duration::from_secs(5);

impl Stream {
    /// Ends a TLS session's direction with its close_notify first.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tls(t) => {
                if how != Shutdown::Read {
                    t.close_notify(CLOSE_NOTIFY_LIMIT);
                }
                t.socket().shutdown(how)
            }
        }
    }

    /// Acknowledge what has arrived now, not after the kernel's delayed-ACK
    /// timer: called when the rest of a message is awaited (an HTTP body
    /// after its head). A peer that wrote the head and the body apart,
    /// with Nagle's algorithm on, holds the body until that ACK comes; on
    /// a connection kept for many requests Linux delays ACKs (up to 40 ms),
    /// expecting them to ride on our next bytes, which do not come before
    /// the body. TCP_QUICKACK=1 sends a pending ACK at once. Nothing for
    /// a unix socket (the call fails and is ignored).
    pub fn ack_now(&self) {
        let _ = socket2::SockRef::from(self).set_quickack(true);
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tls(t) => t.socket().set_nonblocking(on),
        }
    }

    /// A TLS session: its bytes cannot be spliced, and the raw socket
    /// calls below go through the session.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// A TLS session has plaintext or its peer's end in hand: a read
    /// returns at once, whatever the socket's readiness says.
    pub fn ready(&self) -> bool {
        match self {
            Stream::Tls(t) => t.ready(),
            _ => false,
        }
    }

    /// Plaintext already decrypted and waiting: readable without a poll.
    pub fn buffered(&self) -> bool {
        match self {
            Stream::Tls(t) => t.buffered(),
            _ => false,
        }
    }

    /// A TLS session has records a non-blocking write left unsent: the
    /// socket must be polled for writing and [`Stream::flush_nb`] called.
    pub fn wants_write(&self) -> bool {
        match self {
            Stream::Tls(t) => t.wants_write(),
            _ => false,
        }
    }

    /// Send what a TLS session holds within `limit` (before waiting for
    /// the peer, who may be waiting for it). A no-op for plain sockets.
    pub fn flush_within(&self, limit: Duration) -> io::Result<()> {
        match self {
            Stream::Tls(t) if t.wants_write() => t.flush_within(limit),
            _ => Ok(()),
        }
    }

    /// Send what a TLS session holds, without waiting (WouldBlock if some
    /// stays). A no-op for plain sockets.
    pub fn flush_nb(&self) -> io::Result<()> {
        match self {
            Stream::Tls(t) => t.flush_tls(true),
            _ => Ok(()),
        }
    }

    /// recv() with `flags` (MSG_DONTWAIT, MSG_PEEK); through the session
    /// for TLS, where MSG_PEEK looks at decrypted bytes.
    pub fn recv_flags(
        &self,
        buf: &mut [u8],
        flags: nix::sys::socket::MsgFlags,
    ) -> io::Result<usize> {
        use nix::sys::socket::MsgFlags;
        match self {
            Stream::Tls(t) => t.read_plain(
                buf,
                flags.contains(MsgFlags::MSG_DONTWAIT),
                flags.contains(MsgFlags::MSG_PEEK),
            ),
            _ => loop {
                match nix::sys::socket::recv(self.as_raw_fd(), buf, flags) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    r => return r.map_err(io::Error::from),
                }
            },
        }
    }

    /// sendmsg() of `bufs` with `flags` (MSG_DONTWAIT; never SIGPIPE);
    /// through the session for TLS.
    pub fn send_flags(
        &self,
        bufs: &[io::IoSlice<'_>],
        flags: nix::sys::socket::MsgFlags,
    ) -> io::Result<usize> {
        use nix::sys::socket::MsgFlags;
        match self {
            Stream::Tls(t) => t.write_plain(bufs, flags.contains(MsgFlags::MSG_DONTWAIT)),
            _ => nix::sys::socket::sendmsg(
                self.as_raw_fd(),
                bufs,
                &[],
                flags | MsgFlags::MSG_NOSIGNAL,
                None::<&nix::sys::socket::SockaddrStorage>,
            )
            .map_err(io::Error::from),
        }
    }

    /// A second handle on the same socket (dup), for plain streams.
    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            Stream::Tls(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    /// Open a TLS session to a server on this stream (a parent whose type
    /// ends in `s`), as `name`, by `deadline`; the stream becomes
    /// [`Stream::Tls`]. Not over a TLS stream (no TLS in TLS).
    pub fn connect_tls(
        &mut self,
        cfg: std::sync::Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        deadline: std::time::Instant,
    ) -> Result<(), HandshakeError> {
        let dup = self
            .try_clone()
            .map_err(|e| HandshakeError::Failed(e.to_string()))?;
        let t = TlsStream::connect(dup, cfg, name, deadline)?;
        *self = Stream::Tls(Box::new(t));
        Ok(())
    }

    /// Accept a TLS session from the client on this stream by `deadline`
    /// (`ssl_serv`); on success the stream becomes [`Stream::Tls`]. The
    /// session owns a second handle on the socket; this one is closed.
    pub fn accept_tls(
        &mut self,
        cfg: std::sync::Arc<rustls::ServerConfig>,
        deadline: std::time::Instant,
    ) -> Result<(), HandshakeError> {
        let dup = self
            .try_clone()
            .map_err(|e| HandshakeError::Failed(e.to_string()))?;
        let t = TlsStream::accept(dup, cfg, deadline)?;
        *self = Stream::Tls(Box::new(t));
        Ok(())
    }

    /// [`Stream::accept_tls`] of a client whose ClientHello (`hello`) was
    /// read off this stream already.
    pub fn accept_tls_after(
        &mut self,
        cfg: std::sync::Arc<rustls::ServerConfig>,
        hello: &[u8],
        deadline: std::time::Instant,
    ) -> Result<(), HandshakeError> {
        let dup = self
            .try_clone()
            .map_err(|e| HandshakeError::Failed(e.to_string()))?;
        let t = TlsStream::accept_after(dup, cfg, hello, deadline)?;
        *self = Stream::Tls(Box::new(t));
        Ok(())
    }

    /// Read and write timeouts for the blocking phases (handshakes).
    pub fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tls(s) => s.socket().set_timeout(t),
        }
    }

    /// The read timeout alone.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tls(s) => s.socket().set_read_timeout(t),
        }
    }

    /// TCP_NODELAY; a no-op on unix sockets.
    pub fn set_nodelay(&self) {
        match self {
            Stream::Tcp(s) => {
                let _ = s.set_nodelay(true);
            }
            Stream::Tls(s) => s.socket().set_nodelay(),
            Stream::Unix(_) => {}
        }
    }

    /// The peer's address, or None for unix sockets.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok(),
            Stream::Unix(_) => None,
            Stream::Tls(s) => s.socket().peer_addr(),
        }
    }

    /// Our own address on this connection, or None for unix sockets.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Unix(_) => None,
            Stream::Tls(s) => s.socket().local_addr(),
        }
    }

    /// Where the client meant to go before a netfilter REDIRECT/DNAT sent
    /// it to us (`SO_ORIGINAL_DST`), or None: not TCP, or no NAT entry.
    /// An IPv6 socket is asked in the IPv6 table, then the IPv4 one (a
    /// v4-mapped client of a dual-stack listener).
    pub fn original_dst(&self) -> Option<SocketAddr> {
        let Stream::Tcp(s) = self else {
            return None;
        };
        let v6 = s.local_addr().ok()?.is_ipv6();
        let fd = s.as_fd();
        let got = if v6 {
            crate::sys::sockopt::original_dst(fd, true)
                .or_else(|_| crate::sys::sockopt::original_dst(fd, false))
        } else {
            crate::sys::sockopt::original_dst(fd, false)
        };
        got.ok().filter(|a| !a.ip().is_unspecified())
    }

    /// Read without consuming (MSG_PEEK), blocking up to the read timeout.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        use nix::sys::socket::{recv, MsgFlags};
        if let Stream::Tls(t) = self {
            return t.read_plain(buf, false, true);
        }
        recv(self.as_raw_fd(), buf, MsgFlags::MSG_PEEK).map_err(io::Error::from)
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
            Stream::Tls(t) => t.read_plain(buf, false, false),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
            Stream::Tls(t) => t.write_plain(&[io::IoSlice::new(buf)], false),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
            Stream::Tls(t) => t.write_plain(bufs, false),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
            Stream::Tls(t) => t.socket().as_fd(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

/// Where a service listens, or a destination: an IP socket address, a unix
/// socket path, or a Linux abstract socket name (`unix:@name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Ip(SocketAddr),
    Unix(PathBuf),
    Abstract(String),
}

impl Addr {
    /// Parse `unix:/path`, `unix:@name`, or an IP literal (IPv6 with or
    /// without brackets) combined with `port`.
    pub fn parse_listen(s: &str, port: u16) -> Result<Addr, String> {
        if let Some(rest) = s.strip_prefix("unix:") {
            return unix_addr(rest);
        }
        parse_ip(s)
            .map(|ip| Addr::Ip(SocketAddr::new(ip, port)))
            .ok_or_else(|| format!("'{}' is not an IP address", crate::conf::token::quote(s)))
    }

    pub fn port(&self) -> u16 {
        match self {
            Addr::Ip(a) => a.port(),
            _ => 0,
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Ip(a) => write!(f, "{a}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
            Addr::Abstract(n) => write!(f, "unix:@{n}"),
        }
    }
}

fn unix_addr(rest: &str) -> Result<Addr, String> {
    if let Some(name) = rest.strip_prefix('@') {
        if name.is_empty() {
            return Err("empty abstract socket name".into());
        }
        Ok(Addr::Abstract(name.to_string()))
    } else if rest.is_empty() {
        Err("empty unix socket path".into())
    } else {
        Ok(Addr::Unix(PathBuf::from(rest)))
    }
}

/// A destination given by name or address (tcppm/udppm's DSTHOST).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An address known at cfg time.
    Fixed(SocketAddr),
    /// A name resolved when each session starts.
    Name(String, u16),
    Unix(PathBuf),
    Abstract(String),
}

impl Target {
    pub fn parse(host: &str, port: u16) -> Result<Target, String> {
        if let Some(rest) = host.strip_prefix("unix:") {
            return Ok(match unix_addr(rest)? {
                Addr::Unix(p) => Target::Unix(p),
                Addr::Abstract(n) => Target::Abstract(n),
                Addr::Ip(_) => unreachable!(),
            });
        }
        if host.is_empty() {
            return Err("empty destination host".into());
        }
        Ok(match parse_ip(host) {
            Some(ip) => Target::Fixed(SocketAddr::new(ip, port)),
            None => Target::Name(host.to_string(), port),
        })
    }

    /// The host part as the log's `%n` shows it.
    pub fn host(&self) -> String {
        match self {
            Target::Fixed(a) => crate::addr::ip_text(a.ip()),
            Target::Name(n, _) => n.clone(),
            Target::Unix(p) => format!("unix:{}", p.display()),
            Target::Abstract(n) => format!("unix:@{n}"),
        }
    }
}

/// `happyeyeballs`' default: RFC 8305's Connection Attempt Delay.
pub const DEFAULT_EYEBALLS: Duration = Duration::from_millis(250);

/// How to open an outgoing connection: `-e` source addresses, `-De`
/// device, `-os` options, and the CONNECT timeout.
#[derive(Debug, Clone, Default)]
pub struct Dialer {
    pub ext4: Option<IpAddr>,
    pub ext6: Option<IpAddr>,
    pub device: Option<String>,
    /// `-ne`: the network namespace outgoing sockets are made in.
    pub netns: Option<PathBuf>,
    pub opts: SockOpts,
    pub timeout: Duration,
    /// IP_FREEBIND on the source address: bind to an address this host
    /// does not (yet) have (`extip` parents, e.g. a random address of an
    /// IPv6 prefix routed to the host).
    pub freebind: bool,
    /// `happyeyeballs`: how long the first address of a name with both
    /// families has alone before the second one is tried too; zero: the
    /// first address only.
    pub eyeballs: Duration,
}

impl Dialer {
    /// Connect to an IP destination. On failure, the 3proxy code to log.
    ///
    /// Quick ACKs stay on, on every connection we make (and every one we
    /// accept): holding an ACK back to let it ride on our next bytes saves
    /// a packet, but a peer that sends its answer in two writes with
    /// Nagle's algorithm on (many HTTP servers and clients: head, then
    /// body) waits for that ACK before the second, and the kernel holds
    /// it up to its delayed-ACK limit, 40 ms per request.
    pub fn connect_ip(&self, dst: SocketAddr) -> Result<Stream, Res> {
        let sock = self.socket_for(dst)?;
        connect_nonblocking(&sock, dst, self.timeout).map_err(|_| Res::CONNECT)?;
        connected(sock)
    }

    /// Connect to `first`, or to the address `second` gives (the same
    /// name's address of the other family) if that connects first: happy
    /// eyeballs (RFC 8305). `first` has [`Dialer::eyeballs`] alone (less
    /// if it fails sooner); only then is `second` called (it may resolve
    /// a name: a destination that answers at once costs no lookup of the
    /// other family), and both race; the first to connect is kept and the
    /// other closed. Each has the CONNECT timeout from its own start.
    /// Blocking: non-blocking sockets polled in the calling thread.
    /// Ok: the stream and the address it reached (`%R`), which is
    /// `second`'s when that one won.
    pub fn connect_either(
        &self,
        first: SocketAddr,
        second: impl FnOnce() -> Option<SocketAddr>,
    ) -> Result<(Stream, SocketAddr), Res> {
        if self.eyeballs.is_zero() {
            return self.connect_ip(first).map(|s| (s, first));
        }
        let start = std::time::Instant::now();
        // Racers: the socket, when it gives up, and where it goes.
        let mut racing: Vec<(Socket, std::time::Instant, SocketAddr)> = Vec::with_capacity(2);
        let mut err = Res::CONNECT;
        match self.begin(first) {
            Ok((s, true)) => return connected(s).map(|s| (s, first)),
            Ok((s, false)) => racing.push((s, start + self.timeout, first)),
            Err(e) => err = e,
        }
        let mut second = Some(second);
        let second_at = start + self.eyeballs;
        loop {
            let mut now = std::time::Instant::now();
            if second.is_some() && (second_at <= now || racing.is_empty()) {
                if let Some(addr) = second.take().and_then(|f| f()) {
                    now = std::time::Instant::now();
                    match self.begin(addr) {
                        Ok((s, true)) => return connected(s).map(|s| (s, addr)),
                        Ok((s, false)) => racing.push((s, now + self.timeout, addr)),
                        Err(e) => err = e,
                    }
                }
            }
            let second_at = second.as_ref().map(|_| second_at);
            racing.retain(|(_, until, _)| *until > now);
            if racing.is_empty() && second_at.is_none() {
                return Err(err);
            }
            if racing.is_empty() {
                continue;
            }
            // Wait until a socket is done, its time runs out, or the
            // second one is due.
            let mut until = racing.iter().map(|(_, u, _)| *u).min().unwrap_or(now);
            if let Some(at) = second_at {
                until = until.min(at);
            }
            match poll_connecting(&racing, until) {
                Ok(done) => {
                    // The first connected one wins; failed ones drop out.
                    let mut won = None;
                    for (i, d) in done.into_iter().enumerate() {
                        match d {
                            Some(true) if won.is_none() => won = Some(i),
                            Some(false) => {
                                racing[i].1 = now;
                                err = Res::CONNECT;
                            }
                            _ => {}
                        }
                    }
                    if let Some(w) = won {
                        let (s, _, to) = racing.swap_remove(w);
                        // The loser is closed as `racing` drops.
                        return connected(s).map(|s| (s, to));
                    }
                    racing.retain(|(_, until, _)| *until > now);
                }
                Err(_) => return Err(Res::CONNECT),
            }
        }
    }

    /// A socket to `dst`, its connect started: (socket, connected now).
    fn begin(&self, dst: SocketAddr) -> Result<(Socket, bool), Res> {
        let sock = self.socket_for(dst)?;
        match sock.connect(&SockAddr::from(dst)) {
            Ok(()) => Ok((sock, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok((sock, false)),
            Err(_) => Err(Res::CONNECT),
        }
    }

    /// A non-blocking TCP socket for `dst` with the source address,
    /// device and options of this dialer, not yet connected.
    fn socket_for(&self, dst: SocketAddr) -> Result<Socket, Res> {
        let domain = if dst.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        // Non-blocking from the start: the connect waits in one poll()
        // with the CONNECT timeout, and the socket is made blocking once,
        // after (socket2's connect_timeout switches it twice, four fcntl()).
        let sock = in_netns(self.netns.as_deref(), || {
            Socket::new(
                domain,
                Type::STREAM.nonblocking().cloexec(),
                Some(Protocol::TCP),
            )
        })
        .map_err(|_| Res::SOCKET)?;
        let src = if dst.is_ipv4() { self.ext4 } else { self.ext6 };
        if let Some(ip) = src {
            if !ip.is_unspecified() {
                if self.freebind {
                    let _ = if ip.is_ipv4() {
                        sock.set_freebind(true)
                    } else {
                        sock.set_freebind_ipv6(true)
                    };
                }
                sock.bind(&SockAddr::from(SocketAddr::new(ip, 0)))
                    .map_err(|_| Res::BIND)?;
            }
        }
        if let Some(dev) = &self.device {
            sock.bind_device(Some(dev.as_bytes()))
                .map_err(|_| Res::BIND)?;
        }
        let _ = sock.set_nodelay(true);
        self.opts.apply(sock.as_fd());
        Ok(sock)
    }

    /// Connect to a unix socket destination.
    pub fn connect_unix(&self, t: &Target) -> Result<Stream, Res> {
        let s = match t {
            Target::Unix(p) => UnixStream::connect(p),
            Target::Abstract(n) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(n.as_bytes())
                    .and_then(|a| UnixStream::connect_addr(&a))
            }
            _ => return Err(Res::NOHOST),
        };
        s.map(Stream::Unix).map_err(|_| Res::CONNECT)
    }
}

/// A bound, listening socket of either kind. Unix socket files are removed
/// at exit (`remove_unix_files`) or by the reload that drops them.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Bind and listen. IP listeners always get SO_REUSEADDR and
    /// SO_REUSEPORT (as 3proxy's do) plus the `-ol` options; `device` is
    /// `-Di`.
    pub fn bind(
        addr: &Addr,
        backlog: i32,
        opts: &SockOpts,
        device: Option<&str>,
    ) -> io::Result<Listener> {
        match addr {
            Addr::Ip(a) => tcp_listener(*a, backlog, opts, device).map(Listener::Tcp),
            Addr::Unix(p) => {
                // A stale socket file from a previous run would make bind
                // fail; 3proxy unlinks it first too.
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    use std::os::unix::fs::FileTypeExt;
                    if meta.file_type().is_socket() {
                        let _ = std::fs::remove_file(p);
                    }
                }
                let l = UnixListener::bind(p)?;
                UNIX_FILES
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(p.clone());
                Ok(Listener::Unix(l))
            }
            Addr::Abstract(n) => {
                use std::os::linux::net::SocketAddrExt;
                let a = std::os::unix::net::SocketAddr::from_abstract_name(n.as_bytes())?;
                Ok(Listener::Unix(UnixListener::bind_addr(&a)?))
            }
        }
    }

    /// Accept one client; for unix sockets the peer address is None.
    /// Non-blocking accept() (WouldBlock when no client waits); the
    /// accepted sockets are blocking either way.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(on),
            Listener::Unix(l) => l.set_nonblocking(on),
        }
    }

    pub fn accept(&self) -> io::Result<(Stream, Option<SocketAddr>)> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, a)| (Stream::Tcp(s), Some(a))),
            Listener::Unix(l) => l.accept().map(|(s, _)| (Stream::Unix(s), None)),
        }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(_) => None,
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }
}

/// A socket whose connect completed, as the stream the caller gets.
fn connected(sock: Socket) -> Result<Stream, Res> {
    let s: TcpStream = sock.into();
    s.set_nonblocking(false).map_err(|_| Res::CONNECT)?;
    Ok(Stream::Tcp(s))
}

/// Wait until one of the connecting sockets is done or `until`: for each,
/// Some(true) connected, Some(false) failed, None still connecting.
fn poll_connecting(
    socks: &[(Socket, std::time::Instant, SocketAddr)],
    until: std::time::Instant,
) -> io::Result<Vec<Option<bool>>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let left = until.saturating_duration_since(std::time::Instant::now());
    let ms = left.as_millis().clamp(0, i32::MAX as u128) as i32;
    let mut fds: Vec<PollFd<'_>> = socks
        .iter()
        .map(|(s, _, _)| PollFd::new(s.as_fd(), PollFlags::POLLOUT))
        .collect();
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(fds
        .iter()
        .map(|fd| {
            let ev = fd.revents().unwrap_or(PollFlags::empty());
            if ev.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
                Some(false)
            } else if ev.contains(PollFlags::POLLOUT) {
                // Writable with no error or hang-up: connected (a failed
                // connect reports POLLERR, as `connect_nonblocking` relies
                // on too), so no getsockopt(SO_ERROR) is needed.
                Some(true)
            } else {
                None
            }
        })
        .collect())
}

/// Connect the non-blocking `sock` to `dst`, waiting at most `limit`.
fn connect_nonblocking(sock: &Socket, dst: SocketAddr, limit: Duration) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    match sock.connect(&SockAddr::from(dst)) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let ev = fds[0].revents().unwrap_or(PollFlags::empty());
        // Writable alone: connected. An error or hang-up: SO_ERROR says why.
        if ev.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
            return Err(sock
                .take_error()?
                .unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into()));
        }
        return Ok(());
    }
}

/// A listening TCP socket as every service gets one: SO_REUSEADDR and
/// SO_REUSEPORT (as 3proxy sets them), TCP_NODELAY, bound to a device
/// (`-Di`) and with the `-ol`/`-oR` options. IPV6_V6ONLY is left as the
/// system has it, as 3proxy leaves it: on Linux (net.ipv6.bindv6only = 0)
/// `::` takes IPv4 clients too; `-olIPV6_V6ONLY` makes it IPv6 only.
pub fn tcp_listener(
    a: SocketAddr,
    backlog: i32,
    opts: &SockOpts,
    device: Option<&str>,
) -> io::Result<TcpListener> {
    let domain = if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    if let Some(dev) = device {
        sock.bind_device(Some(dev.as_bytes()))?;
    }
    // TCP_NODELAY by default: a proxy must not add Nagle's delay to small
    // writes. Accepted sockets inherit it from the listening socket (Linux),
    // which saves a system call per client; set before listen() so no
    // client, however early, is accepted without it. `-ol`/`-oc` come on top.
    let _ = sock.set_nodelay(true);
    opts.apply(sock.as_fd());
    sock.bind(&SockAddr::from(a))?;
    sock.listen(backlog)?;
    Ok(sock.into())
}

/// Socket files of unix listeners, removed when the process exits (the
/// listeners themselves live in acceptor threads that are never joined).
static UNIX_FILES: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Remove the socket files of every unix listener, at exit.
pub fn remove_unix_files() {
    for p in UNIX_FILES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
    {
        let _ = std::fs::remove_file(p);
    }
}

/// Run `f` with this thread inside the network namespace at `path` (`-ni`,
/// `-ne`), then switch back. Sockets keep the namespace they were made in,
/// so a listener or an outgoing socket made inside `f` stays there.
pub fn in_netns<T>(
    path: Option<&std::path::Path>,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    use nix::sched::{setns, CloneFlags};
    let Some(path) = path else { return f() };
    let here = std::fs::File::open("/proc/thread-self/ns/net")?;
    let there = std::fs::File::open(path)?;
    setns(&there, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    let r = f();
    // Switching back cannot reasonably fail (we came from there); if it
    // did, this thread would make later sockets in the wrong namespace.
    if let Err(e) = setns(&here, CloneFlags::CLONE_NEWNET) {
        log::error!("cannot return to the original network namespace: {e}");
        std::process::abort();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A message in pieces arrives whole; a peer that stops short is EOF;
    /// a peer that goes quiet is TimedOut at the deadline, not later.
    #[test]
    fn read_exact_by_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let writer = std::thread::spawn(move || {
            s.write_all(b"ab").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(b"cd").unwrap();
            s
        });
        let mut buf = [0u8; 4];
        read_exact_by(&mut c, &mut buf, Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(&buf, b"abcd");
        let s = writer.join().unwrap();

        let start = Instant::now();
        let e = read_exact_by(&mut c, &mut buf, start + Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(190) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let e = read_exact_by(&mut c, &mut buf, Instant::now()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);

        (&s).write_all(b"x").unwrap();
        drop(s);
        let e =
            read_exact_by(&mut c, &mut buf, Instant::now() + Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// A listener whose accept queue is full drops new SYNs: a local
    /// address that never answers.
    fn black_hole() -> (Socket, Vec<TcpStream>, SocketAddr) {
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&SockAddr::from(
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        ))
        .unwrap();
        l.listen(0).unwrap();
        let to = l.local_addr().unwrap().as_socket().unwrap();
        // Fill the queue (backlog 0 holds one, the kernel may take two).
        let mut held = Vec::new();
        for _ in 0..3 {
            let s = Socket::new(Domain::IPV4, Type::STREAM.nonblocking(), None).unwrap();
            let _ = s.connect(&SockAddr::from(to));
            std::thread::sleep(Duration::from_millis(20));
            held.push(s.into());
        }
        (l, held, to)
    }

    #[test]
    fn happy_eyeballs_takes_the_second_family_after_the_delay() {
        let v6 = match TcpListener::bind("[::1]:0") {
            Ok(l) => l,
            Err(e) => panic!("this test needs ::1: {e}"),
        };
        let second = v6.local_addr().unwrap();
        let (_l, _held, first) = black_hole();
        let d = Dialer {
            timeout: Duration::from_secs(10),
            eyeballs: Duration::from_millis(250),
            ..Dialer::default()
        };
        let t = Instant::now();
        let (s, to) = d.connect_either(first, || Some(second)).unwrap();
        let took = t.elapsed();
        assert_eq!(s.peer_addr(), Some(second));
        assert_eq!(to, second);
        assert!(
            took >= Duration::from_millis(240) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // Without happy eyeballs the first address is all there is.
        let d = Dialer {
            timeout: Duration::from_millis(600),
            ..Dialer::default()
        };
        let t = Instant::now();
        assert_eq!(
            d.connect_either(first, || Some(second)).unwrap_err(),
            Res::CONNECT
        );
        assert!(t.elapsed() >= Duration::from_millis(590));
        // A first address that connects is kept, the second never tried;
        // one that is refused hands over at once.
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let d = Dialer {
            timeout: Duration::from_secs(10),
            eyeballs: Duration::from_millis(250),
            ..Dialer::default()
        };
        let asked = std::cell::Cell::new(false);
        let (s, to) = d
            .connect_either(v4.local_addr().unwrap(), || {
                asked.set(true);
                Some(second)
            })
            .unwrap();
        assert_eq!(s.peer_addr(), Some(v4.local_addr().unwrap()));
        assert_eq!(to, v4.local_addr().unwrap());
        // Nor looked up: a name's other family costs nothing then.
        assert!(!asked.get());
        let refused = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let t = Instant::now();
        let (s, to) = d.connect_either(refused, || Some(second)).unwrap();
        assert_eq!(s.peer_addr(), Some(second));
        assert_eq!(to, second);
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // Both failing: CONNECT.
        let gone6 = {
            let l = TcpListener::bind("[::1]:0").unwrap();
            l.local_addr().unwrap()
        };
        assert_eq!(
            d.connect_either(refused, || Some(gone6)).unwrap_err(),
            Res::CONNECT
        );
    }

    #[test]
    fn parses_listen_addresses() {
        assert_eq!(
            Addr::parse_listen("127.0.0.1", 80).unwrap(),
            Addr::Ip("127.0.0.1:80".parse().unwrap())
        );
        assert_eq!(
            Addr::parse_listen("[::1]", 80).unwrap(),
            Addr::Ip("[::1]:80".parse().unwrap())
        );
        assert_eq!(
            Addr::parse_listen("::1", 80).unwrap(),
            Addr::Ip("[::1]:80".parse().unwrap())
        );
        assert_eq!(
            Addr::parse_listen("unix:/tmp/s", 0).unwrap(),
            Addr::Unix("/tmp/s".into())
        );
        assert_eq!(
            Addr::parse_listen("unix:@n", 0).unwrap(),
            Addr::Abstract("n".into())
        );
        assert!(Addr::parse_listen("localhost", 0).is_err());
        assert!(Addr::parse_listen("unix:", 0).is_err());
    }

    #[test]
    fn parses_targets() {
        assert_eq!(
            Target::parse("10.0.0.1", 5).unwrap(),
            Target::Fixed("10.0.0.1:5".parse().unwrap())
        );
        assert_eq!(
            Target::parse("[::1]", 5).unwrap(),
            Target::Fixed("[::1]:5".parse().unwrap())
        );
        assert_eq!(
            Target::parse("example.org", 5).unwrap(),
            Target::Name("example.org".into(), 5)
        );
        assert_eq!(
            Target::parse("unix:/s", 0).unwrap(),
            Target::Unix("/s".into())
        );
    }
}
