//! Bodies: copying a request or response body by its framing (a length,
//! chunked coding, or up to the origin's close), under the session's
//! bandwidth limits and traffic quota.
//!
//! A body moves through a 64 KiB buffer borrowed from the shared pool
//! (`bufpool`, the relay's too) only while it moves, or with `-s` through
//! a pipe from the same module's pool with splice(), never copied to user
//! space. Chunked bodies are relayed as they are; a `ChunkScanner` only
//! finds where they end.
//!
//! Invariants: a copy stops exactly at the body's end (bytes read past it
//! go to the caller); every error says which socket it came from (`Side`);
//! each read is counted by the limiter, and waits while a bandwidth limit
//! says so; each read of the server and write to it that moved bytes is
//! counted in the request's `Ops` (TrafficPlugin's `p` form: a write is
//! one buffer sent whole, with splice() one splice() call).

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::bufpool::{Buf, Pipe};
use crate::limit::{Permit, SessionLimits};
use crate::net::Stream;
use crate::proto::http::ChunkScanner;
use crate::traffic::Ops;

use super::sock::write_all_v;

/// Which socket an IO error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Server,
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
    lim: Option<&SessionLimits>,
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

/// A read of `from` moved bytes: one read of the server, if it is.
#[inline]
pub(super) fn count_read(ops: &mut Ops, from: Side) {
    ops.reads += u64::from(from == Side::Server);
}

/// A write to `to` moved bytes: one write to the server, if it is.
#[inline]
pub(super) fn count_write(ops: &mut Ops, to: Side) {
    ops.writes += u64::from(to == Side::Server);
}

/// One read of at most `want` bytes, counted by the limiter (and in
/// `ops`).
pub(super) fn read_some(
    src: &Stream,
    buf: &mut [u8],
    from: Side,
    lim: Option<&SessionLimits>,
    ops: &mut Ops,
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
                if n > 0 {
                    count_read(ops, from);
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
    lim: Option<&SessionLimits>,
    splice: bool,
    ops: &mut Ops,
) -> Moved {
    // A TLS client's bytes pass through rustls: no splice.
    if splice && n >= SPLICE_MIN && !src.is_tls() && !dst.is_tls() {
        return splice_body(src, dst, Some(n), from, lim, ops);
    }
    let mut buf = Buf::get();
    let b = buf.bytes();
    let mut left = n;
    while left > 0 {
        let want = b.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = read_some(src, &mut b[..want], from, lim, ops)?;
        if got == 0 {
            return Err((from, io::ErrorKind::UnexpectedEof.into()));
        }
        write_all_v(dst, &b[..got], &[]).map_err(|e| (other(from), e))?;
        count_write(ops, other(from));
        left -= got as u64;
    }
    Ok(n)
}

/// Copy until the origin closes (a response without a length).
pub(super) fn copy_to_eof(
    src: &Stream,
    dst: &Stream,
    lim: Option<&SessionLimits>,
    splice: bool,
    ops: &mut Ops,
) -> Moved {
    if splice && !src.is_tls() && !dst.is_tls() {
        return splice_body(src, dst, None, Side::Server, lim, ops);
    }
    let mut buf = Buf::get();
    let b = buf.bytes();
    let mut total = 0;
    loop {
        let got = read_some(src, b, Side::Server, lim, ops)?;
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

/// `-s`: move a body of `n` bytes (None: up to EOF) from `src` to `dst`
/// through a pipe with splice(), never copied to user space.
fn splice_body(
    src: &Stream,
    dst: &Stream,
    n: Option<u64>,
    from: Side,
    lim: Option<&SessionLimits>,
    ops: &mut Ops,
) -> Moved {
    use nix::fcntl::SpliceFFlags;
    // A pooled pipe (`bufpool`): blocking ends, so the sockets' own
    // timeouts govern each splice(), as they govern read() and write().
    let mut pipe = Pipe::get().map_err(|e| (from, e.into()))?;
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
            match pipe.fill(src.as_fd(), want, SpliceFFlags::SPLICE_F_MOVE) {
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
        count_read(ops, from);
        while pipe.inflight() > 0 {
            match pipe.drain(dst.as_fd(), SpliceFFlags::SPLICE_F_MOVE) {
                Ok(0) => return Err((other(from), io::ErrorKind::WriteZero.into())),
                Ok(_) => count_write(ops, other(from)),
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
    lim: Option<&SessionLimits>,
    ops: &mut Ops,
    mut past: impl FnMut(&[u8]),
) -> Moved {
    let mut buf = Buf::get();
    let b = buf.bytes();
    let mut total = 0;
    while !sc.done() {
        let got = read_some(src, b, from, lim, ops)?;
        if got == 0 {
            return Err((from, io::ErrorKind::UnexpectedEof.into()));
        }
        let k = sc.feed(&b[..got]).map_err(|()| (from, bad_chunk()))?;
        write_all_v(dst, &b[..k], &[]).map_err(|e| (other(from), e))?;
        count_write(ops, other(from));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::proxy::sock::testing::{pattern, tcp_pair, unix_pair};
    use std::thread;

    /// Everything `r` gets until its peer closes, read on another thread.
    fn drain(r: Stream) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let mut v = Vec::new();
            (&r).read_to_end(&mut v).expect("read to the end");
            v
        })
    }

    /// Write `data` on another thread, then close.
    fn feed(w: Stream, data: Vec<u8>) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            write_all_v(&w, &data, &[]).expect("write");
        })
    }

    const CHUNKED: &[u8] = b"4\r\nWiki\r\n5;ext=\"a b\"\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: v\r\n\r\n";
    const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn chunked_copy_splits_anywhere_and_stops_at_the_end() {
        for at in 0..=CHUNKED.len() {
            let (src_w, src_r) = unix_pair();
            let (dst_w, dst_r) = unix_pair();
            let copier = thread::spawn(move || {
                let mut sc = ChunkScanner::new();
                let mut past = Vec::new();
                let got = copy_chunked(
                    &src_r,
                    &dst_w,
                    Side::Client,
                    &mut sc,
                    None,
                    &mut Ops::default(),
                    |b| past.extend_from_slice(b),
                );
                (got.ok(), past, src_r)
            });
            write_all_v(&src_w, &CHUNKED[..at], &[]).unwrap();
            // The first part is passed on before the rest exists.
            let mut first = vec![0u8; at];
            (&dst_r).read_exact(&mut first).unwrap();
            assert_eq!(first, &CHUNKED[..at]);
            write_all_v(&src_w, &CHUNKED[at..], NEXT).unwrap();
            drop(src_w);
            let (got, past, src_r) = copier.join().unwrap();
            assert_eq!(got, Some(CHUNKED.len() as u64), "split at {at}");
            let mut rest = Vec::new();
            (&dst_r).read_to_end(&mut rest).unwrap();
            assert_eq!(rest, &CHUNKED[at..], "split at {at}");
            // Not a byte of the next request is lost or forwarded: what
            // the copy read past the end went to `past`, the rest is
            // still unread.
            let mut unread = Vec::new();
            (&src_r).read_to_end(&mut unread).unwrap();
            assert_eq!([&past[..], &unread[..]].concat(), NEXT, "split at {at}");
            if at == CHUNKED.len() {
                assert!(past.is_empty(), "a finished body reads no further");
            }
        }
    }

    #[test]
    fn chunked_copy_refuses_a_bad_chunk_line() {
        for (body, side) in [
            (&b"zz\r\nhello\r\n0\r\n\r\n"[..], Side::Client),
            (&b"5\r\nhello\r\n5x\r\n"[..], Side::Server),
        ] {
            let (src_w, src_r) = unix_pair();
            let (dst_w, _dst_r) = unix_pair();
            write_all_v(&src_w, body, &[]).unwrap();
            let mut sc = ChunkScanner::new();
            match copy_chunked(
                &src_r,
                &dst_w,
                side,
                &mut sc,
                None,
                &mut Ops::default(),
                |_| {},
            ) {
                Err((s, e)) => {
                    assert_eq!(s, side);
                    assert!(is_bad_chunk(&e), "{e}");
                }
                Ok(n) => panic!("a bad chunk line was copied ({n} bytes)"),
            }
        }
    }

    #[test]
    fn chunked_copy_reports_eof_before_the_last_chunk() {
        let (src_w, src_r) = unix_pair();
        let (dst_w, _dst_r) = unix_pair();
        write_all_v(&src_w, b"5\r\nhel", &[]).unwrap();
        drop(src_w);
        let mut sc = ChunkScanner::new();
        match copy_chunked(
            &src_r,
            &dst_w,
            Side::Server,
            &mut sc,
            None,
            &mut Ops::default(),
            |_| {},
        ) {
            Err((Side::Server, e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{:?}", other.map_err(|(s, e)| (s, e.kind()))),
        }
    }

    /// `copy_exact` of an `n`-byte body followed by a request, on socket
    /// pairs `pair` makes, spliced or not: the body arrives whole and the
    /// request stays unread.
    fn exact_copy(pair: fn() -> (Stream, Stream), n: usize, from: Side, splice: bool) {
        let (src_w, src_r) = pair();
        let (dst_w, dst_r) = pair();
        let mut data = pattern(n);
        data.extend_from_slice(NEXT);
        let w = feed(src_w, data.clone());
        let out = drain(dst_r);
        let got = copy_exact(
            &src_r,
            &dst_w,
            n as u64,
            from,
            None,
            splice,
            &mut Ops::default(),
        );
        assert_eq!(got.ok(), Some(n as u64));
        drop(dst_w);
        assert_eq!(out.join().unwrap(), &data[..n]);
        w.join().unwrap();
        let mut unread = Vec::new();
        (&src_r).read_to_end(&mut unread).unwrap();
        assert_eq!(unread, NEXT, "bytes after the body stay unread");
    }

    /// `copy_to_eof` of `n` bytes on socket pairs `pair` makes, spliced
    /// or not: all of them, until the close.
    fn copy_all(pair: fn() -> (Stream, Stream), n: usize, splice: bool) {
        let (src_w, src_r) = pair();
        let (dst_w, dst_r) = pair();
        let data = pattern(n);
        let w = feed(src_w, data.clone());
        let out = drain(dst_r);
        let got = copy_to_eof(&src_r, &dst_w, None, splice, &mut Ops::default());
        w.join().unwrap();
        assert_eq!(got.ok(), Some(n as u64));
        drop(dst_w);
        assert_eq!(out.join().unwrap(), data);
    }

    #[test]
    fn exact_copy_moves_n_bytes_and_no_more() {
        exact_copy(unix_pair, 200_000, Side::Client, false);
    }

    #[test]
    fn copies_count_the_servers_reads_and_writes() {
        // A body the client sent in one piece: one write to the server.
        for (from, want) in [
            (
                Side::Client,
                Ops {
                    writes: 1,
                    ..Ops::default()
                },
            ),
            (
                Side::Server,
                Ops {
                    reads: 1,
                    ..Ops::default()
                },
            ),
        ] {
            let (src_w, src_r) = unix_pair();
            let (dst_w, dst_r) = unix_pair();
            write_all_v(&src_w, b"0123456789", &[]).unwrap();
            let out = drain(dst_r);
            let mut ops = Ops::default();
            assert_eq!(
                copy_exact(&src_r, &dst_w, 10, from, None, false, &mut ops).ok(),
                Some(10)
            );
            drop(dst_w);
            assert_eq!(out.join().unwrap(), b"0123456789");
            assert_eq!(ops, want, "{from:?}");
        }
    }

    #[test]
    fn exact_copy_blames_the_side_that_failed() {
        // The source closes early: the source's side, unexpected EOF.
        let (src_w, src_r) = unix_pair();
        let (dst_w, _dst_r) = unix_pair();
        write_all_v(&src_w, b"0123456789", &[]).unwrap();
        drop(src_w);
        match copy_exact(
            &src_r,
            &dst_w,
            20,
            Side::Server,
            None,
            false,
            &mut Ops::default(),
        ) {
            Err((Side::Server, e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{:?}", other.map_err(|(s, e)| (s, e.kind()))),
        }
        // The destination is gone: the other side's error.
        let (src_w, src_r) = unix_pair();
        let (dst_w, dst_r) = unix_pair();
        drop(dst_r);
        write_all_v(&src_w, b"0123456789", &[]).unwrap();
        match copy_exact(
            &src_r,
            &dst_w,
            10,
            Side::Client,
            None,
            false,
            &mut Ops::default(),
        ) {
            Err((Side::Server, e)) => assert_eq!(e.kind(), io::ErrorKind::BrokenPipe),
            other => panic!("{:?}", other.map_err(|(s, e)| (s, e.kind()))),
        }
    }

    #[test]
    fn copy_to_eof_moves_everything_until_the_close() {
        copy_all(unix_pair, 150_001, false);
    }

    #[test]
    fn splice_moves_a_large_body_byte_exact() {
        let n = 3 * PIPE_CAP + 12_345;
        assert!(n as u64 > SPLICE_MIN);
        exact_copy(tcp_pair, n, Side::Server, true);
    }

    #[test]
    fn splice_to_eof_and_early_eof() {
        copy_all(tcp_pair, 5 * PIPE_CAP + 1, true);

        // A length the source does not deliver: its side, unexpected EOF.
        let (src_w, src_r) = tcp_pair();
        let (dst_w, dst_r) = tcp_pair();
        let w = feed(src_w, pattern(40_000));
        let out = drain(dst_r);
        match copy_exact(
            &src_r,
            &dst_w,
            50_000,
            Side::Client,
            None,
            true,
            &mut Ops::default(),
        ) {
            Err((Side::Client, e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{:?}", other.map_err(|(s, e)| (s, e.kind()))),
        }
        w.join().unwrap();
        drop(dst_w);
        assert_eq!(out.join().unwrap(), pattern(40_000));
    }
}
