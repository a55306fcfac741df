//! The process: signals, SIGPIPE, `--help` and `--version`.

use std::io::Read;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::util::*;

fn tcppm(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

/// Starts a tcppm to an echo origin, opens an idle session, sends `signal`
/// and expects a prompt exit with status 0.
fn stops_on(signal: &str) {
    let dir = Dir::new(&format!("sig{signal}"));
    let origin = Origin::echo();
    let port = free_port();
    let mut proxy = Proxy::start(
        dir,
        &tcppm(port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    let mut idle = connect(localhost(port));
    echo_roundtrip(&mut idle, b"open");

    let sent = Instant::now();
    proxy.signal(signal);
    let status = proxy
        .wait_exit(Duration::from_secs(4))
        .unwrap_or_else(|| panic!("3proxy still running 4 s after SIG{signal}"));
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIG{signal}: {status}"
    );
    eprintln!("SIG{signal}: exited after {:?}", sent.elapsed());
    assert!(
        std::net::TcpStream::connect(localhost(port)).is_err(),
        "port {port} still accepts after the exit"
    );
}

#[test]
fn sigterm_exits_zero() {
    stops_on("TERM");
}

#[test]
fn sigint_exits_zero() {
    stops_on("INT");
}

#[test]
fn a_client_that_vanishes_mid_stream_does_not_kill_the_proxy() {
    let dir = Dir::new("sigpipe");
    let (tx, done) = mpsc::channel();
    let tx = Mutex::new(tx);
    // An origin that streams until its peer goes away.
    let origin = Origin::start("127.0.0.1:0", move |mut conn| {
        let _ = send_pattern(&mut conn, 7, 1 << 30);
        let _ = tx.lock().unwrap().send(());
    });
    let port = free_port();
    let mut proxy = Proxy::start(
        dir,
        &tcppm(port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );

    let mut c = connect(localhost(port));
    let mut some = [0u8; 1000];
    c.read_exact(&mut some).expect("the stream starts");
    // Closing with unread data resets the connection: the proxy's next
    // writes to it fail with ECONNRESET, then EPIPE.
    drop(c);
    // The readiness probe's session and ours both end that way.
    for _ in 0..2 {
        done.recv_timeout(IO_TIMEOUT)
            .expect("the proxy should end a session whose client is gone");
    }
    assert!(
        proxy.is_running(),
        "3proxy died when a client went away mid-stream"
    );
    let mut again = connect(localhost(port));
    again
        .read_exact(&mut some)
        .expect("a new session after the reset");
}

#[test]
fn help_prints_usage_and_exits_zero() {
    let out = run(&["--help"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "--help; stderr:\n{}",
        out.stderr
    );
    assert!(
        out.stdout.to_lowercase().contains("usage"),
        "--help should print usage on stdout, got:\n{}",
        out.stdout
    );
}

#[test]
fn version_names_the_program_and_a_version() {
    let out = run(&["--version"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "--version; stderr:\n{}",
        out.stderr
    );
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("3proxy"))
        .unwrap_or_else(|| panic!("no line naming 3proxy in:\n{}", out.stdout));
    let has_version = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .any(|w| {
            w.split('.')
                .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                .count()
                >= 2
        });
    assert!(has_version, "no version number like 1.2 in {line:?}");
}

/// With no cfg file named and none at the default path, 3proxy reads the
/// cfg from standard input and serves it; SIGUSR1 cannot read it again,
/// so the running cfg is kept (and says so) instead of stopping.
#[test]
fn a_cfg_from_standard_input_serves_and_survives_sigusr1() {
    for default in ["/usr/local/etc/3proxy/3proxy.cfg", "/etc/3proxy/3proxy.cfg"] {
        assert!(
            !std::path::Path::new(default).exists(),
            "this test needs {default} not to exist"
        );
    }
    let dir = Dir::new("stdin_cfg");
    let origin = Origin::echo();
    let port = free_port();
    let mut proxy = Proxy::start_stdin(
        dir,
        &tcppm(port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    echo_roundtrip(&mut connect(localhost(port)), b"from stdin");

    proxy.signal("USR1");
    assert!(
        wait_for(
            || proxy.stderr().contains("cannot be read again; keeping it"),
            START_TIMEOUT
        ),
        "no word that the cfg is kept:\n{}",
        proxy.stderr()
    );
    assert!(proxy.is_running(), "SIGUSR1 stopped the server");
    echo_roundtrip(&mut connect(localhost(port)), b"still serving");
}

/// The stack of each thread of the proxy serving a client on `port`,
/// in bytes: the size of the mapping that holds the thread's stack
/// pointer, for every thread named after the service (the acceptor too).
fn service_thread_stacks(pid: u32, port: u16) -> Vec<u64> {
    let maps: Vec<(u64, u64)> = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("read maps")
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    let name = format!("tcppm:{port}");
    let mut sizes = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        // "NR ARG1 .. ARG6 SP PC" while blocked in a system call.
        let sc = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
        let f: Vec<&str> = sc.split_whitespace().collect();
        let Some(sp) = f
            .get(7)
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        else {
            continue;
        };
        if let Some((a, b)) = maps.iter().find(|(a, b)| *a <= sp && sp < *b) {
            sizes.push(b - a);
        }
    }
    sizes
}

/// `stacksize` changes the stack of the threads that serve clients of the
/// services after it: with +1 MiB, a client thread's stack is 1 MiB
/// larger than that of a service before the line.
#[test]
fn stacksize_changes_client_thread_stacks() {
    let dir = Dir::new("stacksize");
    let origin = Origin::echo();
    let (plain, big) = (free_port(), free_port());
    let cfg = format!(
        "{}stacksize 1048576\n{}",
        tcppm(plain, origin.port()),
        tcppm(big, origin.port())
    );
    let proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(plain)), Listen::Tcp(localhost(big))],
    );
    // A live session on each: its client thread waits in the relay.
    let mut a = connect(localhost(plain));
    echo_roundtrip(&mut a, b"a");
    let mut b = connect(localhost(big));
    echo_roundtrip(&mut b, b"b");
    // The smallest stack named after a service is a client thread's (the
    // acceptor has the default 2 MiB).
    let smallest = |port| {
        let mut got = Vec::new();
        wait_for(
            || {
                got = service_thread_stacks(proxy.pid(), port);
                got.len() >= 2
            },
            START_TIMEOUT,
        );
        assert!(
            got.len() >= 2,
            "want the acceptor and a client thread for {port}: {got:?}"
        );
        *got.iter().min().unwrap()
    };
    let (small, large) = (smallest(plain), smallest(big));
    eprintln!("client thread stacks: {small} and {large} bytes");
    assert!(small < 256 << 10, "default client stack: {small} bytes");
    let grown = large.saturating_sub(small);
    assert!(
        ((1 << 20) - (16 << 10)..=(1 << 20) + (16 << 10)).contains(&grown),
        "stacksize 1048576 grew the stack by {grown} bytes ({small} -> {large})"
    );
    echo_roundtrip(&mut a, b"a");
    echo_roundtrip(&mut b, b"b");
}
