//! Limits: `connlim`, `bandlimin`/`bandlimout` and the traffic counters
//! `countin`/`countout`/`countall` with their `no*` exceptions and the
//! `counter` file (3proxy's limiter.c, auth.c `alwaysauth`, 3proxy.c
//! `dumpcounters`).
//!
//! Limit rules are process-wide, like 3proxy's: one list per kind, walked
//! in cfg order after a request is authorized; a matching `no*` rule ends
//! the walk. The state of a rule (a bandwidth bucket, a connection count, a
//! traffic counter) is shared by every session the rule matches, and lives
//! in a registry keyed by the rule's cfg line, so a reload that keeps a line
//! keeps its state.
//!
//! Bandwidth is a token bucket per rule that may go into debt: a session
//! reads a bounded chunk, charges it, and then waits, in the relay's own
//! poll, exactly until the debt is paid. Nothing spins.
//!
//! Counter file layout (3proxy's, native byte order, 64-bit time_t): a
//! 16-byte header `"3CF\0"` + the time of the last update, then one 24-byte
//! record per counter number N at offset 16 + (N-1)*24: bytes counted, time
//! the counter was last reset, time it was last updated.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::acl::{Query, Rule};
use crate::conf::token::quote;
use crate::res::Res;

/// The limit lists of the running cfg.
#[derive(Debug, Default)]
pub struct Limits {
    rules: RwLock<Rules>,
}

#[derive(Debug, Default)]
struct Rules {
    conn: Vec<(Rule, Option<Arc<ConnLim>>)>,
    band_in: Vec<(Rule, Option<Arc<Bucket>>)>,
    band_out: Vec<(Rule, Option<Arc<Bucket>>)>,
    count: Vec<(Rule, CountKind, Option<Arc<Counter>>)>,
    file: Option<Arc<CounterFile>>,
    /// `counter FILE TYPE REPORTNAME`: how often a report is written, and
    /// the name template of the report files.
    report: Option<(Period, String)>,
    /// Some rule looks at the weekday or the time of day.
    timed: bool,
}

/// Which traffic a counter rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountKind {
    In,
    Out,
    All,
    NoIn,
    NoOut,
    NoAll,
}

/// 3proxy's `connlim`: at most `rate` parallel sessions (period 0), or a
/// rate of `rate` new sessions per `period` seconds.
#[derive(Debug)]
pub struct ConnLim {
    rate: u32,
    period: u32,
    state: Mutex<ConnState>,
}

#[derive(Debug)]
struct ConnState {
    /// Parallel: sessions now. Rate: a count that decays linearly to 0
    /// over one period.
    rating: f64,
    base: Option<Instant>,
}

/// A bandwidth limit shared by the sessions of one rule.
#[derive(Debug)]
pub struct Bucket {
    /// Bytes per second.
    rate: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    /// Bytes that may go now; negative is a debt to wait out.
    tokens: f64,
    last: Instant,
}

/// Most a bucket saves up while idle: a twentieth of a second's worth.
const BURST_SECS: f64 = 0.05;

/// A traffic counter (`countin` & co): bytes in the current period.
#[derive(Debug)]
pub struct Counter {
    /// Record number in the counter file; 0 = not saved.
    pub number: u32,
    period: Period,
    limit: u64,
    /// After the `/` of `N/comment`; shown in reports.
    comment: String,
    state: Mutex<CounterState>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CounterState {
    traf: u64,
    cleared: i64,
    updated: i64,
    /// What `traf` was when it was last reset (not saved in the file):
    /// the total of the period just ended, for a report.
    prev: u64,
}

/// How often a counter starts again from 0. Ordered as 3proxy's
/// ROTATION: a report lists the counters of its period or a longer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    Minutely,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Annually,
    Never,
}

impl Period {
    /// 3proxy's letters; anything else means never.
    pub fn from_letter(s: &str) -> Period {
        match s.as_bytes().first().map(u8::to_ascii_uppercase) {
            Some(b'C') => Period::Minutely,
            Some(b'H') => Period::Hourly,
            Some(b'D') => Period::Daily,
            Some(b'W') => Period::Weekly,
            Some(b'M') => Period::Monthly,
            Some(b'Y') => Period::Annually,
            _ => Period::Never,
        }
    }

    fn to_log(self) -> crate::log::Period {
        use crate::log::Period as L;
        match self {
            Period::Minutely => L::Minute,
            Period::Hourly => L::Hour,
            Period::Daily => L::Day,
            Period::Weekly => L::Week,
            Period::Monthly => L::Month,
            Period::Annually => L::Year,
            Period::Never => L::Never,
        }
    }

    /// Whether `new` is in a later period than `old` (3proxy's
    /// `timechanged`), in local time.
    fn changed(self, old: i64, new: i64) -> bool {
        let (a, b) = (crate::sys::time::local(old), crate::sys::time::local(new));
        match self {
            Period::Minutely => {
                (a.min, a.hour, a.mday, a.mon, a.year) != (b.min, b.hour, b.mday, b.mon, b.year)
            }
            Period::Hourly => (a.hour, a.mday, a.mon, a.year) != (b.hour, b.mday, b.mon, b.year),
            Period::Daily => (a.mday, a.mon, a.year) != (b.mday, b.mon, b.year),
            Period::Monthly => (a.mon, a.year) != (b.mon, b.year),
            Period::Annually => a.year != b.year,
            // A new week starts on Sunday.
            Period::Weekly => {
                new - old > 7 * 86400
                    || b.wday < a.wday
                    || (b.wday == a.wday && new - old > 6 * 86400)
            }
            Period::Never => false,
        }
    }
}

/// The `counter` file.
#[derive(Debug)]
pub struct CounterFile {
    file: File,
    path: String,
    /// The header's time of the last update when the file was opened
    /// (0 for a new file).
    updated: i64,
}

const HEADER_LEN: u64 = 16;
const RECORD_LEN: u64 = 24;
const SIGNATURE: &[u8; 4] = b"3CF\0";
/// 3proxy refuses times past this in a counter file (`MAX_COUNTER_TIME`).
const MAX_TIME: i64 = 1 << 40;

impl CounterFile {
    /// Open or create the file and check its header (`counter FILE`). A
    /// new file gets 3proxy's mode, 0660 before the umask, and `owner`.
    pub fn open(path: &str, owner: crate::sys::process::Owner) -> Result<CounterFile, String> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true);
        let file = crate::sys::process::open_or_create(&opts, path.as_ref(), 0o660, owner)
            .map_err(|e| format!("{}: {e}", quote(path)))?;
        let updated = Self::header(&file, path)?;
        Ok(CounterFile {
            file,
            path: path.to_string(),
            updated,
        })
    }

    /// `3proxy -t`: what [`CounterFile::open`] would refuse, found
    /// without creating or changing the file.
    pub fn check(path: &str) -> Result<(), String> {
        let p = std::path::Path::new(path);
        crate::sys::process::check_writable(p).map_err(|e| format!("{}: {e}", quote(path)))?;
        match File::open(p) {
            Ok(file) => Self::header(&file, path).map(|_| ()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", quote(path))),
        }
    }

    /// The time of the last update from the header (0 for an empty
    /// file), or why the file is not a counter file.
    fn header(file: &File, path: &str) -> Result<i64, String> {
        let mut h = [0u8; HEADER_LEN as usize];
        if file.read_exact_at(&mut h, 0).is_err() {
            return Ok(0);
        }
        if &h[..4] != SIGNATURE {
            return Err(format!("{}: not a counter file", quote(path)));
        }
        let t = i64::from_ne_bytes(h[8..16].try_into().unwrap_or_default());
        if !(0..MAX_TIME).contains(&t) {
            return Err(format!(
                "{}: invalid or corrupted counter file",
                quote(path)
            ));
        }
        Ok(t)
    }

    fn read(&self, number: u32) -> Result<Option<CounterState>, String> {
        let mut r = [0u8; RECORD_LEN as usize];
        if self
            .file
            .read_exact_at(&mut r, Self::offset(number))
            .is_err()
        {
            return Ok(None);
        }
        let word = |i: usize| <[u8; 8]>::try_from(&r[i..i + 8]).unwrap_or_default();
        let st = CounterState {
            traf: u64::from_ne_bytes(word(0)),
            cleared: i64::from_ne_bytes(word(8)),
            updated: i64::from_ne_bytes(word(16)),
            prev: 0,
        };
        if !(0..MAX_TIME).contains(&st.cleared) || !(0..MAX_TIME).contains(&st.updated) {
            return Err(format!(
                "{}: record {number} is invalid or corrupted",
                quote(&self.path)
            ));
        }
        Ok(Some(st))
    }

    fn write(&self, number: u32, st: CounterState, now: i64) -> std::io::Result<()> {
        let mut h = [0u8; HEADER_LEN as usize];
        h[..4].copy_from_slice(SIGNATURE);
        h[8..].copy_from_slice(&now.to_ne_bytes());
        self.file.write_all_at(&h, 0)?;
        let mut r = [0u8; RECORD_LEN as usize];
        r[..8].copy_from_slice(&st.traf.to_ne_bytes());
        r[8..16].copy_from_slice(&st.cleared.to_ne_bytes());
        r[16..].copy_from_slice(&st.updated.to_ne_bytes());
        self.file.write_all_at(&r, Self::offset(number))
    }

    fn offset(number: u32) -> u64 {
        HEADER_LEN + u64::from(number.saturating_sub(1)) * RECORD_LEN
    }
}

/// Unix seconds, on the clock of the log rotation (which a test may move
/// forward, see `log::clock`): counter periods and reports follow it.
fn unix_now() -> i64 {
    crate::log::clock()
}

/// State shared across reloads: one object per distinct cfg line.
fn shared<T: Send + Sync + 'static>(key: &str, make: impl FnOnce() -> T) -> Arc<T> {
    type Reg = Mutex<HashMap<String, Weak<dyn std::any::Any + Send + Sync>>>;
    static REGISTRY: OnceLock<Reg> = OnceLock::new();
    let mut reg = REGISTRY
        .get_or_init(Reg::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(old) = reg.get(key).and_then(Weak::upgrade) {
        if let Ok(t) = old.downcast::<T>() {
            return t;
        }
    }
    reg.retain(|_, w| w.strong_count() > 0);
    let t = Arc::new(make());
    let any: Arc<dyn std::any::Any + Send + Sync> = t.clone();
    reg.insert(key.to_string(), Arc::downgrade(&any));
    t
}

impl Limits {
    /// Some rule looks at the weekday or time of day.
    pub fn timed(&self) -> bool {
        self.read().timed
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Rules> {
        self.rules.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Rules> {
        self.rules.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `connlim N PERIOD rule...` (None: `noconnlim rule...`).
    pub fn add_connlim(&self, key: &str, lim: Option<(u32, u32)>, rule: Rule) {
        let state = lim.map(|(rate, period)| {
            shared(key, || ConnLim {
                rate,
                period,
                state: Mutex::new(ConnState {
                    rating: 0.0,
                    base: None,
                }),
            })
        });
        let mut r = self.write();
        r.timed |= rule.timed();
        r.conn.push((rule, state));
    }

    /// `bandlimin`/`bandlimout BPS rule...` (None: `nobandlim*`).
    pub fn add_bandlim(&self, key: &str, out: bool, bps: Option<u64>, rule: Rule) {
        let bucket = bps.map(|b| shared(key, || Bucket::new(b)));
        let mut r = self.write();
        r.timed |= rule.timed();
        if out {
            r.band_out.push((rule, bucket));
        } else {
            r.band_in.push((rule, bucket));
        }
    }

    /// `counter FILE [TYPE REPORTNAME]`.
    pub fn set_counter_file(&self, f: CounterFile, report: Option<(Period, String)>) {
        let mut r = self.write();
        r.file = Some(Arc::new(f));
        r.report = report;
    }

    /// `countin|countout|countall N[/comment] PERIOD MB rule...`. The
    /// counter's saved value is read from the counter file now, as 3proxy
    /// does.
    pub fn add_counter(
        &self,
        key: &str,
        kind: CountKind,
        spec: Option<(u32, String, Period, u64)>,
        rule: Rule,
    ) -> Result<(), String> {
        let file = self.read().file.clone();
        let counter = match spec {
            None => None,
            Some((number, comment, period, limit)) => {
                let saved = match (&file, number) {
                    (Some(f), n) if n > 0 => f.read(n)?,
                    _ => None,
                };
                Some(shared(key, || Counter {
                    number,
                    period,
                    limit,
                    comment,
                    state: Mutex::new(saved.unwrap_or(CounterState {
                        traf: 0,
                        cleared: unix_now(),
                        updated: 0,
                        prev: 0,
                    })),
                }))
            }
        };
        let mut r = self.write();
        r.timed |= rule.timed();
        r.count.push((rule, kind, counter));
        Ok(())
    }

    /// The counter rules in cfg order, as the admin service shows them.
    pub fn counter_views(&self) -> Vec<CounterView> {
        let now = unix_now();
        self.read()
            .count
            .iter()
            .map(|(rule, kind, c)| CounterView {
                kind: *kind,
                users: rule.users.as_ref().map(|u| {
                    let mut v: Vec<String> = u.iter().cloned().collect();
                    v.sort();
                    v
                }),
                counter: c.as_ref().map(|c| {
                    let mut st = c.state.lock().unwrap_or_else(|e| e.into_inner());
                    c.roll(&mut st, now);
                    CounterValue {
                        number: c.number,
                        comment: c.comment.clone(),
                        period: c.period,
                        limit: c.limit,
                        traf: st.traf,
                        cleared: st.cleared,
                        updated: st.updated,
                    }
                }),
            })
            .collect()
    }

    /// After a request is authorized (3proxy's `alwaysauth`): take a
    /// connlim slot, refuse with 10 past a limit or quota, and pick the
    /// session's bandwidth limiters and counters. None if no rule applies.
    pub fn start(&self, q: &Query<'_>) -> Result<Option<Arc<Session>>, Res> {
        let r = self.read();
        if r.conn.is_empty() && r.band_in.is_empty() && r.band_out.is_empty() && r.count.is_empty()
        {
            return Ok(None);
        }
        let mut s = Session::default();
        let now = Instant::now();
        for (rule, lim) in &r.conn {
            if !rule.matches(q) {
                continue;
            }
            let Some(lim) = lim else { break };
            // On refusal `s` drops, giving back the slots taken so far.
            if !lim.enter(now) {
                return Err(Res::QUOTA);
            }
            if lim.period == 0 {
                s.conn.push(lim.clone());
            }
        }
        s.band_in = pick(&r.band_in, q);
        s.band_out = pick(&r.band_out, q);
        let t = unix_now();
        for (dir, stop, go) in [
            (
                &mut s.count_in,
                [CountKind::NoIn, CountKind::NoAll],
                [CountKind::In, CountKind::All],
            ),
            (
                &mut s.count_out,
                [CountKind::NoOut, CountKind::NoAll],
                [CountKind::Out, CountKind::All],
            ),
        ] {
            for (rule, kind, c) in &r.count {
                if !(stop.contains(kind) || go.contains(kind)) || !rule.matches(q) {
                    continue;
                }
                let Some(c) = c.as_ref().filter(|_| go.contains(kind)) else {
                    break;
                };
                if c.remaining(t) == 0 {
                    return Err(Res::QUOTA);
                }
                dir.push(c.clone());
            }
        }
        s.budget_in = s.count_in.iter().map(|c| c.remaining(t)).min();
        s.budget_out = s.count_out.iter().map(|c| c.remaining(t)).min();
        s.file = r.file.clone();
        Ok(Some(Arc::new(s)))
    }
}

/// Up to 10 limiters from a list: the matching rules before the first
/// matching `no*` rule (3proxy's MAXBANDLIMS).
fn pick(list: &[(Rule, Option<Arc<Bucket>>)], q: &Query<'_>) -> Vec<Arc<Bucket>> {
    let mut v = Vec::new();
    for (rule, b) in list {
        if v.len() == 10 {
            break;
        }
        if !rule.matches(q) {
            continue;
        }
        match b {
            Some(b) => v.push(b.clone()),
            None => break,
        }
    }
    v
}

impl ConnLim {
    /// Count a new session in; false if the limit is reached.
    fn enter(&self, now: Instant) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.period == 0 {
            if st.rating >= f64::from(self.rate) {
                return false;
            }
            st.rating += 1.0;
            return true;
        }
        let period = f64::from(self.period);
        let decayed = match st.base {
            Some(b) => {
                let age = now.saturating_duration_since(b).as_secs_f64();
                st.rating * (1.0 - (age / period).min(1.0))
            }
            None => 0.0,
        };
        if decayed + 1.0 > f64::from(self.rate) + 1e-9 {
            return false;
        }
        st.rating = decayed + 1.0;
        st.base = Some(now);
        true
    }

    fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.rating = (st.rating - 1.0).max(0.0);
    }
}

impl Bucket {
    pub fn new(bits_per_sec: u64) -> Bucket {
        Bucket {
            rate: bits_per_sec as f64 / 8.0,
            state: Mutex::new(BucketState {
                tokens: 0.0,
                last: Instant::now(),
            }),
        }
    }

    /// Refill for the time passed; return how long until the debt is paid.
    fn ready_in(&self, now: Instant) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut st, now);
        if st.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-st.tokens / self.rate)
        }
    }

    fn charge(&self, n: usize, now: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut st, now);
        st.tokens -= n as f64;
    }

    fn refill(&self, st: &mut BucketState, now: Instant) {
        let dt = now.saturating_duration_since(st.last).as_secs_f64();
        st.last = st.last.max(now);
        st.tokens = (st.tokens + dt * self.rate).min(self.rate * BURST_SECS);
    }

    /// Largest read worth making at once: a twentieth of a second.
    fn chunk(&self) -> usize {
        ((self.rate * BURST_SECS) as usize).max(512)
    }
}

impl Counter {
    /// Bytes left in this period (resetting the counter if a new period
    /// has begun).
    fn remaining(&self, now: i64) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.roll(&mut st, now);
        self.limit.saturating_sub(st.traf)
    }

    fn roll(&self, st: &mut CounterState, now: i64) {
        if self.period != Period::Never && self.period.changed(st.cleared, now) {
            st.prev = st.traf;
            st.traf = 0;
            st.cleared = now;
        }
    }

    /// One report line (3proxy's format: the number, the bytes, then ` #`
    /// and the comment). `last` is when the reported period was last seen
    /// running: a counter reset since then reports its total before the
    /// reset.
    fn report_line(&self, last: i64) -> String {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let traf = if st.cleared > last { st.prev } else { st.traf };
        format!("{:05} {:020} #{}\n", self.number, traf, self.comment)
    }

    fn add(&self, n: u64, now: i64) -> CounterState {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.roll(&mut st, now);
        st.traf = st.traf.saturating_add(n);
        st.updated = now;
        *st
    }

    #[cfg(test)]
    fn traffic(&self) -> u64 {
        self.state.lock().unwrap().traf
    }
}

/// One counter rule as [`Limits::counter_views`] reports it.
#[derive(Debug, Clone)]
pub struct CounterView {
    pub kind: CountKind,
    /// The rule's user list; None is any user.
    pub users: Option<Vec<String>>,
    /// None for the `nocount*` rules.
    pub counter: Option<CounterValue>,
}

/// A counter's settings and current value.
#[derive(Debug, Clone)]
pub struct CounterValue {
    pub number: u32,
    pub comment: String,
    pub period: Period,
    /// Bytes allowed per period.
    pub limit: u64,
    /// Bytes counted in this period.
    pub traf: u64,
    /// Unix times of the last reset and the last update (0 = never).
    pub cleared: i64,
    pub updated: i64,
}

/// What one session may do: its limiters, counters and connlim slots.
/// Dropping it gives back the slots and adds its traffic to the counters.
#[derive(Debug, Default)]
pub struct Session {
    conn: Vec<Arc<ConnLim>>,
    band_in: Vec<Arc<Bucket>>,
    band_out: Vec<Arc<Bucket>>,
    count_in: Vec<Arc<Counter>>,
    count_out: Vec<Arc<Counter>>,
    /// Bytes this session may still move each way before its quota.
    budget_in: Option<u64>,
    budget_out: Option<u64>,
    file: Option<Arc<CounterFile>>,
    /// Bytes moved so far: server to client, client to server.
    moved_in: AtomicU64,
    moved_out: AtomicU64,
}

/// What the relay may do next in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Read at most this many bytes now.
    Go(usize),
    /// Read nothing until then.
    Wait(Instant),
    /// The session's traffic quota is used up: end it with code 10.
    Stop,
}

impl Session {
    /// Whether the relay has anything to enforce.
    pub fn shapes(&self) -> bool {
        !self.band_in.is_empty()
            || !self.band_out.is_empty()
            || self.budget_in.is_some()
            || self.budget_out.is_some()
    }

    /// Whether direction `out` (client to server) has a bandwidth limit or
    /// a traffic quota; if not, its traffic need not be charged.
    pub fn shapes_dir(&self, out: bool) -> bool {
        let (buckets, budget, _) = self.dir(out);
        !buckets.is_empty() || budget.is_some()
    }

    /// May the relay read in direction `out` (client to server) now?
    pub fn permit(&self, out: bool, now: Instant) -> Permit {
        let (buckets, budget, moved) = self.dir(out);
        let mut max = usize::MAX;
        if let Some(b) = budget {
            let left = b.saturating_sub(moved.load(Ordering::Relaxed));
            if left == 0 {
                return Permit::Stop;
            }
            max = usize::try_from(left).unwrap_or(usize::MAX);
        }
        let mut wait = Duration::ZERO;
        for b in buckets {
            wait = wait.max(b.ready_in(now));
            max = max.min(b.chunk());
        }
        if wait > Duration::ZERO {
            Permit::Wait(now + wait)
        } else {
            Permit::Go(max)
        }
    }

    /// The relay read `n` bytes in direction `out`.
    pub fn used(&self, out: bool, n: usize, now: Instant) {
        let (buckets, _, moved) = self.dir(out);
        moved.fetch_add(n as u64, Ordering::Relaxed);
        for b in buckets {
            b.charge(n, now);
        }
    }

    /// Count traffic moved outside the relay (e.g. datagrams).
    pub fn add(&self, inb: u64, out: u64) {
        self.moved_in.fetch_add(inb, Ordering::Relaxed);
        self.moved_out.fetch_add(out, Ordering::Relaxed);
    }

    fn dir(&self, out: bool) -> (&[Arc<Bucket>], Option<u64>, &AtomicU64) {
        if out {
            (&self.band_out, self.budget_out, &self.moved_out)
        } else {
            (&self.band_in, self.budget_in, &self.moved_in)
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for c in &self.conn {
            c.leave();
        }
        let now = unix_now();
        let (inb, out) = (*self.moved_in.get_mut(), *self.moved_out.get_mut());
        for (list, n) in [(&self.count_in, inb), (&self.count_out, out)] {
            for c in list {
                c.add(n, now);
                if c.number > 0 {
                    if let Some(f) = &self.file {
                        dumper().mark(f, c);
                    }
                }
            }
        }
    }
}

/// A counter whose record must be written, and its file. The state is read
/// when the record is written, not when it was marked: two sessions that
/// end at once may mark in the other order than they added, and the
/// older state written last would lose the other's bytes.
type Dirty = (Arc<CounterFile>, Arc<Counter>);

/// Writes changed counter records to the counter file, at most once a
/// second, on a thread of its own: a crash loses at most the last second.
struct Dumper {
    /// Records to write, by (file, record number): each written with its
    /// counter's state at the time of writing.
    dirty: Mutex<HashMap<(usize, u32), Dirty>>,
    started: AtomicBool,
    /// Writing has failed and not succeeded since.
    failing: AtomicBool,
}

fn dumper() -> &'static Dumper {
    static D: OnceLock<Dumper> = OnceLock::new();
    D.get_or_init(|| Dumper {
        dirty: Mutex::default(),
        started: AtomicBool::new(false),
        failing: AtomicBool::new(false),
    })
}

/// Write every changed counter record now (at exit; sessions still open
/// count what they moved so far only when they end).
pub fn flush_counters() {
    dumper().flush();
}

/// How often changed counters reach the counter file.
const DUMP_EVERY: Duration = Duration::from_secs(1);

impl Dumper {
    fn mark(&'static self, f: &Arc<CounterFile>, c: &Arc<Counter>) {
        let key = (Arc::as_ptr(f) as usize, c.number);
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (f.clone(), c.clone()));
        if !self.started.swap(true, Ordering::AcqRel) {
            let spawned = std::thread::Builder::new()
                .name("counters".into())
                .spawn(move || loop {
                    std::thread::sleep(DUMP_EVERY);
                    self.flush();
                });
            if let Err(e) = spawned {
                log::error!("cannot start the counter writer: {e}; writing now");
                self.started.store(false, Ordering::Release);
                self.flush();
            }
        }
    }

    /// Write what changed. A record that cannot be written (a full disk,
    /// a read-only file system) stays marked and is tried again at the
    /// next flush, unless a newer state of it came meanwhile; the failure
    /// is reported once when it starts, and once when the file is written
    /// again.
    fn flush(&self) {
        let batch = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
        let now = unix_now();
        let mut failed = Vec::new();
        let mut wrote = None;
        for (key, (f, c)) in batch {
            let st = *c.state.lock().unwrap_or_else(|e| e.into_inner());
            match f.write(key.1, st, now) {
                Ok(()) => wrote = Some(f),
                Err(e) => {
                    if !self.failing.swap(true, Ordering::AcqRel) {
                        log::error!("counter file {}: {e}; trying again every second", f.path);
                    }
                    failed.push((key, (f, c)));
                }
            }
        }
        if failed.is_empty() {
            if let Some(f) = wrote {
                if self.failing.swap(false, Ordering::AcqRel) {
                    log::warn!("counter file {}: written again", f.path);
                }
            }
            return;
        }
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        for (key, v) in failed {
            dirty.entry(key).or_insert(v);
        }
    }
}

/// The text of a report of period `min` that was last seen running at
/// `last`: one line per counter rule of that period or a longer one, in
/// cfg order.
fn report_text(
    count: &[(Rule, CountKind, Option<Arc<Counter>>)],
    min: Period,
    last: i64,
) -> String {
    count
        .iter()
        .filter_map(|(_, _, c)| c.as_ref())
        .filter(|c| c.period >= min)
        .map(|c| c.report_line(last))
        .collect()
}

/// Writes the `counter` reports and resets the counters whose period has
/// ended, once a second, for the cfg that last named a report (3proxy does
/// this in its once-a-minute counter dump).
struct Reporter {
    state: Mutex<ReportState>,
    started: AtomicBool,
}

struct ReportState {
    limits: Weak<Limits>,
    /// The last tick (3proxy's counter header time): a report is due when
    /// now is in another period than this.
    last: i64,
}

fn reporter() -> &'static Reporter {
    static R: OnceLock<Reporter> = OnceLock::new();
    R.get_or_init(|| Reporter {
        state: Mutex::new(ReportState {
            limits: Weak::new(),
            last: 0,
        }),
        started: AtomicBool::new(false),
    })
}

/// Make `limits` (a cfg with `counter FILE TYPE REPORTNAME`) the one whose
/// reports are written, starting the report thread if need be.
pub fn start_reports(limits: &Arc<Limits>) {
    let r = reporter();
    {
        let mut st = r.state.lock().unwrap_or_else(|e| e.into_inner());
        st.limits = Arc::downgrade(limits);
        if st.last == 0 {
            // A new process goes on from the file's last update, so a
            // period that ended while it was down is still reported.
            st.last = limits.read().file.as_ref().map_or(0, |f| f.updated);
            if st.last == 0 {
                st.last = unix_now();
            }
        }
    }
    if !r.started.swap(true, Ordering::AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("reports".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                reporter().tick(unix_now());
            });
        if let Err(e) = spawned {
            log::error!("cannot start the counter report writer: {e}");
            r.started.store(false, Ordering::Release);
        }
    }
}

impl Reporter {
    fn tick(&self, now: i64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(limits) = st.limits.upgrade() else {
            return;
        };
        let r = limits.read();
        if let Some((period, name)) = &r.report {
            if st.last > 0 && period.changed(st.last, now) {
                let path = crate::log::period_file_name(name, period.to_log(), st.last);
                let text = report_text(&r.count, *period, st.last);
                if let Err(e) = std::fs::write(&path, text) {
                    log::error!("counter report {path}: {e}");
                }
            }
        }
        // Counters whose period ended start again now, in the file too.
        for c in r.count.iter().filter_map(|(_, _, c)| c.as_ref()) {
            let mut cs = c.state.lock().unwrap_or_else(|e| e.into_inner());
            let before = cs.cleared;
            c.roll(&mut cs, now);
            if cs.cleared != before && c.number > 0 {
                if let Some(f) = &r.file {
                    dumper().mark(f, c);
                }
            }
        }
        st.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn rule(line: &str) -> Rule {
        let f: Vec<String> = line.split_whitespace().map(String::from).collect();
        Rule::parse(&f).unwrap()
    }

    fn q(src: &str) -> Query<'static> {
        Query {
            src: Some(src.parse().unwrap()),
            op: crate::acl::OpBits::CONNECT,
            ..Query::default()
        }
    }

    #[test]
    fn parallel_connlim_refuses_the_next_and_frees_on_drop() {
        let l = Limits::default();
        l.add_connlim(
            "test-parallel connlim 2 0 * 10.0.0.1",
            Some((2, 0)),
            rule("* 10.0.0.1"),
        );
        let a = l.start(&q("10.0.0.1")).unwrap();
        let b = l.start(&q("10.0.0.1")).unwrap();
        assert_eq!(l.start(&q("10.0.0.1")).unwrap_err(), Res(10));
        assert!(
            l.start(&q("10.0.0.2")).is_ok(),
            "another source is not limited"
        );
        drop(a);
        let c = l.start(&q("10.0.0.1")).unwrap();
        drop((b, c));
    }

    #[test]
    fn noconnlim_is_an_exception() {
        let l = Limits::default();
        l.add_connlim("test-noconnlim", None, rule("* 10.0.0.1"));
        l.add_connlim("test-noconnlim connlim 0 0", Some((0, 0)), rule("*"));
        assert!(l.start(&q("10.0.0.1")).is_ok());
        assert_eq!(l.start(&q("10.0.0.2")).unwrap_err(), Res(10));
    }

    #[test]
    fn a_refusal_gives_back_earlier_slots() {
        let l = Limits::default();
        l.add_connlim("test-giveback a", Some((5, 0)), rule("*"));
        l.add_connlim("test-giveback b", Some((0, 0)), rule("* 10.0.0.9"));
        for _ in 0..10 {
            assert!(l.start(&q("10.0.0.9")).is_err());
        }
        let held: Vec<_> = (0..5).map(|_| l.start(&q("10.0.0.1")).unwrap()).collect();
        assert!(l.start(&q("10.0.0.1")).is_err());
        drop(held);
    }

    #[test]
    fn rate_connlim_decays() {
        let c = ConnLim {
            rate: 2,
            period: 10,
            state: Mutex::new(ConnState {
                rating: 0.0,
                base: None,
            }),
        };
        let t0 = Instant::now();
        assert!(c.enter(t0));
        assert!(c.enter(t0));
        assert!(!c.enter(t0), "a third within the period is refused");
        assert!(!c.enter(t0 + Duration::from_secs(1)));
        // After half a period, the count has decayed enough for one more.
        assert!(c.enter(t0 + Duration::from_secs(6)));
        assert!(c.enter(t0 + Duration::from_secs(30)));
    }

    #[test]
    fn bucket_debt_sets_the_wait() {
        let b = Bucket::new(8000); // 1000 bytes/s
        let t0 = Instant::now();
        b.state.lock().unwrap().last = t0;
        assert_eq!(b.ready_in(t0), Duration::ZERO);
        b.charge(500, t0);
        let w = b.ready_in(t0);
        assert!((w.as_secs_f64() - 0.5).abs() < 0.01, "{w:?}");
        assert_eq!(b.ready_in(t0 + Duration::from_millis(500)), Duration::ZERO);
        // Idle time saves up at most a burst's worth.
        assert_eq!(b.ready_in(t0 + Duration::from_secs(100)), Duration::ZERO);
        assert!(b.state.lock().unwrap().tokens <= 1000.0 * BURST_SECS);
    }

    #[test]
    fn sessions_share_a_rules_bucket() {
        let l = Limits::default();
        l.add_bandlim("test-share bandlimout 8000", true, Some(8000), rule("*"));
        let a = l.start(&q("10.0.0.1")).unwrap().unwrap();
        let b = l.start(&q("10.0.0.2")).unwrap().unwrap();
        let now = Instant::now();
        assert!(matches!(a.permit(true, now), Permit::Go(_)));
        a.used(true, 1000, now);
        assert!(
            matches!(b.permit(true, now), Permit::Wait(_)),
            "b waits for a's debt"
        );
        assert!(
            matches!(b.permit(false, now), Permit::Go(usize::MAX)),
            "the other direction is free"
        );
    }

    #[test]
    fn nobandlim_stops_the_search() {
        let l = Limits::default();
        l.add_bandlim("test-nob no", false, None, rule("* * * 110"));
        l.add_bandlim("test-nob lim", false, Some(57600), rule("*"));
        let pop = Query {
            port: 110,
            ..q("10.0.0.1")
        };
        assert!(l.start(&pop).unwrap().unwrap().band_in.is_empty());
        let web = Query {
            port: 80,
            ..q("10.0.0.1")
        };
        assert_eq!(l.start(&web).unwrap().unwrap().band_in.len(), 1);
    }

    #[test]
    fn counters_refuse_past_the_quota_and_count_on_drop() {
        let l = Limits::default();
        let spec = Some((0, String::new(), Period::Never, 1000));
        l.add_counter("test-count out", CountKind::Out, spec, rule("*"))
            .unwrap();
        let s = l.start(&q("10.0.0.1")).unwrap().unwrap();
        assert_eq!(s.budget_out, Some(1000));
        assert_eq!(s.budget_in, None);
        s.used(true, 600, Instant::now());
        assert!(matches!(s.permit(true, Instant::now()), Permit::Go(400)));
        s.used(true, 400, Instant::now());
        assert_eq!(s.permit(true, Instant::now()), Permit::Stop);
        let c = s.count_out[0].clone();
        drop(s);
        assert_eq!(c.traffic(), 1000);
        assert_eq!(l.start(&q("10.0.0.1")).unwrap_err(), Res(10));
    }

    #[test]
    fn countall_counts_both_ways_and_nocount_excepts() {
        let l = Limits::default();
        l.add_counter("test-all no", CountKind::NoAll, None, rule("* 10.0.0.2"))
            .unwrap();
        let spec = Some((0, String::new(), Period::Never, 1 << 20));
        l.add_counter("test-all all", CountKind::All, spec, rule("*"))
            .unwrap();
        assert!(l
            .start(&q("10.0.0.2"))
            .unwrap()
            .unwrap()
            .count_in
            .is_empty());
        let s = l.start(&q("10.0.0.1")).unwrap().unwrap();
        s.add(100, 20);
        let c = s.count_in[0].clone();
        drop(s);
        assert_eq!(c.traffic(), 120);
    }

    #[test]
    fn periods_change_at_their_boundaries() {
        use crate::sys::time::local;
        /// A field of the local time at a given second.
        type Field = fn(i64) -> i32;
        // The first second at which `f` of the local time differs from
        // its value at `t`, found by scanning forward in `step`s and then
        // second by second.
        let next_change = |t: i64, step: i64, f: Field| {
            let v = f(t);
            let mut a = t;
            while f(a + step) == v {
                a += step;
            }
            let mut b = a + 1;
            while f(b) == v {
                b += 1;
            }
            b
        };
        // Mid-January 2024, away from any DST change.
        let t = 1_705_500_000;
        let cases: [(Period, i64, Field); 5] = [
            (Period::Minutely, 1, |x| local(x).min as i32),
            (Period::Hourly, 60, |x| local(x).hour as i32),
            (Period::Daily, 600, |x| local(x).mday as i32),
            (Period::Monthly, 3600, |x| local(x).mon as i32),
            (Period::Annually, 86400, |x| local(x).year),
        ];
        for (p, step, f) in cases {
            let b = next_change(t, step, f);
            assert!(p.changed(b - 1, b), "{p:?} changes at {b}");
            assert!(!p.changed(t, b - 1), "{p:?} holds until {b}");
        }
        // Two times within one minute are in the same period of any kind.
        let m = next_change(t, 1, |x| local(x).min as i32);
        for p in [
            Period::Minutely,
            Period::Hourly,
            Period::Daily,
            Period::Weekly,
            Period::Monthly,
            Period::Annually,
        ] {
            assert!(!p.changed(m, m + 30), "{p:?}");
        }
        // A week starts on Sunday.
        let sunday = next_change(t, 600, |x| i32::from(local(x).wday == 0));
        assert_eq!(local(sunday).wday, 0);
        assert!(Period::Weekly.changed(sunday - 1, sunday));
        assert!(!Period::Weekly.changed(sunday, sunday + 6 * 86400));
        assert!(Period::Weekly.changed(sunday, sunday + 7 * 86400));
        assert!(!Period::Never.changed(0, t));
    }

    #[test]
    fn counter_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("threeproxy-limit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("counters");
        let _ = std::fs::remove_file(&path);
        let p = path.to_str().unwrap();
        let f = CounterFile::open(p, Default::default()).unwrap();
        let st = CounterState {
            traf: 12345,
            cleared: 1_700_000_000,
            updated: 1_700_000_100,
            prev: 0,
        };
        f.write(3, st, 1_700_000_200).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, HEADER_LEN + 3 * RECORD_LEN);
        assert_eq!(&bytes[..4], b"3CF\0");
        let f = CounterFile::open(p, Default::default()).unwrap();
        assert_eq!(f.read(3).unwrap(), Some(st));
        assert_eq!(
            f.read(1).unwrap(),
            Some(CounterState::default()),
            "a hole reads as zeros"
        );
        assert_eq!(f.read(9).unwrap(), None);
        std::fs::write(&path, b"not a counter file").unwrap();
        assert!(CounterFile::open(p, Default::default())
            .unwrap_err()
            .contains("not a counter file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_counter_record_is_written_with_the_state_at_writing() {
        // Two sessions that end at once each add, then mark, and the marks
        // may come in the other order: here the second session's mark
        // came first, and the first session marks after the second's add.
        // (When a mark carried its session's state, that one wrote 100.)
        let dir = std::env::temp_dir().join(format!("threeproxy-dump-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("counters");
        let _ = std::fs::remove_file(&path);
        let f = Arc::new(CounterFile::open(path.to_str().unwrap(), Default::default()).unwrap());
        let c = Arc::new(Counter {
            number: 2,
            period: Period::Daily,
            limit: 1 << 30,
            comment: String::new(),
            state: Mutex::new(CounterState {
                cleared: unix_now(),
                ..CounterState::default()
            }),
        });
        let now = unix_now();
        c.add(100, now);
        c.add(100, now);
        dumper().mark(&f, &c);
        flush_counters();
        assert_eq!(f.read(2).unwrap().map(|st| st.traf), Some(200));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reports_list_counters_of_their_period_or_longer() {
        let dir = std::env::temp_dir().join(format!("threeproxy-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("c"));
        let l = Arc::new(Limits::default());
        let report = dir.join("rep").to_str().unwrap().to_string();
        l.set_counter_file(
            CounterFile::open(dir.join("c").to_str().unwrap(), Default::default()).unwrap(),
            Some((Period::Daily, report.clone())),
        );
        let mb = 1 << 20;
        for (key, n, comment, period, src) in [
            ("test-rep h", 1, "hourly", Period::Hourly, "* 10.0.0.1"),
            ("test-rep d", 2, "daily", Period::Daily, "* 10.0.0.2"),
            ("test-rep m", 0, "", Period::Monthly, "* 10.0.0.3"),
        ] {
            l.add_counter(
                key,
                CountKind::All,
                Some((n, comment.to_string(), period, 100 * mb)),
                rule(src),
            )
            .unwrap();
        }
        l.add_counter("test-rep no", CountKind::NoOut, None, rule("*"))
            .unwrap();
        // A noon, so that an hour on is the same day and a day on is not.
        let tm = crate::sys::time::local(1_700_000_000);
        let noon = 1_700_000_000 - i64::from(tm.hour) * 3600 + 12 * 3600;
        for (src, n) in [("10.0.0.1", 111), ("10.0.0.2", 222), ("10.0.0.3", 333)] {
            let s = l.start(&q(src)).unwrap().unwrap();
            for c in s.count_in.iter() {
                c.state.lock().unwrap().cleared = noon;
                c.add(n, noon);
            }
            // Its drop would count (nothing) on today's clock.
            std::mem::forget(s);
        }
        let r = Reporter {
            state: Mutex::new(ReportState {
                limits: Arc::downgrade(&l),
                last: noon,
            }),
            started: AtomicBool::new(true),
        };
        r.tick(noon + 3600);
        let name = crate::log::period_file_name(&report, crate::log::Period::Day, noon);
        assert!(
            name.starts_with(&report) && name.len() == report.len() + 11,
            "{name}"
        );
        assert!(!Path::new(&name).exists(), "same day: no report yet");
        r.tick(noon + 86400);
        let text = std::fs::read_to_string(&name).unwrap();
        assert_eq!(
            text,
            "00002 00000000000000000222 #daily\n00000 00000000000000000333 #\n",
        );
        // The daily counter started again; the monthly one maybe, too.
        let c = l.read().count[1].2.clone().unwrap();
        assert_eq!(c.traffic(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
