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
    let oport = origin.port().to_string();
    let args = ["-i127.0.0.1", &port.to_string(), "127.0.0.1", &oport];
    let child = serve_with(&prog, &args, port, Stdio::piped());
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

/// Runs `prog ARGS` and waits until it accepts on `port`; kills it and
/// panics with its stderr if it does not.
fn serve(prog: &std::path::Path, args: &[&str], port: u16) -> std::process::Child {
    serve_with(prog, args, port, Stdio::null())
}

/// [`serve`] with its standard output going to `stdout` (piped, for a
/// test that reads what it printed).
fn serve_with(
    prog: &std::path::Path,
    args: &[&str],
    port: u16,
    stdout: Stdio,
) -> std::process::Child {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
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
            "{} did not listen: {}",
            prog.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child
}

/// Kills a child and reaps it when dropped.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn proxy_runs_from_its_command_line() {
    let dir = Dir::new("standalone_proxy");
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        let mut buf = [0u8; 4096];
        let _ = conn.read(&mut buf);
        let _ = conn.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nstandalone",
        );
        let _ = conn.shutdown(std::net::Shutdown::Both);
    });
    let port = free_port();
    let prog = link(&dir, "3proxy_proxy");
    let _child = Reap(serve(&prog, &["-i127.0.0.1", &format!("-p{port}")], port));
    let mut s = connect(localhost(port));
    write!(
        s,
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        origin.port()
    )
    .unwrap();
    let reply = String::from_utf8_lossy(&read_until_closed(&mut s).unwrap()).into_owned();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("\r\n\r\nstandalone"), "{reply}");
}

#[test]
fn socks_runs_from_its_command_line() {
    let dir = Dir::new("standalone_socks");
    let origin = Origin::echo();
    let port = free_port();
    let prog = link(&dir, "3proxy_socks");
    let _child = Reap(serve(&prog, &["-i127.0.0.1", &format!("-p{port}")], port));
    // SOCKS5, no authentication, CONNECT 127.0.0.1:origin.
    let mut s = socks5_to(port, origin.port());
    echo_roundtrip(&mut s, b"through 3proxy_socks");
}

#[test]
fn pop3p_runs_from_its_command_line() {
    let dir = Dir::new("standalone_pop3p");
    // A POP3 server that greets, then echoes the first line it gets.
    let origin = Origin::start("127.0.0.1:0", |mut s| {
        s.write_all(b"+OK ready\r\n").unwrap();
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).is_ok_and(|n| n == 1) {
            line.push(b[0]);
            if b[0] == b'\n' {
                break;
            }
        }
        let _ = s.write_all(b"+OK got ");
        let _ = s.write_all(&line);
    });
    let port = free_port();
    let prog = link(&dir, "3proxy_pop3p");
    let _child = Reap(serve(&prog, &["-i127.0.0.1", &format!("-p{port}")], port));
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let o = origin.port();
    s.write_all(format!("USER a:b:bob@127.0.0.1:{o}\r\n").as_bytes())
        .unwrap();
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    // No user is asked for: `a:b:` is part of the name, not credentials.
    assert_eq!(got, "+OK Proxy\r\n+OK got USER a:b:bob\r\n");
}

#[test]
fn ftppr_runs_from_its_command_line() {
    let dir = Dir::new("standalone_ftppr");
    // An FTP server that takes any login and echoes the user name.
    let origin = Origin::start("127.0.0.1:0", |mut s| {
        s.write_all(b"220 ready\r\n").unwrap();
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let (mut line, mut user) = (String::new(), String::new());
        while std::io::BufRead::read_line(&mut r, &mut line).is_ok_and(|n| n > 0) {
            let reply = if line.starts_with("USER") {
                user = line.trim_end().to_string();
                "331 pass\r\n".to_string()
            } else {
                format!("230 in as {user}\r\n")
            };
            line.clear();
            if s.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    });
    let port = free_port();
    let prog = link(&dir, "3proxy_ftppr");
    let _child = Reap(serve(&prog, &["-i127.0.0.1", &format!("-p{port}")], port));
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let o = origin.port();
    s.write_all(format!("USER a:b:bob@127.0.0.1:{o}\r\nPASS x\r\n").as_bytes())
        .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    // Until the answer to PASS has come whole (or the proxy closes).
    while !(got.windows(4).any(|w| w == b"\n230") && got.ends_with(b"\n")) {
        match s.read(&mut b) {
            Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
            _ => break,
        }
    }
    // No user is asked for: `a:b:` is part of the name, not credentials.
    assert_eq!(
        String::from_utf8_lossy(&got),
        "220 Ready\r\n331 ok\r\n230 in as USER a:b:bob\r\n"
    );
    drop(origin);
}

#[test]
fn smtpp_runs_from_its_command_line() {
    let dir = Dir::new("standalone_smtpp");
    // An SMTP server offering AUTH LOGIN that answers the login with the
    // user name it got.
    let origin = Origin::start("127.0.0.1:0", |mut s| {
        s.write_all(b"220 ready\r\n").unwrap();
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut lines = Vec::new();
        for reply in ["250 AUTH LOGIN\r\n", "334 a\r\n", "334 b\r\n", ""] {
            let mut line = String::new();
            if !std::io::BufRead::read_line(&mut r, &mut line).is_ok_and(|n| n > 0) {
                return;
            }
            lines.push(line);
            let _ = s.write_all(reply.as_bytes());
        }
        let _ = s.write_all(format!("235 got {}", lines[2]).as_bytes());
    });
    let port = free_port();
    let o = origin.port();
    let prog = link(&dir, "3proxy_smtpp");
    let args = [
        "-i127.0.0.1",
        &format!("-p{port}"),
        &format!("-h127.0.0.1:{o}"),
    ];
    let _child = Reap(serve(&prog, &args, port));
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    // AUTH LOGIN as a:b:bob, no host: -h's. No user is asked for, so
    // `a:b:` is part of the name.
    s.write_all(b"AUTH LOGIN\r\nYTpiOmJvYg==\r\ncHc=\r\n")
        .unwrap();
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    assert_eq!(
        got,
        "220 Proxy\r\n334 VXNlcm5hbWU6\r\n334 UGFzc3dvcmQ6\r\n235 got YTpiOmJvYg==\r\n"
    );
}

/// The pids of processes whose argv[0] is `prog`.
fn pids_of(prog: &std::path::Path) -> Vec<u32> {
    let want = prog.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(want))
        })
        .collect()
}

/// `-d` on a standalone program's command line forks: the program exits
/// 0 at once and a process of its own serves.
#[test]
fn dash_d_forks_a_standalone_program() {
    let dir = Dir::new("standalone_d");
    let origin = Origin::echo();
    let port = free_port();
    let prog = link(&dir, "3proxy_tcppm");
    let mut child = Command::new(&prog)
        .args([
            "-d",
            "-i127.0.0.1",
            &port.to_string(),
            "127.0.0.1",
            &origin.port().to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let foreground = child.id();
    let mut status = None;
    wait_for(
        || {
            status = child.try_wait().unwrap();
            status.is_some()
        },
        START_TIMEOUT,
    );
    // Whatever happens next, no daemon is left behind.
    struct KillAll<'a>(&'a std::path::Path);
    impl Drop for KillAll<'_> {
        fn drop(&mut self) {
            for pid in pids_of(self.0) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
    let _cleanup = KillAll(&prog);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("3proxy_tcppm -d did not return to the shell");
    };
    assert_eq!(status.code(), Some(0));
    let mut s = None;
    wait_for(
        || {
            s = std::net::TcpStream::connect(localhost(port)).ok();
            s.is_some()
        },
        START_TIMEOUT,
    );
    let mut s = s.expect("the forked 3proxy_tcppm accepts");
    set_timeouts(&s, IO_TIMEOUT);
    echo_roundtrip(&mut s, b"forked");
    let daemons = pids_of(&prog);
    assert_eq!(daemons.len(), 1, "one background process: {daemons:?}");
    assert_ne!(daemons[0], foreground, "the foreground process has exited");
}

#[test]
fn imapp_runs_from_its_command_line() {
    let dir = Dir::new("standalone_imapp");
    // An IMAP server that greets, then echoes the first line it gets.
    let origin = Origin::start("127.0.0.1:0", |mut s| {
        s.write_all(b"* OK [CAPABILITY IMAP4rev1] ready\r\n")
            .unwrap();
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).is_ok_and(|n| n == 1) {
            line.push(b[0]);
            if b[0] == b'\n' {
                break;
            }
        }
        let _ = s.write_all(b"* got ");
        let _ = s.write_all(&line);
    });
    let port = free_port();
    let prog = link(&dir, "3proxy_imapp");
    let _child = Reap(serve(&prog, &["-i127.0.0.1", &format!("-p{port}")], port));
    let mut s = connect(localhost(port));
    set_timeouts(&s, Duration::from_secs(10));
    let o = origin.port();
    s.write_all(format!("t LOGIN a:b:bob@127.0.0.1:{o} pw\r\n").as_bytes())
        .unwrap();
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    // No user is asked for: `a:b:` is part of the name, not credentials.
    assert_eq!(
        got,
        "* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN AUTH=LOGIN] IMAP4rev1 Proxy Ready\r\n\
         * got t LOGIN a:b:bob pw\r\n"
    );
}

/// `3proxy_tlspr`, which 3proxy 1.0.0 installs too: the SNI of the
/// client's ClientHello names the destination, `-P` its port.
#[test]
fn tlspr_runs_from_its_command_line() {
    let dir = Dir::new("standalone_tlspr");
    let pki = crate::tls::Pki::new(&dir);
    let (oport, sni) = crate::tls::tls_origin(
        &pki,
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
    );
    let port = free_port();
    let prog = link(&dir, "3proxy_tlspr");
    let args = [
        "-i127.0.0.1".to_string(),
        format!("-p{port}"),
        format!("-P{oport}"),
    ];
    let mut child = serve(&prog, &args.each_ref().map(String::as_str), port);
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", "*"])
        .args(["--cacert", p(&pki.ca)])
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg(format!("https://localhost:{port}/"))
        .output()
        .expect("run curl");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let asked = sni
        .recv_timeout(Duration::from_secs(20))
        .expect("the origin's handshake");
    assert_eq!(asked.as_deref(), Some("localhost"), "the SNI passed on");
}
