//! The door of a full service (`reclaim`, issue 34).
//!
//! At `maxconn` a new client used to wait in the listener's backlog, in
//! arrival order, behind a crowd that holds the slots and reconnects as
//! fast as it is closed; and once the backlog was full the kernel dropped
//! its SYNs, which cost it a second of retransmission each (1 s, 3 s: a
//! measured p99 of 3 s for an ordinary client, bench/RESULTS.md "Under
//! pressure"). So while the service is full its acceptor takes waiting
//! clients in, without a thread or a slot, up to a bound ([`Door::cap`]),
//! and keeps the backlog empty. Each slot that frees, or that a reclaim
//! frees, goes to the held client that has sent the most bytes (an
//! ordinary client sends its whole request or greeting at once; a slow
//! one has a byte or two, a silent one none), the newest among equals
//! (for the protocols where the server speaks first, nobody has sent
//! anything, and the one that came last is the least likely to be one of
//! a crowd that has waited). A held client below `minrate` after its
//! grace is closed (code 82); when the door is full, the held client
//! worth least (fewest bytes, then the oldest) that has waited at least
//! `RECLAIM_AGE` is closed (81) for the next. Each close writes one
//! record. A held client costs a descriptor and its socket's buffers.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant, SystemTime};

use crate::net::{Listener, Stream};
use crate::res::Res;
use crate::service::Service;

/// A held client is not closed for another before this: a client that
/// has just come in has had no time to send (as `live::pressure`'s).
const HELD_AGE: Duration = Duration::from_millis(100);

/// How often the held clients are judged against `minrate`.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// At most this many clients are taken in per call, so that the
/// acceptor gets back to handing out slots.
const FILL_BATCH: usize = 256;

/// A client taken in while the service is full.
struct Held {
    stream: Stream,
    peer: Option<SocketAddr>,
    since: Instant,
    start: SystemTime,
}

impl Held {
    fn pending(&self) -> usize {
        crate::sys::sockopt::pending_bytes(self.stream.as_fd())
    }
}

/// The clients a full service holds, oldest first.
#[derive(Default)]
pub struct Door {
    held: Vec<Held>,
    swept: Option<Instant>,
    /// Held clients closed since the acceptor last asked: for the door
    /// being full, and below minrate.
    pub pushed_out: u64,
    pub too_slow: u64,
}

impl Door {
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// How many clients a service holds at most: four times `maxconn`,
    /// at least 256, and never more than a quarter of the process's
    /// descriptor limit, so that the sessions being served still get the
    /// descriptors of their origins (with a limit of 1,024, 256).
    pub fn cap(svc: &Service) -> usize {
        let want = (svc.maxconn as usize).saturating_mul(4).max(256);
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(u64::MAX, |(soft, _)| soft);
        want.min(usize::try_from(nofile / 4).unwrap_or(usize::MAX))
    }

    /// Take in the clients waiting in the backlog, up to the bound; at
    /// the bound, close the held client worth least (if one has waited
    /// long enough) for each one more that waits. Stops at the first
    /// accept() that fails (no client, or out of descriptors: the
    /// acceptor's own accept meets and handles that).
    pub fn fill(&mut self, svc: &Service, listener: &Listener) {
        let cap = Door::cap(svc);
        for _ in 0..FILL_BATCH {
            if self.held.len() >= cap && (!client_waiting(listener) || !self.push_out_one(svc)) {
                return;
            }
            match listener.accept() {
                Ok((stream, peer)) => self.held.push(Held {
                    stream,
                    peer,
                    since: Instant::now(),
                    start: SystemTime::now(),
                }),
                Err(_) => return,
            }
        }
    }

    /// Close the held client worth least that has waited HELD_AGE:
    /// fewest bytes, then the oldest. False when none has waited so long.
    fn push_out_one(&mut self, svc: &Service) -> bool {
        let now = Instant::now();
        let worst = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| now.duration_since(h.since) >= HELD_AGE)
            .min_by_key(|(i, h)| (h.pending(), *i))
            .map(|(i, _)| i);
        let Some(i) = worst else { return false };
        let h = self.held.remove(i);
        record(svc, &h, Res::RECLAIMED);
        self.pushed_out += 1;
        true
    }

    /// Close the held clients that have sent less than `minrate` since
    /// they came, once its grace is over (at most every SWEEP_EVERY).
    pub fn sweep(&mut self, svc: &Service) {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|t| now.duration_since(t) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        let g = svc.guard;
        if g.rate == 0 {
            return;
        }
        let grace = Duration::from_millis(u64::from(g.grace_ms));
        let mut i = 0;
        while i < self.held.len() {
            let age = now.duration_since(self.held[i].since);
            let least = age.as_secs_f64() * f64::from(g.rate);
            if age >= grace && (self.held[i].pending() as f64) < least {
                let h = self.held.remove(i);
                record(svc, &h, Res::TOO_SLOW);
                self.too_slow += 1;
            } else {
                i += 1;
            }
        }
    }

    /// The held client a slot goes to, the one with the most bytes
    /// waiting, the newest among equals: its place and those bytes.
    pub fn best(&self) -> Option<(usize, usize)> {
        self.held
            .iter()
            .enumerate()
            .map(|(i, h)| (h.pending(), i))
            .max()
            .map(|(n, i)| (i, n))
    }

    /// Take the held client at `i` (from [`Door::best`]) out of the door.
    pub fn take(&mut self, i: usize) -> (Stream, Option<SocketAddr>) {
        let h = self.held.remove(i);
        (h.stream, h.peer)
    }
}

/// The one record of a held client closed with `res`: it never had a
/// session, so only what the door knows (the client, the service, when).
fn record(svc: &Service, h: &Held, res: Res) {
    let Some(sink) = &svc.log else { return };
    let rec = crate::logformat::LogRecord {
        listen_port: svc.port(),
        res: res.0,
        client: h.peer,
        start: h.start,
        ..crate::logformat::LogRecord::blank(svc.def.log_name, SystemTime::now())
    };
    crate::log::emit(sink, &svc.logformat, &rec);
}

/// A client waits in the listener's backlog.
pub fn client_waiting(listener: &Listener) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

/// Wait up to `wait` for a client in the listener's backlog.
pub fn wait_for_client_within(listener: &Listener, wait: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(ms));
}
