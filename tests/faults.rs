//! Fault injection: the proxy under conditions a machine imposes on it.
//! Out of descriptors (RLIMIT_NOFILE), out of threads (a cgroup's pids
//! limit), the access log's disk full and the counter file's disk full
//! (a small tmpfs in a mount namespace of the proxy's own), the resolver
//! unreachable, a parent that accepts and never answers, and SIGKILL
//! while counters are being written. Each time: the clients the proxy
//! can serve are served, the others are refused promptly, the loss is
//! reported once, and the proxy recovers when the condition ends.
//!
//! A parent that never answers in a weight group with others is in
//! `failover.rs` (a_black_holed_parent_stops_costing_requests_after_three_failures);
//! here it is the only parent, and the CHAIN timeout bounds the wait.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// A client that must be refused (closed before any answer) within this.
const REFUSED_WITHIN: Duration = Duration::from_secs(3);

/// What a fresh client of `port` that sends `hello` sees within
/// [`REFUSED_WITHIN`]: Some(true) if it is closed (EOF or reset) before
/// any answer, Some(false) if it gets an answer, None if it is left
/// waiting.
fn refused(port: u16, hello: &[u8]) -> Option<bool> {
    let Ok(mut s) = TcpStream::connect(localhost(port)) else {
        return Some(true);
    };
    s.set_read_timeout(Some(REFUSED_WITHIN)).unwrap();
    let _ = s.write_all(hello);
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => Some(true),
        Ok(_) => Some(false),
        Err(e) if is_timeout(&e) => None,
        Err(_) => Some(true),
    }
}

/// An echo roundtrip on a new tcppm client, kept open.
fn served(port: u16, msg: &[u8]) -> Option<TcpStream> {
    let mut s = TcpStream::connect(localhost(port)).ok()?;
    set_timeouts(&s, REFUSED_WITHIN);
    s.write_all(msg).ok()?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).ok()?;
    (back == msg).then_some(s)
}

/// `sh -c 'ulimit -n N; exec "$@"' sh`: the proxy with N descriptors.
fn with_nofile(n: u32) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("ulimit -n {n} && exec \"$@\""),
        "sh".into(),
    ]
}

/// The proxy in a mount namespace of its own with a tmpfs of `kb` KiB
/// mounted on `mnt` (which the test reaches through /proc/PID/root);
/// with `full`, a file `filler` takes all its room before the proxy runs.
fn with_tmpfs(mnt: &Path, kb: u32, full: bool) -> Vec<String> {
    std::fs::create_dir_all(mnt).unwrap();
    let fill = if full {
        format!("dd if=/dev/zero of={}/filler bs=1k 2>/dev/null; ", p(mnt))
    } else {
        String::new()
    };
    vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount -t tmpfs -o size={kb}k tmpfs {} && {fill}exec \"$@\"",
            p(mnt)
        ),
        "sh".into(),
    ]
}

fn start_via(dir: Dir, wrapper: &[String], cfg: &str, ready: &[Listen]) -> Proxy {
    let w: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Proxy::start_via(dir, &w, cfg, ready)
}

/// `path` as the proxy sees it, from outside its mount namespace.
fn inside(proxy: &Proxy, path: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{}", proxy.pid(), p(path)))
}

fn count(text: &str, what: &str) -> usize {
    text.lines().filter(|l| l.contains(what)).count()
}

// ---------------------------------------------------------------------------

#[test]
fn out_of_descriptors_refuses_new_clients_serves_the_old_and_recovers() {
    let origin = Origin::echo();
    let (pt, ps) = (free_port(), free_port());
    // BYTE_SHORT and BYTE_LONG 60 s and no minrate: idle SOCKS clients
    // stay.
    let cfg = format!(
        "timeouts 60 60\nminrate 0\ntcppm -i127.0.0.1 {pt} 127.0.0.1 {}\nsocks -i127.0.0.1 -p{ps}\n",
        origin.port()
    );
    let proxy = start_via(
        Dir::new("fault_nofile"),
        &with_nofile(32),
        &cfg,
        &[Listen::Tcp(localhost(pt)), Listen::Tcp(localhost(ps))],
    );
    // Three sessions that must go on being served.
    let mut held: Vec<TcpStream> = (0..3)
        .map(|i| served(pt, format!("held {i}").as_bytes()).expect("a held session"))
        .collect();
    // Idle SOCKS clients (one descriptor each) until there is none left:
    // the first one the proxy closes at once.
    let mut idle = Vec::new();
    let mut exhausted = false;
    for _ in 0..64 {
        let s = TcpStream::connect(localhost(ps)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 1];
        match (&s).read(&mut b) {
            Err(e) if is_timeout(&e) => idle.push(s),
            // Answered (never, with no request) or refused.
            _ => {
                exhausted = true;
                break;
            }
        }
    }
    assert!(exhausted, "64 idle clients and descriptors to spare?");
    // Out of descriptors: new clients of either service are closed at
    // once, not left in the backlog; the acceptors do not spin.
    // SOCKS clients first: a tcppm client the proxy closes for want of a
    // descriptor to reach the origin frees one, which a SOCKS client
    // after it may get and be answered with (3 of 10 alternating ones
    // were, once); the tcppm clients come last.
    let cpu = proxy.cpu_time();
    let t = Instant::now();
    let mut refusals = 0;
    let mut answered = Vec::new();
    for i in 0..10 {
        let port = if i < 8 { ps } else { pt };
        match refused(port, b"\x05\x01\x00") {
            Some(true) => refusals += 1,
            Some(false) => answered.push(i),
            None => panic!("client {i} was left waiting\n{}", proxy.stderr()),
        }
    }
    assert!(
        refusals >= 8,
        "only {refusals} of 10 refused (answered: {answered:?})\n{}",
        proxy.stderr()
    );
    thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
    let spent = proxy.cpu_time() - cpu;
    let wall = t.elapsed();
    assert!(
        spent < wall / 4,
        "the proxy used {spent:?} of CPU in {wall:?} out of descriptors"
    );
    // The sessions it had go on.
    for (i, s) in held.iter_mut().enumerate() {
        echo_roundtrip(s, format!("still served {i}").as_bytes());
    }
    assert!(
        proxy
            .stderr()
            .contains("refusing new clients until descriptors free"),
        "not reported:\n{}",
        proxy.stderr()
    );
    assert!(
        count(&proxy.stderr(), "accept():") <= 2 * (wall.as_secs() as usize + 1) + 2,
        "reported too often:\n{}",
        proxy.stderr()
    );
    // Descriptors free: served again.
    drop(idle);
    assert!(
        wait_for(|| served(pt, b"after").is_some(), Duration::from_secs(5)),
        "not served after descriptors freed\n{}",
        proxy.stderr()
    );
    drop(held);
}

/// A pids cgroup (v1) holding the proxy: at most `max` threads.
struct PidsCgroup(PathBuf);

impl PidsCgroup {
    fn new(tag: &str) -> PidsCgroup {
        let path = PathBuf::from(format!(
            "/sys/fs/cgroup/pids/threeproxy-test-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("create {}: {e} (needs root)", path.display()));
        PidsCgroup(path)
    }

    fn set_max(&self, n: usize) {
        std::fs::write(self.0.join("pids.max"), n.to_string()).unwrap();
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // Empty once the proxy is reaped (it is dropped first).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn out_of_threads_refuses_the_client_and_the_acceptor_goes_on() {
    let cg = PidsCgroup::new("threads");
    let origin = Origin::echo();
    let pt = free_port();
    let cfg = format!("tcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n", origin.port());
    let proxy = start_via(
        Dir::new("fault_threads"),
        &[],
        &cfg,
        &[Listen::Tcp(localhost(pt))],
    );
    // The readiness check's client thread is parked; two more may start.
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", proxy.pid()))
            .unwrap()
            .count()
    };
    cg.set_max(threads() + 2);
    cg.enter(proxy.pid());
    let mut held = Vec::new();
    let mut refusals = 0;
    for i in 0..8 {
        match served(pt, format!("client {i}").as_bytes()) {
            Some(s) => held.push(s),
            None => refusals += 1,
        }
        if refusals > 0 {
            break;
        }
    }
    assert_eq!(
        refusals,
        1,
        "no client was refused with {} held",
        held.len()
    );
    assert!(!held.is_empty(), "no client was served");
    assert!(
        wait_for(
            || proxy.stderr().contains("cannot start a client thread"),
            LOG_TIMEOUT
        ),
        "the refusal is not logged:\n{}",
        proxy.stderr()
    );
    // The acceptor survived: a finished client's thread serves the next.
    for (i, s) in held.iter_mut().enumerate() {
        echo_roundtrip(s, format!("held {i}").as_bytes());
    }
    drop(held.pop());
    assert!(
        wait_for(|| served(pt, b"next").is_some(), Duration::from_secs(5)),
        "no client served after a thread freed\n{}",
        proxy.stderr()
    );
    drop(proxy);
}

#[test]
fn a_full_log_disk_loses_records_reported_once_and_clients_are_served() {
    let dir = Dir::new("fault_logfull");
    let mnt = dir.join("small");
    let log = mnt.join("access.log");
    let origin = Origin::echo();
    let pt = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %t %E %C:%c %R:%r %I %O padding to make the record longer\"\n\
         tcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n",
        p(&log),
        origin.port()
    );
    let wrapper = with_tmpfs(&mnt, 16, false);
    let proxy = start_via(dir, &wrapper, &cfg, &[Listen::Tcp(localhost(pt))]);
    let log_in = inside(&proxy, &log);
    // 16 KiB of log holds about 150 records: 400 sessions overflow it.
    for i in 0..400 {
        let s = served(pt, format!("session {i}").as_bytes());
        assert!(
            s.is_some(),
            "session {i} was not served\n{}",
            proxy.stderr()
        );
    }
    assert!(
        wait_for(
            || proxy.stderr().contains("records are lost until"),
            LOG_TIMEOUT
        ),
        "the loss is not reported:\n{}",
        proxy.stderr()
    );
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        count(&proxy.stderr(), "access log"),
        1,
        "reported more than once:\n{}",
        proxy.stderr()
    );
    // Room again (the log emptied): records are written, and how many
    // were lost is said once.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log_in)
        .unwrap()
        .set_len(0)
        .unwrap();
    served(pt, b"after").expect("served after");
    assert!(
        wait_for(|| proxy.stderr().contains("writing again"), LOG_TIMEOUT),
        "recovery not reported:\n{}",
        proxy.stderr()
    );
    let text = std::fs::read_to_string(&log_in).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.iter().any(|l| !l.is_empty()),
        "nothing logged after the recovery: {text:?}"
    );
    // Every line is a whole record (the first after a torn one starts on
    // a line of its own).
    for l in &lines {
        assert!(
            l.starts_with("TCPPM ") && l.ends_with("record longer") || l.is_empty(),
            "a torn record: {l:?}\n{text}"
        );
    }
    let stderr = proxy.stderr();
    let said = stderr
        .lines()
        .find(|l| l.contains("writing again"))
        .unwrap();
    assert!(said.contains("records were lost"), "{said}");
}

#[test]
fn an_unwritable_counter_file_is_reported_once_and_caught_up() {
    let dir = Dir::new("fault_counterfull");
    let mnt = dir.join("small");
    let counters = mnt.join("counters");
    let origin = Origin::echo();
    let pt = free_port();
    let cfg = format!(
        "counter {}\ncountall 1/total D 100 *\ntcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n",
        p(&counters),
        origin.port()
    );
    let wrapper = with_tmpfs(&mnt, 64, true);
    let proxy = start_via(dir, &wrapper, &cfg, &[Listen::Tcp(localhost(pt))]);
    let file_in = inside(&proxy, &counters);
    let filler = inside(&proxy, &mnt.join("filler"));
    // Sessions go on while the file cannot be written.
    let mut moved = 0;
    for i in 0..20 {
        let msg = format!("counted session {i:04}");
        drop(served(pt, msg.as_bytes()).expect("served"));
        moved += 2 * msg.len() as u64;
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        wait_for(|| proxy.stderr().contains("counter file"), LOG_TIMEOUT),
        "the failure is not reported:\n{}",
        proxy.stderr()
    );
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        count(&proxy.stderr(), "counter file"),
        1,
        "reported more than once:\n{}",
        proxy.stderr()
    );
    // Room again: the counter reaches the file with no new session.
    std::fs::remove_file(&filler).unwrap();
    // (The readiness probe moved nothing.)
    assert!(
        wait_for(
            || counter_record(&file_in, 1) == Some(moved),
            Duration::from_secs(5)
        ),
        "record 1 is {:?}, want {moved}\n{}",
        counter_record(&file_in, 1),
        proxy.stderr()
    );
    assert!(
        wait_for(|| proxy.stderr().contains("written again"), LOG_TIMEOUT),
        "recovery not reported:\n{}",
        proxy.stderr()
    );
}

#[test]
fn an_unreachable_resolver_fails_names_promptly_and_not_addresses() {
    let closed = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let web = Origin::start("127.0.0.1:0", |mut c| {
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&b[..n]),
            }
        }
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    });
    let ph = free_port();
    // DNS timeout 2 s.
    let body = format!(
        "timeouts 1 5 30 60 180 1800 2\nnserver 127.0.0.1:{closed}\nproxy -i127.0.0.1 -p{ph}\n"
    );
    let (proxy, log) = start(Dir::new("fault_resolver"), "L%E %n", &body, &[ph]);
    let named = thread::spawn(move || get_owned(ph, "nowhere.test".into()));
    let (text, took) = get_owned(ph, format!("127.0.0.1:{}", web.port()));
    assert!(text.starts_with("HTTP/1.1 200"), "by address: {text}");
    assert!(took < Duration::from_secs(1), "by address took {took:?}");
    let (text, took) = named.join().unwrap();
    assert!(
        text.starts_with("HTTP/1.0 502") || text.starts_with("HTTP/1.1 502"),
        "by name: {text}"
    );
    assert!(took < Duration::from_secs(5), "by name took {took:?}");
    let line = read_log_line(&log, "the record of the name", |l| {
        l.contains("nowhere.test")
    });
    assert!(line.starts_with("00100 "), "{line}");
    drop(proxy);
}

/// A GET of `http://host/` through the proxy on `port`: the whole answer
/// and how long it took.
fn get_owned(port: u16, host: String) -> (String, Duration) {
    let t = Instant::now();
    let request =
        format!("GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    (http_once(port, request.as_bytes()).to_string(), t.elapsed())
}

#[test]
fn a_sole_parent_that_never_answers_is_bounded_by_the_chain_timeout() {
    // Accepts and never answers.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let keep = Arc::new(AtomicBool::new(true));
    let k = keep.clone();
    let holder = thread::spawn(move || {
        hole.set_nonblocking(true).unwrap();
        let mut held = Vec::new();
        while k.load(Ordering::SeqCst) {
            if let Ok((c, _)) = hole.accept() {
                held.push(c);
            }
            thread::sleep(Duration::from_millis(5));
        }
    });
    let origin = Origin::echo();
    let pt = free_port();
    let dir = Dir::new("fault_silent_parent");
    let log = dir.join("access.log");
    // CHAIN 2 s.
    let cfg = format!(
        "log {}\nlogformat \"L%E %h\"\ntimeouts 1 5 30 60 180 1800 15 2\nallow *\n\
         parent 1000 connect 127.0.0.1 {hole_port}\ntcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n",
        p(&log),
        origin.port()
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(pt))]);
    // (The readiness probe drew the parent too.)
    let t = Instant::now();
    let mut s = connect(localhost(pt));
    s.write_all(b"hello").unwrap();
    let got = read_until_closed(&mut s).unwrap_or_default();
    let took = t.elapsed();
    assert!(got.is_empty(), "{got:?}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "the client waited {took:?} (CHAIN is 2 s)"
    );
    let lines = log_lines(&log);
    assert!(
        wait_for(|| log_lines(&log).len() >= 2, LOG_TIMEOUT),
        "records: {lines:?}"
    );
    let last = log_lines(&log).pop().unwrap();
    // 32: the parent gave no status line.
    assert!(last.starts_with("00032 "), "{last}");
    keep.store(false, Ordering::SeqCst);
    holder.join().unwrap();
    drop(proxy);
}

#[test]
fn sigkill_loses_at_most_one_counter_interval() {
    let store = Dir::new("fault_kill_store");
    let counters = store.join("counters");
    let origin = Origin::echo();
    let pt = free_port();
    let cfg = format!(
        "counter {}\ncountall 1/total D 1000 *\ntcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n",
        p(&counters),
        origin.port()
    );
    let mut proxy = Proxy::start(Dir::new("fault_kill"), &cfg, &[Listen::Tcp(localhost(pt))]);
    // Sessions end one after another; each knows when it ended.
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let ends: Arc<std::sync::Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let (s2, e2, t2) = (stop.clone(), ends.clone(), total.clone());
    let driver = thread::spawn(move || {
        let mut i = 0u64;
        while !s2.load(Ordering::SeqCst) {
            let msg = vec![b'x'; 1000 + (i % 7) as usize];
            let Some(s) = served(pt, &msg) else { break };
            drop(s);
            let moved = t2.fetch_add(2 * msg.len() as u64, Ordering::SeqCst) + 2 * msg.len() as u64;
            e2.lock().unwrap().push((Instant::now(), moved));
            i += 1;
            thread::sleep(Duration::from_millis(20));
        }
    });
    thread::sleep(Duration::from_millis(3300));
    let killed_at = Instant::now();
    proxy.signal("KILL");
    stop.store(true, Ordering::SeqCst);
    let _ = driver.join();
    let _ = proxy.wait_exit(START_TIMEOUT);
    let saved = counter_record(&counters, 1).expect("a counter record");
    let ends = ends.lock().unwrap();
    // Counted: the sessions that ended more than one interval (1 s)
    // before the kill, with 1 s more for a loaded machine, at least.
    let due = ends
        .iter()
        .filter(|(t, _)| killed_at.duration_since(*t) > Duration::from_millis(2000))
        .map(|(_, m)| *m)
        .max()
        .unwrap_or(0);
    let all = ends.last().map_or(0, |e| e.1);
    assert!(
        due > 0,
        "no session ended early enough: {} sessions",
        ends.len()
    );
    assert!(
        saved >= due && saved <= all,
        "the file says {saved}; sessions that ended over 2 s before the kill moved {due}, all {all}"
    );
    // The file is whole: a new proxy takes it and counts on from it.
    let proxy = Proxy::start(Dir::new("fault_kill2"), &cfg, &[Listen::Tcp(localhost(pt))]);
    drop(served(pt, &[b'y'; 500]).expect("served after the restart"));
    assert!(
        wait_for(
            || counter_record(&counters, 1) == Some(saved + 1000),
            LOG_TIMEOUT
        ),
        "the restarted proxy has {:?}, want {}",
        counter_record(&counters, 1),
        saved + 1000
    );
    drop(proxy);
}

/// Descriptors below `limit` the proxy `pid` has open (one inherited
/// above the limit takes no slot), once the number has held still for
/// 200 ms (clients accepted or closed just before settle).
fn open_fds(pid: u32, limit: usize) -> usize {
    let now = || {
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n < limit)
                })
                .count()
        })
    };
    let mut last = now();
    loop {
        thread::sleep(Duration::from_millis(200));
        let n = now();
        if n == last {
            return n;
        }
        last = n;
    }
}

/// The HTTP proxy's client is accepted but the socket to its origin
/// cannot be made (EMFILE): it is answered 503 with a page that says why
/// (3proxy: 502, as for a server that cannot be reached), the request is
/// logged with 11, and the proxy serves again once descriptors free.
#[test]
fn out_of_descriptors_for_the_origin_answers_the_http_client_503() {
    const NOFILE: usize = 32;
    let web = Origin::start("127.0.0.1:0", |mut c| {
        let mut b = [0u8; 1024];
        let _ = c.read(&mut b);
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    });
    let (ph, ps) = (free_port(), free_port());
    let dir = Dir::new("fault_nofile_http");
    let log = dir.join("access.log");
    // BYTE_SHORT and BYTE_LONG 60 s and no minrate: idle SOCKS clients
    // stay.
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %T\"\ntimeouts 60 60\nminrate 0\nproxy -i127.0.0.1 -p{ph}\n\
         socks -i127.0.0.1 -p{ps}\n",
        p(&log)
    );
    let proxy = start_via(
        dir,
        &with_nofile(NOFILE as u32),
        &cfg,
        &[Listen::Tcp(localhost(ph)), Listen::Tcp(localhost(ps))],
    );
    let pid = proxy.pid();
    // Idle SOCKS clients (one descriptor each) until one descriptor is
    // left: the HTTP client takes it, and its origin's socket fails.
    let mut idle = Vec::new();
    while open_fds(pid, NOFILE) < NOFILE - 1 {
        idle.push(TcpStream::connect(localhost(ps)).unwrap());
        assert!(idle.len() < 64, "64 idle clients and descriptors to spare?");
    }
    assert_eq!(open_fds(pid, NOFILE), NOFILE - 1, "{}", proxy.stderr());
    let url = format!("http://127.0.0.1:{}/", web.port());
    let mut c = HttpClient::connect(ph);
    c.send(format!("GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes());
    let r = c.try_read(false);
    let r = r.unwrap_or_else(|e| panic!("no answer: {e}\n{}", proxy.stderr()));
    assert_eq!(r.status, 503, "{r}");
    assert!(r.text().contains("descriptors"), "{}", r.text());
    // 11: socket() failed.
    expect_log_line(&log, &format!("PROXY 00011 GET {url} HTTP/1.1"));
    // Descriptors free: served again.
    drop(idle);
    assert!(
        wait_for(
            || http_once(ph, format!("GET {url} HTTP/1.0\r\n\r\n").as_bytes()).status == 200,
            Duration::from_secs(5)
        ),
        "not served after descriptors freed\n{}",
        proxy.stderr()
    );
}

/// A record the full disk cut short is taken back: no partial record
/// stays in the file, the records that did not fit are counted as lost,
/// and those written once there is room again are whole lines. For a
/// `log FILE` and for `log` to a standard output that is a file on that
/// disk.
#[test]
fn a_record_cut_short_by_a_full_disk_is_taken_back() {
    for to_stdout in [false, true] {
        let dir = Dir::new("fault_logtorn");
        let mnt = dir.join("small");
        let log = mnt.join("access.log");
        let origin = Origin::echo();
        let pt = free_port();
        let target = if to_stdout {
            String::new()
        } else {
            format!(" {}", p(&log))
        };
        let cfg = format!(
            "log{target}\nlogformat \"L%N %E %C:%c %I %O a record of about a hundred bytes ends here\"\n\
             tcppm -i127.0.0.1 {pt} 127.0.0.1 {}\n",
            origin.port()
        );
        let mut wrapper = with_tmpfs(&mnt, 32, false);
        if to_stdout {
            // The proxy's standard output is the file.
            let run = wrapper.iter_mut().find(|w| w.contains("exec")).unwrap();
            *run = format!("{run} > {}", p(&log));
        }
        let proxy = start_via(dir, &wrapper, &cfg, &[Listen::Tcp(localhost(pt))]);
        torn_record_is_taken_back(&proxy, &mnt, &log, pt);
    }
}

fn torn_record_is_taken_back(proxy: &Proxy, mnt: &Path, log: &Path, pt: u16) {
    let log_in = inside(proxy, log);
    // Half the disk taken by a file that goes away later.
    let filler = inside(proxy, &mnt.join("filler"));
    std::fs::write(&filler, vec![0u8; 16 << 10]).unwrap();
    // 16 KiB of log holds about 160 records: 400 fill it, the last one
    // written cut where the disk ended.
    for i in 0..400 {
        assert!(served(pt, format!("session {i}").as_bytes()).is_some());
    }
    let size = || std::fs::metadata(&log_in).map_or(0, |m| m.len());
    // Full: within a record of the 16 KiB left.
    assert!(
        wait_for(|| size() >= (16 << 10) - 200, LOG_TIMEOUT),
        "the disk never filled: {} bytes\n{}",
        size(),
        proxy.stderr()
    );
    assert!(
        wait_for(|| proxy.stderr().contains("records are lost"), LOG_TIMEOUT),
        "no record was lost: {}",
        proxy.stderr()
    );
    thread::sleep(Duration::from_millis(500));
    let full = std::fs::read(&log_in).unwrap();
    assert!(
        full.ends_with(b"\n"),
        "a cut record was left ({} bytes): {:?}",
        full.len(),
        String::from_utf8_lossy(&full[full.len().saturating_sub(120)..])
    );
    // Room again, the log as it was.
    std::fs::remove_file(&filler).unwrap();
    for i in 0..5 {
        drop(served(pt, format!("after {i}").as_bytes()).expect("served"));
    }
    let text = || String::from_utf8(std::fs::read(&log_in).unwrap()).unwrap();
    assert!(
        wait_for(
            || text().matches("\n").count() > full.split(|&b| b == b'\n').count() + 3,
            LOG_TIMEOUT
        ),
        "nothing written after room came back:\n{}\n{}",
        text(),
        proxy.stderr()
    );
    let text = text();
    let lines: Vec<&str> = text.lines().collect();
    let whole = |l: &str| {
        l.starts_with("TCPPM ") && l.ends_with("ends here") && l.matches("TCPPM").count() == 1
    };
    for (i, l) in lines.iter().enumerate() {
        assert!(whole(l), "line {i} is not one whole record: {l:?}\n{text}");
    }
    assert!(
        proxy.stderr().contains("records were lost"),
        "{}",
        proxy.stderr()
    );
}
