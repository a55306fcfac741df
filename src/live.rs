//! The live sessions: every client session is registered here while it
//! runs (the admin service's `/sessions`, its sessions page and `/S`),
//! and can be ended from another thread (the admin page's "end" buttons;
//! later RADIUS Disconnect-Request).
//!
//! Cost on the session's path: registering takes one short lock of one of
//! [`SHARDS`] maps (by id) and one allocation; deregistering (the drop of
//! [`Session`], so a panic or an early return still removes it) the same.
//! The byte counters are relaxed atomics the relay adds to where it counts
//! anyway; user, destination and parent are written when a session learns
//! them, under the entry's own lock, which only a snapshot also takes.
//!
//! Ending a session is shutdown(2) of its client socket and, while the
//! relay runs, of its server socket: the session sees EOF on both at once,
//! ends by its usual path and writes its one record, with
//! [`crate::res::Res::ENDED`]. The registry keeps descriptor numbers, not
//! duplicates (no system call per session): a session forgets a number,
//! under the entry's lock, before it closes that socket, and ending takes
//! the same lock, so a number is never used after its socket closed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use crate::sys::sockopt::{shutdown_both, ForeignFd};

/// Maps the registry is split into, so sessions starting on different
/// threads rarely wait for each other.
pub const SHARDS: usize = 16;

type Shard = Mutex<BTreeMap<u64, Arc<Entry>>>;

static REGISTRY: [Shard; SHARDS] = [const { Mutex::new(BTreeMap::new()) }; SHARDS];
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn shard(id: u64) -> &'static Shard {
    &REGISTRY[(id % SHARDS as u64) as usize]
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
    /// The destination asked for: its name, else its address (kept as
    /// an address: formatted only when someone looks), and port.
    pub host: Option<String>,
    pub addr: Option<std::net::IpAddr>,
    pub port: u16,
    /// The first parent the session's connection went through.
    pub parent: Option<SocketAddr>,
}

impl Info {
    /// The destination host: its name, else its address.
    pub fn host_text(&self) -> Option<String> {
        match (&self.host, self.addr) {
            (Some(h), _) => Some(h.clone()),
            (None, Some(a)) => Some(a.to_string()),
            (None, None) => None,
        }
    }

    /// `host:port` (IPv6 in brackets), if a destination is known.
    pub fn dest(&self) -> Option<String> {
        let h = self.host_text()?;
        Some(if h.contains(':') {
            format!("[{h}]:{}", self.port)
        } else {
            format!("{h}:{}", self.port)
        })
    }
}

#[derive(Default)]
struct Fds {
    cli: Option<ForeignFd>,
    srv: Option<ForeignFd>,
}

/// One registered session.
pub struct Entry {
    pub id: u64,
    /// The service's cfg name (`proxy`, `socks`, ...).
    pub service: &'static str,
    /// The port the service listens on (0 for a unix socket).
    pub port: u16,
    pub start: SystemTime,
    pub bytes: Bytes,
    info: Mutex<Info>,
    fds: Mutex<Fds>,
    ended: AtomicBool,
    /// What a layer above hangs on the session ([`Tag`]); None for most.
    tag: Mutex<Option<Tag>>,
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
    /// End the session: shut both its sockets down. False if it was
    /// ended already.
    fn end(&self) -> bool {
        let fds = lock(&self.fds);
        if self.ended.swap(true, Ordering::Relaxed) {
            return false;
        }
        for fd in [&fds.cli, &fds.srv].into_iter().flatten() {
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

/// A session's registration; dropping it removes the session.
pub struct Session(Arc<Entry>);

/// Register a session of service `service` (listening on `port`) from
/// `client`, whose socket is `cli`. `cli` must stay open until the
/// returned [`Session`] is dropped or [`Session::detach`]ed.
pub fn register(
    service: &'static str,
    port: u16,
    client: Option<SocketAddr>,
    cli: &impl AsFd,
) -> Session {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let e = Arc::new(Entry {
        id,
        service,
        port,
        start: SystemTime::now(),
        bytes: Bytes::default(),
        info: Mutex::new(Info {
            client,
            ..Info::default()
        }),
        fds: Mutex::new(Fds {
            cli: Some(ForeignFd::new(cli.as_fd())),
            srv: None,
        }),
        ended: AtomicBool::new(false),
        tag: Mutex::new(None),
    });
    lock(shard(id)).insert(id, e.clone());
    Session(e)
}

impl Session {
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The counters the relay adds to.
    pub fn bytes(&self) -> &Bytes {
        &self.0.bytes
    }

    /// Set the byte counters (at a log record: what the session moved in
    /// all so far).
    pub fn set_bytes(&self, out: u64, inb: u64) {
        self.0.bytes.out.store(out, Ordering::Relaxed);
        self.0.bytes.inb.store(inb, Ordering::Relaxed);
    }

    /// Update what the session knows, allocating only what changed.
    pub fn update(
        &self,
        client: Option<SocketAddr>,
        user: Option<&str>,
        host: Option<&str>,
        addr: Option<std::net::IpAddr>,
        port: u16,
        parent: Option<SocketAddr>,
    ) {
        let mut i = lock(&self.0.info);
        i.client = client;
        if i.user.as_deref() != user {
            i.user = user.map(str::to_string);
        }
        if i.host.as_deref() != host {
            i.host = host.map(str::to_string);
        }
        i.addr = addr;
        i.port = port;
        i.parent = parent;
    }

    /// The session was ended from outside ([`end`], [`end_user`]).
    pub fn ended(&self) -> bool {
        self.0.ended.load(Ordering::Relaxed)
    }

    /// Let [`end`] shut `srv` down too, until the guard is dropped; `srv`
    /// must stay open that long.
    pub fn attach_server(&self, srv: &impl AsFd) -> Attached {
        let mut fds = lock(&self.0.fds);
        if self.ended() {
            // Ended while this socket was being reached.
            shutdown_both(&ForeignFd::new(srv.as_fd()));
        }
        fds.srv = Some(ForeignFd::new(srv.as_fd()));
        Attached(self.0.clone())
    }

    /// Hang `tag` on the session (None takes it off).
    pub fn set_tag(&self, tag: Option<Tag>) {
        *lock(&self.0.tag) = tag;
    }

    /// Forget the client socket (it is about to be closed).
    pub fn detach(&self) {
        let mut fds = lock(&self.0.fds);
        fds.cli = None;
        fds.srv = None;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.detach();
        lock(shard(self.0.id)).remove(&self.0.id);
    }
}

/// A server socket [`end`] may shut down; dropping it takes that back.
pub struct Attached(Arc<Entry>);

impl Drop for Attached {
    fn drop(&mut self) {
        lock(&self.0.fds).srv = None;
    }
}

/// Every live session, by id.
pub fn snapshot() -> Vec<View> {
    let mut out = Vec::new();
    for s in &REGISTRY {
        let entries: Vec<Arc<Entry>> = lock(s).values().cloned().collect();
        for e in entries {
            out.push(View {
                id: e.id,
                service: e.service,
                port: e.port,
                start: e.start,
                bytes_out: e.bytes.out.load(Ordering::Relaxed),
                bytes_in: e.bytes.inb.load(Ordering::Relaxed),
                info: lock(&e.info).clone(),
                ended: e.ended.load(Ordering::Relaxed),
            });
        }
    }
    out.sort_by_key(|v| v.id);
    out
}

/// How many sessions are live.
pub fn count() -> usize {
    REGISTRY.iter().map(|s| lock(s).len()).sum()
}

/// End the session `id`. False if there is none (or it was ended already).
pub fn end(id: u64) -> bool {
    let e = lock(shard(id)).get(&id).cloned();
    e.is_some_and(|e| e.end())
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

fn walk(pick: impl Fn(&Info, Option<&Tag>) -> bool, end: bool) -> Vec<u64> {
    let mut found = Vec::new();
    for s in &REGISTRY {
        let entries: Vec<Arc<Entry>> = lock(s).values().cloned().collect();
        for e in entries {
            let tag = lock(&e.tag).clone();
            let mine = pick(&lock(&e.info), tag.as_ref());
            if mine && (!end || e.end()) {
                found.push(e.id);
            }
        }
    }
    found
}

/// The live sessions that carry a tag, with their byte counters now.
pub fn tagged() -> Vec<Tagged> {
    let mut out = Vec::new();
    for s in &REGISTRY {
        for e in lock(s).values() {
            if let Some(tag) = lock(&e.tag).clone() {
                out.push(Tagged {
                    out: e.bytes.out.load(Ordering::Relaxed),
                    inb: e.bytes.inb.load(Ordering::Relaxed),
                    tag,
                });
            }
        }
    }
    out
}

/// Whether session `id` is still registered.
pub fn is_live(id: u64) -> bool {
    lock(shard(id)).contains_key(&id)
}

/// Wait, polling, until none of `ids` is registered any more (their
/// threads saw the sockets close and wrote their records), for at most
/// `wait`. False if some are still there.
pub fn wait_gone(ids: &[u64], wait: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + wait;
    loop {
        if !ids.iter().any(|&id| is_live(id)) {
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

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn registers_ends_and_forgets() {
        let (mut peer, ours) = pair();
        let (mut srv_peer, srv) = pair();
        let s = register("tcppm", 1, None, &ours);
        let id = s.id();
        s.update(
            None,
            Some("live-test-user"),
            Some("example.org"),
            None,
            80,
            None,
        );
        s.bytes().out.store(5, Ordering::Relaxed);
        let v = snapshot().into_iter().find(|v| v.id == id).unwrap();
        assert_eq!(v.bytes_out, 5);
        assert_eq!(v.info.user.as_deref(), Some("live-test-user"));
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
        let s = register("tcppm", 1, None, &ours);
        let id = s.id();
        s.update(None, Some("tag-test-user"), None, None, 0, None);
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
}
