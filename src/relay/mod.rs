//! The TCP relay: both directions of a session in one thread (3proxy's
//! `sockmap.c`).
//!
//! Both sockets are non-blocking. Each direction remembers whether its
//! source was last seen readable and its destination writable; the loop
//! reads and writes until every possible move would block, and only then
//! polls, for just the events it is waiting for. So a read that can proceed
//! never waits for a poll(), and an idle direction costs no system calls.
//!
//! - Half-close (the default): one side's EOF becomes a shutdown of the
//!   other side's write half once everything read has been written, and the
//!   other direction keeps flowing. `-C` ends the session at the first EOF,
//!   after delivering what was already read.
//! - The idle timeout is measured from the last time any byte moved.
//! - Data moves through a heap buffer per direction (borrowed from the
//!   shared pool, `bufpool`, only while data is in flight, so idle sessions
//!   hold none) or, with `-s`, through a kernel pipe per direction with
//!   splice(), never copied to us (pooled too, unless `-b` resizes it).
//! - Limits (`Hooks::limits`): a direction over its bandwidth limit reads
//!   nothing until its bucket's debt is paid; the wait is part of the
//!   poll() timeout, so a limited session sleeps and never spins. A
//!   direction past its traffic quota ends the session with code 10.
//! - Each direction counts its reads and writes that moved bytes (two
//!   plain adds per move, where the bytes are counted anyway): the
//!   outcome says how often the server was read from and written to
//!   (`Outcome::ops`, for TrafficPlugin's `p` form). With splice() a read
//!   is one splice() from the server's socket into the pipe, a write one
//!   from the pipe into the server's socket, as in 3proxy's sockmap.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::access::Recheck;
use crate::limit::{Permit, SessionLimits};
use crate::net::Stream;
use crate::res::Res;
use crate::service::Grace;
use crate::traffic::Ops;

mod channel;

pub use channel::DataFilter;
use channel::{errno, Channel, CopyBuf, FilterBuf, SplicePipe};

/// How a relay runs.
#[derive(Debug, Clone, Copy)]
pub struct RelayOpts {
    /// End the session after this long without data in either direction.
    pub idle: Duration,
    /// `-C`: end at the first EOF instead of half-closing.
    pub session_end: bool,
    /// `-s`: splice through pipes instead of copying.
    pub splice: bool,
    /// Bytes per direction in flight at most (`-b`).
    pub bufsize: usize,
    pub grace: Option<Grace>,
    /// End the session then, with code 27 (`auth radius`'s
    /// Session-Timeout).
    pub deadline: Option<Instant>,
    /// `parklinger`: after this long without a byte moving (and nothing
    /// in flight), stop and return the state to park (`relay_parking`).
    /// None: never. Only `relay_parking` honours it.
    pub linger: Option<Duration>,
    /// The client was just answered (a SOCKS reply, a CONNECT's 200) and
    /// everything it sent before is read: it has nothing to send until
    /// the answer reaches it, so the relay's first read of it waits for a
    /// poll() instead of trying at once (a recv() that would only say
    /// EAGAIN).
    pub client_answered: bool,
}

/// A relay that stopped to park (`relay_parking`): what it must remember
/// to go on. It holds no buffer and no pipe.
#[derive(Debug, Clone)]
pub struct Paused {
    up: DirState,
    down: DirState,
    dumped: (u64, u64),
    dumped_ops: (u64, u64),
    generation: u64,
    /// Since when no byte moved: the idle timeout counts from here, also
    /// while parked.
    quiet_since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct DirState {
    eof: bool,
    shut: bool,
    bytes: u64,
    fills: u64,
    drains: u64,
}

impl Paused {
    /// Whether the client socket is to be watched (it may still send).
    pub fn watch_client(&self) -> bool {
        !self.up.eof
    }

    /// Whether the server socket is to be watched.
    pub fn watch_server(&self) -> bool {
        !self.down.eof
    }

    /// The reload generation the session was last checked against.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// When the session must be looked at even if nothing comes: its idle
    /// timeout, or the end `opts.deadline` sets.
    pub fn deadline(&self, opts: &RelayOpts) -> Instant {
        let idle = self.quiet_since + opts.idle;
        opts.deadline.map_or(idle, |d| d.min(idle))
    }
}

/// How a relay ended: the result code and the bytes delivered each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub res: Res,
    /// Client to server.
    pub out: u64,
    /// Server to client.
    pub inb: u64,
    /// Reads of the server and writes to it that moved bytes (no
    /// connects: the relay makes none).
    pub ops: Ops,
}

/// What a relay does besides moving bytes. All optional.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Bandwidth limits and traffic quotas of the session.
    pub limits: Option<&'a SessionLimits>,
    /// Check the session again after a reload (`force`).
    pub recheck: Option<&'a Recheck>,
    /// `logdump`: intermediate log records.
    pub dump: Option<Dump<'a>>,
    /// `pcre` filters of types `clidata` and `srvdata`: the data goes
    /// through them (and never through splice), as in 3proxy's sockmap.
    pub filter: Option<DataFilter<'a>>,
    /// The session's counters in the live registry: each delivery is
    /// added there too (one relaxed add, where the relay counts anyway).
    pub live: Option<&'a crate::live::Bytes>,
}

/// `logdump`: when a direction has moved this many bytes since the last
/// record (0: never), `write(out, in, ops)` writes a record of the bytes
/// (and the server's reads and writes) since then; the outcome then
/// counts only what came after the last record.
pub struct Dump<'a> {
    /// Bytes client to server.
    pub out_at: u64,
    /// Bytes server to client.
    pub in_at: u64,
    pub write: &'a mut dyn FnMut(u64, u64, Ops),
}

/// The relay with every hook; it never parks.
pub fn relay_hooked(cli: &Stream, srv: &Stream, opts: &RelayOpts, hooks: Hooks<'_>) -> Outcome {
    let opts = &RelayOpts {
        linger: None,
        ..*opts
    };
    match relay_parking(cli, srv, opts, hooks, None) {
        Ok(out) => out,
        // Not without a linger.
        Err(_) => Outcome {
            res: Res::POLL,
            out: 0,
            inb: 0,
            ops: Ops::default(),
        },
    }
}

/// The relay with every hook, parking after `opts.linger` without
/// traffic: then it returns Err with the state to go on from (`from`),
/// and the caller parks the session (`park`). Sessions with data filters
/// (`clidata`, `srvdata`) never park: their filters hold state.
pub fn relay_parking(
    cli: &Stream,
    srv: &Stream,
    opts: &RelayOpts,
    mut hooks: Hooks<'_>,
    from: Option<Paused>,
) -> Result<Outcome, Paused> {
    hooks.limits = hooks.limits.filter(|l| l.shapes());
    // A TLS session's bytes must pass through rustls: the copy path.
    let splice = opts.splice && !cli.is_tls() && !srv.is_tls();
    let opts = &RelayOpts { splice, ..*opts };
    // The copy relay asks for non-blocking reads and writes per call
    // (MSG_DONTWAIT), which leaves the sockets' mode alone: two ioctl()
    // per session less. splice() to a socket follows the socket's mode,
    // so for it the sockets are switched.
    // (A parked session's sockets were switched already.)
    if opts.splice
        && from.is_none()
        && (cli.set_nonblocking(true).is_err() || srv.set_nonblocking(true).is_err())
    {
        return Ok(Outcome {
            res: Res::POLL,
            out: 0,
            inb: 0,
            ops: Ops::default(),
        });
    }
    if let Some(f) = hooks.filter {
        // Decided once per session: without filters the loop below never
        // sees this type.
        let up = FilterBuf::new(f, crate::filter::CLIDATA, opts.bufsize);
        let down = FilterBuf::new(f, crate::filter::SRVDATA, opts.bufsize);
        let opts = &RelayOpts {
            linger: None,
            ..*opts
        };
        return run(cli, srv, up, down, opts, hooks, from);
    }
    if opts.splice {
        let mk = || SplicePipe::new(opts.bufsize);
        run(cli, srv, mk(), mk(), opts, hooks, from)
    } else {
        let mk = || CopyBuf::new(opts.bufsize);
        run(cli, srv, mk(), mk(), opts, hooks, from)
    }
}

/// Which socket an error came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

struct Dir<'a, C> {
    ch: C,
    src: &'a Stream,
    dst: &'a Stream,
    src_side: Side,
    can_read: bool,
    can_write: bool,
    eof: bool,
    shut: bool,
    /// The other direction has passed its EOF on already: when this one
    /// ends too, both sockets are about to be closed, and close() sends
    /// the FIN, so no shutdown() is needed.
    other_shut: bool,
    bytes: u64,
    /// Fills and drains that moved bytes: reads of `src`, writes to `dst`.
    fills: u64,
    drains: u64,
    /// Where `bytes` is also added (the live registry), if anywhere.
    live: Option<&'a std::sync::atomic::AtomicU64>,
    /// Limits: set while the direction must not read (bandwidth), and
    /// when its quota is used up.
    throttled: Option<Instant>,
    quota_hit: bool,
    /// Reads and bytes in the current one-second window, for `-g`.
    win_start: Instant,
    win_reads: u32,
    win_bytes: u64,
}

impl<'a, C: Channel> Dir<'a, C> {
    fn new(ch: C, src: &'a Stream, dst: &'a Stream, src_side: Side) -> Self {
        Dir {
            ch,
            src,
            dst,
            src_side,
            can_read: true,
            can_write: true,
            eof: false,
            shut: false,
            other_shut: false,
            bytes: 0,
            fills: 0,
            drains: 0,
            live: None,
            throttled: None,
            quota_hit: false,
            win_start: Instant::now(),
            win_reads: 0,
            win_bytes: 0,
        }
    }

    fn dst_side(&self) -> Side {
        match self.src_side {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }

    /// Whether the limits let this direction read now, and how much.
    fn allowance(&mut self, limits: Option<&SessionLimits>) -> Option<usize> {
        let Some(l) = limits else {
            return Some(usize::MAX);
        };
        if self.quota_hit {
            return None;
        }
        let now = Instant::now();
        if self.throttled.is_some_and(|t| t > now) {
            return None;
        }
        self.throttled = None;
        match l.permit(self.src_side == Side::Client, now) {
            Permit::Go(n) => Some(n),
            Permit::Wait(t) => {
                self.throttled = Some(t);
                None
            }
            Permit::Stop => {
                self.quota_hit = true;
                None
            }
        }
    }

    /// Move what can move without blocking. Ok(true) if anything happened.
    /// `stop_at`: return once this many bytes have been delivered in all,
    /// so the caller can write a `logdump` record at that point.
    fn step(
        &mut self,
        grace: Option<Grace>,
        limits: Option<&SessionLimits>,
        stop_at: u64,
    ) -> Result<bool, (Side, Errno)> {
        let mut progress = false;
        loop {
            let mut moved = false;
            let readable = !self.eof && self.can_read && self.ch.has_space();
            let max = if readable {
                self.allowance(limits)
            } else {
                None
            };
            if let Some(max) = max {
                let asked = self.ch.room().min(max);
                match self.ch.fill(self.src, max) {
                    Ok(0) => {
                        self.eof = true;
                        moved = true;
                    }
                    Ok(n) => {
                        moved = true;
                        self.fills += 1;
                        // A short read emptied the socket: the next read
                        // would only say EAGAIN, so wait for readiness
                        // instead of paying for that call. (Unless a TLS
                        // session holds more, or its peer's end, which no
                        // poll of the socket would report.)
                        if n < asked && !self.src.ready() {
                            self.can_read = false;
                        }
                        if let Some(l) = limits {
                            l.used(self.src_side == Side::Client, n, Instant::now());
                        }
                        if grace.is_some() {
                            self.count_read(n);
                        }
                    }
                    Err(Errno::EAGAIN) => self.can_read = false,
                    Err(Errno::EINTR) => moved = true,
                    // A reset while reading is the source's end, as its
                    // FIN is (3proxy's sockmap ends a side on a failed
                    // read and counts only failed writes as errors):
                    // everything it sent before has been read, and the
                    // kernel gives queued bytes before the error. A peer
                    // resets when it closes with our last bytes unread:
                    // a TLS server that sends its close_notify and
                    // closes as the client's reply comes in, which
                    // happened or not by a few microseconds. What was
                    // lost, if anything, shows on the write side: bytes
                    // still to be sent to it fail there (95, 96).
                    Err(Errno::ECONNRESET | Errno::EPIPE) => {
                        self.eof = true;
                        moved = true;
                    }
                    Err(e) => return Err((self.src_side, e)),
                }
            }
            if !self.ch.pending() && self.can_write && self.dst.wants_write() {
                // All written, but a TLS session still holds records.
                match self.dst.flush_nb() {
                    Ok(()) => moved = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.can_write = false,
                    Err(e) => return Err((self.dst_side(), errno(e))),
                }
            }
            if self.ch.pending() && self.can_write {
                match self.ch.drain(self.dst) {
                    Ok(n) => {
                        self.bytes += n as u64;
                        self.drains += 1;
                        if let Some(l) = self.live {
                            // The session's own thread is the only writer
                            // (`live::Bytes`): a plain load and store, no
                            // locked add.
                            use std::sync::atomic::Ordering::Relaxed;
                            l.store(l.load(Relaxed) + n as u64, Relaxed);
                        }
                        moved = true;
                    }
                    Err(Errno::EAGAIN) => self.can_write = false,
                    Err(Errno::EINTR) => moved = true,
                    Err(e) => return Err((self.dst_side(), e)),
                }
            }
            if self.eof && !self.pending() && !self.shut {
                // Everything read has been written: pass the EOF on.
                if !self.other_shut {
                    let _ = self.dst.shutdown(std::net::Shutdown::Write);
                }
                self.shut = true;
                moved = true;
            }
            if !moved {
                return Ok(progress);
            }
            progress = true;
            if self.bytes >= stop_at {
                return Ok(true);
            }
        }
    }

    fn count_read(&mut self, n: usize) {
        if self.win_start.elapsed() >= Duration::from_secs(1) {
            self.win_start = Instant::now();
            self.win_reads = 0;
            self.win_bytes = 0;
        }
        self.win_reads += 1;
        self.win_bytes += n as u64;
    }

    /// `-g`: this direction made many small reads in the last second.
    fn trickling(&self, g: Grace) -> bool {
        self.win_reads >= g.reads
            && self.win_bytes <= u64::from(g.bytes) * u64::from(self.win_reads)
    }

    fn wants_read(&self) -> bool {
        !self.eof
            && !self.can_read
            && self.ch.has_space()
            && self.throttled.is_none()
            && !self.quota_hit
    }

    fn wants_write(&self) -> bool {
        self.pending() && !self.can_write
    }

    /// Bytes read and not yet on the wire: in the channel, or records a
    /// TLS destination holds.
    fn pending(&self) -> bool {
        self.ch.pending() || self.dst.wants_write()
    }
}

/// Both directions of a running relay, and what its loop keeps between
/// passes.
struct Relay<'a, C> {
    // `down` first: fields are dropped in order, and the server's
    // direction gives its buffer or pipe back first.
    down: Dir<'a, C>,
    up: Dir<'a, C>,
    /// Bytes each way already reported by `logdump` records.
    dumped: (u64, u64),
    /// The server's reads and writes those records reported.
    dumped_ops: (u64, u64),
    /// The reload generation the session was last checked against.
    generation: u64,
    /// Since when nothing moved (None: something just did; the quiet time
    /// starts at the next wait).
    quiet_since: Option<Instant>,
}

/// The relay loop over `c2s` and `s2c`: Ok when the session ends, Err
/// when it stops to park.
fn run<C: Channel>(
    cli: &Stream,
    srv: &Stream,
    c2s: C,
    s2c: C,
    opts: &RelayOpts,
    hooks: Hooks<'_>,
    from: Option<Paused>,
) -> Result<Outcome, Paused> {
    let Hooks {
        limits,
        recheck,
        mut dump,
        filter: _,
        live,
    } = hooks;
    let mut r = Relay::new(cli, srv, c2s, s2c, live, recheck);
    let idle_ms = millis(opts.idle);
    match &from {
        Some(p) => r.resume(p),
        None => r.begin(opts),
    }
    let res = loop {
        if opts.deadline.is_some_and(|d| Instant::now() >= d) {
            break Res::RADIUS_SESSION_TIMEOUT;
        }
        if let Err(res) = r.recheck(recheck) {
            break res;
        }
        let moved = match r.step(opts.grace, limits, dump.as_ref()) {
            Ok(moved) => moved,
            Err(res) => break res,
        };
        if let Some(d) = dump.as_mut().filter(|_| moved) {
            r.dump(d);
        }
        if let Some(res) = r.ended() {
            break res;
        }
        if opts.session_end && (r.up.eof || r.down.eof) && !(r.up.eof && r.down.eof) {
            // -C: stop reading; what was read is still delivered.
            r.up.eof = true;
            r.down.eof = true;
            continue;
        }
        if moved {
            r.quiet_since = None;
            continue;
        }
        r.settle(opts.grace);
        let holding = r.up.ch.holds() || r.down.ch.holds();
        let quiet = *r.quiet_since.get_or_insert_with(Instant::now);
        let (ms, ends) = wait_ms(opts, idle_ms, quiet, holding);
        if let Some(linger) = opts.linger.filter(|_| !holding && parkable(&r.up, &r.down)) {
            match r.linger(linger, quiet, ms) {
                None => {}
                Some(Ok(true)) => continue,
                Some(Ok(false)) => return Err(r.paused(quiet)),
                Some(Err(_)) => break Res::POLL,
            }
        }
        let waited = wait(&mut r.up, &mut r.down, ms);
        match waited {
            Ok(true) => {}
            Ok(false) if holding => r.flush(),
            Ok(false) if ends => {}
            Ok(false) => break r.idle_res(),
            Err(_) => break Res::POLL,
        }
    };
    Ok(Outcome {
        res,
        out: r.up.bytes - r.dumped.0,
        inb: r.down.bytes - r.dumped.1,
        ops: r.ops_since_dump(),
    })
}

impl<'a, C: Channel> Relay<'a, C> {
    /// The two directions over `c2s` and `s2c`, counting into `live`.
    fn new(
        cli: &'a Stream,
        srv: &'a Stream,
        c2s: C,
        s2c: C,
        live: Option<&'a crate::live::Bytes>,
        recheck: Option<&Recheck>,
    ) -> Self {
        let mut up = Dir::new(c2s, cli, srv, Side::Client);
        up.live = live.map(|l| &l.out);
        let mut down = Dir::new(s2c, srv, cli, Side::Server);
        down.live = live.map(|l| &l.inb);
        Relay {
            down,
            up,
            dumped: (0, 0),
            dumped_ops: (0, 0),
            // A reload since the session was admitted (even one during its
            // handshake) is noticed at the first pass.
            generation: recheck.map_or_else(crate::running::generation, |c| c.generation()),
            quiet_since: None,
        }
    }

    /// Back from the parking lot: go on where it stopped.
    fn resume(&mut self, p: &Paused) {
        for (d, st) in [(&mut self.up, p.up), (&mut self.down, p.down)] {
            d.eof = st.eof;
            d.shut = st.shut;
            d.bytes = st.bytes;
            d.fills = st.fills;
            d.drains = st.drains;
        }
        self.dumped = p.dumped;
        self.dumped_ops = p.dumped_ops;
        self.generation = p.generation;
        self.quiet_since = Some(p.quiet_since);
    }

    /// Before a new session's first pass: which side to read at once.
    fn begin(&mut self, opts: &RelayOpts) {
        // A new session: the server has just been connected to (or sent
        // the handshake's last word) and has not had the client's bytes
        // yet, so a read of it now would only say EAGAIN; its first read
        // waits for a poll(), which reports at once if it spoke first.
        // (Unless a TLS session holds its bytes, which no poll shows.)
        self.down.can_read = self.down.src.ready();
        if opts.client_answered {
            self.up.can_read = self.up.src.ready();
        }
    }

    /// `force`: after a reload, check the session again; Err with the
    /// code it is then refused with.
    #[inline]
    fn recheck(&mut self, recheck: Option<&Recheck>) -> Result<(), Res> {
        if let Some(check) = recheck {
            // One relaxed load per pass; the check itself runs only after
            // a reload.
            let now = crate::running::generation();
            if now != self.generation {
                self.generation = now;
                crate::running::recheck(check)?;
            }
        }
        Ok(())
    }

    /// Move what can move both ways without blocking. Ok(true) if anything
    /// moved; Err with the code an IO error ends the session with.
    #[inline]
    fn step(
        &mut self,
        grace: Option<Grace>,
        limits: Option<&SessionLimits>,
        dump: Option<&Dump<'_>>,
    ) -> Result<bool, Res> {
        // With `logdump`, each direction stops at its next record's size.
        let stop = |d: Option<&Dump<'_>>, at: fn(&Dump<'_>) -> u64, done: u64| match d {
            Some(d) if at(d) > 0 => done + at(d),
            _ => u64::MAX,
        };
        let up_stop = stop(dump, |d| d.out_at, self.dumped.0);
        let down_stop = stop(dump, |d| d.in_at, self.dumped.1);
        let (up, down) = (&mut self.up, &mut self.down);
        up.other_shut = down.shut;
        let up_moved = up.step(grace, limits, up_stop);
        down.other_shut = up.shut;
        match (up_moved, down.step(grace, limits, down_stop)) {
            (Ok(a), Ok(b)) => Ok(a || b),
            (Err((side, e)), _) | (_, Err((side, e))) => Err(error_res(side, e, up, down)),
        }
    }

    /// `logdump`: write a record once a direction has moved its record's
    /// size since the last one.
    #[inline]
    fn dump(&mut self, d: &mut Dump<'_>) {
        let (o, i) = (
            self.up.bytes - self.dumped.0,
            self.down.bytes - self.dumped.1,
        );
        if (d.out_at > 0 && o >= d.out_at) || (d.in_at > 0 && i >= d.in_at) {
            (d.write)(o, i, self.ops_since_dump());
            self.dumped = (self.up.bytes, self.down.bytes);
            self.dumped_ops = (self.down.fills, self.up.drains);
        }
    }

    /// The server's reads (the down direction's fills) and writes (the
    /// up direction's drains) since the last `logdump` record.
    fn ops_since_dump(&self) -> Ops {
        Ops {
            reads: self.down.fills - self.dumped_ops.0,
            writes: self.up.drains - self.dumped_ops.1,
            connects: 0,
        }
    }

    /// The code the session ends with now, if it does: a filter refused
    /// data, a quota is reached (and what was read is delivered), or both
    /// directions are done.
    #[inline]
    fn ended(&self) -> Option<Res> {
        let (up, down) = (&self.up, &self.down);
        if up.ch.denied() || down.ch.denied() {
            // 3proxy's sockmap code for data a filter refused.
            return Some(Res::FILTER);
        }
        if (up.quota_hit && !up.ch.pending()) || (down.quota_hit && !down.ch.pending()) {
            // 3proxy's code for a traffic limit reached mid-session.
            return Some(Res::QUOTA);
        }
        if up.shut && down.shut {
            return Some(Res::OK);
        }
        None
    }

    /// Nothing moved: `-g`'s pause for a session that trickles, then the
    /// buffers go back.
    #[inline]
    fn settle(&mut self, grace: Option<Grace>) {
        if let Some(g) = grace {
            if self.up.trickling(g) || self.down.trickling(g) {
                std::thread::sleep(Duration::from_millis(u64::from(g.delay_ms)));
            }
        }
        // Nothing can move: give the buffers back before sleeping, so a
        // quiet session holds none (the pool makes the next borrow cheap).
        self.up.ch.release();
        self.down.ch.release();
    }

    /// `parklinger`: when the linger (from `quiet`) ends within `ms`, wait
    /// just that long. None: it does not, wait as usual; Some(Ok(true)):
    /// something came; Some(Ok(false)): nothing did, time to park.
    #[inline]
    fn linger(&mut self, linger: Duration, quiet: Instant, ms: i32) -> Option<io::Result<bool>> {
        // Park after the linger: wait that long first; if nothing
        // comes, the session leaves this thread.
        let (lingering, linger) = crate::park::Lingering::start(linger);
        let lms = millis(linger.saturating_sub(quiet.elapsed()));
        if lms >= ms {
            return None;
        }
        let waited = wait(&mut self.up, &mut self.down, lms);
        drop(lingering);
        Some(waited)
    }

    /// What the session must remember to go on after the lot (quiet since
    /// `quiet`).
    fn paused(&self, quiet: Instant) -> Paused {
        let st = |d: &Dir<'_, C>| DirState {
            eof: d.eof,
            shut: d.shut,
            bytes: d.bytes,
            fills: d.fills,
            drains: d.drains,
        };
        Paused {
            up: st(&self.up),
            down: st(&self.down),
            dumped: self.dumped,
            dumped_ops: self.dumped_ops,
            generation: self.generation,
            quiet_since: quiet,
        }
    }

    /// The senders paused: filters let out what they hold.
    #[inline]
    fn flush(&mut self) {
        self.up.ch.flush();
        self.down.ch.flush();
        self.up.can_write = true;
        self.down.can_write = true;
    }

    /// The code of an idle timeout: 3proxy's for bytes left unsent, if any.
    fn idle_res(&self) -> Res {
        if self.up.ch.pending() || self.down.ch.pending() {
            Res::UNSENT
        } else {
            Res::IDLE
        }
    }
}

/// The next wait's timeout for poll(), and whether `opts.deadline` is
/// what ends it: the idle time left since `quiet` (shorter while a filter
/// holds bytes), at most until the deadline.
#[inline]
fn wait_ms(opts: &RelayOpts, idle_ms: i32, quiet: Instant, holding: bool) -> (i32, bool) {
    // The idle time left: all of it, unless the session was parked.
    let left = idle_ms.min(millis(opts.idle.saturating_sub(quiet.elapsed())));
    let ms = if holding {
        left.min(crate::filter::FLUSH_AFTER.as_millis() as i32)
    } else {
        left
    };
    match opts.deadline {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let left = left.as_millis().min(i32::MAX as u128) as i32 + 1;
            (ms.min(left), left <= ms)
        }
        None => (ms, false),
    }
}

/// Milliseconds for poll(), at most i32::MAX.
fn millis(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}

/// Whether the relay may park now: nothing in flight either way (no byte
/// in a buffer or a pipe, no record a TLS session holds), no limit's wait
/// or quota, and a socket to wait on.
fn parkable<C: Channel>(up: &Dir<'_, C>, down: &Dir<'_, C>) -> bool {
    let quiet = |d: &Dir<'_, C>| !d.pending() && d.throttled.is_none() && !d.quota_hit;
    quiet(up) && quiet(down) && (up.wants_read() || down.wants_read())
}

/// Block until a wanted event or the idle timeout. Ok(false) on timeout.
fn wait<C: Channel>(up: &mut Dir<'_, C>, down: &mut Dir<'_, C>, idle_ms: i32) -> io::Result<bool> {
    let mut cli_ev = PollFlags::empty();
    let mut srv_ev = PollFlags::empty();
    if up.wants_read() {
        cli_ev |= PollFlags::POLLIN;
    }
    if down.wants_write() {
        cli_ev |= PollFlags::POLLOUT;
    }
    if down.wants_read() {
        srv_ev |= PollFlags::POLLIN;
    }
    if up.wants_write() {
        srv_ev |= PollFlags::POLLOUT;
    }
    // A direction waiting out its bandwidth limit wakes the poll in time.
    let mut idle_ms = idle_ms;
    let mut throttled = false;
    if let Some(t) = [up.throttled, down.throttled].into_iter().flatten().min() {
        let ms = t.saturating_duration_since(Instant::now()).as_millis() as i32 + 1;
        if ms < idle_ms {
            idle_ms = ms;
            throttled = true;
        }
    }
    // Only sockets with something to wait for are polled: POLLHUP and
    // POLLERR are reported even for no events and would make this spin.
    // A fixed pair, not a Vec: no allocation per wait.
    let mut pair = [
        PollFd::new(up.src.as_fd(), cli_ev),
        PollFd::new(down.src.as_fd(), srv_ev),
    ];
    let fds: &mut [PollFd<'_>] = match (cli_ev.is_empty(), srv_ev.is_empty()) {
        (false, false) => &mut pair[..],
        (false, true) => &mut pair[..1],
        (true, false) => &mut pair[1..],
        (true, true) => &mut [],
    };
    if fds.is_empty() && throttled {
        std::thread::sleep(Duration::from_millis(idle_ms as u64));
        return Ok(true);
    }
    if fds.is_empty() {
        // Nothing can ever move again (both ends done reading, nothing
        // pending): treat as the end of the session.
        up.shut = true;
        down.shut = true;
        return Ok(true);
    }
    let timeout = PollTimeout::try_from(idle_ms).unwrap_or(PollTimeout::MAX);
    let n = loop {
        match poll(fds, timeout) {
            Ok(n) => break n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        // A limit's wait is over: not an idle timeout.
        return Ok(throttled);
    }
    let ready_in = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    let ready_out = PollFlags::POLLOUT | PollFlags::POLLHUP | PollFlags::POLLERR;
    let mut i = 0;
    if !cli_ev.is_empty() {
        let r = fds[i].revents().unwrap_or(PollFlags::empty());
        up.can_read |= r.intersects(ready_in);
        down.can_write |= r.intersects(ready_out);
        i += 1;
    }
    if !srv_ev.is_empty() {
        let r = fds[i].revents().unwrap_or(PollFlags::empty());
        down.can_read |= r.intersects(ready_in);
        up.can_write |= r.intersects(ready_out);
    }
    Ok(true)
}

/// Map an IO error to 3proxy's codes: 95 client side, 96 server side, 90
/// for a pipe error in splice mode. (A reset while reading is no error:
/// it ends that side, see `Dir::step`.)
fn error_res<C: Channel>(side: Side, e: Errno, _up: &Dir<'_, C>, _down: &Dir<'_, C>) -> Res {
    match (side, e) {
        (_, Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM | Errno::EINVAL) => Res::SPLICE,
        (Side::Client, _) => Res::CLIENT_ERR,
        (Side::Server, _) => Res::SERVER_ERR,
    }
}
