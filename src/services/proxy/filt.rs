//! The `pcre` filters on the HTTP proxy (3proxy.cfg(5) "PCRE FILTERING"):
//! the request line, the forwarded request head, the response head, and
//! bodies, with what a filter may change in a head kept from breaking how
//! the message is framed.
//!
//! Only reached when the service has filters of the type (one test of
//! `Filters::has` on the request path); bodies without filters keep the
//! plain copy (and splice) path.

use std::io;

use crate::acl::Query;
use crate::client::Client;
use crate::filter::{Filters, Verdict};
use crate::limit::SessionLimits;
use crate::net::Stream;
use crate::traffic::Ops;

use super::body::{count_write, read_some, Side};

/// What a filter's ACE is matched against for this request (the clock
/// only if some ACE has weekdays or periods).
pub(super) fn query<'a>(
    fs: &Filters,
    c: &'a Client,
    user: Option<&'a str>,
    host: &'a str,
    port: u16,
    op: u32,
) -> Query<'a> {
    let (wday, daysec) = if fs.timed() {
        crate::access::local_clock(std::time::SystemTime::now())
    } else {
        (0, 0)
    };
    Query {
        wday,
        daysec,
        user,
        src: c.client_addr.map(|a| a.ip()),
        dst: c.req_addr.map(|a| a.ip()),
        host: (!host.is_empty()).then_some(host),
        port,
        op,
        ..Query::default()
    }
}

/// The lines of `head` that say how its message is framed.
fn framing_lines(head: &[u8]) -> Vec<Vec<u8>> {
    head.split(|&b| b == b'\n')
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with(b"content-length") || l.starts_with(b"transfer-encoding")
        })
        .map(<[u8]>::to_vec)
        .collect()
}

/// The first `words` words of the first line (the method of a request,
/// the version and status of a response).
fn lead(head: &[u8], words: usize) -> Vec<u8> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or(b"");
    line.split(|&b| b == b' ')
        .take(words)
        .collect::<Vec<_>>()
        .join(&b' ')
}

/// Run the filters of `kind` on a head: `closed` says whether it ends in
/// its blank line (a request head from `parse_request`) or not (a response
/// head before `end_response_head`). Err if a filter denies, or if a
/// rewrite would change the method or status, a framing field, or end the
/// head early: the proxy and the peer must agree where the message ends.
pub(super) fn head(
    fs: &Filters,
    kind: u8,
    q: &Query<'_>,
    head: &mut Vec<u8>,
    closed: bool,
    words: usize,
) -> Result<(), ()> {
    if closed {
        head.truncate(head.len().saturating_sub(2));
    }
    let before = (framing_lines(head), lead(head, words));
    let v = fs.check(kind, q, head);
    if !head.ends_with(b"\n") {
        head.extend_from_slice(b"\r\n");
    }
    let early_end = head.windows(2).any(|w| w == b"\n\n")
        || head.windows(3).any(|w| w == b"\n\r\n")
        || head.starts_with(b"\r\n");
    let after = (framing_lines(head), lead(head, words));
    if closed {
        head.extend_from_slice(b"\r\n");
    }
    if v == Verdict::Deny || early_end || before != after {
        return Err(());
    }
    Ok(())
}

/// Set the Content-Length field of `head` to `n`.
pub(super) fn set_length(head: &mut Vec<u8>, n: usize) {
    let mut out = Vec::with_capacity(head.len() + 8);
    for l in head.split_inclusive(|&b| b == b'\n') {
        if l.to_ascii_lowercase().starts_with(b"content-length:") {
            out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes());
        } else {
            out.extend_from_slice(l);
        }
    }
    *head = out;
}

/// Read `n` more bytes of a body from `src` onto `buf`.
pub(super) fn read_rest(
    src: &Stream,
    mut n: u64,
    from: Side,
    lim: Option<&SessionLimits>,
    buf: &mut Vec<u8>,
    ops: &mut Ops,
) -> Result<(), (Side, io::Error)> {
    let mut chunk = [0u8; 16 << 10];
    while n > 0 {
        let want = chunk.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        let got = read_some(src, &mut chunk[..want], from, lim, ops)?;
        if got == 0 {
            return Err((from, io::ErrorKind::UnexpectedEof.into()));
        }
        buf.extend_from_slice(&chunk[..got]);
        n -= got as u64;
    }
    Ok(())
}

/// How a streamed body ended badly.
pub(super) enum StreamErr {
    Io(Side, io::Error),
    /// A filter denied; whether the head had been sent by then.
    Denied {
        head_sent: bool,
    },
}

/// Stream a body that ends when the origin closes through the filters:
/// `first` is what came with the head; `head` is sent with the first bytes
/// the filters let out (so a deny before that can still be answered).
/// Returns the bytes written to the client, head included.
#[allow(clippy::too_many_arguments)]
pub(super) fn stream_to_eof(
    fs: &Filters,
    kind: u8,
    q: &Query<'_>,
    max: usize,
    src: &Stream,
    dst: &Stream,
    head: &[u8],
    first: &[u8],
    lim: Option<&SessionLimits>,
    ops: &mut Ops,
) -> Result<u64, StreamErr> {
    use super::sock::write_all_v;
    let mut f = crate::filter::Stream::new(kind, max);
    let mut out = Vec::new();
    let mut sent = 0u64;
    let mut head_sent = false;
    let mut chunk = vec![0u8; 16 << 10];
    let mut data: &[u8] = first;
    let mut end = false;
    loop {
        out.clear();
        if f.push(fs, q, data, end, &mut out).is_err() {
            return Err(StreamErr::Denied { head_sent });
        }
        if !out.is_empty() || (end && !head_sent) {
            let h: &[u8] = if head_sent { b"" } else { head };
            write_all_v(dst, h, &out).map_err(|e| StreamErr::Io(Side::Client, e))?;
            sent += (h.len() + out.len()) as u64;
            head_sent = true;
        }
        if end {
            return Ok(sent);
        }
        if f.held() > 0 && !super::sock::readable_within(src, crate::filter::FLUSH_AFTER) {
            // The origin paused: what is held goes out as it is.
            out.clear();
            if f.flush(fs, q, &mut out).is_err() {
                return Err(StreamErr::Denied { head_sent });
            }
            let h: &[u8] = if head_sent { b"" } else { head };
            write_all_v(dst, h, &out).map_err(|e| StreamErr::Io(Side::Client, e))?;
            sent += (h.len() + out.len()) as u64;
            head_sent = true;
        }
        let got = read_some(src, &mut chunk, Side::Server, lim, ops)
            .map_err(|(s, e)| StreamErr::Io(s, e))?;
        end = got == 0;
        data = &chunk[..got];
    }
}

/// Write `data` as one chunk (nothing if empty), after `head` if given.
fn send_chunk(dst: &Stream, head: &[u8], data: &[u8]) -> io::Result<u64> {
    use super::sock::write_all_v;
    let mut framed = Vec::with_capacity(head.len() + data.len() + 20);
    framed.extend_from_slice(head);
    if !data.is_empty() {
        framed.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(b"\r\n");
    }
    write_all_v(dst, &framed, &[])?;
    Ok(framed.len() as u64)
}

/// A chunked body through the filters: decoded (`sc` has scanned none of
/// it yet; `first` is what came with the head), filtered as a stream, and
/// sent as new chunks after `head` (empty if the head went out already),
/// with an empty trailer section. Bytes read past the body's end go to
/// `past`. Returns the bytes written.
#[allow(clippy::too_many_arguments)]
pub(super) fn stream_chunked(
    fs: &Filters,
    kind: u8,
    q: &Query<'_>,
    max: usize,
    src: &Stream,
    from: Side,
    dst: &Stream,
    head: &[u8],
    first: &[u8],
    lim: Option<&SessionLimits>,
    ops: &mut Ops,
    mut past: impl FnMut(&[u8]),
) -> Result<u64, StreamErr> {
    let to = match from {
        Side::Client => Side::Server,
        Side::Server => Side::Client,
    };
    let mut sc = crate::proto::http::ChunkScanner::new();
    let mut f = crate::filter::Stream::new(kind, max);
    let (mut payload, mut out) = (Vec::new(), Vec::new());
    let mut sent = 0u64;
    let mut head_sent = head.is_empty();
    let mut chunk = vec![0u8; 16 << 10];
    let mut data: &[u8] = first;
    let bad = || StreamErr::Io(from, io::ErrorKind::InvalidData.into());
    loop {
        payload.clear();
        let k = sc.feed_into(data, Some(&mut payload)).map_err(|()| bad())?;
        if k < data.len() {
            past(&data[k..]);
        }
        let end = sc.done();
        out.clear();
        if f.push(fs, q, &payload, end, &mut out).is_err() {
            return Err(StreamErr::Denied { head_sent });
        }
        if !out.is_empty() || (end && !head_sent) {
            let h: &[u8] = if head_sent { b"" } else { head };
            sent += send_chunk(dst, h, &out).map_err(|e| StreamErr::Io(to, e))?;
            count_write(ops, to);
            head_sent = true;
        }
        if end {
            sent += send_chunk(dst, b"0\r\n\r\n", b"").map_err(|e| StreamErr::Io(to, e))?;
            count_write(ops, to);
            return Ok(sent);
        }
        if f.held() > 0 && !super::sock::readable_within(src, crate::filter::FLUSH_AFTER) {
            out.clear();
            if f.flush(fs, q, &mut out).is_err() {
                return Err(StreamErr::Denied { head_sent });
            }
            let h: &[u8] = if head_sent { b"" } else { head };
            sent += send_chunk(dst, h, &out).map_err(|e| StreamErr::Io(to, e))?;
            count_write(ops, to);
            head_sent = true;
        }
        let got =
            read_some(src, &mut chunk, from, lim, ops).map_err(|(s, e)| StreamErr::Io(s, e))?;
        if got == 0 {
            return Err(StreamErr::Io(from, io::ErrorKind::UnexpectedEof.into()));
        }
        data = &chunk[..got];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::{Filter, Options, CLIHEADER};

    fn fs(pat: &str, rep: &str) -> Filters {
        let mut f = Filters::default();
        f.push(
            Filter::parse(
                "cliheader",
                "dunno",
                pat,
                Some(rep),
                &[],
                &Options::default(),
            )
            .unwrap(),
        );
        f
    }

    #[test]
    fn a_head_rewrite_cannot_change_framing() {
        let q = Query::default();
        let mut h = b"GET / HTTP/1.1\r\nHost: a\r\nX-Agent: old\r\n\r\n".to_vec();
        head(&fs("old", "new"), CLIHEADER, &q, &mut h, true, 1).unwrap();
        assert_eq!(h, b"GET / HTTP/1.1\r\nHost: a\r\nX-Agent: new\r\n\r\n");
        for (p, r) in [
            ("X-Agent: old", "Content-Length: 5"),
            ("X-Agent: old", "\\r\\n\\r\\nGET /x HTTP/1.1"),
            ("GET", "HEAD"),
        ] {
            let mut h = b"GET / HTTP/1.1\r\nHost: a\r\nX-Agent: old\r\n\r\n".to_vec();
            assert!(
                head(&fs(p, r), CLIHEADER, &q, &mut h, true, 1).is_err(),
                "{p}"
            );
        }
    }

    #[test]
    fn length_is_replaced() {
        let mut h = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nX: y\r\n".to_vec();
        set_length(&mut h, 7);
        assert_eq!(h, b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nX: y\r\n");
    }
}
