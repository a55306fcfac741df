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
//! - Accounting: [`account`] encodes a request on the client thread,
//!   in a buffer the sender gave back (no allocation in the steady
//!   state), queues it (bounded: past [`QUEUE`] requests one is dropped
//!   and counted) and returns at once. One sender thread ([`SENDERS`])
//!   keeps up to 256 requests in flight per server (one socket each,
//!   answers matched by identifier and checked by their Response
//!   Authenticator), sends and reads them in batches (`sendmmsg`,
//!   `recvmmsg`) every [`GATHER`] while busy, sends each again once at
//!   half the wait and hands it to the next server at the wait (the
//!   same timeouts and failover as authentication). A session's
//!   requests go in order: each waits until the one before it was
//!   answered or given up. On exit [`flush`] waits, bounded, until what
//!   was queued is done. Start and Stop are [`Record`]s from the
//!   session's fields; an Interim-Update is the same with
//!   [`Status::InterimUpdate`] and the counters so far (`logdump`
//!   records send one).
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

    /// The server to ask next for `which`, of those not `tried` (bits):
    /// the first that is up, in the order of the line, else the first
    /// held down ([`Conf::order`] without a list).
    fn pick(&self, which: usize, tried: u8, now: u64) -> Option<usize> {
        let fresh = |i: &usize| tried & (1 << i) == 0;
        let n = self.servers.len().min(8);
        (0..n)
            .filter(fresh)
            .find(|&i| self.down[i][which].load(Ordering::Relaxed) <= now)
            .or_else(|| (0..n).find(fresh))
    }

    /// Ask the servers in [`Conf::order`] until one gives a valid answer.
    fn ask(&self, which: usize, pkt: &[u8]) -> Option<Reply> {
        for i in self.order(which) {
            let s = &self.servers[i];
            let to = if which == AUTH { s.auth } else { s.acct };
            let r = exchange(self, to, s.local, pkt);
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
    /// The same fields, borrowed.
    pub fn view(&self) -> View<'_> {
        View {
            user: self.user.as_deref(),
            client: self.client,
            local: self.local,
            nas_port: self.nas_port,
            nas_id: &self.nas_id,
            host: self.host.as_deref(),
            dst: self.dst,
            port: self.port,
            op: self.op,
            session_id: self.session_id.as_bytes(),
        }
    }
}

/// [`Fields`] borrowed from where the proxy keeps them: what a client
/// thread encodes an Accounting-Request from without copying them.
#[derive(Debug, Clone, Copy, Default)]
pub struct View<'a> {
    pub user: Option<&'a str>,
    pub client: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub nas_port: u16,
    pub nas_id: &'a str,
    pub host: Option<&'a str>,
    pub dst: Option<IpAddr>,
    pub port: u16,
    pub op: Option<u32>,
    /// Acct-Session-Id (text).
    pub session_id: &'a [u8],
}

impl View<'_> {
    fn add_to(&self, b: &mut Builder) {
        b.add(attr::ACCT_SESSION_ID, self.session_id);
        b.add_u32(attr::NAS_PORT_TYPE, wire::PORT_VIRTUAL);
        b.add_u32(attr::NAS_PORT, u32::from(self.nas_port));
        if let Some(l) = self.local {
            b.add_ip(attr::NAS_IP_ADDRESS, attr::NAS_IPV6_ADDRESS, l.ip());
        }
        b.add(attr::NAS_IDENTIFIER, self.nas_id.as_bytes());
        if let Some(c) = self.client {
            b.add_ip(attr::FRAMED_IP_ADDRESS, attr::FRAMED_IPV6_ADDRESS, c.ip());
            add_ip_text(b, attr::CALLING_STATION_ID, c.ip().to_canonical());
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

/// An address as text (`addr::ip_text`'s form), an IPv4 one without
/// allocating.
fn add_ip_text(b: &mut Builder, t: u8, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        b.add(t, crate::addr::ip_text(ip).as_bytes());
        return;
    };
    let mut text = [0u8; 15];
    let mut n = 0;
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            text[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            text[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        text[n] = b'0' + o % 10;
        n += 1;
    }
    b.add(t, &text[..n]);
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
    let d = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}.{}.{}",
        d.as_secs(),
        d.subsec_millis(),
        SESSION_N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The counter at the end of Acct-Session-Ids.
static SESSION_N: AtomicU64 = AtomicU64::new(0);

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
    f.view().add_to(&mut b);
    if let Some(pw) = password {
        b.add_password(pw.as_bytes(), &conf.secret);
    }
    let pkt = b.finish_access(&conf.secret);
    if let Some(r) = conf.ask(AUTH, &pkt) {
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
/// (sending it again once, halfway), on a socket of its own.
fn exchange(conf: &Conf, to: SocketAddr, local: Option<IpAddr>, pkt: &[u8]) -> Option<Reply> {
    let sock = open(to, local)?;
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
                // Not ours (the socket is new: nothing late is).
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

/// An Acct-Session-Id kept inline (a session's requests copy it without
/// allocating): at most [`SessionId::MAX`] bytes, cut there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionId {
    len: u8,
    buf: [u8; SessionId::MAX],
}

impl SessionId {
    /// Longest id kept: ours ("seconds.millis.counter") take at most 35.
    pub const MAX: usize = 47;

    /// A new id for a session that starts at `start` (as [`session_id`]).
    pub fn new(start: SystemTime) -> SessionId {
        let d = start
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut s = SessionId {
            len: 0,
            buf: [0; SessionId::MAX],
        };
        let n = SESSION_N.fetch_add(1, Ordering::Relaxed);
        for (i, v) in [d.as_secs(), u64::from(d.subsec_millis()), n]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                s.push(b'.');
            }
            s.push_number(v);
        }
        s
    }

    fn push(&mut self, b: u8) {
        if usize::from(self.len) < SessionId::MAX {
            self.buf[usize::from(self.len)] = b;
            self.len += 1;
        }
    }

    /// `v` in decimal, as `format!` writes it.
    fn push_number(&mut self, v: u64) {
        let mut digits = [0u8; 20];
        for &d in crate::addr::decimal(v, &mut digits) {
            self.push(d);
        }
    }

    /// The id an Access-Request carried (cut at [`SessionId::MAX`] bytes,
    /// at a character boundary).
    pub fn from_text(t: &str) -> SessionId {
        let mut n = t.len().min(SessionId::MAX);
        while !t.is_char_boundary(n) {
            n -= 1;
        }
        let mut s = SessionId {
            len: n as u8,
            buf: [0; SessionId::MAX],
        };
        s.buf[..n].copy_from_slice(&t.as_bytes()[..n]);
        s
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// A session's accounting so far: begun with a Start, ended with a Stop.
#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    /// Ties its requests together for the sender ([`next_key`]): none of
    /// them is sent before the one queued before it was answered or
    /// given up.
    pub key: u64,
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

/// A new accounting session's key (never 0: 0 is a lone request's).
pub fn next_key() -> u64 {
    static K: AtomicU64 = AtomicU64::new(1);
    K.fetch_add(1, Ordering::Relaxed)
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
    pub session_id: SessionId,
    key: u64,
    since: SystemTime,
    class: Vec<Vec<u8>>,
    /// Live counters (out, in) at the Start.
    base: (u64, u64),
    /// [`clock_ms`] of the Start or the last Interim-Update, and whether
    /// the Stop was queued: under one lock, so an Interim-Update is
    /// queued before the Stop or not at all.
    state: std::sync::Mutex<(u64, bool)>,
    /// What its Interim-Updates say (only kept with `radiusinterim`).
    fields: std::sync::Mutex<Option<Fields>>,
}

impl Track {
    /// A track for session `s` of `conf`; `base` the live counters (out,
    /// in) now; `fields` what its Interim-Updates say, asked for only if
    /// `conf` has an interval (which starts the timer thread).
    pub fn new(
        conf: &Arc<Conf>,
        s: &Session,
        fields: impl FnOnce() -> Fields,
        base: (u64, u64),
    ) -> Track {
        let every = conf.interim;
        if every.is_some() {
            start_timer();
        }
        Track {
            conf: conf.clone(),
            every,
            session_id: s.id,
            key: s.key,
            since: s.since,
            class: s.class.clone(),
            base,
            state: std::sync::Mutex::new((clock_ms(), false)),
            fields: std::sync::Mutex::new(every.map(|_| fields())),
        }
    }

    /// Whether Interim-Updates are sent for the session.
    pub fn interim(&self) -> bool {
        self.every.is_some()
    }

    /// The session knows more of itself (its destination's address).
    pub fn set_fields(&self, f: Fields) {
        *self.fields.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
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
        let fields = self.fields.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = fields.as_ref() else { return };
        let r = Record {
            status: Status::InterimUpdate,
            fields: f.view(),
            input: inb.saturating_sub(self.base.1),
            output: out.saturating_sub(self.base.0),
            session_time: self.since.elapsed().map_or(0, |d| d.as_secs()),
            class: &self.class,
            res: Res::OK,
        };
        account(&self.conf, self.key, &r);
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

    fn record(status: Status, user: &str) -> Vec<u8> {
        let f = Fields {
            user: Some(user.to_string()),
            ..Fields::default()
        };
        Record {
            status,
            fields: f.view(),
            input: 0,
            output: 0,
            session_time: 0,
            class: &[],
            res: Res::OK,
        }
        .encode(Vec::new())
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
    fn session_ids_read_as_format_writes_them() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_042);
        let a = SessionId::new(t);
        let (head, n) = a.as_str().rsplit_once('.').unwrap();
        assert_eq!(head, "1700000000.42");
        let b = SessionId::new(t);
        let m: u64 = b.as_str().rsplit_once('.').unwrap().1.parse().unwrap();
        assert!(m > n.parse::<u64>().unwrap());
        assert_eq!(
            SessionId::new(SystemTime::UNIX_EPOCH)
                .as_str()
                .split('.')
                .next(),
            Some("0")
        );
        assert_eq!(SessionId::from_text("1.2.3").as_str(), "1.2.3");
        let long = "é".repeat(40);
        assert_eq!(SessionId::from_text(&long).as_str(), "é".repeat(23));
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
            let f = Fields {
                user: Some(format!("u{i}")),
                ..Fields::default()
            };
            let r = Record {
                status: Status::Stop,
                fields: f.view(),
                input: 1,
                output: 2,
                session_time: 3,
                class: &[],
                res: Res::OK,
            };
            account(&c, next_key(), &r);
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
        let f = Fields {
            user: Some("icmp".into()),
            ..Fields::default()
        };
        let r = Record {
            status: Status::Start,
            fields: f.view(),
            input: 0,
            output: 0,
            session_time: 0,
            class: &[],
            res: Res::OK,
        };
        account(&c, next_key(), &r);
        let p = got.recv_timeout(Duration::from_secs(4)).unwrap();
        assert_eq!(what(&p), ("icmp".into(), 1));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
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
