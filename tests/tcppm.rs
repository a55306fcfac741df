//! tcppm, the TCP port mapper: bulk relay, half-close and `-C`, maxconn,
//! the idle timeout, many idle sessions, the PROXY v1 header, unix sockets
//! and IPv6.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

fn tcppm(opts: &str, port: u16, to: u16) -> String {
    format!("tcppm {opts} -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

/// A tcppm with `opts` in front of an echo origin, ready on its port.
fn echo_tcppm(name: &str, opts: &str) -> (Proxy, Origin, u16) {
    let origin = Origin::echo();
    let port = free_port();
    let proxy = Proxy::start(
        Dir::new(name),
        &tcppm(opts, port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    (proxy, origin, port)
}

const BULK: u64 = 64 * 1024 * 1024;
const SEED_UP: u64 = 1;
const SEED_DOWN: u64 = 2;

/// 64 MiB each way at the same time; both directions must arrive intact.
/// `splice`: with `-s`, and splice(2) must have moved the data.
fn bulk_both_ways(name: &str, splice: bool) {
    let dir = Dir::new(name);
    let (origin, up) = Origin::hash_sink(BULK, SEED_DOWN);
    let port = free_port();
    let opts = if splice { "-s" } else { "" };
    let proxy = Proxy::start(
        dir,
        &tcppm(opts, port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    let trace = splice.then(|| Strace::attach(&proxy, "splice"));

    let mut client = connect(localhost(port));
    set_timeouts(&client, Duration::from_secs(60));
    let mut down = client.try_clone().unwrap();
    let reader = thread::spawn(move || hash_to_eof(&mut down));
    send_pattern(&mut client, SEED_UP, BULK).expect("send 64 MiB to the proxy");
    client.shutdown(Shutdown::Write).unwrap();

    let down = reader.join().unwrap().expect("read 64 MiB from the proxy");
    let up = recv_nonempty(&up, Duration::from_secs(60));
    assert_eq!(up, pattern_digest(SEED_UP, BULK), "client -> origin");
    assert_eq!(down, pattern_digest(SEED_DOWN, BULK), "origin -> client");
    if let Some(trace) = trace {
        // Both directions, each byte at least once.
        trace.assert_moved(2 * BULK);
    }
}

#[test]
fn relays_64mb_each_way_intact() {
    bulk_both_ways("bulk", false);
}

#[test]
fn relays_64mb_each_way_intact_with_splice() {
    bulk_both_ways("bulk_splice", true);
}

#[test]
fn small_buffer_relays_intact() {
    buffer_size_relays_intact("small_buf", "-b1024");
}

/// `-s` with `-b` above a pipe's 64 KiB: the pipes are resized.
#[test]
fn splice_with_a_large_buffer_relays_intact() {
    buffer_size_relays_intact("splice_big_buf", "-s -b1048576");
}

/// With `-s` in `opts`, splice(2) must have moved the data.
fn buffer_size_relays_intact(name: &str, opts: &str) {
    let dir = Dir::new(name);
    let len = 16 * BLOCK as u64;
    let (origin, up) = Origin::hash_sink(len, SEED_DOWN);
    let port = free_port();
    let proxy = Proxy::start(
        dir,
        &tcppm(opts, port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    let splice = opts.split_whitespace().any(|o| o == "-s");
    let trace = splice.then(|| Strace::attach(&proxy, "splice"));
    let mut client = connect(localhost(port));
    let mut down = client.try_clone().unwrap();
    let reader = thread::spawn(move || hash_to_eof(&mut down));
    send_pattern(&mut client, SEED_UP, len).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        reader.join().unwrap().unwrap(),
        pattern_digest(SEED_DOWN, len)
    );
    assert_eq!(recv_nonempty(&up, IO_TIMEOUT), pattern_digest(SEED_UP, len));
    if let Some(trace) = trace {
        trace.assert_moved(2 * len);
    }
}

/// How long the origin in the close tests waits before it answers.
const LATE: Duration = Duration::from_millis(300);

#[test]
fn half_close_reply_after_client_eof_still_arrives() {
    let dir = Dir::new("half_close");
    let reply: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (origin, got) = Origin::reply_after_eof(&reply, LATE);
    let port = free_port();
    let _proxy = Proxy::start(
        dir,
        &tcppm("", port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );

    let mut c = connect(localhost(port));
    c.write_all(b"the whole request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let back = read_until_closed(&mut c).expect("read the reply");
    assert_eq!(back.len(), reply.len(), "reply length");
    assert!(back == reply, "reply bytes differ");
    let seen = recv_where(&got, |g| !g.is_empty());
    assert_eq!(seen, b"the whole request");
}

#[test]
fn half_close_client_data_after_origin_eof_still_arrives() {
    let dir = Dir::new("half_close_rev");
    let (tx, got) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    // The origin talks first and closes its sending side at once.
    let origin = Origin::start("127.0.0.1:0", move |mut conn| {
        let _ = conn.write_all(b"banner");
        let _ = conn.shutdown(Shutdown::Write);
        let data = read_until_closed(&mut conn).unwrap_or_default();
        let _ = tx.lock().unwrap().send(data);
    });
    let port = free_port();
    let _proxy = Proxy::start(
        dir,
        &tcppm("", port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );

    let mut c = connect(localhost(port));
    let banner = read_until_closed(&mut c).expect("read banner then EOF");
    assert_eq!(banner, b"banner");
    c.write_all(b"sent after the origin's EOF")
        .expect("write after EOF");
    c.shutdown(Shutdown::Write).unwrap();
    let seen = recv_where(&got, |g| !g.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "sent after the origin's EOF"
    );
}

#[test]
fn dash_c_ends_the_session_at_the_first_close() {
    let dir = Dir::new("dash_c");
    let (origin, got) = Origin::reply_after_eof(b"too late", LATE);
    let port = free_port();
    let _proxy = Proxy::start(
        dir,
        &tcppm("-C", port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );

    let mut c = connect(localhost(port));
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let started = Instant::now();
    let back = read_until_closed(&mut c).expect("the session should end, not time out");
    assert!(
        back.is_empty(),
        "with -C the origin's late reply must not arrive, got {:?}",
        String::from_utf8_lossy(&back)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed after {:?}",
        started.elapsed()
    );
    // What the client sent before closing is still delivered.
    assert_eq!(recv_where(&got, |g| !g.is_empty()), b"request");
}

/// Waits for a report from a `reply_after_eof` origin that satisfies `pred`.
fn recv_where(rx: &std::sync::mpsc::Receiver<Vec<u8>>, pred: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(g) if pred(&g) => return g,
            Ok(_) => {}
            Err(e) => panic!("origin reported nothing matching: {e}"),
        }
    }
}

#[test]
fn maxconn_queues_extra_clients_until_a_slot_frees() {
    let dir = Dir::new("maxconn");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("maxconn 2\n{}", tcppm("", port, origin.port()));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut first = connect(localhost(port));
    echo_roundtrip(&mut first, b"first");
    let mut second = connect(localhost(port));
    echo_roundtrip(&mut second, b"second");

    // The third connects (the kernel queues it) but is not served.
    let mut third = connect(localhost(port));
    third.write_all(b"third").unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buf = [0u8; 5];
    match third.read(&mut buf) {
        Err(e) if is_timeout(&e) => {}
        other => panic!("a third client was served past maxconn 2: {other:?}"),
    }

    drop(first);
    third.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    third
        .read_exact(&mut buf)
        .expect("the third client is served once a slot frees");
    assert_eq!(&buf, b"third");
    echo_roundtrip(&mut second, b"second still works");
}

#[test]
fn idle_session_ends_after_connection_long_with_code_92() {
    let dir = Dir::new("idle");
    let log = dir.join("access.log");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "timeouts 1 5 30 60 180 2\nlog {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&log),
        tcppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"x");
    let idle_from = Instant::now();
    let rest = read_until_closed(&mut c).expect("the idle session should be closed, not time out");
    let idle = idle_from.elapsed();
    assert!(rest.is_empty(), "unexpected data {rest:?}");
    assert!(
        idle >= Duration::from_millis(1500) && idle < Duration::from_secs(6),
        "closed after {idle:?} idle, want about 2 s"
    );
    expect_log_line(&log, "TCPPM 00092 1 1");
}

#[test]
fn holds_2000_idle_sessions() {
    const WANT: usize = 2000;
    // This process holds both ends of every session (2 fds each) and the
    // proxy, which inherits the limit, holds 2 more per session.
    let limit = open_files_limit().unwrap_or(1024);
    let n = WANT.min((limit.saturating_sub(300) / 2) as usize);
    if n < WANT {
        eprintln!("open files limit is {limit}: testing {n} sessions instead of {WANT}");
    }
    assert!(
        n >= 100,
        "open files limit {limit} is too low for this test"
    );

    let dir = Dir::new("many");
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_port = origin.local_addr().unwrap().port();
    let port = free_port();
    let cfg = format!("maxconn {}\n{}", n + 100, tcppm("", port, origin_port));
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let idle_rss = proxy.rss_kb();

    // All sessions open, none has carried a byte yet.
    let mut clients = Vec::with_capacity(n);
    let mut accepted = Vec::with_capacity(n);
    for i in 0..n {
        clients.push(connect(localhost(port)));
        accepted.push(accept_within(&origin, IO_TIMEOUT).unwrap_or_else(|e| {
            panic!("session {i}: the proxy did not connect to the origin: {e}")
        }));
    }
    let idle_sessions_rss = proxy.rss_kb();

    // Each client names itself; the origin side learns which session it is.
    // (The readiness probe's session is among the accepted ones: it reads
    // as EOF and is skipped.)
    for (i, client) in clients.iter_mut().enumerate() {
        client
            .write_all(&(i as u16).to_be_bytes())
            .unwrap_or_else(|e| panic!("session {i}: write: {e}"));
    }
    let mut servers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut unread = accepted.into_iter();
    while servers.iter().any(Option::is_none) {
        let mut server = match unread.next() {
            Some(s) => s,
            None => accept_within(&origin, IO_TIMEOUT).expect("a session's origin connection"),
        };
        let mut id = [0u8; 2];
        if server.read_exact(&mut id).is_err() {
            continue;
        }
        let id = u16::from_be_bytes(id) as usize;
        assert!(
            id < n && servers[id].is_none(),
            "origin got a bad or repeated id {id}"
        );
        servers[id] = Some(server);
    }
    for (i, (client, server)) in clients.iter_mut().zip(servers.iter_mut()).enumerate() {
        let server = server.as_mut().unwrap();
        let b = [(i % 251) as u8];
        server.write_all(&b).unwrap();
        let mut got = [0u8; 1];
        client
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("session {i}: origin -> client: {e}"));
        assert_eq!(got, b, "session {i}: byte to the client");
    }
    let busy_rss = proxy.rss_kb();

    let per = busy_rss.saturating_sub(idle_rss) / n as u64;
    // Straight to stderr, past the test harness's capture.
    let _ = writeln!(
        std::io::stderr(),
        "RSS idle: {idle_rss} kB; with {n} sessions: {busy_rss} kB; per session: {per} kB \
         (before any data: {idle_sessions_rss} kB; {} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}

#[test]
fn proxy_protocol_header_sets_the_client_address_and_is_not_forwarded() {
    let dir = Dir::new("haproxy");
    let log = dir.join("access.log");
    let (origin, got) = Origin::reply_after_eof(b"hello world", Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %C:%c %R:%r\"\n{}",
        p(&log),
        tcppm("-H", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut c = connect(localhost(port));
    // One write: the header and the first data arrive together.
    c.write_all(b"PROXY TCP4 1.2.3.4 5.6.7.8 1111 2222\r\nhello")
        .unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut c).unwrap(), b"hello world");
    assert_eq!(
        String::from_utf8_lossy(&recv_where(&got, |g| !g.is_empty())),
        "hello"
    );
    expect_log_line(
        &log,
        &format!("TCPPM 1.2.3.4:1111 127.0.0.1:{}", origin.port()),
    );
}

#[test]
fn proxy_protocol_tcp6_header() {
    let dir = Dir::new("haproxy6");
    let log = dir.join("access.log");
    let (origin, got) = Origin::reply_after_eof(b"ok", Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %C %c\"\n{}",
        p(&log),
        tcppm("-H", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let mut c = connect(localhost(port));
    c.write_all(b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 443\r\ndata")
        .unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut c).unwrap(), b"ok");
    assert_eq!(recv_where(&got, |g| !g.is_empty()), b"data");
    expect_log_line(&log, "TCPPM 2001:db8::7 40000");
}

#[test]
fn refused_destination_closes_the_client_and_logs_13() {
    let dir = Dir::new("refused");
    let log = dir.join("access.log");
    let dead = free_port();
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&log),
        tcppm("", port, dead)
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = connect(localhost(port));
    let _ = c.write_all(b"anyone?");
    let got = read_until_closed(&mut c).expect("the client should be closed, not left waiting");
    assert!(got.is_empty(), "data from nowhere: {got:?}");
    expect_log_line(&log, "TCPPM 00013 0 0");
}

#[test]
fn destination_by_host_name() {
    let dir = Dir::new("by_name");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("tcppm -i127.0.0.1 {port} localhost {}\n", origin.port());
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"via localhost");
}

#[test]
fn listens_on_a_unix_socket() {
    let dir = Dir::new("unix_listen");
    let sock = dir.join("in.sock");
    let origin = Origin::echo();
    // The port is required by the syntax and unused for a unix listener.
    let cfg = format!("tcppm -iunix:{} 1 127.0.0.1 {}\n", p(&sock), origin.port());
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Unix(sock.clone())]);
    let mut c = connect_unix(&sock);
    echo_roundtrip(&mut c, b"over a unix socket");
}

#[test]
fn unix_socket_file_is_replaced_at_start_and_removed_at_exit() {
    let dir = Dir::new("unix_file");
    let sock = dir.join("in.sock");
    // A socket file left behind by an earlier run.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let origin = Origin::echo();
    let cfg = format!("tcppm -iunix:{} 1 127.0.0.1 {}\n", p(&sock), origin.port());
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Unix(sock.clone())]);
    echo_roundtrip(&mut connect_unix(&sock), b"over a reused path");
    proxy.signal("TERM");
    let status = proxy
        .wait_exit(Duration::from_secs(4))
        .expect("exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(
        !sock.exists(),
        "{} is still there after the exit",
        sock.display()
    );
}

#[test]
fn connects_to_a_unix_socket_destination() {
    let dir = Dir::new("unix_dst");
    let sock = dir.join("origin.sock");
    let _origin = UnixEcho::start(&sock);
    let port = free_port();
    let cfg = format!("tcppm -i127.0.0.1 {port} unix:{} 1\n", p(&sock));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"to a unix socket");
}

#[test]
fn ipv6_loopback_both_sides() {
    require_ipv6();
    let dir = Dir::new("ipv6");
    let origin = Origin::echo_on("[::1]:0");
    let port = free_port_v6();
    let addr: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    // 3proxy itself needs -6 or -64 to use an IPv6 literal destination.
    let cfg = format!("tcppm -i::1 {port} ::1 {}\n", origin.port());
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(addr)]);
    let mut c = connect(addr);
    echo_roundtrip(&mut c, b"over ::1");
    assert!(origin.peers().iter().all(|a| a.is_ipv6()));
}

#[test]
fn dash_e_sets_the_source_address() {
    let (_proxy, origin, port) = echo_tcppm("dash_e", "-e127.0.0.5");
    echo_roundtrip(&mut connect(localhost(port)), b"from 127.0.0.5");
    let peers = origin.peers();
    assert!(!peers.is_empty());
    for peer in peers {
        assert_eq!(peer.ip().to_string(), "127.0.0.5", "origin saw {peer}");
    }
}

#[test]
fn client_and_origin_sockets_have_tcp_nodelay() {
    // On by default (the client's socket inherits it from the listening
    // socket); a relay must not hold small writes back for Nagle.
    let (proxy, origin, port) = echo_tcppm("nodelay", "");
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"nodelay");
    let me = c.local_addr().unwrap().port();
    let cli = proxy.tcp_socket(port, me);
    assert!(
        socket2::SockRef::from(&cli).nodelay().unwrap(),
        "client side"
    );
    // The origin may speak first (SMTP, SSH): a new client's socket keeps
    // quick ACKs (as every service's does), so its bytes are acknowledged
    // at once even when no answer is coming. (Checked before any data:
    // an exchange of data makes the kernel delay ACKs by itself.)
    let fresh = connect(localhost(port));
    let me = fresh.local_addr().unwrap().port();
    assert!(
        wait_for(
            || proxy.try_tcp_socket(port, me).is_some(),
            Duration::from_secs(5)
        ),
        "the proxy did not accept the second client"
    );
    assert!(
        socket2::SockRef::from(&proxy.tcp_socket(port, me))
            .quickack()
            .unwrap(),
        "quick ACKs off on a port mapping's new client socket"
    );
    let peers = origin.peers();
    // The readiness probe's session dialed the origin too, but closed.
    let srv = peers
        .iter()
        .find_map(|p| proxy.try_tcp_socket(p.port(), origin.port()))
        .expect("the proxy's connection to the origin");
    assert!(
        socket2::SockRef::from(&srv).nodelay().unwrap(),
        "origin side"
    );
}

#[test]
fn idle_client_threads_exit_after_15_s() {
    // A client thread that has finished its client parks for the next one;
    // one idle for 15 s exits, so a burst of clients does not leave its
    // threads behind.
    let (proxy, _origin, port) = echo_tcppm("idle_threads", "");
    // Client threads: the threads named like the acceptor, but it.
    let name = format!("tcppm:{port}");
    let client_threads = || proxy.threads_named(&name).saturating_sub(1);
    // One client after another: threads that served one serve the next
    // (a few more when a client comes before the last one's thread has
    // closed up, but not one per client).
    for i in 0..30 {
        echo_roundtrip(&mut connect(localhost(port)), format!("one {i}").as_bytes());
    }
    let after_sequence = client_threads();
    assert!(
        after_sequence < 10,
        "{after_sequence} client threads after 30 clients in turn"
    );
    let clients: Vec<TcpStream> = (0..20)
        .map(|i| {
            let mut c = connect(localhost(port));
            echo_roundtrip(&mut c, format!("client {i}").as_bytes());
            c
        })
        .collect();
    let busy = client_threads();
    assert!(busy >= 20, "{busy} client threads with 20 clients");
    drop(clients);
    assert!(
        wait_for(|| client_threads() == 0, Duration::from_secs(30)),
        "{} client threads left after the clients left",
        client_threads()
    );
    // The service still serves.
    echo_roundtrip(&mut connect(localhost(port)), b"after");
}

#[test]
fn a_burst_leaves_at_most_32_idle_threads_after_a_quarter_second() {
    // 80 tunnels at once: each needs a thread until it has been quiet for
    // the linger, then parks; the threads go idle, and all but 32 of them
    // exit once idle for 250 ms, long before the 15 s of the 32 kept.
    let (proxy, _origin, port) = echo_tcppm("burst_threads", "");
    let name = format!("tcppm:{port}");
    let client_threads = || proxy.threads_named(&name).saturating_sub(1);
    let mut clients: Vec<TcpStream> = (0..80).map(|_| connect(localhost(port))).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        echo_roundtrip(c, format!("client {i}").as_bytes());
    }
    let busy = client_threads();
    assert!(busy > 32, "{busy} client threads with 80 active tunnels");
    let mut left = busy;
    assert!(
        wait_for(
            || {
                left = client_threads();
                left <= 32
            },
            Duration::from_secs(8)
        ),
        "{left} client threads 8 s after 80 tunnels went quiet"
    );
    // Every tunnel still carries its bytes, in order, woken from the lot.
    for (i, c) in clients.iter_mut().enumerate() {
        echo_roundtrip(c, format!("again {i}").as_bytes());
    }
}

/// The end of a TLS session relayed as bytes (tlspr, or tcppm in front of
/// a TLS server): the server sends its close_notify and closes while the
/// client's close_notify, sent in reply, is already in its socket unread,
/// so its kernel resets the connection instead of closing it. Everything
/// the server sent was relayed, and all the client sent reached the
/// server's socket: the session ends with 0, not with a server error,
/// whichever came first (here the server always waits for the reply, the
/// case that raced). A reset while reading ends that side, as 3proxy's
/// sockmap takes it.
#[test]
fn a_server_that_resets_after_its_last_bytes_ends_the_session_with_0() {
    for opts in ["", "-s"] {
        let dir = Dir::new("reset_end");
        let log = dir.join("access.log");
        let origin = Origin::start("127.0.0.1:0", |mut conn| {
            // Its close_notify, then the client's reply comes in, unread.
            let _ = conn.write_all(b"server close_notify");
            let mut b = [0u8; 1];
            set_timeouts(&conn, IO_TIMEOUT);
            let _ = conn.peek(&mut b);
            // Closed with unread bytes: a reset, not a FIN.
        });
        let port = free_port();
        let cfg = format!(
            "log {}\nlogformat \"L%N %E %O %I\"\n{}",
            p(&log),
            tcppm(opts, port, origin.port())
        );
        let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
        let mut c = connect(localhost(port));
        set_timeouts(&c, IO_TIMEOUT);
        let mut got = [0u8; 19];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"server close_notify");
        c.write_all(b"client close_notify").unwrap();
        // The server's end reaches the client as an end, not a reset.
        let rest = read_until_closed(&mut c).expect("the server's end passed on");
        assert!(rest.is_empty(), "{rest:?}");
        drop(c);
        expect_log_line(&log, "TCPPM 00000 19 19");
    }
}
