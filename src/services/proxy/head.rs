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

use crate::http::{self, ResponseHead};
use crate::net::Stream;
use crate::res::Res;

use super::sock::{recv, set_read_timeout};
use super::Fail;

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
    fn before_read(&mut self, s: &Stream, data: &[u8]) -> Result<MsgFlags, HeadRead> {
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
pub(super) fn read_head(
    s: &Stream,
    buf: &mut HeadBuf<'_>,
    mut clock: Option<&mut HeadClock>,
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
            Some(k) => k.before_read(s, buf.data())?,
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

    pub(super) fn fail(&self) -> Fail {
        match self {
            RespErr::Head(HeadRead::Timeout { .. }) => Fail::answer(Res::IDLE, 504),
            RespErr::Head(HeadRead::TooBig) => Fail::answer(Res::HTTP_HEAD_TOO_LARGE, 502),
            RespErr::Head(HeadRead::Io { .. }) => Fail::answer(Res::SERVER_ERR, 502),
            RespErr::Head(HeadRead::Closed { .. }) | RespErr::Bad => {
                Fail::answer(Res::HTTP_BAD_REPLY, 502)
            }
        }
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
        let end = read_head(srv, sb, None).map_err(RespErr::Head)?;
        match http::parse_response(&sb.data()[..end], head_req, out) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => sb.scanned = end,
            Err(_) => return Err(RespErr::Bad),
        }
    }
}
