//! Where a relayed direction's bytes wait between read and write: a
//! buffer from the pool, a pipe for `splice()`, or a buffer that runs the
//! `clidata`/`srvdata` filters. The loop that moves them is the parent's.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;
use nix::sys::socket::{recv, send, MsgFlags};

use crate::bufpool::{self, Pipe};
use crate::net::Stream;
use crate::service::DEFAULT_BUFSIZE;

/// The `clidata`/`srvdata` filters a relay runs, and what their ACEs
/// are matched against.
#[derive(Clone, Copy)]
pub struct DataFilter<'a> {
    pub filters: &'a crate::filter::Filters,
    pub query: crate::acl::Query<'a>,
    /// `filtermaxsize`: the window of each direction.
    pub max: usize,
}

/// Where a direction's bytes wait between read and write.
pub(super) trait Channel {
    /// Room for more input.
    fn has_space(&self) -> bool;
    /// How many bytes the next fill may take.
    fn room(&self) -> usize;
    /// Bytes read and not yet written.
    fn pending(&self) -> bool;
    /// Read at most `max` bytes from `src` into the channel.
    fn fill(&mut self, src: &Stream, max: usize) -> Result<usize, Errno>;
    /// Write from the channel to `dst`.
    fn drain(&mut self, dst: &Stream) -> Result<usize, Errno>;
    /// The channel is idle: give back what can be given back.
    fn release(&mut self) {}
    /// A filter refused the data (the session ends with code 19).
    fn denied(&self) -> bool {
        false
    }
    /// A filter holds bytes back, waiting for more.
    fn holds(&self) -> bool {
        false
    }
    /// The source paused: let out what a filter holds.
    fn flush(&mut self) {}
}

/// A direction through the data filters of its type: what is read goes
/// through a `filter::Stream` (which holds back a window's tail until more
/// comes or the source ends), what it lets out waits to be written.
pub(super) struct FilterBuf<'a> {
    f: DataFilter<'a>,
    /// None: no filter of this direction's type; bytes pass unchanged.
    stream: Option<crate::filter::Stream>,
    read: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
    size: usize,
    denied: bool,
}

impl<'a> FilterBuf<'a> {
    pub(super) fn new(f: DataFilter<'a>, kind: u8, size: usize) -> FilterBuf<'a> {
        let stream =
            (f.filters.has(kind) && f.max > 0).then(|| crate::filter::Stream::new(kind, f.max));
        FilterBuf {
            f,
            stream,
            read: Vec::new(),
            out: Vec::new(),
            sent: 0,
            size: size.max(1),
            denied: false,
        }
    }
}

impl Channel for FilterBuf<'_> {
    fn has_space(&self) -> bool {
        !self.denied && self.out.len() - self.sent < self.size
    }
    fn room(&self) -> usize {
        self.size
    }
    fn pending(&self) -> bool {
        self.sent < self.out.len()
    }
    fn fill(&mut self, src: &Stream, max: usize) -> Result<usize, Errno> {
        let want = self.size.min(max);
        self.read.resize(want, 0);
        let n = if src.is_tls() {
            src.recv_flags(&mut self.read, MsgFlags::MSG_DONTWAIT)
                .map_err(errno)?
        } else {
            recv(src.as_raw_fd(), &mut self.read, MsgFlags::MSG_DONTWAIT)?
        };
        match &mut self.stream {
            None => self.out.extend_from_slice(&self.read[..n]),
            Some(s) => {
                let (f, q) = (self.f.filters, &self.f.query);
                if s.push(f, q, &self.read[..n], n == 0, &mut self.out)
                    .is_err()
                {
                    self.denied = true;
                }
            }
        }
        Ok(n)
    }
    fn drain(&mut self, dst: &Stream) -> Result<usize, Errno> {
        let n = if dst.is_tls() {
            dst.send_flags(
                &[io::IoSlice::new(&self.out[self.sent..])],
                MsgFlags::MSG_DONTWAIT,
            )
            .map_err(errno)?
        } else {
            send(
                dst.as_raw_fd(),
                &self.out[self.sent..],
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            )?
        };
        self.sent += n;
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
        Ok(n)
    }
    fn release(&mut self) {
        if !self.pending() {
            self.out = Vec::new();
        }
        self.read = Vec::new();
    }
    fn denied(&self) -> bool {
        self.denied
    }
    fn holds(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.held() > 0)
    }
    fn flush(&mut self) {
        if let Some(s) = &mut self.stream {
            if s.flush(self.f.filters, &self.f.query, &mut self.out)
                .is_err()
            {
                self.denied = true;
            }
        }
    }
}

// The shared pool's buffers are those of a relay with the default `-b`:
// only they are pooled (`bufpool`), so a burst of sessions does not
// allocate and free 128 KiB each, and idle sessions hold none.
const _: () = assert!(bufpool::SIZE == DEFAULT_BUFSIZE);

/// A direction's buffer: borrowed from the pool (`bufpool`) when a read
/// needs it, given back when the direction is idle.
pub(super) struct CopyBuf {
    buf: Option<Box<[u8]>>,
    size: usize,
    start: usize,
    end: usize,
}

impl CopyBuf {
    pub(super) fn new(size: usize) -> CopyBuf {
        CopyBuf {
            buf: None,
            size,
            start: 0,
            end: 0,
        }
    }

    fn buffer(&mut self) -> &mut [u8] {
        let size = self.size;
        self.buf.get_or_insert_with(|| bufpool::take(size))
    }
}

impl Channel for CopyBuf {
    fn has_space(&self) -> bool {
        self.end < self.size
    }
    fn room(&self) -> usize {
        self.size - self.end
    }
    fn pending(&self) -> bool {
        self.end > self.start
    }
    fn fill(&mut self, src: &Stream, max: usize) -> Result<usize, Errno> {
        let end = self.end;
        let stop = end.saturating_add(max).min(self.size);
        // Both ends are sockets (TCP or unix), or TLS sessions over one:
        // a session decrypts what the socket has now (`tls`).
        let n = if src.is_tls() {
            src.recv_flags(&mut self.buffer()[end..stop], MsgFlags::MSG_DONTWAIT)
                .map_err(errno)?
        } else {
            recv(
                src.as_raw_fd(),
                &mut self.buffer()[end..stop],
                MsgFlags::MSG_DONTWAIT,
            )?
        };
        self.end += n;
        Ok(n)
    }
    fn drain(&mut self, dst: &Stream) -> Result<usize, Errno> {
        let Some(buf) = &self.buf else { return Ok(0) };
        let n = if dst.is_tls() {
            dst.send_flags(
                &[io::IoSlice::new(&buf[self.start..self.end])],
                MsgFlags::MSG_DONTWAIT,
            )
            .map_err(errno)?
        } else {
            send(
                dst.as_raw_fd(),
                &buf[self.start..self.end],
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            )?
        };
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(n)
    }
    fn release(&mut self) {
        if self.pending() {
            return;
        }
        if let Some(b) = self.buf.take() {
            bufpool::give(b);
        }
    }
}

impl Drop for CopyBuf {
    fn drop(&mut self) {
        self.start = 0;
        self.end = 0;
        self.release();
    }
}

/// A pipe for splice(): bytes go socket -> pipe -> socket inside the kernel.
/// One of the default size comes from the shared pool (`bufpool`) and goes
/// back to it, empty, when the session ends.
pub(super) struct SplicePipe {
    pipe: Option<Pipe>,
    cap: usize,
}

impl SplicePipe {
    pub(super) fn new(cap: usize) -> SplicePipe {
        // A pipe holds 64 KiB unless resized; `-b` above that resizes it
        // when it is made (see `pipe`).
        SplicePipe { pipe: None, cap }
    }

    fn pipe(&mut self) -> Result<&mut Pipe, Errno> {
        if self.pipe.is_none() {
            use nix::fcntl::{fcntl, FcntlArg};
            // A pipe resized for `-b` is the session's own: the pool keeps
            // pipes of the default size only.
            let p = if self.cap > 65536 {
                Pipe::own()?
            } else {
                Pipe::get()?
            };
            let w = p.write_end();
            // The pipe's real size bounds what may be in flight: more than
            // that would make splice() block or fail.
            let size = if self.cap > 65536 {
                let want = self.cap.min(i32::MAX as usize) as i32;
                fcntl(w, FcntlArg::F_SETPIPE_SZ(want)).or_else(|_| fcntl(w, FcntlArg::F_GETPIPE_SZ))
            } else {
                fcntl(w, FcntlArg::F_GETPIPE_SZ)
            };
            self.cap = self.cap.min(size.map_or(65536, |n| n.max(4096) as usize));
            self.pipe = Some(p);
        }
        Ok(self.pipe.as_mut().expect("just created"))
    }

    /// Bytes in the pipe.
    fn inflight(&self) -> usize {
        self.pipe.as_ref().map_or(0, Pipe::inflight)
    }
}

impl Channel for SplicePipe {
    fn has_space(&self) -> bool {
        self.inflight() < self.cap
    }
    fn room(&self) -> usize {
        self.cap.saturating_sub(self.inflight())
    }
    fn pending(&self) -> bool {
        self.inflight() > 0
    }
    // The pool's pipes have blocking ends; SPLICE_F_NONBLOCK makes each
    // splice() as non-blocking as the relay needs (see `bufpool`).
    fn fill(&mut self, src: &Stream, max: usize) -> Result<usize, Errno> {
        use nix::fcntl::SpliceFFlags;
        self.pipe()?;
        let room = self.cap.saturating_sub(self.inflight()).min(max);
        self.pipe()?.fill(
            src.as_fd(),
            room,
            SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE,
        )
    }
    fn drain(&mut self, dst: &Stream) -> Result<usize, Errno> {
        use nix::fcntl::SpliceFFlags;
        self.pipe()?.drain(
            dst.as_fd(),
            SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE,
        )
    }
}

/// The errno of a stream error; a TLS session's own errors (a bad
/// record) have none and count as EPROTO.
pub(super) fn errno(e: io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) => Errno::from_raw(n),
        None if e.kind() == io::ErrorKind::WouldBlock => Errno::EAGAIN,
        None => Errno::EPROTO,
    }
}
