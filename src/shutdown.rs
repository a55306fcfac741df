//! A normal exit, on SIGTERM or SIGINT (3proxy's `timetoexit`): stop
//! accepting, give the sessions still running a bounded grace time to end,
//! write out what is buffered, exit 0.
//!
//! Stopping the listeners is `running::stop_all`; this file counts live
//! sessions over every service (a reload leaves old sessions on old
//! snapshots, so the per-service counts do not cover them all) and runs the
//! final steps. 3proxy waits about 3 s and does not wait for sessions at
//! all; we wait at most as long, and less when the last session ends first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for live sessions at exit (3proxy's three one-second ticks).
pub const GRACE: Duration = Duration::from_secs(3);
/// Longest wait for the access log to drain at exit.
const LOG_FLUSH: Duration = Duration::from_secs(1);
/// Longest wait for the RADIUS accounting queue at exit.
const RADIUS_FLUSH: Duration = Duration::from_secs(5);

/// Sessions (TCP clients, UDP associations) in progress.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A session began (a client took a service slot).
pub fn session_started() {
    LIVE.fetch_add(1, Ordering::AcqRel);
}

/// A session ended (its slot was freed).
pub fn session_ended() {
    // Never below zero, whatever the order of calls.
    let _ = LIVE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// Sessions in progress.
pub fn live() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// The end of a normal exit, after the listeners are closed: wait up to
/// `grace` for live sessions to end (their access-log records are written
/// as they end), drain the log writer, remove the pid file.
pub fn finish(grace: Duration) {
    let deadline = Instant::now() + grace;
    while live() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = live();
    if left > 0 {
        log::info!("exiting with {left} sessions still open");
    }
    // Traffic counters are written once a second; write the last changes
    // now, so a stop loses none (3proxy can lose up to a minute).
    crate::limit::flush_counters();
    crate::log::flush(LOG_FLUSH);
    // `log radius`: the Stops of the sessions that ended are sent.
    crate::radius::flush(RADIUS_FLUSH);
    crate::sys::process::remove_pidfile();
}
