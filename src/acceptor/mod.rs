//! One acceptor thread per TCP service (3proxy's `proxymain.c` main loop).
//!
//! The loop: wait while the service has `maxconn` live clients (new clients
//! then queue in the kernel's backlog, as with 3proxy), accept one, and
//! hand it to a client thread. Client threads are kept: one that has
//! finished its client parks on a seat of the service's idle stack, and the
//! acceptor gives the next client to the thread parked last (its stack and
//! caches are the warmest), which costs one wake-up; when none is parked, a
//! new thread is started with the service's small stack. A thread parked
//! for `IDLE_THREAD` leaves the stack and exits: with a stack, the threads
//! left idle by a burst are the ones at the bottom, and they do time out.
//! Beyond `SPARE_THREADS` idle threads, a thread exits after
//! `IDLE_RELEASE` already, so that the threads of a burst whose clients
//! went to the parking lot do not stay for 15 s. Still one client per
//! thread at a time.
//!
//! The acceptor does nothing per client that the kernel can do once for
//! all: accept4() gives the socket CLOEXEC, and the listener's TCP options
//! (TCP_NODELAY, quick ACKs off) and, for SOCKS, its receive timeout are
//! inherited by each accepted socket.
//!
//! The listener is non-blocking: the acceptor accepts until no client
//! waits, then waits for one with poll(). When a burst of clients queues
//! in the backlog, the acceptor alone drains it too slowly: with thousands
//! of client threads runnable on one CPU, the scheduler gives it one
//! thread's share, and every client it hands over is a thread that runs
//! before it gets the CPU again (issue 19: 2,000 kept-alive clients waited
//! up to seconds in the backlog, bench/RESULTS.md). So when the acceptor
//! has found a client waiting without having had to wait for it (the
//! backlog is not empty: `Help::behind`), each thread given a new client
//! first accepts up to two more clients and hands them on, in the
//! acceptor's place, before it serves its own. (The acceptor learns that
//! the backlog is not empty by accepting the next client before it hands
//! over the one it has. With one client at a time that costs a poll() and
//! a failed accept() per client more than a blocking accept() did.) The
//! threads that take part double with each round, so a backlog of N
//! clients drains in about log2(N) rounds of the run queue instead of N.
//! With one client at a time nobody helps.
//!
//! Helping must stop when the CPU, not the acceptor, is what is behind.
//! Under a load near what the CPU can serve (3,500 new CONNECT tunnels a
//! second, bench/RESULTS.md connect-rate-high), a hiccup leaves clients in
//! the backlog; helping then hands them all to threads at once, hundreds
//! of threads share the CPU, each connection costs more (their stacks and
//! the kernel's per-task data no longer stay in the caches: 420 µs a
//! connection instead of 240), the service falls further behind and never
//! catches up. So a thread helps only while fewer than `HELP_PENDING` jobs
//! handed to threads have not yet been started by them (`IdleThreads::
//! pending`): a job waiting for its thread to run means the run queue is
//! long, and the clients are better left in the backlog, which costs
//! nothing, until the threads that have clients get through them.
//!
//! Out of descriptors (EMFILE, ENFILE), accept() fails while clients wait
//! in the backlog, and they would wait there until their own timeout. The
//! acceptor keeps one spare descriptor (a duplicate of the listener): when
//! a client is waiting and accept() fails for want of a descriptor, the
//! spare is closed, the client accepted and closed at once (it sees the
//! connection closed before any answer), and the spare taken again. With
//! no client waiting, it waits for one (or 100 ms) without spinning.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

mod door;

use crate::client::{Accepted, Client, Serve, Slot, Tail};
use crate::net::Listener;
use crate::running::Running;
use crate::service::Service;
use door::Door;

/// How long a finished client thread waits for the next client before it
/// exits and frees its stack.
const IDLE_THREAD: Duration = Duration::from_secs(15);

/// How long a client thread waits for its next client before it gives
/// back the stack pages its last client dirtied (`sys::mem`). Long
/// enough that a thread of a busy service, which waits microseconds
/// between clients, never does it: the madvise and the page faults after
/// it are paid only by a thread that has really gone idle.
const IDLE_RELEASE: Duration = Duration::from_millis(250);

/// How many idle client threads a service keeps for IDLE_THREAD; the
/// others exit once idle for IDLE_RELEASE. After a burst (thousands of
/// clients that connect at once, are served, and park in the parking
/// lot), the threads that served them would otherwise wait 15 s with
/// their top stack pages, TLS and kernel stack (about 8 KB of RSS and
/// 16 KB outside it each, and a task against the task limit); a service
/// whose load is steady reuses its threads within microseconds and never
/// reaches IDLE_RELEASE. Starting a thread costs tens of microseconds,
/// so a burst that comes back more often than every 250 ms keeps its
/// threads anyway.
const SPARE_THREADS: usize = 32;

/// A thread helps the acceptor only while fewer jobs than this wait for
/// their thread to start them (see the module doc). Large enough that a
/// burst of clients drains in a few rounds of the run queue, small enough
/// that the threads started ahead of the CPU stay few.
const HELP_PENDING: usize = 16;

/// The acceptor thread's body: runs until the service is stopped (by a
/// reload that drops it, or at exit), then closes the listener.
pub fn run(r: Arc<Running>, listener: Listener, serve: Serve) {
    let first = r.current();
    if !first.opts.silent {
        svc_record(&first, "Accepting connections");
    }
    drop(first);
    let local = listener.local_addr().filter(|a| !a.ip().is_unspecified());
    let listener = Arc::new(listener);
    // Without a non-blocking listener (never seen) the acceptor blocks in
    // accept() and nobody helps.
    let help = listener.set_nonblocking(true).is_ok().then(|| Help {
        r: r.clone(),
        listener: Arc::downgrade(&listener),
        local,
        behind: AtomicBool::new(false),
        rcvtimeo: Mutex::new(None),
    });
    let idle = Arc::new(IdleThreads::new(serve, help));
    let mut last_warn = None;
    let mut last_err: Option<Instant> = None;
    let mut spare = Spare::take(&listener);
    let mut reclaim = Reclaim::default();
    let mut door = Door::default();
    crate::live::pressure::start_sweeper();
    // The receive timeout set on the listener, which each accepted socket
    // inherits (see `first_read_timeout`).
    let mut rcvtimeo = None;
    // A client accepted ahead of the one being handed over.
    let mut ahead: Option<(crate::net::Stream, Option<SocketAddr>, Slot)> = None;
    'accept: while !r.stopped() {
        // The settings of the moment: a reload may have swapped them.
        let svc = r.current();
        let want = first_read_timeout(&svc);
        if want != rcvtimeo {
            rcvtimeo = set_rcvtimeo(&listener, want);
            idle.set_rcvtimeo(rcvtimeo);
        }
        let (stream, peer, slot) = match ahead.take() {
            Some(x) => x,
            None => 'next: {
                // While clients are held at the door, slots go to them.
                let free = if door.is_empty() {
                    Slot::try_take(&svc)
                } else {
                    None
                };
                let slot = match free {
                    Some(s) => s,
                    None if svc.reclaim || !door.is_empty() => {
                        // Threads must not accept past the door.
                        idle.set_behind(false);
                        match reclaim.through_door(&mut door, &svc, &listener, &mut last_warn) {
                            Some(x) => break 'next x,
                            None => continue 'accept,
                        }
                    }
                    None => match Slot::take(&svc, &mut last_warn) {
                        Some(s) => s,
                        None => continue 'accept,
                    },
                };
                match listener.accept() {
                    Ok((stream, peer)) => (stream, peer, slot),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        drop(slot);
                        idle.set_behind(false);
                        wait_for_client(&listener);
                        continue 'accept;
                    }
                    Err(e) => {
                        drop(slot);
                        if !r.stopped() {
                            accept_error(&svc, &e, &mut last_err);
                            if out_of_descriptors(&e) {
                                spare.refuse_one(&listener, &svc);
                            }
                        }
                        continue 'accept;
                    }
                }
            }
        };
        // Before handing this client over (the thread it wakes may keep
        // the CPU from us for a while), accept the next one if it waits:
        // then the backlog is not empty and the threads help.
        let mut wait = false;
        if let Some(slot) = door.is_empty().then(|| Slot::try_take(&svc)).flatten() {
            match listener.accept() {
                Ok((s, p)) => {
                    idle.set_behind(true);
                    ahead = Some((s, p, slot));
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        idle.set_behind(false);
                        wait = true;
                    }
                    // Another error comes back at the next accept(),
                    // which reports it.
                }
            }
        }
        // Served with the settings of now, not of when the wait began.
        let generation = crate::running::generation();
        let svc = r.current();
        svc.opts.oc.apply(std::os::fd::AsFd::as_fd(&stream));
        let job = Accepted {
            stream,
            svc: svc.clone(),
            generation,
            peer,
            local,
            slot,
            read_timeout: rcvtimeo,
        };
        idle.dispatch(&svc, Job::New(job));
        if wait {
            wait_for_client(&listener);
        }
    }
    // A client accepted ahead or held at the door when the service
    // stopped is closed.
    drop(ahead);
    drop(door);
    idle.close();
    let svc = r.current();
    if !svc.opts.silent {
        svc_record(&svc, "Exiting thread");
    }
}

/// How long the acceptor of a full service waits for a slot before it
/// looks again for a session to reclaim (a waiting head becomes one as
/// it ages: `live::pressure::RECLAIM_AGE`).
const RECLAIM_WAIT: Duration = Duration::from_millis(100);

/// How long the acceptor of a full service with clients at its door and
/// nothing to reclaim for them waits for a new client before it looks
/// again (a slot may have freed meanwhile).
const DOOR_WAIT: Duration = Duration::from_millis(20);

/// `reclaim`: a full service holds its new clients at its door
/// ([`door`]) and closes an idle or slow session for each
/// (`live::pressure::reclaim`), and says how many it closed at most
/// every 5 s.
#[derive(Default)]
struct Reclaim {
    /// Idle sessions and slow heads closed since the last warning.
    idle: u64,
    slow: u64,
    since: Option<Instant>,
}

impl Reclaim {
    /// The next client of a full service, or of one with clients held at
    /// its door, and its slot: the held client a slot goes to, with a slot
    /// that was free, that reclaiming a session freed, or that was freed
    /// while waiting for it (None when none came within RECLAIM_WAIT, or
    /// no client is held: then it has waited up to RECLAIM_WAIT for one).
    fn through_door(
        &mut self,
        door: &mut Door,
        svc: &Arc<Service>,
        listener: &Listener,
        last_warn: &mut Option<Instant>,
    ) -> Option<(crate::net::Stream, Option<SocketAddr>, Slot)> {
        door.fill(svc, listener);
        door.sweep(svc);
        self.report(svc, door);
        let Some((best, offer)) = door.best() else {
            door::wait_for_client_within(listener, RECLAIM_WAIT);
            return None;
        };
        let slot = match Slot::try_take(svc) {
            Some(s) => s,
            None => {
                let key = Arc::as_ptr(svc) as usize;
                let closed = svc
                    .reclaim
                    .then(|| crate::live::pressure::reclaim(key, Instant::now(), offer))
                    .flatten();
                match closed {
                    Some(crate::live::Phase::Idle) => self.idle += 1,
                    Some(_) => self.slow += 1,
                    None => {}
                }
                if closed.is_none() {
                    // Nothing to close for the clients held: what may
                    // change that is a new client (or a slot freed
                    // meanwhile); the door also keeps the backlog empty.
                    door::wait_for_client_within(listener, DOOR_WAIT);
                    Slot::try_take(svc)?
                } else {
                    Slot::take_within(svc, last_warn, RECLAIM_WAIT)?
                }
            }
        };
        let (stream, peer) = door.take(best);
        Some((stream, peer, slot))
    }

    fn report(&mut self, svc: &Service, door: &mut Door) {
        let due = self
            .since
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
        if !due {
            return;
        }
        let held = door.pushed_out + door.too_slow;
        if self.idle + self.slow + held > 0 {
            log::warn!(
                "{} on {}: at maxconn ({}): closed {} idle and {} slow clients for new ones, \
                 and {} of the new ones waiting (door full: {}, below minrate: {})",
                svc.def.name,
                svc.listen,
                svc.maxconn,
                self.idle,
                self.slow,
                held,
                door.pushed_out,
                door.too_slow
            );
        } else if !door.is_empty() {
            log::warn!(
                "{} on {}: at maxconn ({}): no idle or slow client to close, new ones wait",
                svc.def.name,
                svc.listen,
                svc.maxconn
            );
        }
        door.pushed_out = 0;
        door.too_slow = 0;
        *self = Reclaim {
            since: Some(Instant::now()),
            ..Reclaim::default()
        };
    }
}

/// The receive timeout a service's accepted sockets should have from the
/// start: its handler's first wait for the client. Linux copies the
/// listener's SO_RCVTIMEO into each socket accept() returns, so setting
/// it once on the listener saves a setsockopt() (and the non-blocking
/// recv() that tries to avoid it) on every client. Only SOCKS, whose
/// reader knows what it gets (`Client::cli_read_timeout`); not under
/// `-H` or TLS, whose first reads come before the handler's. (The
/// listener itself is non-blocking, so the timeout does not bound the
/// acceptor's own wait.)
fn first_read_timeout(svc: &Service) -> Option<Duration> {
    if svc.def.name != "socks" || svc.opts.proxy_header || svc.tls_server.is_some() {
        return None;
    }
    Some(svc.timeouts.get(crate::timeouts::Timeouts::BYTE_LONG)).filter(|d| !d.is_zero())
}

/// Set the listener's SO_RCVTIMEO (None: none); what it has after.
fn set_rcvtimeo(listener: &Listener, to: Option<Duration>) -> Option<Duration> {
    let Listener::Tcp(l) = listener else {
        return None;
    };
    let sock = socket2::SockRef::from(l);
    if sock.set_read_timeout(to).is_ok() {
        return to;
    }
    // Unknown: try to clear it, and claim nothing.
    let _ = sock.set_read_timeout(None);
    None
}

/// The body of a `-r` (connect-back) service's thread, in place of the
/// accept loop: within `maxconn`, dial the `-R` side, wait for its `C`,
/// and hand the connection to a client thread as if it had been accepted
/// (see `crate::connectback`). A failed dial is retried after a pause that
/// grows to a second, so a relay that is down is not hammered.
pub fn run_dialing(r: Arc<Running>, wake: crate::connectback::Wake, serve: Serve) {
    let first = r.current();
    let Some(to) = first.opts.connect_to else {
        return;
    };
    drop(first);
    let idle = Arc::new(IdleThreads::new(serve, None));
    let mut last_warn = None;
    let mut pause = Duration::from_millis(10);
    while !r.stopped() {
        let svc = r.current();
        let Some(slot) = Slot::take(&svc, &mut last_warn) else {
            continue;
        };
        match crate::connectback::dial(
            to,
            &wake,
            svc.opts.ns_out.as_deref(),
            &svc.opts.cb_client,
            svc.timeouts.get(crate::timeouts::Timeouts::CONNECTBACK),
        ) {
            Ok((stream, peer)) => {
                pause = Duration::from_millis(10);
                let generation = crate::running::generation();
                let svc = r.current();
                let job = Accepted {
                    stream,
                    svc: svc.clone(),
                    generation,
                    peer,
                    local: None,
                    slot,
                    read_timeout: None,
                };
                idle.dispatch(&svc, Job::New(job));
            }
            Err(crate::connectback::DialError::Stopped) => break,
            Err(crate::connectback::DialError::Failed(why)) => {
                drop(slot);
                log::debug!("{} -r{to}: {why}", svc.def.name);
                wake.sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
    idle.close();
    let svc = r.current();
    if !svc.opts.silent {
        svc_record(&svc, "Exiting thread");
    }
}

/// Work for a client thread.
enum Job {
    /// A client just accepted.
    New(Accepted),
    /// A session back from the parking lot (`park`), with the rest of it.
    Resume(Box<Client>, Box<dyn Tail>, crate::client::Resumed),
}

/// Where a parked client thread receives its next client.
struct Seat {
    job: Mutex<Option<Job>>,
    thread: Thread,
}

/// A client whose session went quiet, waiting in the parking lot with
/// the rest of its session; when it must go on, it goes back to a client
/// thread of its service's acceptor.
struct ParkedClient {
    client: Box<Client>,
    tail: Box<dyn Tail>,
    idle: Arc<IdleThreads>,
}

impl crate::park::Parked for ParkedClient {
    fn fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        self.tail.fds(&self.client.cli)
    }

    fn resume(self: Box<Self>, ready: bool) {
        let ParkedClient { client, tail, idle } = *self;
        let svc = client.svc().clone();
        let how = crate::client::Resumed {
            may_park: true,
            ready,
        };
        idle.dispatch(&svc, Job::Resume(client, tail, how));
    }
}

/// Wait until a client is in the backlog (or a second passes, or the
/// listener is shut down by a stop).
fn wait_for_client(listener: &crate::net::Listener) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(1000u16));
}

/// What a client thread needs to accept a client in the acceptor's place
/// (see the module doc).
struct Help {
    r: Arc<Running>,
    /// The acceptor's listener; gone once the acceptor has stopped (the
    /// acceptor holds the only strong reference, so the socket closes
    /// with it).
    listener: Weak<crate::net::Listener>,
    local: Option<SocketAddr>,
    /// The acceptor's last accept() found a client without waiting for
    /// one: more may be in the backlog.
    behind: AtomicBool,
    /// The receive timeout the listener has now (`first_read_timeout`),
    /// for the sockets a helping thread accepts. Changed by the acceptor
    /// only when a reload changes it.
    rcvtimeo: Mutex<Option<Duration>>,
}

/// The parked client threads of one service, the last parked on top.
struct IdleThreads {
    parked: Mutex<Stack>,
    serve: Serve,
    /// Jobs handed to a thread (woken or started) that it has not begun.
    pending: AtomicUsize,
    /// None for a connect-back service (no listener).
    help: Option<Help>,
}

struct Stack {
    seats: Vec<Arc<Seat>>,
    /// The acceptor has stopped: parked threads exit, none parks again.
    closed: bool,
}

impl IdleThreads {
    fn new(serve: Serve, help: Option<Help>) -> IdleThreads {
        IdleThreads {
            parked: Mutex::new(Stack {
                seats: Vec::new(),
                closed: false,
            }),
            serve,
            help,
            pending: AtomicUsize::new(0),
        }
    }

    /// The listener's receive timeout changed (see `Help::rcvtimeo`).
    fn set_rcvtimeo(&self, to: Option<Duration>) {
        if let Some(h) = &self.help {
            *h.rcvtimeo.lock().unwrap_or_else(|e| e.into_inner()) = to;
        }
    }

    fn set_behind(&self, on: bool) {
        if let Some(h) = &self.help {
            // Read first: the line is shared with every helping thread.
            if h.behind.load(Ordering::Relaxed) != on {
                h.behind.store(on, Ordering::Relaxed);
            }
        }
    }

    /// A thread given a new client while the backlog is not empty
    /// accepts one more client and hands it on, as the acceptor would
    /// (without its waiting and error handling: a failed accept is left to
    /// the acceptor, which meets the same condition and reports it).
    fn help_accept(self: &Arc<Self>) {
        // Two each: the threads that help double with each round.
        for _ in 0..2 {
            if !self.help_accept_one() {
                return;
            }
        }
    }

    /// One client accepted and handed on (true), or none (false).
    fn help_accept_one(self: &Arc<Self>) -> bool {
        let Some(h) = &self.help else { return false };
        if !h.behind.load(Ordering::Relaxed)
            || h.r.stopped()
            || self.pending.load(Ordering::Relaxed) >= HELP_PENDING
        {
            return false;
        }
        let Some(listener) = h.listener.upgrade() else {
            return false;
        };
        let svc = h.r.current();
        let Some(slot) = Slot::try_take(&svc) else {
            return false;
        };
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                if e.kind() == io::ErrorKind::WouldBlock {
                    self.set_behind(false);
                }
                return false;
            }
        };
        drop(listener);
        let generation = crate::running::generation();
        svc.opts.oc.apply(std::os::fd::AsFd::as_fd(&stream));
        let read_timeout = *h.rcvtimeo.lock().unwrap_or_else(|e| e.into_inner());
        let job = Accepted {
            stream,
            svc: svc.clone(),
            generation,
            peer,
            local: h.local,
            slot,
            read_timeout,
        };
        self.dispatch(&svc, Job::New(job));
        true
    }

    fn stack(&self) -> std::sync::MutexGuard<'_, Stack> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Give `job` to the thread parked last, or start a thread for it.
    fn dispatch(self: &Arc<Self>, svc: &Service, job: Job) {
        // Counted until the thread begins it (`client_thread`), or here
        // again if no thread can be started for it.
        self.pending.fetch_add(1, Ordering::Relaxed);
        let seat = self.stack().seats.pop();
        if let Some(seat) = seat {
            *seat.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
            seat.thread.unpark();
            return;
        }
        let idle = self.clone();
        // The job moves into the closure; if the spawn fails the closure is
        // dropped with it, which closes the client and frees its slot.
        // On a stack of its own that is given back when the thread ends
        // (sys::thread): a burst's threads leave no memory behind.
        let spawned = crate::sys::thread::spawn(
            &format!("{}:{}", svc.def.name, svc.port()),
            svc.stack_size,
            move || idle.client_thread(job),
        );
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            // At most one line a second: a flood of clients while threads
            // cannot start would otherwise be a line each.
            static LAST: Mutex<(Option<Instant>, u64)> = Mutex::new((None, 0));
            let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
            last.1 += 1;
            if last.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                log::error!(
                    "{} on {}: cannot start a client thread: {e}; {} clients refused",
                    svc.def.name,
                    svc.listen,
                    last.1
                );
                *last = (Some(Instant::now()), 0);
            }
        }
    }

    /// The acceptor stopped: wake every parked thread so that it exits.
    fn close(&self) {
        let seats = {
            let mut st = self.stack();
            st.closed = true;
            std::mem::take(&mut st.seats)
        };
        for seat in seats {
            seat.thread.unpark();
        }
    }

    /// A client thread: serve a client, park for the next, until idle for
    /// IDLE_THREAD or the acceptor stops.
    fn client_thread(self: Arc<Self>, first: Job) {
        let seat = Arc::new(Seat {
            job: Mutex::new(None),
            thread: std::thread::current(),
        });
        let mut job = first;
        loop {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            match job {
                Job::New(a) => {
                    self.help_accept();
                    let mut client = Box::new(Client::accepted(a));
                    (self.serve)(&mut client, None);
                    self.done(client);
                }
                Job::Resume(mut client, tail, how) => {
                    (self.serve)(&mut client, Some((tail, how)));
                    self.done(client);
                }
            }
            match self.wait(&seat) {
                Some(next) => job = next,
                None => {
                    // What its clients allocated is free now, in malloc's
                    // arena of this thread: have it trimmed within a
                    // second (after a crowd, hundreds exit at once).
                    crate::sys::mem::freed_big();
                    return;
                }
            }
        }
    }

    /// The thread is done with `client`: it ends (its drop writes the
    /// record), or, if its session parked, it goes to the parking lot.
    fn done(self: &Arc<Self>, mut client: Box<Client>) {
        let Some(tail) = client.parked.take() else {
            return;
        };
        let deadline = tail.deadline();
        let generation = tail.generation();
        let p = Box::new(ParkedClient {
            client,
            tail,
            idle: self.clone(),
        });
        if let Err(p) = crate::park::park(p, deadline, generation) {
            // The lot cannot take it: the session goes on here, unparked.
            let ParkedClient {
                mut client, tail, ..
            } = *p;
            let how = crate::client::Resumed {
                may_park: false,
                ready: false,
            };
            (self.serve)(&mut client, Some((tail, how)));
        }
    }

    /// Park on `seat` until the acceptor gives it a client (Some), or the
    /// thread has been idle too long or the acceptor stopped (None).
    fn wait(&self, seat: &Arc<Seat>) -> Option<Job> {
        {
            let mut st = self.stack();
            if st.closed {
                return None;
            }
            st.seats.push(seat.clone());
        }
        let now = Instant::now();
        let deadline = now + IDLE_THREAD;
        let mut release = Some(now + IDLE_RELEASE);
        loop {
            // Spurious wake-ups and an unpark that came before the park
            // both land here: the seat says what happened.
            let until = release.unwrap_or(deadline);
            std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
            if let Some(job) = Self::take(seat) {
                return Some(job);
            }
            let mut st = self.stack();
            let now = Instant::now();
            let idle_long = release.is_some_and(|t| now >= t);
            match st.seats.iter().position(|s| Arc::ptr_eq(s, seat)) {
                // Idle for IDLE_THREAD; or for IDLE_RELEASE with more
                // threads idle than a service keeps spare, and this one
                // among the longest idle (the stack is taken from the
                // top): the thread exits.
                Some(i) if now >= deadline || (idle_long && st.seats.len() > SPARE_THREADS) => {
                    st.seats.remove(i);
                    return None;
                }
                Some(_) => {
                    drop(st);
                    if idle_long {
                        // Idle for IDLE_RELEASE: the frames of the last
                        // client are gone, their pages need not stay.
                        release = None;
                        crate::sys::mem::release_stack_below_here();
                    }
                    continue;
                }
                // Emptied by `close` (which runs after the acceptor's last
                // dispatch, so a job given before is in the seat already).
                None if st.closed => return Self::take(seat),
                // Taken off by `dispatch`, which fills the seat, then
                // unparks us.
                None => {
                    drop(st);
                    loop {
                        if let Some(job) = Self::take(seat) {
                            return Some(job);
                        }
                        std::thread::park();
                    }
                }
            }
        }
    }

    fn take(seat: &Seat) -> Option<Job> {
        seat.job.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// accept() failed. Running out of memory is transient: back off briefly
/// so the loop does not spin (running out of descriptors is handled by
/// [`Spare::refuse_one`], which waits); log at most once a second so a
/// flood does not fill the disk.
fn accept_error(svc: &Service, e: &io::Error, last: &mut Option<Instant>) {
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        if out_of_descriptors(e) {
            log::error!(
                "{} on {}: accept(): {e}: refusing new clients until descriptors free",
                svc.def.name,
                svc.listen
            );
        } else {
            log::error!("{} on {}: accept(): {e}", svc.def.name, svc.listen);
        }
        *last = Some(Instant::now());
    }
    if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM)) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The descriptor an acceptor keeps in reserve, so that it can still
/// accept (and close) a waiting client when the process is out of them.
struct Spare(Option<std::os::fd::OwnedFd>);

impl Spare {
    fn take(listener: &Listener) -> Spare {
        use std::os::fd::AsFd;
        Spare(listener.as_fd().try_clone_to_owned().ok())
    }

    /// Out of descriptors: wait up to 100 ms for a client; if one waits,
    /// accept it with the spare descriptor and close it at once. Without
    /// a spare (another thread took the descriptor it freed), wait 10 ms.
    fn refuse_one(&mut self, listener: &Listener, svc: &Service) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if !poll(&mut fds, PollTimeout::from(100u8)).is_ok_and(|n| n > 0) {
            return;
        }
        if self.0.take().is_none() {
            *self = Spare::take(listener);
            std::thread::sleep(Duration::from_millis(10));
            return;
        }
        if let Ok((stream, peer)) = listener.accept() {
            log::debug!(
                "{} on {}: out of descriptors, closed the connection of {peer:?}",
                svc.def.name,
                svc.listen
            );
            drop(stream);
        }
        *self = Spare::take(listener);
    }
}

/// A service event record ("Accepting connections ...") in the access log,
/// as 3proxy writes one when a service starts.
pub fn svc_record(svc: &Service, what: &str) {
    let Some(sink) = &svc.log else { return };
    let text = format!("{what} [{}/{}]", std::process::id(), thread_id());
    let now = std::time::SystemTime::now();
    let listen = match &svc.listen {
        crate::net::Addr::Ip(a) => Some(*a),
        _ => None,
    };
    let rec = crate::logformat::LogRecord {
        listen_port: svc.port(),
        client: listen,
        local: listen,
        text: &text,
        ..crate::logformat::LogRecord::blank(svc.def.log_name, now)
    };
    crate::log::emit(sink, &svc.logformat, &rec);
}

fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}
