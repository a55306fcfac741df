//! The ODBC access log (`log &DSN[,USER[,PASSWORD]]`, 3proxy's sql.c
//! `logsql`): each record is an SQL statement, the `logformat` expanded
//! by [`LogFormat::render_sql`](crate::logformat::LogFormat::render_sql),
//! executed on a data source through unixODBC's driver manager.
//!
//! One writer thread per target owns the connection. Client threads only
//! count the record into the target's bound (`odbcqueue`) and hand it
//! over, never waiting: when the bound is reached (the database is away
//! or slower than the traffic), the record is dropped and counted, and
//! the writer logs the count at most once per [`DROP_REPORT`]. The
//! writer connects on the first record; when a statement fails it
//! reconnects and tries once more (a connection the server has closed).
//! When that fails too, a round ([`Writer::round`]) tries up to
//! [`PROBES`] - 1 other waiting records: if one is written, the database
//! works and the records that failed in the round are refused, dropped
//! with a warning; if none is (or no connection could be made), the
//! database is taken as away: nothing is dropped, the records stay in
//! order, and the next round comes after a delay that doubles from
//! [`RETRY_MIN`] to [`RETRY_MAX`]. The probes start where the last
//! round's stopped, so a run of bad records cannot hide the good ones
//! behind it for long. A statement-level SQLSTATE class (42 syntax, 23
//! constraint, ...) drops its record at once.
//!
//! Values a client chooses are parameters of the statement, never its
//! text (see `render_sql`): a quote in a user name or URL is stored as
//! a quote.
//!
//! Reload: a `log &...` line naming the same target with the same queue
//! size as a running writer gets that writer, queue and all; a changed
//! one gets a new writer, and the old one writes what is queued and what
//! the sessions of the old cfg still log, then ends when the last of them
//! is gone (or, if its database stays away, [`CLOSE_GRACE`] after that).
//! At exit, [`flush`] waits for the queues to drain.
//!
//! Linking: odbc-sys is built with `vendored-unix-odbc`, unixODBC's
//! driver manager compiled from source into the binary. So the binary
//! needs no libodbc to start, and the drivers (and their libodbcinst)
//! are loaded with dlopen only when a `log &` target connects.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use odbc_api::parameter::VarCharSlice;
use odbc_api::{Connection, ConnectionOptions, Environment};

use crate::logformat::SqlRecord;

/// Records a target's queue holds when the cfg sets no `odbcqueue`.
pub const DEFAULT_QUEUE: usize = 10000;
/// The largest `odbcqueue`.
pub const MAX_QUEUE: usize = 10_000_000;
/// First delay before trying a database that went away again.
const RETRY_MIN: Duration = Duration::from_millis(250);
/// The delay stops doubling here.
const RETRY_MAX: Duration = Duration::from_secs(8);
/// Dropped records are reported at most this often.
pub const DROP_REPORT: Duration = Duration::from_secs(5);
/// The writer's tick while nothing arrives: drop reports, the end.
const TICK: Duration = Duration::from_millis(500);
/// How long a writer no cfg uses any more keeps trying a database that
/// is away before it gives its records up.
const CLOSE_GRACE: Duration = Duration::from_secs(30);
/// How long an exit waits for the ODBC queues (a statement is slower
/// than a line in a file).
pub const EXIT_FLUSH: Duration = Duration::from_secs(3);
/// SQLConnect's login timeout, as 3proxy sets it.
const LOGIN_TIMEOUT_S: u32 = 15;
/// A statement taking longer than this counts as failed.
const QUERY_TIMEOUT_S: usize = 30;

/// One `log &DSN[,USER[,PASSWORD]]` target.
pub struct SqlLog {
    dsn: String,
    /// What the cfg wrote after `&`, and the queue size: a reload that
    /// names the same keeps this writer.
    key: (String, usize),
    tx: Sender<Msg>,
    shared: Arc<Shared>,
    /// The writer, until its thread starts with the first record (after
    /// `daemon`'s fork: threads do not survive a fork).
    writer: Mutex<Option<Writer>>,
    started: Once,
}

impl std::fmt::Debug for SqlLog {
    // Never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqlLog(&{})", self.dsn)
    }
}

struct Shared {
    /// Records queued and not written (or given up) yet: in the channel
    /// and in the writer's hands. Never above the queue size.
    queued: AtomicUsize,
    /// Records dropped since the last report.
    dropped: AtomicU64,
    /// No cfg uses this writer any more.
    closed: AtomicBool,
}

enum Msg {
    Rec(SqlRecord),
    Flush(Sender<()>),
}

/// The data source and credentials of a `log &...` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub dsn: String,
    pub user: String,
    pub password: String,
}

impl Target {
    /// `DSN[,USER[,PASSWORD]]` (what follows the `&`). The password is
    /// the rest of the line's argument, commas and all.
    pub fn parse(s: &str) -> Result<Target, String> {
        let mut it = s.splitn(3, ',');
        let dsn = it.next().unwrap_or("").to_string();
        if dsn.is_empty() {
            return Err("'&' names no ODBC data source (log &DSN[,USER[,PASSWORD]])".into());
        }
        Ok(Target {
            dsn,
            user: it.next().unwrap_or("").to_string(),
            password: it.next().unwrap_or("").to_string(),
        })
    }
}

/// Every live target, for reuse across reloads and for [`flush`].
static TARGETS: Mutex<Vec<Weak<SqlLog>>> = Mutex::new(Vec::new());

impl SqlLog {
    /// The writer for `log &spec` with a queue of `queue` records: the
    /// running one if the cfg before named the same, else a new one.
    /// Nothing connects until the first record.
    pub fn open(spec: &str, queue: usize) -> Result<Arc<SqlLog>, String> {
        let target = Target::parse(spec)?;
        let key = (spec.to_string(), queue);
        let mut all = TARGETS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        if let Some(live) = all.iter().filter_map(Weak::upgrade).find(|l| l.key == key) {
            return Ok(live);
        }
        // The bound is `Shared::queued`: the writer takes records out of
        // the channel as they come, to try them in any order.
        let (tx, rx) = unbounded();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let w = Writer {
            name: format!("access log &{}", target.dsn),
            target: target.clone(),
            queue,
            rx,
            shared: shared.clone(),
            conn: None,
            rejected: 0,
            reject_warned: None,
        };
        let log = Arc::new(SqlLog {
            dsn: target.dsn,
            key,
            tx,
            shared,
            writer: Mutex::new(Some(w)),
            started: Once::new(),
        });
        all.push(Arc::downgrade(&log));
        Ok(log)
    }

    pub fn name(&self) -> String {
        format!("&{}", self.dsn)
    }

    /// Check `log &spec` for `3proxy -t`: nothing is opened.
    pub fn check(spec: &str) -> Result<(), String> {
        Target::parse(spec).map(|_| ())
    }

    /// Queue one record; never waits. A full queue drops it (counted).
    pub fn push(&self, rec: SqlRecord) {
        self.started.call_once(|| {
            let Some(w) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                return;
            };
            if let Err(e) = std::thread::Builder::new()
                .name("sqllog".into())
                .spawn(move || w.run())
            {
                log::error!(
                    "access log {}: cannot start its writer thread: {e}",
                    self.name()
                );
            }
        });
        let sh = &self.shared;
        let taken = sh
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.key.1).then_some(n + 1)
            })
            .is_ok();
        if !taken || self.tx.send(Msg::Rec(rec)).is_err() {
            if taken {
                sh.queued.fetch_sub(1, Ordering::AcqRel);
            }
            sh.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for SqlLog {
    fn drop(&mut self) {
        // The sender drops with `self`: the writer drains the queue and ends.
        self.shared.closed.store(true, Ordering::Relaxed);
    }
}

/// Wait until every ODBC target has written what was queued so far, for
/// at most `limit` in all (at exit). What is still queued then is lost,
/// and said so.
pub fn flush(limit: Duration) {
    let deadline = Instant::now() + limit;
    let live: Vec<Arc<SqlLog>> = TARGETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for l in live.into_iter().filter(|l| l.started.is_completed()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (done_tx, done_rx) = bounded(1);
        let flushed = l.tx.send_timeout(Msg::Flush(done_tx), left).is_ok()
            && done_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_ok();
        if !flushed {
            log::warn!(
                "access log {}: about {} records not written at exit: the database did not take them in time",
                l.name(),
                l.shared.queued.load(Ordering::Relaxed)
            );
        }
    }
}

/// The process's one ODBC environment, made on first use (by a writer
/// thread, so a host without drivers pays nothing unless it logs to SQL).
fn environment() -> Result<&'static Environment, String> {
    static ENV: OnceLock<Result<Environment, String>> = OnceLock::new();
    ENV.get_or_init(|| Environment::new().map_err(|e| one_line(&e)))
        .as_ref()
        .map_err(Clone::clone)
}

/// An ODBC error as one line: SQLSTATE and the driver's message.
fn one_line(e: &odbc_api::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a record was not written.
enum Fail {
    /// The database refused this statement for what it is (SQLSTATE).
    Rejected(String),
    /// No connection could be made: the database is away.
    Unreachable(String),
    /// Connected, but the statement failed: the database is away (or
    /// refuses writes), or this record is bad; other records tell.
    Failed(String),
}

/// At most this many records are tried in one round while they fail,
/// to tell a database that is away from records it refuses.
const PROBES: usize = 3;

/// SQLSTATE classes that blame the statement, not the connection: 07
/// dynamic SQL, 21 cardinality, 22 data, 23 constraint, 42 syntax or
/// access rule, 44 check option.
fn statement_error(e: &odbc_api::Error) -> bool {
    match e {
        odbc_api::Error::Diagnostics { record, .. } => {
            matches!(
                &record.state.0[..2],
                b"07" | b"21" | b"22" | b"23" | b"42" | b"44"
            )
        }
        _ => false,
    }
}

struct Writer {
    name: String,
    target: Target,
    queue: usize,
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    conn: Option<Connection<'static>>,
    /// Records the database refused and not reported yet.
    rejected: u64,
    /// When a refusal was last reported with its reason.
    reject_warned: Option<Instant>,
}

impl Writer {
    fn run(mut self) {
        // Records taken out of the channel, oldest first.
        let mut pending: VecDeque<SqlRecord> = VecDeque::new();
        let mut waiters: Vec<Sender<()>> = Vec::new();
        let mut delay = RETRY_MIN;
        let mut next_try = Instant::now();
        let mut down_since: Option<Instant> = None;
        let mut last_report: Option<Instant> = None;
        // When the writer, with its database away, saw that no cfg uses
        // it any more.
        let mut closed_at: Option<Instant> = None;
        // Where the next round's probes start (see `round`).
        let mut cursor = 1;
        loop {
            self.report(&mut last_report, false);
            // Take what has come; wait only when there is nothing to do.
            let first = if pending.is_empty() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                match self.rx.recv_timeout(TICK) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => {
                        self.report(&mut last_report, true);
                        return;
                    }
                }
            } else {
                None
            };
            for m in first
                .into_iter()
                .chain(std::iter::from_fn(|| self.rx.try_recv().ok()))
            {
                match m {
                    Msg::Rec(r) => pending.push_back(r),
                    // Done when what came before it is written.
                    Msg::Flush(done) if pending.is_empty() => {
                        let _ = done.send(());
                    }
                    Msg::Flush(done) => waiters.push(done),
                }
            }
            if pending.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now < next_try {
                if self.shared.closed.load(Ordering::Relaxed)
                    && now.duration_since(*closed_at.get_or_insert(now)) >= CLOSE_GRACE
                {
                    self.give_up(&mut pending, &mut last_report);
                    return;
                }
                std::thread::sleep((next_try - now).min(TICK));
                continue;
            }
            match self.round(&mut pending, &mut cursor) {
                None => self.back_up(&mut down_since, &mut delay),
                Some(err) => {
                    self.conn = None;
                    if down_since.is_none() {
                        down_since = Some(now);
                        log::warn!(
                            "{}: {err}; records wait in memory (at most {}) until the database takes them",
                            self.name,
                            self.queue
                        );
                    }
                    next_try = Instant::now() + delay;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Write the first pending record; if it fails on a working
    /// connection, try up to [`PROBES`] - 1 others, from `cursor` on
    /// (so that a run of bad records cannot hide the good ones behind
    /// them round after round). One written means the database works:
    /// the records that failed in this round are refused, and dropped.
    /// None when something was written (or dropped as refused); the
    /// error when the database looks away.
    fn round(&mut self, pending: &mut VecDeque<SqlRecord>, cursor: &mut usize) -> Option<String> {
        let err = match self.write(&pending[0]) {
            Ok(()) => {
                self.done(pending.pop_front());
                return None;
            }
            Err(Fail::Rejected(e)) => {
                self.done(pending.pop_front());
                self.reject(&e);
                return None;
            }
            Err(Fail::Unreachable(e)) => return Some(e),
            Err(Fail::Failed(e)) => e,
        };
        let mut failed = vec![0];
        let mut refused = Vec::new();
        let mut written = None;
        let n = pending.len();
        let mut i = (*cursor).max(1);
        for _ in 1..PROBES.min(n) {
            if i >= n {
                i = 1;
            }
            match self.write(&pending[i]) {
                Ok(()) => {
                    written = Some(i);
                    break;
                }
                Err(Fail::Rejected(e)) => refused.push((i, e)),
                Err(Fail::Unreachable(_)) => break,
                Err(Fail::Failed(_)) => failed.push(i),
            }
            i += 1;
        }
        *cursor = i;
        let mut gone: Vec<usize> = refused.iter().map(|(i, _)| *i).collect();
        for (_, e) in &refused {
            self.reject(e);
        }
        if let Some(w) = written {
            gone.push(w);
            for &f in &failed {
                self.reject(&err);
                gone.push(f);
            }
        }
        gone.sort_unstable();
        for &g in gone.iter().rev() {
            let r = pending.remove(g);
            self.done(r);
        }
        if *cursor > pending.len() {
            *cursor = 1;
        }
        // Only a written record shows that the database works.
        match written {
            Some(_) => None,
            None => Some(err),
        }
    }

    /// A record left the queue (written or dropped).
    fn done(&self, r: Option<SqlRecord>) {
        if r.is_some() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A record was written: if the database was away, it is back.
    fn back_up(&self, down_since: &mut Option<Instant>, delay: &mut Duration) {
        if let Some(t) = down_since.take() {
            log::warn!(
                "{}: the database takes records again (it was away for {} s)",
                self.name,
                t.elapsed().as_secs()
            );
        }
        *delay = RETRY_MIN;
    }

    /// A refused record: its reason at most once per [`DROP_REPORT`], the
    /// others counted for [`Writer::report`].
    fn reject(&mut self, e: &str) {
        if self
            .reject_warned
            .is_none_or(|t| t.elapsed() >= DROP_REPORT)
        {
            self.reject_warned = Some(Instant::now());
            log::warn!("{}: a record was refused and dropped: {e}", self.name);
        } else {
            self.rejected += 1;
        }
    }

    /// Say how many records were dropped (at most once per
    /// [`DROP_REPORT`], or now with `now`).
    fn report(&mut self, last: &mut Option<Instant>, now: bool) {
        if !now && last.is_some_and(|t| t.elapsed() < DROP_REPORT) {
            return;
        }
        let n = self.shared.dropped.swap(0, Ordering::Relaxed);
        if n > 0 {
            log::warn!(
                "{}: {n} records dropped: the queue of {} records was full (the database is away or too slow)",
                self.name,
                self.queue
            );
        }
        let r = std::mem::take(&mut self.rejected);
        if r > 0 {
            log::warn!(
                "{}: {r} more records refused by the database and dropped",
                self.name
            );
        }
        if n > 0 || r > 0 || now {
            *last = Some(Instant::now());
        }
    }

    /// No cfg uses this writer and its database stayed away: drop what
    /// is left, say how much, end.
    fn give_up(&mut self, pending: &mut VecDeque<SqlRecord>, last: &mut Option<Instant>) {
        let mut n = pending.len() as u64;
        pending.clear();
        while let Ok(m) = self.rx.try_recv() {
            if let Msg::Rec(_) = m {
                n += 1;
            }
        }
        self.shared.queued.store(0, Ordering::Release);
        self.shared.dropped.fetch_add(n, Ordering::Relaxed);
        self.report(last, true);
    }

    /// Execute one record, connecting first if need be. A failure on a
    /// connection made earlier reconnects and tries once more.
    fn write(&mut self, rec: &SqlRecord) -> Result<(), Fail> {
        let fresh = self.conn.is_none();
        if fresh {
            self.conn = Some(self.connect().map_err(Fail::Unreachable)?);
        }
        match self.execute(rec) {
            Ok(()) => return Ok(()),
            Err(e) if statement_error(&e) => return Err(Fail::Rejected(one_line(&e))),
            Err(e) if fresh => return Err(Fail::Failed(one_line(&e))),
            Err(_) => {}
        }
        self.conn = None;
        self.conn = Some(self.connect().map_err(Fail::Unreachable)?);
        match self.execute(rec) {
            Ok(()) => Ok(()),
            Err(e) if statement_error(&e) => Err(Fail::Rejected(one_line(&e))),
            Err(e) => Err(Fail::Failed(one_line(&e))),
        }
    }

    fn connect(&self) -> Result<Connection<'static>, String> {
        let env = environment()?;
        let opts = ConnectionOptions {
            login_timeout_sec: Some(LOGIN_TIMEOUT_S),
            ..ConnectionOptions::default()
        };
        env.connect(
            &self.target.dsn,
            &self.target.user,
            &self.target.password,
            opts,
        )
        .map_err(|e| one_line(&e))
    }

    fn execute(&self, rec: &SqlRecord) -> Result<(), odbc_api::Error> {
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let statement = String::from_utf8_lossy(&rec.statement);
        let params: Vec<VarCharSlice<'_>> =
            rec.params.iter().map(|p| VarCharSlice::new(p)).collect();
        conn.execute(&statement, &params[..], Some(QUERY_TIMEOUT_S))
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_fields() {
        let t = Target::parse("logdb,root,pa,ss").unwrap();
        assert_eq!(
            (t.dsn.as_str(), t.user.as_str(), t.password.as_str()),
            ("logdb", "root", "pa,ss")
        );
        let t = Target::parse("logdb").unwrap();
        assert_eq!((t.user.as_str(), t.password.as_str()), ("", ""));
        assert!(Target::parse("").is_err());
        assert!(Target::parse(",root").is_err());
    }

    #[test]
    fn same_target_same_writer() {
        let a = SqlLog::open("threeproxy-test-dsn,u,p", 10).unwrap();
        let b = SqlLog::open("threeproxy-test-dsn,u,p", 10).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = SqlLog::open("threeproxy-test-dsn,u,p", 11).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(format!("{a:?}"), "SqlLog(&threeproxy-test-dsn)");
    }
}
