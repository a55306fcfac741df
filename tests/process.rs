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
