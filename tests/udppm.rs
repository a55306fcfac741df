//! udppm, the UDP port mapper: datagrams both ways, clients kept apart,
//! `-s` single-packet sessions, and the association's idle end.

use std::net::{SocketAddr, UdpSocket};

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
