//! Parents that fail over (threeproxy's own `parenthealth`, `parentcheck`,
//! `happyeyeballs`): a weight group with a dead or black-holed parent
//! stops paying for it after the first failures and takes it back after
//! its hold or a check; a name whose IPv6 address drops SYNs is reached
//! over IPv4 after the happy eyeballs delay; user limits apply through
//! parents as they do directly.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// Service, code, hops, user, text.
const FMT: &str = "L%N %E %h %U %T";

/// A 3proxy with `body` that logs with [`FMT`], ready on `port`; its
/// stderr at info level, where parent failures are reported.
fn hop(name: &str, body: &str, port: u16) -> (Proxy, PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("access.log");
    let cfg = format!("log {}\nlogformat \"{FMT}\"\n{body}", p(&log));
    let proxy = Proxy::start_with_env(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(port))],
        &[("THREEPROXY_LOG", "info")],
    );
    (proxy, log)
}

fn socks_on(port: u16) -> String {
    format!("socks -i127.0.0.1 -p{port}\n")
}

/// A listener that accepts and never answers; counts the connections.
struct BlackHole {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl BlackHole {
    fn start() -> BlackHole {
        let port = free_port();
        let l = TcpListener::bind(localhost(port)).unwrap();
        l.set_nonblocking(true).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((c, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        held.push(c);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        BlackHole {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request through the tcppm at `port` to an echo origin: the time
/// it took, or why it failed.
fn request(port: u16, msg: &[u8]) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = TcpStream::connect(localhost(port)).map_err(|e| e.to_string())?;
    set_timeouts(&s, Duration::from_secs(10));
    s.write_all(msg).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).map_err(|e| e.to_string())?;
    if back != msg {
        return Err(format!("echo came back as {back:?}"));
    }
    Ok(t.elapsed())
}

/// How many times the front proxy's stderr says `parent` failed.
fn failures(stderr: &str, parent: &str) -> usize {
    stderr
        .lines()
        .filter(|l| l.contains(&format!("parent {parent}: attempt failed")))
        .count()
}

/// The front proxy: a tcppm to `origin` through `parents` (cfg lines),
/// ready on a socks service of its own so that the readiness check draws
/// no parent.
fn front(name: &str, head: &str, parents: &str, origin: u16) -> (Proxy, u16) {
    let (pa, ready) = (free_port(), free_port());
    let body = format!(
        "{head}allow *\n{parents}tcppm -i127.0.0.1 {pa} 127.0.0.1 {origin}\nflush\nallow *\n{}",
        socks_on(ready)
    );
    let (a, _) = hop(name, &body, ready);
    (a, pa)
}

#[test]
fn a_black_holed_parent_stops_costing_requests_after_three_failures() {
    let origin = Origin::echo();
    let hole = BlackHole::start();
    let (pb, pc) = (free_port(), free_port());
    let (_b, _) = hop("fo_bh_b", &socks_on(pb), pb);
    let (_c, _) = hop("fo_bh_c", &socks_on(pc), pc);
    // CHAIN (a parent's handshake) 1 s: what each draw of the hole costs.
    let parents = format!(
        "parent 800 socks5 127.0.0.1 {}\nparent 100 socks5 127.0.0.1 {pb}\n\
         parent 100 socks5 127.0.0.1 {pc}\n",
        hole.port
    );
    let (a, pa) = front(
        "fo_bh_a",
        "timeouts 1 5 30 60 180 1800 15 1 15 5 5\n",
        &parents,
        origin.port(),
    );
    let mut times = Vec::new();
    for i in 0..20 {
        let t = request(pa, format!("request {i}").as_bytes())
            .unwrap_or_else(|e| panic!("request {i}: {e}\n{}", a.stderr()));
        times.push(t);
    }
    // The hole is drawn four times in five; after three failures in a row
    // it is left out of the draw (for 30 s by default).
    assert!(
        (1..=3).contains(&hole.accepted()),
        "the black hole got {} connections; times {times:?}\n{}",
        hole.accepted(),
        a.stderr()
    );
    assert!(
        times[19] < Duration::from_millis(800),
        "the 20th request took {:?} (all: {times:?})",
        times[19]
    );
    let slow = times
        .iter()
        .filter(|t| **t >= Duration::from_secs(1))
        .count();
    assert!(slow <= 3, "{slow} requests waited for the hole: {times:?}");
    let port = hole.port;
    assert!(
        a.stderr().contains(&format!(
            "parent socks5 127.0.0.1:{port} is down after 3 failures"
        )),
        "no line saying the parent is down:\n{}",
        a.stderr()
    );
}

#[test]
fn a_dead_parent_is_left_out_then_used_again_after_its_hold() {
    let origin = Origin::echo();
    let (pb, dead) = (free_port(), free_port());
    let (_b, _) = hop("fo_dead_b", &socks_on(pb), pb);
    // Nothing listens on `dead` (yet). A hold of 3 s, not doubled.
    let parents = format!("parent 800 socks5 127.0.0.1 {dead}\nparent 200 socks5 127.0.0.1 {pb}\n");
    let (a, pa) = front("fo_dead_a", "parenthealth 3 3 3\n", &parents, origin.port());
    let started = Instant::now();
    for i in 0..20 {
        request(pa, format!("request {i}").as_bytes())
            .unwrap_or_else(|e| panic!("request {i}: {e}\n{}", a.stderr()));
    }
    let name = format!("socks5 127.0.0.1:{dead}");
    if started.elapsed() < Duration::from_secs(3) {
        // All within the hold: exactly the three failures that put it down.
        assert_eq!(failures(&a.stderr(), &name), 3, "{}", a.stderr());
    }
    assert!(
        a.stderr().contains(&format!("parent {name} is down")),
        "{}",
        a.stderr()
    );

    // It comes back: once its hold is over it is drawn again, and works.
    let (_d, log_d) = hop("fo_dead_d", &socks_on(dead), dead);
    let mut n = 0;
    let back = wait_for(
        || {
            n += 1;
            let _ = request(pa, format!("again {n}").as_bytes());
            log_lines(&log_d)
                .iter()
                .any(|l| l.starts_with("SOCK5 00000"))
        },
        Duration::from_secs(15),
    );
    assert!(back, "the parent was not used again:\n{}", a.stderr());
    assert!(
        wait_for(
            || a.stderr().contains(&format!("parent {name} is up again")),
            LOG_TIMEOUT
        ),
        "{}",
        a.stderr()
    );
}

#[test]
fn a_retry_never_draws_the_parent_that_just_failed() {
    // Health off (`parenthealth 0`): only the retry rule keeps the dead
    // parent from taking both attempts of a request, which half of the
    // draws would give it.
    let origin = Origin::echo();
    let (pb, dead) = (free_port(), free_port());
    let (_b, _) = hop("fo_retry_b", &socks_on(pb), pb);
    let parents = format!("parent 500 socks5 127.0.0.1 {dead}\nparent 500 socks5 127.0.0.1 {pb}\n");
    let (a, pa) = front("fo_retry_a", "parenthealth 0\n", &parents, origin.port());
    for i in 0..30 {
        request(pa, format!("request {i}").as_bytes())
            .unwrap_or_else(|e| panic!("request {i}: {e}\n{}", a.stderr()));
    }
    let name = format!("socks5 127.0.0.1:{dead}");
    let n = failures(&a.stderr(), &name);
    assert!(n >= 3, "the dead parent was drawn only {n} times in 30");
    assert!(
        !a.stderr().contains(&format!("parent {name} is down")),
        "{}",
        a.stderr()
    );
}

#[test]
fn the_health_of_an_unchanged_parent_line_survives_a_reload() {
    let origin = Origin::echo();
    let (pb, dead) = (free_port(), free_port());
    let (_b, _) = hop("fo_rl_b", &socks_on(pb), pb);
    let parents = format!("parent 800 socks5 127.0.0.1 {dead}\nparent 200 socks5 127.0.0.1 {pb}\n");
    let (a, pa) = front("fo_rl_a", "", &parents, origin.port());
    let name = format!("socks5 127.0.0.1:{dead}");
    let down = wait_for(
        || {
            let _ = request(pa, b"x");
            a.stderr().contains(&format!("parent {name} is down"))
        },
        Duration::from_secs(10),
    );
    assert!(down, "{}", a.stderr());
    let before = failures(&a.stderr(), &name);
    a.signal("USR1");
    assert!(
        wait_for(|| a.stderr().contains("loaded, 2 services"), START_TIMEOUT),
        "no reload: {}",
        a.stderr()
    );
    for i in 0..10 {
        request(pa, format!("after {i}").as_bytes()).unwrap();
    }
    assert_eq!(
        failures(&a.stderr(), &name),
        before,
        "the reload forgot that the parent is down:\n{}",
        a.stderr()
    );
}

#[test]
fn parentcheck_marks_parents_down_and_up_without_requests() {
    let origin = Origin::echo();
    let hole = BlackHole::start();
    let pb = free_port();
    // One failure puts a parent down here, for 60 s: only a check can
    // bring it back sooner. A `connect` parent is checked with a CONNECT
    // to the origin, a `socks5` one with its greeting.
    let head = format!(
        "parenthealth 1 60 60\nparentcheck 1 1 127.0.0.1:{}\n",
        origin.port()
    );
    let parents = format!(
        "parent 500 connect 127.0.0.1 {pb}\nparent 500 socks5 127.0.0.1 {}\n",
        hole.port
    );
    let (a, pa) = front("fo_chk_a", &head, &parents, origin.port());
    let (hb, hh) = (
        format!("parent connect 127.0.0.1:{pb} is down"),
        format!("parent socks5 127.0.0.1:{} is down", hole.port),
    );
    assert!(
        wait_for(
            || a.stderr().contains(&hb) && a.stderr().contains(&hh),
            Duration::from_secs(10)
        ),
        "the checks did not mark both down:\n{}",
        a.stderr()
    );
    assert!(hole.accepted() >= 1, "the hole was never checked");
    assert_eq!(a.threads_named("parentcheck"), 1);

    // The connect parent comes up: the next check's CONNECT works.
    let (_b, log_b) = hop("fo_chk_b", &format!("proxy -i127.0.0.1 -p{pb}\n"), pb);
    assert!(
        wait_for(
            || a.stderr()
                .contains(&format!("parent connect 127.0.0.1:{pb} is up again")),
            Duration::from_secs(10)
        ),
        "{}",
        a.stderr()
    );
    read_log_line(&log_b, "of the check's CONNECT", |l| {
        l.starts_with("PROXY 00000") && l.contains(&format!("CONNECT 127.0.0.1:{}", origin.port()))
    });
    // Requests now go through it, not to the hole that is still down.
    let holed = hole.accepted();
    for i in 0..10 {
        let t = request(pa, format!("checked {i}").as_bytes()).unwrap();
        assert!(t < Duration::from_millis(800), "request {i} took {t:?}");
    }
    // (The checks keep knocking on the hole, once a second.)
    assert!(hole.accepted() <= holed + 2);
}

/// `parentcheck` checks a parent from the source address the sessions of
/// the service that uses it leave from (`-e`): the parent sees the checks
/// come from 127.0.0.2, as the sessions do (loopback takes any 127/8
/// source), and a parent no service names from the default source.
#[test]
fn parentcheck_leaves_from_the_services_external_address() {
    /// A listener that notes the source address of every connection.
    fn noting() -> (u16, Arc<std::sync::Mutex<Vec<SocketAddr>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                if let Ok(peer) = c.peer_addr() {
                    s.lock().unwrap().push(peer);
                }
            }
        });
        (port, seen)
    }
    let (used, seen_used) = noting();
    let (unused, seen_unused) = noting();
    let pt = free_port();
    // The second parent belongs to an entry no service has (flush drops
    // it before the service line).
    let cfg = format!(
        "parentcheck 1 1\nallow *\nparent 1000 tcp 127.0.0.1 {unused}\nflush\n\
         allow *\nparent 1000 tcp 127.0.0.1 {used}\n\
         tcppm -e127.0.0.2 -i127.0.0.1 {pt} 127.0.0.1 9\n"
    );
    let _proxy = Proxy::start(Dir::new("fo_chk_src"), &cfg, &[]);
    let checked = |seen: &Arc<std::sync::Mutex<Vec<SocketAddr>>>| seen.lock().unwrap().len() >= 2;
    assert!(
        wait_for(
            || checked(&seen_used) && checked(&seen_unused),
            Duration::from_secs(10)
        ),
        "checks: {:?} {:?}",
        seen_used.lock().unwrap(),
        seen_unused.lock().unwrap()
    );
    // No client came: every connection is a check.
    let ips = |seen: &Arc<std::sync::Mutex<Vec<SocketAddr>>>| {
        seen.lock()
            .unwrap()
            .iter()
            .map(|a| a.ip().to_string())
            .collect::<Vec<_>>()
    };
    assert!(
        ips(&seen_used).iter().all(|ip| ip == "127.0.0.2"),
        "{:?}",
        ips(&seen_used)
    );
    assert!(
        ips(&seen_unused).iter().all(|ip| ip == "127.0.0.1"),
        "{:?}",
        ips(&seen_unused)
    );
    // A session through the parent leaves from there too.
    let n = seen_used.lock().unwrap().len();
    let mut c = connect(localhost(pt));
    c.write_all(b"x").unwrap();
    assert!(wait_for(
        || seen_used.lock().unwrap().len() > n,
        LOG_TIMEOUT
    ));
    assert!(
        ips(&seen_used).iter().all(|ip| ip == "127.0.0.2"),
        "{:?}",
        ips(&seen_used)
    );
}

/// A network namespace made for one test, removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("tp-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip(8)");
        assert!(ok.success(), "ip netns add {name} failed (needs root)");
        let ns = Netns(name);
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn run(&self, args: &[&str]) {
        let ok = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .status()
            .unwrap();
        assert!(ok.success(), "in {}: {args:?} failed", self.0);
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn happy_eyeballs_reaches_ipv4_when_ipv6_drops_syns() {
    let ns = Netns::new("he");
    let oport = free_port();
    // In the namespace: SYNs to [::1]:oport are dropped; 127.0.0.1:oport
    // answers "inside:" and what it got.
    ns.run(&[
        "ip6tables",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-d",
        "::1",
        "--dport",
        &oport.to_string(),
        "-j",
        "DROP",
    ]);
    let code = format!(
        "import socket\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         l.bind(('127.0.0.1',{oport}))\nl.listen()\nprint('up',flush=True)\nwhile True:\n c,_=l.accept()\n \
         c.sendall(b'inside:'+c.recv(100))\n c.close()"
    );
    let mut origin = Killed(
        Command::new("ip")
            .args(["netns", "exec", &ns.0, "python3", "-c", &code])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut up = [0u8; 3];
    origin
        .0
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut up)
        .unwrap();

    // `-64`: the name's IPv6 address first. The CONNECT timeout is the
    // default 15 s.
    let port = free_port();
    let cfg = format!(
        "nsrecord dual.test 127.0.0.1\nnsrecord dual.test ::1\n\
         tcppm -64 -ne{} -i127.0.0.1 {port} dual.test {oport}\n",
        ns.path()
    );
    let _proxy = Proxy::start(Dir::new("fo_he"), &cfg, &[]);
    let ask = || -> io::Result<(Vec<u8>, Duration)> {
        let t = Instant::now();
        let mut s = TcpStream::connect(localhost(port))?;
        set_timeouts(&s, Duration::from_secs(30));
        s.write_all(b"hi")?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        Ok((got, t.elapsed()))
    };
    assert!(
        wait_for(
            || TcpStream::connect(localhost(port)).is_ok(),
            START_TIMEOUT
        ),
        "the proxy did not come up"
    );
    let mut times = Vec::new();
    for _ in 0..3 {
        let (got, took) = ask().unwrap();
        assert_eq!(got, b"inside:hi", "after {took:?}");
        times.push(took);
    }
    for took in &times {
        assert!(
            *took >= Duration::from_millis(200) && *took < Duration::from_secs(3),
            "requests took {times:?}: want about 250 ms, not the 15 s connect timeout"
        );
    }
}

/// `%R` is the address really connected to: a name with both families,
/// its preferred (IPv6, `-64`) address refused, is reached over IPv4 by
/// happy eyeballs, and that is what the record says, for the HTTP proxy,
/// SOCKS and tcppm alike.
#[test]
fn remote_address_is_the_family_happy_eyeballs_connected() {
    let origin = crate::http::HttpOrigin::start();
    let o = origin.port();
    // Nothing listens on [::1] at that port: refused at once.
    assert!(
        TcpStream::connect(("::1", o)).is_err(),
        "[::1]:{o} is taken"
    );
    let (ph, ps, pt) = (free_port(), free_port(), free_port());
    let body = format!(
        "nsrecord dual.test 127.0.0.1\nnsrecord dual.test ::1\n\
         proxy -64 -i127.0.0.1 -p{ph}\nsocks -64 -i127.0.0.1 -p{ps}\n\
         tcppm -64 -i127.0.0.1 {pt} dual.test {o}\n"
    );
    let (_proxy, log) = start(Dir::new("fo_he_r"), "L%N %E %n %R:%r", &body, &[ph, ps, pt]);
    // Twice: the second request may take the first's origin connection
    // from the pool, which keeps where it went.
    for _ in 0..2 {
        let r = http_once(
            ph,
            format!("GET http://dual.test:{o}/hello HTTP/1.0\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 200, "{r}");
    }
    let want = format!("PROXY 00000 dual.test 127.0.0.1:{o}");
    assert!(
        wait_for(
            || log_lines(&log).iter().filter(|l| **l == want).count() == 2,
            LOG_TIMEOUT
        ),
        "want two {want:?}: {:?}",
        log_lines(&log)
    );
    let mut s = socks5_hello(ps, None);
    s.write_all(&socks5_request_name(1, b"dual.test", o))
        .unwrap();
    let reply = read_socks5_reply(&mut s).unwrap();
    assert_eq!(reply[1], 0, "{reply:?}");
    drop(s);
    expect_log_line(&log, &format!("SOCK5 00000 dual.test 127.0.0.1:{o}"));
    let mut s = connect(localhost(pt));
    s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    set_timeouts(&s, IO_TIMEOUT);
    let got = read_until_closed(&mut s).unwrap();
    assert!(
        got.ends_with(b"hello"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    drop(s);
    expect_log_line(&log, &format!("TCPPM 00000 dual.test 127.0.0.1:{o}"));
}

/// A child process killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An origin that sends bytes without end to whoever connects.
fn endless() -> (u16, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            if s.load(Ordering::SeqCst) {
                return;
            }
            thread::spawn(move || {
                let buf = [7u8; 16384];
                while c.write_all(&buf).is_ok() {}
            });
        }
    });
    (port, stop)
}

/// Bits per second read from `s` over `window`.
fn rate(s: &mut TcpStream, window: Duration) -> f64 {
    set_timeouts(s, Duration::from_secs(5));
    let mut buf = [0u8; 65536];
    // Let the start (the burst a bucket allows) pass.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(500) {
        let _ = s.read(&mut buf);
    }
    let t = Instant::now();
    let mut n = 0usize;
    while t.elapsed() < window {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n as f64 * 8.0 / t.elapsed().as_secs_f64()
}

#[test]
fn user_limits_apply_through_parents_as_directly() {
    // 3proxy #819: connlim and bandlim by user through a parent. One
    // front proxy, two services: `direct` and `chained` (through B).
    const BPS: f64 = 1_000_000.0;
    let echo = Origin::echo();
    let (src, stop) = endless();
    let pb = free_port();
    let (_b, _) = hop("fo_lim_b", &socks_on(pb), pb);
    let (pd, pc) = (free_port(), free_port());
    let body = format!(
        "users alice:CL:pw bob:CL:pw\nauth strong\n\
         connlim 1 0 alice\nbandlimin {} bob\n\
         allow *\nsocks -i127.0.0.1 -p{pd}\n\
         flush\nallow *\nparent 1000 socks5 127.0.0.1 {pb}\nsocks -i127.0.0.1 -p{pc}\n",
        BPS as u64
    );
    let (_a, log_a) = hop("fo_lim_a", &body, pd);
    let refused = |l: &String| l.starts_with("SOCK5 00010") && l.contains(" alice ");
    for (round, (port, hops)) in [(pd, 0), (pc, 1)].into_iter().enumerate() {
        // connlim 1 for alice: a second session of hers is refused while
        // the first lasts, and another user's is not.
        // (The slot of the last round's session may take a moment to free.)
        let mut first = None;
        assert!(
            wait_for(
                || {
                    first = socks5_open(
                        port,
                        Some(("alice", "pw")),
                        &socks5_request(1, localhost(echo.port())),
                    )
                    .ok();
                    first.is_some()
                },
                LOG_TIMEOUT
            ),
            "alice never got a session ({hops} hops)"
        );
        let mut one = first.unwrap();
        echo_roundtrip(&mut one, b"first");
        assert!(
            socks5_open(
                port,
                Some(("alice", "pw")),
                &socks5_request(1, localhost(echo.port()))
            )
            .is_err(),
            "a second session of alice's got through ({hops} hops)"
        );
        let mut other = socks5_open(
            port,
            Some(("bob", "pw")),
            &socks5_request(1, localhost(echo.port())),
        )
        .unwrap();
        echo_roundtrip(&mut other, b"bob");
        assert!(
            wait_for(
                || log_lines(&log_a).iter().filter(|l| refused(l)).count() > round,
                LOG_TIMEOUT
            ),
            "no record of alice refused by connlim ({hops} hops): {:?}",
            log_lines(&log_a)
        );
        drop(one);
        drop(other);
        // bandlimin for bob: the download is held to its rate.
        let mut down = socks5_open(
            port,
            Some(("bob", "pw")),
            &socks5_request(1, localhost(src)),
        )
        .unwrap();
        let r = rate(&mut down, Duration::from_secs(2));
        assert!(
            r < BPS * 1.25 && r > BPS * 0.5,
            "bob's download at {r:.0} bit/s with {hops} hops, want {BPS} (bandlimin)"
        );
    }
    let chained = log_lines(&log_a)
        .into_iter()
        .filter(|l| l.starts_with("SOCK5 00000 1 bob"))
        .count();
    assert!(
        chained >= 1,
        "nothing went through the parent: {:?}",
        log_lines(&log_a)
    );
    stop.store(true, Ordering::SeqCst);
    let _ = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], src)));
}
