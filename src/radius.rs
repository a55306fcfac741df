//! The RADIUS client: the servers of the `radius` line, asked in order
//! (failover), for `auth radius` on the client's thread and for `log
//! radius` accounting on sender threads of its own (3proxy's
//! authradius.c `radsend`). The packets themselves are `proto::radius`.
//!
//! - Authentication: each server in turn gets the Access-Request and is
//!   waited for up to the `timeouts` slot 1 (BYTE_LONG, 3proxy's
//!   `SINGLEBYTE_L`, 5 s by default), the request sent again once at half
//!   that time (a retransmission: same identifier and authenticator). A
//!   server that does not answer, or answers with something that does not
//!   check out, hands over to the next, and is asked after the others for
//!   [`HOLD_DOWN`]; when none is left the client is refused with
//!   [`Res::RADIUS_NO_ANSWER`]. So a client thread waits at most servers
//!   x BYTE_LONG.
//! - Accounting: [`account`] queues a request (bounded: past
//!   [`QUEUE`] requests one is dropped and counted) and returns at once;
//!   [`SENDERS`] sender threads send them with the same failover, those
//!   of one session in order, on a socket per server they keep. On
//!   exit [`flush`] waits, bounded, for the queue to drain. Start and Stop
//!   are built by [`Acct::packet`] from the session's fields; an
//!   Interim-Update is the same call with [`Status::InterimUpdate`] and the
//!   counters so far (`logdump` records send one).
//! - `radiusinterim`: a session's [`Track`], hung on its live-registry
//!   entry at its Start, lets one timer thread for the whole process
//!   ([`interim_loop`]) send each live session an Interim-Update every
//!   interval, with the counters the relay keeps there; the Stop takes
//!   the track off first, so no Interim-Update follows a Stop.
//!
//! Invariant: every wait is bounded by the timeout; nothing here blocks
//! a client thread on the accounting server.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::proto::radius::{self as wire, attr, Builder, Reply, Status};
use crate::res::Res;

/// Most servers on a `radius` line (3proxy's MAXRADIUS).
pub const MAX_SERVERS: usize = 5;
/// Longest secret kept; 3proxy cuts a longer one here.
pub const MAX_SECRET: usize = 63;
/// Accounting requests waiting for the sender, at most.
pub const QUEUE: usize = 8192;

/// One server of the `radius` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Where Access-Requests go (port 1812 unless given).
    pub auth: SocketAddr,
    /// Where Accounting-Requests go: the same address, the next port
    /// (3proxy's rule).
    pub acct: SocketAddr,
    /// `/LOCAL`: the address to send from.
    pub local: Option<IpAddr>,
}

/// After a server failed to answer, it is asked after the others for
/// this long (it is still asked when they fail too).
pub const HOLD_DOWN: Duration = Duration::from_secs(30);

/// The `radius` line: the shared secret and the servers, in order.
#[derive(Debug)]
pub struct Conf {
    pub secret: Vec<u8>,
    pub servers: Vec<Server>,
    /// How long each server is waited for (`timeouts` slot 1).
    pub wait: Duration,
    /// `radiusinterim`: how often a live `log radius` session gets an
    /// Interim-Update; None (the default, as in 3proxy) for never.
    pub interim: Option<Duration>,
    /// Per server, authentication and accounting: until when (ms of
    /// [`clock_ms`]) it counts as down after it failed; 0 when it is up.
    down: Vec<[AtomicU64; 2]>,
}

const AUTH: usize = 0;
const ACCT: usize = 1;

/// Milliseconds since the first call, never 0.
fn clock_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl Conf {
    pub fn new(secret: Vec<u8>, servers: Vec<Server>, wait: Duration) -> Conf {
        let down = servers.iter().map(|_| Default::default()).collect();
        Conf {
            secret,
            servers,
            wait,
            interim: None,
            down,
        }
    }

    /// The servers to ask for `which` (AUTH, ACCT), in order: those up
    /// first, in the order of the line, then those held down.
    fn order(&self, which: usize) -> Vec<usize> {
        let now = clock_ms();
        let is_down = |i: usize| self.down[i][which].load(Ordering::Relaxed) > now;
        let (mut up, down): (Vec<usize>, Vec<usize>) =
            (0..self.servers.len()).partition(|&i| !is_down(i));
        up.extend(down);
        up
    }

    /// Server `i` answered (`ok`) or did not.
    fn mark(&self, i: usize, which: usize, ok: bool) {
        let until = if ok {
            0
        } else {
            clock_ms() + HOLD_DOWN.as_millis() as u64
        };
        self.down[i][which].store(until, Ordering::Relaxed);
    }

    /// Ask the servers in [`Conf::order`] until one gives a valid answer,
    /// on the sockets `keep` holds if given.
    fn ask(&self, which: usize, pkt: &[u8], mut keep: Option<&mut Sockets>) -> Option<Reply> {
        for i in self.order(which) {
            let s = &self.servers[i];
            let to = if which == AUTH { s.auth } else { s.acct };
            let r = exchange(self, to, s.local, pkt, keep.as_deref_mut());
            self.mark(i, which, r.is_some());
            if r.is_some() {
                return r;
            }
        }
        None
    }
}

/// A `radius` line's servers and secret, shared by every service of the
/// cfg (3proxy keeps one global list; the last `radius` line wins),
/// completed with the timeout when the whole cfg has loaded.
#[derive(Debug, Default)]
pub struct Slot(OnceLock<Arc<Conf>>);

impl Slot {
    /// Set once, at the end of the load.
    pub fn set(&self, c: Conf) {
        let _ = self.0.set(Arc::new(c));
    }

    pub fn get(&self) -> Option<&Arc<Conf>> {
        self.0.get()
    }
}

/// What the proxy knows about a client when it asks or accounts: the
/// attributes 3proxy's `radsend` fills in.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pub user: Option<String>,
    /// The client's address: Framed-IP-Address as 3proxy sends it, and
    /// Calling-Station-Id.
    pub client: Option<SocketAddr>,
    /// The address the client reached: NAS-IP-Address (NAS-IPv6-Address);
    /// the service's port is NAS-Port.
    pub local: Option<SocketAddr>,
    pub nas_port: u16,
    /// NAS-Identifier: the service's log name (PROXY, SOCK5, ...).
    pub nas_id: String,
    /// Called-Station-Id: the destination host as asked.
    pub host: Option<String>,
    /// Login-IP-Host (Login-IPv6-Host) and Login-TCP-Port.
    pub dst: Option<IpAddr>,
    pub port: u16,
    /// Login-Service: the operation's bits shifted by 8, as 3proxy sends
    /// (Access-Request only: a record does not keep its operation).
    pub op: Option<u32>,
    pub session_id: String,
}

impl Fields {
    fn add_to(&self, b: &mut Builder) {
        b.add(attr::ACCT_SESSION_ID, self.session_id.as_bytes());
        b.add_u32(attr::NAS_PORT_TYPE, wire::PORT_VIRTUAL);
        b.add_u32(attr::NAS_PORT, u32::from(self.nas_port));
        if let Some(l) = self.local {
            b.add_ip(attr::NAS_IP_ADDRESS, attr::NAS_IPV6_ADDRESS, l.ip());
        }
        b.add(attr::NAS_IDENTIFIER, self.nas_id.as_bytes());
        if let Some(c) = self.client {
            b.add_ip(attr::FRAMED_IP_ADDRESS, attr::FRAMED_IPV6_ADDRESS, c.ip());
            let text = crate::addr::ip_text(c.ip().to_canonical());
            b.add(attr::CALLING_STATION_ID, text.as_bytes());
        }
        if let Some(h) = &self.host {
            b.add(attr::CALLED_STATION_ID, h.as_bytes());
        }
        if let Some(op) = self.op {
            b.add_u32(attr::LOGIN_SERVICE, op);
        }
        b.add_u32(attr::LOGIN_TCP_PORT, u32::from(self.port));
        if let Some(d) = self.dst {
            b.add_ip(attr::LOGIN_IP_HOST, attr::LOGIN_IPV6_HOST, d);
        }
        if let Some(u) = &self.user {
            b.add(attr::USER_NAME, u.as_bytes());
        }
    }
}

/// What an Access-Accept gave the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Framed-IP-Address: the source of the user's outgoing connections.
    pub framed_ip: Option<IpAddr>,
    /// Session-Timeout: the session ends then, with
    /// [`Res::RADIUS_SESSION_TIMEOUT`].
    pub deadline: Option<Instant>,
    /// Class: echoed in the session's accounting.
    pub class: Vec<Vec<u8>>,
    /// The Acct-Session-Id the Access-Request carried: the session's
    /// accounting uses it too, as 3proxy's does.
    pub session_id: String,
}

/// A new Acct-Session-Id: seconds, milliseconds of the start and a
/// process-wide counter (3proxy: seconds, milliseconds, thread id).
pub fn session_id(start: SystemTime) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}.{}.{}",
        d.as_secs(),
        d.subsec_millis(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An identifier for the next request (3proxy counts them too).
fn next_id() -> u8 {
    static ID: AtomicU8 = AtomicU8::new(0);
    ID.fetch_add(1, Ordering::Relaxed)
}

/// A Request Authenticator nobody off this host can predict: SipHash
/// keyed from the OS's randomness (std's `RandomState`) over a counter.
fn random_authenticator() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut out = [0u8; 16];
    for half in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(N.fetch_add(1, Ordering::Relaxed));
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// `auth radius`: ask the servers about `user` and `password`. Ok with
/// what an Access-Accept gave; Err [`Res::RADIUS_REJECT`] for an
/// Access-Reject (or the code its Reply-Message starts with, as in
/// 3proxy), [`Res::RADIUS_NO_ANSWER`] when no server answered.
pub fn authenticate(conf: &Conf, f: &Fields, password: Option<&str>) -> Result<Accepted, Res> {
    let asked = Instant::now();
    let mut b = Builder::new(wire::ACCESS_REQUEST, next_id(), random_authenticator());
    b.add_u32(attr::SERVICE_TYPE, wire::SERVICE_AUTHENTICATE_ONLY);
    f.add_to(&mut b);
    if let Some(pw) = password {
        b.add_password(pw.as_bytes(), &conf.secret);
    }
    let pkt = b.finish_access(&conf.secret);
    if let Some(r) = conf.ask(AUTH, &pkt, None) {
        return match r.code {
            wire::ACCESS_ACCEPT => Ok(Accepted {
                framed_ip: r.framed_ip,
                deadline: r
                    .session_timeout
                    .filter(|&t| t > 0)
                    .map(|t| asked + Duration::from_secs(u64::from(t))),
                class: r.class,
                session_id: f.session_id.clone(),
            }),
            _ => Err(match r.reply_code {
                // 3proxy takes a numeric Reply-Message for the result.
                Some(n) if n > 0 => Res(n),
                _ => Res::RADIUS_REJECT,
            }),
        };
    }
    warn_limited(&format!(
        "auth radius: no answer from {} server(s) within {:?} each",
        conf.servers.len(),
        conf.wait
    ));
    Err(Res::RADIUS_NO_ANSWER)
}

/// Send `pkt` to `to` and wait for a valid answer, up to `conf.wait`
/// (sending it again once, halfway).
/// With `keep` (the accounting sender's), the socket for `to` is kept
/// for the next request: a late answer to an earlier one is told apart
/// by its identifier and authenticator, and skipped.
fn exchange(
    conf: &Conf,
    to: SocketAddr,
    local: Option<IpAddr>,
    pkt: &[u8],
    keep: Option<&mut Sockets>,
) -> Option<Reply> {
    let owned;
    let sock = match keep {
        Some(map) => match map.entry((to, local)) {
            std::collections::hash_map::Entry::Occupied(e) => &*e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => &*e.insert(open(to, local)?),
        },
        None => {
            owned = open(to, local)?;
            &owned
        }
    };
    let start = Instant::now();
    let deadline = start + conf.wait;
    let resend_at = start + conf.wait / 2;
    let mut resent = false;
    let mut buf = vec![0u8; wire::MAX_PACKET];
    if sock.send(pkt).is_err() {
        return None;
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let until = if resent { deadline } else { resend_at };
        let wait = until
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(wait));
        match sock.recv(&mut buf) {
            Ok(n) => match wire::parse_reply(&buf[..n], pkt, &conf.secret) {
                Ok(r) => return Some(r),
                // A late answer to an earlier request on a kept socket.
                Err(wire::Fault::Id) => {}
                Err(why) => log::warn!("radius {to}: ignored a reply: {why}"),
            },
            Err(e) if crate::addr::is_timeout(&e) => {
                if !resent {
                    resent = true;
                    let _ = sock.send(pkt);
                }
            }
            // ICMP port unreachable: nobody listens there.
            Err(_) => return None,
        }
    }
}

/// A warning, at most one every [`WARN_EVERY`] (a server outage would
/// otherwise give one per request); the next one says how many were
/// left out.
fn warn_limited(msg: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SKIPPED: AtomicU64 = AtomicU64::new(0);
    let now = clock_ms();
    let last = LAST.load(Ordering::Relaxed);
    let due = last == 0 || now >= last + WARN_EVERY.as_millis() as u64;
    if due
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        match SKIPPED.swap(0, Ordering::Relaxed) {
            0 => log::warn!("{msg}"),
            n => log::warn!("{msg} ({n} more such warnings left out)"),
        }
    } else {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Least time between two of this module's warnings about servers.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// Sockets the accounting sender keeps, by server and source address.
type Sockets = std::collections::HashMap<(SocketAddr, Option<IpAddr>), UdpSocket>;

/// A UDP socket connected to `to` (so only its datagrams reach us), from
/// `local` if given.
fn open(to: SocketAddr, local: Option<IpAddr>) -> Option<UdpSocket> {
    let from = local.unwrap_or(match to {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    });
    match UdpSocket::bind(SocketAddr::new(from, 0)).and_then(|s| s.connect(to).map(|()| s)) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("radius {to}: {e}");
            None
        }
    }
}

/// Acct-Terminate-Cause for a session's result code (3proxy.cfg(5) "log
/// radius" lists the mapping).
pub fn terminate_cause(res: Res) -> u32 {
    use wire::cause::*;
    match res {
        Res::OK => USER_REQUEST,
        Res::IDLE => IDLE_TIMEOUT,
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

/// A session's accounting so far: begun with a Start, ended with a Stop.
#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub since: SystemTime,
    pub class: Vec<Vec<u8>>,
    /// Bytes already reported by Interim-Updates (`logdump` records),
    /// in and out: the Stop adds them to what came after.
    pub dumped_in: AtomicU64,
    pub dumped_out: AtomicU64,
    /// What `radiusinterim`'s timer and a Disconnect-Request by
    /// Acct-Session-Id read, also hung on the session's live entry.
    pub track: Option<Arc<Track>>,
}

/// What `radiusinterim`'s timer and `radiusdae` need of a live `log
/// radius` session:
/// the servers, what its requests say, and the live counters' values at
/// its Start (a kept-alive HTTP connection has one accounting session
/// per request, the counters one per connection).
#[derive(Debug)]
pub struct Track {
    conf: Arc<Conf>,
    /// `radiusinterim`, if set.
    every: Option<Duration>,
    pub session_id: String,
    since: SystemTime,
    class: Vec<Vec<u8>>,
    /// Live counters (out, in) at the Start.
    base: (u64, u64),
    /// [`clock_ms`] of the Start or the last Interim-Update, and whether
    /// the Stop was queued: under one lock, so an Interim-Update is
    /// queued before the Stop or not at all.
    state: std::sync::Mutex<(u64, bool)>,
    fields: std::sync::Mutex<Fields>,
}

impl Track {
    /// A track for session `s` of `conf`; `base` the live counters (out,
    /// in) now. Starts the timer thread if `conf` has an interval.
    pub fn new(conf: &Arc<Conf>, s: &Session, fields: Fields, base: (u64, u64)) -> Track {
        let every = conf.interim;
        if every.is_some() {
            start_timer();
        }
        Track {
            conf: conf.clone(),
            every,
            session_id: s.id.clone(),
            since: s.since,
            class: s.class.clone(),
            base,
            state: std::sync::Mutex::new((clock_ms(), false)),
            fields: std::sync::Mutex::new(fields),
        }
    }

    /// Whether Interim-Updates are sent for the session.
    pub fn interim(&self) -> bool {
        self.every.is_some()
    }

    /// The session knows more of itself (its destination's address).
    pub fn set_fields(&self, f: Fields) {
        *self.fields.lock().unwrap_or_else(|e| e.into_inner()) = f;
    }

    /// The Stop is about to be queued: no Interim-Update after it.
    pub fn stop(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    }

    /// Queue an Interim-Update if one is due at `now` ([`clock_ms`]);
    /// `out` and `inb` are the live counters now.
    fn tick(&self, now: u64, out: u64, inb: u64) {
        let Some(every) = self.every else { return };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.1 || now < st.0 + every.as_millis() as u64 {
            return;
        }
        st.0 = now;
        let fields = self
            .fields
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let a = Acct {
            status: Status::InterimUpdate,
            fields,
            input: inb.saturating_sub(self.base.1),
            output: out.saturating_sub(self.base.0),
            session_time: self.since.elapsed().map_or(0, |d| d.as_secs()),
            class: self.class.clone(),
            res: Res::OK,
            queued: Instant::now(),
        };
        account(&self.conf, a);
    }
}

/// How often the timer looks for sessions whose Interim-Update is due.
const TICK: Duration = Duration::from_millis(250);

/// Start [`interim_loop`] once per process.
fn start_timer() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("radius-interim".into())
            .stack_size(256 << 10)
            .spawn(interim_loop);
        if let Err(e) = spawned {
            log::error!("radiusinterim: cannot start the timer thread: {e}");
        }
    });
}

/// The one timer thread: every [`TICK`], each live session with a
/// [`Track`] whose interval has passed gets an Interim-Update.
fn interim_loop() {
    loop {
        std::thread::sleep(TICK);
        let now = clock_ms();
        for t in crate::live::tagged() {
            if let Some(track) = t.tag.downcast_ref::<Track>() {
                track.tick(now, t.out, t.inb);
            }
        }
    }
}

/// One Accounting-Request to send.
#[derive(Debug, Clone)]
pub struct Acct {
    pub status: Status,
    pub fields: Fields,
    /// Acct-Input-Octets: bytes from the server to the client (3proxy's
    /// `statssrv64`, `%I`); Acct-Output-Octets the other way (`%O`).
    pub input: u64,
    pub output: u64,
    /// Seconds since the session began (Stop and Interim-Update).
    pub session_time: u64,
    pub class: Vec<Vec<u8>>,
    /// The session's result code, for Stop.
    pub res: Res,
    /// When it was queued: Acct-Delay-Time says how long it waited.
    pub queued: Instant,
}

impl Acct {
    /// An Interim-Update for a live session: `input` and `output` are its
    /// byte counts so far (not since the last update). What a periodic
    /// sender (a live-session registry's timer) queues with [`account`];
    /// `logdump` records use it today.
    pub fn interim(fields: Fields, session: &Session, input: u64, output: u64) -> Acct {
        Acct {
            status: Status::InterimUpdate,
            fields,
            input,
            output,
            session_time: session.since.elapsed().map_or(0, |d| d.as_secs()),
            class: session.class.clone(),
            res: Res::OK,
            queued: Instant::now(),
        }
    }

    /// The Accounting-Request's bytes: Acct-Status-Type, the fields, and
    /// for a Stop or an Interim-Update the counters and the session time;
    /// for a Stop the terminate cause; the Class attributes.
    pub fn packet(&self, secret: &[u8]) -> Vec<u8> {
        let mut b = Builder::new(wire::ACCOUNTING_REQUEST, next_id(), [0; 16]);
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
        for c in &self.class {
            b.add(attr::CLASS, c);
        }
        let delay = self.queued.elapsed().as_secs();
        if delay > 0 {
            b.add_u32(attr::ACCT_DELAY_TIME, delay.min(u64::from(u32::MAX)) as u32);
        }
        b.finish_accounting(secret)
    }
}

enum Job {
    Send(Arc<Conf>, Box<Acct>),
    Flush(Sender<()>),
}

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Accounting sender threads. All requests of a session go to the same
/// one (chosen by its Acct-Session-Id), so its Start always goes before
/// its Stop, while other sessions' requests are sent meanwhile.
pub const SENDERS: usize = 4;

static SENDER_TX: OnceLock<Vec<Sender<Job>>> = OnceLock::new();

/// The senders' queues, started at the first request.
fn senders() -> &'static [Sender<Job>] {
    SENDER_TX.get_or_init(|| {
        (0..SENDERS)
            .filter_map(|i| {
                let (tx, rx) = bounded(QUEUE / SENDERS);
                std::thread::Builder::new()
                    .name(format!("radius-acct-{i}"))
                    .spawn(move || send_loop(rx))
                    .map_err(|e| log::error!("radius accounting: cannot start a thread: {e}"))
                    .ok()
                    .map(|_| tx)
            })
            .collect()
    })
}

/// `log radius`: queue `a` for the servers of `conf`; never waits. A full
/// queue drops it (counted, and said once in a while).
pub fn account(conf: &Arc<Conf>, a: Acct) {
    use std::hash::{Hash, Hasher};
    let all = senders();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    a.fields.session_id.hash(&mut h);
    let Some(tx) = all.get(h.finish() as usize % all.len().max(1)) else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    match tx.try_send(Job::Send(conf.clone(), Box::new(a))) {
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

fn send_loop(rx: Receiver<Job>) {
    let mut sockets = Sockets::new();
    for job in rx {
        match job {
            Job::Send(conf, a) => {
                let pkt = a.packet(&conf.secret);
                if conf.ask(ACCT, &pkt, Some(&mut sockets)).is_none() {
                    warn_limited(&format!(
                        "radius accounting: {:?} for session {} not answered by any server",
                        a.status, a.fields.session_id
                    ));
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
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
            tx.send_deadline(Job::Flush(done_tx.clone()), deadline)
                .is_ok()
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

    /// A server on loopback that answers every Access-Request as `code`.
    fn server(secret: &'static [u8], code: u8) -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = s.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let req = &buf[..n];
                let mut b = Builder::new(code, req[1], req[4..20].try_into().unwrap());
                b.add(attr::FRAMED_IP_ADDRESS, &[127, 0, 0, 2]);
                let mut p = b.finish_accounting(b"");
                // Response Authenticator over the request's authenticator.
                use md5::{Digest, Md5};
                let mut h = Md5::new();
                h.update(&p[..4]);
                h.update(&req[4..20]);
                h.update(&p[20..]);
                h.update(secret);
                let d = h.finalize();
                p[4..20].copy_from_slice(&d);
                let _ = s.send_to(&p, from);
            }
        });
        a
    }

    fn conf(servers: &[SocketAddr]) -> Conf {
        Conf::new(
            b"sec".to_vec(),
            servers
                .iter()
                .map(|&a| Server {
                    auth: a,
                    acct: a,
                    local: None,
                })
                .collect(),
            Duration::from_millis(300),
        )
    }

    #[test]
    fn fails_over_and_gives_up_in_time() {
        // A port nobody answers on (bound, never read).
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = silent.local_addr().unwrap();
        let good = server(b"sec", wire::ACCESS_ACCEPT);
        let f = Fields::default();
        let t = Instant::now();
        let r = authenticate(&conf(&[dead, good]), &f, Some("pw")).unwrap();
        assert_eq!(r.framed_ip, Some("127.0.0.2".parse().unwrap()));
        assert!(t.elapsed() >= Duration::from_millis(300));
        let t = Instant::now();
        assert_eq!(
            authenticate(&conf(&[dead, dead]), &f, Some("pw")),
            Err(Res::RADIUS_NO_ANSWER)
        );
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(2));
        // A server with another secret does not count as an answer.
        let other = server(b"other", wire::ACCESS_ACCEPT);
        assert_eq!(
            authenticate(&conf(&[other]), &f, Some("pw")),
            Err(Res::RADIUS_NO_ANSWER)
        );
        let no = server(b"sec", wire::ACCESS_REJECT);
        assert_eq!(
            authenticate(&conf(&[no, good]), &f, Some("pw")),
            Err(Res::RADIUS_REJECT)
        );
    }

    #[test]
    fn a_server_that_failed_is_asked_last_for_a_while() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = silent.local_addr().unwrap();
        let good = server(b"sec", wire::ACCESS_ACCEPT);
        let c = conf(&[dead, good]);
        let f = Fields::default();
        assert!(authenticate(&c, &f, Some("pw")).is_ok());
        assert_eq!(c.order(AUTH), [1, 0]);
        // Accounting keeps its own account of the same server.
        assert_eq!(c.order(ACCT), [0, 1]);
        // The next request goes to the good server at once.
        let t = Instant::now();
        assert!(authenticate(&c, &f, Some("pw")).is_ok());
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // An answer puts a server back in its place.
        c.mark(0, AUTH, true);
        assert_eq!(c.order(AUTH), [0, 1]);
    }
}
