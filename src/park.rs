//! The parking lot: idle sessions wait here without a thread (issue 19,
//! "park after linger").
//!
//! A session that moved no bytes for its linger (`parklinger`) hands
//! itself to the lot as a [`Parked`]: the sockets to watch, a deadline,
//! and what to do when it must go on. Its thread is then free. One
//! process-wide thread, started with the first park, waits on every
//! parked socket at once (epoll) and, when one becomes readable (or hung
//! up, or in error), when the deadline passes, or after a reload (the
//! session must be checked again, `force`), takes the session out of the
//! lot and calls its [`Parked::resume`], which hands it to a client
//! thread. The lot does no protocol work and no IO on the sessions'
//! sockets: it only waits.
//!
//! After a reload the parked sessions are handed back in small batches,
//! so that a few thousand of them do not start a few thousand threads at
//! once; each is checked again on its thread and parks again at once if
//! it is still allowed and still idle.

use std::collections::{BTreeSet, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Sessions waiting out their linger on their threads right now, in all
/// services (see [`Lingering`]).
static LINGERING: AtomicUsize = AtomicUsize::new(0);
/// Beyond this many sessions lingering at once, a session lingers
/// `CROWDED_DIV` times shorter.
pub const CROWD: usize = 64;
const CROWDED_DIV: u32 = 10;
/// The shortest linger, crowded or not.
const MIN_LINGER: Duration = Duration::from_millis(1);

/// A session waiting out its linger (`parklinger`) on its thread before
/// it parks, counted while it lives. When a burst of clients goes quiet
/// together, each would hold a thread for the whole linger, and the
/// burst needs as many threads as clients arrive within one linger; what
/// those threads and their sessions' transient buffers touch stays in
/// the heap as holes between the parked sessions after the threads have
/// gone (about 2.5 MB after 2,000 clients, issue 19). So beyond
/// [`CROWD`] sessions lingering at once, the next ones linger a tenth as
/// long: a busy client (a request every few ms) still never parks, and a
/// burst needs far fewer threads.
pub struct Lingering(());

impl Lingering {
    /// Start lingering for at most `linger`: the guard, and the linger to
    /// wait (shorter when crowded).
    pub fn start(linger: Duration) -> (Lingering, Duration) {
        let before = LINGERING.fetch_add(1, Ordering::Relaxed);
        let linger = if before >= CROWD {
            (linger / CROWDED_DIV).max(MIN_LINGER).min(linger)
        } else {
            linger
        };
        (Lingering(()), linger)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        LINGERING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A session waiting in the lot.
pub trait Parked: Send {
    /// The sockets whose readiness ends the wait (at least one).
    fn fds(&self) -> Vec<BorrowedFd<'_>>;
    /// Run on the lot's thread when the session must go on: hand it to a
    /// thread and return at once (no IO here). `ready`: one of its
    /// sockets became ready (else its deadline passed or a reload came).
    fn resume(self: Box<Self>, ready: bool);
}

/// Sessions handed back per pass after a reload.
const RELOAD_BATCH: usize = 32;
/// The pause between two batches.
const RELOAD_PAUSE: Duration = Duration::from_millis(2);
/// The epoll key of the lot's own wake-up socket.
const WAKE_KEY: u64 = u64::MAX;

struct Entry {
    p: Box<dyn Parked>,
    deadline: Instant,
}

/// The parked sessions, by key: a slab (a place per session, reused), 40
/// bytes a place where a hash map took about 84 at 2,000 sessions (an
/// idle client's memory, issue 19). A key is the place's index in its low
/// 32 bits and the place's use count in the high ones, so that a key
/// taken out and its place reused is not found again.
#[derive(Default)]
struct Slab {
    places: Vec<Place>,
    free: Vec<u32>,
    len: usize,
}

struct Place {
    uses: u32,
    entry: Option<Entry>,
}

/// A key: the place's use count high, its index low.
fn key(uses: u32, index: u32) -> u64 {
    (u64::from(uses) << 32) | u64::from(index)
}

fn index(key: u64) -> u32 {
    key as u32
}

impl Slab {
    /// A place for a new entry, by its key; [`Slab::fill`] puts the entry
    /// there, [`Slab::release`] gives the place back unused.
    fn vacant(&mut self) -> Option<u64> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                // u32::MAX stays out of reach: WAKE_KEY is all ones.
                let i = u32::try_from(self.places.len())
                    .ok()
                    .filter(|&i| i < u32::MAX)?;
                self.places.push(Place {
                    uses: 0,
                    entry: None,
                });
                i
            }
        };
        let place = &mut self.places[index as usize];
        place.uses = place.uses.wrapping_add(1);
        Some(key(place.uses, index))
    }

    fn fill(&mut self, key: u64, e: Entry) {
        self.places[index(key) as usize].entry = Some(e);
        self.len += 1;
    }

    fn release(&mut self, key: u64) {
        self.free.push(index(key));
    }

    fn remove(&mut self, key: u64) -> Option<Entry> {
        let i = index(key);
        let place = self.places.get_mut(i as usize)?;
        if self::key(place.uses, i) != key {
            return None;
        }
        let e = place.entry.take()?;
        self.free.push(i);
        self.len -= 1;
        Some(e)
    }

    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.places
            .iter()
            .enumerate()
            .filter(|(_, p)| p.entry.is_some())
            .map(|(i, p)| key(p.uses, i as u32))
    }
}

/// The descriptors the lot left in its epoll set, disarmed, when their
/// session went back to a thread (see [`Lot::forget`]): the next park of
/// the same descriptor re-arms its registration (one EPOLL_CTL_MOD)
/// where taking it out and adding it again would cost two calls, one a
/// request for a kept-alive client that parks between its requests. A
/// hint only: a descriptor closed and reused since is found out by the
/// kernel's answer (ENOENT), and one added twice (EEXIST) is modified
/// instead.
#[derive(Default)]
struct Left {
    bits: Vec<u64>,
}

impl Left {
    /// Whether `fd` was left in the set; it is not any more.
    fn take(&mut self, fd: RawFd) -> bool {
        let Ok(i) = usize::try_from(fd) else {
            return false;
        };
        match self.bits.get_mut(i / 64) {
            Some(w) => {
                let was = *w & (1 << (i % 64)) != 0;
                *w &= !(1 << (i % 64));
                was
            }
            None => false,
        }
    }

    fn put(&mut self, fd: RawFd) {
        let Ok(i) = usize::try_from(fd) else { return };
        if self.bits.len() <= i / 64 {
            self.bits.resize(i / 64 + 1, 0);
        }
        self.bits[i / 64] |= 1 << (i % 64);
    }
}

struct State {
    parked: Slab,
    left: Left,
    deadlines: BTreeSet<(Instant, u64)>,
    /// When the lot's thread wakes up by itself next (None: not before
    /// an event). A park with an earlier deadline wakes it.
    wakes_at: Option<Instant>,
    /// A reload happened: every session parked now is to be handed back.
    reloaded: bool,
    /// Keys still to hand back after a reload.
    recheck: VecDeque<u64>,
}

struct Lot {
    epoll: Epoll,
    /// Written to wake the lot's thread; the other end is in the epoll set.
    wake: UnixStream,
    state: Mutex<State>,
}

static LOT: OnceLock<Option<Lot>> = OnceLock::new();

fn lot() -> Option<&'static Lot> {
    LOT.get_or_init(|| match start() {
        Ok(l) => Some(l),
        Err(e) => {
            log::error!("parking lot: cannot start: {e}; sessions keep their threads");
            None
        }
    })
    .as_ref()
}

fn start() -> std::io::Result<Lot> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    let (wake, rx) = UnixStream::pair()?;
    wake.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    epoll.add(&rx, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_KEY))?;
    std::thread::Builder::new()
        .name("parking lot".into())
        .stack_size(64 << 10)
        .spawn(move || {
            // The lot is in LOT by the time the first park returns; the
            // thread waits for it there.
            let lot = loop {
                if let Some(Some(l)) = LOT.get() {
                    break l;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            run(lot, rx)
        })?;
    Ok(Lot {
        epoll,
        wake,
        state: Mutex::new(State {
            parked: Slab::default(),
            left: Left::default(),
            deadlines: BTreeSet::new(),
            wakes_at: None,
            reloaded: false,
            recheck: VecDeque::new(),
        }),
    })
}

impl Lot {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn poke(&self) {
        // A full socket buffer means a wake-up is pending already.
        let _ = (&self.wake).write(&[1]);
    }

    /// Take `e`'s sockets out of the epoll set. `ready`: a socket of its
    /// woke it. A session with one socket woken by it is left in the set:
    /// EPOLLONESHOT disarmed it when its event came, so it reports nothing
    /// more until a park re-arms it ([`Left`]). Any other is taken out: a
    /// deadline or a reload leaves its sockets armed, and a tunnel's other
    /// socket is armed still.
    fn forget(&self, left: &mut Left, e: &Entry, ready: bool) {
        let fds = e.p.fds();
        if ready && fds.len() == 1 {
            left.put(fds[0].as_raw_fd());
            return;
        }
        for fd in fds {
            left.take(fd.as_raw_fd());
            let _ = self.epoll.delete(fd);
        }
    }

    /// Put `fd` in the epoll set, armed for one event with `key`.
    fn arm(&self, left: &mut Left, fd: BorrowedFd<'_>, key: u64) -> nix::Result<()> {
        let ev = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLONESHOT;
        let mut e = EpollEvent::new(ev, key);
        if left.take(fd.as_raw_fd()) {
            match self.epoll.modify(fd, &mut e) {
                Err(Errno::ENOENT) => self.epoll.add(fd, e),
                r => r,
            }
        } else {
            match self.epoll.add(fd, e) {
                Err(Errno::EEXIST) => self.epoll.modify(fd, &mut e),
                r => r,
            }
        }
    }
}

use std::io::Write;

/// Park `p` until one of its sockets is readable, `deadline` passes or a
/// reload comes. `generation`: the reload generation the session was
/// last checked against; if a reload came since (while it was on its way
/// here), it goes back to be checked at once. Err(p) if the lot cannot
/// take it (the caller goes on with the session itself).
pub fn park<P: Parked + 'static>(
    p: Box<P>,
    deadline: Instant,
    generation: u64,
) -> Result<(), Box<P>> {
    let Some(lot) = lot() else { return Err(p) };
    let mut st = lot.state();
    let Some(key) = st.parked.vacant() else {
        return Err(p);
    };
    let fds = p.fds();
    for (i, fd) in fds.iter().enumerate() {
        if lot.arm(&mut st.left, *fd, key).is_err() {
            for fd in &fds[..i] {
                let _ = lot.epoll.delete(fd);
            }
            drop(fds);
            st.parked.release(key);
            return Err(p);
        }
    }
    drop(fds);
    st.parked.fill(key, Entry { p, deadline });
    st.deadlines.insert((deadline, key));
    // Under the lock `reloaded` takes: a reload either finds this
    // session parked, or is seen here.
    if generation != crate::generation::generation() {
        st.recheck.push_back(key);
        drop(st);
        lot.poke();
        return Ok(());
    }
    if st.wakes_at.is_none_or(|t| deadline < t) {
        st.wakes_at = Some(deadline);
        drop(st);
        lot.poke();
    }
    Ok(())
}

/// A reload took effect: every parked session goes back to a thread to be
/// checked again.
pub fn reloaded() {
    let Some(Some(lot)) = LOT.get() else { return };
    let mut st = lot.state();
    if st.parked.len == 0 {
        return;
    }
    st.reloaded = true;
    drop(st);
    lot.poke();
}

/// Sessions in the lot now.
pub fn count() -> usize {
    match LOT.get() {
        Some(Some(lot)) => lot.state().parked.len,
        _ => 0,
    }
}

fn run(lot: &'static Lot, mut rx: UnixStream) {
    let mut events = vec![EpollEvent::empty(); 256];
    // With whether a socket of theirs became ready.
    let mut due: Vec<(Box<dyn Parked>, bool)> = Vec::new();
    loop {
        let timeout = {
            let mut st = lot.state();
            let next = st.deadlines.first().map(|&(d, _)| d);
            st.wakes_at = next;
            let now = Instant::now();
            let mut t = next.map(|d| d.saturating_duration_since(now) + Duration::from_millis(1));
            if !st.recheck.is_empty() {
                t = Some(t.map_or(RELOAD_PAUSE, |t| t.min(RELOAD_PAUSE)));
            }
            match t {
                Some(t) => EpollTimeout::try_from(t).unwrap_or(EpollTimeout::MAX),
                None => EpollTimeout::NONE,
            }
        };
        let n = match lot.epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => {
                log::error!("parking lot: epoll_wait: {e}");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        {
            let mut st = lot.state();
            for ev in &events[..n] {
                let key = ev.data();
                if key == WAKE_KEY {
                    let mut b = [0u8; 64];
                    while matches!(rx.read(&mut b), Ok(n) if n > 0) {}
                    continue;
                }
                if let Some(e) = st.parked.remove(key) {
                    st.deadlines.remove(&(e.deadline, key));
                    lot.forget(&mut st.left, &e, true);
                    due.push((e.p, true));
                }
            }
            let now = Instant::now();
            while let Some(&(d, key)) = st.deadlines.first() {
                if d > now {
                    break;
                }
                st.deadlines.pop_first();
                if let Some(e) = st.parked.remove(key) {
                    lot.forget(&mut st.left, &e, false);
                    due.push((e.p, false));
                }
            }
            if st.reloaded {
                st.reloaded = false;
                let keys: Vec<u64> = st.parked.keys().collect();
                st.recheck.extend(keys);
            }
            let mut taken = 0;
            while taken < RELOAD_BATCH {
                let Some(key) = st.recheck.pop_front() else {
                    break;
                };
                if let Some(e) = st.parked.remove(key) {
                    st.deadlines.remove(&(e.deadline, key));
                    lot.forget(&mut st.left, &e, false);
                    due.push((e.p, false));
                    taken += 1;
                }
            }
        }
        // Outside the lock: a resume may start a thread, and that thread
        // may park again at once.
        for (p, ready) in due.drain(..) {
            p.resume(ready);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::mpsc;

    struct Probe {
        sock: UnixStream,
        /// (id, when, woken by its socket)
        tx: mpsc::Sender<(u8, Instant, bool)>,
        id: u8,
    }

    impl Parked for Probe {
        fn fds(&self) -> Vec<BorrowedFd<'_>> {
            vec![self.sock.as_fd()]
        }
        fn resume(self: Box<Self>, ready: bool) {
            let _ = self.tx.send((self.id, Instant::now(), ready));
        }
    }

    #[test]
    fn readable_and_deadline_wake_in_order() {
        let (tx, rx) = mpsc::channel();
        let (a, mut a_peer) = UnixStream::pair().unwrap();
        let (b, _b_peer) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let far = start + Duration::from_secs(60);
        let g = crate::generation::generation();
        let one = Probe {
            sock: a,
            tx: tx.clone(),
            id: 1,
        };
        assert!(park(Box::new(one), far, g).is_ok());
        let soon = start + Duration::from_millis(150);
        assert!(park(Box::new(Probe { sock: b, tx, id: 2 }), soon, g).is_ok());
        // Nothing is due yet.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        a_peer.write_all(b"x").unwrap();
        let (id, _, ready) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(id, 1, "the readable one first");
        assert!(ready, "woken by its socket");
        let (id, at, ready) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(id, 2);
        assert!(!ready, "woken by its deadline, not its socket");
        assert!(at >= soon, "woken before its deadline");
        assert!(
            at < soon + Duration::from_secs(1),
            "woken late: {:?}",
            at - soon
        );
    }

    /// A probe that gives its socket back when it resumes.
    struct Returns {
        sock: UnixStream,
        tx: mpsc::Sender<(UnixStream, bool)>,
    }

    impl Parked for Returns {
        fn fds(&self) -> Vec<BorrowedFd<'_>> {
            vec![self.sock.as_fd()]
        }
        fn resume(self: Box<Self>, ready: bool) {
            let _ = self.tx.send((self.sock, ready));
        }
    }

    #[test]
    fn a_socket_left_in_the_set_wakes_again_when_parked_again() {
        let (tx, rx) = mpsc::channel();
        let (mut sock, mut peer) = UnixStream::pair().unwrap();
        let g = crate::generation::generation();
        let far = Instant::now() + Duration::from_secs(60);
        for round in 0..3u8 {
            let p = Returns {
                sock,
                tx: tx.clone(),
            };
            assert!(park(Box::new(p), far, g).is_ok());
            assert!(
                rx.recv_timeout(Duration::from_millis(30)).is_err(),
                "round {round}: woken with nothing to read"
            );
            peer.write_all(&[round]).unwrap();
            let (back, ready) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(ready, "round {round}: not woken by its socket");
            sock = back;
            let mut b = [0u8; 1];
            sock.read_exact(&mut b).unwrap();
            assert_eq!(b[0], round);
        }
        // Left in the set, then parked again with a near deadline and
        // nothing to read: the deadline wakes it, once.
        let soon = Instant::now() + Duration::from_millis(50);
        let p = Returns {
            sock,
            tx: tx.clone(),
        };
        assert!(park(Box::new(p), soon, g).is_ok());
        let (sock, ready) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(!ready, "woken by its socket with nothing sent");
        // Taken out of the set: data now wakes nobody.
        peer.write_all(b"x").unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(sock);
    }

    #[test]
    fn a_slab_key_taken_out_is_not_found_again_when_its_place_is_reused() {
        let (tx, _rx) = mpsc::channel();
        let entry = |id| {
            let (sock, _) = UnixStream::pair().unwrap();
            Entry {
                p: Box::new(Probe {
                    sock,
                    tx: tx.clone(),
                    id,
                }),
                deadline: Instant::now(),
            }
        };
        let mut slab = Slab::default();
        let k1 = slab.vacant().unwrap();
        slab.fill(k1, entry(1));
        let k2 = slab.vacant().unwrap();
        slab.fill(k2, entry(2));
        assert_eq!(slab.len, 2);
        assert!(slab.remove(k1).is_some());
        assert!(slab.remove(k1).is_none(), "taken out twice");
        let k3 = slab.vacant().unwrap();
        slab.fill(k3, entry(3));
        assert_eq!(index(k3), index(k1), "the place is reused");
        assert_ne!(k3, k1);
        assert!(slab.remove(k1).is_none(), "the old key finds the new entry");
        let mut keys: Vec<u64> = slab.keys().collect();
        keys.sort();
        let mut want = vec![k2, k3];
        want.sort();
        assert_eq!(keys, want);
        let k4 = slab.vacant().unwrap();
        slab.release(k4);
        assert!(slab.remove(k4).is_none(), "a released place holds nothing");
        assert_eq!(slab.len, 2);
    }
}
