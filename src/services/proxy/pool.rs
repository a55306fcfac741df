//! The shared pool of idle origin connections.
//!
//! A client whose next request goes elsewhere, or who leaves, parks its
//! kept origin connection here (`park`); any client of the same service
//! going to the same host and port takes it (`unpark`) instead of dialing.
//! (3proxy has no such pool; haproxy and nginx do.)
//!
//! Invariants: only direct connections that served a request and are not
//! bound to a client (no NTLM/Negotiate, no parents) are parked; a
//! connection waits at most STRING_SHORT (the time a client may stay idle
//! between requests), at most 32 per destination and 1024 in all; a
//! connection is closed only after the lock is released, and whether a
//! taken one still looks open is checked outside the lock.
//!
//! A sweeper thread (started with the first park) looks at the pool once
//! a [`SWEEP`]: it closes what has waited too long and what the origin
//! has closed (or sent something on: an idle HTTP connection that is
//! readable is not reusable), so a pool nobody draws from holds no socket
//! in CLOSE_WAIT and nothing past its time (3proxy issue #1263's
//! symptom). The readiness of all parked sockets is asked with one
//! poll() that does not wait, under the lock; the connections that look
//! closed are taken out and checked with `still_open` outside it (a TLS
//! session may only have had a ticket to read), and put back if open.
//!
//! Under `ssl_cli` (modes 0, 1) a service's origin connections are TLS,
//! the session asked for `ssl_client_sni` or the host: a parked one is
//! taken only by the same service (the key), for the same address and
//! host (so the same name was asked and checked), and only when it is
//! TLS exactly when a new one would be (`tls`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::net::Stream;
use crate::parent::Parents;
use crate::service::Service;
use crate::timeouts::Timeouts;

/// A connection to an origin server.
pub(super) struct Origin {
    pub(super) s: Stream,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) addr: SocketAddr,
    /// Who the connection reached (`%R`): `addr`, or its other family's
    /// address after happy eyeballs, or the last parent.
    pub(super) peer: Option<SocketAddr>,
    /// Our side's address (`%e`).
    pub(super) ext: Option<SocketAddr>,
    /// It has served a request already (so it may have been closed by the
    /// origin meanwhile).
    pub(super) used: bool,
    /// A request on it used NTLM/Negotiate, which authenticates the
    /// connection: it never goes to the shared pool.
    pub(super) bound: bool,
    /// Made through the parents of an ACL entry (None: directly).
    /// Boxed: most origins are direct, and a kept one waits as long as
    /// its client (an idle client's memory, issue 19).
    pub(super) via: Option<Box<Via>>,
    /// Parents taken (`%h`).
    pub(super) hops: u32,
}

/// How a connection through `parent`s was made: which later requests of
/// the same client it may serve (they keep their chain). Such connections
/// never go to the shared pool.
pub(super) struct Via {
    /// The parents of the ACL entry that allowed it (compared by pointer:
    /// a request allowed by another entry, or after a reload, dials anew).
    pub(super) parents: Parents,
    /// The last hop is an `http` parent: requests go to it in absolute
    /// form, for any host. Otherwise the connection reaches one
    /// destination.
    pub(super) http: bool,
    /// `Basic ...` for the `http` parent's `Proxy-Authorization`.
    pub(super) auth: Option<String>,
    /// The client's credentials when it was made (a `*` parent was given
    /// them).
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
}

/// Idle origin connections of all clients, by service and address, most
/// recently parked last. A client whose next request goes elsewhere, or
/// who leaves, parks its kept connection here; any client of the same
/// service going to the same host and port takes it instead of dialing.
/// (3proxy has no such pool; haproxy and nginx do.)
static IDLE: Mutex<Option<IdleMap>> = Mutex::new(None);

/// Parked connections by (service, destination).
type IdleMap = HashMap<(usize, SocketAddr), Vec<Parked>>;
/// Most idle connections kept per destination, and in all.
const IDLE_PER_DEST: usize = 32;
const IDLE_MAX: usize = 1024;

struct Parked {
    o: Origin,
    at: Instant,
    /// How long it may wait (its service's STRING_SHORT).
    limit: Duration,
}

fn pool_key(svc: &Arc<Service>, dst: SocketAddr) -> (usize, SocketAddr) {
    (Arc::as_ptr(svc) as usize, dst)
}

/// How long a connection may wait in the pool: STRING_SHORT, the time a
/// client may stay idle between requests.
fn idle_limit(svc: &Service) -> Duration {
    svc.timeouts.get(Timeouts::STRING_SHORT)
}

pub(super) fn park(svc: &Arc<Service>, o: Origin) {
    if o.bound || !o.used || o.via.is_some() {
        return;
    }
    start_sweeper();
    let limit = idle_limit(svc);
    let now = Instant::now();
    // Connections dropped here are closed after the lock is released.
    let mut dead: Vec<Parked> = Vec::new();
    let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    // Each list is in the order of parking: what waited too long is a
    // prefix.
    let expired = |v: &[Parked]| v.partition_point(|p| now.duration_since(p.at) >= limit);
    let total: usize = map.values().map(Vec::len).sum();
    if total >= IDLE_MAX {
        // Make room by dropping what has waited too long everywhere.
        map.retain(|_, v| {
            let k = expired(v);
            dead.extend(v.drain(..k));
            !v.is_empty()
        });
        if map.values().map(Vec::len).sum::<usize>() >= IDLE_MAX {
            drop(g);
            return;
        }
    }
    let v = map.entry(pool_key(svc, o.addr)).or_default();
    let mut k = expired(v);
    if v.len() - k >= IDLE_PER_DEST {
        k += 1;
    }
    dead.extend(v.drain(..k));
    v.push(Parked { o, at: now, limit });
    drop(g);
    drop(dead);
}

/// How often the sweeper looks at the pool.
const SWEEP: Duration = Duration::from_secs(1);

/// Start the sweeper thread once. If it cannot start, the pool still
/// works: parks and unparks drop what they find expired.
fn start_sweeper() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("httppool".into())
            .spawn(|| loop {
                std::thread::sleep(SWEEP);
                sweep(Instant::now());
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the origin pool's sweeper: {e}");
        }
    });
}

/// Close the parked connections that waited past their limit or that the
/// origin closed; keep the rest in their order.
fn sweep(now: Instant) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut dead: Vec<Parked> = Vec::new();
    let mut suspect: Vec<((usize, SocketAddr), Parked)> = Vec::new();
    {
        let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(map) = g.as_mut() else { return };
        for v in map.values_mut() {
            let k = v.partition_point(|p| now.duration_since(p.at) >= p.limit);
            dead.extend(v.drain(..k));
        }
        let keys: Vec<(usize, SocketAddr)> = map.keys().copied().collect();
        let mut readable: Vec<((usize, SocketAddr), usize)> = Vec::new();
        {
            let mut fds = Vec::new();
            let mut at = Vec::new();
            for key in &keys {
                for (i, p) in map[key].iter().enumerate() {
                    fds.push(PollFd::new(p.o.s.as_fd(), PollFlags::POLLIN));
                    at.push((*key, i));
                }
            }
            if !fds.is_empty() && poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0) {
                for (fd, pos) in fds.iter().zip(at) {
                    if fd.revents().is_some_and(|r| !r.is_empty()) {
                        readable.push(pos);
                    }
                }
            }
        }
        // Taken out from the back, so the indexes still hold.
        for (key, i) in readable.into_iter().rev() {
            if let Some(v) = map.get_mut(&key) {
                suspect.push((key, v.remove(i)));
            }
        }
        map.retain(|_, v| !v.is_empty());
    }
    let mut back = Vec::new();
    for (key, p) in suspect {
        if still_open(&p.o) {
            back.push((key, p));
        } else {
            dead.push(p);
        }
    }
    if !back.is_empty() {
        let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        let map = g.get_or_insert_with(HashMap::new);
        for (key, p) in back {
            let v = map.entry(key).or_default();
            let i = v.partition_point(|q| q.at <= p.at);
            v.insert(i, p);
        }
    }
    drop(dead);
}

/// The most recently parked connection to `dst` for `host`, TLS or not
/// as `tls` says; with `look`, one that still looks open.
pub(super) fn unpark(
    svc: &Arc<Service>,
    dst: SocketAddr,
    host: &str,
    tls: bool,
    look: bool,
) -> Option<Origin> {
    let limit = idle_limit(svc);
    loop {
        let p = {
            let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
            let v = g.as_mut()?.get_mut(&pool_key(svc, dst))?;
            let i = v
                .iter()
                .rposition(|p| p.o.host.eq_ignore_ascii_case(host) && p.o.s.is_tls() == tls)?;
            v.remove(i)
        };
        // Checked outside the lock; a dead one is dropped and the next tried.
        if p.at.elapsed() < limit && (!look || still_open(&p.o)) {
            return Some(p.o);
        }
    }
}

/// Whether a kept connection still looks open (a peek that does not
/// wait): checked before sending a request that cannot be retried.
/// (Through the session for a TLS parent: records with no data, such as
/// session tickets, are taken in and do not count.)
pub(super) fn still_open(o: &Origin) -> bool {
    use nix::sys::socket::MsgFlags;
    let mut b = [0u8; 1];
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    matches!(
        o.s.recv_flags(&mut b, flags),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    )
}
