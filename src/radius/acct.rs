//! `log radius` accounting: [`account`] queues a session's requests for
//! the one sender thread, which keeps many in flight per server and sends
//! and reads them in batches (`sys::udp`); [`flush`] waits for them at
//! exit.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use super::fields::View;
use super::servers::{clock_ms, open, warn_limited, Conf, ACCT};
use crate::proto::radius::{self as wire, attr, Builder, Status};
use crate::res::Res;

/// Accounting requests waiting for the sender, at most.
pub const QUEUE: usize = 8192;

/// Acct-Terminate-Cause for a session's result code (3proxy.cfg(5) "log
/// radius" lists the mapping).
pub fn terminate_cause(res: Res) -> u32 {
    use wire::cause::*;
    match res {
        Res::OK => USER_REQUEST,
        Res::IDLE | Res::TOO_SLOW => IDLE_TIMEOUT,
        // Its slot went to a new client at `maxconn`.
        Res::RECLAIMED => PORT_PREEMPTED,
        Res::RADIUS_SESSION_TIMEOUT => SESSION_TIMEOUT,
        // Ended from outside: the admin page or a Disconnect-Request.
        Res::ENDED => ADMIN_RESET,
        r if r.is_auth() => USER_ERROR,
        Res::QUOTA => SERVICE_UNAVAILABLE,
        Res::CLIENT_ERR => LOST_CARRIER,
        r if (11..=19).contains(&r.0) || r.is_parent() || r == Res::SERVER_ERR => LOST_SERVICE,
        r if (100..200).contains(&r.0) => NAS_REQUEST,
        _ => NAS_ERROR,
    }
}

/// A new accounting session's key (never 0: 0 is a lone request's).
pub fn next_key() -> u64 {
    static K: AtomicU64 = AtomicU64::new(1);
    K.fetch_add(1, Ordering::Relaxed)
}

/// One Accounting-Request, as the client thread knows it (borrowed: it
/// is encoded at once, in [`account`]).
#[derive(Debug, Clone)]
pub struct Record<'a> {
    pub status: Status,
    pub fields: View<'a>,
    /// Acct-Input-Octets: bytes from the server to the client (3proxy's
    /// `statssrv64`, `%I`); Acct-Output-Octets the other way (`%O`).
    pub input: u64,
    pub output: u64,
    /// Seconds since the session began (Stop and Interim-Update).
    pub session_time: u64,
    pub class: &'a [Vec<u8>],
    /// The session's result code, for Stop.
    pub res: Res,
}

impl Record<'_> {
    /// The Accounting-Request's attributes, in `buf` (a buffer kept from
    /// an earlier request): Acct-Status-Type, the fields, and for a Stop
    /// or an Interim-Update the counters and the session time; for a
    /// Stop the terminate cause; the Class attributes. Unsealed: the
    /// sender adds Acct-Delay-Time, the identifier and the authenticator
    /// ([`seal`]).
    pub fn encode(&self, buf: Vec<u8>) -> Vec<u8> {
        let mut b = Builder::reuse(buf, wire::ACCOUNTING_REQUEST, 0, [0; 16]);
        b.add_u32(attr::ACCT_STATUS_TYPE, self.status as u32);
        self.fields.add_to(&mut b);
        if self.status != Status::Start {
            wire::add_octets(&mut b, self.input, self.output);
            b.add_u32(
                attr::ACCT_SESSION_TIME,
                self.session_time.min(u64::from(u32::MAX)) as u32,
            );
        }
        if self.status == Status::Stop {
            b.add_u32(attr::ACCT_TERMINATE_CAUSE, terminate_cause(self.res));
        }
        for c in self.class {
            b.add(attr::CLASS, c);
        }
        b.into_unsealed()
    }
}

/// Finish an encoded request for sending with identifier `id`:
/// Acct-Delay-Time (how long from `queued` to `now`, [`clock_ms`]) if a second or
/// more, after the `body` bytes [`Record::encode`] made, then the header.
fn seal(pkt: &mut Vec<u8>, body: usize, queued: u64, now: u64, id: u8, secret: &[u8]) {
    pkt.truncate(body);
    let delay = now.saturating_sub(queued) / 1000;
    if delay > 0 {
        let mut b = Builder::resume(std::mem::take(pkt));
        b.add_u32(attr::ACCT_DELAY_TIME, delay.min(u64::from(u32::MAX)) as u32);
        *pkt = b.into_unsealed();
    }
    wire::seal_accounting(pkt, id, secret);
}

/// What a client thread hands the sender: the encoded request and what
/// it needs to send it.
struct Job {
    conf: Arc<Conf>,
    /// The session's [`next_key`], 0 for a lone request.
    key: u64,
    pkt: Vec<u8>,
    /// [`clock_ms`] when it was queued.
    queued: u64,
    /// A flush marker instead of a request (see [`flush`]).
    flush: Option<Sender<()>>,
}

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Accounting sender threads. All requests of a session go to the same
/// one (chosen by its key), so its Start always goes before its Stop.
/// One is enough: it keeps up to 256 requests outstanding per server
/// and sends and receives them in batches.
pub const SENDERS: usize = 1;

static SENDER_TX: OnceLock<Vec<Sender<Job>>> = OnceLock::new();

/// Encoded requests' buffers, back from the sender for the next ones
/// (the client thread allocates none in the steady state).
static POOL: OnceLock<Pool> = OnceLock::new();

/// The pool's two ends: the sender gives back, client threads take.
type Pool = (Sender<Vec<u8>>, Receiver<Vec<u8>>);

fn pool() -> &'static Pool {
    POOL.get_or_init(|| bounded(1024))
}

/// The senders' queues, started at the first request.
fn senders() -> &'static [Sender<Job>] {
    SENDER_TX.get_or_init(|| {
        (0..SENDERS)
            .filter_map(|i| {
                let (tx, rx) = bounded(QUEUE / SENDERS);
                std::thread::Builder::new()
                    .name(format!("radius-acct-{i}"))
                    .spawn(move || Outbox::new(rx).run())
                    .map_err(|e| log::error!("radius accounting: cannot start a thread: {e}"))
                    .ok()
                    .map(|_| tx)
            })
            .collect()
    })
}

/// `log radius`: queue `r` for the servers of `conf`, as a request of
/// the session `key` (0: a lone request); never waits. A full queue
/// drops it (counted, and said once in a while). The request is encoded
/// here, in a buffer the sender gave back.
pub fn account(conf: &Arc<Conf>, key: u64, r: &Record) {
    let all = senders();
    let Some(tx) = all.get(key as usize % all.len().max(1)) else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let buf = pool()
        .1
        .try_recv()
        .unwrap_or_else(|_| Vec::with_capacity(256));
    let job = Job {
        conf: conf.clone(),
        key,
        pkt: r.encode(buf),
        queued: clock_ms(),
        flush: None,
    };
    match tx.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            let n = DROPPED.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() || n == 0 {
                log::warn!(
                    "radius accounting: queue full, {} request(s) dropped",
                    n + 1
                );
            }
        }
    }
}

/// A request on its way: sent (or to be sent) to one server.
struct Pending {
    conf: Arc<Conf>,
    key: u64,
    pkt: Vec<u8>,
    /// Length of the encoded request before [`seal`] added to it.
    body: usize,
    queued: u64,
    /// The server it is sent to (an index into `conf.servers`), and
    /// those tried before (bits).
    server: usize,
    tried: u8,
    /// [`clock_ms`] of its first send to this server; whether it was
    /// sent again.
    sent: u64,
    resent: bool,
}

/// The socket to one server (by address and source address) and its
/// requests in flight, by identifier.
struct Sock {
    to: SocketAddr,
    local: Option<IpAddr>,
    sock: UdpSocket,
    slots: Vec<Option<Pending>>,
    used: usize,
    /// Where to look for a free identifier next.
    cursor: u8,
    /// Identifiers to send (or send again) at the next batch.
    out: Vec<u8>,
}

impl Sock {
    fn free_id(&mut self) -> Option<u8> {
        if self.used >= 256 {
            return None;
        }
        for _ in 0..256 {
            let id = self.cursor;
            self.cursor = self.cursor.wrapping_add(1);
            if self.slots[usize::from(id)].is_none() {
                return Some(id);
            }
        }
        None
    }
}

/// How long the sender gathers requests and answers before it sends
/// and reads them in one batch, while it is busy.
const GATHER: Duration = Duration::from_millis(2);
/// After this long without a request, the sender sleeps until the next
/// one (a client thread then wakes it).
const IDLE_AFTER: u64 = 50;

/// One accounting sender thread's state.
struct Outbox {
    rx: Receiver<Job>,
    socks: Vec<Sock>,
    /// Requests ready for a server (new ones and failed-over ones).
    ready: std::collections::VecDeque<Pending>,
    /// Sessions with a request in flight or ready: their later requests
    /// wait here, in order.
    sessions: std::collections::HashMap<u64, std::collections::VecDeque<Job>, KeyHash>,
    /// How many jobs wait in `sessions`.
    held: usize,
    /// Flushes waiting for everything before them.
    flushes: Vec<Sender<()>>,
    /// When the next retransmission or give-up is due ([`clock_ms`]).
    next_due: u64,
    last_job: u64,
    /// [`clock_ms`] as of the last wake-up (what the sender's timers
    /// count from: a few ms coarse at most).
    now: u64,
    bufs: Vec<Vec<u8>>,
    lens: [usize; crate::sys::udp::BATCH],
    /// Requests just answered: (session key, buffer).
    answered: Vec<(u64, Vec<u8>)>,
}

/// Session keys are counters: their own hash.
#[derive(Default, Clone, Copy)]
struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Outbox {
    fn new(rx: Receiver<Job>) -> Outbox {
        Outbox {
            rx,
            socks: Vec::new(),
            ready: Default::default(),
            sessions: Default::default(),
            held: 0,
            flushes: Vec::new(),
            next_due: u64::MAX,
            last_job: 0,
            now: clock_ms(),
            bufs: vec![vec![0u8; wire::MAX_PACKET]; crate::sys::udp::BATCH],
            lens: [0; crate::sys::udp::BATCH],
            answered: Vec::with_capacity(crate::sys::udp::BATCH),
        }
    }

    fn in_flight(&self) -> usize {
        self.socks.iter().map(|s| s.used).sum()
    }

    fn idle(&self) -> bool {
        self.ready.is_empty() && self.sessions.is_empty() && self.in_flight() == 0
    }

    fn run(mut self) {
        loop {
            // Take the requests queued meanwhile; sleep until the next
            // one when there is nothing to do for a while.
            self.now = clock_ms();
            if self.flushes.is_empty() {
                if self.idle() && self.now >= self.last_job + IDLE_AFTER {
                    match self.rx.recv() {
                        Ok(job) => {
                            self.now = clock_ms();
                            self.take(job)
                        }
                        Err(_) => return,
                    }
                }
                // Taken from the queue only while what was taken is
                // bounded too: servers that do not answer fill the queue,
                // and a full queue drops (counted).
                while self.ready.len() + self.held < QUEUE {
                    let Ok(job) = self.rx.try_recv() else { break };
                    self.take(job);
                    if !self.flushes.is_empty() {
                        break;
                    }
                }
            }
            self.dispatch();
            self.send();
            if self.idle() {
                for done in self.flushes.drain(..) {
                    let _ = done.send(());
                }
                if self.now >= self.last_job + IDLE_AFTER {
                    continue;
                }
            }
            std::thread::sleep(GATHER);
            self.now = clock_ms();
            self.receive();
            self.timers();
        }
    }

    /// A job from a client thread: ready, or waiting behind its
    /// session's earlier request.
    fn take(&mut self, job: Job) {
        self.last_job = self.now;
        if let Some(done) = job.flush {
            self.flushes.push(done);
            return;
        }
        if job.key != 0 {
            use std::collections::hash_map::Entry;
            match self.sessions.entry(job.key) {
                Entry::Occupied(mut e) => {
                    e.get_mut().push_back(job);
                    self.held += 1;
                    return;
                }
                Entry::Vacant(e) => {
                    e.insert(Default::default());
                }
            }
        }
        self.start(job);
    }

    /// Make `job` ready for the first server to ask.
    fn start(&mut self, job: Job) {
        let Some(server) = job.conf.pick(ACCT, 0, self.now) else {
            self.done(job.key, job.pkt);
            return;
        };
        let body = job.pkt.len();
        self.ready.push_back(Pending {
            conf: job.conf,
            key: job.key,
            pkt: job.pkt,
            body,
            queued: job.queued,
            server,
            tried: 0,
            sent: 0,
            resent: false,
        });
    }

    /// A request was answered or given up: its buffer goes back to the
    /// pool, and its session's next request (if any) gets ready.
    fn done(&mut self, key: u64, pkt: Vec<u8>) {
        let _ = pool().0.try_send(pkt);
        if key == 0 {
            return;
        }
        let next = match self.sessions.get_mut(&key) {
            Some(q) => q.pop_front(),
            None => return,
        };
        match next {
            Some(job) => {
                self.held -= 1;
                self.start(job)
            }
            None => {
                self.sessions.remove(&key);
            }
        }
    }

    /// The socket for server `i` of `conf`, opened at first use.
    fn sock(&mut self, conf: &Conf, i: usize) -> Option<usize> {
        let s = &conf.servers[i];
        if let Some(at) = self
            .socks
            .iter()
            .position(|k| k.to == s.acct && k.local == s.local)
        {
            return Some(at);
        }
        let sock = open(s.acct, s.local)?;
        self.socks.push(Sock {
            to: s.acct,
            local: s.local,
            sock,
            slots: (0..256).map(|_| None).collect(),
            used: 0,
            cursor: 0,
            out: Vec::with_capacity(64),
        });
        Some(self.socks.len() - 1)
    }

    /// Give each ready request an identifier on its server's socket (one
    /// whose 256 are all in flight waits).
    fn dispatch(&mut self) {
        let mut wait = std::collections::VecDeque::new();
        while let Some(mut p) = self.ready.pop_front() {
            let conf = p.conf.clone();
            let Some(at) = self.sock(&conf, p.server) else {
                // No socket to that server: as if it did not answer.
                self.fail_over(p);
                continue;
            };
            let s = &mut self.socks[at];
            let Some(id) = s.free_id() else {
                wait.push_back(p);
                continue;
            };
            seal(&mut p.pkt, p.body, p.queued, self.now, id, &conf.secret);
            p.sent = self.now;
            p.resent = false;
            let due = p.sent + conf.wait.as_millis() as u64 / 2;
            self.next_due = self.next_due.min(due);
            s.slots[usize::from(id)] = Some(p);
            s.used += 1;
            s.out.push(id);
        }
        self.ready = wait;
    }

    /// Send what each socket has to send, in batches.
    fn send(&mut self) {
        use std::os::fd::AsFd;
        let mut refused = Vec::new();
        for (at, s) in self.socks.iter_mut().enumerate() {
            let mut from = 0;
            while from < s.out.len() {
                let mut pkts: [&[u8]; crate::sys::udp::BATCH] = [&[]; crate::sys::udp::BATCH];
                let mut n = 0;
                for &id in s.out[from..].iter().take(crate::sys::udp::BATCH) {
                    if let Some(p) = &s.slots[usize::from(id)] {
                        pkts[n] = &p.pkt;
                        n += 1;
                    }
                }
                let taken = s.out[from..].len().min(crate::sys::udp::BATCH);
                match crate::sys::udp::send_batch(s.sock.as_fd(), &pkts[..n]) {
                    Ok(k) if k == n => from += taken,
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // ICMP port unreachable: nobody listens there.
                    Err(_) => {
                        refused.push(at);
                        break;
                    }
                }
            }
            // What the socket's buffer did not take goes out at the
            // retransmission (or is given up on in time).
            s.out.clear();
        }
        for at in refused {
            self.refused(at);
        }
    }

    /// The server of socket `at` refused (ICMP): every request in flight
    /// there goes to the next server now.
    fn refused(&mut self, at: usize) {
        let s = &mut self.socks[at];
        let all: Vec<Pending> = s.slots.iter_mut().filter_map(Option::take).collect();
        s.used = 0;
        s.out.clear();
        for p in all {
            self.fail_over(p);
        }
    }

    /// Read the answers waiting on every socket with requests in flight.
    fn receive(&mut self) {
        use std::os::fd::AsFd;
        for at in 0..self.socks.len() {
            loop {
                let s = &mut self.socks[at];
                if s.used == 0 {
                    break;
                }
                let n = match crate::sys::udp::recv_batch(
                    s.sock.as_fd(),
                    &mut self.bufs,
                    &mut self.lens,
                ) {
                    Ok(n) => n,
                    Err(_) => {
                        self.refused(at);
                        break;
                    }
                };
                for k in 0..n {
                    let got = &self.bufs[k][..self.lens[k]];
                    if got.len() < 20 {
                        continue;
                    }
                    let s = &mut self.socks[at];
                    let slot = &mut s.slots[usize::from(got[1])];
                    let Some(p) = slot.as_ref() else {
                        // A late answer to a request given up on.
                        continue;
                    };
                    match wire::parse_reply(got, &p.pkt, &p.conf.secret) {
                        Ok(_) => {
                            let p = slot.take().expect("checked above");
                            s.used -= 1;
                            p.conf.mark(p.server, ACCT, true);
                            self.answered.push((p.key, p.pkt));
                        }
                        // A late duplicate answer to a request given up on
                        // or answered, whose identifier was taken again
                        // since (its authenticator is the old request's):
                        // not worth a warning each. A wrong secret shows
                        // as requests no server answers.
                        Err(why) => log::debug!("radius {}: ignored a reply: {why}", s.to),
                    }
                }
                let mut answered = std::mem::take(&mut self.answered);
                for (key, pkt) in answered.drain(..) {
                    self.done(key, pkt);
                }
                self.answered = answered;
                if n < crate::sys::udp::BATCH {
                    break;
                }
            }
        }
    }

    /// Retransmissions (once, at half the wait) and give-ups (at the
    /// wait: the next server), when one is due.
    fn timers(&mut self) {
        let now = self.now;
        if now < self.next_due {
            return;
        }
        let mut next = u64::MAX;
        let mut gone = Vec::new();
        for s in &mut self.socks {
            if s.used == 0 {
                continue;
            }
            for id in 0..=255u8 {
                let Some(p) = &mut s.slots[usize::from(id)] else {
                    continue;
                };
                let wait = p.conf.wait.as_millis() as u64;
                if now >= p.sent + wait {
                    gone.push(s.slots[usize::from(id)].take().expect("checked above"));
                    s.used -= 1;
                    continue;
                }
                if !p.resent && now >= p.sent + wait / 2 {
                    p.resent = true;
                    s.out.push(id);
                }
                next = next.min(if p.resent {
                    p.sent + wait
                } else {
                    p.sent + wait / 2
                });
            }
        }
        self.next_due = next;
        for p in gone {
            self.fail_over(p);
        }
        self.dispatch();
        self.send();
    }

    /// Server `p.server` did not answer: the next one gets `p`, or, when
    /// all were asked, it is given up on.
    fn fail_over(&mut self, mut p: Pending) {
        p.conf.mark(p.server, ACCT, false);
        p.tried |= 1 << p.server;
        match p.conf.pick(ACCT, p.tried, self.now) {
            Some(i) => {
                p.server = i;
                self.ready.push_back(p);
            }
            None => {
                let status = p.pkt.get(25).copied().unwrap_or(0);
                let status = match status {
                    1 => "Start",
                    2 => "Stop",
                    _ => "Interim-Update",
                };
                warn_limited(&format!(
                    "radius accounting: a {status} not answered by any of {} server(s)",
                    p.conf.servers.len()
                ));
                self.done(p.key, p.pkt);
            }
        }
    }
}

/// Wait, up to `limit`, until what was queued so far has been sent (or
/// given up on): the Stops of a stopping process.
pub fn flush(limit: Duration) {
    // Nothing was ever queued: no thread to wait for.
    let Some(all) = SENDER_TX.get() else { return };
    let (done_tx, done_rx) = bounded(all.len());
    let deadline = Instant::now() + limit;
    let asked = all
        .iter()
        .filter(|tx| {
            let marker = Job {
                conf: Arc::new(Conf::new(Vec::new(), Vec::new(), Duration::ZERO)),
                key: 0,
                pkt: Vec::new(),
                queued: 0,
                flush: Some(done_tx.clone()),
            };
            tx.send_deadline(marker, deadline).is_ok()
        })
        .count();
    for _ in 0..asked {
        if done_rx.recv_deadline(deadline).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::radius::fields::Fields;
    use crate::radius::servers::tests::conf;

    #[test]
    fn causes() {
        assert_eq!(terminate_cause(Res::OK), 1);
        assert_eq!(terminate_cause(Res::IDLE), 4);
        assert_eq!(terminate_cause(Res::RADIUS_SESSION_TIMEOUT), 5);
        assert_eq!(terminate_cause(Res::ACL_DENY), 17);
        assert_eq!(terminate_cause(Res::RADIUS_REJECT), 17);
        assert_eq!(terminate_cause(Res::CONNECT), 3);
        assert_eq!(terminate_cause(Res::CLIENT_ERR), 2);
        assert_eq!(terminate_cause(Res::ENDED), 6);
    }

    /// An accounting server on loopback: reads nothing for `delay`, then
    /// answers each request and hands it over, as received.
    fn acct_server(delay: Duration) -> (SocketAddr, Receiver<Vec<u8>>) {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = s.local_addr().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            std::thread::sleep(delay);
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let req = buf[..n].to_vec();
                let mut p = vec![wire::ACCOUNTING_RESPONSE, req[1], 0, 20];
                p.extend_from_slice(&req[4..20]);
                use md5::{Digest, Md5};
                let mut h = Md5::new();
                h.update(&p);
                h.update(b"sec");
                let d = h.finalize();
                p[4..20].copy_from_slice(&d);
                let _ = s.send_to(&p, from);
                if tx.send(req).is_err() {
                    return;
                }
            }
        });
        (a, rx)
    }

    /// `then` with a record of `status` for a session of `user`: no
    /// bytes, no time, no class.
    fn with_record<T>(status: Status, user: &str, then: impl FnOnce(Record<'_>) -> T) -> T {
        let f = Fields {
            user: Some(user.to_string()),
            ..Fields::default()
        };
        then(Record {
            status,
            fields: f.view(),
            input: 0,
            output: 0,
            session_time: 0,
            class: &[],
            res: Res::OK,
        })
    }

    fn record(status: Status, user: &str) -> Vec<u8> {
        with_record(status, user, |r| r.encode(Vec::new()))
    }

    /// The User-Name and Acct-Status-Type of a request as received.
    fn what(pkt: &[u8]) -> (String, u8) {
        let mut at = 20;
        let (mut user, mut status) = (String::new(), 0);
        while at + 2 <= pkt.len() {
            let (t, l) = (pkt[at], usize::from(pkt[at + 1]));
            let v = &pkt[at + 2..at + l];
            match t {
                attr::USER_NAME => user = String::from_utf8_lossy(v).into_owned(),
                attr::ACCT_STATUS_TYPE => status = v[3],
                _ => {}
            }
            at += l;
        }
        (user, status)
    }

    #[test]
    fn accounting_fails_over_in_order_and_flushes() {
        // The first server is silent, the second answers: each request
        // goes there after the wait, a session's Start before its Stop.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = silent.local_addr().unwrap();
        let (good, got) = acct_server(Duration::ZERO);
        let c = Arc::new(conf(&[dead, good]));
        let key = next_key();
        let t = Instant::now();
        let start = record(Status::Start, "fo");
        let stop = record(Status::Stop, "fo");
        let send = |pkt: &[u8], key| {
            // What `account` does, with the record already encoded.
            let job = Job {
                conf: c.clone(),
                key,
                pkt: pkt.to_vec(),
                queued: clock_ms(),
                flush: None,
            };
            let all = senders();
            all[key as usize % all.len()].send(job).unwrap();
        };
        send(&start, key);
        send(&stop, key);
        flush(Duration::from_secs(5));
        let took = t.elapsed();
        let seen: Vec<_> = got.try_iter().map(|p| what(&p)).collect();
        assert_eq!(seen, [("fo".into(), 1), ("fo".into(), 2)], "{took:?}");
        // The Stop waited for the Start's answer, which waited 300 ms
        // for the silent server; the Stop then went to the good one at
        // once (the silent one is held down).
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
        assert_eq!(c.order(ACCT), [1, 0]);
    }

    #[test]
    fn many_requests_in_flight_at_once() {
        // A server that starts answering late: 600 requests (more than
        // one socket's 256 identifiers) of 600 sessions all arrive, each
        // answered by its own answer.
        let (good, got) = acct_server(Duration::from_millis(20));
        let mut c = conf(&[good]);
        c.wait = Duration::from_secs(5);
        let c = Arc::new(c);
        for i in 0..600 {
            with_record(Status::Stop, &format!("u{i}"), |r| {
                let r = Record {
                    input: 1,
                    output: 2,
                    session_time: 3,
                    ..r
                };
                account(&c, next_key(), &r);
            });
        }
        flush(Duration::from_secs(15));
        let mut users: Vec<String> = got.try_iter().map(|p| what(&p).0).collect();
        users.sort();
        users.dedup();
        assert_eq!(users.len(), 600);
    }

    #[test]
    fn a_refused_server_hands_over_at_once() {
        // A port nobody listens on: ICMP port unreachable.
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed = gone.local_addr().unwrap();
        drop(gone);
        let (good, got) = acct_server(Duration::ZERO);
        let mut c = conf(&[closed, good]);
        c.wait = Duration::from_secs(5);
        let c = Arc::new(c);
        let t = Instant::now();
        with_record(Status::Start, "icmp", |r| account(&c, next_key(), &r));
        let p = got.recv_timeout(Duration::from_secs(4)).unwrap();
        assert_eq!(what(&p), ("icmp".into(), 1));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}
