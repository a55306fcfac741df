//! parent chains: `tcppm` and `socks` through chains of two and three of
//! our own `3proxy` processes of different parent types, ending at a real
//! origin; the bytes that arrive and what each hop logs; credentials to
//! parents; a parent that is down, after `parentretries`; weights.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::socks::{curl, http_origin};
use crate::util::*;

/// Service, code, hops, user, text.
const FMT: &str = "L%N %E %h %U %T";

fn socks_on(port: u16) -> String {
    format!("socks -i127.0.0.1 -p{port}\n")
}

fn tcppm_on(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

#[test]
fn tcppm_through_a_socks5_parent() {
    let origin = Origin::echo();
    let (pb, pa) = (free_port(), free_port());
    let (_b, log_b) = start(Dir::new("p_b"), FMT, &socks_on(pb), &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, log_a) = start(Dir::new("p_a"), FMT, &a_cfg, &[pa]);

    let mut c = connect(localhost(pa));
    echo_roundtrip(&mut c, b"through the chain");
    drop(c);
    expect_log_line(&log_a, "TCPPM 00000 1 - 127.0.0.1");
    expect_log_line(
        &log_b,
        &format!("SOCK5 00000 0 - CONNECT 127.0.0.1:{}", origin.port()),
    );
    // The origin saw B, not A, and not the client.
    assert!(origin.peers().iter().all(|a| a.ip() == localhost(0).ip()));
}

#[test]
fn socks_through_socks5_plus_then_socks4_three_processes() {
    // client -socks5h-> A -socks5+-> B -socks4-> C -> origin. A passes
    // the name on; B resolves it (socks4 has no names); C connects. A
    // socks4 parent is sent the user id "anonymous", as 3proxy does.
    let origin = http_origin("127.0.0.1:0");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (_c, log_c) = start(Dir::new("p3_c"), FMT, &socks_on(pc), &[pc]);
    let b_cfg = format!(
        "allow *\nparent 1000 socks4 127.0.0.1 {pc}\n{}",
        socks_on(pb)
    );
    let (_b, log_b) = start(Dir::new("p3_b"), FMT, &b_cfg, &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5+ 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("p3_a"), FMT, &a_cfg, &[pa]);

    let body = curl(
        &format!("socks5h://127.0.0.1:{pa}"),
        &format!("http://localhost:{}/three", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /three");
    let port = origin.port();
    expect_log_line(&log_a, &format!("SOCK5 00000 1 - CONNECT localhost:{port}"));
    expect_log_line(&log_b, &format!("SOCK5 00000 1 - CONNECT localhost:{port}"));
    expect_log_line(
        &log_c,
        &format!("SOCK4 00000 0 anonymous CONNECT 127.0.0.1:{port}"),
    );
}

#[test]
fn one_process_two_hops_in_one_chain() {
    // Two groups in one ACL entry: A dials B, asks B for C, asks C for
    // the origin.
    let origin = Origin::echo();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (_c, log_c) = start(Dir::new("p2_c"), FMT, &socks_on(pc), &[pc]);
    let (_b, log_b) = start(Dir::new("p2_b"), FMT, &socks_on(pb), &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\nparent 1000 socks4 127.0.0.1 {pc}\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, log_a) = start(Dir::new("p2_a"), FMT, &a_cfg, &[pa]);
    let mut s = connect(localhost(pa));
    echo_roundtrip(&mut s, b"two hops");
    drop(s);
    expect_log_line(&log_a, "TCPPM 00000 2 - 127.0.0.1");
    expect_log_line(&log_b, &format!("SOCK5 00000 0 - CONNECT 127.0.0.1:{pc}"));
    expect_log_line(
        &log_c,
        &format!(
            "SOCK4 00000 0 anonymous CONNECT 127.0.0.1:{}",
            origin.port()
        ),
    );
}

#[test]
fn connect_and_connect_plus_parents_through_our_http_proxy() {
    let origin = Origin::echo();
    let (pa, pb, pa2) = (free_port(), free_port(), free_port());
    let (_b, log_b) = start(
        Dir::new("pc_b"),
        FMT,
        &format!("proxy -i127.0.0.1 -p{pb}\n"),
        &[pb],
    );
    let a_cfg = format!(
        "allow * * * * CONNECT\nparent 1000 connect 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pc_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_to(pa, origin.port());
    echo_roundtrip(&mut s, b"over CONNECT");
    drop(s);
    expect_log_line(
        &log_a,
        &format!("SOCK5 00000 1 - CONNECT 127.0.0.1:{}", origin.port()),
    );
    read_log_line(&log_b, "the CONNECT", |l| {
        l.contains(&format!("CONNECT 127.0.0.1:{}", origin.port()))
    });

    // connect+ sends the name the client gave.
    let a2_cfg = format!(
        "allow *\nparent 1000 connect+ 127.0.0.1 {pb}\n{}",
        socks_on(pa2)
    );
    let (_a2, _log_a2) = start(Dir::new("pc_a2"), FMT, &a2_cfg, &[pa2]);
    let request = socks5_request_name(1, b"localhost", origin.port());
    let mut s = socks5_open(pa2, None, &request).expect("CONNECT by name granted");
    echo_roundtrip(&mut s, b"by name over CONNECT");
    drop(s);
    read_log_line(&log_b, "the CONNECT by name", |l| {
        l.contains(&format!("CONNECT localhost:{}", origin.port()))
    });
}

#[test]
fn credentials_go_to_the_parent_and_star_passes_the_clients() {
    let origin = Origin::echo();
    let (pa, pb, pa2) = (free_port(), free_port(), free_port());
    let b_cfg = format!(
        "users carol:CL:pw1 dave:CL:pw2\nauth strong\nallow carol,dave\n{}",
        socks_on(pb)
    );
    let (_b, log_b) = start(Dir::new("pcred_b"), FMT, &b_cfg, &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb} carol pw1\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, _log_a) = start(Dir::new("pcred_a"), FMT, &a_cfg, &[pa]);
    let mut s = connect(localhost(pa));
    echo_roundtrip(&mut s, b"as carol");
    drop(s);
    expect_log_line(
        &log_b,
        &format!("SOCK5 00000 0 carol CONNECT 127.0.0.1:{}", origin.port()),
    );

    // `*`: the client's own name and password, from its SOCKS5 login.
    let a2_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb} *\n{}",
        socks_on(pa2)
    );
    let (_a2, log_a2) = start(Dir::new("pcred_a2"), FMT, &a2_cfg, &[pa2]);
    let mut s = socks5_connect(pa2, Some(("dave", "pw2")), localhost(origin.port()));
    echo_roundtrip(&mut s, b"as dave");
    drop(s);
    expect_log_line(
        &log_b,
        &format!("SOCK5 00000 0 dave CONNECT 127.0.0.1:{}", origin.port()),
    );
    // A client with no name cannot lend one: code 4, "not allowed".
    let mut s = socks5_hello(pa2, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let got = read_until_closed(&mut s).unwrap();
    assert_eq!(got, [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    read_log_line(&log_a2, "code 4", |l| l.starts_with("SOCK5 00004"));
}

#[test]
fn a_parent_that_refuses_gives_60_plus_its_reply() {
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    let (_b, _log_b) = start(
        Dir::new("pref_b"),
        FMT,
        &format!("deny *\n{}", socks_on(pb)),
        &[pb],
    );
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pref_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_hello(pa, None);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    // 62 (B said "not allowed") is a parent failure: host unreachable.
    assert_eq!(
        read_until_closed(&mut s).unwrap(),
        [5, 4, 0, 1, 0, 0, 0, 0, 0, 0]
    );
    read_log_line(&log_a, "code 62", |l| l.starts_with("SOCK5 00062"));
}

/// A fake parent that accepts and closes at once; counts connections
/// (the readiness probe is one).
fn slammer() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    thread::spawn(move || {
        for c in l.incoming().flatten() {
            n2.fetch_add(1, Ordering::SeqCst);
            let _ = c.shutdown(Shutdown::Both);
        }
    });
    (port, n)
}

#[test]
fn a_broken_parent_is_tried_parentretries_times() {
    let (bad, tries) = slammer();
    let pa = free_port();
    let a_cfg = format!(
        "parentretries 3\nallow *\nparent 1000 socks5 127.0.0.1 {bad}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pdown_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_hello(pa, None);
    s.write_all(&socks5_request(1, localhost(80))).unwrap();
    assert_eq!(
        read_until_closed(&mut s).unwrap(),
        [5, 4, 0, 1, 0, 0, 0, 0, 0, 0]
    );
    // No greeting came back: 52.
    read_log_line(&log_a, "code 52", |l| l.starts_with("SOCK5 00052"));
    assert_eq!(tries.load(Ordering::SeqCst), 3);
}

#[test]
fn a_parent_that_is_down_fails_with_13() {
    let down = free_port();
    let pa = free_port();
    let a_cfg = format!(
        "allow *\nparent 1000 connect 127.0.0.1 {down}\n{}",
        tcppm_on(pa, 9)
    );
    let (_a, log_a) = start(Dir::new("pdead_a"), FMT, &a_cfg, &[pa]);
    let mut s = connect(localhost(pa));
    assert_eq!(read_until_closed(&mut s).unwrap(), b"");
    read_log_line(&log_a, "code 13", |l| l.starts_with("TCPPM 00013"));
}

#[test]
fn tcp_parent_ends_the_chain_and_keeps_the_requested_port() {
    // `tcp 127.0.0.1 0`: go to 127.0.0.1, at the port asked for.
    let origin = Origin::echo();
    let pa = free_port();
    let a_cfg = format!("allow *\nparent 1000 tcp 127.0.0.1 0\n{}", socks_on(pa));
    let (_a, log_a) = start(Dir::new("ptcp_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_to(pa, origin.port());
    echo_roundtrip(&mut s, b"tcp parent");
    drop(s);
    expect_log_line(
        &log_a,
        &format!("SOCK5 00000 1 - CONNECT 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn weights_spread_requests_over_a_group() {
    let origin = Origin::echo();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (_b, log_b) = start(Dir::new("pw_b"), FMT, &socks_on(pb), &[pb]);
    let (_c, log_c) = start(Dir::new("pw_c"), FMT, &socks_on(pc), &[pc]);
    let a_cfg = format!(
        "allow *\nparent 500 socks5 127.0.0.1 {pb}\nparent 500 socks5 127.0.0.1 {pc}\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, _log_a) = start(Dir::new("pw_a"), FMT, &a_cfg, &[pa]);
    for i in 0..40 {
        let mut s = connect(localhost(pa));
        echo_roundtrip(&mut s, format!("request {i}").as_bytes());
    }
    let count = |log: &PathBuf| {
        log_lines(log)
            .iter()
            .filter(|l| l.starts_with("SOCK5 00000"))
            .count()
    };
    assert!(
        // 40, and one more from A's readiness probe.
        wait_for(|| count(&log_b) + count(&log_c) >= 40, LOG_TIMEOUT),
        "b {} c {}",
        count(&log_b),
        count(&log_c)
    );
    // Each should get about 20 of 40: (0.5^40 odds of a miss).
    assert!(count(&log_b) >= 5 && count(&log_c) >= 5);
}

#[test]
fn parent_errors_name_the_line() {
    let dir = Dir::new("perr");
    let out = start_expect_fail(&dir, "parent 1000 socks5 127.0.0.1 1080\n");
    out.assert_cfg_error(&dir.cfg_path(), 1, "parent");
    let out = start_expect_fail(&dir, "allow *\nparent 1000 socks9 127.0.0.1 1080\n");
    out.assert_cfg_error(&dir.cfg_path(), 2, "parent");
}

#[test]
fn idle_chain_session_still_times_out() {
    // The relay after a chain is the ordinary one: CONNECTION_LONG ends
    // an idle session with 92 on every hop.
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    let (_b, _log_b) = start(
        Dir::new("pidle_b"),
        FMT,
        &format!("timeouts 1 5 30 60 180 2\n{}", socks_on(pb)),
        &[pb],
    );
    let a_cfg = format!(
        "timeouts 1 5 30 60 180 2\nallow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, log_a) = start(Dir::new("pidle_a"), FMT, &a_cfg, &[pa]);
    let mut s = connect(localhost(pa));
    echo_roundtrip(&mut s, b"x");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(read_until_closed(&mut s).unwrap(), b"");
    expect_log_line(&log_a, "TCPPM 00092 1 - 127.0.0.1");
}

#[test]
fn ha_sends_a_proxy_header_to_the_next_hop() {
    // A: ha, then a tcp parent B; B is a tcppm with -H, which takes the
    // client address from the header.
    let origin = Origin::echo();
    let (pa, pb) = (free_port(), free_port());
    let b_cfg = format!("tcppm -H -i127.0.0.1 {pb} 127.0.0.1 {}\n", origin.port());
    let (_b, log_b) = start(Dir::new("pha_b"), "L%N %E %C:%c", &b_cfg, &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 ha 0.0.0.0 0\nparent 1000 tcp 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, _log_a) = start(Dir::new("pha_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_to(pa, 9);
    let me = s.local_addr().unwrap();
    echo_roundtrip(&mut s, b"with a PROXY header");
    drop(s);
    expect_log_line(&log_b, &format!("TCPPM 00000 {}:{}", me.ip(), me.port()));
}

#[test]
fn extip_sets_the_source_address() {
    let origin = Origin::echo();
    let pa = free_port();
    let a_cfg = format!(
        "allow *\nparent 1000 extip 127.0.0.2 0\n{}",
        tcppm_on(pa, origin.port())
    );
    let (_a, _log_a) = start(Dir::new("pext_a"), FMT, &a_cfg, &[pa]);
    let mut s = connect(localhost(pa));
    echo_roundtrip(&mut s, b"from 127.0.0.2");
    let peers = origin.peers();
    assert!(
        peers.iter().any(|a| a.ip().to_string() == "127.0.0.2"),
        "{peers:?}"
    );
}

#[test]
fn redirect_sends_socks_clients_to_the_http_parent_as_tcp() {
    // For services other than `proxy` an `http` parent is a plain relay.
    let origin = Origin::echo();
    let pa = free_port();
    let a_cfg = format!("redirect 127.0.0.1 {}\n{}", origin.port(), socks_on(pa));
    let (_a, log_a) = start(Dir::new("predir_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_to(pa, 9);
    echo_roundtrip(&mut s, b"redirected");
    drop(s);
    expect_log_line(&log_a, "SOCK5 00000 1 - CONNECT 127.0.0.1:9");
}

#[test]
fn bind_skips_an_allow_with_parents() {
    // 3proxy cannot chain a BIND: the entry with parents is passed over
    // and the next one decides.
    let pa = free_port();
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 9\ndeny *\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pbind_a"), FMT, &a_cfg, &[pa]);
    let mut s = socks5_hello(pa, None);
    s.write_all(&socks5_request(2, "0.0.0.0:0".parse().unwrap()))
        .unwrap();
    assert_eq!(
        read_until_closed(&mut s).unwrap(),
        [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]
    );
    read_log_line(&log_a, "code 1", |l| l.starts_with("SOCK5 00001"));
}

/// Opens a SOCKS5 UDP association at `proxy` for `client`; returns the
/// control connection and the reply's code and relay address.
fn udp_associate_at(
    proxy: u16,
    client: &std::net::UdpSocket,
) -> (std::net::TcpStream, u8, std::net::SocketAddr) {
    let mut ctl = socks5_hello(proxy, None);
    let from = client.local_addr().unwrap();
    ctl.write_all(&socks5_request(3, localhost(from.port())))
        .unwrap();
    let mut r = [0u8; 10];
    ctl.read_exact(&mut r).unwrap();
    let relay =
        std::net::SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[8], r[9]])));
    (ctl, r[1], relay)
}

/// A SOCKS5 UDP datagram for 127.0.0.1:`port`.
fn datagram(port: u16, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 0, 1, 127, 0, 0, 1];
    b.extend_from_slice(&port.to_be_bytes());
    b.extend_from_slice(data);
    b
}

#[test]
fn udp_associate_through_a_socks5_parent() {
    // client -UDP-> A -UDP-> B's relay -> echo; A associates with B over
    // TCP and passes the datagrams to B's relay with their headers.
    let echo = UdpEcho::start();
    let (pb, pa) = (free_port(), free_port());
    let (_b, log_b) = start(Dir::new("pu_b"), FMT, &socks_on(pb), &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("pu_a"), FMT, &a_cfg, &[pa]);

    let client = udp_client();
    let (ctl, rep, relay) = udp_associate_at(pa, &client);
    assert_eq!(rep, 0);
    for msg in [&b"one"[..], b"two", &[9u8; 1200]] {
        client.send_to(&datagram(echo.port(), msg), relay).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, relay);
        assert_eq!(&buf[..n], &datagram(echo.port(), msg)[..]);
    }
    // The echo saw B's relay, not A's: nothing came from A's relay port.
    assert!(echo.sources().iter().all(|s| s.port() != relay.port()));
    drop(ctl);
    let text = format!("UDPMAP 127.0.0.1:{}", echo.port());
    expect_log_line(&log_a, &format!("SOCK5 00000 1 - {text}"));
    expect_log_line(&log_b, &format!("SOCK5 00000 0 - {text}"));
}

#[test]
fn udppm_through_a_socks5_parent() {
    // client -UDP-> A (udppm) -UDP-> B's relay -> echo: A makes a UDP
    // association at B and wraps each datagram in a SOCKS header there,
    // unwrapping the replies; the client sees plain datagrams.
    let echo = UdpEcho::start();
    let (pb, pa) = (free_port(), free_udp_port());
    let (_b, log_b) = start(Dir::new("pm_b"), FMT, &socks_on(pb), &[pb]);
    let a_cfg = format!(
        "timeouts 1 5 30 2\nallow *\nparent 1000 socks5 127.0.0.1 {pb}\nudppm -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        echo.port()
    );
    let (_a, log_a) = start_ready(Dir::new("pm_a"), FMT, &a_cfg, &[Listen::Udp(pa)]);
    let client = udp_client();
    let a = localhost(pa);
    for msg in [&b"one"[..], b"two", &[3u8; 1200]] {
        client.send_to(msg, a).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, a);
        assert_eq!(&buf[..n], msg);
    }
    // Every datagram reached the echo from B's relay, so from one source
    // that is not A's association socket (A sends to B, not to the echo).
    let sources = echo.sources();
    assert_eq!(sources.len(), 3);
    assert!(sources.iter().all(|s| *s == sources[0]), "{sources:?}");
    // A's association ends after STRING_LONG (2 s) without a reply: its
    // record counts one hop, and closing its control connection ends the
    // association at B, which logs what it relayed for A.
    expect_log_line(&log_a, "UDPPM 00092 1 - 127.0.0.1");
    expect_log_line(
        &log_b,
        &format!("SOCK5 00000 0 - UDPMAP 127.0.0.1:{}", echo.port()),
    );
}

#[test]
fn udppm_through_a_socks5_parent_that_is_down_is_logged() {
    // Nothing listens at the parent: the association is not made, the
    // datagram is dropped and the record says why.
    let echo = UdpEcho::start();
    let pa = free_udp_port();
    let dead = free_port();
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {dead}\nudppm -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        echo.port()
    );
    let (_a, log_a) = start_ready(Dir::new("pm_dead"), FMT, &a_cfg, &[Listen::Udp(pa)]);
    let client = udp_client();
    client.send_to(b"lost", localhost(pa)).unwrap();
    // Code 13: the parent refused the connection (`parent` chain codes).
    read_log_line(&log_a, "the failed association", |l| {
        l == "UDPPM 00013 0 - 127.0.0.1"
    });
    assert!(echo.sources().is_empty());
}

#[test]
fn udppm_passes_over_parents_that_cannot_carry_udp() {
    // As in 3proxy, udppm ignores an entry's parents unless they can
    // carry UDP: with an http parent (nothing listens there) the
    // datagrams go straight to the destination.
    let echo = UdpEcho::start();
    let pa = free_udp_port();
    let dead = free_port();
    let a_cfg = format!(
        "timeouts 1 5 30 1\nallow *\nparent 1000 http 127.0.0.1 {dead}\nudppm -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        echo.port()
    );
    let (_a, log_a) = start_ready(Dir::new("pm_http"), FMT, &a_cfg, &[Listen::Udp(pa)]);
    let client = udp_client();
    client.send_to(b"direct", localhost(pa)).unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"direct");
    expect_log_line(&log_a, "UDPPM 00092 0 - 127.0.0.1");
}

#[test]
fn udp_associate_through_a_tcp_parent_is_refused_with_70() {
    let pa = free_port();
    let a_cfg = format!("allow *\nparent 1000 tcp 127.0.0.1 9\n{}", socks_on(pa));
    let (_a, log_a) = start(Dir::new("pu_tcp"), FMT, &a_cfg, &[pa]);
    let client = udp_client();
    let (_ctl, rep, _) = udp_associate_at(pa, &client);
    assert_ne!(rep, 0);
    read_log_line(&log_a, "code 70", |l| l.starts_with("SOCK5 00070"));
}

#[test]
fn http_local_redirect_hands_socks_clients_to_the_proxy_handler() {
    // The SOCKS CONNECT is allowed by an entry that redirects to the
    // local `proxy` handler; that handler's own ACL pass skips the
    // entry (no loop) and takes the next.
    let origin = http_origin("127.0.0.1:0");
    let pa = free_port();
    let cfg = format!(
        "allow * * * * CONNECT\nparent 1000 http 0.0.0.0 0\nallow *\n{}",
        socks_on(pa)
    );
    let (_a, log) = start(Dir::new("pl_http"), FMT, &cfg, &[pa]);
    let body = curl(
        &format!("socks5://127.0.0.1:{pa}"),
        &format!("http://127.0.0.1:{}/redir", origin.port()),
    )
    .unwrap();
    assert_eq!(body, "hello /redir");
    // The record is the HTTP handler's: a GET, one hop (the redirection).
    let line = read_log_line(&log, "the GET", |l| l.contains("/redir"));
    assert!(line.contains(" 00000 1 "), "{line}");
    assert!(line.contains("GET"), "{line}");
}

#[test]
fn http_local_redirect_alone_does_not_loop() {
    // Only the redirecting entry: on the second pass nothing is usable,
    // so the HTTP request is refused instead of redirected again.
    let origin = http_origin("127.0.0.1:0");
    let pa = free_port();
    let cfg = format!("allow *\nparent 1000 http 0.0.0.0 0\n{}", socks_on(pa));
    let (_a, _log) = start(Dir::new("pl_http_loop"), FMT, &cfg, &[pa]);
    let body = curl(
        &format!("socks5://127.0.0.1:{pa}"),
        &format!("http://127.0.0.1:{}/loop", origin.port()),
    );
    assert_ne!(body.as_deref(), Ok("hello /loop"));
}

#[test]
fn http_local_redirect_behind_a_proxy_header() {
    // `socks -H`: the PROXY line is read once, by the SOCKS service; the
    // HTTP handler it hands the client to must not expect another.
    use std::io::{Read, Write};
    let origin = http_origin("127.0.0.1:0");
    let pa = free_port();
    let cfg = format!(
        "allow * * * * CONNECT\nparent 1000 http 0.0.0.0 0\nallow *\nsocks -H -i127.0.0.1 -p{pa}\n"
    );
    let (_a, log) = start(Dir::new("pl_http_h"), FMT, &cfg, &[pa]);
    let mut s = connect(localhost(pa));
    s.write_all(format!("PROXY TCP4 192.0.2.7 127.0.0.1 4444 {pa}\r\n").as_bytes())
        .unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    expect_bytes(&mut s, &[5, 0]);
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let reply = read_socks5_reply(&mut s).unwrap();
    assert_eq!(reply[1], 0, "CONNECT granted");
    let req = format!(
        "GET /hdr HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
        origin.port()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    assert!(got.ends_with("hello /hdr"), "{got:?}");
    let line = read_log_line(&log, "the GET", |l| l.contains("/hdr"));
    // Served, not refused for a second, missing PROXY line (511).
    assert!(line.starts_with("SOCK5 00000 1 "), "{line}");
}

// ---------------------------------------------------------------------------
// DNS through a SOCKS5 parent, against a real DNS server

/// Debian's dnsmasq on a free UDP port of 127.0.0.1, answering
/// `udp.test` with 192.0.2.7 from its own cfg (no upstream, no hosts).
struct Dnsmasq {
    child: std::process::Child,
    port: u16,
}

impl Dnsmasq {
    fn start() -> Dnsmasq {
        let port = free_udp_port();
        let child = std::process::Command::new(sbin("dnsmasq"))
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--user=root",
                "--pid-file=",
                &format!("--port={port}"),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--address=/udp.test/192.0.2.7",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("dnsmasq (tests/deps.sh installs dnsmasq-base)");
        let d = Dnsmasq { child, port };
        let c = udp_client();
        c.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let up = wait_for(
            || {
                let _ = c.send_to(&dns_query(1), localhost(port));
                let mut buf = [0u8; 512];
                c.recv_from(&mut buf).is_ok()
            },
            START_TIMEOUT,
        );
        assert!(up, "dnsmasq did not answer on port {port}");
        d
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An A query for udp.test with ID `id`.
fn dns_query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(b"\x03udp\x04test\x00\x00\x01\x00\x01");
    q
}

/// The reply to `dns_query(id)` carries one answer, 192.0.2.7.
fn assert_dns_answer(reply: &[u8], id: u16) {
    assert!(reply.len() > 12, "DNS reply too short: {reply:?}");
    assert_eq!(reply[..2], id.to_be_bytes(), "reply ID");
    assert!(reply[2] & 0x80 != 0, "not a response: {reply:?}");
    assert_eq!(reply[3] & 0x0f, 0, "rcode: {reply:?}");
    assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), 1, "one answer");
    assert!(reply.ends_with(&[192, 0, 2, 7]), "the answer: {reply:?}");
}

#[test]
fn dns_through_socks5_udp_associate_via_a_parent() {
    // client -SOCKS5 UDP-> A -> B (socks5 parent) -> dnsmasq: the query
    // and its answer pass both hops with their headers.
    let dns = Dnsmasq::start();
    let (pb, pa) = (free_port(), free_port());
    let (_b, log_b) = start(Dir::new("dns_b"), FMT, &socks_on(pb), &[pb]);
    let a_cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\n{}",
        socks_on(pa)
    );
    let (_a, log_a) = start(Dir::new("dns_a"), FMT, &a_cfg, &[pa]);
    let client = udp_client();
    let (ctl, rep, relay) = udp_associate_at(pa, &client);
    assert_eq!(rep, 0);
    client
        .send_to(&datagram(dns.port, &dns_query(0x4242)), relay)
        .unwrap();
    let mut buf = [0u8; 1024];
    let (n, from) = client.recv_from(&mut buf).unwrap();
    assert_eq!(from, relay);
    let head = datagram(dns.port, b"");
    assert_eq!(buf[..head.len()], head[..], "the SOCKS header of the reply");
    assert_dns_answer(&buf[head.len()..n], 0x4242);
    drop(ctl);
    let text = format!("UDPMAP 127.0.0.1:{}", dns.port);
    expect_log_line(&log_a, &format!("SOCK5 00000 1 - {text}"));
    expect_log_line(&log_b, &format!("SOCK5 00000 0 - {text}"));
}

#[test]
fn dns_through_udppm_via_a_socks5_parent() {
    // A DNS forwarder made of a udppm whose association goes through a
    // socks5 parent: plain queries in, plain answers out.
    let dns = Dnsmasq::start();
    let (pb, pa) = (free_port(), free_udp_port());
    let (_b, log_b) = start(Dir::new("dnspm_b"), FMT, &socks_on(pb), &[pb]);
    let dir = Dir::new("dnspm_a");
    let cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb}\nudppm -s -i127.0.0.1 {pa} 127.0.0.1 {}\n",
        dns.port
    );
    let _a = Proxy::start(dir, &cfg, &[Listen::Udp(pa)]);
    for id in [7u16, 8] {
        let client = udp_client();
        client.send_to(&dns_query(id), localhost(pa)).unwrap();
        let mut buf = [0u8; 1024];
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_dns_answer(&buf[..n], id);
    }
    // With -s each query is an association of its own, ended by its
    // answer: B logs two.
    let text = format!("SOCK5 00000 0 - UDPMAP 127.0.0.1:{}", dns.port);
    assert!(
        wait_for(
            || log_lines(&log_b).iter().filter(|l| **l == text).count() == 2,
            LOG_TIMEOUT
        ),
        "two associations at the parent:\n{}",
        log_lines(&log_b).join("\n")
    );
}
