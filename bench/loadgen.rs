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
//! With --keepalive (socks-ka) each connection stays open and carries one
//! GET after another until the S seconds are over.
//!
//!   loadgen rate --server H:P --target H:P --path /5b.bin --rate R
//!                --seconds S [--connect | --socks]
//!
//! Open loop (tunnel-rate): a new connection is due every 1/R s whatever
//! the proxy does, however many are still in flight; each one (after an
//! HTTP CONNECT to the target with --connect) GETs PATH and closes. The
//! latency of each is counted from the moment it was due, not from when
//! the client got round to it, so a proxy that stalls pays for every
//! connection that waited behind the stall (coordinated omission
//! corrected). Prints `LOADGEN {json}` as above plus `latency_us` (p50,
//! p90, p99, p99.9, p99.99, max) and `service_us` (the same from the
//! connect call, uncorrected).
//!
//!   loadgen fetch --tls CAFILE --server H:P --target H:P --path /1k.bin
//!                 --conns N --seconds S [--connect] [--keepalive]
//!
//! HTTPS (the https-mitm cells): each connection (after an HTTP CONNECT
//! to the target with --connect: through an intercepting proxy) speaks
//! TLS (rustls, ring) to the target, trusting only the certificates of
//! CAFILE and checking the target's address as the name, with no session
//! resumption (every connection a full handshake), and GETs PATH inside
//! it (origin-form, Host of the target). --keepalive: one GET after
//! another on each connection; else `Connection: close`, the client's
//! close_notify, and the next connection once the server has closed. A
//! warm-up comes first: every connection makes one request (kept-alive
//! ones stay open; the others close), then `WARM n` is printed and the S
//! measured seconds begin; the LOADGEN line counts only those, with
//! `handshakes` (TLS handshakes completed in the measured part).
//!
//! Built by bench.py with `cargo build --release --example loadgen`.

use nix::errno::Errno;
use nix::poll::{poll, ppoll, PollFd, PollFlags, PollTimeout};
use nix::sys::time::TimeSpec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::Arc;
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
    /// HTTP CONNECT to the target first (rate mode).
    connect: bool,
    /// Kept-alive: GET after GET on one connection (fetch mode).
    keepalive: bool,
    /// New connections a second: the open-loop mode (with --keepalive:
    /// requests a second over a fixed pool of kept connections).
    rate: Option<f64>,
    /// An absolute-form request target (`GET http://TARGET/PATH`), what a
    /// forward proxy is sent.
    absolute: bool,
    /// HTTPS to the target (fetch mode), trusting only this CA file.
    tls: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mode = it.next();
    let open_loop = match mode.as_deref() {
        Some("fetch") => false,
        Some("rate") => true,
        _ => return Err("usage: loadgen fetch --server H:P --target H:P --path P --conns N --seconds S [--socks] [--keepalive] [--tls CAFILE [--connect]]\n       loadgen rate --server H:P --target H:P --path P --rate R --seconds S [--connect | --socks | --keepalive --conns N] [--absolute]".into()),
    };
    let (mut server, mut target, mut path) = (None, None, None);
    let (mut conns, mut seconds, mut socks) = (8usize, 5f64, false);
    let (mut connect, mut keepalive, mut rate) = (false, false, None);
    let (mut absolute, mut tls) = (false, None);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--server" => server = Some(val()?.parse().map_err(|e| format!("--server: {e}"))?),
            "--target" => target = Some(val()?.parse().map_err(|e| format!("--target: {e}"))?),
            "--path" => path = Some(val()?),
            "--conns" => conns = val()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--seconds" => seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--socks" => socks = true,
            "--connect" => connect = true,
            "--keepalive" => keepalive = true,
            "--absolute" => absolute = true,
            "--tls" => tls = Some(val()?),
            "--rate" => {
                let r: f64 = val()?.parse().map_err(|e| format!("--rate: {e}"))?;
                if !(r > 0.0 && r <= 1e6) {
                    return Err("--rate must be in (0, 1000000]".into());
                }
                rate = Some(r)
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if open_loop != rate.is_some() {
        return Err("--rate belongs to (and is required by) the rate mode".into());
    }
    if connect && socks {
        return Err("--connect and --socks exclude each other".into());
    }
    if open_loop && keepalive && (connect || socks) {
        return Err("the kept-alive rate mode speaks plain HTTP only".into());
    }
    if tls.is_some() && (open_loop || socks || absolute) {
        return Err("--tls belongs to the fetch mode, directly or after --connect".into());
    }
    Ok(Args {
        server: server.ok_or("--server is required")?,
        target: target.ok_or("--target is required")?,
        path: path.ok_or("--path is required")?,
        conns: conns.max(1),
        seconds,
        socks,
        connect,
        keepalive,
        rate,
        absolute,
        tls,
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
    /// HTTP CONNECT: waiting for the proxy's response head.
    Tunnel,
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
    /// When the connection was due (rate mode).
    due: Instant,
    resume: Instant,
    /// Bytes of the current response (head and body).
    got: usize,
}

#[derive(Default)]
struct Totals {
    requests: u64,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
    /// TLS handshakes completed (the TLS fetch mode's measured part).
    handshakes: u64,
    /// The first error of the TLS fetch mode's warm-up.
    warm_error: Option<String>,
}

impl Totals {
    /// Count an error; the first one is kept for the report.
    fn fail(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
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
    /// The HTTP CONNECT request (rate mode, --connect).
    tunnel: Vec<u8>,
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
                    } else if self.args.connect {
                        send_all(s, &self.tunnel)?;
                        slot.state = State::Tunnel;
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
                State::Method | State::Reply | State::Tunnel | State::Head => {
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
                        State::Tunnel => {
                            if let Some(end) = slot.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let status = tunnel_status(&slot.buf[..end])?;
                                if status != 200 {
                                    return Err(format!("CONNECT status {status}"));
                                }
                                if slot.buf.len() > end + 4 {
                                    return Err("bytes after the CONNECT response".into());
                                }
                                slot.buf.clear();
                                send_all(s, &self.request)?;
                                slot.state = State::Head;
                            } else if slot.buf.len() > HEAD_MAX {
                                return Err("CONNECT response head too long".into());
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

/// The status of a CONNECT response head (without its blank line).
fn tunnel_status(head: &[u8]) -> Result<u16, String> {
    std::str::from_utf8(head)
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| "bad CONNECT status line".into())
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

fn gen_for(args: Args) -> Gen {
    let request = format!(
        "GET {}{} HTTP/1.1\r\nHost: {}\r\n{}\r\n",
        if args.absolute {
            format!("http://{}", args.target)
        } else {
            String::new()
        },
        args.path,
        args.target,
        if args.keepalive {
            ""
        } else {
            "Connection: close\r\n"
        }
    )
    .into_bytes();
    let connect = socks_connect(&args.target);
    let tunnel = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", args.target).into_bytes();
    Gen {
        args,
        request,
        connect,
        tunnel,
        scratch: vec![0u8; 256 * 1024],
    }
}

fn new_slot(t0: Instant) -> Slot {
    Slot {
        sock: None,
        state: State::Pause,
        buf: Vec::with_capacity(HEAD_MAX),
        started: t0,
        due: t0,
        resume: t0,
        got: 0,
    }
}

fn run(args: Args) -> Totals {
    let conns = args.conns;
    let keepalive = args.keepalive;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(args.seconds);
    let mut gen = gen_for(args);
    let mut totals = Totals::default();
    let mut slots: Vec<Slot> = (0..conns).map(|_| new_slot(t0)).collect();
    // (slot, ready) after each poll.
    let mut ready: Vec<(usize, bool)> = Vec::with_capacity(conns);
    loop {
        let now = Instant::now();
        // (Re)start idle slots while the run lasts.
        for slot in slots.iter_mut() {
            if slot.sock.is_none() && now < deadline && now >= slot.resume {
                if let Err(e) = gen.open(slot) {
                    totals.fail(e);
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
                Ok(Want::Done) if keepalive && now < deadline => {
                    // The next GET on the same connection.
                    totals.requests += 1;
                    totals.bytes += slot.got as u64;
                    slot.got = 0;
                    slot.buf.clear();
                    slot.started = now;
                    slot.state = State::Head;
                    let s = slot.sock.as_mut().expect("a done slot has its socket");
                    if let Err(e) = send_all(s, &gen.request) {
                        totals.fail(e);
                        slot.sock = None;
                        slot.state = State::Pause;
                        slot.resume = now + ERROR_PAUSE;
                    }
                }
                Ok(Want::Done) => {
                    totals.requests += 1;
                    totals.bytes += slot.got as u64;
                    slot.sock = None;
                    slot.state = State::Pause;
                    slot.resume = now;
                }
                Err(e) => {
                    totals.fail(e);
                    slot.sock = None;
                    slot.state = State::Pause;
                    slot.resume = now + ERROR_PAUSE;
                }
            }
        }
    }
    totals
}

/// Connections in flight at most in the rate mode (descriptors).
const RATE_MAX_IN_FLIGHT: usize = 15_000;

struct Latencies {
    /// From the moment each connection was due (corrected).
    due: hdrhistogram::Histogram<u64>,
    /// From its connect call (what the client saw, uncorrected).
    service: hdrhistogram::Histogram<u64>,
    /// When the measured part began, if not at the start (a warm-up).
    began: Option<Instant>,
}

impl Latencies {
    /// A request of `slot` completed at `now`.
    fn done(&mut self, totals: &mut Totals, slot: &Slot, now: Instant) {
        totals.requests += 1;
        totals.bytes += slot.got as u64;
        let us = |d: Duration| (d.as_micros() as u64).max(1);
        self.due.saturating_record(us(now.duration_since(slot.due)));
        self.service
            .saturating_record(us(now.duration_since(slot.started)));
    }

    fn new() -> Latencies {
        Latencies {
            due: histogram(),
            service: histogram(),
            began: None,
        }
    }
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    // 1 us to 100 s, 3 significant digits.
    hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds")
}

/// The percentiles the report shows, as a JSON object, in microseconds.
fn percentiles_json(h: &hdrhistogram::Histogram<u64>) -> String {
    let q = |x: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(x)
        }
    };
    format!(
        "{{\"p50\": {}, \"p90\": {}, \"p99\": {}, \"p99.9\": {}, \"p99.99\": {}, \"max\": {}}}",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        q(0.9999),
        h.max()
    )
}

/// Growth from one bucket of `buckets_json` to the next: 2%, finer than
/// the 10% within which two runs are said to agree.
const BUCKET_RATIO: f64 = 1.02;

/// The histogram as `[[upper_us, count], ...]`, in buckets growing by
/// BUCKET_RATIO from 1 us, empty ones left out: what bench/report.py
/// needs to add the runs of a cell together and take its percentiles
/// from all of their connections at once (a p99 of one 6 s run moves
/// with a single bad moment; pooled runs do not).
fn buckets_json(h: &hdrhistogram::Histogram<u64>) -> String {
    let mut out = String::from("[");
    for v in h.iter_log(1, BUCKET_RATIO) {
        let n = v.count_since_last_iteration();
        if n > 0 {
            if out.len() > 1 {
                out.push_str(", ");
            }
            out.push_str(&format!("[{}, {n}]", v.value_iterated_to()));
        }
    }
    out.push(']');
    out
}

/// Wait up to `wait` for the sockets of the `active` slots (writable while
/// connecting, else readable); `ready[k]` says whether `active[k]`'s is.
fn wait_ready(
    slots: &[Slot],
    active: &[usize],
    wait: Duration,
    ready: &mut Vec<bool>,
) -> Result<(), String> {
    let mut fds = Vec::with_capacity(active.len());
    for &i in active {
        let slot = &slots[i];
        let s = slot.sock.as_ref().expect("an active slot has a socket");
        let events = if slot.state == State::Connecting {
            PollFlags::POLLOUT
        } else {
            PollFlags::POLLIN
        };
        fds.push(PollFd::new(s.as_fd(), events));
    }
    ready.clear();
    match ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None) {
        Ok(_) => ready.extend(
            fds.iter()
                .map(|fd| fd.revents().is_some_and(|e| !e.is_empty())),
        ),
        // Interrupted: nothing is ready yet.
        Err(Errno::EINTR) => ready.resize(active.len(), false),
        Err(e) => return Err(format!("poll: {e}")),
    }
    Ok(())
}

/// The next step of a slot after a wait: None while it still waits within
/// REQUEST_TIMEOUT.
fn advance(
    gen: &mut Gen,
    slot: &mut Slot,
    is_ready: bool,
    now: Instant,
) -> Option<Result<Want, String>> {
    if is_ready {
        Some(gen.step(slot))
    } else if now.duration_since(slot.started) > REQUEST_TIMEOUT {
        Some(Err("request timed out".into()))
    } else {
        None
    }
}

/// How long an open loop may wait for sockets before `next_due`: to the
/// microsecond, at most 100 ms (nothing more is due after the deadline).
fn until_due(next_due: Instant, deadline: Instant) -> Duration {
    if next_due < deadline {
        next_due.saturating_duration_since(Instant::now())
    } else {
        Duration::from_millis(100)
    }
    .min(Duration::from_millis(100))
}

/// The open loop: a connection due every 1/rate s until the deadline.
fn run_rate(args: Args) -> (Totals, Latencies) {
    let rate = args.rate.expect("rate mode has a rate");
    let interval = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(args.seconds);
    let mut gen = gen_for(args);
    let mut totals = Totals::default();
    let mut lat = Latencies::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut active: Vec<usize> = Vec::new();
    let mut next_due = t0;
    let mut ready: Vec<bool> = Vec::new();
    loop {
        let now = Instant::now();
        // Every connection now due, however late we are.
        while next_due <= now && next_due < deadline {
            let due = next_due;
            next_due += interval;
            if active.len() >= RATE_MAX_IN_FLIGHT {
                totals.fail(format!("{RATE_MAX_IN_FLIGHT} connections in flight"));
                continue;
            }
            let i = free.pop().unwrap_or_else(|| {
                slots.push(new_slot(t0));
                slots.len() - 1
            });
            let slot = &mut slots[i];
            match gen.open(slot) {
                Ok(()) => {
                    slot.due = due;
                    active.push(i);
                }
                Err(e) => {
                    totals.fail(e);
                    free.push(i);
                }
            }
        }
        if active.is_empty() && next_due >= deadline {
            break;
        }
        // Sleep until the next connection is due, to the microsecond: at
        // 3,500 a second they are 286 us apart, and a timeout in whole
        // milliseconds (poll's) would be 0 every time, a busy loop that
        // took the CPU the origin shares with this client (the latency
        // cells measured that, and it moved from run to run).
        let wait = until_due(next_due, deadline);
        if let Err(e) = wait_ready(&slots, &active, wait, &mut ready) {
            totals.first_error.get_or_insert(e);
            break;
        }
        let now = Instant::now();
        let mut still = Vec::with_capacity(active.len());
        for (&i, &is_ready) in active.iter().zip(&ready) {
            let slot = &mut slots[i];
            let Some(outcome) = advance(&mut gen, slot, is_ready, now) else {
                still.push(i);
                continue;
            };
            match outcome {
                Ok(Want::Read) => {
                    still.push(i);
                    continue;
                }
                Ok(Want::Done) => {
                    lat.done(&mut totals, slot, now);
                }
                Err(e) => {
                    totals.fail(e);
                }
            }
            slot.sock = None;
            slot.state = State::Pause;
            free.push(i);
        }
        active = still;
    }
    (totals, lat)
}

/// How long the kept-alive rate mode waits for its pool to connect and
/// carry one request each before the measured part.
const WARMUP_MAX: Duration = Duration::from_secs(30);

/// The open loop over kept connections (http-ka-50k-2000-rate): CONNS
/// connections are opened and each carries one request (the warm-up, not
/// counted), then `WARM` is printed and a request is due every 1/rate s
/// until the deadline. A due request goes to the connection that has been
/// idle longest; when none is idle it waits for one, and its latency still
/// counts from when it was due. So every connection of the pool is used
/// in turn at the same offered load whatever the proxy's speed, which is
/// what makes the tail of two proxies comparable (a closed loop runs each
/// at its own speed, and a fast one saturates the client's CPU).
fn run_rate_kept(args: Args) -> (Totals, Latencies) {
    let rate = args.rate.expect("rate mode has a rate");
    let interval = Duration::from_secs_f64(1.0 / rate);
    let seconds = args.seconds;
    let conns = args.conns;
    let mut gen = gen_for(args);
    let mut totals = Totals::default();
    let mut lat = Latencies::new();
    // The pool: every connection opened, then one request on each.
    let start = Instant::now();
    let mut slots: Vec<Slot> = (0..conns).map(|_| new_slot(start)).collect();
    let mut active: Vec<usize> = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        match gen.open(slot) {
            Ok(()) => active.push(i),
            Err(e) => totals.fail(e),
        }
    }
    let mut idle: std::collections::VecDeque<usize> = Default::default();
    let mut ready: Vec<bool> = Vec::new();
    while !active.is_empty() {
        if start.elapsed() > WARMUP_MAX {
            totals.fail(format!(
                "{} connections not through their warm-up",
                active.len()
            ));
            for &i in &active {
                slots[i].sock = None;
            }
            break;
        }
        if let Err(e) = wait_ready(&slots, &active, Duration::from_millis(100), &mut ready) {
            totals.fail(e);
            for &i in &active {
                slots[i].sock = None;
            }
            break;
        }
        let mut still = Vec::with_capacity(active.len());
        for (&i, &is_ready) in active.iter().zip(&ready) {
            if !is_ready {
                still.push(i);
                continue;
            }
            match gen.step(&mut slots[i]) {
                Ok(Want::Read) => still.push(i),
                Ok(Want::Done) => idle.push_back(i),
                Err(e) => {
                    totals.fail(e);
                    slots[i].sock = None;
                }
            }
        }
        active = still;
    }
    // The measured part starts now: the caller reads this line first.
    println!("WARM {}", idle.len());
    let _ = std::io::stdout().flush();
    let t0 = Instant::now();
    lat.began = Some(t0);
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let mut next_due = t0;
    let mut waiting: std::collections::VecDeque<Instant> = Default::default();
    loop {
        let now = Instant::now();
        while next_due <= now && next_due < deadline {
            waiting.push_back(next_due);
            next_due += interval;
        }
        while !waiting.is_empty() {
            let Some(i) = idle.pop_front() else { break };
            let due = waiting.pop_front().expect("not empty");
            let slot = &mut slots[i];
            slot.due = due;
            slot.started = now;
            slot.got = 0;
            slot.buf.clear();
            slot.state = State::Head;
            let s = slot.sock.as_mut().expect("an idle slot has its socket");
            match send_all(s, &gen.request) {
                Ok(()) => active.push(i),
                Err(e) => {
                    totals.fail(e);
                    slot.sock = None;
                }
            }
        }
        if active.is_empty() && (next_due >= deadline || idle.is_empty()) {
            // Done, or every connection is lost: the requests still
            // waiting can never be sent.
            if !waiting.is_empty() {
                totals.fail(format!(
                    "{} requests due with no connection left",
                    waiting.len()
                ));
            }
            break;
        }
        let wait = until_due(next_due, deadline);
        if let Err(e) = wait_ready(&slots, &active, wait, &mut ready) {
            totals.fail(e);
            break;
        }
        let now = Instant::now();
        let mut still = Vec::with_capacity(active.len());
        for (&i, &is_ready) in active.iter().zip(&ready) {
            let slot = &mut slots[i];
            let Some(outcome) = advance(&mut gen, slot, is_ready, now) else {
                still.push(i);
                continue;
            };
            match outcome {
                Ok(Want::Read) => still.push(i),
                Ok(Want::Done) => {
                    lat.done(&mut totals, slot, now);
                    idle.push_back(i);
                }
                Err(e) => {
                    totals.fail(e);
                    slot.sock = None;
                }
            }
        }
        active = still;
    }
    (totals, lat)
}

// --- the TLS fetch mode (https-mitm-*) ---------------------------------------

/// Where a connection of the TLS fetch mode is.
#[derive(Clone, Copy, PartialEq, Debug)]
enum TlsPhase {
    /// No connection (before the next one, after an error, or done).
    Pause,
    Connecting,
    /// HTTP CONNECT sent: reading the proxy's response head.
    Tunnel,
    /// TLS: the handshake and the request, then the response head.
    Head,
    /// TLS: the response body, bytes still to come.
    Body(usize),
    /// Kept-alive, between the warm-up and the measured part.
    Idle,
    /// Our close_notify sent after a `Connection: close` response:
    /// waiting for the server to close.
    Closing,
}

/// What a step of a TLS connection ended with.
#[derive(Debug, PartialEq)]
enum TlsWant {
    /// Nothing more until its socket is ready again.
    Wait,
    /// A whole response has come.
    Done,
    /// The server closed after our close_notify.
    Closed,
}

struct TlsSlot {
    sock: Option<Socket>,
    tls: Option<rustls::ClientConnection>,
    phase: TlsPhase,
    /// The CONNECT response head, or the response head, read so far.
    buf: Vec<u8>,
    started: Instant,
    resume: Instant,
    /// Bytes of the current response (head and body).
    got: usize,
    /// The handshake of the current connection has been counted.
    handshaken: bool,
    /// It completed in the last step (for the caller to count).
    new_handshake: bool,
    /// This slot's warm-up is over: its request came, or it failed.
    warm: bool,
    /// Its warm-up failed.
    cold: bool,
}

/// The fixed parts of the TLS fetch mode.
struct TlsGen {
    server: SocketAddr,
    connect: bool,
    tunnel: Vec<u8>,
    request: Vec<u8>,
    config: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
    scratch: Vec<u8>,
}

/// A rustls client configuration trusting only the CA certificates of
/// CAFILE, with session resumption off: every connection makes a full
/// handshake, what the -close cell measures.
fn tls_config(cafile: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(cafile)
        .map_err(|e| format!("--tls {cafile}: {e}"))?;
    for c in certs {
        let c = c.map_err(|e| format!("--tls {cafile}: {e}"))?;
        roots.add(c).map_err(|e| format!("--tls {cafile}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("--tls {cafile}: no certificate"));
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS versions: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}

/// The request inside TLS: origin-form, with the target as Host (its port
/// left out when it is 443, as a browser writes it).
fn tls_request(target: &SocketAddrV4, path: &str, keepalive: bool) -> Vec<u8> {
    let host = if target.port() == 443 {
        target.ip().to_string()
    } else {
        target.to_string()
    };
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{}\r\n",
        if keepalive {
            ""
        } else {
            "Connection: close\r\n"
        }
    )
    .into_bytes()
}

fn tls_gen_for(args: &Args) -> Result<TlsGen, String> {
    let cafile = args.tls.as_deref().ok_or("the TLS mode needs --tls")?;
    Ok(TlsGen {
        server: args.server,
        connect: args.connect,
        tunnel: format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", args.target).into_bytes(),
        request: tls_request(&args.target, &args.path, args.keepalive),
        config: tls_config(cafile)?,
        name: rustls::pki_types::ServerName::from(std::net::IpAddr::V4(*args.target.ip())),
        scratch: vec![0u8; 64 * 1024],
    })
}

fn new_tls_slot(t0: Instant) -> TlsSlot {
    TlsSlot {
        sock: None,
        tls: None,
        phase: TlsPhase::Pause,
        buf: Vec::with_capacity(HEAD_MAX),
        started: t0,
        resume: t0,
        got: 0,
        handshaken: false,
        new_handshake: false,
        warm: false,
        cold: false,
    }
}

/// Write what rustls has to send, as far as the socket takes it.
fn tls_flush(tls: &mut rustls::ClientConnection, s: &mut Socket) -> Result<(), String> {
    while tls.wants_write() {
        match tls.write_tls(s) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

impl TlsGen {
    fn open(&self, slot: &mut TlsSlot) -> Result<(), String> {
        let s = Socket::new(
            Domain::for_address(self.server),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| format!("socket: {e}"))?;
        s.set_nonblocking(true)
            .map_err(|e| format!("nonblocking: {e}"))?;
        s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
        match s.connect(&SockAddr::from(self.server)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(format!("connect: {e}")),
        }
        slot.sock = Some(s);
        slot.tls = None;
        slot.phase = TlsPhase::Connecting;
        slot.buf.clear();
        slot.got = 0;
        slot.handshaken = false;
        slot.started = Instant::now();
        Ok(())
    }

    /// The TLS session of a connection, its first request written into it
    /// (rustls sends it once the handshake is over).
    fn start_tls(&self, slot: &mut TlsSlot) -> Result<(), String> {
        let mut tls = rustls::ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(|e| format!("TLS: {e}"))?;
        tls.writer()
            .write_all(&self.request)
            .map_err(|e| format!("TLS write: {e}"))?;
        slot.tls = Some(tls);
        slot.phase = TlsPhase::Head;
        Ok(())
    }

    /// The next request on a kept connection.
    fn again(&self, slot: &mut TlsSlot) -> Result<(), String> {
        let (Some(tls), Some(s)) = (slot.tls.as_mut(), slot.sock.as_mut()) else {
            return Err("no connection to send on".into());
        };
        tls.writer()
            .write_all(&self.request)
            .map_err(|e| format!("TLS write: {e}"))?;
        slot.phase = TlsPhase::Head;
        slot.buf.clear();
        slot.got = 0;
        slot.started = Instant::now();
        tls_flush(tls, s)
    }

    /// Our close_notify after a `Connection: close` response; the server
    /// is to close.
    fn close(&self, slot: &mut TlsSlot) -> Result<(), String> {
        let (Some(tls), Some(s)) = (slot.tls.as_mut(), slot.sock.as_mut()) else {
            return Err("no connection to close".into());
        };
        tls.send_close_notify();
        slot.phase = TlsPhase::Closing;
        slot.started = Instant::now();
        tls_flush(tls, s)
    }

    /// Advance a connection after its socket became ready.
    fn step(&mut self, slot: &mut TlsSlot) -> Result<TlsWant, String> {
        let Some(s) = slot.sock.as_mut() else {
            return Ok(TlsWant::Wait);
        };
        match slot.phase {
            TlsPhase::Pause => return Ok(TlsWant::Wait),
            TlsPhase::Connecting => {
                if let Some(e) = s.take_error().map_err(|e| format!("SO_ERROR: {e}"))? {
                    return Err(format!("connect: {e}"));
                }
                if self.connect {
                    send_all(s, &self.tunnel)?;
                    slot.phase = TlsPhase::Tunnel;
                    return Ok(TlsWant::Wait);
                }
                self.start_tls(slot)?;
            }
            TlsPhase::Tunnel => {
                let mut chunk = [0u8; 4096];
                let n = match s.read(&mut chunk) {
                    Ok(0) => return Err("closed before the CONNECT response".into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(TlsWant::Wait),
                    Err(e) => return Err(format!("read: {e}")),
                };
                slot.buf.extend_from_slice(&chunk[..n]);
                let Some(end) = slot.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    if slot.buf.len() > HEAD_MAX {
                        return Err("CONNECT response head too long".into());
                    }
                    return Ok(TlsWant::Wait);
                };
                let status = tunnel_status(&slot.buf[..end])?;
                if status != 200 {
                    return Err(format!("CONNECT status {status}"));
                }
                if slot.buf.len() > end + 4 {
                    return Err("bytes after the CONNECT response".into());
                }
                slot.buf.clear();
                self.start_tls(slot)?;
            }
            _ => {}
        }
        let (Some(tls), Some(s)) = (slot.tls.as_mut(), slot.sock.as_mut()) else {
            return Err("no TLS session".into());
        };
        loop {
            tls_flush(tls, s)?;
            let eof = match tls.read_tls(s) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(TlsWant::Wait),
                Err(_) if slot.phase == TlsPhase::Closing => return Ok(TlsWant::Closed),
                Err(e) => return Err(format!("read: {e}")),
            };
            if let Err(e) = tls.process_new_packets() {
                // Our own alert for the server, if any, before the error.
                let _ = tls_flush(tls, s);
                return Err(format!("TLS: {e}"));
            }
            if !slot.handshaken && !tls.is_handshaking() {
                slot.handshaken = true;
                slot.new_handshake = true;
            }
            // The plaintext that came.
            loop {
                match tls.reader().read(&mut self.scratch) {
                    Ok(0) => {
                        // The server's close_notify.
                        if slot.phase == TlsPhase::Closing {
                            return Ok(TlsWant::Closed);
                        }
                        return Err(format!("TLS closed in phase {:?}", slot.phase));
                    }
                    Ok(n) => {
                        let (phase, buf, got) = (&mut slot.phase, &mut slot.buf, &mut slot.got);
                        if response_bytes(phase, buf, got, &self.scratch[..n])? {
                            return Ok(TlsWant::Done);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) if slot.phase == TlsPhase::Closing => return Ok(TlsWant::Closed),
                    Err(e) => return Err(format!("TLS read: {e} in phase {:?}", slot.phase)),
                }
            }
            if eof {
                if slot.phase == TlsPhase::Closing {
                    return Ok(TlsWant::Closed);
                }
                return Err(format!("closed in phase {:?}", slot.phase));
            }
        }
    }
}

/// Take plaintext bytes of a response (PHASE, the head so far in BUF, the
/// bytes of the response in GOT): true once it is whole.
fn response_bytes(
    phase: &mut TlsPhase,
    buf: &mut Vec<u8>,
    got: &mut usize,
    data: &[u8],
) -> Result<bool, String> {
    match *phase {
        TlsPhase::Head => {
            buf.extend_from_slice(data);
            let Some((status, len, hlen)) = split_head(buf)? else {
                if buf.len() > HEAD_MAX {
                    return Err("response head too long".into());
                }
                return Ok(false);
            };
            if status != 200 {
                return Err(format!("status {status}"));
            }
            let have = buf.len() - hlen;
            if have > len {
                return Err("more bytes than Content-Length".into());
            }
            *got = buf.len();
            buf.clear();
            if have == len {
                return Ok(true);
            }
            *phase = TlsPhase::Body(len - have);
            Ok(false)
        }
        TlsPhase::Body(left) => {
            if data.len() > left {
                return Err("more bytes than Content-Length".into());
            }
            *got += data.len();
            if data.len() == left {
                return Ok(true);
            }
            *phase = TlsPhase::Body(left - data.len());
            Ok(false)
        }
        // The server's bytes after a response are nothing we asked for.
        TlsPhase::Closing => Ok(false),
        p => Err(format!("unexpected bytes in phase {p:?}")),
    }
}

/// The TLS fetch mode: the warm-up (one request per connection, then
/// `WARM n` on stdout), then S measured seconds. Returns the measured
/// part's totals and when it began.
fn run_tls(args: Args) -> (Totals, Instant) {
    let conns = args.conns;
    let keepalive = args.keepalive;
    let seconds = args.seconds;
    let mut totals = Totals::default();
    let mut gen = match tls_gen_for(&args) {
        Ok(g) => g,
        Err(e) => {
            totals.fail(e);
            return (totals, Instant::now());
        }
    };
    let start = Instant::now();
    let mut slots: Vec<TlsSlot> = (0..conns).map(|_| new_tls_slot(start)).collect();
    let mut warming = true;
    let mut began = start;
    let mut deadline = start + WARMUP_MAX;
    let mut ready: Vec<(usize, bool)> = Vec::with_capacity(conns);
    loop {
        let now = Instant::now();
        if warming && (slots.iter().all(|s| s.warm) || now > deadline) {
            // The measured part begins. What failed in the warm-up is not
            // counted in it (the first error is kept); a connection that
            // did not get through is told on the WARM line.
            let through = slots.iter().filter(|s| s.warm && !s.cold).count();
            println!("WARM {through}");
            let _ = std::io::stdout().flush();
            warming = false;
            totals.errors = 0;
            totals.warm_error = totals.first_error.take();
            began = Instant::now();
            deadline = began + Duration::from_secs_f64(seconds);
            for slot in slots.iter_mut() {
                if slot.phase == TlsPhase::Idle {
                    if let Err(e) = gen.again(slot) {
                        totals.fail(e);
                        slot.sock = None;
                        slot.tls = None;
                        slot.phase = TlsPhase::Pause;
                    }
                } else if slot.phase != TlsPhase::Pause {
                    // Still in its warm-up (timed out), or closing.
                    slot.sock = None;
                    slot.tls = None;
                    slot.phase = TlsPhase::Pause;
                }
                slot.resume = began;
            }
            continue;
        }
        // (Re)open idle slots: in the warm-up each one once, then every
        // one while the measured part lasts.
        for slot in slots.iter_mut() {
            let wanted = if warming { !slot.warm } else { now < deadline };
            if slot.sock.is_none() && wanted && now >= slot.resume {
                if let Err(e) = gen.open(slot) {
                    totals.fail(e);
                    slot.resume = now + ERROR_PAUSE;
                    if warming {
                        slot.warm = true;
                        slot.cold = true;
                    }
                }
            }
        }
        ready.clear();
        let mut fds = Vec::with_capacity(conns);
        for (i, slot) in slots.iter().enumerate() {
            if let Some(s) = &slot.sock {
                let events = if slot.phase == TlsPhase::Connecting {
                    PollFlags::POLLOUT
                } else if slot.tls.as_ref().is_some_and(|t| t.wants_write()) {
                    PollFlags::POLLIN | PollFlags::POLLOUT
                } else {
                    PollFlags::POLLIN
                };
                fds.push(PollFd::new(s.as_fd(), events));
                ready.push((i, false));
            }
        }
        if fds.is_empty() {
            if !warming && now >= deadline {
                break;
            }
            let next = slots.iter().map(|s| s.resume).min().unwrap_or(now);
            std::thread::sleep(
                next.saturating_duration_since(now)
                    .clamp(Duration::from_millis(1), Duration::from_millis(100)),
            );
            continue;
        }
        match poll(&mut fds, PollTimeout::from(100u8)) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => {
                totals.fail(format!("poll: {e}"));
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
            } else if slot.phase != TlsPhase::Idle
                && now.duration_since(slot.started) > REQUEST_TIMEOUT
            {
                Err(if slot.phase == TlsPhase::Closing {
                    "the server did not close after Connection: close".into()
                } else {
                    format!("timed out in phase {:?}", slot.phase)
                })
            } else {
                continue;
            };
            if std::mem::take(&mut slot.new_handshake) && !warming {
                totals.handshakes += 1;
            }
            let next = match outcome {
                Ok(TlsWant::Wait) => continue,
                Ok(TlsWant::Done) => {
                    if warming {
                        slot.warm = true;
                    } else {
                        totals.requests += 1;
                        totals.bytes += slot.got as u64;
                    }
                    if !keepalive {
                        gen.close(slot)
                    } else if warming {
                        slot.phase = TlsPhase::Idle;
                        Ok(())
                    } else if now < deadline {
                        gen.again(slot)
                    } else {
                        // Done: the kept connection is dropped.
                        slot.sock = None;
                        slot.tls = None;
                        slot.phase = TlsPhase::Pause;
                        Ok(())
                    }
                }
                Ok(TlsWant::Closed) => {
                    slot.sock = None;
                    slot.tls = None;
                    slot.phase = TlsPhase::Pause;
                    slot.resume = now;
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Err(e) = next {
                totals.fail(e);
                if warming {
                    slot.warm = true;
                    slot.cold = true;
                }
                slot.sock = None;
                slot.tls = None;
                slot.phase = TlsPhase::Pause;
                slot.resume = now + ERROR_PAUSE;
            }
        }
    }
    (totals, began)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let mut t0 = Instant::now();
    let rate = args.rate;
    let (t, extra) = if args.tls.is_some() {
        let (t, began) = run_tls(args);
        t0 = began;
        let extra = format!(
            ", \"handshakes\": {}, \"warm_error\": {}",
            t.handshakes,
            t.warm_error
                .as_deref()
                .map(json_str)
                .unwrap_or_else(|| "null".into())
        );
        (t, extra)
    } else if rate.is_some() {
        // Wake when a connection is due, not up to 50 us later (the
        // default slack), which every latency would carry.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let (t, lat) = if args.keepalive {
            run_rate_kept(args)
        } else {
            run_rate(args)
        };
        t0 = lat.began.unwrap_or(t0);
        let extra = format!(
            ", \"rate\": {}, \"latency_us\": {}, \"service_us\": {}, \"latency_buckets_us\": {}",
            rate.unwrap_or(0.0),
            percentiles_json(&lat.due),
            percentiles_json(&lat.service),
            buckets_json(&lat.due)
        );
        (t, extra)
    } else {
        (run(args), String::new())
    };
    println!(
        "LOADGEN {{\"requests\": {}, \"bytes\": {}, \"errors\": {}, \"first_error\": {}, \"seconds\": {:.6}{}}}",
        t.requests,
        t.bytes,
        t.errors,
        t.first_error.as_deref().map(json_str).unwrap_or_else(|| "null".into()),
        t0.elapsed().as_secs_f64(),
        extra
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

    #[derive(Clone, Copy, PartialEq)]
    enum Front {
        Plain,
        Socks,
        Connect,
    }

    /// An origin answering each GET with one 1000-byte response (several
    /// on one connection unless the request says `Connection: close`),
    /// optionally behind a minimal SOCKS5 server (no authentication,
    /// CONNECT to any address is accepted and served locally) or a minimal
    /// HTTP CONNECT proxy.
    fn origin(front: Front) -> SocketAddr {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    let read_head = |c: &mut std::net::TcpStream| {
                        let mut head = Vec::new();
                        let mut one = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if c.read(&mut one).unwrap_or(0) == 0 {
                                return None;
                            }
                            head.push(one[0]);
                        }
                        Some(head)
                    };
                    match front {
                        Front::Socks => {
                            c.read_exact(&mut b[..3]).unwrap();
                            assert_eq!(&b[..3], b"\x05\x01\x00");
                            c.write_all(b"\x05\x00").unwrap();
                            c.read_exact(&mut b[..10]).unwrap();
                            assert_eq!(&b[..4], b"\x05\x01\x00\x01");
                            c.write_all(b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50")
                                .unwrap();
                        }
                        Front::Connect => {
                            let head = read_head(&mut c).expect("a CONNECT request");
                            assert!(head.starts_with(b"CONNECT 10.0.2.2:80 HTTP/1.1\r\n"));
                            c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                                .unwrap();
                        }
                        Front::Plain => {}
                    }
                    while let Some(head) = read_head(&mut c) {
                        assert!(head.starts_with(b"GET /f HTTP/1.1\r\n"));
                        let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec();
                        resp.extend_from_slice(&[b'x'; 1000]);
                        c.write_all(&resp).unwrap();
                        if head.windows(17).any(|w| w == b"Connection: close") {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn args(server: SocketAddr, conns: usize, seconds: f64) -> Args {
        Args {
            server,
            target: "10.0.2.2:80".parse().unwrap(),
            path: "/f".into(),
            conns,
            seconds,
            socks: false,
            connect: false,
            keepalive: false,
            rate: None,
            absolute: false,
            tls: None,
        }
    }

    const EACH: u64 = 41 + 1000;

    fn fetch_from(server: SocketAddr, socks: bool) {
        let t = run(Args {
            socks,
            ..args(server, 3, 0.3)
        });
        assert_eq!(t.errors, 0, "{:?}", t.first_error);
        assert!(t.requests > 10, "{} requests", t.requests);
        let each = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".len() as u64 + 1000;
        assert_eq!(each, EACH);
        assert_eq!(t.bytes, t.requests * each);
    }

    #[test]
    fn fetches_whole_responses_directly_and_through_socks() {
        fetch_from(origin(Front::Plain), false);
        fetch_from(origin(Front::Socks), true);
    }

    #[test]
    fn keepalive_carries_many_requests_per_socks_tunnel() {
        let t = run(Args {
            socks: true,
            keepalive: true,
            ..args(origin(Front::Socks), 2, 0.3)
        });
        assert_eq!(t.errors, 0, "{:?}", t.first_error);
        assert!(t.requests > 20, "{} requests", t.requests);
        assert_eq!(t.bytes, t.requests * EACH);
    }

    #[test]
    fn open_loop_keeps_its_rate_and_measures_from_the_schedule() {
        for (front, connect) in [(Front::Plain, false), (Front::Connect, true)] {
            let (t, lat) = run_rate(Args {
                connect,
                rate: Some(200.0),
                ..args(origin(front), 1, 0.5)
            });
            assert_eq!(t.errors, 0, "{:?}", t.first_error);
            // 100 connections were due; each made one request.
            assert!((95..=101).contains(&t.requests), "{} requests", t.requests);
            assert_eq!(t.bytes, t.requests * EACH);
            assert_eq!(lat.due.len(), t.requests);
            let p = |h: &hdrhistogram::Histogram<u64>, q| h.value_at_quantile(q);
            assert!(p(&lat.due, 0.5) <= p(&lat.due, 0.99));
            assert!(p(&lat.due, 0.99) <= lat.due.max());
            // Measured from when it was due, a request takes at least as
            // long as from its connect call.
            assert!(lat.due.max() >= lat.service.max());
            assert!(lat.due.max() < 5_000_000);
        }
    }

    #[test]
    fn open_loop_over_kept_connections_uses_the_pool_in_turn() {
        let (t, lat) = run_rate_kept(Args {
            keepalive: true,
            rate: Some(200.0),
            ..args(origin(Front::Plain), 4, 0.5)
        });
        assert_eq!(t.errors, 0, "{:?}", t.first_error);
        // 100 requests were due after the warm-up's 4, which are not
        // counted.
        assert!((95..=101).contains(&t.requests), "{} requests", t.requests);
        assert_eq!(t.bytes, t.requests * EACH);
        assert_eq!(lat.due.len(), t.requests);
        assert!(lat.began.is_some());
        assert!(lat.due.max() >= lat.service.max());
    }

    #[test]
    fn a_forward_proxy_is_sent_an_absolute_target() {
        let g = gen_for(Args {
            absolute: true,
            keepalive: true,
            ..args("127.0.0.1:1".parse().unwrap(), 1, 0.1)
        });
        assert_eq!(
            g.request,
            b"GET http://10.0.2.2:80/f HTTP/1.1\r\nHost: 10.0.2.2:80\r\n\r\n"
        );
    }

    #[test]
    fn open_loop_counts_a_refused_tunnel() {
        // An origin that is no CONNECT proxy answers the CONNECT with...
        // nothing it understands: a plain listener that closes at once.
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                let _ = c.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n");
            }
        });
        let (t, lat) = run_rate(Args {
            connect: true,
            rate: Some(100.0),
            ..args(server, 1, 0.2)
        });
        assert_eq!(t.requests, 0);
        assert!(t.errors >= 15, "{} errors", t.errors);
        assert!(t.first_error.unwrap().contains("CONNECT status 403"));
        assert!(lat.due.is_empty());
        assert!(percentiles_json(&lat.due).contains("\"p99.99\": 0"));
    }

    #[test]
    fn buckets_hold_every_value_and_grow_by_two_percent() {
        let mut h = histogram();
        assert_eq!(buckets_json(&h), "[]");
        for v in [5u64, 5, 1000, 1010, 250_000] {
            h.record(v).unwrap();
        }
        let j = buckets_json(&h);
        let pairs: Vec<(f64, u64)> = j
            .trim_matches(|c| c == '[' || c == ']')
            .split("], [")
            .map(|p| {
                let (a, b) = p.split_once(", ").unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        assert_eq!(pairs.iter().map(|p| p.1).sum::<u64>(), 5, "{j}");
        // Each value lies in a bucket whose upper end is at most 2% (and
        // the histogram's own 0.1%) above it.
        for v in [5.0, 1000.0, 1010.0, 250_000.0] {
            let upper = pairs.iter().map(|p| p.0).find(|&u| u >= v).unwrap();
            assert!(upper <= v * 1.021 + 1.0, "{v} in {upper}: {j}");
        }
        assert_eq!(pairs[0], (5.0, 2), "{j}");
    }

    #[test]
    fn percentiles_are_the_report_columns() {
        let mut h = histogram();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let j = percentiles_json(&h);
        for k in [
            "\"p50\": ",
            "\"p90\": ",
            "\"p99\": ",
            "\"p99.9\": ",
            "\"p99.99\": ",
            "\"max\": ",
        ] {
            assert!(j.contains(k), "{j}");
        }
        // Three significant digits: within 0.1% of the exact values.
        let near = |q: f64, exact: f64| {
            let v = h.value_at_quantile(q) as f64;
            (v - exact).abs() <= exact * 0.001 + 1.0
        };
        assert!(
            near(0.5, 5000.0) && near(0.99, 9900.0) && near(0.9999, 9999.0),
            "{j}"
        );
        assert!((h.max() as f64 - 10_000.0).abs() <= 10.0, "{j}");
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = free.local_addr().unwrap();
        drop(free);
        let t = run(args(server, 1, 0.2));
        assert_eq!(t.requests, 0);
        assert!(t.errors > 0);
        assert!(t.first_error.unwrap().contains("connect"));
    }

    /// A CA and a certificate it signed for NAME (the CA's PEM file in
    /// DIR, and the leaf's chain and key for a rustls server).
    fn tls_pki(
        dir: &std::path::Path,
        name: &str,
    ) -> (
        String,
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let ca_path = dir.join("ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        (
            ca_path.to_str().unwrap().to_string(),
            vec![leaf.der().clone()],
            key,
        )
    }

    /// An HTTPS origin on 127.0.0.1 answering each GET with one 1000-byte
    /// response, several on a connection unless the request says
    /// `Connection: close` (then it closes, with its close_notify),
    /// optionally behind a CONNECT front: the front answers a CONNECT
    /// itself and then speaks TLS as the origin, as an intercepting proxy
    /// does. Its certificate names NAME. Returns its address and the CA
    /// file to trust.
    fn tls_origin(connect: bool, name: &str, dir: &str) -> (SocketAddr, String) {
        use std::net::TcpListener;
        let dir = std::env::temp_dir().join(format!("loadgen-{}-{dir}", std::process::id()));
        let (ca, chain, key) = tls_pki(&dir, name);
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let cfg = Arc::new(cfg);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                let cfg = cfg.clone();
                std::thread::spawn(move || {
                    let read_head = |r: &mut dyn Read| {
                        let mut head = Vec::new();
                        let mut one = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if r.read(&mut one).unwrap_or(0) == 0 {
                                return None;
                            }
                            head.push(one[0]);
                        }
                        Some(head)
                    };
                    if connect {
                        let head = read_head(&mut c).expect("a CONNECT request");
                        assert!(head.starts_with(b"CONNECT 10.0.2.2:443 HTTP/1.1\r\n"));
                        c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                            .unwrap();
                    }
                    let conn = rustls::ServerConnection::new(cfg).unwrap();
                    let mut s = rustls::StreamOwned::new(conn, c);
                    while let Some(head) = read_head(&mut s) {
                        assert!(head.starts_with(b"GET /f HTTP/1.1\r\n"), "{head:?}");
                        let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec();
                        resp.extend_from_slice(&[b'x'; 1000]);
                        if s.write_all(&resp).is_err() {
                            return;
                        }
                        if head.windows(17).any(|w| w == b"Connection: close") {
                            s.conn.send_close_notify();
                            let _ = s.flush();
                            return;
                        }
                    }
                });
            }
        });
        (addr, ca)
    }

    /// The TLS mode's arguments: through a CONNECT front to 10.0.2.2:443
    /// (which the front never dials), or directly to SERVER.
    fn tls_args(server: SocketAddr, ca: String, connect: bool, keepalive: bool) -> Args {
        let SocketAddr::V4(direct) = server else {
            unreachable!()
        };
        Args {
            target: if connect {
                "10.0.2.2:443".parse().unwrap()
            } else {
                direct
            },
            connect,
            keepalive,
            tls: Some(ca),
            ..args(server, 2, 0.4)
        }
    }

    #[test]
    fn tls_each_request_on_its_own_connection_is_a_handshake() {
        // Directly and through an intercepting CONNECT front: every
        // request a new connection with a full handshake, after the
        // warm-up's (not counted); the name checked is the target's
        // address.
        for (connect, name) in [(false, "127.0.0.1"), (true, "10.0.2.2")] {
            let (server, ca) = tls_origin(connect, name, &format!("close-{connect}"));
            let (t, began) = run_tls(tls_args(server, ca, connect, false));
            assert_eq!(t.errors, 0, "{:?}", t.first_error);
            assert!(t.warm_error.is_none(), "{:?}", t.warm_error);
            assert!(t.requests > 5, "{} requests", t.requests);
            assert_eq!(t.handshakes, t.requests);
            assert_eq!(t.bytes, t.requests * EACH);
            assert!(began.elapsed() < Duration::from_secs(5));
        }
    }

    #[test]
    fn tls_keepalive_carries_many_requests_per_connection() {
        for (connect, name) in [(false, "127.0.0.1"), (true, "10.0.2.2")] {
            let (server, ca) = tls_origin(connect, name, &format!("ka-{connect}"));
            let t = run_tls(tls_args(server, ca, connect, true)).0;
            assert_eq!(t.errors, 0, "{:?}", t.first_error);
            assert!(t.requests > 20, "{} requests", t.requests);
            // The connections were made in the warm-up.
            assert_eq!(t.handshakes, 0);
            assert_eq!(t.bytes, t.requests * EACH);
        }
    }

    #[test]
    fn tls_a_certificate_for_another_name_is_refused() {
        // The front's certificate names 127.0.0.1, the target is 10.0.2.2.
        let (server, ca) = tls_origin(true, "127.0.0.1", "other-name");
        let t = run_tls(tls_args(server, ca, true, true)).0;
        assert_eq!(t.requests, 0);
        assert!(
            t.warm_error
                .as_deref()
                .unwrap_or("")
                .contains("certificate"),
            "{:?}",
            t.warm_error
        );
    }

    #[test]
    fn tls_requests_name_the_target() {
        let t: SocketAddrV4 = "10.0.2.2:443".parse().unwrap();
        assert_eq!(
            tls_request(&t, "/1k.bin", true),
            b"GET /1k.bin HTTP/1.1\r\nHost: 10.0.2.2\r\n\r\n"
        );
        let t: SocketAddrV4 = "10.0.2.2:8443".parse().unwrap();
        assert_eq!(
            tls_request(&t, "/f", false),
            b"GET /f HTTP/1.1\r\nHost: 10.0.2.2:8443\r\nConnection: close\r\n\r\n"
        );
        assert!(tls_config("/nonexistent/ca.pem").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
