//! udppm, the UDP port mapper: datagrams both ways, clients kept apart,
//! `-s` single-packet sessions, the association's idle end, and the access
//! layer on associations: bandwidth limits, connlim, traffic quotas with
//! their counter file, `nolog`, and `force` after a reload.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::util::*;

fn udppm(opts: &str, port: u16, to: u16) -> String {
    format!("udppm {opts} -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

/// Sends `msg` to the proxy and expects it back, from the proxy's address.
fn roundtrip(client: &UdpSocket, proxy: SocketAddr, msg: &[u8]) {
    client.send_to(msg, proxy).expect("send to udppm");
    let (data, from) = recv(client);
    assert_eq!(
        from, proxy,
        "the reply should come from the address the client sent to"
    );
    assert_eq!(data, msg, "datagram came back different");
}

fn recv(client: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = vec![0u8; 65536];
    let (n, from) = client
        .recv_from(&mut buf)
        .expect("a datagram from udppm (none within the timeout)");
    buf.truncate(n);
    (buf, from)
}

#[test]
fn relays_several_datagrams_each_way() {
    let dir = Dir::new("udppm");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let _proxy = Proxy::start(dir, &udppm("", port, origin.port()), &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let client = udp_client();
    for size in [1usize, 100, 1400, 8000] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 7 % 256) as u8).collect();
        roundtrip(&client, proxy, &msg);
    }
    // One association: the origin saw a single source for all of them.
    let sources = origin.sources();
    assert_eq!(sources.len(), 4);
    assert!(
        sources.iter().all(|s| *s == sources[0]),
        "sources: {sources:?}"
    );

    // The origin may also speak first; that reaches the client too.
    for msg in [&b"push 1"[..], b"push 2", b"push 3"] {
        origin.send_to(msg, sources[0]);
        let (data, from) = recv(&client);
        assert_eq!(from, proxy);
        assert_eq!(data, msg);
    }
}

#[test]
fn keeps_clients_apart() {
    let dir = Dir::new("udppm_two");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let _proxy = Proxy::start(dir, &udppm("", port, origin.port()), &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let (a, b) = (udp_client(), udp_client());
    a.send_to(b"from a", proxy).unwrap();
    b.send_to(b"from b", proxy).unwrap();
    assert_eq!(recv(&a).0, b"from a");
    assert_eq!(recv(&b).0, b"from b");
    roundtrip(&b, proxy, b"b again");
    roundtrip(&a, proxy, b"a again");
    let mut sources = origin.sources();
    sources.sort();
    sources.dedup();
    assert_eq!(
        sources.len(),
        2,
        "two clients, two associations: {sources:?}"
    );
}

#[test]
fn dash_s_makes_one_session_per_datagram() {
    let dir = Dir::new("udppm_s");
    let log = dir.join("access.log");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&log),
        udppm("-s", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let client = udp_client();
    for msg in [b"req 1", b"req 2", b"req 3"] {
        roundtrip(&client, proxy, msg);
    }
    // Each session ends with its reply, so each is logged right away.
    let want = "UDPPM 00000 5 5";
    let complete = wait_for(
        || log_lines(&log).iter().filter(|l| *l == want).count() == 3,
        LOG_TIMEOUT,
    );
    assert!(
        complete,
        "want 3 lines {want:?}; the log has:\n{}",
        log_lines(&log).join("\n")
    );
}

#[test]
fn association_ends_after_string_long_idle_and_logs_totals() {
    let dir = Dir::new("udppm_idle");
    let log = dir.join("access.log");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    // The 4th timeout, STRING_LONG, is udppm's association idle time.
    let cfg = format!(
        "timeouts 1 5 30 2\nlog {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&log),
        udppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let client = udp_client();
    for msg in [b"ping1", b"ping2", b"ping3"] {
        roundtrip(&client, proxy, msg);
    }
    expect_log_line(&log, "UDPPM 00092 15 15");
    // A new datagram from the same client starts a new association.
    roundtrip(&client, proxy, b"after the idle end");
}

#[test]
fn survives_an_unreachable_destination() {
    let dir = Dir::new("udppm_dead");
    let dead = free_udp_port();
    let origin = UdpEcho::start();
    let (port, port2) = (free_udp_port(), free_udp_port());
    let cfg = format!(
        "{}{}",
        udppm("", port, dead),
        udppm("", port2, origin.port())
    );
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port), Listen::Udp(port2)]);

    let client = udp_client();
    // Nothing listens there: the kernel answers with ICMP port unreachable.
    for _ in 0..3 {
        client.send_to(b"nobody home", localhost(port)).unwrap();
    }
    roundtrip(&client, localhost(port2), b"still serving");
    client.send_to(b"nobody home", localhost(port)).unwrap();
    roundtrip(&client, localhost(port2), b"still serving");
    assert!(proxy.is_running(), "3proxy died after ICMP unreachable");
}

/// A UDP client on `ip` (127.0.0.2 for rules that must not match the
/// tests' other clients) with the test timeouts.
fn udp_client_on(ip: &str) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).expect("bind udp client");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// `L%N %E %C:%c %O %I`: service, code, client, bytes each way.
const ASSOC_FMT: &str = "logformat \"L%N %E %C:%c %O %I\"\n";

/// The record of an association of `client`.
fn record(client: &UdpSocket, code: u32, out: u64, inb: u64) -> String {
    let c = client.local_addr().unwrap();
    format!("UDPPM {code:05} {}:{} {out} {inb}", c.ip(), c.port())
}

/// The bit rate of echoes through a udppm limited by `limit` (a
/// `bandlimin` or `bandlimout` line) over about three seconds, with eight
/// datagrams of 1000 bytes in flight: each echo sends the next one, so the
/// limited direction always has datagrams waiting.
fn echo_rate(name: &str, limit: &str) -> f64 {
    let dir = Dir::new(name);
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let cfg = format!("{limit}\n{}", udppm("", port, origin.port()));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let client = udp_client();
    let msg = vec![0x3cu8; 1000];
    for _ in 0..8 {
        client.send_to(&msg, proxy).unwrap();
    }
    let mut buf = vec![0u8; 2048];
    let (n, _) = client.recv_from(&mut buf).expect("the first echo");
    assert_eq!(n, msg.len());
    client.send_to(&msg, proxy).unwrap();
    // Measured from the first echo, so the start of the association does
    // not count.
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        let (n, _) = client
            .recv_from(&mut buf)
            .expect("an echo (none within the timeout: datagrams were lost)");
        bytes += n as u64;
        client.send_to(&msg, proxy).unwrap();
    }
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64()
}

fn assert_rate(rate: f64, want: f64) {
    assert!(
        (rate - want).abs() <= want * 0.15,
        "{rate:.0} bit/s, want {want:.0} within 15%"
    );
}

#[test]
fn bandlimout_paces_what_clients_send() {
    // Unlimited, the loopback echo runs at hundreds of Mbit/s.
    assert_rate(
        echo_rate("udppm_bandlimout", "bandlimout 400000 *"),
        400_000.0,
    );
}

#[test]
fn bandlimin_paces_the_replies() {
    assert_rate(
        echo_rate("udppm_bandlimin", "bandlimin 400000 *"),
        400_000.0,
    );
}

#[test]
fn connlim_refuses_the_third_association() {
    let dir = Dir::new("udppm_connlim");
    let log = dir.join("access.log");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    // STRING_LONG 2: associations end after two quiet seconds.
    let cfg = format!(
        "timeouts 1 5 30 2\nlog {}\n{ASSOC_FMT}connlim 2 0 * 127.0.0.2\n{}",
        p(&log),
        udppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let (a, b, c) = (
        udp_client_on("127.0.0.2"),
        udp_client_on("127.0.0.2"),
        udp_client_on("127.0.0.2"),
    );
    roundtrip(&a, proxy, b"one");
    roundtrip(&b, proxy, b"two");
    c.send_to(b"three", proxy).unwrap();
    expect_log_line(&log, &record(&c, 10, 0, 0));
    assert_eq!(
        origin.sources().len(),
        2,
        "the refused datagram must not reach the origin"
    );
    // Other sources are not limited.
    roundtrip(&udp_client(), proxy, b"other");

    // When the first two end, their slots are free again.
    expect_log_line(&log, &record(&a, 92, 3, 3));
    expect_log_line(&log, &record(&b, 92, 3, 3));
    roundtrip(&c, proxy, b"three again");
}

#[test]
fn countout_ends_an_association_past_its_quota() {
    const SIZE: u64 = 60_000;
    let dir = Dir::new("udppm_count");
    let log = dir.join("access.log");
    let counters = dir.join("3proxy.counters");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    // 1 MiB each way: 17 datagrams of 60000 bytes fit, the 18th passes it.
    let cfg = format!(
        "log {}\n{ASSOC_FMT}counter {}\ncountout 1 D 1 *\ncountin 2 D 1 *\n{}",
        p(&log),
        p(&counters),
        udppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let proxy = localhost(port);

    let client = udp_client();
    let msg = vec![0x77u8; SIZE as usize];
    for _ in 0..17 {
        roundtrip(&client, proxy, &msg);
    }
    // The datagram that passes the quota is the last one sent on: the
    // association ends with code 10 before its echo comes back.
    client.send_to(&msg, proxy).unwrap();
    expect_log_line(&log, &record(&client, 10, 18 * SIZE, 17 * SIZE));
    // The quota is used up: the next datagram is refused when it would
    // open a new association.
    client.send_to(&msg, proxy).unwrap();
    expect_log_line(&log, &record(&client, 10, 0, 0));
    assert_eq!(
        origin.sources().len(),
        18,
        "datagrams that reached the origin"
    );
    let both = || (counter_record(&counters, 1), counter_record(&counters, 2));
    assert!(
        wait_for(|| both() == (Some(18 * SIZE), Some(17 * SIZE)), LOG_TIMEOUT),
        "counter records 1 and 2 (out, in): {:?}",
        both()
    );
}

#[test]
fn nolog_associations_leave_no_record() {
    let dir = Dir::new("udppm_nolog");
    let log = dir.join("access.log");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let cfg = format!(
        "log {}\n{ASSOC_FMT}allow * 127.0.0.2\nnolog\nallow *\n{}",
        p(&log),
        udppm("-s", port, origin.port())
    );
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Udp(port)]);
    let addr = localhost(port);

    let quiet = udp_client_on("127.0.0.2");
    roundtrip(&quiet, addr, b"not logged");
    roundtrip(&quiet, addr, b"nor this");
    let loud = udp_client();
    roundtrip(&loud, addr, b"logged");
    // With -s every association has ended with its reply; at exit the log
    // holds all that will ever be written.
    proxy.signal("TERM");
    assert!(
        proxy.wait_exit(START_TIMEOUT).is_some(),
        "3proxy did not exit"
    );
    let lines = log_lines(&log);
    assert!(
        lines.contains(&record(&loud, 0, 6, 6)),
        "no record of the logged client: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("127.0.0.2")),
        "a nolog association was logged: {lines:?}"
    );
}

#[test]
fn force_stops_an_association_the_new_acl_denies() {
    let dir = Dir::new("udppm_force");
    let log = dir.join("access.log");
    let origin = UdpEcho::start();
    let port = free_udp_port();
    let cfg = |acl: &str| {
        format!(
            "log {}\n{ASSOC_FMT}{acl}\n{}",
            p(&log),
            udppm("", port, origin.port())
        )
    };
    let proxy = Proxy::start(dir, &cfg("allow *"), &[Listen::Udp(port)]);
    let addr = localhost(port);

    let client = udp_client();
    roundtrip(&client, addr, b"before");
    let assoc_src = origin.sources()[0];

    proxy.dir.write("3proxy.cfg", cfg("deny *"));
    proxy.signal("USR1");
    // The reload has taken effect once another client is refused.
    let probe = udp_client();
    let refused = |l: &String| {
        let p = probe.local_addr().unwrap();
        l.starts_with(&format!("UDPPM 00001 {}:{} ", p.ip(), p.port()))
    };
    assert!(
        wait_for(
            || {
                let _ = probe.send_to(b"probe", addr);
                log_lines(&log).iter().any(refused)
            },
            START_TIMEOUT
        ),
        "the new ACL never took effect:\n{}",
        log_lines(&log).join("\n")
    );

    // The association admitted before the reload is checked when its next
    // datagram comes, and ends with the refusal's code.
    client.send_to(b"after", addr).unwrap();
    expect_log_line(&log, &record(&client, 1, 6, 6));
    let via_old = origin.sources().iter().filter(|s| **s == assoc_src).count();
    assert_eq!(
        via_old, 1,
        "the denied association relayed another datagram"
    );
}
