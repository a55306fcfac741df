//! Sessions under pressure (`maxconn`'s slot reclaim and `minrate`):
//! which session a service at `maxconn` closes so that a client waiting
//! in its backlog gets the slot ([`reclaim`]), and the sessions that wait
//! for a request head or a handshake while sending less than their
//! service's `minrate` ([`sweep`], every second on a thread of its own).
//!
//! A session tells the registry what it is doing by three atomics of its
//! entry that only it writes, a relaxed store each and no lock: its
//! [`Phase`] (busy in an exchange or a relay, idle between two requests
//! of a kept-alive connection, or waiting for a head), since when, and
//! how many bytes of the head it has. A session of a service that reads
//! a head or a handshake first begins waiting for one ([`Guard::head`]).
//!
//! The victim of a reclaim is the idle session quiet longest (it may
//! connect again; a client is told by the close, as when its idle
//! timeout ends it); without one, the session that has waited longest
//! for its head, at least [`RECLAIM_AGE`], while sending below its
//! service's `minrate` over that time. Each only if the waiting client
//! is worth more (see [`reclaim`]). A busy session is never chosen.
//! The choice is a compare-exchange of the victim's phase, which races
//! with the session's own change to busy (a swap, [`Registration::busy`]):
//! either the session was still waiting when it was chosen and learns so,
//! or it is not closed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{clock, lock, EndedBy, Entry, Phase, Registration, REGISTRY};

/// A waiting head is reclaimed only once it has waited this long: a
/// client that has just connected may not have been read yet. Short, so
/// that a backlog of slow clients drains in a few rounds: at `maxconn`
/// N with a backlog of B, the last one is in after about B/N x this.
pub const RECLAIM_AGE: Duration = Duration::from_millis(100);

/// An idle kept-alive client is closed only for a waiting client that has
/// sent at least this much (an HTTP request line; a TLS ClientHello):
/// not for one of a crowd that sends a byte or nothing.
pub const IDLE_OFFER: usize = 16;

/// How often the sweeper looks for heads below their `minrate`.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Registration {
    /// Kept alive between two requests, since `at`.
    pub fn idle(&self, at: Instant) {
        let e = self.entry();
        e.since.store(clock(at), Ordering::Relaxed);
        e.got.store(0, Ordering::Relaxed);
        e.phase.store(Phase::Idle as u8, Ordering::Relaxed);
    }

    /// Part of a head is in: `got` bytes so far. A session that was idle
    /// begins waiting for the rest now.
    pub fn head(&self, got: usize) {
        let e = self.entry();
        if e.phase.load(Ordering::Relaxed) != Phase::Head as u8 {
            e.since.store(clock(Instant::now()), Ordering::Relaxed);
            e.phase.store(Phase::Head as u8, Ordering::Relaxed);
        }
        e.got
            .store(u32::try_from(got).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// The head or handshake is in: the session is busy. False if it had
    /// been chosen to be closed (its sockets are shut down, or about to
    /// be: it should end now).
    pub fn busy(&self) -> bool {
        let was = self
            .entry()
            .phase
            .swap(Phase::Busy as u8, Ordering::Relaxed);
        was != Phase::Taken as u8
    }

    /// What the session is doing now.
    pub fn phase(&self) -> Phase {
        match self.entry().phase.load(Ordering::Relaxed) {
            1 => Phase::Idle,
            2 => Phase::Head,
            3 => Phase::Taken,
            _ => Phase::Busy,
        }
    }
}

/// A head of `got` bytes that began at `since` is, at `now` (ms), below
/// `rate` bytes a second.
fn below(rate: u32, got: u32, since: u64, now: u64) -> bool {
    let age = now.saturating_sub(since);
    rate > 0 && u64::from(got) * 1000 < u64::from(rate) * age
}

/// Close one session of the service `key` so that its slot goes to a
/// waiting client that has sent `offer` bytes (see the module doc); what
/// it was doing, or None if no session may be closed. A waiting client
/// is worth a slot only against what it would replace: an idle session
/// only if it has sent IDLE_OFFER bytes or more, a slow head only if it
/// has sent more than that head has, or the head is past its `minrate`
/// grace (the sweeper would close it within a second anyway). So a crowd
/// that reconnects as fast as it is closed does not turn the slots over
/// among itself.
pub fn reclaim(key: usize, now: Instant, offer: usize) -> Option<Phase> {
    if key == 0 {
        return None;
    }
    let now = clock(now);
    let min_age = RECLAIM_AGE.as_millis() as u64;
    // The best so far: (rank, since) ordered, idle (0) before heads (1),
    // the oldest first.
    let mut best: Option<(u8, u64, Arc<Entry>)> = None;
    for shard in &REGISTRY {
        let s = lock(shard);
        for e in s.slots.iter().flatten() {
            let phase = e.phase.load(Ordering::Relaxed);
            let rank = match phase {
                p if p == Phase::Idle as u8 && offer >= IDLE_OFFER => 0,
                p if p == Phase::Head as u8 => 1,
                _ => continue,
            };
            let since = e.since.load(Ordering::Relaxed);
            if best.as_ref().is_some_and(|b| (b.0, b.1) <= (rank, since)) {
                continue;
            }
            if e.ended.load(Ordering::Relaxed) != 0 {
                continue;
            }
            let st = lock(&e.state);
            if st.id == 0 || st.guard.key != key {
                continue;
            }
            if rank == 1 {
                let got = e.got.load(Ordering::Relaxed);
                let age = now.saturating_sub(since);
                let worth = offer > got as usize || age >= u64::from(st.guard.grace_ms);
                if age < min_age || !below(st.guard.rate, got, since, now) || !worth {
                    continue;
                }
            }
            best = Some((rank, since, e.clone()));
        }
    }
    let (rank, _, e) = best?;
    let phase = if rank == 0 { Phase::Idle } else { Phase::Head };
    let st = lock(&e.state);
    if st.guard.key != key || !take(&e, phase) {
        return None;
    }
    e.end_by(&st, EndedBy::Reclaim).then_some(phase)
}

/// Mark `e`, found in `phase`, as chosen; false if it has moved on.
fn take(e: &Entry, phase: Phase) -> bool {
    e.phase
        .compare_exchange(
            phase as u8,
            Phase::Taken as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_ok()
}

/// Close every session whose head, after its grace, is below its
/// service's `minrate`; how many were closed.
pub fn sweep(now: Instant) -> usize {
    sweep_services(now, |_| true)
}

/// [`sweep`] of the services whose key `pick` takes.
fn sweep_services(now: Instant, pick: impl Fn(usize) -> bool) -> usize {
    let now = clock(now);
    let mut closed = 0;
    for shard in &REGISTRY {
        let s = lock(shard);
        for e in s.slots.iter().flatten() {
            if e.phase.load(Ordering::Relaxed) != Phase::Head as u8 {
                continue;
            }
            let st = lock(&e.state);
            let since = e.since.load(Ordering::Relaxed);
            let g = st.guard;
            if st.id == 0
                || !pick(g.key)
                || now.saturating_sub(since) < u64::from(g.grace_ms)
                || !below(g.rate, e.got.load(Ordering::Relaxed), since, now)
            {
                continue;
            }
            if take(e, Phase::Head) && e.end_by(&st, EndedBy::Slow) {
                closed += 1;
            }
        }
    }
    closed
}

/// Start the sweeper (once for the process): [`sweep`] every second.
pub fn start_sweeper() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("minrate".into())
            .stack_size(64 * 1024)
            .spawn(|| loop {
                std::thread::sleep(SWEEP_EVERY);
                sweep(Instant::now());
            });
        if let Err(e) = spawned {
            log::error!("cannot start the minrate thread: {e}; slow heads wait for their timeouts");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::pair;
    use super::super::{register, Guard};
    use super::*;
    use std::io::Read;
    use std::time::SystemTime;

    fn guard(key: usize) -> Guard {
        Guard {
            key,
            head: true,
            rate: 100,
            grace_ms: 3000,
        }
    }

    #[test]
    fn below_the_rate() {
        // 100 B/s over 2 s wants 200 bytes.
        assert!(below(100, 199, 1000, 3000));
        assert!(!below(100, 200, 1000, 3000));
        assert!(!below(0, 0, 0, 1_000_000), "rate 0 is no least");
    }

    /// Idle before heads, the oldest first, only of the service asked
    /// for, never a busy one, and a head only once it is old enough.
    #[test]
    fn reclaim_order() {
        let key = 0x5eed_0001;
        let (mut p_busy, busy) = pair();
        let (mut p_head, head) = pair();
        let (mut p_idle, idle) = pair();
        let (_p_other, other) = pair();
        let start = SystemTime::now();
        let b = register("proxy", 1, None, &busy, start, guard(key));
        assert!(b.busy());
        let h = register("proxy", 1, None, &head, start, guard(key));
        let i = register("proxy", 1, None, &idle, start, guard(key));
        i.idle(Instant::now());
        let o = register("proxy", 2, None, &other, start, guard(0x5eed_0100));
        o.idle(Instant::now() - Duration::from_secs(60));
        // The head is too young to be taken; the idle one goes first.
        assert_eq!(reclaim(key, Instant::now(), 100), Some(Phase::Idle));
        assert_eq!(i.ended_by(), Some(EndedBy::Reclaim));
        let mut buf = [0u8; 1];
        assert_eq!(p_idle.read(&mut buf).unwrap(), 0);
        assert_eq!(reclaim(key, Instant::now(), 100), None, "the head is young");
        let later = Instant::now() + RECLAIM_AGE + Duration::from_millis(10);
        assert_eq!(reclaim(key, later, 100), Some(Phase::Head));
        assert_eq!(p_head.read(&mut buf).unwrap(), 0);
        assert!(!h.busy(), "a taken session learns it");
        assert_eq!(reclaim(key, later + Duration::from_secs(60), 100), None);
        assert!(!b.ended() && !o.ended());
        p_busy.set_nonblocking(true).unwrap();
        assert!(p_busy.read(&mut buf).is_err(), "the busy one is open");
    }

    /// A head that keeps its rate is not taken; below it, it is.
    #[test]
    fn reclaim_spares_a_head_at_its_rate() {
        let key = 0x5eed_0002;
        let (_p, s) = pair();
        let h = register("proxy", 1, None, &s, SystemTime::now(), guard(key));
        h.head(10_000);
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(reclaim(key, later, 100_000), None);
        h.head(150);
        assert_eq!(reclaim(key, later, 100_000), Some(Phase::Head));
    }

    /// A waiting client is worth a slot only against what it replaces:
    /// an idle session for IDLE_OFFER bytes, a slow head for more bytes
    /// than it has, or once the head is past its grace.
    #[test]
    fn reclaim_weighs_the_waiting_client() {
        let key = 0x5eed_0004;
        let (_pi, idle) = pair();
        let (_ph, head) = pair();
        let start = SystemTime::now();
        let i = register("proxy", 1, None, &idle, start, guard(key));
        i.idle(Instant::now());
        let h = register("proxy", 1, None, &head, start, guard(key));
        h.head(2);
        let soon = Instant::now() + RECLAIM_AGE + Duration::from_millis(10);
        // One byte: neither the idle session nor a head of two bytes.
        assert_eq!(reclaim(key, soon, 1), None);
        assert_eq!(reclaim(key, soon, 2), None);
        // Three bytes: the head, still not the idle one.
        assert_eq!(reclaim(key, soon, 3), Some(Phase::Head));
        assert!(!i.ended());
        assert_eq!(reclaim(key, soon, IDLE_OFFER - 1), None);
        assert_eq!(reclaim(key, soon, IDLE_OFFER), Some(Phase::Idle));
        // Past its grace a head goes for anyone.
        let (_pl, late) = pair();
        let l = register("proxy", 1, None, &late, start, guard(key));
        l.head(5);
        let past = Instant::now() + Duration::from_secs(4);
        assert_eq!(reclaim(key, past, 0), Some(Phase::Head));
        assert!(l.ended());
    }

    /// The sweeper closes a head below its rate after the grace (the
    /// reading side only), and leaves busy, idle and fast ones.
    #[test]
    fn sweep_closes_slow_heads_after_the_grace() {
        let key = 0x5eed_0003;
        let (mut p_slow, slow) = pair();
        let (_p_fast, fast) = pair();
        let (_p_idle, idle) = pair();
        let start = SystemTime::now();
        let s = register("socks", 3, None, &slow, start, guard(key));
        let f = register("socks", 3, None, &fast, start, guard(key));
        f.head(1_000_000);
        let i = register("socks", 3, None, &idle, start, guard(key));
        i.idle(Instant::now());
        let mine = |k| k == key;
        sweep_services(Instant::now() + Duration::from_secs(1), mine);
        assert!(!s.ended(), "within the grace");
        sweep_services(Instant::now() + Duration::from_secs(4), mine);
        assert_eq!(s.ended_by(), Some(EndedBy::Slow));
        assert!(!f.ended() && !i.ended());
        // Only its reading side: the peer can still be answered.
        use std::io::Write;
        let mut w = slow.try_clone().unwrap();
        w.write_all(b"408").unwrap();
        let mut buf = [0u8; 3];
        p_slow.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"408");
    }
}
