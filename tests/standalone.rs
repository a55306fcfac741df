//! The standalone programs: the binary run as `3proxy_tcppm`, `3proxy_udppm`
//! ... serves one service from its command line, with no cfg, as 3proxy's
//! standalone binaries do.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

fn link(dir: &Dir, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::os::unix::fs::symlink(BIN, &path).expect("symlink the binary");
    path
}

#[test]
fn tcppm_runs_from_its_command_line() {
    let dir = Dir::new("standalone_tcppm");
    let origin = Origin::echo();
    let port = free_port();
    let prog = link(&dir, "3proxy_tcppm");
    let mut child = Command::new(&prog)
        .args([
            "-i127.0.0.1",
            &port.to_string(),
            "127.0.0.1",
            &origin.port().to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let up = wait_for(
        || std::net::TcpStream::connect(localhost(port)).is_ok(),
        START_TIMEOUT,
    );
    if !up {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "3proxy_tcppm did not listen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut s = connect(localhost(port));
    s.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    drop(s);
    // Without -l nothing is logged, on stdout or anywhere.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "exit status {}", out.status);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "no log without -l"
    );
}

#[test]
fn udppm_runs_from_its_command_line() {
    let dir = Dir::new("standalone_udppm");
    let echo = UdpEcho::start();
    let port = free_udp_port();
    let prog = link(&dir, "3proxy_udppm");
    let mut child = Command::new(&prog)
        .args([
            "-i127.0.0.1",
            &port.to_string(),
            "127.0.0.1",
            &echo.port().to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = udp_client();
    let ok = wait_for(
        || {
            let _ = c.send_to(b"hi", localhost(port));
            let mut buf = [0u8; 16];
            c.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            matches!(c.recv_from(&mut buf), Ok((2, _)))
        },
        START_TIMEOUT,
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok, "no echo through 3proxy_udppm");
}

#[test]
fn a_bad_option_is_a_usage_error() {
    let dir = Dir::new("standalone_bad");
    let prog = link(&dir, "3proxy_tcppm");
    let out = Command::new(&prog)
        .args(["-Zbad", "1", "127.0.0.1", "2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3proxy_tcppm") && err.contains("-Zbad"),
        "{err}"
    );
}
