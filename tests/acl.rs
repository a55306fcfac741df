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

/// Record `n`'s byte count in a counter file (3proxy's layout).
fn counter_record(path: &Path, n: u64) -> Option<u64> {
    let b = std::fs::read(path).ok()?;
    let off = (16 + (n - 1) * 24) as usize;
    let word: [u8; 8] = b.get(off..off + 8)?.try_into().ok()?;
    Some(u64::from_ne_bytes(word))
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
