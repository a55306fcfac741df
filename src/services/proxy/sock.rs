//! Socket calls of the proxy: writing two slices in one sendmsg, a lazy
//! write timeout, and timeouts and readiness.
//!
//! Sockets stay blocking; their timeouts are set only when they change.

use std::io::{self, IoSlice};
use std::time::Duration;

use nix::sys::socket::MsgFlags;

use crate::net::Stream;

/// Write `a` then `b` with as few sendmsg calls as the socket allows.
/// (sendmsg, not writev: a socket needs none of the file layer's work.)
pub(super) fn write_all_v(s: &Stream, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut bufs = [IoSlice::new(a), IoSlice::new(b)];
    let mut slices = &mut bufs[..];
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match sendv(s, slices, MsgFlags::empty()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`write_all_v`] to a client socket whose write timeout may not be set
/// yet (`*wto` false): first without waiting; only if the socket cannot
/// take it all now is the timeout `t` set, and the rest written.
pub(super) fn send_lazy(
    s: &Stream,
    a: &[u8],
    b: &[u8],
    wto: &mut bool,
    t: Duration,
) -> io::Result<()> {
    if *wto {
        return write_all_v(s, a, b);
    }
    let n = loop {
        match sendv(
            s,
            &[IoSlice::new(a), IoSlice::new(b)],
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 0,
            Err(e) => return Err(e),
        }
    };
    if n == a.len() + b.len() {
        return Ok(());
    }
    set_write_timeout(s, wto, t)?;
    if n < a.len() {
        write_all_v(s, &a[n..], b)
    } else {
        write_all_v(s, &b[n - a.len()..], &[])
    }
}

/// One sendmsg() of `bufs`; never raises SIGPIPE. Through the session
/// for a TLS client (`ssl_serv`).
fn sendv(s: &Stream, bufs: &[IoSlice<'_>], flags: MsgFlags) -> io::Result<usize> {
    s.send_flags(bufs, flags)
}

/// One recv() into `buf` (MSG_PEEK looks at decrypted bytes under TLS).
pub(super) fn recv(s: &Stream, buf: &mut [u8], flags: MsgFlags) -> io::Result<usize> {
    s.recv_flags(buf, flags)
}

/// Set the write timeout `t` unless `*done` says it is set.
pub(super) fn set_write_timeout(s: &Stream, done: &mut bool, t: Duration) -> io::Result<()> {
    if !*done {
        socket2::SockRef::from(s).set_write_timeout(nonzero(t))?;
        *done = true;
    }
    Ok(())
}

pub(super) fn set_timeouts(s: &Stream, read: Duration, write: Duration) -> io::Result<()> {
    let sock = socket2::SockRef::from(s);
    sock.set_read_timeout(nonzero(read))?;
    sock.set_write_timeout(nonzero(write))
}

pub(super) fn set_read_timeout(s: &Stream, read: Duration) -> io::Result<()> {
    socket2::SockRef::from(s).set_read_timeout(nonzero(read))
}

/// A zero timeout means "none" to the socket API; 3proxy's 0 is "at once",
/// so make it the shortest wait instead.
fn nonzero(d: Duration) -> Option<Duration> {
    Some(d.max(Duration::from_millis(1)))
}

/// Wait up to `t` for `s` to become readable (or closed).
pub(super) fn readable_within(s: &Stream, t: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    if s.buffered() {
        return true;
    }
    // A TLS answer not all sent yet: the client waits for it first.
    if s.flush_within(t).is_err() {
        return false;
    }
    let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(t.as_millis().min(i32::MAX as u128) as i32)
        .unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, ms), Ok(n) if n > 0)
}

/// Connected socket pairs for the proxy's unit tests.
#[cfg(test)]
pub(super) mod testing {
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use crate::net::Stream;

    /// Long enough for any test step, short enough that a bug fails the
    /// test instead of hanging it.
    const BOUND: Duration = Duration::from_secs(10);

    /// A connected pair of unix stream sockets.
    pub fn unix_pair() -> (Stream, Stream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (a, b) = (Stream::Unix(a), Stream::Unix(b));
        a.set_timeout(Some(BOUND)).expect("timeout");
        b.set_timeout(Some(BOUND)).expect("timeout");
        (a, b)
    }

    /// A connected pair of TCP sockets on 127.0.0.1.
    pub fn tcp_pair() -> (Stream, Stream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        let (a, b) = (Stream::Tcp(a), Stream::Tcp(b));
        a.set_timeout(Some(BOUND)).expect("timeout");
        b.set_timeout(Some(BOUND)).expect("timeout");
        (a, b)
    }

    /// Bytes that show a lost, doubled or reordered byte.
    pub fn pattern(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8)
            .collect()
    }
}
