//! Access control through tcppm and udppm: ACLs by source, target port and
//! `flush`, `auth` types, and the limits (`bandlimout`, `connlim`,
//! `countout` with its counter file across a restart).
//!
//! Clients that must be told apart by address connect from 127.0.0.2
//! (Linux routes all of 127/8 to the loopback); the readiness probe comes
//! from 127.0.0.1, so rules on 127.0.0.2 never see it.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// The log format of these tests: result code and client address.
const LOGFORMAT: &str = "logformat \"L%E %C\"\n";

/// A TCP connection to `to` made from the local address `from`.
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let src: IpAddr = from.parse().unwrap();
    s.bind(&SocketAddr::new(src, 0).into())
        .expect("bind the client address");
    s.connect_timeout(&to.into(), IO_TIMEOUT)
        .expect("connect to the proxy");
    let s: TcpStream = s.into();
    set_timeouts(&s, IO_TIMEOUT);
    s
}

/// The proxy answered by closing: EOF (or a reset) before any byte.
fn assert_refused(s: &mut TcpStream) {
    let _ = s.write_all(b"hello");
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("expected the proxy to close the connection, got {other:?}"),
    }
}

/// A log record with this result code and client address.
fn expect_record(log: &Path, code: u32, client: &str) {
    expect_log_line(log, &format!("{code:05} {client}"));
}

fn tcppm(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

#[test]
fn allow_by_source_address() {
    let dir = Dir::new("acl_src");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}allow * 127.0.0.1\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut ok = connect_from("127.0.0.1", localhost(port));
    echo_roundtrip(&mut ok, b"allowed");
    let mut other = connect_from("127.0.0.2", localhost(port));
    assert_refused(&mut other);
    // No rule matched: the implicit `deny *` of a non-empty ACL, code 3.
    expect_record(&log, 3, "127.0.0.2");
}

#[test]
fn deny_by_target_port_and_first_match_wins() {
    let dir = Dir::new("acl_port");
    let log = dir.join("acl.log");
    let (a, b) = (Origin::echo(), Origin::echo());
    let (pa, pb) = (free_port(), free_port());
    let cfg = format!(
        "log {}\n{LOGFORMAT}deny * * * {}\nallow *\n{}{}",
        p(&log),
        b.port(),
        tcppm(pa, a.port()),
        tcppm(pb, b.port())
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pa)), Listen::Tcp(localhost(pb))],
    );

    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(pa)), b"to a");
    assert_refused(&mut connect_from("127.0.0.2", localhost(pb)));
    expect_record(&log, 1, "127.0.0.2");
    assert!(
        b.peers().iter().all(|p| p.ip().is_loopback()),
        "origin b saw only probes at most"
    );
}

#[test]
fn flush_gives_two_services_different_acls() {
    let dir = Dir::new("acl_flush");
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    let cfg = format!(
        "deny * 127.0.0.2\n{}flush\n{}",
        tcppm(pa, origin.port()),
        tcppm(pb, origin.port())
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pa)), Listen::Tcp(localhost(pb))],
    );
    assert_refused(&mut connect_from("127.0.0.2", localhost(pa)));
    echo_roundtrip(
        &mut connect_from("127.0.0.2", localhost(pb)),
        b"after flush",
    );
}

#[test]
fn acl_is_enforced_without_auth_and_skipped_with_auth_none() {
    let dir = Dir::new("acl_auth_none");
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    // No `auth` line: 3proxy's default `iponly` enforces the ACL.
    let cfg = format!(
        "deny * 127.0.0.2\n{}auth none\n{}",
        tcppm(pa, origin.port()),
        tcppm(pb, origin.port())
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pa)), Listen::Tcp(localhost(pb))],
    );
    assert_refused(&mut connect_from("127.0.0.2", localhost(pa)));
    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(pb)), b"no acl");
}

#[test]
fn iponly_strong_without_credentials_reports_no_user() {
    let dir = Dir::new("acl_iponly_strong");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}auth iponly strong\nusers alice:pw\nallow * 127.0.0.1\nallow alice\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(
        &mut connect_from("127.0.0.1", localhost(port)),
        b"by address",
    );
    // Not allowed by address, and tcppm carries no user name: code 4.
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 4, "127.0.0.2");
}

#[test]
fn udppm_checks_the_acl() {
    let dir = Dir::new("acl_udppm");
    let log = dir.join("acl.log");
    let (open, closed) = (UdpEcho::start(), UdpEcho::start());
    let (pa, pb) = (free_udp_port(), free_udp_port());
    let cfg = format!(
        "log {}\n{LOGFORMAT}deny * * * {}\nallow * 127.0.0.1\n\
         udppm -i127.0.0.1 {pa} 127.0.0.1 {}\nudppm -i127.0.0.1 {pb} 127.0.0.1 {}\n",
        p(&log),
        closed.port(),
        open.port(),
        closed.port()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(pa), Listen::Udp(pb)]);

    let c = udp_client();
    c.send_to(b"ping", localhost(pa)).unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = c.recv_from(&mut buf).expect("the allowed mapping answers");
    assert_eq!(&buf[..n], b"ping");

    c.send_to(b"ping", localhost(pb)).unwrap();
    expect_record(&log, 1, "127.0.0.1");
    assert!(
        closed.sources().is_empty(),
        "a denied datagram must not reach the origin"
    );
}

/// An origin that counts what it receives during `window` after the first
/// byte, then reports the count and closes.
fn rate_sink(window: Duration) -> (Origin, mpsc::Receiver<u64>) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let origin = Origin::start("127.0.0.1:0", move |mut conn| {
        let mut buf = vec![0u8; 65536];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        loop {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let t0 = *first.get_or_insert_with(Instant::now);
                    if t0.elapsed() > window {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
        if total > 0 {
            let _ = tx.lock().unwrap().send(total);
        }
        let _ = conn.shutdown(Shutdown::Both);
    });
    (origin, rx)
}

#[test]
fn bandlimout_holds_2_mbit_within_10_percent() {
    const BPS: u64 = 2_000_000;
    let window = Duration::from_secs(5);
    let dir = Dir::new("acl_bandlim");
    let (origin, got) = rate_sink(window);
    let port = free_port();
    let cfg = format!(
        "bandlimout {BPS} * 127.0.0.2\n{}",
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut client = connect_from("127.0.0.2", localhost(port));
    let writer = thread::spawn(move || {
        let block = vec![0x5au8; 16384];
        while client.write_all(&block).is_ok() {}
    });
    let bytes = got
        .recv_timeout(window + Duration::from_secs(20))
        .expect("the origin's count");
    let rate = bytes as f64 * 8.0 / window.as_secs_f64();
    let want = BPS as f64;
    assert!(
        (rate - want).abs() <= want * 0.10,
        "{bytes} bytes in {window:?} is {rate:.0} bit/s, want {want:.0} within 10%"
    );
    let _ = writer.join();
}

#[test]
fn connlim_refuses_the_third_parallel_connection() {
    let dir = Dir::new("acl_connlim");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}connlim 2 0 * 127.0.0.2\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut one = connect_from("127.0.0.2", localhost(port));
    let mut two = connect_from("127.0.0.2", localhost(port));
    echo_roundtrip(&mut one, b"one");
    echo_roundtrip(&mut two, b"two");
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 10, "127.0.0.2");
    // Other sources are not limited.
    echo_roundtrip(&mut connect_from("127.0.0.1", localhost(port)), b"other");

    // When one leaves, a new one gets its slot.
    drop(one);
    let ok = wait_for(
        || {
            let mut s = connect_from("127.0.0.2", localhost(port));
            let _ = s.write_all(b"x");
            let mut b = [0u8; 1];
            matches!(s.read(&mut b), Ok(1))
        },
        LOG_TIMEOUT,
    );
    assert!(ok, "a slot was not given back");
    drop(two);
}

#[test]
fn countout_stops_a_session_and_the_counter_file_survives_a_restart() {
    const MB: u64 = 1 << 20;
    let store = Dir::new("acl_count_store");
    let counters = store.join("3proxy.counters");
    let (origin, got) = rate_sink(Duration::from_secs(60));
    let port = free_port();
    let cfg = |log: &Path| {
        format!(
            "log {}\n{LOGFORMAT}counter {}\ncountout 1/test D 1 * 127.0.0.2\n{}",
            p(log),
            p(&counters),
            tcppm(port, origin.port())
        )
    };

    let dir = Dir::new("acl_count_1");
    let log = dir.join("acl.log");
    let proxy = Proxy::start(dir, &cfg(&log), &[Listen::Tcp(localhost(port))]);
    let mut client = connect_from("127.0.0.2", localhost(port));
    let mut sent = 0u64;
    let block = vec![0xa5u8; 65536];
    while sent < 3 * MB {
        if client.write_all(&block).is_err() {
            break;
        }
        sent += block.len() as u64;
    }
    // The session ends at the quota with code 10; the origin got 1 MiB.
    expect_record(&log, 10, "127.0.0.2");
    let bytes = got
        .recv_timeout(Duration::from_secs(20))
        .expect("the origin's count");
    assert_eq!(bytes, MB, "the origin must get exactly the quota");
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    assert!(
        wait_for(
            || counter_record(&counters, 1).is_some_and(|n| n >= MB),
            LOG_TIMEOUT
        ),
        "the counter file has no record 1 of at least 1 MiB: {:?}",
        counter_record(&counters, 1)
    );
    drop(proxy);

    // A new process reads the counter back and still refuses.
    let dir = Dir::new("acl_count_2");
    let log = dir.join("acl.log");
    let _proxy = Proxy::start(dir, &cfg(&log), &[Listen::Tcp(localhost(port))]);
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 10, "127.0.0.2");
    drop(client);
}

/// A DNS server on 127.0.0.1 that answers PTR and A questions from two
/// tables; stops when dropped.
struct PtrDns {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PtrDns {
    /// `ptr`: (reverse name, host name); `a`: (host name, IPv4 address).
    fn start(ptr: &[(&str, &str)], a: &[(&str, &str)]) -> PtrDns {
        use simple_dns::rdata::{RData, A, PTR};
        use simple_dns::{Name, Packet, ResourceRecord, CLASS, QTYPE, RCODE, TYPE};
        use std::sync::atomic::Ordering;

        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind test DNS");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let port = sock.local_addr().unwrap().port();
        let ptr: Vec<(String, String)> = ptr
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let a: Vec<(String, std::net::Ipv4Addr)> = a
            .iter()
            .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !halt.load(Ordering::SeqCst) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = Packet::parse(&buf[..n]) else {
                    continue;
                };
                let [question] = q.questions.as_slice() else {
                    continue;
                };
                let name = question.qname.to_string().to_ascii_lowercase();
                let mut reply = Packet::new_reply(q.id());
                reply.questions.push(question.clone());
                let owner = Name::new_unchecked(&name);
                let rdata = match question.qtype {
                    QTYPE::TYPE(TYPE::PTR) => ptr
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| RData::PTR(PTR(Name::new_unchecked(v)))),
                    QTYPE::TYPE(TYPE::A) => a
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, ip)| RData::A(A::from(*ip))),
                    _ => None,
                };
                match rdata {
                    Some(d) => reply
                        .answers
                        .push(ResourceRecord::new(owner, CLASS::IN, 60, d)),
                    None => *reply.rcode_mut() = RCODE::NameError,
                }
                if let Ok(bytes) = reply.build_bytes_vec_compressed() {
                    let _ = sock.send_to(&bytes, from);
                }
            }
        });
        PtrDns { port, stop }
    }
}

impl Drop for PtrDns {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn dnsname_makes_the_confirmed_ptr_name_the_user() {
    let dns = PtrDns::start(
        &[
            ("2.0.0.127.in-addr.arpa", "client.test"),
            ("3.0.0.127.in-addr.arpa", "liar.test"),
        ],
        // liar.test does not point back at 127.0.0.3: not confirmed.
        &[("client.test", "127.0.0.2"), ("liar.test", "127.0.0.9")],
    );
    let dir = Dir::new("acl_dnsname");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "nserver 127.0.0.1:{}\nlog {}\nlogformat \"L%E %C %U\"\nauth dnsname\n\
         allow client.test\n{}",
        dns.port,
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(port)), b"named");
    expect_log_line(&log, "00000 127.0.0.2 client.test");
    // A name that does not resolve back to the client, and no name at
    // all, are both code 3 (3proxy's dnsauth).
    assert_refused(&mut connect_from("127.0.0.3", localhost(port)));
    expect_log_line(&log, "00003 127.0.0.3 -");
    assert_refused(&mut connect_from("127.0.0.4", localhost(port)));
    expect_log_line(&log, "00003 127.0.0.4 -");
}

#[test]
fn connlim_and_counters_survive_a_reload() {
    let dir = Dir::new("acl_reload_limits");
    let log = dir.join("acl.log");
    let counters = dir.join("3proxy.counters");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}counter {}\nconnlim 1 0 * 127.0.0.2\n\
         countall 1/kept D 100 * 127.0.0.2\n{}",
        p(&log),
        p(&counters),
        tcppm(port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    // A finished session counts 2 x 100 bytes.
    let mut first = connect_from("127.0.0.2", localhost(port));
    echo_roundtrip(&mut first, &[7u8; 100]);
    drop(first);
    assert!(
        wait_for(|| counter_record(&counters, 1) == Some(200), LOG_TIMEOUT),
        "record 1 is {:?}, want 200",
        counter_record(&counters, 1)
    );

    let mut live = wait_for_slot(port);
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 10, "127.0.0.2");

    // The same cfg again: the rule's state is kept with its line.
    proxy.signal("USR1");
    assert!(
        wait_for(
            || proxy.stderr().contains("loaded, 1 services"),
            START_TIMEOUT
        ),
        "no reload: {}",
        proxy.stderr()
    );
    let refused_before = log_lines(&log)
        .iter()
        .filter(|l| l.contains("00010 127.0.0.2"))
        .count();
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    assert!(
        wait_for(
            || log_lines(&log)
                .iter()
                .filter(|l| l.contains("00010 127.0.0.2"))
                .count()
                > refused_before,
            LOG_TIMEOUT
        ),
        "the connlim slot was not kept across the reload"
    );
    // The live session goes on, then ends and is counted with the rest.
    echo_roundtrip(&mut live, b"after");
    drop(live);
    assert!(
        wait_for(
            || counter_record(&counters, 1) == Some(200 + 2 * 3 + 2 * 5),
            LOG_TIMEOUT
        ),
        "record 1 is {:?}, want 216",
        counter_record(&counters, 1)
    );
    // And the slot it held is free again under the new cfg.
    drop(wait_for_slot(port));
}

/// A session from 127.0.0.2 once a connlim slot is free, with "one"
/// echoed through it.
fn wait_for_slot(port: u16) -> TcpStream {
    let mut got = None;
    let ok = wait_for(
        || {
            let mut s = connect_from("127.0.0.2", localhost(port));
            let _ = s.write_all(b"one");
            let mut b = [0u8; 3];
            if s.read_exact(&mut b).is_ok() && &b == b"one" {
                got = Some(s);
                true
            } else {
                false
            }
        },
        LOG_TIMEOUT,
    );
    assert!(ok, "no connlim slot came free");
    got.unwrap()
}

#[test]
fn counter_reports_are_written_when_the_period_changes() {
    let dir = Dir::new("acl_counter_report");
    let counters = dir.join("3proxy.counters");
    let clock = dir.write("clock", "0");
    let root = dir.join("report").parent().unwrap().to_path_buf();
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "counter {} D {}\ncountall 1/daily D 100 * 127.0.0.2\n\
         countout 2 M 100 * 127.0.0.2\ncountin 3 H 100 * 127.0.0.2\n{}",
        p(&counters),
        p(&dir.join("report")),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let _proxy = Proxy::start_with_env(dir, &cfg, &[Listen::Tcp(localhost(port))], &envs);

    let mut s = connect_from("127.0.0.2", localhost(port));
    echo_roundtrip(&mut s, &[1u8; 1000]);
    drop(s);
    assert!(
        wait_for(|| counter_record(&counters, 1) == Some(2000), LOG_TIMEOUT),
        "record 1 is {:?}",
        counter_record(&counters, 1)
    );
    let reports = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&root)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("report.")
            })
            .collect()
    };
    thread::sleep(Duration::from_millis(1500));
    assert!(reports().is_empty(), "no report within the day");

    // A day later: the report of the day that ended, named by its date,
    // lists the counters of a day or longer (not the hourly one).
    std::fs::write(&clock, "86400").unwrap();
    assert!(wait_for(|| !reports().is_empty(), LOG_TIMEOUT), "no report");
    let path = reports().remove(0);
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let today = String::from_utf8(
        std::process::Command::new("date")
            .args(["-u", "+%Y.%m.%d"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(name, format!("report.{}", today.trim()));
    assert!(wait_for(
        || std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n')),
        LOG_TIMEOUT
    ));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "00001 00000000000000002000 #daily\n00002 00000000000000001000 #\n"
    );
}

// ---------------------------------------------------------------------------
// The authentication cache, through the HTTP proxy and the port mappers

/// `alice:pw` for `Proxy-Authorization: Basic`.
const ALICE: &str = "YWxpY2U6cHc=";

/// A keep-alive HTTP origin: every request gets 200 with the body `ok`
/// (none for HEAD). Records the peer of each request: the proxy's
/// outgoing address.
fn http_origin() -> (Origin, std::sync::Arc<std::sync::Mutex<Vec<SocketAddr>>>) {
    use std::io::BufRead;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = Origin::start("127.0.0.1:0", move |conn| {
        let peer = conn.peer_addr().ok();
        let mut w = conn.try_clone().expect("clone origin socket");
        let mut r = std::io::BufReader::new(conn);
        loop {
            let mut first = String::new();
            if r.read_line(&mut first).unwrap_or(0) == 0 {
                return;
            }
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
            }
            if let Some(p) = peer {
                log.lock().unwrap().push(p);
            }
            let answer: &[u8] = if first.starts_with("HEAD ") {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            if w.write_all(answer).is_err() {
                return;
            }
        }
    });
    (origin, seen)
}

/// Sends `METHOD url` (with Basic credentials if given) on `c` and reads
/// the answer; its status, 0 if the proxy closed without one.
fn ask(c: &mut HttpClient, method: &str, url: &str, auth: Option<&str>) -> u16 {
    let creds = auth
        .map(|a| format!("Proxy-Authorization: Basic {a}\r\n"))
        .unwrap_or_default();
    let req = format!("{method} {url} HTTP/1.1\r\nHost: x\r\n{creds}\r\n");
    if c.w.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    c.try_read(method == "HEAD").map_or(0, |r| r.status)
}

/// One request on a connection of its own.
fn http(src: &str, port: u16, method: &str, url: &str, auth: Option<&str>) -> u16 {
    ask(
        &mut HttpClient::on(connect_from(src, localhost(port))),
        method,
        url,
        auth,
    )
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/")
}

#[test]
fn auth_cache_strong_by_address_and_port_until_it_expires() {
    let dir = Dir::new("acl_cache_dstport");
    let log = dir.join("acl.log");
    let ((o1, _), (o2, _)) = (http_origin(), http_origin());
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%E %C %U\"\nauth cache strong\nauthcache ip,dstport 2\n\
         users alice:pw\nallow alice\nproxy -i127.0.0.1 -p{port}\n",
        p(&log)
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let (u1, u2) = (url(o1.port()), url(o2.port()));

    assert_eq!(http("127.0.0.2", port, "GET", &u1, None), 407);
    assert_eq!(http("127.0.0.2", port, "GET", &u1, Some(ALICE)), 200);
    // The address and the port now stand for alice, who is logged.
    assert_eq!(http("127.0.0.2", port, "GET", &u1, None), 200);
    expect_log_line(&log, "00000 127.0.0.2 alice");
    // Another port or another address is not in the cache.
    assert_eq!(http("127.0.0.2", port, "GET", &u2, None), 407);
    assert_eq!(http("127.0.0.3", port, "GET", &u1, None), 407);
    // After the 2 s of `authcache`, the password is asked for again.
    thread::sleep(Duration::from_millis(3100));
    assert_eq!(http("127.0.0.2", port, "GET", &u1, None), 407);
}

#[test]
fn auth_cacheacl_skips_the_acl_and_keys_on_host_and_operation() {
    let dir = Dir::new("acl_cacheacl");
    let ((o1, _), (o2, _)) = (http_origin(), http_origin());
    let (pa, pb) = (free_port(), free_port());
    // o2 is denied; `cacheacl` does not look at the ACL on a hit, `cache`
    // does (with the cached user name).
    let cfg = format!(
        "authcache ip,dsthost,dstoper\nusers alice:pw\ndeny * * * {}\nallow alice\n\
         auth cacheacl strong\nproxy -i127.0.0.1 -p{pa}\nauth cache strong\nproxy -i127.0.0.1 -p{pb}\n",
        o2.port()
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pa)), Listen::Tcp(localhost(pb))],
    );
    let by_name = |o: &Origin| format!("http://localhost:{}/", o.port());

    assert_eq!(
        http("127.0.0.2", pa, "GET", &by_name(&o1), Some(ALICE)),
        200
    );
    assert_eq!(http("127.0.0.2", pa, "GET", &by_name(&o1), None), 200);
    // The port is not part of the key, and the ACL is not asked: o2 too.
    assert_eq!(http("127.0.0.2", pa, "GET", &by_name(&o2), None), 200);
    // The same entry through `cache`: the ACL denies o2.
    assert_eq!(http("127.0.0.2", pb, "GET", &by_name(&o1), None), 200);
    assert_eq!(http("127.0.0.2", pb, "GET", &by_name(&o2), None), 403);
    // Another operation, or the address instead of the name, is a miss.
    assert_eq!(http("127.0.0.2", pa, "HEAD", &by_name(&o1), None), 407);
    assert_eq!(http("127.0.0.2", pa, "GET", &url(o1.port()), None), 407);
}

#[test]
fn authcache_acl_srvport_and_srvaddr_tell_services_apart() {
    let dir = Dir::new("acl_cache_services");
    let (o, _) = http_origin();
    let [a, b, c, d, e, f, g] = [(); 7].map(|_| free_port());
    let cfg = format!(
        "auth cache strong\nusers alice:pw\nallow alice\n\
         authcache ip,acl\nproxy -i127.0.0.1 -p{a}\nproxy -i127.0.0.1 -p{b}\n\
         authcache ip,srvport\nproxy -i127.0.0.1 -p{c}\nproxy -i127.0.0.1 -p{d}\n\
         authcache ip,srvaddr\nproxy -i127.0.0.1 -p{e}\nproxy -i127.0.0.3 -p{f}\n\
         proxy -i127.0.0.1 -p{g}\n"
    );
    let v4 = |ip: &str, port| Listen::Tcp(SocketAddr::new(ip.parse().unwrap(), port));
    let listen = [
        v4("127.0.0.1", a),
        v4("127.0.0.1", b),
        v4("127.0.0.1", c),
        v4("127.0.0.1", d),
        v4("127.0.0.1", e),
        v4("127.0.0.3", f),
        v4("127.0.0.1", g),
    ];
    let _proxy = Proxy::start(dir, &cfg, &listen);
    let u = url(o.port());
    let ask = |ip: &str, port, auth| {
        let s = connect_from("127.0.0.2", SocketAddr::new(ip.parse().unwrap(), port));
        ask(&mut HttpClient::on(s), "GET", &u, auth)
    };

    // `acl`: each service line has its own ACL, though a and b were
    // started from the same list (3proxy copies it per service).
    assert_eq!(ask("127.0.0.1", a, Some(ALICE)), 200);
    assert_eq!(ask("127.0.0.1", a, None), 200);
    assert_eq!(ask("127.0.0.1", b, None), 407);
    // `srvport`: the service's port.
    assert_eq!(ask("127.0.0.1", c, Some(ALICE)), 200);
    assert_eq!(ask("127.0.0.1", c, None), 200);
    assert_eq!(ask("127.0.0.1", d, None), 407);
    // `srvaddr`: the service's address, whatever its port.
    assert_eq!(ask("127.0.0.1", e, Some(ALICE)), 200);
    assert_eq!(ask("127.0.0.1", g, None), 200);
    assert_eq!(ask("127.0.0.3", f, None), 407);
}

#[test]
fn authcache_ext_keeps_the_external_address_drawn_for_the_user() {
    let dir = Dir::new("acl_cache_ext");
    let (o, peers) = http_origin();
    let port = free_port();
    // Each request draws one of two source addresses; with `ext` the one
    // drawn when alice gave her password serves her cache hits.
    let cfg = format!(
        "auth cacheacl strong\nauthcache ip,ext\nusers alice:pw\nallow *\n\
         parent 500 extip 127.0.0.5 0\nparent 500 extip 127.0.0.6 0\n\
         proxy -i127.0.0.1 -p{port}\n"
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let u = url(o.port());
    assert_eq!(http("127.0.0.2", port, "GET", &u, Some(ALICE)), 200);
    for _ in 0..12 {
        assert_eq!(http("127.0.0.2", port, "GET", &u, None), 200);
    }
    let ips: Vec<IpAddr> = peers.lock().unwrap().iter().map(|a| a.ip()).collect();
    assert_eq!(ips.len(), 13);
    assert!(
        ["127.0.0.5", "127.0.0.6"].contains(&ips[0].to_string().as_str()),
        "{ips:?}"
    );
    assert!(ips.iter().all(|ip| *ip == ips[0]), "{ips:?}");
}

#[test]
fn dnsname_logins_are_cached_for_other_services() {
    let dns = PtrDns::start(
        &[("2.0.0.127.in-addr.arpa", "client.test")],
        &[("client.test", "127.0.0.2")],
    );
    let dir = Dir::new("acl_cache_dnsname");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    // b knows nobody by itself: `auth cache` alone.
    let cfg = format!(
        "nserver 127.0.0.1:{}\nlog {}\nlogformat \"L%E %p %C %U\"\nauthcache ip\n\
         allow client.test\nauth dnsname\n{}auth cache\n{}",
        dns.port,
        p(&log),
        tcppm(pa, origin.port()),
        tcppm(pb, origin.port())
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(pa)), Listen::Tcp(localhost(pb))],
    );
    assert_refused(&mut connect_from("127.0.0.2", localhost(pb)));
    expect_log_line(&log, &format!("00004 {pb} 127.0.0.2 -"));
    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(pa)), b"by name");
    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(pb)), b"cached");
    expect_log_line(&log, &format!("00000 {pb} 127.0.0.2 client.test"));
}

// ---------------------------------------------------------------------------
// Weight

#[test]
fn weight_carries_over_keep_alive_requests() {
    let ((o1, _), (o2, _)) = (http_origin(), http_origin());
    let dir = Dir::new("acl_weight_keepalive");
    let port = free_port();
    // o1 is reached through an entry of weight 500; any other port
    // through one of weight 100, which a request of weight 500 skips.
    let cfg = format!(
        "allow * * * {} * * * 500\nallow * * * * * * * 100\nproxy -i127.0.0.1 -p{port}\n",
        o1.port()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let (u1, u2) = (url(o1.port()), url(o2.port()));

    let mut c = HttpClient::on(connect_from("127.0.0.2", localhost(port)));
    assert_eq!(ask(&mut c, "GET", &u2, None), 200);
    assert_eq!(ask(&mut c, "GET", &u1, None), 200);
    assert_eq!(ask(&mut c, "GET", &u1, None), 200);
    // Now at weight 500: the entry of weight 100 no longer matches (code
    // 3, which the HTTP proxy answers with 407).
    assert_eq!(ask(&mut c, "GET", &u2, None), 407);
    // A new connection starts from weight 0.
    assert_eq!(http("127.0.0.2", port, "GET", &u2, None), 200);
}

#[test]
fn a_session_is_rechecked_after_a_reload_with_its_weight() {
    let dir = Dir::new("acl_weight_reload");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = |weight: u32| {
        format!(
            "log {}\n{LOGFORMAT}allow * * * * * * * {weight}\n{}",
            p(&log),
            tcppm(port, origin.port())
        )
    };
    let proxy = Proxy::start(dir, &cfg(500), &[Listen::Tcp(localhost(port))]);
    let mut heavy = connect_from("127.0.0.2", localhost(port));
    echo_roundtrip(&mut heavy, b"weight 500");

    // The same entry with weight 100: the session (weight 500) no longer
    // matches it when it is checked again; new sessions do.
    proxy.dir.write("3proxy.cfg", cfg(100));
    proxy.signal("USR1");
    assert!(
        wait_for(
            || proxy.stderr().contains("loaded, 1 services"),
            START_TIMEOUT
        ),
        "no reload: {}",
        proxy.stderr()
    );
    echo_roundtrip(&mut connect_from("127.0.0.2", localhost(port)), b"new");
    assert_refused(&mut heavy);
    expect_record(&log, 3, "127.0.0.2");
}

// ---------------------------------------------------------------------------
// Limits

#[test]
fn auth_none_still_applies_connlim() {
    let dir = Dir::new("acl_none_connlim");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}auth none\ndeny *\nconnlim 1 0 * 127.0.0.2\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    // The `deny *` is not asked, the connlim is.
    let mut one = connect_from("127.0.0.2", localhost(port));
    echo_roundtrip(&mut one, b"one");
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 10, "127.0.0.2");
    drop(one);
}

#[test]
fn connlim_with_a_period_limits_the_rate_of_new_sessions() {
    let dir = Dir::new("acl_connlim_rate");
    let log = dir.join("acl.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}connlim 2 60 * 127.0.0.2\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    // Two sessions, one after the other, each closed before the next.
    for i in 0..2 {
        let mut s = connect_from("127.0.0.2", localhost(port));
        echo_roundtrip(&mut s, format!("session {i}").as_bytes());
    }
    // None is open, but two in the last minute is the rate.
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
    expect_record(&log, 10, "127.0.0.2");
    echo_roundtrip(&mut connect_from("127.0.0.1", localhost(port)), b"other");
}

/// An origin that sends without end to each connection.
fn endless_source() -> Origin {
    Origin::start("127.0.0.1:0", |mut conn| {
        let block = vec![0x3cu8; 16384];
        while conn.write_all(&block).is_ok() {}
    })
}

#[test]
fn countin_stops_a_download_at_its_quota() {
    const MB: u64 = 1 << 20;
    let dir = Dir::new("acl_countin");
    let log = dir.join("acl.log");
    let counters = dir.join("3proxy.counters");
    let origin = endless_source();
    let port = free_port();
    let cfg = format!(
        "log {}\n{LOGFORMAT}counter {}\ncountin 2/down D 1 * 127.0.0.2\n{}",
        p(&log),
        p(&counters),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = connect_from("127.0.0.2", localhost(port));
    let got = read_until_closed(&mut s).map_or_else(|_| 0, |b| b.len() as u64);
    expect_record(&log, 10, "127.0.0.2");
    assert_eq!(got, MB, "the client must get exactly the quota");
    assert!(
        wait_for(
            || counter_record(&counters, 2).is_some_and(|n| n >= MB),
            LOG_TIMEOUT
        ),
        "record 2 is {:?}",
        counter_record(&counters, 2)
    );
    // Used up: the next download is refused at once.
    assert_refused(&mut connect_from("127.0.0.2", localhost(port)));
}

/// Clients from 127.0.0.2 reading from `port` without end; the bytes they
/// got so far, all together.
struct Downloads {
    total: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Downloads {
    fn new() -> Downloads {
        Downloads {
            total: Default::default(),
        }
    }

    fn start(&self, port: u16) {
        let total = self.total.clone();
        let mut s = connect_from("127.0.0.2", localhost(port));
        thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }

    /// The rate in bit/s over `window`.
    fn rate(&self, window: Duration) -> f64 {
        use std::sync::atomic::Ordering::SeqCst;
        let before = self.total.load(SeqCst);
        let t = Instant::now();
        thread::sleep(window);
        let bytes = self.total.load(SeqCst) - before;
        bytes as f64 * 8.0 / t.elapsed().as_secs_f64()
    }
}

#[test]
fn bandlimin_holds_its_rate_and_keeps_it_across_a_reload() {
    const BPS: f64 = 2_000_000.0;
    let dir = Dir::new("acl_bandlimin");
    let origin = endless_source();
    let port = free_port();
    let cfg = format!(
        "bandlimin {} * 127.0.0.2\n{}",
        BPS as u64,
        tcppm(port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let d = Downloads::new();
    d.start(port);
    thread::sleep(Duration::from_millis(500));
    let rate = d.rate(Duration::from_secs(4));
    assert!(
        (rate - BPS).abs() <= BPS * 0.10,
        "one download at {rate:.0} bit/s, want {BPS} within 10%"
    );

    // The same cfg again: the rule keeps its bucket, so a second download
    // started after the reload shares the limit with the first.
    proxy.signal("USR1");
    assert!(
        wait_for(
            || proxy.stderr().contains("loaded, 1 services"),
            START_TIMEOUT
        ),
        "no reload: {}",
        proxy.stderr()
    );
    d.start(port);
    thread::sleep(Duration::from_millis(500));
    let rate = d.rate(Duration::from_secs(4));
    assert!(
        (rate - BPS).abs() <= BPS * 0.15,
        "two downloads at {rate:.0} bit/s together, want {BPS} within 15%"
    );
}
