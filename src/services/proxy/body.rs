//! Bodies: copying a request or response body by its framing (a length,
//! chunked coding, or up to the origin's close), under the session's
//! bandwidth limits and traffic quota.
//!
//! A body moves through a 64 KiB buffer borrowed from a pool only while
//! it moves, or with `-s` through a pooled pipe with splice(), never
//! copied to user space. Chunked bodies are relayed as they are; a
//! `ChunkScanner` only finds where they end.
//!
//! Invariants: a copy stops exactly at the body's end (bytes read past it
//! go to the caller); every error says which socket it came from (`Side`);
//! each read is counted by the limiter, and waits while a bandwidth limit
//! says so.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::http::ChunkScanner;
use crate::limit::{Permit, Session as Limits};
use crate::net::Stream;
use crate::services::DEFAULT_BUFSIZE;

use super::sock::write_all_v;

/// Which socket an IO error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Server,
}

/// Body buffers of `DEFAULT_BUFSIZE` waiting for the next body.
static POOL: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());
/// Most buffers the pool keeps (4 MiB).
const POOL_MAX: usize = 64;

/// A body buffer borrowed from the pool; returned on drop.
struct BodyBuf(Option<Box<[u8]>>);

impl BodyBuf {
    fn get() -> BodyBuf {
        let pooled = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
        BodyBuf(Some(pooled.unwrap_or_else(|| {
            vec![0u8; DEFAULT_BUFSIZE].into_boxed_slice()
        })))
    }

    fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for BodyBuf {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_MAX {
                pool.push(b);
            }
        }
    }
}

type Moved = Result<u64, (Side, io::Error)>;

fn other(side: Side) -> Side {
    match side {
        Side::Client => Side::Server,
        Side::Server => Side::Client,
    }
}

/// The error a copy ends with when the session's traffic quota is used up.
#[derive(Debug)]
struct QuotaUsed;

impl std::fmt::Display for QuotaUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("traffic limit reached")
    }
}

impl std::error::Error for QuotaUsed {}

pub(super) fn is_quota(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<QuotaUsed>())
}

/// How much may be read now in direction `out` (client to server) under
/// the session's limits: waits while a bandwidth limit says so.
fn gate(
    lim: Option<&Limits>,
    out: bool,
    want: usize,
    from: Side,
) -> Result<usize, (Side, io::Error)> {
    let Some(l) = lim else { return Ok(want) };
    loop {
        let now = Instant::now();
        match l.permit(out, now) {
            Permit::Go(n) => return Ok(want.min(n.max(1))),
            Permit::Wait(until) => std::thread::sleep((until - now).min(Duration::from_secs(1))),
            Permit::Stop => return Err((from, io::Error::other(QuotaUsed))),
        }
    }
}

/// One read of at most `want` bytes, counted by the limiter.
fn read_some(
    src: &Stream,
    buf: &mut [u8],
    from: Side,
    lim: Option<&Limits>,
) -> Result<usize, (Side, io::Error)> {
    let out = from == Side::Client;
    let want = gate(lim, out, buf.len(), from)?;
    let mut r = src;
    loop {
        match r.read(&mut buf[..want]) {
            Ok(n) => {
                if let Some(l) = lim {
                    l.used(out, n, Instant::now());
                }
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((from, e)),
        }
    }
}

/// Copy exactly `n` bytes from `src` (which is `from`) to `dst`; with
/// `splice` (`-s`) inside the kernel, unless it is little.
pub(super) fn copy_exact(
    src: &Stream,
    dst: &Stream,
    n: u64,
    from: Side,
    lim: Option<&Limits>,
    splice: bool,
) -> Moved {
    if splice && n >= SPLICE_MIN {
        return splice_body(src, dst, Some(n), from, lim);
    }
    let mut buf = BodyBuf::get();
    let b = buf.bytes();
    let mut left = n;
    while left > 0 {
        let want = b.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = read_some(src, &mut b[..want], from, lim)?;
        if got == 0 {
            return Err((from, io::ErrorKind::UnexpectedEof.into()));
        }
        write_all_v(dst, &b[..got], &[]).map_err(|e| (other(from), e))?;
        left -= got as u64;
    }
    Ok(n)
}

/// Copy until the origin closes (a response without a length).
pub(super) fn copy_to_eof(src: &Stream, dst: &Stream, lim: Option<&Limits>, splice: bool) -> Moved {
    if splice {
        return splice_body(src, dst, None, Side::Server, lim);
    }
    let mut buf = BodyBuf::get();
    let b = buf.bytes();
    let mut total = 0;
    loop {
        let got = read_some(src, b, Side::Server, lim)?;
        if got == 0 {
            return Ok(total);
        }
        write_all_v(dst, &b[..got], &[]).map_err(|e| (Side::Client, e))?;
        total += got as u64;
    }
}

/// Bodies shorter than this are copied even with `-s`: for them the two
/// splice() calls cost as much as a read and a write.
const SPLICE_MIN: u64 = 16 * 1024;
/// Bytes moved per splice() pair: what a pipe holds by default.
const PIPE_CAP: usize = 64 * 1024;

/// Pipes for splice(), empty, waiting for the next body (as `POOL`).
static PIPES: Mutex<Vec<(OwnedFd, OwnedFd)>> = Mutex::new(Vec::new());

/// A pipe borrowed from `PIPES`; returned on drop if it is empty.
struct Pipe {
    fds: Option<(OwnedFd, OwnedFd)>,
    /// Bytes in the pipe.
    inflight: usize,
}

impl Pipe {
    fn get() -> io::Result<Pipe> {
        let pooled = PIPES.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let fds = match pooled {
            Some(p) => p,
            // Blocking ends: the sockets' own timeouts then govern each
            // splice(), as they govern read() and write(); a blocking pipe
            // never makes one wait, as it is empty before every fill and
            // drained of what is in it only.
            None => nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?,
        };
        Ok(Pipe {
            fds: Some(fds),
            inflight: 0,
        })
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        if let Some(p) = self.fds.take().filter(|_| self.inflight == 0) {
            let mut pool = PIPES.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_MAX {
                pool.push(p);
            }
        }
    }
}

/// `-s`: move a body of `n` bytes (None: up to EOF) from `src` to `dst`
/// through a pipe with splice(), never copied to user space.
fn splice_body(
    src: &Stream,
    dst: &Stream,
    n: Option<u64>,
    from: Side,
    lim: Option<&Limits>,
) -> Moved {
    use nix::fcntl::{splice, SpliceFFlags};
    let mut pipe = Pipe::get().map_err(|e| (from, e))?;
    let Some((r, w)) = pipe.fds.as_ref().map(|(r, w)| (r.as_fd(), w.as_fd())) else {
        return Ok(0);
    };
    let out = from == Side::Client;
    let mut left = n.unwrap_or(u64::MAX);
    let mut total = 0u64;
    while left > 0 {
        let want = gate(
            lim,
            out,
            PIPE_CAP.min(usize::try_from(left).unwrap_or(usize::MAX)),
            from,
        )?;
        let got = loop {
            match splice(
                src.as_fd(),
                None,
                w,
                None,
                want,
                SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(k) => break k,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err((from, e.into())),
            }
        };
        if got == 0 {
            return match n {
                Some(_) => Err((from, io::ErrorKind::UnexpectedEof.into())),
                None => Ok(total),
            };
        }
        if let Some(l) = lim {
            l.used(out, got, Instant::now());
        }
        pipe.inflight = got;
        while pipe.inflight > 0 {
            match splice(
                r,
                None,
                dst.as_fd(),
                None,
                pipe.inflight,
                SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(0) => return Err((other(from), io::ErrorKind::WriteZero.into())),
                Ok(k) => pipe.inflight -= k,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err((other(from), e.into())),
            }
        }
        left -= got as u64;
        total += got as u64;
    }
    Ok(total)
}

/// Copy a chunked body (its framing as it is) from `src` (which is
/// `from`) to `dst`, to its end. Bytes read past the end go to `past`:
/// a request's are the next pipelined request, a response's are dropped
/// and make the connection unfit for reuse.
pub(super) fn copy_chunked(
    src: &Stream,
    dst: &Stream,
    from: Side,
    sc: &mut ChunkScanner,
    lim: Option<&Limits>,
    mut past: impl FnMut(&[u8]),
) -> Moved {
    let mut buf = BodyBuf::get();
    let b = buf.bytes();
    let mut total = 0;
    while !sc.done() {
        let got = read_some(src, b, from, lim)?;
        if got == 0 {
            return Err((from, io::ErrorKind::UnexpectedEof.into()));
        }
        let k = sc.feed(&b[..got]).map_err(|()| (from, bad_chunk()))?;
        write_all_v(dst, &b[..k], &[]).map_err(|e| (other(from), e))?;
        total += k as u64;
        if k < got {
            past(&b[k..got]);
        }
    }
    Ok(total)
}

/// The error `copy_chunked` reports for a body that is not valid chunked
/// coding (no socket error has this kind).
fn bad_chunk() -> io::Error {
    io::ErrorKind::InvalidData.into()
}

pub(super) fn is_bad_chunk(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
}
