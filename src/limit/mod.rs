//! Limits: `connlim`, `bandlimin`/`bandlimout` and the traffic counters
//! `countin`/`countout`/`countall` with their `no*` exceptions (3proxy's
//! limiter.c, auth.c `alwaysauth`, 3proxy.c `dumpcounters`).
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
//! This is the policy and its state, in memory: `connlim` the connection
//! limits, `shaping` the bandwidth buckets, `counters` the traffic
//! counters and their periods; here the lists of the cfg and what a
//! session takes from them. The `counter` file, its format and the
//! threads that write it and the reports are `crate::counter_file`, a
//! layer below: a counter hands it its changed record ([`SessionLimits`]'s
//! drop, a period's end) and [`Limits`] answers its report ticks.

mod connlim;
mod counters;
mod shaping;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::acl::{Query, Rule};
use crate::counter_file::{CounterFile, Reports};
use crate::res::Res;
use connlim::ConnLim;
use counters::{report_text, Counter, CounterView};
pub use counters::{CountKind, Period};
use shaping::Bucket;

/// Write every changed counter record now (at exit), and LdapPlugin's
/// counter files.
pub fn flush_counters() {
    crate::counter_file::flush();
    crate::dircount::flush();
}

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

    /// Whether there is a `connlim` or `noconnlim` rule.
    pub fn has_connlim(&self) -> bool {
        !self.read().conn.is_empty()
    }

    /// `connlim N PERIOD rule...` (None: `noconnlim rule...`).
    pub fn add_connlim(&self, key: &str, lim: Option<(u32, u32)>, rule: Rule) {
        let state = lim.map(|(rate, period)| shared(key, || ConnLim::new(rate, period)));
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
                Some(shared(key, || {
                    Counter::new(number, comment, period, limit, saved, unix_now())
                }))
            }
        };
        let mut r = self.write();
        r.timed |= rule.timed();
        r.count.push((rule, kind, counter));
        Ok(())
    }

    /// LdapPlugin's `ldaptrafgroup`, for one member of its group: a
    /// `bandlimin` of `bps` and a `countin` of `limit` bytes per `period`
    /// for `user` alone, put before every rule so far as the plugin puts
    /// them. The counter is not in the counter file: its state is read
    /// from, and kept in, the text file `lc` (`crate::dircount`). `key`
    /// keeps both across reloads, as a cfg line's.
    pub fn add_group_member(
        &self,
        key: &str,
        user: &str,
        bps: u64,
        period: Period,
        limit: u64,
        lc: String,
    ) {
        let rule = Rule {
            users: Some(std::collections::HashSet::from([user.to_string()])),
            ..Rule::default()
        };
        let bucket = shared(&format!("{key} bandlimin"), || Bucket::new(bps));
        let counter = shared(&format!("{key} countin"), || {
            let saved = crate::dircount::read(&lc);
            Counter::new(0, "ldapcounters".into(), period, limit, saved, unix_now())
        });
        let record: Arc<dyn crate::counter_file::Record> = counter.clone();
        crate::dircount::keep(lc, &record);
        let mut r = self.write();
        r.band_in.insert(0, (rule.clone(), Some(bucket)));
        r.count.insert(0, (rule, CountKind::In, Some(counter)));
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
                counter: c.as_ref().map(|c| c.value(now)),
            })
            .collect()
    }

    /// When a connection is accepted, before its head is read: take the
    /// `connlim` rules that its client's address alone decides (every
    /// field but the source `*`), in the order of the file, so that one
    /// host's connections cannot take every slot of a service while they
    /// send nothing. The walk stops at a matching `noconnlim` of that
    /// kind, or at a `noconnlim` it cannot decide yet (its other rules
    /// are then taken per request, as 3proxy takes them all). Err 10 when
    /// one is over its limit. None when no rule was taken.
    pub fn start_connection(&self, q: &Query<'_>) -> Result<ConnHold, Res> {
        let r = self.read();
        let mut hold = ConnHold {
            limits: self as *const Limits as usize,
            upto: 0,
            held: Vec::new(),
        };
        let now = Instant::now();
        for (rule, lim) in &r.conn {
            let decided = rule.by_source_only();
            match lim {
                None if !decided || rule.matches(q) => break,
                Some(lim) if decided && rule.matches(q) => {
                    // On refusal `hold` drops, giving back what it took.
                    if !lim.enter(now) {
                        return Err(Res::QUOTA);
                    }
                    if lim.period == 0 {
                        hold.held.push(lim.clone());
                    }
                }
                _ => {}
            }
            hold.upto += 1;
        }
        Ok(hold)
    }

    /// After a request is authorized (3proxy's `alwaysauth`): take a
    /// connlim slot, refuse with 10 past a limit or quota, and pick the
    /// session's bandwidth limiters and counters. None if no rule applies.
    /// `early`: what [`Limits::start_connection`] decided for the
    /// connection ([`ConnHold::mark`]); those rules are not taken again.
    pub fn start(
        &self,
        q: &Query<'_>,
        early: Option<(usize, usize)>,
    ) -> Result<Option<Arc<SessionLimits>>, Res> {
        let r = self.read();
        if r.conn.is_empty() && r.band_in.is_empty() && r.band_out.is_empty() && r.count.is_empty()
        {
            return Ok(None);
        }
        let mut s = SessionLimits::default();
        let now = Instant::now();
        let skip = early
            .filter(|e| e.0 == self as *const Limits as usize)
            .map_or(0, |e| e.1);
        for (i, (rule, lim)) in r.conn.iter().enumerate() {
            if i < skip && lim.is_some() && rule.by_source_only() {
                // Taken (or not) when the connection was accepted.
                continue;
            }
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

/// The `connlim` slots a connection took when it was accepted
/// ([`Limits::start_connection`]); dropping it gives them back.
#[derive(Debug)]
pub struct ConnHold {
    /// The lists it was walked in (a reload makes others).
    limits: usize,
    /// How many `connlim` rules of the list the walk decided.
    upto: usize,
    held: Vec<Arc<ConnLim>>,
}

impl ConnHold {
    /// What a request's [`Limits::start`] needs to know of it.
    pub fn mark(&self) -> (usize, usize) {
        (self.limits, self.upto)
    }
}

impl Drop for ConnHold {
    fn drop(&mut self) {
        for c in &self.held {
            c.leave();
        }
    }
}

/// What one session may do: its limiters, counters and connlim slots.
/// Dropping it gives back the slots and adds its traffic to the counters.
#[derive(Debug, Default)]
pub struct SessionLimits {
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

impl SessionLimits {
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

    /// A record's bytes (in, out) were `was` and it says `now` (corrected
    /// by TrafficPlugin's rules): the counters take the difference.
    pub fn recount(&self, was: (u64, u64), now: (u64, u64)) {
        for (moved, was, now) in [
            (&self.moved_in, was.0, now.0),
            (&self.moved_out, was.1, now.1),
        ] {
            if now > was {
                moved.fetch_add(now - was, Ordering::Relaxed);
            } else if now < was {
                let _ = moved.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    Some(m.saturating_sub(was - now))
                });
            }
        }
    }

    fn dir(&self, out: bool) -> (&[Arc<Bucket>], Option<u64>, &AtomicU64) {
        if out {
            (&self.band_out, self.budget_out, &self.moved_out)
        } else {
            (&self.band_in, self.budget_in, &self.moved_in)
        }
    }
}

impl Drop for SessionLimits {
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
                        crate::counter_file::mark(f, c.number, c.clone());
                    }
                }
            }
        }
    }
}

/// Make `limits` (a cfg with `counter FILE TYPE REPORTNAME`) the one whose
/// reports are written, starting the report thread if need be.
pub fn start_reports(limits: &Arc<Limits>) {
    // A new process goes on from the file's last update, so a period
    // that ended while it was down is still reported.
    let since = limits.read().file.as_ref().map_or(0, |f| f.updated());
    let weak: Weak<Limits> = Arc::downgrade(limits);
    let source: Weak<dyn Reports> = weak;
    crate::counter_file::start_reports(source, since);
}

/// The report ticks of the cfg that last named a report (3proxy does
/// this in its once-a-minute counter dump).
impl Reports for Limits {
    fn tick(&self, last: i64, now: i64) -> Option<(String, String)> {
        let r = self.read();
        let mut due = None;
        if let Some((period, name)) = &r.report {
            if last > 0 && period.changed(last, now) {
                let path = crate::log::period_file_name(name, period.to_log(), last);
                due = Some((path, report_text(&r.count, *period, last)));
            }
        }
        // Counters whose period ended start again now, in the file too.
        for c in r.count.iter().filter_map(|(_, _, c)| c.as_ref()) {
            if c.restart(now) && c.number > 0 {
                if let Some(f) = &r.file {
                    crate::counter_file::mark(f, c.number, c.clone());
                }
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn rule(line: &str) -> Rule {
        let f: Vec<String> = line.split_whitespace().map(String::from).collect();
        Rule::parse(&f).unwrap()
    }

    pub(super) fn q(src: &str) -> Query<'static> {
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
        let a = l.start(&q("10.0.0.1"), None).unwrap();
        let b = l.start(&q("10.0.0.1"), None).unwrap();
        assert_eq!(l.start(&q("10.0.0.1"), None).unwrap_err(), Res(10));
        assert!(
            l.start(&q("10.0.0.2"), None).is_ok(),
            "another source is not limited"
        );
        drop(a);
        let c = l.start(&q("10.0.0.1"), None).unwrap();
        drop((b, c));
    }

    /// A source-only rule is taken once per connection, when it is
    /// accepted, and not again by its requests; a rule that needs the
    /// request is taken per request; a `noconnlim` the source cannot
    /// decide ends the early walk.
    #[test]
    fn source_rules_are_taken_per_connection_before_the_head() {
        let l = Limits::default();
        l.add_connlim("test-early a", Some((2, 0)), rule("* 10.0.0.1"));
        l.add_connlim("test-early b", Some((1, 0)), rule("* * 192.0.2.1"));
        let c1 = l.start_connection(&q("10.0.0.1")).unwrap();
        let c2 = l.start_connection(&q("10.0.0.1")).unwrap();
        assert_eq!(l.start_connection(&q("10.0.0.1")).unwrap_err(), Res(10));
        // Its requests do not count against rule a again.
        let to = |ip: &str| Query {
            dst: Some(ip.parse().unwrap()),
            ..q("10.0.0.1")
        };
        let r1 = l.start(&to("192.0.2.9"), Some(c1.mark())).unwrap();
        let r2 = l.start(&to("192.0.2.9"), Some(c2.mark())).unwrap();
        // Rule b is the request's: one at a time.
        let r3 = l.start(&to("192.0.2.1"), Some(c1.mark())).unwrap();
        assert!(l.start(&to("192.0.2.1"), Some(c2.mark())).is_err());
        drop((r1, r2, r3, c2));
        let c3 = l.start_connection(&q("10.0.0.1")).unwrap();
        drop((c1, c3));

        let l = Limits::default();
        l.add_connlim("test-early c", None, rule("alice"));
        l.add_connlim("test-early d", Some((0, 0)), rule("* 10.0.0.1"));
        let c = l.start_connection(&q("10.0.0.1")).unwrap();
        assert_eq!(c.mark().1, 0, "the walk stopped at the user's exception");
        let alice = Query {
            user: Some("alice"),
            ..q("10.0.0.1")
        };
        assert!(l.start(&alice, Some(c.mark())).is_ok());
        assert!(l.start(&q("10.0.0.1"), Some(c.mark())).is_err());
    }

    #[test]
    fn noconnlim_is_an_exception() {
        let l = Limits::default();
        l.add_connlim("test-noconnlim", None, rule("* 10.0.0.1"));
        l.add_connlim("test-noconnlim connlim 0 0", Some((0, 0)), rule("*"));
        assert!(l.start(&q("10.0.0.1"), None).is_ok());
        assert_eq!(l.start(&q("10.0.0.2"), None).unwrap_err(), Res(10));
    }

    #[test]
    fn a_refusal_gives_back_earlier_slots() {
        let l = Limits::default();
        l.add_connlim("test-giveback a", Some((5, 0)), rule("*"));
        l.add_connlim("test-giveback b", Some((0, 0)), rule("* 10.0.0.9"));
        for _ in 0..10 {
            assert!(l.start(&q("10.0.0.9"), None).is_err());
        }
        let held: Vec<_> = (0..5)
            .map(|_| l.start(&q("10.0.0.1"), None).unwrap())
            .collect();
        assert!(l.start(&q("10.0.0.1"), None).is_err());
        drop(held);
    }

    #[test]
    fn sessions_share_a_rules_bucket() {
        let l = Limits::default();
        l.add_bandlim("test-share bandlimout 8000", true, Some(8000), rule("*"));
        let a = l.start(&q("10.0.0.1"), None).unwrap().unwrap();
        let b = l.start(&q("10.0.0.2"), None).unwrap().unwrap();
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
        assert!(l.start(&pop, None).unwrap().unwrap().band_in.is_empty());
        let web = Query {
            port: 80,
            ..q("10.0.0.1")
        };
        assert_eq!(l.start(&web, None).unwrap().unwrap().band_in.len(), 1);
    }

    #[test]
    fn counters_refuse_past_the_quota_and_count_on_drop() {
        let l = Limits::default();
        let spec = Some((0, String::new(), Period::Never, 1000));
        l.add_counter("test-count out", CountKind::Out, spec, rule("*"))
            .unwrap();
        let s = l.start(&q("10.0.0.1"), None).unwrap().unwrap();
        assert_eq!(s.budget_out, Some(1000));
        assert_eq!(s.budget_in, None);
        s.used(true, 600, Instant::now());
        assert!(matches!(s.permit(true, Instant::now()), Permit::Go(400)));
        s.used(true, 400, Instant::now());
        assert_eq!(s.permit(true, Instant::now()), Permit::Stop);
        let c = s.count_out[0].clone();
        drop(s);
        assert_eq!(c.traffic(), 1000);
        assert_eq!(l.start(&q("10.0.0.1"), None).unwrap_err(), Res(10));
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
            .start(&q("10.0.0.2"), None)
            .unwrap()
            .unwrap()
            .count_in
            .is_empty());
        let s = l.start(&q("10.0.0.1"), None).unwrap().unwrap();
        s.add(100, 20);
        let c = s.count_in[0].clone();
        drop(s);
        assert_eq!(c.traffic(), 120);
    }
}
