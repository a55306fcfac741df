//! The datagram relay shared by `udppm` and SOCKS UDP ASSOCIATE.
//!
//! A UDP association moves datagrams two ways: from its client toward a
//! destination (out) and back (in). What differs between the services is
//! where a client's datagrams wait (udppm: a queue its service thread
//! fills; SOCKS: the association's own socket), how a datagram is wrapped
//! (SOCKS puts an RFC 1928 header in front; a socks5 parent's relay wants
//! one too) and which connections end the association when they close.
//! That part is an [`Assoc`]. What is the same is here: the limits
//! (`bandlimin`/`bandlimout` hold a direction back, a quota ends the
//! association with code 10), the reload check (`force`), the idle
//! timeout, batching so that neither direction starves the other, and the
//! one poll() the thread waits in, always with a timeout.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, MsgFlags};

use crate::access::Recheck;
use crate::limit::{Permit, SessionLimits};
use crate::res::Res;

/// Largest datagram relayed.
pub const DGRAM_MAX: usize = 65536;

/// Room kept in front of a destination's datagram for a SOCKS header
/// (an IPv6 one is the longest: 22 bytes).
pub const HEADROOM: usize = 22;

/// Most datagrams moved one way before the other way is looked at.
const BATCH: usize = 64;

/// What moving one datagram did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A datagram of the association was taken: `n` bytes of payload were
    /// relayed (0 when it was dropped, e.g. refused by the ACL). It counts
    /// as activity.
    Moved(usize),
    /// A datagram that is not the association's (another sender): ignored.
    Stray,
    /// Nothing is waiting.
    Empty,
    /// The association ends with this code.
    End(Res),
}

/// One association's service-specific half.
pub trait Assoc {
    /// Where the client's datagrams wait.
    fn client_fd(&self) -> BorrowedFd<'_>;
    /// Where the destination's datagrams wait.
    fn dest_fd(&self) -> BorrowedFd<'_>;
    /// A connection whose closing (or any byte on it) ends the
    /// association, `i` = 0 or 1; None when there is none.
    fn control_fd(&self, i: usize) -> Option<BorrowedFd<'_>>;
    /// The code the association ends with when control connection `i`
    /// becomes readable.
    fn controlled(&mut self, i: usize) -> Res;
    /// Take one client datagram and send it on.
    fn outbound(&mut self, buf: &mut [u8]) -> Step;
    /// Take one destination datagram into `buf[HEADROOM..]` and send it to
    /// the client (`buf[..HEADROOM]` is room for a header).
    fn inbound(&mut self, buf: &mut [u8]) -> Step;
    /// The association passed the reload check of `generation`.
    fn rechecked(&mut self, _generation: u64) {}
}

/// How an association is relayed.
pub struct Opts<'a> {
    /// The association ends after this long without activity.
    pub idle: Duration,
    /// A client's datagram is activity too (SOCKS); otherwise only the
    /// destination's replies are (udppm, 3proxy's udppm.c).
    pub idle_on_out: bool,
    /// End after the first reply (udppm `-s`).
    pub single: bool,
    pub limits: Option<&'a SessionLimits>,
    /// Checked again after a reload (`force`).
    pub recheck: Option<&'a Recheck>,
    /// The reload generation the association was last checked against.
    pub since: u64,
}

/// Payload bytes relayed each way, and the datagrams that carried them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Client to destination (%O).
    pub out: u64,
    /// Destination to client (%I).
    pub inb: u64,
    /// Datagrams with a payload relayed to the destination (TrafficPlugin's
    /// writes) and from it (its reads).
    pub writes: u64,
    pub reads: u64,
}

/// What the limits allow in one direction now.
fn permit(limits: Option<&SessionLimits>, out: bool, now: Instant) -> Permit {
    limits.map_or(Permit::Go(usize::MAX), |l| l.permit(out, now))
}

/// Whether the limits let direction `out` take its next datagram now:
/// Ok(false) when a limit holds it back (until `wait`, now set), Err when
/// its quota is used up.
#[inline]
fn admit(
    limits: Option<&SessionLimits>,
    out: bool,
    now: Instant,
    wait: &mut Option<Instant>,
) -> Result<bool, Res> {
    match permit(limits, out, now) {
        Permit::Go(_) => Ok(true),
        Permit::Wait(t) => {
            *wait = Some(t);
            Ok(false)
        }
        Permit::Stop => Err(Res::QUOTA),
    }
}

/// The payload bytes of a datagram a step moved; None when it took none:
/// a stray datagram, or nothing waiting (then `ready` is cleared). Err
/// when the association ends.
#[inline]
fn taken(step: Step, ready: &mut bool) -> Result<Option<usize>, Res> {
    match step {
        Step::Moved(len) => Ok(Some(len)),
        Step::Stray => Ok(None),
        Step::Empty => {
            *ready = false;
            Ok(None)
        }
        Step::End(res) => Err(res),
    }
}

/// What the relay loop keeps between its passes.
struct State {
    /// The association is idle from then on, unless something moves.
    deadline: Instant,
    /// The reload generation last checked against.
    generation: u64,
    /// The limits hold the destination's datagrams back (`bandlimin`, an
    /// inbound quota).
    shaped_in: bool,
    // Until when a limit holds each direction back.
    out_wait: Option<Instant>,
    in_wait: Option<Instant>,
    // Either side may have a datagram (or an error) to read.
    cli_ready: bool,
    dst_ready: bool,
}

/// Relay `a` until it ends; returns its result code. `n` has the bytes.
pub fn relay(a: &mut dyn Assoc, o: &Opts<'_>, n: &mut Counts) -> Res {
    let shaped_in = o.limits.is_some_and(|l| l.shapes_dir(false));
    let mut buf = vec![0u8; HEADROOM + DGRAM_MAX];
    let mut st = State {
        deadline: Instant::now() + o.idle,
        generation: o.since,
        shaped_in,
        out_wait: None,
        in_wait: None,
        cli_ready: true,
        dst_ready: true,
    };
    loop {
        if let Err(res) = st.recheck(a, o) {
            return res;
        }
        let now = Instant::now();
        // A full batch either way: the other way has had its turn, go on
        // at once.
        let busy_out = match st.client_batch(a, o, n, &mut buf, now) {
            Ok(busy) => busy,
            Err(res) => return res,
        };
        let busy_in = match st.dest_batch(a, o, n, &mut buf, now) {
            Ok(busy) => busy,
            Err(res) => return res,
        };
        if busy_out || busy_in {
            continue;
        }
        if let Err(res) = st.wait(a) {
            return res;
        }
    }
}

impl State {
    /// `force`: after a reload, check the association again; Err with the
    /// code it is then refused with.
    #[inline]
    fn recheck(&mut self, a: &mut dyn Assoc, o: &Opts<'_>) -> Result<(), Res> {
        if let Some(again) = o.recheck {
            let g = crate::running::generation();
            if g != self.generation {
                self.generation = g;
                crate::running::recheck(again)?;
                a.rechecked(g);
            }
        }
        Ok(())
    }

    /// The client's datagrams: relay them until none waits or a limit
    /// holds them back, a batch at most. Ok(true) when the batch is full;
    /// Err with the code the association ends with.
    fn client_batch(
        &mut self,
        a: &mut dyn Assoc,
        o: &Opts<'_>,
        n: &mut Counts,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<bool, Res> {
        self.out_wait = self.out_wait.filter(|t| *t > now);
        let mut moved = 0;
        while self.cli_ready && self.out_wait.is_none() {
            if moved == BATCH {
                return Ok(true);
            }
            if !admit(o.limits, true, now, &mut self.out_wait)? {
                break;
            }
            // None: a stray datagram (on to the next), or none left (the
            // loop ends, the client is no longer ready).
            let Some(len) = taken(a.outbound(buf), &mut self.cli_ready)? else {
                continue;
            };
            moved += 1;
            if o.idle_on_out {
                self.deadline = Instant::now() + o.idle;
            }
            n.out += len as u64;
            n.writes += u64::from(len > 0);
            if let Some(l) = o.limits {
                l.used(true, len, now);
            }
            // The datagram that uses up the quota is the last one.
            if permit(o.limits, true, now) == Permit::Stop {
                return Err(Res::QUOTA);
            }
        }
        Ok(false)
    }

    /// The destination's datagrams: relay them until none waits or a
    /// limit holds them back, a batch at most. Ok(true) when the batch is
    /// full; Err with the code the association ends with.
    fn dest_batch(
        &mut self,
        a: &mut dyn Assoc,
        o: &Opts<'_>,
        n: &mut Counts,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<bool, Res> {
        self.in_wait = self.in_wait.filter(|t| *t > now);
        let mut moved = 0;
        while self.dst_ready && self.in_wait.is_none() {
            if moved == BATCH {
                return Ok(true);
            }
            if self.shaped_in {
                // Ask the limits only for a datagram that is there.
                let mut probe = [0u8; 1];
                let fd = a.dest_fd().as_raw_fd();
                match recv(fd, &mut probe, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
                    Ok(_) => {}
                    Err(Errno::EAGAIN) => {
                        self.dst_ready = false;
                        break;
                    }
                    // ECONNREFUSED: the port is closed (ICMP); the client
                    // may try again, the association stays until idle.
                    Err(Errno::EINTR | Errno::ECONNREFUSED) => continue,
                    Err(_) => return Err(Res::SERVER_ERR),
                }
                if !admit(o.limits, false, now, &mut self.in_wait)? {
                    break;
                }
            }
            // None: a stray datagram (on to the next), or none left (the
            // loop ends, the destination is no longer ready).
            let Some(len) = taken(a.inbound(buf), &mut self.dst_ready)? else {
                continue;
            };
            moved += 1;
            self.deadline = Instant::now() + o.idle;
            n.inb += len as u64;
            n.reads += u64::from(len > 0);
            if let Some(l) = o.limits {
                l.used(false, len, now);
            }
            if o.single {
                return Err(Res::OK);
            }
            if permit(o.limits, false, now) == Permit::Stop {
                return Err(Res::QUOTA);
            }
        }
        Ok(false)
    }

    /// When the next wait ends: at the idle deadline, or sooner when a
    /// limit's wait is over.
    fn poll_timeout(&self, now: Instant) -> PollTimeout {
        let wake = [
            self.in_wait.is_none().then_some(self.deadline),
            self.out_wait,
            self.in_wait,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.deadline);
        // Rounded up: a wait shorter than a millisecond is not a busy loop.
        let ms = wake
            .saturating_duration_since(now)
            .as_nanos()
            .div_ceil(1_000_000);
        PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
    }

    /// Nothing can move: wait in one poll() for a datagram, a control
    /// connection or the end of a limit's wait, until the idle deadline.
    /// Err with the code the association ends with (idle, a poll() error,
    /// a control connection's).
    fn wait(&mut self, a: &mut dyn Assoc) -> Result<(), Res> {
        // A reply held back by a limit is waiting: the association is not
        // idle.
        let now = Instant::now();
        if self.in_wait.is_none() && now >= self.deadline {
            return Err(Res::IDLE);
        }
        let timeout = self.poll_timeout(now);
        // Only descriptors with something to wait for are polled: POLLERR
        // and POLLHUP come even for no events and would make this spin.
        let want_cli = self.out_wait.is_none() && !self.cli_ready;
        let want_dst = self.in_wait.is_none() && !self.dst_ready;
        let mut fds: [Option<PollFd<'_>>; 4] = [None, None, None, None];
        let (cli_fd, dst_fd) = (a.client_fd(), a.dest_fd());
        if want_cli {
            fds[0] = Some(PollFd::new(cli_fd, PollFlags::POLLIN));
        }
        if want_dst {
            fds[1] = Some(PollFd::new(dst_fd, PollFlags::POLLIN));
        }
        for i in 0..2 {
            fds[2 + i] = a.control_fd(i).map(|fd| PollFd::new(fd, PollFlags::POLLIN));
        }
        // Which slot each polled descriptor came from.
        let mut slots = [0usize; 4];
        let mut list: Vec<PollFd<'_>> = Vec::with_capacity(4);
        for (i, f) in fds.into_iter().enumerate() {
            if let Some(f) = f {
                slots[list.len()] = i;
                list.push(f);
            }
        }
        match poll(&mut list, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(()),
            Err(_) => return Err(Res::POLL),
        }
        let mut ended = None;
        for (k, f) in list.iter().enumerate() {
            if f.revents().is_none_or(|r| r.is_empty()) {
                continue;
            }
            match slots[k] {
                0 => self.cli_ready = true,
                1 => self.dst_ready = true,
                i => ended = ended.or(Some(i - 2)),
            }
        }
        drop(list);
        if let Some(i) = ended {
            return Err(a.controlled(i));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::{UnixDatagram, UnixStream};

    /// An association over local sockets: the client's datagrams arrive
    /// on `cli`, go out on `dst`; replies come in on `dst`, go to `cli`.
    struct Pair {
        cli: UnixDatagram,
        dst: UnixDatagram,
        ctl: Option<UnixStream>,
    }

    impl Assoc for Pair {
        fn client_fd(&self) -> BorrowedFd<'_> {
            self.cli.as_fd()
        }
        fn dest_fd(&self) -> BorrowedFd<'_> {
            self.dst.as_fd()
        }
        fn control_fd(&self, i: usize) -> Option<BorrowedFd<'_>> {
            self.ctl.as_ref().filter(|_| i == 1).map(|s| s.as_fd())
        }
        fn controlled(&mut self, i: usize) -> Res {
            assert_eq!(i, 1);
            Res::PARENT_NO_UDP
        }
        fn outbound(&mut self, buf: &mut [u8]) -> Step {
            match self.cli.recv(buf) {
                Ok(n) if buf[..n].starts_with(b"stray") => Step::Stray,
                Ok(n) => Step::Moved(self.dst.send(&buf[..n]).map_or(0, |_| n)),
                Err(_) => Step::Empty,
            }
        }
        fn inbound(&mut self, buf: &mut [u8]) -> Step {
            match self.dst.recv(&mut buf[HEADROOM..]) {
                Ok(n) => Step::Moved(self.cli.send(&buf[HEADROOM..HEADROOM + n]).map_or(0, |_| n)),
                Err(_) => Step::Empty,
            }
        }
    }

    /// The association, the client's socket and the destination's.
    fn setup(ctl: Option<UnixStream>) -> (Pair, UnixDatagram, UnixDatagram) {
        let (cli, client) = UnixDatagram::pair().unwrap();
        let (dst, server) = UnixDatagram::pair().unwrap();
        cli.set_nonblocking(true).unwrap();
        dst.set_nonblocking(true).unwrap();
        (Pair { cli, dst, ctl }, client, server)
    }

    fn opts(idle_ms: u64, idle_on_out: bool, single: bool) -> Opts<'static> {
        Opts {
            idle: Duration::from_millis(idle_ms),
            idle_on_out,
            single,
            limits: None,
            recheck: None,
            since: 0,
        }
    }

    #[test]
    fn relays_both_ways_until_the_control_connection_speaks() {
        let (ctl_near, mut ctl_far) = UnixStream::pair().unwrap();
        let (mut a, client, server) = setup(Some(ctl_near));
        let t = std::thread::spawn(move || {
            let mut n = Counts::default();
            let res = relay(&mut a, &opts(10_000, true, false), &mut n);
            (res, n)
        });
        let mut buf = [0u8; 64];
        for msg in [&b"one"[..], b"stray, not counted", b"three"] {
            client.send(msg).unwrap();
            if msg.starts_with(b"stray") {
                continue;
            }
            let n = server.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], msg);
            server.send(b"reply!").unwrap();
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"reply!");
        }
        ctl_far.write_all(b"x").unwrap();
        let (res, n) = t.join().unwrap();
        assert_eq!(res, Res::PARENT_NO_UDP);
        assert_eq!((n.out, n.inb), (8, 12));
        let mut rest = Vec::new();
        let _ = ctl_far.read_to_end(&mut rest);
    }

    #[test]
    fn ends_idle_when_only_the_client_speaks_unless_that_counts() {
        // udppm: only replies keep an association; SOCKS: both directions.
        for (on_out, ends_early) in [(false, true), (true, false)] {
            let (mut a, client, _server) = setup(None);
            let t = std::thread::spawn(move || {
                let start = Instant::now();
                let res = relay(&mut a, &opts(300, on_out, false), &mut Counts::default());
                (res, start.elapsed())
            });
            // A datagram every 100 ms for 600 ms: past the idle time.
            for _ in 0..6 {
                let _ = client.send(b"tick");
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(client);
            let (res, took) = t.join().unwrap();
            assert_eq!(res, Res::IDLE, "idle_on_out {on_out}");
            let early = took < Duration::from_millis(550);
            assert_eq!(early, ends_early, "idle_on_out {on_out}: {took:?}");
        }
    }

    #[test]
    fn single_ends_with_the_first_reply() {
        let (mut a, client, server) = setup(None);
        let t = std::thread::spawn(move || {
            let mut n = Counts::default();
            (relay(&mut a, &opts(10_000, false, true), &mut n), n)
        });
        client.send(b"question").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"question");
        server.send(b"answer").unwrap();
        let (res, n) = t.join().unwrap();
        assert_eq!(res, Res::OK);
        assert_eq!((n.out, n.inb), (8, 6));
    }
}
