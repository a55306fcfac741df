//! The access log's targets (3proxy's log.c `dolog`, `logstdout`,
//! `logsyslog`; 3proxy.c's rotation in the main loop; conf.c `dologname`):
//! where finished sessions are written, and the rotation of log files.
//!
//! A client thread formats its record into a buffer of its own and hands
//! the buffer to one log-writer thread through a bounded queue; only that
//! thread touches files and sockets. So a slow disk, a full pipe on stdout
//! or a stuck syslog daemon delays the log, never a client: when the queue
//! is full, a client waits at most [`QUEUE_WAIT`] and then drops its record
//! (the writer warns how many were dropped).
//!
//! Invariants: a record is formatted once and written with one write() (a
//! file is opened with O_APPEND; standard output is written to its
//! descriptor, not through Rust's buffer), so lines never interleave; a
//! record a failed write cut short is taken back, or where it cannot be
//! (a pipe), followed by a newline before the next (`Loss`); only the
//! writer thread writes, rotates and runs the archiver, never a client
//! thread; the writer starts with the first record, after the cfg has
//! loaded and after `daemon`'s fork; at a normal exit [`flush`] waits for
//! the queue to drain. Diagnostics (start-up, errors) go through the `log`
//! crate to stderr, never here.
//!
//! Rotation (`log FILE c|H|D|W|M|Y`, `rotate N`, `archiver EXT CMD...`): the
//! file's name gets a suffix for the period, `.YYYY[.MM[.DD[-HH[.MM]]]]`
//! (weekly files are named after the week's Sunday), unless the name holds a
//! `%`: then it is a template with the logformat time escapes. All in local
//! time. The writer checks the period at most once a second and at least
//! once a second even when nothing is logged, so files change on time, as
//! 3proxy's main loop does. On a change it opens the new file and, if
//! `rotate` N is set (as in 3proxy, not otherwise), deletes the file
//! (archived, if there is an archiver) of N periods ago and runs the
//! archiver on the file it just closed. A template is expanded with the
//! start of the period (3proxy uses the time of the check), so the name of
//! any period's file is known and `rotate` deletes the file that was
//! written. A cfg's rotating files take part in the checks only once that
//! cfg serves (`commit_files`): a reload that fails changes nothing.
//!
//! Syslog: a datagram to the syslog socket waits at most [`SYSLOG_WAIT`]
//! for room; after one such wait ran out, records are sent only if there
//! is room at once, and otherwise dropped and counted (the writer warns
//! how many), until the daemon reads again. So a stuck daemon costs the
//! writer one short wait, never a stall of the file logs behind it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use crate::conf::token::quote;
use crate::logformat::{LogFormat, LogRecord};
use crate::sqllog::SqlLog;
use crate::sys::process::Owner;
use crate::sys::time;

/// Records waiting for the writer, at most.
const QUEUE_LEN: usize = 16384;
/// How long a client waits for room in a full queue before it drops its
/// record.
const QUEUE_WAIT: Duration = Duration::from_millis(100);
/// The writer's tick: rotation checks and dropped-record warnings.
const TICK: Duration = Duration::from_secs(1);
/// Env var naming a file that holds seconds to add to the rotation clock.
/// A test hook (see 3proxy.cfg(5)): tests move time without waiting.
pub const CLOCK_OFFSET_ENV: &str = "THREEPROXY_TEST_CLOCK_OFFSET";
/// Env var overriding the syslog socket path (default `/dev/log`).
pub const SYSLOG_SOCKET_ENV: &str = "THREEPROXY_SYSLOG_SOCKET";
/// Longest wait for room in the syslog socket before a record is dropped.
const SYSLOG_WAIT: Duration = Duration::from_millis(20);

/// Where access-log records go.
#[derive(Debug)]
pub enum Sink {
    Stdout,
    File(FileLog),
    /// `log @ident`, `-l@ident`.
    Syslog {
        ident: String,
    },
    /// `log &DSN[,USER[,PASSWORD]]`: ODBC, with a writer of its own
    /// (`sqllog`).
    Sql(Arc<SqlLog>),
    /// `log radius`: a session's record is a RADIUS Accounting-Request
    /// (the `Client` sends it, `crate::radius`); other lines go nowhere.
    Radius,
}

impl Sink {
    /// `log` / `-l`: standard output.
    pub fn stdout() -> Arc<Sink> {
        Arc::new(Sink::Stdout)
    }

    /// `-lFILE`: a file that is never rotated (as in 3proxy).
    pub fn open(path: &str, user: Owner) -> io::Result<Arc<Sink>> {
        Sink::rotating(path, Period::Never, user)
    }

    /// `log FILE [PERIOD]`: the file for the current period, opened now so
    /// an error names the cfg line. A rotating file joins the writer's
    /// rotation checks only when its cfg is committed ([`commit_files`]),
    /// so a cfg that fails to load leaves the running logs as they were.
    pub fn rotating(name: &str, period: Period, user: Owner) -> io::Result<Arc<Sink>> {
        let f = FileLog::open(name, period, clock(), user)?;
        let sink = Arc::new(Sink::File(f));
        if period != Period::Never {
            PENDING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::downgrade(&sink));
        }
        Ok(sink)
    }

    /// `3proxy -t` for `log FILE [PERIOD]` and `-lFILE`: whether the file
    /// of the current period could be opened, creating and changing
    /// nothing.
    pub fn check_file(name: &str, period: Period) -> io::Result<()> {
        let template = name.contains('%').then(|| LogFormat::template(name));
        let (key, start) = period_of(period, clock());
        let path = PathBuf::from(file_name(name, template.as_ref(), period, key, start));
        crate::sys::process::check_writable(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: {e}", quote(path.as_os_str().as_encoded_bytes())),
            )
        })
    }

    /// `log @ident`: syslog, facility daemon, severity info.
    pub fn syslog(ident: &str) -> Arc<Sink> {
        let ident = if ident.is_empty() { "3proxy" } else { ident };
        Arc::new(Sink::Syslog {
            ident: ident.to_string(),
        })
    }

    pub fn name(&self) -> String {
        match self {
            Sink::Stdout => "stdout".into(),
            Sink::File(f) => f.current_path().display().to_string(),
            Sink::Syslog { ident } => format!("syslog @{ident}"),
            Sink::Sql(db) => db.name(),
            Sink::Radius => "radius".into(),
        }
    }

    /// Write one record (ending in a newline) with a single call. Runs on
    /// the writer thread (or on the caller's, if no writer could start).
    fn write_line(&self, line: &[u8]) {
        let res = match self {
            Sink::Stdout => {
                // Straight to the descriptor, not through Rust's line
                // buffer: a record a full disk cut short must be known,
                // so that the next starts on a line of its own (the
                // buffer kept the cut tail and glued the next record to
                // what it then wrote).
                use std::os::fd::AsFd;
                let mut loss = STDOUT_LOSS.lock().unwrap_or_else(|e| e.into_inner());
                loss.write(
                    &"stdout",
                    line,
                    |b| nix::unistd::write(io::stdout().as_fd(), b).map_err(io::Error::from),
                    |n| {
                        // Only a regular file can be cut back (a pipe or
                        // a terminal has the bytes already).
                        use std::io::Seek;
                        let mut f = File::from(io::stdout().as_fd().try_clone_to_owned()?);
                        let m = f.metadata()?;
                        if !m.is_file() {
                            return Err(io::ErrorKind::Unsupported.into());
                        }
                        let len = m.len().saturating_sub(n as u64);
                        f.set_len(len)?;
                        // Opened without O_APPEND (a shell's `>`), the
                        // descriptor's offset (shared with the copy) must
                        // come back too, or the next write leaves a hole.
                        f.seek(io::SeekFrom::Start(len)).map(drop)
                    },
                );
                Ok(())
            }
            Sink::File(f) => f.write(line),
            Sink::Syslog { ident } => syslog_send(ident, line),
            // Records for a database go to its own writer (`emit`).
            Sink::Sql(_) => Ok(()),
            Sink::Radius => Ok(()),
        };
        if let Err(e) = res {
            warn_limited(&format!("access log {}: {e}", self.name()));
        }
    }
}

/// Format `rec` with `fmt` and queue it for `sink` as one line.
pub fn emit(sink: &Arc<Sink>, fmt: &LogFormat, rec: &LogRecord<'_>) {
    if let Sink::Sql(db) = &**sink {
        db.push(fmt.render_sql(rec));
        return;
    }
    if matches!(**sink, Sink::Radius) {
        return;
    }
    let mut line = Vec::with_capacity(256);
    fmt.render(rec, &mut line);
    line.push(b'\n');
    match writer() {
        Some(tx) => match tx.send_timeout(Msg::Line(sink.clone(), line), QUEUE_WAIT) {
            Ok(()) => {}
            Err(SendTimeoutError::Timeout(_) | SendTimeoutError::Disconnected(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        },
        None => sink.write_line(&line),
    }
}

/// Wait until every record queued so far is written, for at most `limit`
/// (at exit, so the last sessions' records are not lost).
/// The ODBC targets then get [`sqllog::EXIT_FLUSH`](crate::sqllog::EXIT_FLUSH)
/// of their own (at least `limit`), after the files, so a slow database
/// cannot cost the file records.
pub fn flush(limit: Duration) {
    if let Some(Some(tx)) = WRITER.get() {
        let (done_tx, done_rx) = bounded(1);
        if tx.send_timeout(Msg::Flush(done_tx), limit).is_ok() {
            let _ = done_rx.recv_timeout(limit);
        }
    }
    crate::sqllog::flush(limit.max(crate::sqllog::EXIT_FLUSH));
}

/// The cfg that opened the rotating files since the last call is the one
/// that serves now: its files join the once-a-second rotation check, and
/// each takes over deleting and archiving from the running file of the
/// same name. After a reload, that old target may live on with the
/// sessions that use it: it still follows the periods (when it writes),
/// but only the newest deletes and archives, so that is done once.
pub fn commit_files() {
    let pending = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()));
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    for w in pending {
        let Some(new) = w.upgrade() else { continue };
        let Sink::File(nf) = &*new else { continue };
        files.retain(|w| match w.upgrade() {
            None => false,
            Some(old) => match &*old {
                Sink::File(f) if f.name == nf.name => {
                    f.owner.store(false, Ordering::Relaxed);
                    false
                }
                _ => true,
            },
        });
        files.push(w);
    }
}

/// The cfg that opened the rotating files since the last commit failed to
/// load: forget them; the running files keep their rotation duties.
pub fn discard_files() {
    PENDING.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The process-wide `rotate` and `archiver` settings (3proxy keeps them
/// global and reads them at each rotation). Set when the cfg has loaded.
pub fn set_rotation(rotate: u32, archiver: Option<Vec<String>>) {
    *POLICY.lock().unwrap_or_else(|e| e.into_inner()) = Policy { rotate, archiver };
}

// ---------------------------------------------------------------------------
// The writer thread

enum Msg {
    Line(Arc<Sink>, Vec<u8>),
    Flush(Sender<()>),
}

static WRITER: OnceLock<Option<Sender<Msg>>> = OnceLock::new();
/// Records dropped because the queue stayed full.
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Every log file that rotates, for the writer's once-a-second check.
static FILES: Mutex<Vec<Weak<Sink>>> = Mutex::new(Vec::new());
/// Rotating files opened by a cfg that is still loading.
static PENDING: Mutex<Vec<Weak<Sink>>> = Mutex::new(Vec::new());

#[derive(Debug, Default)]
struct Policy {
    rotate: u32,
    /// `archiver EXT CMD...` as the cfg gave it, EXT first.
    archiver: Option<Vec<String>>,
}

static POLICY: Mutex<Policy> = Mutex::new(Policy {
    rotate: 0,
    archiver: None,
});

/// The queue to the writer, which starts on first use. None if the thread
/// could not be started: records are then written by the caller.
fn writer() -> Option<&'static Sender<Msg>> {
    WRITER
        .get_or_init(|| {
            let (tx, rx) = bounded(QUEUE_LEN);
            match std::thread::Builder::new()
                .name("log".into())
                .spawn(move || write_loop(rx))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    log::error!("cannot start the log writer thread: {e}");
                    None
                }
            }
        })
        .as_ref()
}

fn write_loop(rx: Receiver<Msg>) {
    let mut next_tick = Instant::now() + TICK;
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Msg::Line(sink, line)) => {
                if let Sink::File(f) = &*sink {
                    f.maybe_rotate(clock());
                }
                sink.write_line(&line);
            }
            Ok(Msg::Flush(done)) => {
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + TICK;
            tick();
        }
    }
}

fn tick() {
    let files: Vec<Arc<Sink>> = FILES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let now = clock();
    for s in files {
        if let Sink::File(f) = &*s {
            f.maybe_rotate(now);
        }
    }
    let n = DROPPED.swap(0, Ordering::Relaxed);
    if n > 0 {
        log::warn!("access log: {n} records dropped: the log target is too slow");
    }
    let n = SYSLOG_DROPPED.swap(0, Ordering::Relaxed);
    if n > 0 {
        log::warn!("access log: {n} records dropped: the syslog daemon does not read them");
    }
}

/// A warning at most once a minute (a dead log target fails every record).
fn warn_limited(msg: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *last = Some(Instant::now());
        log::warn!("{msg}");
    }
}

/// The rotation clock: Unix seconds, plus the test offset when the
/// [`CLOCK_OFFSET_ENV`] hook is set (read at every check, so a test can
/// move time while the proxy runs).
pub(crate) fn clock() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    static HOOK: OnceLock<Option<PathBuf>> = OnceLock::new();
    let hook = HOOK.get_or_init(|| std::env::var_os(CLOCK_OFFSET_ENV).map(PathBuf::from));
    let offset = hook
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0);
    now.saturating_add(offset)
}

// ---------------------------------------------------------------------------
// Log files and their periods

/// How often a `log` file changes (3proxy's ROTATION; the letter after the
/// file name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Never,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Period {
    /// The rotation letter: `c` minutely, `H` hourly, `D` daily, `W`
    /// weekly, `M` monthly, `Y` yearly, in either case. None for any other
    /// letter (3proxy then silently never rotates).
    pub fn from_letter(s: &str) -> Option<Period> {
        Some(match s.chars().next()?.to_ascii_lowercase() {
            'c' => Period::Minute,
            'h' => Period::Hour,
            'd' => Period::Day,
            'w' => Period::Week,
            'm' => Period::Month,
            'y' => Period::Year,
            _ => return None,
        })
    }

    /// Seconds in a period (months and years on average); only used to
    /// step from one period to another, then snapped to the calendar.
    fn nominal(self) -> i64 {
        match self {
            Period::Never => 0,
            Period::Minute => 60,
            Period::Hour => 3600,
            Period::Day => 86_400,
            Period::Week => 7 * 86_400,
            // 400 Gregorian years have 146097 days.
            Period::Month => 146_097 * 86_400 / 4800,
            Period::Year => 146_097 * 86_400 / 400,
        }
    }
}

/// A period in local time: year, month, day, hour, minute, with the fields
/// finer than the period zeroed (a week: the date of its Sunday).
type Key = (i32, u32, u32, u32, u32);

/// Days since 1970-01-01 of a date the C library gave (so a real one;
/// 0 for one the calendar has not, which no clock reads).
fn days_from_civil(year: i32, mon: u32, mday: u32) -> i64 {
    time::days_from_civil(year, mon, mday).unwrap_or(0)
}

/// The period containing `t`, and the time it began.
fn period_of(p: Period, t: i64) -> (Key, i64) {
    let tm = time::local(t);
    let day_secs = i64::from(tm.hour) * 3600 + i64::from(tm.min) * 60 + i64::from(tm.sec.min(59));
    let (y, mo, d, h, mi) = (tm.year, tm.mon, tm.mday, tm.hour, tm.min);
    match p {
        Period::Never => ((0, 0, 0, 0, 0), t),
        Period::Minute => ((y, mo, d, h, mi), t - i64::from(tm.sec.min(59))),
        Period::Hour => (
            (y, mo, d, h, 0),
            t - i64::from(mi) * 60 - i64::from(tm.sec.min(59)),
        ),
        Period::Day => ((y, mo, d, 0, 0), t - day_secs),
        Period::Week => {
            let sunday = days_from_civil(y, mo, d) - i64::from(tm.wday);
            let s = time::utc(sunday * 86_400);
            (
                (s.year, s.mon, s.mday, 0, 0),
                t - i64::from(tm.wday) * 86_400 - day_secs,
            )
        }
        Period::Month => ((y, mo, 0, 0, 0), t - i64::from(d - 1) * 86_400 - day_secs),
        Period::Year => {
            let yday = days_from_civil(y, mo, d) - days_from_civil(y, 1, 1);
            ((y, 0, 0, 0, 0), t - yday * 86_400 - day_secs)
        }
    }
}

/// The period `n` periods before the one containing `t`.
fn periods_back(p: Period, t: i64, n: u32) -> (Key, i64) {
    let (_, start) = period_of(p, t);
    let mid = start + p.nominal() / 2;
    period_of(p, mid - i64::from(n) * p.nominal())
}

/// The file name for a period: `name` plus the period's suffix, or the
/// template expanded at the period's start.
fn file_name(name: &str, template: Option<&LogFormat>, p: Period, key: Key, start: i64) -> String {
    if let Some(t) = template {
        let mut out = Vec::new();
        t.render(&template_record(start), &mut out);
        return String::from_utf8_lossy(&out).into_owned();
    }
    let (y, mo, d, h, mi) = key;
    match p {
        Period::Never => name.to_string(),
        Period::Year => format!("{name}.{y:04}"),
        Period::Month => format!("{name}.{y:04}.{mo:02}"),
        Period::Day | Period::Week => format!("{name}.{y:04}.{mo:02}.{d:02}"),
        Period::Hour => format!("{name}.{y:04}.{mo:02}.{d:02}-{h:02}"),
        Period::Minute => format!("{name}.{y:04}.{mo:02}.{d:02}-{h:02}.{mi:02}"),
    }
}

/// The name of a period's file, as for a `log` file of period `p`, for
/// the period containing `t` (a `%` template is expanded at `t` itself).
/// For the `counter` reports.
pub(crate) fn period_file_name(name: &str, p: Period, t: i64) -> String {
    let template = name.contains('%').then(|| LogFormat::template(name));
    let (key, _) = period_of(p, t);
    file_name(name, template.as_ref(), p, key, t)
}

/// A record with nothing but a time, for expanding a file name template.
fn template_record(t: i64) -> LogRecord<'static> {
    LogRecord::blank("", UNIX_EPOCH + Duration::from_secs(t.max(0) as u64))
}

/// A log file, and its rotation.
#[derive(Debug)]
pub struct FileLog {
    /// The name as the cfg gave it.
    name: String,
    period: Period,
    /// Set when the name contains `%`.
    template: Option<LogFormat>,
    /// Whether this target deletes and archives old files at rotation.
    owner: AtomicBool,
    /// Who gets the files this target creates while we are root.
    user: Owner,
    cur: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    file: File,
    path: PathBuf,
    key: Key,
    /// The clock second of the last rotation check.
    checked: i64,
    loss: Loss,
}

/// What a target's failed writes (a full disk) left: records lost, and
/// whether the last one was cut short.
#[derive(Debug, Default)]
struct Loss {
    /// Records lost since writing began to fail: the failure is reported
    /// once when it starts, and the count once when a record is written
    /// again.
    lost: u64,
    /// A failed write left part of a record that could not be taken
    /// back (standard output on a pipe or a terminal): the next record
    /// starts on a line of its own.
    torn: bool,
}

/// Standard output's [`Loss`]: one descriptor, however many `log` lines
/// name it.
static STDOUT_LOSS: Mutex<Loss> = Mutex::new(Loss {
    lost: 0,
    torn: false,
});

impl Loss {
    /// Write one record with `write` (one call, unless it writes less),
    /// after a newline if a cut record was left before it. A record that
    /// cannot be written is lost: the first loss is reported, then
    /// nothing until a record is written again, which reports how many
    /// were lost. A record cut short (a full disk) is taken back with
    /// `undo` (given how many of its bytes were written), so that no
    /// partial record stays; where that fails, the next record starts
    /// on a line of its own.
    fn write(
        &mut self,
        name: &dyn std::fmt::Display,
        line: &[u8],
        write: impl FnMut(&[u8]) -> io::Result<usize>,
        undo: impl FnOnce(usize) -> io::Result<()>,
    ) {
        let res = if self.torn {
            let mut whole = Vec::with_capacity(line.len() + 1);
            whole.push(b'\n');
            whole.extend_from_slice(line);
            write_record(write, &whole)
        } else {
            write_record(write, line)
        };
        match res {
            Ok(()) => {
                self.torn = false;
                if self.lost > 0 {
                    log::warn!(
                        "access log {name}: writing again; {} records were lost",
                        self.lost
                    );
                    self.lost = 0;
                }
            }
            Err((e, written)) => {
                if written > 0 && undo(written).is_err() {
                    self.torn = true;
                }
                self.lost += 1;
                if self.lost == 1 {
                    log::warn!(
                        "access log {name}: {e}; records are lost until it can be written again"
                    );
                }
            }
        }
    }
}

/// Open a log file for appending; a new one is made with 3proxy's mode
/// (fopen's 0666 before the umask) and given to `owner`.
fn append(path: &Path, owner: Owner) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.append(true);
    crate::sys::process::open_or_create(&opts, path, 0o666, owner)
}

/// Write all of `buf` with `write`; on an error, also say how much was
/// written.
fn write_record(
    mut write: impl FnMut(&[u8]) -> io::Result<usize>,
    buf: &[u8],
) -> Result<(), (io::Error, usize)> {
    let mut done = 0;
    while done < buf.len() {
        match write(&buf[done..]) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), done)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, done)),
        }
    }
    Ok(())
}

impl FileLog {
    fn open(name: &str, period: Period, now: i64, user: Owner) -> io::Result<FileLog> {
        let template = name.contains('%').then(|| LogFormat::template(name));
        let (key, start) = period_of(period, now);
        let path = PathBuf::from(file_name(name, template.as_ref(), period, key, start));
        let file = append(&path, user).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: {e}", quote(path.as_os_str().as_encoded_bytes())),
            )
        })?;
        Ok(FileLog {
            name: name.to_string(),
            period,
            template,
            owner: AtomicBool::new(true),
            user,
            cur: Mutex::new(Current {
                file,
                path,
                key,
                checked: now,
                loss: Loss::default(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.cur.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current_path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    /// Append one record (see [`Loss::write`]).
    fn write(&self, line: &[u8]) -> io::Result<()> {
        let mut cur = self.lock();
        let Current {
            file, path, loss, ..
        } = &mut *cur;
        let mut f: &File = file;
        loss.write(
            &path.display(),
            line,
            |b| f.write(b),
            |n| {
                // Appended by this thread alone: the last n bytes are
                // the cut record's.
                let len = file.metadata()?.len();
                file.set_len(len.saturating_sub(n as u64))
            },
        );
        Ok(())
    }

    /// Switch files if the period has changed since the last check (at
    /// most one check per clock second).
    fn maybe_rotate(&self, now: i64) {
        if self.period == Period::Never {
            return;
        }
        let mut cur = self.lock();
        if cur.checked == now {
            return;
        }
        cur.checked = now;
        let (key, start) = period_of(self.period, now);
        if key == cur.key {
            return;
        }
        let name =
            |k: Key, s: i64| file_name(&self.name, self.template.as_ref(), self.period, k, s);
        let path = PathBuf::from(name(key, start));
        let old = std::mem::replace(&mut cur.path, path.clone());
        cur.key = key;
        match append(&path, self.user) {
            Ok(f) => {
                cur.file = f;
                cur.loss.torn = false;
            }
            Err(e) => {
                // Keep writing to the old file; try again next period.
                log::warn!("log rotation: cannot open {}: {e}", path.display());
                cur.path = old;
                return;
            }
        }
        drop(cur);
        if old == path || !self.owner.load(Ordering::Relaxed) {
            return;
        }
        // As in 3proxy, `rotate 0` (the default) turns both the deletion
        // and the archiver off.
        let policy = POLICY.lock().unwrap_or_else(|e| e.into_inner());
        if policy.rotate == 0 {
            return;
        }
        let ext = policy.archiver.as_ref().and_then(|a| a.first());
        let (k, s) = periods_back(self.period, now, policy.rotate);
        let mut gone = name(k, s);
        if let Some(ext) = ext {
            gone = format!("{gone}.{ext}");
        }
        if gone != path.to_string_lossy() {
            let _ = std::fs::remove_file(&gone);
        }
        if let Some(a) = &policy.archiver {
            let cmd = archiver_command(a, &old.to_string_lossy());
            run_archiver(cmd);
        }
    }
}

/// The shell command for `archiver EXT CMD...` on the closed file `old`:
/// the words of CMD joined by spaces, with a word `%A` replaced by the
/// archive's name (`old.EXT`) and `%F` by `old`, both quoted for the shell.
fn archiver_command(archiver: &[String], old: &str) -> String {
    let ext = archiver.first().map(String::as_str).unwrap_or("");
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    archiver[1..]
        .iter()
        .map(|w| match w.as_str() {
            "%A" => quote(&format!("{old}.{ext}")),
            "%F" => quote(old),
            _ => w.clone(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run the archiver through /bin/sh; a thread of its own waits for it, so
/// a long compression does not hold up the log.
fn run_archiver(cmd: String) {
    let spawned = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&cmd)
        .stdin(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => {
            let _ = std::thread::Builder::new()
                .name("archiver".into())
                .spawn(move || match child.wait() {
                    Ok(st) if !st.success() => {
                        log::warn!("archiver: '{}' exited with {st}", quote(&cmd))
                    }
                    Err(e) => log::warn!("archiver: '{}': {e}", quote(&cmd)),
                    Ok(_) => {}
                });
        }
        Err(e) => log::warn!("archiver: cannot run /bin/sh: {e}"),
    }
}

// ---------------------------------------------------------------------------
// Syslog

/// The connection to the syslog daemon, shared by every `@ident` target.
static SYSLOG: Mutex<Option<Syslog>> = Mutex::new(None);
/// Syslog records dropped because the daemon's socket stayed full.
static SYSLOG_DROPPED: AtomicU64 = AtomicU64::new(0);

struct Syslog {
    sock: UnixDatagram,
    /// A send found no room within [`SYSLOG_WAIT`]: the socket is
    /// non-blocking until a send succeeds again.
    stuck: bool,
}

impl Syslog {
    /// Send one datagram. Ok(false): no room, the record is dropped.
    fn send(&mut self, msg: &[u8]) -> io::Result<bool> {
        match self.sock.send(msg) {
            Ok(_) => {
                if self.stuck {
                    self.stuck = false;
                    self.sock.set_nonblocking(false)?;
                }
                Ok(true)
            }
            // EAGAIN: SO_SNDTIMEO ran out, or no room now while stuck.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !self.stuck {
                    self.stuck = true;
                    self.sock.set_nonblocking(true)?;
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

fn syslog_path() -> PathBuf {
    std::env::var_os(SYSLOG_SOCKET_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/log"))
}

fn syslog_connect() -> io::Result<Syslog> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(syslog_path())?;
    sock.set_write_timeout(Some(SYSLOG_WAIT))?;
    Ok(Syslog { sock, stuck: false })
}

/// Connect to the syslog socket now, if it can be reached. `chroot` calls
/// this first, so `log @ident` keeps working inside a new root that has no
/// `/dev/log`.
pub fn syslog_preconnect() {
    let mut s = SYSLOG.lock().unwrap_or_else(|e| e.into_inner());
    if s.is_none() {
        *s = syslog_connect().ok();
    }
}

/// The RFC 3164 message a local syslog daemon expects: priority (facility
/// daemon, severity info), local time stamp, `ident[pid]: `, the record.
fn syslog_message(ident: &str, pid: u32, t: i64, line: &[u8]) -> Vec<u8> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // LOG_DAEMON (3) * 8 + LOG_INFO (6).
    const PRI: u32 = 3 * 8 + 6;
    let tm = time::local(t);
    let mon = MONTHS[(tm.mon.clamp(1, 12) - 1) as usize];
    let mut m = format!(
        "<{PRI}>{mon} {:>2} {:02}:{:02}:{:02} {ident}[{pid}]: ",
        tm.mday, tm.hour, tm.min, tm.sec
    )
    .into_bytes();
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    m.extend_from_slice(line);
    m
}

fn syslog_send(ident: &str, line: &[u8]) -> io::Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let msg = syslog_message(ident, std::process::id(), now, line);
    let mut s = SYSLOG.lock().unwrap_or_else(|e| e.into_inner());
    let sent = match s.as_mut().map(|sock| sock.send(&msg)) {
        Some(Ok(sent)) => sent,
        // Not connected yet, or the daemon restarted: connect again once.
        None | Some(Err(_)) => {
            let sock = s.insert(syslog_connect()?);
            sock.send(&msg)?
        }
    };
    if !sent {
        SYSLOG_DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Unit tests run in the test binary's zone; these use instants and check
    // only what holds in any zone, or use UTC through the name template.

    #[test]
    fn letters() {
        assert_eq!(Period::from_letter("c"), Some(Period::Minute));
        assert_eq!(Period::from_letter("C"), Some(Period::Minute));
        assert_eq!(Period::from_letter("H"), Some(Period::Hour));
        assert_eq!(Period::from_letter("d"), Some(Period::Day));
        assert_eq!(Period::from_letter("W"), Some(Period::Week));
        assert_eq!(Period::from_letter("m"), Some(Period::Month));
        assert_eq!(Period::from_letter("Y"), Some(Period::Year));
        assert_eq!(Period::from_letter("x"), None);
        assert_eq!(Period::from_letter(""), None);
    }

    fn name_at(name: &str, p: Period, t: i64) -> String {
        let template = name.contains('%').then(|| LogFormat::template(name));
        let (k, s) = period_of(p, t);
        file_name(name, template.as_ref(), p, k, s)
    }

    #[test]
    fn suffixes_per_period() {
        let t = 1_700_000_000; // some instant
        let tm = time::local(t);
        let ymd = format!("{:04}.{:02}.{:02}", tm.year, tm.mon, tm.mday);
        assert_eq!(name_at("a.log", Period::Never, t), "a.log");
        assert_eq!(
            name_at("a.log", Period::Year, t),
            format!("a.log.{:04}", tm.year)
        );
        assert_eq!(
            name_at("a.log", Period::Month, t),
            format!("a.log.{:04}.{:02}", tm.year, tm.mon)
        );
        assert_eq!(name_at("a.log", Period::Day, t), format!("a.log.{ymd}"));
        assert_eq!(
            name_at("a.log", Period::Hour, t),
            format!("a.log.{ymd}-{:02}", tm.hour)
        );
        assert_eq!(
            name_at("a.log", Period::Minute, t),
            format!("a.log.{ymd}-{:02}.{:02}", tm.hour, tm.min)
        );
    }

    #[test]
    fn weeks_are_named_after_their_sunday() {
        let t = 1_700_000_000;
        let (key, start) = period_of(Period::Week, t);
        let s = time::local(start);
        assert_eq!(s.wday, 0, "the week starts on a Sunday");
        assert_eq!((key.0, key.1, key.2), (s.year, s.mon, s.mday));
        // Every instant of that week gives the same name.
        for d in 0..7 {
            assert_eq!(period_of(Period::Week, start + d * 86_400 + 3_600).0, key);
        }
    }

    #[test]
    fn a_period_has_one_key_and_one_start() {
        for p in [
            Period::Minute,
            Period::Hour,
            Period::Day,
            Period::Month,
            Period::Year,
        ] {
            let t = 1_700_000_000;
            let (k, s) = period_of(p, t);
            assert_eq!(period_of(p, s), (k, s), "{p:?}");
            assert_ne!(
                period_of(p, s - 1).0,
                k,
                "{p:?}: the second before is another period"
            );
        }
    }

    #[test]
    fn stepping_back_whole_periods() {
        let t = 1_700_000_000;
        for p in [Period::Minute, Period::Hour, Period::Day, Period::Week] {
            let (_, s) = period_of(p, t);
            let (_, back) = periods_back(p, t, 3);
            // Exact for fixed-length periods away from a DST change.
            assert!((s - back - 3 * p.nominal()).abs() <= 3600, "{p:?}");
        }
        let now = time::local(t);
        let (k, _) = periods_back(Period::Month, t, 14);
        let months = (now.year * 12 + now.mon as i32 - 1) - 14;
        assert_eq!((k.0, k.1), (months / 12, (months % 12 + 1) as u32));
        let (k, _) = periods_back(Period::Year, t, 10);
        assert_eq!(k.0, now.year - 10);
        // 120 months back is still the same month, ten years ago.
        let (k, _) = periods_back(Period::Month, t, 120);
        assert_eq!((k.0, k.1), (now.year - 10, now.mon));
    }

    #[test]
    fn templates_expand_time_escapes_at_the_period_start() {
        let t = 1_700_000_000;
        let (_, start) = period_of(Period::Hour, t);
        let tm = time::local(start);
        assert_eq!(
            name_at("/var/log/3proxy-%Y%m%d-%H%M%S.log", Period::Hour, t),
            format!(
                "/var/log/3proxy-{:04}{:02}{:02}-{:02}0000.log",
                tm.year, tm.mon, tm.mday, tm.hour
            )
        );
        // No suffix is added to a template.
        assert!(name_at("x%t", Period::Day, t).starts_with('x'));
    }

    #[test]
    fn archiver_words() {
        let a: Vec<String> = ["gz", "gzip", "-c", "%F", ">", "%A", "&&", "rm", "%F"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            archiver_command(&a, "/l/a.log.2024"),
            "gzip -c '/l/a.log.2024' > '/l/a.log.2024.gz' && rm '/l/a.log.2024'"
        );
        let a: Vec<String> = ["z", "zip", "%A", "%F"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(archiver_command(&a, "it's"), r"zip 'it'\''s.z' 'it'\''s'");
    }

    #[test]
    fn syslog_message_shape() {
        let t = 1_700_000_000;
        let m = syslog_message("3proxy", 42, t, b"a record\n");
        let m = String::from_utf8(m).unwrap();
        assert!(m.starts_with("<30>"), "{m}");
        assert!(m.ends_with(" 3proxy[42]: a record"), "{m}");
        // "<30>Mmm dd hh:mm:ss " is 20 bytes.
        assert_eq!(&m[19..20], " ");
        assert_eq!(&m[13..14], ":");
    }

    #[test]
    fn records_from_many_threads_never_interleave() {
        let path = std::env::temp_dir().join(format!("threeproxy-many-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sink = Sink::open(path.to_str().unwrap(), Owner::default()).unwrap();
        let (threads, each) = (8, 400);
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    let text = format!("thread {t} {}", "x".repeat(300 + t * 50));
                    let fmt = LogFormat::parse("L%T");
                    for _ in 0..each {
                        let mut rec = template_record(0);
                        rec.text = &text;
                        emit(&sink, &fmt, &rec);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        flush(Duration::from_secs(10));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), threads * each);
        for l in lines {
            let t: usize = l.split(' ').nth(1).unwrap().parse().unwrap();
            assert_eq!(l, format!("thread {t} {}", "x".repeat(300 + t * 50)));
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn rotation_switches_files_and_keeps_n() {
        let dir = std::env::temp_dir().join(format!("threeproxy-logrot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("a.log");
        let base = base.to_str().unwrap();
        let t0 = 1_700_000_000 - 1_700_000_000 % 60 + 5;
        let f = FileLog::open(base, Period::Minute, t0, Owner::default()).unwrap();
        let first = f.current_path();
        f.write(b"one\n").unwrap();
        f.maybe_rotate(t0 + 1);
        assert_eq!(f.current_path(), first, "same minute, same file");
        set_rotation(2, None);
        f.maybe_rotate(t0 + 60);
        assert!(first.exists(), "rotate 2 keeps the previous file");
        let second = f.current_path();
        assert_ne!(second, first);
        f.write(b"two\n").unwrap();
        f.maybe_rotate(t0 + 120);
        let third = f.current_path();
        set_rotation(0, None);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "two\n");
        assert!(third.exists());
        // rotate 2 deletes the file two periods old: the first.
        assert!(!first.exists(), "{} should be deleted", first.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
