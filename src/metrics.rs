//! The counters the admin service's `/metrics` shows (Prometheus text
//! exposition format): per service, per parent, per user (up to
//! `metricsusers` users; the others summed as `user="other"`), and the
//! process's own.
//!
//! The counters live here, process-wide, keyed by what a user recognizes
//! across reloads (a service by its name and port, a parent by its type
//! and address), so a reload keeps them: a `Service` snapshot holds an
//! `Arc` of its service's counters, got once when the cfg is read.
//! On a session's path there are only relaxed atomic adds: at accept, at
//! its end, and at each log record (per request for HTTP), into one of a
//! service's [`CELLS`] sets of counters chosen per thread, so threads on
//! different cores seldom share a cache line; a user's counters are looked
//! up (a read lock) only for records with a user.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::res::{Res, CLASSES};

const R: Ordering = Ordering::Relaxed;

/// One set of a service's counters.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Cell {
    accepted: AtomicU64,
    active: AtomicI64,
    refused: AtomicU64,
    results: [AtomicU64; CLASSES.len()],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// Sets of counters per service: each thread adds to one of them, so
/// client threads on different cores rarely write the same cache line;
/// `/metrics` sums them.
const CELLS: usize = 8;

static NEXT_CELL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The cell this thread adds to, dealt round-robin.
    static MY_CELL: usize = NEXT_CELL.fetch_add(1, R) % CELLS;
}

/// A service's counters (by name and port).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    cells: [Cell; CELLS],
}

/// A service's counters, summed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Totals {
    pub accepted: u64,
    pub active: i64,
    /// Records with a refusal by authentication or the ACL (codes 1-9).
    pub refused: u64,
    /// Records by [`Res::class`].
    pub results: [u64; CLASSES.len()],
    /// Server to client.
    pub bytes_in: u64,
    /// Client to server.
    pub bytes_out: u64,
}

impl ServiceCounters {
    fn cell(&self) -> &Cell {
        &self.cells[MY_CELL.with(|c| *c)]
    }

    /// A client was accepted.
    pub fn accepted(&self) {
        let c = self.cell();
        c.accepted.fetch_add(1, R);
        c.active.fetch_add(1, R);
    }

    /// An accepted client is gone.
    pub fn ended(&self) {
        self.cell().active.fetch_sub(1, R);
    }

    /// A log record (whether or not a log is written): its code and bytes.
    /// Inlined into the record's path; a user's counters are out of it.
    #[inline]
    pub fn record(&self, res: Res, out: u64, inb: u64, user: Option<&str>) {
        let c = self.cell();
        c.results[res.class()].fetch_add(1, R);
        if res.is_auth() {
            c.refused.fetch_add(1, R);
        }
        c.bytes_in.fetch_add(inb, R);
        c.bytes_out.fetch_add(out, R);
        if let Some(u) = user {
            record_user(u, out, inb);
        }
    }

    /// The sum of the cells.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for c in &self.cells {
            t.accepted += c.accepted.load(R);
            t.active += c.active.load(R);
            t.refused += c.refused.load(R);
            for (i, r) in c.results.iter().enumerate() {
                t.results[i] += r.load(R);
            }
            t.bytes_in += c.bytes_in.load(R);
            t.bytes_out += c.bytes_out.load(R);
        }
        t
    }
}

type ServiceKey = (&'static str, u16);

static SERVICES: Mutex<BTreeMap<ServiceKey, Arc<ServiceCounters>>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The counters of service `name` on `port` (made at first use; the same
/// ones after a reload).
pub fn service(name: &'static str, port: u16) -> Arc<ServiceCounters> {
    lock(&SERVICES).entry((name, port)).or_default().clone()
}

/// A parent's counters.
#[derive(Debug, Default)]
pub struct ParentCounters {
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
}

static PARENTS: Mutex<BTreeMap<String, Arc<ParentCounters>>> = Mutex::new(BTreeMap::new());

/// The counters of the parent named `key` (its type and address).
pub fn parent(key: &str) -> Arc<ParentCounters> {
    let mut m = lock(&PARENTS);
    if let Some(c) = m.get(key) {
        return c.clone();
    }
    m.entry(key.to_string()).or_default().clone()
}

/// A user's counters.
#[derive(Debug, Default)]
pub struct UserCounters {
    pub requests: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

/// `metricsusers`' default.
pub const DEFAULT_USER_CAP: usize = 100;

static USER_CAP: AtomicUsize = AtomicUsize::new(DEFAULT_USER_CAP);
static USERS: RwLock<Option<HashMap<String, Arc<UserCounters>>>> = RwLock::new(None);
static OTHER: std::sync::LazyLock<Arc<UserCounters>> = std::sync::LazyLock::new(Arc::default);

/// `metricsusers N`: at most N users get series of their own.
pub fn set_user_cap(n: usize) {
    USER_CAP.store(n, R);
}

/// A record of user `u`: its counters.
#[inline(never)]
fn record_user(u: &str, out: u64, inb: u64) {
    let c = user_counters(u);
    c.requests.fetch_add(1, R);
    c.bytes_in.fetch_add(inb, R);
    c.bytes_out.fetch_add(out, R);
}

fn user_counters(u: &str) -> Arc<UserCounters> {
    {
        let m = USERS.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.as_ref().and_then(|m| m.get(u)) {
            return c.clone();
        }
    }
    let mut m = USERS.write().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    if let Some(c) = m.get(u) {
        return c.clone();
    }
    if m.len() >= USER_CAP.load(R) {
        return OTHER.clone();
    }
    m.entry(u.to_string()).or_default().clone()
}

static RELOADS: AtomicU64 = AtomicU64::new(0);
static RELOAD_FAILURES: AtomicU64 = AtomicU64::new(0);
static CFG_HASH: AtomicU64 = AtomicU64::new(0);

/// A reload took effect.
pub fn reloaded() {
    RELOADS.fetch_add(1, R);
}

/// A reload was refused (the running cfg stays).
pub fn reload_failed() {
    RELOAD_FAILURES.fetch_add(1, R);
}

/// The text of the cfg now serving (its hash is shown).
pub fn set_cfg(text: &[u8]) {
    CFG_HASH.store(fnv1a(text), R);
}

/// FNV-1a, 64 bits: a cfg's fingerprint, not a secret.
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A label value, escaped as the exposition format says.
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// What the process measures of itself when asked.
pub struct Process {
    pub threads: u64,
    pub open_fds: u64,
    pub rss_bytes: u64,
}

/// Read the process's threads, descriptors and resident memory from
/// /proc.
pub fn process() -> Process {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    Process {
        threads: field("Threads:"),
        open_fds,
        rss_bytes: field("VmRSS:") * 1024,
    }
}

/// A parent's health as `/metrics` shows it (from `crate::health`,
/// which the caller asks).
#[derive(Debug, Clone, PartialEq)]
pub struct ParentHealth {
    /// `TYPE HOST:PORT`, as the parent counters name it.
    pub name: String,
    pub up: bool,
    /// Unix time it was marked down; None while up.
    pub down_since: Option<f64>,
    /// Failures in a row.
    pub fails: u32,
}

/// The whole exposition; `live` is how many sessions are live.
pub fn render(live: usize, parked: usize, health: &[ParentHealth]) -> String {
    let mut out = String::new();
    render_services(&mut out);
    render_parents(&mut out);
    render_health(&mut out, health);
    render_users(&mut out);
    render_process(&mut out, live, parked);
    render_cfg(&mut out);
    out
}

/// The per-service series: the counters, then the results by class.
fn render_services(out: &mut String) {
    let services: Vec<(ServiceKey, Totals)> = lock(&SERVICES)
        .iter()
        .map(|(k, v)| (*k, v.totals()))
        .collect();
    let svc_label =
        |(name, port): ServiceKey| format!("service=\"{}\",port=\"{port}\"", label(name));
    type Get = fn(&Totals) -> i64;
    let per_service: [(&str, &str, &str, Get); 5] = [
        (
            "threeproxy_service_accepted_total",
            "counter",
            "Clients the service accepted.",
            |c| c.accepted as i64,
        ),
        (
            "threeproxy_service_active",
            "gauge",
            "Clients the service is serving now.",
            |c| c.active,
        ),
        (
            "threeproxy_service_refused_total",
            "counter",
            "Records refused by authentication or the ACL (result codes 1-9).",
            |c| c.refused as i64,
        ),
        (
            "threeproxy_service_bytes_in_total",
            "counter",
            "Bytes from servers to clients (%I of the records).",
            |c| c.bytes_in as i64,
        ),
        (
            "threeproxy_service_bytes_out_total",
            "counter",
            "Bytes from clients to servers (%O of the records).",
            |c| c.bytes_out as i64,
        ),
    ];
    for (name, kind, help, get) in per_service {
        head(out, name, kind, help);
        for (k, c) in &services {
            let _ = writeln!(out, "{name}{{{}}} {}", svc_label(*k), get(c));
        }
    }
    let name = "threeproxy_service_results_total";
    head(
        out,
        name,
        "counter",
        "Records by class of result code (%E), as 3proxy.cfg(5) RESULT CODES groups them.",
    );
    for (k, c) in &services {
        for (i, class) in CLASSES.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{{},code_class=\"{class}\"}} {}",
                svc_label(*k),
                c.results[i]
            );
        }
    }
}

/// The per-parent attempt and failure counters.
fn render_parents(out: &mut String) {
    let parents: Vec<(String, Arc<ParentCounters>)> = lock(&PARENTS)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (name, help, attempts) in [
        (
            "threeproxy_parent_attempts_total",
            "Connection attempts through the parent.",
            true,
        ),
        (
            "threeproxy_parent_failures_total",
            "Attempts through the parent that failed.",
            false,
        ),
    ] {
        head(out, name, "counter", help);
        for (k, c) in &parents {
            let v = if attempts { &c.attempts } else { &c.failures };
            let _ = writeln!(out, "{name}{{parent=\"{}\"}} {}", label(k), v.load(R));
        }
    }
}

/// The parents' health gauges, from `health`.
fn render_health(out: &mut String, health: &[ParentHealth]) {
    type HealthGet = fn(&ParentHealth) -> String;
    for (name, help, get) in [
        (
            "threeproxy_parent_up",
            "1 while the parent is up, 0 while parenthealth has it marked down.",
            (|h: &ParentHealth| u8::from(h.up).to_string()) as HealthGet,
        ),
        (
            "threeproxy_parent_down_since_seconds",
            "Unix time the parent was marked down; 0 while it is up.",
            |h| {
                h.down_since
                    .map_or_else(|| "0".into(), |t| format!("{t:.3}"))
            },
        ),
        (
            "threeproxy_parent_consecutive_failures",
            "Attempts through the parent that failed in a row.",
            |h| h.fails.to_string(),
        ),
    ] {
        head(out, name, "gauge", help);
        for h in health {
            let _ = writeln!(out, "{name}{{parent=\"{}\"}} {}", label(&h.name), get(h));
        }
    }
}

/// The per-user counters, users in name order, then `user="other"` if
/// any record went there.
fn render_users(out: &mut String) {
    let mut users: Vec<(String, Arc<UserCounters>)> = USERS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    users.sort_by(|a, b| a.0.cmp(&b.0));
    let other = OTHER.clone();
    let other_used = other.requests.load(R) > 0;
    for (name, help, get) in [
        (
            "threeproxy_user_requests_total",
            "Records of the user (sessions; HTTP requests).",
            (|c: &UserCounters| c.requests.load(R)) as fn(&UserCounters) -> u64,
        ),
        (
            "threeproxy_user_bytes_in_total",
            "Bytes from servers to the user.",
            |c| c.bytes_in.load(R),
        ),
        (
            "threeproxy_user_bytes_out_total",
            "Bytes from the user to servers.",
            |c| c.bytes_out.load(R),
        ),
    ] {
        head(out, name, "counter", help);
        for (u, c) in &users {
            let _ = writeln!(out, "{name}{{user=\"{}\"}} {}", label(u), get(c));
        }
        if other_used {
            // Users beyond `metricsusers`, summed.
            let _ = writeln!(out, "{name}{{user=\"other\"}} {}", get(&other));
        }
    }
}

/// The process's own series: threads, descriptors, memory, sessions and
/// reloads.
fn render_process(out: &mut String, live: usize, parked: usize) {
    let p = process();
    for (name, kind, help, v) in [
        (
            "threeproxy_threads",
            "gauge",
            "Threads of the process.",
            p.threads,
        ),
        (
            "threeproxy_open_fds",
            "gauge",
            "Open file descriptors of the process.",
            p.open_fds,
        ),
        (
            "threeproxy_resident_memory_bytes",
            "gauge",
            "Resident memory of the process.",
            p.rss_bytes,
        ),
        (
            "threeproxy_live_sessions",
            "gauge",
            "Client sessions now registered (/sessions).",
            live as u64,
        ),
        (
            "threeproxy_parked_sessions",
            "gauge",
            "Sessions waiting in the parking lot, without a thread (parklinger).",
            parked as u64,
        ),
        (
            "threeproxy_reloads_total",
            "counter",
            "Reloads that took effect.",
            RELOADS.load(R),
        ),
        (
            "threeproxy_reload_failures_total",
            "counter",
            "Reloads refused (the running configuration stayed).",
            RELOAD_FAILURES.load(R),
        ),
    ] {
        head(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// The hash of the cfg now serving.
fn render_cfg(out: &mut String) {
    let name = "threeproxy_cfg_info";
    head(
        out,
        name,
        "gauge",
        "The configuration now serving: its FNV-1a hash in the label.",
    );
    let _ = writeln!(out, "{name}{{hash=\"{:016x}\"}} 1", CFG_HASH.load(R));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_keep_their_counters() {
        let a = service("metrics-test", 9);
        a.accepted();
        a.record(Res::ACL_DENY, 3, 4, None);
        let b = service("metrics-test", 9);
        assert!(Arc::ptr_eq(&a, &b));
        let down = ParentHealth {
            name: "socks5 192.0.2.1:1080".into(),
            up: false,
            down_since: Some(1700000000.5),
            fails: 4,
        };
        let text = render(0, 0, &[down]);
        assert!(text
            .contains("threeproxy_service_refused_total{service=\"metrics-test\",port=\"9\"} 1\n"));
        assert!(text.contains("threeproxy_parent_up{parent=\"socks5 192.0.2.1:1080\"} 0\n"));
        assert!(text.contains(
            "threeproxy_parent_down_since_seconds{parent=\"socks5 192.0.2.1:1080\"} 1700000000.500\n"
        ));
        assert!(text.contains(
            "threeproxy_parent_consecutive_failures{parent=\"socks5 192.0.2.1:1080\"} 4\n"
        ));
        assert!(text.contains(
            "threeproxy_service_results_total{service=\"metrics-test\",port=\"9\",code_class=\"1-10\"} 1\n"
        ));
        assert!(text.contains(
            "threeproxy_service_bytes_in_total{service=\"metrics-test\",port=\"9\"} 4\n"
        ));
    }

    #[test]
    fn threads_add_to_cells_that_sum_up() {
        let c = Arc::new(ServiceCounters::default());
        let threads: Vec<_> = (0..CELLS + 3)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    c.accepted();
                    c.record(Res::OK, 10, 1, None);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Ended on another thread than accepted: the sum is still right.
        c.ended();
        let t = c.totals();
        assert_eq!(t.accepted, CELLS as u64 + 3);
        assert_eq!(t.active, CELLS as i64 + 2);
        assert_eq!(t.results[0], CELLS as u64 + 3);
        assert_eq!(t.bytes_out, 10 * (CELLS as u64 + 3));
        assert_eq!(t.bytes_in, CELLS as u64 + 3);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
