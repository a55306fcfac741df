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
