//! The live sessions: every client session is registered here while it
//! runs (the admin service's `/sessions`, its sessions page and `/S`),
//! and can be ended from another thread (the admin page's "end" buttons,
//! a RADIUS Disconnect-Request).
//!
//! Cost on the session's path: the registry's entries belong to threads,
//! not to sessions. A client thread makes its entry at its first session
//! (one allocation and one short lock of one of [`SHARDS`] slabs) and keeps
//! it, parked between sessions, until it exits; a session takes its
//! thread's entry and marks it with its id, under the entry's own lock,
//! and gives it back by clearing the mark. So a session costs no
//! allocation and no lock of a shared map: what every session pays is the
//! uncontended lock of its own entry at start, end and when it learns
//! something (user, destination, parent). Only a second session at once
//! on one thread makes an entry of its own. The byte counters are relaxed
//! atomics the relay adds to where it counts anyway. Finding a session by
//! id (ending one, [`wait_gone`]) walks the entries: the admin page and
//! RADIUS do that, seldom.
//!
//! Ending a session is shutdown(2) of its client socket and, while the
//! relay runs, of its server socket: the session sees EOF on both at once,
//! ends by its usual path and writes its one record, with
//! [`crate::res::Res::ENDED`]. The registry keeps descriptor numbers, not
//! duplicates (no system call per session): a session forgets a number,
//! under the entry's lock, before it closes that socket, and ending takes
//! the same lock, so a number is never used after its socket closed.
//! Ending checks the entry's id under that lock: an entry its session gave
//! back, or that a later session of the thread took, is not ended.

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime};

use crate::sys::sockopt::{shutdown_both, ForeignFd};

pub mod pressure;

// What `pressure` reads of a session (its walks are there).

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// In an exchange or a relay (or a service without heads).
    Busy = 0,
    /// A kept-alive connection between two requests.
    Idle = 1,
    /// Waiting for a request head or a handshake.
    Head = 2,
    /// Chosen to be closed (by [`reclaim`] or [`sweep`]).
    Taken = 3,
}

/// Why a session was ended from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndedBy {
    /// `live::end` and the like: the admin page, a RADIUS Disconnect.
    Admin = 1,
    /// Its slot went to a new client at `maxconn`.
    Reclaim = 2,
    /// Its head or handshake came slower than `minrate`.
    Slow = 3,
}

impl EndedBy {
    pub fn from_u8(v: u8) -> Option<EndedBy> {
        match v {
            1 => Some(EndedBy::Admin),
            2 => Some(EndedBy::Reclaim),
            3 => Some(EndedBy::Slow),
            _ => None,
        }
    }
}

/// What the registry needs of a session's service for this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Guard {
    /// Which service the session counts against (the address of its
    /// settings): a reclaim closes only a session of the service that
    /// needs the slot. 0: none (never reclaimed).
    pub key: usize,
    /// The session first waits for a head or a handshake.
    pub head: bool,
    /// `minrate`: the least bytes per second of a head, 0 for no least.
    pub rate: u32,
    /// `minrate`'s grace: a head is not judged before this, in ms.
    pub grace_ms: u32,
}

static BASE: OnceLock<Instant> = OnceLock::new();

/// `t` in ms of the registry's clock (0 at its first use).
pub fn clock(t: Instant) -> u64 {
    let base = *BASE.get_or_init(Instant::now);
    t.saturating_duration_since(base).as_millis() as u64
}

/// A session takes entry `e`: it begins busy or waiting for a head.
fn begin(e: &Entry, g: &Guard) {
    let phase = if g.head { Phase::Head } else { Phase::Busy };
    e.phase.store(phase as u8, Ordering::Relaxed);
    if g.head {
        e.since.store(clock(Instant::now()), Ordering::Relaxed);
    }
    e.got.store(0, Ordering::Relaxed);
}

/// Slabs the registry is split into, so threads starting on different
/// cores rarely wait for each other (only a thread's first session and
/// its exit take one).
pub const SHARDS: usize = 16;

/// One slab: the entries of some threads, and the free places.
struct Shard {
    slots: Vec<Option<Arc<Entry>>>,
    free: Vec<usize>,
}

static REGISTRY: [Mutex<Shard>; SHARDS] = [const {
    Mutex::new(Shard {
        slots: Vec::new(),
        free: Vec::new(),
    })
}; SHARDS];
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes a session moved so far, both ways (the relay adds to them as it
/// delivers; the session sets them exactly at each log record). Only the
/// session's own thread writes them, so it adds with a relaxed load and
/// store (no locked instruction); readers see a recent value.
#[derive(Debug, Default)]
pub struct Bytes {
    /// Client to server (`%O`).
    pub out: AtomicU64,
    /// Server to client (`%I`).
    pub inb: AtomicU64,
}

/// What a session has learnt about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    /// The client (what a PROXY header said, once it has been read).
    pub client: Option<SocketAddr>,
    pub user: Option<String>,
    /// The destination asked for: its name, if it was given one, and its
    /// address and port (kept as an address: formatted only when someone
    /// looks; the port is 0 without it).
    pub host: Option<String>,
    pub dst: Option<SocketAddr>,
    /// The first parent the session's connection went through.
    pub parent: Option<SocketAddr>,
}

impl Info {
    /// The destination host: its name, else its address.
    pub fn host_text(&self) -> Option<String> {
        match (&self.host, self.dst) {
            (Some(h), _) => Some(h.clone()),
            (None, Some(a)) => Some(a.ip().to_string()),
            (None, None) => None,
        }
    }

    /// `host:port` (IPv6 in brackets), if a destination is known.
    pub fn dest(&self) -> Option<String> {
        let h = self.host_text()?;
        let port = self.dst.map_or(0, |a| a.port());
        Some(if h.contains(':') {
            format!("[{h}]:{port}")
        } else {
            format!("{h}:{port}")
        })
    }
}

/// What an entry's lock guards: the session using it, if any.
struct State {
    /// The session's id; 0 while no session uses the entry.
    id: u64,
    /// The service's cfg name (`proxy`, `socks`, ...).
    service: &'static str,
    /// The port the service listens on (0 for a unix socket).
    port: u16,
    start: SystemTime,
    info: Info,
    cli: Option<ForeignFd>,
    srv: Option<ForeignFd>,
    /// What a layer above hangs on the session ([`Tag`]); None for most.
    tag: Option<Tag>,
    /// The user and host strings of an earlier session, kept for the
    /// next ones (a session's strings then cost no allocation).
    spare: [Option<String>; 2],
    /// Its service's `maxconn` reclaim and `minrate` ([`pressure`]).
    guard: Guard,
}

/// One entry of the registry: a thread's, used by one session at a time.
struct Entry {
    state: Mutex<State>,
    bytes: Bytes,
    /// The session using the entry was ended from outside: 0 not, else
    /// an [`EndedBy`]. Set only under `state`'s lock, with the id
    /// checked; cleared when a session takes the entry.
    ended: AtomicU8,
    /// What the session is doing ([`pressure::Phase`]), since when (ms of
    /// [`pressure::clock`]), and the bytes of the head it waits for that
    /// it has so far. Written by the session alone, without a lock.
    phase: AtomicU8,
    since: AtomicU64,
    got: AtomicU32,
    /// Its place: shard and index in the shard's slab.
    shard: usize,
    index: usize,
}

/// What a layer above this one keeps on a live session for its own
/// walks of the registry: `log radius` hangs its accounting state there
/// (the Acct-Session-Id, what an Interim-Update says), which
/// `radiusinterim`'s timer and a Disconnect-Request read back. The
/// registry only keeps it and hands it out ([`tagged`], [`end_if`]).
pub type Tag = Arc<dyn std::any::Any + Send + Sync>;

/// A tagged live session, as [`tagged`] hands it out.
pub struct Tagged {
    /// Its byte counters now (`%O`, `%I` of the whole connection).
    pub out: u64,
    pub inb: u64,
    pub tag: Tag,
}

impl Entry {
    /// End the session whose state `st` is (its lock held): shut both
    /// its sockets down. False if it was ended already.
    fn end(&self, st: &State) -> bool {
        self.end_by(st, EndedBy::Admin)
    }

    /// [`Entry::end`], saying why; `EndedBy::Slow` shuts only the
    /// client's reading side (the session still answers it, an HTTP 408).
    fn end_by(&self, st: &State, why: EndedBy) -> bool {
        if st.id == 0
            || self
                .ended
                .compare_exchange(0, why as u8, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        if why == EndedBy::Slow {
            if let Some(fd) = &st.cli {
                crate::sys::sockopt::shutdown_read(fd);
            }
            return true;
        }
        for fd in [&st.cli, &st.srv].into_iter().flatten() {
            shutdown_both(fd);
        }
        true
    }
}

/// A copy of a session's state, for the admin pages.
#[derive(Debug, Clone)]
pub struct View {
    pub id: u64,
    pub service: &'static str,
    pub port: u16,
    pub start: SystemTime,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub info: Info,
    /// Ended from outside, and not yet gone.
    pub ended: bool,
}

/// An entry in the registry, owned by one thread (or one session);
/// dropping it takes it out of the registry.
struct Owned(Arc<Entry>);

impl Owned {
    fn new() -> Owned {
        let shard = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
        let mut s = lock(&REGISTRY[shard]);
        let index = s.free.pop().unwrap_or(s.slots.len());
        let e = Arc::new(Entry {
            state: Mutex::new(State {
                id: 0,
                service: "",
                port: 0,
                start: SystemTime::UNIX_EPOCH,
                info: Info::default(),
                cli: None,
                srv: None,
                tag: None,
                spare: [None, None],
                guard: Guard::default(),
            }),
            bytes: Bytes::default(),
            ended: AtomicU8::new(0),
            phase: AtomicU8::new(0),
            since: AtomicU64::new(0),
            got: AtomicU32::new(0),
            shard,
            index,
        });
        if index == s.slots.len() {
            s.slots.push(Some(e.clone()));
        } else {
            s.slots[index] = Some(e.clone());
        }
        Owned(e)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let mut s = lock(&REGISTRY[self.0.shard]);
        s.slots[self.0.index] = None;
        s.free.push(self.0.index);
    }
}

thread_local! {
    /// This thread's entry while no session of it uses it. Its drop, when
    /// the thread exits, takes the entry out of the registry.
    static SPARE: Cell<Option<Owned>> = const { Cell::new(None) };
}

/// A session's registration; dropping it removes the session.
pub struct Registration {
    /// Always Some; None only inside `drop`.
    entry: Option<Owned>,
    id: u64,
}

/// Register a session of service `service` (listening on `port`) from
/// `client`, whose socket is `cli`, which started at `start`, under its
/// service's `guard`. `cli` must stay open until the returned
/// [`Registration`] is dropped.
pub fn register(
    service: &'static str,
    port: u16,
    client: Option<SocketAddr>,
    cli: &impl AsFd,
    start: SystemTime,
    guard: Guard,
) -> Registration {
    let owned = SPARE
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_else(Owned::new);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let e = &owned.0;
    {
        let mut st = lock(&e.state);
        e.bytes.out.store(0, Ordering::Relaxed);
        e.bytes.inb.store(0, Ordering::Relaxed);
        e.ended.store(0, Ordering::Relaxed);
        begin(e, &guard);
        st.guard = guard;
        st.id = id;
        st.service = service;
        st.port = port;
        st.start = start;
        st.info.client = client;
        st.cli = Some(ForeignFd::new(cli.as_fd()));
    }
    Registration {
        entry: Some(owned),
        id,
    }
}

/// Set `slot` to `v`, reusing its string or `spare`'s. The common case,
/// nothing changed, is a comparison where this is called.
#[inline]
fn put_str(slot: &mut Option<String>, spare: &mut Option<String>, v: Option<&str>) {
    if slot.as_deref() != v {
        put_str_changed(slot, spare, v);
    }
}

#[inline(never)]
fn put_str_changed(slot: &mut Option<String>, spare: &mut Option<String>, v: Option<&str>) {
    match v {
        Some(v) => {
            let mut s = slot.take().or_else(|| spare.take()).unwrap_or_default();
            s.clear();
            s.push_str(v);
            *slot = Some(s);
        }
        None => {
            if let Some(s) = slot.take() {
                *spare = Some(s);
            }
        }
    }
}

impl Registration {
    fn entry(&self) -> &Entry {
        match &self.entry {
            Some(o) => &o.0,
            None => unreachable!("a live::Registration's entry is taken only by its drop"),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The counters the relay adds to.
    pub fn bytes(&self) -> &Bytes {
        &self.entry().bytes
    }

    /// Set the byte counters (at a log record: what the session moved in
    /// all so far).
    pub fn set_bytes(&self, out: u64, inb: u64) {
        let b = self.bytes();
        b.out.store(out, Ordering::Relaxed);
        b.inb.store(inb, Ordering::Relaxed);
    }

    /// Update what the session knows, allocating nothing once the
    /// thread's entry has held strings that long.
    pub fn update(
        &self,
        client: Option<SocketAddr>,
        user: Option<&str>,
        host: Option<&str>,
        dst: Option<SocketAddr>,
        parent: Option<SocketAddr>,
    ) {
        let mut guard = lock(&self.entry().state);
        let st = &mut *guard;
        let i = &mut st.info;
        i.client = client;
        let [su, sh] = &mut st.spare;
        put_str(&mut i.user, su, user);
        put_str(&mut i.host, sh, host);
        i.dst = dst;
        i.parent = parent;
    }

    /// The session was ended from outside ([`end`], [`end_user`]).
    pub fn ended(&self) -> bool {
        self.entry().ended.load(Ordering::Relaxed) != 0
    }

    /// Why the session was ended from outside, if it was.
    pub fn ended_by(&self) -> Option<EndedBy> {
        EndedBy::from_u8(self.entry().ended.load(Ordering::Relaxed))
    }

    /// Let [`end`] shut `srv` down too, until the guard is dropped; `srv`
    /// must stay open that long.
    pub fn attach_server(&self, srv: &impl AsFd) -> Attached {
        let mut st = lock(&self.entry().state);
        if self.ended() {
            // Ended while this socket was being reached.
            shutdown_both(&ForeignFd::new(srv.as_fd()));
        }
        st.srv = Some(ForeignFd::new(srv.as_fd()));
        Attached(self.entry.as_ref().map(|o| o.0.clone()), self.id)
    }

    /// Hang `tag` on the session (None takes it off).
    pub fn set_tag(&self, tag: Option<Tag>) {
        lock(&self.entry().state).tag = tag;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(owned) = self.entry.take() else {
            return;
        };
        let tag = {
            let mut guard = lock(&owned.0.state);
            let st = &mut *guard;
            st.id = 0;
            st.cli = None;
            st.srv = None;
            st.info.client = None;
            st.info.dst = None;
            st.info.parent = None;
            let [su, sh] = &mut st.spare;
            put_str(&mut st.info.user, su, None);
            put_str(&mut st.info.host, sh, None);
            st.tag.take()
        };
        // Not under the lock: a tag's drop may do anything.
        drop(tag);
        // Back to the thread for its next session; if the thread has one
        // already (two sessions at once), or is exiting, this one goes.
        let mut owned = Some(owned);
        let _ = SPARE.try_with(|s| {
            if let Some(old) = s.replace(owned.take()) {
                drop(old);
            }
        });
        drop(owned);
    }
}

/// A server socket [`end`] may shut down; dropping it takes that back.
pub struct Attached(Option<Arc<Entry>>, u64);

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(e) = &self.0 {
            let mut st = lock(&e.state);
            if st.id == self.1 {
                st.srv = None;
            }
        }
    }
}

/// Every entry of the registry (used or not).
fn entries() -> Vec<Arc<Entry>> {
    let mut out = Vec::new();
    for s in &REGISTRY {
        out.extend(lock(s).slots.iter().flatten().cloned());
    }
    out
}

/// Every live session, by id.
pub fn snapshot() -> Vec<View> {
    let mut out = Vec::new();
    for e in entries() {
        let st = lock(&e.state);
        if st.id == 0 {
            continue;
        }
        out.push(View {
            id: st.id,
            service: st.service,
            port: st.port,
            start: st.start,
            bytes_out: e.bytes.out.load(Ordering::Relaxed),
            bytes_in: e.bytes.inb.load(Ordering::Relaxed),
            info: st.info.clone(),
            ended: e.ended.load(Ordering::Relaxed) != 0,
        });
    }
    out.sort_by_key(|v| v.id);
    out
}

/// How many sessions are live.
pub fn count() -> usize {
    entries().iter().filter(|e| lock(&e.state).id != 0).count()
}

/// End the session `id`. False if there is none (or it was ended already).
pub fn end(id: u64) -> bool {
    entries().iter().any(|e| {
        let st = lock(&e.state);
        st.id == id && e.end(&st)
    })
}

/// End every live session of `user`; the ids of those ended.
pub fn end_user(user: &str) -> Vec<u64> {
    end_if(|i, _| i.user.as_deref() == Some(user))
}

/// End every live session for which `pick` (given what it knows and its
/// tag) is true; the ids of those ended.
pub fn end_if(pick: impl Fn(&Info, Option<&Tag>) -> bool) -> Vec<u64> {
    walk(pick, true)
}

/// The ids of the live sessions for which `pick` is true (not ended).
pub fn find_if(pick: impl Fn(&Info, Option<&Tag>) -> bool) -> Vec<u64> {
    walk(pick, false)
}

/// `pick` runs under the entry's lock: it must not call this module.
fn walk(pick: impl Fn(&Info, Option<&Tag>) -> bool, end: bool) -> Vec<u64> {
    let mut found = Vec::new();
    for e in entries() {
        let st = lock(&e.state);
        if st.id != 0 && pick(&st.info, st.tag.as_ref()) && (!end || e.end(&st)) {
            found.push(st.id);
        }
    }
    found.sort_unstable();
    found
}

/// The live sessions that carry a tag, with their byte counters now.
pub fn tagged() -> Vec<Tagged> {
    let mut out = Vec::new();
    for e in entries() {
        let st = lock(&e.state);
        if let Some(tag) = st.tag.as_ref().filter(|_| st.id != 0) {
            out.push(Tagged {
                out: e.bytes.out.load(Ordering::Relaxed),
                inb: e.bytes.inb.load(Ordering::Relaxed),
                tag: tag.clone(),
            });
        }
    }
    out
}

/// Wait, polling, until none of `ids` is registered any more (their
/// threads saw the sockets close and wrote their records), for at most
/// `wait`. False if some are still there.
pub fn wait_gone(ids: &[u64], wait: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + wait;
    loop {
        let live: std::collections::HashSet<u64> = entries()
            .iter()
            .map(|e| lock(&e.state).id)
            .filter(|id| *id != 0)
            .collect();
        if !ids.iter().any(|id| live.contains(id)) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    pub(super) fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn registers_ends_and_forgets() {
        let (mut peer, ours) = pair();
        let (mut srv_peer, srv) = pair();
        let s = register("tcppm", 1, None, &ours, SystemTime::now(), Guard::default());
        let id = s.id();
        s.update(
            None,
            Some("live-test-user"),
            Some("example.org"),
            Some("192.0.2.1:80".parse().unwrap()),
            None,
        );
        s.bytes().out.store(5, Ordering::Relaxed);
        let v = snapshot().into_iter().find(|v| v.id == id).unwrap();
        assert_eq!(v.bytes_out, 5);
        assert_eq!(v.info.user.as_deref(), Some("live-test-user"));
        assert_eq!(v.info.dest().as_deref(), Some("example.org:80"));
        let a = s.attach_server(&srv);
        assert_eq!(end_user("live-test-user"), vec![id]);
        assert!(snapshot().iter().any(|v| v.id == id && v.ended));
        assert!(s.ended());
        assert!(!end(id), "ended twice");
        // Both peers see EOF.
        let mut b = [0u8; 4];
        assert_eq!(peer.read(&mut b).unwrap(), 0);
        assert_eq!(srv_peer.read(&mut b).unwrap(), 0);
        drop(a);
        assert!(!wait_gone(&[id], std::time::Duration::from_millis(20)));
        drop(s);
        assert!(wait_gone(&[id], std::time::Duration::ZERO));
        assert!(snapshot().iter().all(|v| v.id != id));
        assert!(!end(id));
    }

    #[test]
    fn tags_are_handed_back_and_picked_by() {
        let (mut peer, ours) = pair();
        let s = register("tcppm", 1, None, &ours, SystemTime::now(), Guard::default());
        let id = s.id();
        s.update(None, Some("tag-test-user"), None, None, None);
        s.bytes().inb.store(7, Ordering::Relaxed);
        let mine = |t: &Tagged| t.tag.downcast_ref::<String>().map(String::as_str) == Some("sid-1");
        assert!(!tagged().iter().any(mine));
        s.set_tag(Some(Arc::new("sid-1".to_string())));
        let t: Vec<Tagged> = tagged().into_iter().filter(mine).collect();
        assert_eq!((t.len(), t[0].inb), (1, 7));
        let by_tag = |_: &Info, t: Option<&Tag>| {
            t.and_then(|t| t.downcast_ref::<String>())
                .is_some_and(|t| t == "sid-1")
        };
        assert_eq!(find_if(by_tag), vec![id]);
        assert!(!s.ended(), "find_if ends nothing");
        assert_eq!(end_if(by_tag), vec![id]);
        let mut b = [0u8; 1];
        assert_eq!(peer.read(&mut b).unwrap(), 0);
        s.set_tag(None);
        assert!(!tagged().iter().any(mine));
    }

    /// A thread's entry serves its sessions one after another: a later
    /// session starts with nothing of an earlier one, and ending an
    /// earlier one's id (gone) leaves the later one alone.
    #[test]
    fn a_thread_entry_is_reused_and_an_old_id_ends_nothing() {
        let (mut peer, ours) = pair();
        let first = register("tcppm", 1, None, &ours, SystemTime::now(), Guard::default());
        let old = first.id();
        first.update(
            None,
            Some("reuse-test-user"),
            Some("a.example"),
            Some("192.0.2.2:81".parse().unwrap()),
            Some("192.0.2.3:3128".parse().unwrap()),
        );
        first.set_tag(Some(Arc::new("reuse-tag".to_string())));
        first.set_bytes(10, 20);
        let kept = Arc::downgrade(&first.entry.as_ref().unwrap().0);
        drop(first);
        let second = register("socks", 2, None, &ours, SystemTime::now(), Guard::default());
        assert_ne!(second.id(), old);
        let entry = kept.upgrade().expect("the thread keeps its entry");
        assert!(Arc::ptr_eq(&entry, &second.entry.as_ref().unwrap().0));
        drop(entry);
        assert!(!end(old), "an id that is gone ends nothing");
        assert!(end_user("reuse-test-user").is_empty());
        assert!(!second.ended());
        let v = snapshot()
            .into_iter()
            .find(|v| v.id == second.id())
            .unwrap();
        assert_eq!(
            (v.service, v.port, v.bytes_out, v.bytes_in),
            ("socks", 2, 0, 0)
        );
        assert_eq!(v.info, Info::default());
        assert!(snapshot().iter().all(|v| v.id != old));
        let reuse =
            |t: &Tagged| t.tag.downcast_ref::<String>().map(String::as_str) == Some("reuse-tag");
        assert!(!tagged().iter().any(reuse), "the tag went with its session");
        // The second session is still there to be ended.
        assert!(end(second.id()));
        let mut b = [0u8; 1];
        assert_eq!(peer.read(&mut b).unwrap(), 0);
    }

    /// Two sessions at once on one thread each have an entry; each
    /// thread's entries leave the registry when it exits.
    #[test]
    fn nested_sessions_and_exiting_threads() {
        let (_peer, ours) = pair();
        let (_peer2, ours2) = pair();
        let t = std::thread::spawn(move || {
            let a = register("tcppm", 1, None, &ours, SystemTime::now(), Guard::default());
            let b = register(
                "tcppm",
                1,
                None,
                &ours2,
                SystemTime::now(),
                Guard::default(),
            );
            let ids = [a.id(), b.id()];
            let live: Vec<u64> = snapshot().iter().map(|v| v.id).collect();
            assert!(ids.iter().all(|id| live.contains(id)));
            let mine = |e: &Arc<Entry>| {
                let st = lock(&e.state);
                ids.contains(&st.id)
            };
            assert_eq!(entries().iter().filter(|e| mine(e)).count(), 2);
            let weak: Vec<std::sync::Weak<Entry>> = entries()
                .iter()
                .filter(|e| mine(e))
                .map(Arc::downgrade)
                .collect();
            drop(a);
            drop(b);
            assert!(wait_gone(&ids, std::time::Duration::ZERO));
            weak
        });
        let weak = t.join().unwrap();
        // The thread is gone: so are both its entries (one was kept as
        // its spare until it exited). Another test's walk may hold one
        // for a moment.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while weak.iter().any(|w| w.upgrade().is_some()) {
            assert!(
                std::time::Instant::now() < until,
                "an exited thread's entry stayed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
