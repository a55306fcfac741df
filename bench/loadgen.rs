//! The benchmark's compiled load client for the `fetch` scenarios
//! (tcp-1k, tcp-1m, socks-1k, socks-1m): `bench/loadgen.py fetch` done in
//! one thread with non-blocking sockets and poll(), so that, like wrk, it
//! keeps the proxy busy instead of being the bottleneck itself.
//!
//!   loadgen fetch --server H:P --target H:P --path /1k.bin --conns N
//!                 --seconds S [--socks]
//!
//! N connections at once, each in a loop: connect (and SOCKS5 CONNECT to
//! the target when --socks), GET PATH with `Connection: close`, read the
//! whole response (Content-Length), close, start again. After S seconds no
//! new connection is started; the run ends when the last one finishes.
//! Prints one line `LOADGEN {json}` with requests, bytes, errors,
//! first_error and seconds, as bench/loadgen.py does (parse.parse_loadgen).
//!
//! Built by bench.py with `cargo build --release --example loadgen`.

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// A request that takes longer than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After an error a slot waits this long before its next connection.
const ERROR_PAUSE: Duration = Duration::from_millis(50);
/// The longest response head accepted.
const HEAD_MAX: usize = 16 * 1024;

struct Args {
    server: SocketAddr,
    target: SocketAddrV4,
    path: String,
    conns: usize,
    seconds: f64,
    socks: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    if it.next().as_deref() != Some("fetch") {
        return Err("usage: loadgen fetch --server H:P --target H:P --path P --conns N --seconds S [--socks]".into());
    }
    let (mut server, mut target, mut path) = (None, None, None);
    let (mut conns, mut seconds, mut socks) = (8usize, 5f64, false);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--server" => server = Some(val()?.parse().map_err(|e| format!("--server: {e}"))?),
            "--target" => target = Some(val()?.parse().map_err(|e| format!("--target: {e}"))?),
            "--path" => path = Some(val()?),
            "--conns" => conns = val()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--seconds" => seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--socks" => socks = true,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(Args {
        server: server.ok_or("--server is required")?,
        target: target.ok_or("--target is required")?,
        path: path.ok_or("--path is required")?,
        conns: conns.max(1),
        seconds,
        socks,
    })
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum State {
    /// Waiting before the next connection (after an error, or done).
    Pause,
    Connecting,
    /// SOCKS5: waiting for the method choice (2 bytes).
    Method,
    /// SOCKS5: waiting for the CONNECT reply.
    Reply,
    /// Reading the response head.
    Head,
    /// Reading the body: bytes still to come.
    Body(usize),
}

struct Slot {
    sock: Option<Socket>,
    state: State,
    /// Bytes of the current SOCKS reply or response head read so far.
    buf: Vec<u8>,
    started: Instant,
    resume: Instant,
    /// Bytes of the current response (head and body).
    got: usize,
}

struct Totals {
    requests: u64,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
}

/// What one step of a slot needs next.
enum Want {
    Read,
    Done,
}

fn socks_greeting() -> &'static [u8] {
    b"\x05\x01\x00"
}

fn socks_connect(t: &SocketAddrV4) -> Vec<u8> {
    let mut v = vec![5, 1, 0, 1];
    v.extend_from_slice(&t.ip().octets());
    v.extend_from_slice(&t.port().to_be_bytes());
    v
}

/// Length of a SOCKS5 reply from its first five bytes.
fn socks_reply_len(head: &[u8]) -> Result<usize, String> {
    match head[3] {
        1 => Ok(10),
        4 => Ok(22),
        3 => Ok(7 + head[4] as usize),
        t => Err(format!("bad SOCKS5 address type {t}")),
    }
}

/// (status, content length, head length) once `buf` holds a whole head.
fn split_head(buf: &[u8]) -> Result<Option<(u16, usize, usize)>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "response head is not text")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let len = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or("response without Content-Length")?;
    Ok(Some((status, len, end + 4)))
}

fn send_all(s: &mut Socket, data: &[u8]) -> Result<(), String> {
    // Small messages on a fresh connection: the socket buffer always takes
    // them whole.
    match s.write(data) {
        Ok(n) if n == data.len() => Ok(()),
        Ok(n) => Err(format!("short write {n} of {}", data.len())),
        Err(e) => Err(format!("write: {e}")),
    }
}

struct Gen {
    args: Args,
    request: Vec<u8>,
    connect: Vec<u8>,
    scratch: Vec<u8>,
}

impl Gen {
    fn open(&self, slot: &mut Slot) -> Result<(), String> {
        let s = Socket::new(
            Domain::for_address(self.args.server),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| format!("socket: {e}"))?;
        s.set_nonblocking(true)
            .map_err(|e| format!("nonblocking: {e}"))?;
        s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
        match s.connect(&SockAddr::from(self.args.server)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(format!("connect: {e}")),
        }
        slot.sock = Some(s);
        slot.state = State::Connecting;
        slot.buf.clear();
        slot.got = 0;
        slot.started = Instant::now();
        Ok(())
    }

    /// Advance a slot after its socket became ready.
    fn step(&mut self, slot: &mut Slot) -> Result<Want, String> {
        let Some(s) = slot.sock.as_mut() else {
            return Ok(Want::Done);
        };
        loop {
            match slot.state {
                State::Pause => return Ok(Want::Done),
                State::Connecting => {
                    if let Some(e) = s.take_error().map_err(|e| format!("SO_ERROR: {e}"))? {
                        return Err(format!("connect: {e}"));
                    }
                    if self.args.socks {
                        send_all(s, socks_greeting())?;
                        slot.state = State::Method;
                    } else {
                        send_all(s, &self.request)?;
                        slot.state = State::Head;
                    }
                    return Ok(Want::Read);
                }
                State::Body(left) => {
                    let cap = left.min(self.scratch.len());
                    match s.read(&mut self.scratch[..cap]) {
                        Ok(0) => return Err(format!("closed {} bytes before the end", left)),
                        Ok(n) => {
                            slot.got += n;
                            if n == left {
                                return Ok(Want::Done);
                            }
                            slot.state = State::Body(left - n);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Want::Read),
                        Err(e) => return Err(format!("read: {e}")),
                    }
                }
                State::Method | State::Reply | State::Head => {
                    let mut chunk = [0u8; 4096];
                    let n = match s.read(&mut chunk) {
                        Ok(0) => return Err(format!("closed in state {:?}", slot.state)),
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Want::Read),
                        Err(e) => return Err(format!("read: {e}")),
                    };
                    slot.buf.extend_from_slice(&chunk[..n]);
                    match slot.state {
                        State::Method if slot.buf.len() >= 2 => {
                            if slot.buf[..2] != [5, 0] {
                                return Err("SOCKS5 method refused".into());
                            }
                            slot.buf.drain(..2);
                            send_all(s, &self.connect)?;
                            slot.state = State::Reply;
                        }
                        State::Reply if slot.buf.len() >= 5 => {
                            if slot.buf[1] != 0 {
                                return Err(format!(
                                    "SOCKS5 CONNECT failed, reply {}",
                                    slot.buf[1]
                                ));
                            }
                            let len = socks_reply_len(&slot.buf)?;
                            if slot.buf.len() >= len {
                                slot.buf.drain(..len);
                                send_all(s, &self.request)?;
                                slot.state = State::Head;
                            }
                        }
                        State::Head => {
                            if let Some((status, len, hlen)) = split_head(&slot.buf)? {
                                if status != 200 {
                                    return Err(format!("status {status}"));
                                }
                                let have = slot.buf.len() - hlen;
                                if have > len {
                                    return Err("more bytes than Content-Length".into());
                                }
                                slot.got = slot.buf.len();
                                slot.buf.clear();
                                if have == len {
                                    return Ok(Want::Done);
                                }
                                slot.state = State::Body(len - have);
                            } else if slot.buf.len() > HEAD_MAX {
                                return Err("response head too long".into());
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn run(args: Args) -> Totals {
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        args.path, args.target
    )
    .into_bytes();
    let connect = socks_connect(&args.target);
    let conns = args.conns;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(args.seconds);
    let mut gen = Gen {
        args,
        request,
        connect,
        scratch: vec![0u8; 256 * 1024],
    };
    let mut totals = Totals {
        requests: 0,
        bytes: 0,
        errors: 0,
        first_error: None,
    };
    let mut slots: Vec<Slot> = (0..conns)
        .map(|_| Slot {
            sock: None,
            state: State::Pause,
            buf: Vec::with_capacity(HEAD_MAX),
            started: t0,
            resume: t0,
            got: 0,
        })
        .collect();
    // (slot, ready) after each poll.
    let mut ready: Vec<(usize, bool)> = Vec::with_capacity(conns);
    loop {
        let now = Instant::now();
        // (Re)start idle slots while the run lasts.
        for slot in slots.iter_mut() {
            if slot.sock.is_none() && now < deadline && now >= slot.resume {
                if let Err(e) = gen.open(slot) {
                    totals.errors += 1;
                    totals.first_error.get_or_insert(e);
                    slot.resume = now + ERROR_PAUSE;
                }
            }
        }
        ready.clear();
        let mut fds = Vec::with_capacity(conns);
        for (i, slot) in slots.iter().enumerate() {
            if let Some(s) = &slot.sock {
                let events = if slot.state == State::Connecting {
                    PollFlags::POLLOUT
                } else {
                    PollFlags::POLLIN
                };
                fds.push(PollFd::new(s.as_fd(), events));
                ready.push((i, false));
            }
        }
        if fds.is_empty() {
            if now >= deadline {
                break;
            }
            // Every slot waits out an error pause.
            let next = slots.iter().map(|s| s.resume).min().unwrap_or(now);
            std::thread::sleep(next.saturating_duration_since(now));
            continue;
        }
        match poll(&mut fds, PollTimeout::from(100u8)) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => {
                totals.first_error.get_or_insert(format!("poll: {e}"));
                break;
            }
        }
        for (r, fd) in ready.iter_mut().zip(&fds) {
            r.1 = fd.revents().is_some_and(|e| !e.is_empty());
        }
        drop(fds);
        let now = Instant::now();
        for &(i, is_ready) in &ready {
            let slot = &mut slots[i];
            let outcome = if is_ready {
                gen.step(slot)
            } else if now.duration_since(slot.started) > REQUEST_TIMEOUT {
                Err("request timed out".into())
            } else {
                continue;
            };
            match outcome {
                Ok(Want::Read) => {}
                Ok(Want::Done) => {
                    totals.requests += 1;
                    totals.bytes += slot.got as u64;
                    slot.sock = None;
                    slot.state = State::Pause;
                    slot.resume = now;
                }
                Err(e) => {
                    totals.errors += 1;
                    totals.first_error.get_or_insert(e);
                    slot.sock = None;
                    slot.state = State::Pause;
                    slot.resume = now + ERROR_PAUSE;
                }
            }
        }
    }
    totals
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let t0 = Instant::now();
    let t = run(args);
    println!(
        "LOADGEN {{\"requests\": {}, \"bytes\": {}, \"errors\": {}, \"first_error\": {}, \"seconds\": {:.6}}}",
        t.requests,
        t.bytes,
        t.errors,
        t.first_error.as_deref().map(json_str).unwrap_or_else(|| "null".into()),
        t0.elapsed().as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socks_messages() {
        assert_eq!(socks_greeting(), b"\x05\x01\x00");
        let t: SocketAddrV4 = "10.0.2.2:80".parse().unwrap();
        assert_eq!(
            socks_connect(&t),
            b"\x05\x01\x00\x01\x0a\x00\x02\x02\x00\x50"
        );
        assert_eq!(socks_reply_len(b"\x05\x00\x00\x01\x0a").unwrap(), 10);
        assert_eq!(socks_reply_len(b"\x05\x00\x00\x04\x00").unwrap(), 22);
        assert_eq!(socks_reply_len(b"\x05\x00\x00\x03\x05").unwrap(), 12);
        assert!(socks_reply_len(b"\x05\x00\x00\x09\x00").is_err());
    }

    #[test]
    fn heads() {
        assert_eq!(
            split_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n").unwrap(),
            None
        );
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n";
        let mut full = head.to_vec();
        full.extend_from_slice(b"abc");
        assert_eq!(split_head(&full).unwrap(), Some((200, 3, head.len())));
        assert!(split_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }

    /// An origin answering every connection with one 1000-byte response,
    /// optionally behind a minimal SOCKS5 server (no authentication,
    /// CONNECT to any address is accepted and served locally).
    fn origin(socks: bool) -> SocketAddr {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    if socks {
                        c.read_exact(&mut b[..3]).unwrap();
                        assert_eq!(&b[..3], b"\x05\x01\x00");
                        c.write_all(b"\x05\x00").unwrap();
                        c.read_exact(&mut b[..10]).unwrap();
                        assert_eq!(&b[..4], b"\x05\x01\x00\x01");
                        c.write_all(b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50")
                            .unwrap();
                    }
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let n = c.read(&mut b[..1]).unwrap();
                        assert_eq!(n, 1, "closed before the request's end");
                        head.push(b[0]);
                    }
                    assert!(head.starts_with(b"GET /f HTTP/1.1\r\n"));
                    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec();
                    resp.extend_from_slice(&[b'x'; 1000]);
                    c.write_all(&resp).unwrap();
                });
            }
        });
        addr
    }

    fn fetch_from(server: SocketAddr, socks: bool) {
        let t = run(Args {
            server,
            target: "10.0.2.2:80".parse().unwrap(),
            path: "/f".into(),
            conns: 3,
            seconds: 0.3,
            socks,
        });
        assert_eq!(t.errors, 0, "{:?}", t.first_error);
        assert!(t.requests > 10, "{} requests", t.requests);
        let each = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".len() as u64 + 1000;
        assert_eq!(t.bytes, t.requests * each);
    }

    #[test]
    fn fetches_whole_responses_directly_and_through_socks() {
        fetch_from(origin(false), false);
        fetch_from(origin(true), true);
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = free.local_addr().unwrap();
        drop(free);
        let t = run(Args {
            server,
            target: "10.0.2.2:80".parse().unwrap(),
            path: "/f".into(),
            conns: 1,
            seconds: 0.2,
            socks: false,
        });
        assert_eq!(t.requests, 0);
        assert!(t.errors > 0);
        assert!(t.first_error.unwrap().contains("connect"));
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
