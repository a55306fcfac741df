//! Request and response heads: the head buffer, reading a head, and a
//! request head's deadlines.
//!
//! A head is read into a small buffer on the client thread's stack
//! (`HeadBuf`), spilled to the heap only for a bigger head and given back
//! between requests, so an idle keep-alive client holds no heap buffer.
//! Bytes already in the buffer (pipelined) are looked at before reading.
//!
//! Invariants: a head is at most `MAX_HEAD` bytes; bytes after a head stay
//! in the buffer for the caller (`data()` past `head_len`); a request head
//! is read within deadlines, not idle times (`HeadClock`), so a client
//! trickling bytes cannot hold its thread for ever.

use std::io;
use std::time::{Duration, Instant};

use nix::sys::socket::MsgFlags;

use crate::net::Stream;
use crate::proto::http::{self, ResponseHead};

use super::sock::{recv, set_read_timeout};

/// Largest request or response head (request line and fields); a bigger
/// request head is answered 431.
const MAX_HEAD: usize = 64 * 1024;
/// Head buffers start this small, on the stack: enough for a response
/// head with a small body (read in one go), and for the heads of most
/// requests (`SMALL_REQUEST`). Every stack page a client thread touches
/// stays resident while the thread lives: with 2000 clients each page is
/// 8 MB. So these are small (a bigger head spills to the heap), and the
/// deep paths (connecting, exchanging) do not stack their frames on one
/// another. A client thread touches 3 pages of stack.
pub(super) const SMALL: usize = 1536;
pub(super) const SMALL_REQUEST: usize = 1024;

/// A head buffer: `SMALL` bytes on the caller's stack, spilled to the heap
/// when a head is bigger (up to `MAX_HEAD`), and given back at rest.
pub(super) struct HeadBuf<'a> {
    small: &'a mut [u8],
    big: Vec<u8>,
    /// Unused bytes are `[start..end]`.
    start: usize,
    end: usize,
    /// How far past `start` a head end was looked for already.
    pub(super) scanned: usize,
    /// The length of the head just read.
    pub(super) head_len: usize,
    /// Reads that took bytes (TrafficPlugin counts the server's).
    pub(super) reads: u64,
}

impl<'a> HeadBuf<'a> {
    pub(super) fn new(small: &'a mut [u8]) -> HeadBuf<'a> {
        HeadBuf {
            small,
            big: Vec::new(),
            start: 0,
            end: 0,
            scanned: 0,
            head_len: 0,
            reads: 0,
        }
    }

    fn buf(&self) -> &[u8] {
        if self.big.is_empty() {
            self.small
        } else {
            &self.big
        }
    }

    pub(super) fn data(&self) -> &[u8] {
        &self.buf()[self.start..self.end]
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        self.scanned = 0;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Make room to read more; false when the data is `MAX_HEAD` already.
    fn make_room(&mut self) -> bool {
        let len = self.end - self.start;
        if len >= MAX_HEAD {
            return false;
        }
        let cap = self.buf().len();
        if self.end < cap {
            return true;
        }
        if self.start > 0 {
            let (s, e) = (self.start, self.end);
            if self.big.is_empty() {
                self.small.copy_within(s..e, 0);
            } else {
                self.big.copy_within(s..e, 0);
            }
            self.start = 0;
            self.end = len;
            return true;
        }
        let want = (cap * 2).min(MAX_HEAD);
        if self.big.is_empty() {
            let mut v = vec![0u8; want];
            v[..len].copy_from_slice(&self.small[..len]);
            self.big = v;
        } else {
            self.big.resize(want, 0);
        }
        true
    }

    fn read_from(&mut self, s: &Stream, flags: MsgFlags) -> io::Result<usize> {
        let end = self.end;
        let room = if self.big.is_empty() {
            &mut self.small[end..]
        } else {
            &mut self.big[end..]
        };
        let n = recv(s, room, flags)?;
        self.end += n;
        self.reads += u64::from(n > 0);
        Ok(n)
    }

    /// Put bytes read past a body back in front (the next pipelined
    /// request). Only called when the buffer is empty.
    pub(super) fn put_back(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            if !self.make_room() {
                return;
            }
            let end = self.end;
            let room = if self.big.is_empty() {
                &mut self.small[end..]
            } else {
                &mut self.big[end..]
            };
            let n = room.len().min(bytes.len() - at);
            room[..n].copy_from_slice(&bytes[at..at + n]);
            self.end += n;
            at += n;
        }
    }

    /// Between requests: give back a heap spill if the data fits on the
    /// stack again.
    pub(super) fn rest(&mut self) {
        if self.big.is_empty() {
            return;
        }
        let len = self.end - self.start;
        if len <= self.small.len() {
            self.small[..len].copy_from_slice(&self.big[self.start..self.end]);
            self.big = Vec::new();
            self.start = 0;
            self.end = len;
        }
    }
}

/// Why no head was read. `partial`: some bytes of it had arrived.
pub(super) enum HeadRead {
    Closed { partial: bool },
    Timeout { partial: bool },
    Io { partial: bool },
    TooBig,
}

/// The deadlines of a request head being read from a client (see
/// `Session::read_request`), and the client socket's read timeout.
pub(super) struct HeadClock {
    /// When the request line must be complete.
    pub(super) line_by: Instant,
    /// How long the rest of the head may take after the request line.
    pub(super) rest: Duration,
    /// When the whole head must be complete (once the line is in).
    pub(super) rest_by: Option<Instant>,
    /// The request line's time: the socket's read timeout while no byte
    /// of a head has come, set once and kept between requests.
    pub(super) window: Duration,
    /// The socket's read timeout as set (None: not yet).
    pub(super) rto: Option<Duration>,
}

impl HeadClock {
    /// Before a read of `data`'s next bytes: the flags for it, after the
    /// socket's timeout was fitted to the deadline. Timeout when the
    /// deadline has passed.
    fn before_read(
        &mut self,
        s: &Stream,
        data: &[u8],
        live: Option<&crate::live::Registration>,
    ) -> Result<MsgFlags, HeadRead> {
        if data.is_empty() {
            // Nothing of a head yet: a blocking read with the full window
            // (the fast path of a kept-alive client: no system call but
            // the read), or a first read that does not wait when the
            // timeout is not set yet (see `arm`).
            return Ok(if self.rto == Some(self.window) {
                MsgFlags::empty()
            } else {
                MsgFlags::MSG_DONTWAIT
            });
        }
        if let Some(l) = live {
            // A head that takes more than one read: its rate is watched.
            l.head(data.len());
        }
        let now = Instant::now();
        if self.rest_by.is_none() && data.contains(&b'\n') {
            self.rest_by = Some(now + self.rest);
        }
        let left = self
            .rest_by
            .unwrap_or(self.line_by)
            .saturating_duration_since(now);
        if left.is_zero() {
            return Err(HeadRead::Timeout { partial: true });
        }
        // A slow head: its socket waits no longer than the deadline. (The
        // next head's first wait sets the window again.)
        set_read_timeout(s, left).map_err(|_| HeadRead::Io { partial: true })?;
        self.rto = Some(left);
        Ok(MsgFlags::empty())
    }

    /// A read that was not to wait would have: set the window and wait.
    fn arm(&mut self, s: &Stream) -> Result<(), HeadRead> {
        set_read_timeout(s, self.window).map_err(|_| HeadRead::Io { partial: false })?;
        self.rto = Some(self.window);
        Ok(())
    }

    /// A read timed out: the deadline has passed, unless the socket's
    /// timeout ended earlier than it (then read on).
    fn expired(&self, partial: bool) -> bool {
        !partial
            || self
                .rest_by
                .unwrap_or(self.line_by)
                .saturating_duration_since(Instant::now())
                .is_zero()
    }
}

/// Read until `buf` holds a whole head (up to an empty line); its length.
/// Bytes already in `buf` (pipelined) are looked at first, so a read
/// happens only when the head is not there yet.
///
/// With a `clock` (a client's request head), reads keep its deadlines;
/// without, each read waits for the socket's own timeout (a response).
/// `live`: the session's entry, told how much of a head that takes more
/// than one read is in (`minrate`, `live::pressure`).
pub(super) fn read_head(
    s: &Stream,
    buf: &mut HeadBuf<'_>,
    mut clock: Option<&mut HeadClock>,
    live: Option<&crate::live::Registration>,
) -> Result<usize, HeadRead> {
    loop {
        if let Some(end) = http::find_head_end(buf.data(), buf.scanned) {
            buf.head_len = end;
            return Ok(end);
        }
        buf.scanned = buf.data().len();
        if !buf.make_room() {
            return Err(HeadRead::TooBig);
        }
        let partial = buf.end > buf.start;
        let flags = match clock.as_deref_mut() {
            Some(k) => k.before_read(s, buf.data(), live)?,
            None => MsgFlags::empty(),
        };
        match buf.read_from(s, flags) {
            Ok(0) => return Err(HeadRead::Closed { partial }),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    && flags.contains(MsgFlags::MSG_DONTWAIT) =>
            {
                if let Some(k) = clock.as_deref_mut() {
                    k.arm(s)?;
                }
            }
            Err(e) if crate::net::is_timeout(&e) => {
                if clock.as_deref().is_none_or(|k| k.expired(partial)) {
                    return Err(HeadRead::Timeout { partial });
                }
            }
            Err(_) => return Err(HeadRead::Io { partial }),
        }
    }
}

/// Why no response head came.
pub(super) enum RespErr {
    Head(HeadRead),
    Bad,
}

impl RespErr {
    /// Nothing at all came back: the connection was dead before the request.
    pub(super) fn nothing_read(&self) -> bool {
        matches!(
            self,
            RespErr::Head(HeadRead::Closed { partial: false } | HeadRead::Io { partial: false })
        )
    }
}

/// Read and parse one response head from the origin.
pub(super) fn read_response(
    srv: &Stream,
    sb: &mut HeadBuf<'_>,
    head_req: bool,
    out: &mut Vec<u8>,
) -> Result<ResponseHead, RespErr> {
    loop {
        let end = read_head(srv, sb, None, None).map_err(RespErr::Head)?;
        match http::parse_response(&sb.data()[..end], head_req, out) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => sb.scanned = end,
            Err(_) => return Err(RespErr::Bad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::Framing;
    use crate::services::proxy::sock::testing::unix_pair;
    use crate::services::proxy::sock::write_all_v;
    use std::io::Read;
    use std::thread;

    /// On a new socket pair, send `parts` one after another, `gap` apart,
    /// from another thread, then keep that end open until the reader
    /// closes its own: the reader's end and the thread.
    fn send_parts(parts: &[&[u8]], gap: Duration) -> (Stream, thread::JoinHandle<()>) {
        let (r, w) = unix_pair();
        let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        let t = thread::spawn(move || {
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    thread::sleep(gap);
                }
                if write_all_v(&w, p, &[]).is_err() {
                    return;
                }
            }
            // Wait for the reader to close its end (or the pair's bound).
            let mut b = [0u8; 1];
            let _ = (&w).read(&mut b);
        });
        (r, t)
    }

    #[test]
    fn headbuf_stays_small_then_spills_and_comes_back() {
        let mut small = [0u8; 16];
        let mut b = HeadBuf::new(&mut small);
        b.put_back(b"0123456789");
        assert_eq!(b.data(), b"0123456789");
        assert!(b.big.is_empty(), "ten bytes fit on the stack");
        let more: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        b.put_back(&more);
        assert!(!b.big.is_empty(), "50 bytes spill to the heap");
        let mut want = b"0123456789".to_vec();
        want.extend_from_slice(&more);
        assert_eq!(b.data(), &want[..]);
        // Still too big for the stack: `rest` keeps the spill.
        b.consume(20);
        b.rest();
        assert!(!b.big.is_empty());
        assert_eq!(b.data(), &want[20..]);
        // Small enough again: back on the stack, same bytes.
        b.consume(20);
        b.rest();
        assert!(b.big.is_empty(), "rest gives the heap buffer back");
        assert_eq!(b.data(), &want[40..]);
        b.consume(1000);
        assert!(b.data().is_empty());
        assert_eq!((b.start, b.end, b.scanned), (0, 0, 0));
    }

    #[test]
    fn headbuf_put_back_stops_at_max_head() {
        let mut small = [0u8; 16];
        let mut b = HeadBuf::new(&mut small);
        b.put_back(&vec![b'x'; MAX_HEAD + 100]);
        assert_eq!(b.data().len(), MAX_HEAD);
        assert!(!b.make_room(), "no room past MAX_HEAD");
    }

    #[test]
    fn read_head_across_writes_keeps_pipelined_bytes() {
        let parts: [&[u8]; 3] = [
            b"GET / HTTP/1.1\r\n",
            b"Host: a\r\nX: ",
            b"y\r\n\r\nGET /2 HTTP/1.1\r\n\r\nGE",
        ];
        let (r, t) = send_parts(&parts, Duration::from_millis(20));
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\n";
        let end = read_head(&r, &mut b, None, None).ok().expect("a head");
        assert_eq!(end, head.len());
        assert_eq!(b.head_len, head.len());
        assert_eq!(&b.data()[..end], &head[..]);
        assert_eq!(&b.data()[end..], b"GET /2 HTTP/1.1\r\n\r\nGE");
        // The next head is in the buffer already: no read is needed.
        b.consume(end);
        let end = read_head(&r, &mut b, None, None)
            .ok()
            .expect("pipelined head");
        assert_eq!(&b.data()[..end], b"GET /2 HTTP/1.1\r\n\r\n");
        b.consume(end);
        assert_eq!(b.data(), b"GE");
        drop(r);
        t.join().unwrap();
    }

    #[test]
    fn read_head_refuses_a_head_over_the_limit() {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 4096, b'a');
        let (r, t) = send_parts(&[&big], Duration::ZERO);
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        assert!(matches!(
            read_head(&r, &mut b, None, None),
            Err(HeadRead::TooBig)
        ));
        assert_eq!(b.data().len(), MAX_HEAD);
        drop(r);
        t.join().unwrap();
    }

    #[test]
    fn read_head_reports_eof_mid_head_and_before_one() {
        let (r, w) = unix_pair();
        write_all_v(&w, b"GET / HT", &[]).unwrap();
        drop(w);
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        assert!(matches!(
            read_head(&r, &mut b, None, None),
            Err(HeadRead::Closed { partial: true })
        ));
        assert_eq!(b.data(), b"GET / HT");

        let (r, w) = unix_pair();
        drop(w);
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        assert!(matches!(
            read_head(&r, &mut b, None, None),
            Err(HeadRead::Closed { partial: false })
        ));
    }

    fn clock(window: Duration, rest: Duration) -> HeadClock {
        HeadClock {
            line_by: Instant::now() + window,
            rest,
            rest_by: None,
            window,
            rto: None,
        }
    }

    /// Send `first`, then one byte every 50 ms until the reader leaves.
    fn trickle(w: Stream, first: &'static [u8]) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            if write_all_v(&w, first, &[]).is_err() {
                return;
            }
            for _ in 0..200 {
                thread::sleep(Duration::from_millis(50));
                if write_all_v(&w, b"x", &[]).is_err() {
                    return;
                }
            }
        })
    }

    /// Read a head that is `trickle`d after `first`, with the deadlines
    /// `clock(window, rest)`: it times out with something read, after at
    /// least `at_least` (and well before the trickle ends); then `check`
    /// looks at what was read and at the clock.
    fn trickled_times_out(
        first: &'static [u8],
        window: Duration,
        rest: Duration,
        at_least: Duration,
        check: impl FnOnce(&HeadBuf<'_>, &HeadClock),
    ) {
        let (r, w) = unix_pair();
        let t = trickle(w, first);
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        let mut k = clock(window, rest);
        let start = Instant::now();
        let got = read_head(&r, &mut b, Some(&mut k), None);
        let took = start.elapsed();
        assert!(matches!(got, Err(HeadRead::Timeout { partial: true })));
        assert!(took >= at_least, "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        check(&b, &k);
        drop(r);
        t.join().unwrap();
    }

    #[test]
    fn a_trickled_head_times_out_at_its_deadline() {
        // The request line is in at once; the rest of the head comes a
        // byte at a time, never completing: the rest's deadline (300 ms)
        // ends it, though bytes keep coming well within the window.
        let ms300 = Duration::from_millis(300);
        trickled_times_out(
            b"GET / HTTP/1.1\r\nX: ",
            Duration::from_secs(5),
            ms300,
            ms300,
            |b, _| assert!(b.data().starts_with(b"GET / HTTP/1.1\r\nX: x")),
        );
    }

    #[test]
    fn a_trickled_request_line_times_out_at_the_line_deadline() {
        trickled_times_out(
            b"G",
            Duration::from_millis(300),
            Duration::from_secs(5),
            Duration::from_millis(250),
            |_, k| assert!(k.rest_by.is_none(), "no line was complete"),
        );
    }

    #[test]
    fn a_head_within_its_deadlines_is_read() {
        let parts: [&[u8]; 3] = [b"GET / HT", b"TP/1.1\r\nHost: a\r\n", b"\r\n"];
        let (r, t) = send_parts(&parts, Duration::from_millis(30));
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        let mut k = clock(Duration::from_secs(2), Duration::from_secs(2));
        let end = read_head(&r, &mut b, Some(&mut k), None)
            .ok()
            .expect("a head");
        assert_eq!(&b.data()[..end], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(k.rest_by.is_some(), "the line's arrival started the rest");
        // The socket's timeout was fitted to what was left of a deadline.
        assert!(k.rto.is_some_and(|t| t <= Duration::from_secs(2)));
        drop(r);
        t.join().unwrap();
    }

    #[test]
    fn no_head_at_all_times_out_with_nothing_partial() {
        let (r, w) = unix_pair();
        let mut small = [0u8; SMALL_REQUEST];
        let mut b = HeadBuf::new(&mut small);
        let window = Duration::from_millis(200);
        let mut k = clock(window, Duration::from_secs(5));
        let start = Instant::now();
        let got = read_head(&r, &mut b, Some(&mut k), None);
        assert!(matches!(got, Err(HeadRead::Timeout { partial: false })));
        assert!(start.elapsed() >= Duration::from_millis(150));
        // The first read did not wait; then the window was set, once.
        assert_eq!(k.rto, Some(window));
        drop(w);
    }

    #[test]
    fn read_response_leaves_the_body_bytes() {
        let (r, w) = unix_pair();
        write_all_v(&w, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", &[]).unwrap();
        let mut small = [0u8; SMALL];
        let mut b = HeadBuf::new(&mut small);
        let mut out = Vec::new();
        let h = read_response(&r, &mut b, false, &mut out)
            .ok()
            .expect("a response head");
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(3));
        b.consume(h.len);
        assert_eq!(b.data(), b"abc");
        drop(w);
        let mut small = [0u8; SMALL];
        let mut b = HeadBuf::new(&mut small);
        let Err(e) = read_response(&r, &mut b, false, &mut out) else {
            panic!("a response head from a closed connection");
        };
        assert!(e.nothing_read(), "a dead connection is told apart");
    }
}
