//! SIGUSR1 reloads the cfg: a changed cfg takes effect for new clients,
//! a listener whose address and options did not change stays open (no
//! refused client during the switch), a session in progress goes on
//! undisturbed, a removed service stops listening, and a broken cfg leaves
//! the running one in place with the error logged.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::util::*;

/// An origin that answers every connection with `tag` and closes.
fn tagged(tag: &'static [u8]) -> Origin {
    Origin::start("127.0.0.1:0", move |mut conn| {
        let _ = conn.write_all(tag);
        let _ = conn.shutdown(Shutdown::Both);
    })
}

/// Connect through the proxy and read what the origin says.
fn ask(port: u16) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(localhost(port))?;
    set_timeouts(&s, IO_TIMEOUT);
    let mut got = Vec::new();
    s.read_to_end(&mut got)?;
    Ok(got)
}

fn cfg(dir: &Dir, body: &str) -> String {
    format!(
        "log {}\nlogformat \"L%N %p %E %O %I\"\n{body}",
        p(&dir.join("access.log"))
    )
}

#[test]
fn reload_switches_settings_and_keeps_the_listener() {
    let dir = Dir::new("reload_switch");
    let (one, two) = (tagged(b"one"), tagged(b"two"));
    let (p1, p2) = (free_port(), free_port());
    let text = cfg(
        &dir,
        &format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n", one.port()),
    );
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    assert_eq!(ask(p1).unwrap(), b"one");

    // A long session through the unchanged listener, started before.
    let (sink, digests) = Origin::hash_sink(0, 0);
    let p3 = free_port();
    let keep = format!("tcppm -i127.0.0.1 {p3} 127.0.0.1 {}\n", sink.port());
    let text = cfg(
        &proxy.dir,
        &format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n{keep}", one.port()),
    );
    proxy.dir.write("3proxy.cfg", &text);
    proxy.signal("USR1");
    assert!(
        wait_for(|| TcpStream::connect(localhost(p3)).is_ok(), START_TIMEOUT),
        "p3 never came up"
    );
    let mut long = connect(localhost(p3));
    let seed = 7;
    let total: u64 = 8 << 20;
    let half = total / 2;
    send_pattern(&mut long, seed, half).unwrap();

    // Hammer p1 while the cfg switches it to another origin: no client
    // may be refused or cut.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let hammer = {
        let (stop, failures, served) = (stop.clone(), failures.clone(), served.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match ask(p1) {
                    Ok(b) if b == b"one" || b == b"two" => served.fetch_add(1, Ordering::SeqCst),
                    _ => failures.fetch_add(1, Ordering::SeqCst),
                };
            }
        })
    };
    let text = cfg(
        &proxy.dir,
        &format!(
            "tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n{keep}tcppm -i127.0.0.1 {p2} 127.0.0.1 {}\n",
            two.port(),
            one.port()
        ),
    );
    proxy.dir.write("3proxy.cfg", &text);
    proxy.signal("USR1");
    assert!(
        wait_for(
            || ask(p1).map(|b| b == b"two").unwrap_or(false),
            START_TIMEOUT
        ),
        "p1 never switched to the new origin"
    );
    assert_eq!(ask(p2).unwrap(), b"one", "the added service serves");
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    hammer.join().unwrap();
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "clients refused or cut during the reload"
    );
    assert!(served.load(Ordering::SeqCst) > 0);

    // The session started before the reload finishes intact.
    send_pattern(&mut long, seed + 1, total - half).unwrap();
    long.shutdown(Shutdown::Write).unwrap();
    let got = recv_nonempty(&digests, IO_TIMEOUT);
    assert_eq!(got.bytes, total, "bytes of the long session");
}

#[test]
fn removed_service_stops_listening() {
    let dir = Dir::new("reload_remove");
    let one = tagged(b"one");
    let (p1, p2) = (free_port(), free_port());
    let both = cfg(
        &dir,
        &format!(
            "tcppm -i127.0.0.1 {p1} 127.0.0.1 {o}\ntcppm -i127.0.0.1 {p2} 127.0.0.1 {o}\n",
            o = one.port()
        ),
    );
    let proxy = Proxy::start(
        dir,
        &both,
        &[Listen::Tcp(localhost(p1)), Listen::Tcp(localhost(p2))],
    );
    let only = cfg(
        &proxy.dir,
        &format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n", one.port()),
    );
    proxy.dir.write("3proxy.cfg", &only);
    proxy.signal("USR1");
    assert!(
        wait_for(|| TcpStream::connect(localhost(p2)).is_err(), START_TIMEOUT),
        "the removed service still accepts"
    );
    assert_eq!(ask(p1).unwrap(), b"one");
}

#[test]
fn the_first_client_after_a_reload_gets_the_new_settings() {
    // The acceptor waits in accept() across the reload: the client it
    // accepts next must be served by the new cfg, not by the settings of
    // when the wait began.
    let dir = Dir::new("reload_first_client");
    let (one, two) = (tagged(b"one"), tagged(b"two"));
    let (p1, marker) = (free_port(), free_port());
    let text = cfg(
        &dir,
        &format!(
            "tcppm -i127.0.0.1 {p1} 127.0.0.1 {}
",
            one.port()
        ),
    );
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    let text = cfg(
        &proxy.dir,
        &format!(
            "tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\ntcppm -i127.0.0.1 {marker} 127.0.0.1 {}\n",
            two.port(),
            one.port()
        ),
    );
    proxy.dir.write("3proxy.cfg", &text);
    proxy.signal("USR1");
    // The marker service starts after p1's settings were swapped.
    assert!(
        wait_for(
            || TcpStream::connect(localhost(marker)).is_ok(),
            START_TIMEOUT
        ),
        "the reload never started the marker service"
    );
    assert_eq!(ask(p1).unwrap(), b"two", "served by the old cfg");
}

#[test]
fn broken_cfg_on_reload_keeps_the_running_one() {
    let dir = Dir::new("reload_broken");
    let one = tagged(b"one");
    let p1 = free_port();
    let good = cfg(
        &dir,
        &format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n", one.port()),
    );
    let mut proxy = Proxy::start(dir, &good, &[Listen::Tcp(localhost(p1))]);
    let bad = format!("{good}maxconn nonsense\n");
    proxy.dir.write("3proxy.cfg", &bad);
    proxy.signal("USR1");
    let cfg_path = proxy.dir.cfg_path();
    let at = format!("{}:4: maxconn:", cfg_path.display());
    assert!(
        wait_for(|| proxy.stderr().contains(&at), START_TIMEOUT),
        "no error naming {at} in stderr:\n{}",
        proxy.stderr()
    );
    assert!(
        proxy.is_running(),
        "a bad cfg on reload must not stop the server"
    );
    assert_eq!(ask(p1).unwrap(), b"one");
}

#[test]
fn monitor_reloads_when_the_file_changes() {
    let dir = Dir::new("reload_monitor");
    let (one, two) = (tagged(b"one"), tagged(b"two"));
    let p1 = free_port();
    let cfg_path = dir.cfg_path();
    let body = |o: &Origin| {
        format!(
            "monitor {}\ntcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n",
            p(&cfg_path),
            o.port()
        )
    };
    let text = cfg(&dir, &body(&one));
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    assert_eq!(ask(p1).unwrap(), b"one");
    // No signal: the edit alone must be picked up.
    let text = cfg(&proxy.dir, &body(&two));
    proxy.dir.write("3proxy.cfg", &text);
    assert!(
        wait_for(
            || ask(p1).map(|b| b == b"two").unwrap_or(false),
            Duration::from_secs(10)
        ),
        "the monitored cfg was not reloaded; stderr:\n{}",
        proxy.stderr()
    );
}

#[test]
fn config_names_the_file_a_reload_reads() {
    let dir = Dir::new("reload_config");
    let (one, two) = (tagged(b"one"), tagged(b"two"));
    let p1 = free_port();
    let other = dir.join("other.cfg");
    let text = cfg(
        &dir,
        &format!(
            "config {}\ntcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n",
            p(&other),
            one.port()
        ),
    );
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    let next = cfg(
        &proxy.dir,
        &format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n", two.port()),
    );
    proxy.dir.write("other.cfg", &next);
    proxy.signal("USR1");
    assert!(
        wait_for(
            || ask(p1).map(|b| b == b"two").unwrap_or(false),
            START_TIMEOUT
        ),
        "reload did not read the file named by 'config'; stderr:\n{}",
        proxy.stderr()
    );
}

/// A session admitted by the old ACL, after a reload whose ACL denies it:
/// with `force` (the default) it is cut when data next moves, and logged
/// with the refusal's code; with `noforce` it goes on.
fn recheck_case(name: &str, noforce: bool) -> (bool, Proxy) {
    let dir = Dir::new(name);
    let origin = Origin::echo();
    let p1 = free_port();
    let svc = format!("tcppm -i127.0.0.1 {p1} 127.0.0.1 {}\n", origin.port());
    let text = cfg(&dir, &format!("allow *\n{svc}"));
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    let mut s = connect(localhost(p1));
    echo_roundtrip(&mut s, b"before");
    let deny = cfg(
        &proxy.dir,
        &format!("{}deny *\n{svc}", if noforce { "noforce\n" } else { "" }),
    );
    proxy.dir.write("3proxy.cfg", &deny);
    proxy.signal("USR1");
    // The reload has happened when a new client is refused (closed
    // without an echo).
    let refused = || {
        let Ok(mut n) = TcpStream::connect(localhost(p1)) else {
            return true;
        };
        set_timeouts(&n, IO_TIMEOUT);
        let _ = n.write_all(b"ping");
        let mut b = [0u8; 4];
        n.read_exact(&mut b).is_err()
    };
    assert!(
        wait_for(refused, START_TIMEOUT),
        "the new ACL never took effect"
    );
    let _ = s.write_all(b"after");
    let mut buf = [0u8; 5];
    let alive = matches!(s.read_exact(&mut buf), Ok(())) && &buf == b"after";
    (alive, proxy)
}

#[test]
fn force_cuts_sessions_the_new_acl_denies() {
    let (alive, proxy) = recheck_case("reload_force", false);
    assert!(!alive, "the denied session went on");
    read_log_line(
        &proxy.dir.join("access.log"),
        "TCPPM with code 1 and data",
        |l| l.starts_with("TCPPM ") && l.contains(" 00001 ") && !l.ends_with(" 0 0"),
    );
}

#[test]
fn noforce_lets_sessions_finish() {
    let (alive, _proxy) = recheck_case("reload_noforce", true);
    assert!(alive, "noforce: the session should go on");
}

#[test]
fn force_cuts_socks_sessions_too() {
    let dir = Dir::new("reload_force_socks");
    let origin = Origin::echo();
    let p1 = free_port();
    let svc = format!("socks -i127.0.0.1 -p{p1}\n");
    let text = cfg(&dir, &format!("auth iponly\nallow *\n{svc}"));
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(p1))]);
    let mut s = socks5_to(p1, origin.port());
    echo_roundtrip(&mut s, b"before");
    proxy.dir.write(
        "3proxy.cfg",
        cfg(&proxy.dir, &format!("auth iponly\ndeny *\n{svc}")),
    );
    proxy.signal("USR1");
    let refused = || {
        let Ok(mut n) = TcpStream::connect(localhost(p1)) else {
            return true;
        };
        set_timeouts(&n, IO_TIMEOUT);
        let _ = n.write_all(&[5, 1, 0]);
        let _ = n.read_exact(&mut [0u8; 2]);
        let _ = n.write_all(&socks5_request(1, localhost(origin.port())));
        let mut r = [0u8; 10];
        n.read_exact(&mut r).is_err() || r[1] != 0
    };
    assert!(
        wait_for(refused, START_TIMEOUT),
        "the new ACL never took effect"
    );
    let _ = s.write_all(b"after");
    let mut buf = [0u8; 5];
    let alive = matches!(s.read_exact(&mut buf), Ok(())) && &buf == b"after";
    assert!(!alive, "the denied SOCKS session went on");
}

/// A client socket bound to `from` (a 127.0.0.0/8 address), connected.
fn connect_from(from: &str, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let src: std::net::IpAddr = from.parse().unwrap();
    s.bind(&std::net::SocketAddr::new(src, 0).into())?;
    s.connect_timeout(&to.into(), IO_TIMEOUT)?;
    let s: TcpStream = s.into();
    set_timeouts(&s, IO_TIMEOUT);
    Ok(s)
}

/// Whether a client from `from` gets any of the origin's bytes.
fn served_from(from: &str, port: u16) -> bool {
    let Ok(mut s) = connect_from(from, localhost(port)) else {
        return false;
    };
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(1))
}

/// A long download through a listener the reload keeps goes on undisturbed
/// (every byte, in order) while the reload's new ACL refuses new clients
/// it denies.
#[test]
fn a_download_goes_on_while_a_reload_changes_the_acl() {
    use sha2::{Digest, Sha256};
    let dir = Dir::new("reload_acl_download");
    let (seed, total) = (11, 32u64 << 20);
    let (origin, _reports) = Origin::hash_sink(total, seed);
    let port = free_port();
    let svc = format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n", origin.port());
    let text = cfg(&dir, &format!("allow *\n{svc}"));
    let proxy = Proxy::start(dir, &text, &[Listen::Tcp(localhost(port))]);
    assert!(
        served_from("127.0.0.2", port),
        "the old ACL allows 127.0.0.2"
    );

    // The download starts, then stalls on the client's side (the proxy's
    // buffers and the socket's fill up) while the cfg changes.
    let mut down = connect(localhost(port));
    let mut hasher = Sha256::new();
    let mut got = 0u64;
    let mut buf = vec![0u8; BLOCK];
    while got < 1 << 20 {
        let n = down.read(&mut buf).expect("read the download");
        assert!(n > 0, "the download ended after {got} bytes");
        hasher.update(&buf[..n]);
        got += n as u64;
    }
    proxy.dir.write(
        "3proxy.cfg",
        cfg(&proxy.dir, &format!("deny * 127.0.0.2\nallow *\n{svc}")),
    );
    proxy.signal("USR1");
    assert!(
        wait_for(|| !served_from("127.0.0.2", port), START_TIMEOUT),
        "the new ACL never refused 127.0.0.2; stderr:\n{}",
        proxy.stderr()
    );
    assert!(
        served_from("127.0.0.1", port),
        "the new ACL still allows 127.0.0.1"
    );

    // The rest of the download, intact.
    loop {
        let n = down.read(&mut buf).expect("read the rest of the download");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        got += n as u64;
    }
    let digest = Digested {
        bytes: got,
        sha256: hasher.finalize().into(),
    };
    assert_eq!(digest, pattern_digest(seed, total), "the download");
}
