//! Operations: `daemon` and `pidfile`, giving up root (`setuid`, `setgid`,
//! `chroot`), log rotation (`log FILE c`, `rotate`, `archiver`), syslog
//! (`log @ident`, `-l@ident`), and the graceful exit on SIGTERM.
//!
//! Rotation tests move the proxy's rotation clock through its test hook
//! (THREEPROXY_TEST_CLOCK_OFFSET names a file of seconds to add) and run it
//! with TZ=UTC, so file names are known in advance. Tests that need root
//! (CI runs as root) say so and pass without checking when not root.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::util::*;

fn tcppm(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

fn is_root() -> bool {
    proc_ids(std::process::id(), "Uid:").is_some_and(|ids| ids[1] == 0)
}

/// The four ids (real, effective, saved, fs) of a `Uid:`/`Gid:` line of
/// /proc/PID/status.
fn proc_ids(pid: u32, field: &str) -> Option<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    Some(
        line[field.len()..]
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect(),
    )
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        // The state follows the parenthesized command name.
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

fn kill(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Kills a daemonized proxy (not our child) if the test ends early.
struct Daemon(u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        if alive(self.0) {
            kill(self.0, "KILL");
        }
    }
}

#[test]
fn daemon_pidfile_holds_the_live_process_and_sigterm_removes_it() {
    let dir = Dir::new("daemon");
    let origin = Origin::echo();
    let port = free_port();
    let pidfile = dir.join("3proxy.pid");
    let log = dir.join("access.log");
    let cfg = format!(
        "daemon\npidfile {}\nlog {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&pidfile),
        p(&log),
        tcppm(port, origin.port())
    );
    let cfg_path = dir.write("3proxy.cfg", cfg);
    let stderr = fs::File::create(dir.join("stderr.txt")).unwrap();
    let mut parent = Command::new(BIN)
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn 3proxy");
    // The foreground process exits 0 at once; the daemon goes on.
    let mut status = None;
    wait_for(
        || {
            status = parent.try_wait().unwrap();
            status.is_some()
        },
        START_TIMEOUT,
    );
    let status = status.expect("the foreground 3proxy should exit after forking");
    let diag = || fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", diag());

    let mut pid = None;
    wait_for(
        || {
            pid = fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.parse::<u32>().ok());
            pid.is_some()
        },
        START_TIMEOUT,
    );
    let pid = pid.unwrap_or_else(|| panic!("no pid in {}; stderr:\n{}", pidfile.display(), diag()));
    let _guard = Daemon(pid);
    assert_ne!(pid, parent.id(), "the pid file must hold the daemon's pid");
    assert!(alive(pid), "pid {pid} from the pid file is not running");
    let content = fs::read_to_string(&pidfile).unwrap();
    assert!(
        !content.ends_with('\n'),
        "3proxy writes the pid without a newline"
    );

    // The daemon serves, in a session of its own.
    let mut c = None;
    wait_for(
        || {
            c = TcpStream::connect(localhost(port)).ok();
            c.is_some()
        },
        START_TIMEOUT,
    );
    let mut c = c.expect("the daemon accepts");
    set_timeouts(&c, IO_TIMEOUT);
    echo_roundtrip(&mut c, b"daemon");
    drop(c);
    let sid = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = sid.rsplit_once(") ").unwrap().1.split(' ').collect();
    assert_eq!(
        fields[3],
        pid.to_string(),
        "the daemon leads its own session (setsid)"
    );

    kill(pid, "TERM");
    assert!(
        wait_for(|| !alive(pid), START_TIMEOUT),
        "the daemon is still running after SIGTERM"
    );
    assert!(
        !pidfile.exists(),
        "the pid file is removed at a normal exit"
    );
    read_log_line(&log, "for the daemon's session", |l| l == "TCPPM 00000 6 6");
}

#[test]
fn setuid_to_nobody_after_binding_port_1() {
    assert!(
        is_root(),
        "setuid needs root: run the tests as root (CI does)"
    );
    let dir = Dir::new("setuid");
    let origin = Origin::echo();
    // Port 1 needs root to bind; the ids change after binding.
    let cfg = format!("setuid nobody\nsetgid 65534\n{}", tcppm(1, origin.port()));
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(1))]);
    let nobody = 65534;
    // The listener exists (and the readiness probe gets in) before the ids
    // change: wait for the change rather than race it.
    let dropped = wait_for(
        || proc_ids(proxy.pid(), "Uid:") == Some(vec![nobody; 4]),
        START_TIMEOUT,
    );
    assert!(dropped, "uids: {:?}", proc_ids(proxy.pid(), "Uid:"));
    assert_eq!(proc_ids(proxy.pid(), "Gid:"), Some(vec![nobody; 4]));
    let status = fs::read_to_string(format!("/proc/{}/status", proxy.pid())).unwrap();
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(
        groups.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65534"]
    );
    let mut c = connect(localhost(1));
    echo_roundtrip(&mut c, b"as nobody");
}

#[test]
fn uid_and_gid_0_are_refused() {
    for (line, cmd) in [
        ("setuid 0", "setuid"),
        ("setgid root", "setgid"),
        ("chroot / 0", "chroot"),
    ] {
        let dir = Dir::new("uid0");
        let cfg = format!("{line}\n{}", tcppm(free_port(), 9));
        let out = start_expect_fail(&dir, &cfg);
        out.assert_cfg_error(&dir.cfg_path(), 1, cmd);
    }
}

#[test]
fn chroot_makes_later_paths_relative_to_the_new_root() {
    assert!(
        is_root(),
        "chroot needs root: run the tests as root (CI does)"
    );
    let dir = Dir::new("chroot");
    let origin = Origin::echo();
    let port = free_port();
    let root = dir.join("");
    // The log path is inside the new root; so is the pid file.
    let cfg = format!(
        "chroot {} 65534 65534\nlog /inside.log\nlogformat \"L%N %E\"\npidfile /p.pid\n{}",
        p(&root),
        tcppm(port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let link = fs::read_link(format!("/proc/{}/root", proxy.pid())).unwrap();
    assert_eq!(link, proxy.dir.join("").canonicalize().unwrap());
    assert_eq!(proc_ids(proxy.pid(), "Uid:"), Some(vec![65534; 4]));
    let pid = fs::read_to_string(proxy.dir.join("p.pid")).unwrap();
    assert_eq!(pid, proxy.pid().to_string());
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"jailed");
    drop(c);
    read_log_line(&proxy.dir.join("inside.log"), "in the chroot", |l| {
        l == "TCPPM 00000"
    });
}

/// 2030-01-01 00:00:05 UTC: five seconds into a minute, so the test has 55
/// seconds before the clock leaves the minute by itself.
const T0: i64 = 1_893_456_005;

fn set_clock(file: &Path, at: i64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    fs::write(file, (at - now).to_string()).unwrap();
}

fn wait_exists(path: &Path, what: &str, dir: &Path) {
    assert!(
        wait_for(|| path.exists(), LOG_TIMEOUT),
        "{what}: {} does not exist; the dir has {:?}",
        path.display(),
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect::<Vec<_>>()
    );
}

#[test]
fn minutely_rotation_rotate_and_archiver() {
    let dir = Dir::new("rotation");
    let clock = dir.join("clock");
    set_clock(&clock, T0);
    let origin = Origin::echo();
    let port = free_port();
    let base = dir.join("access.log");
    let cfg = format!(
        "log {} c\nrotate 2\narchiver gz cp %F %A\nlogformat \"L%N %E %O\"\n{}",
        p(&base),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let proxy = Proxy::start_with_env(dir, &cfg, &[Listen::Tcp(localhost(port))], &envs);
    let d = proxy.dir.join("");
    let name = |min: u32| d.join(format!("access.log.2030.01.01-00.{min:02}"));
    let gz = |min: u32| d.join(format!("access.log.2030.01.01-00.{min:02}.gz"));

    wait_exists(&name(0), "the first minute's file", &d);
    assert!(!base.exists(), "a rotated log has a suffix");

    // A minute later: a new file, and the archiver copies the old one.
    set_clock(&clock, T0 + 60);
    wait_exists(&name(1), "the second minute's file", &d);
    wait_exists(&gz(0), "the archiver's copy of the first file", &d);
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"minute 1");
    drop(c);
    read_log_line(&name(1), "for the session in minute 1", |l| {
        l == "TCPPM 00000 8"
    });

    // Another minute: `rotate 2` deletes the archive two minutes old.
    set_clock(&clock, T0 + 120);
    wait_exists(&name(2), "the third minute's file", &d);
    wait_exists(&gz(1), "the archive of the second file", &d);
    assert!(
        wait_for(|| !gz(0).exists(), LOG_TIMEOUT),
        "rotate 2 should delete {}",
        gz(0).display()
    );
    // The second minute's record stayed in its file.
    assert!(log_lines(&name(1)).iter().any(|l| l == "TCPPM 00000 8"));
}

#[test]
fn template_log_names_use_time_escapes() {
    let dir = Dir::new("logtemplate");
    let clock = dir.join("clock");
    set_clock(&clock, T0);
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log {}/t-%Y%m%d-%H%M.log c\n{}",
        p(&dir.join("")).trim_end_matches('/'),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let proxy = Proxy::start_with_env(dir, &cfg, &[Listen::Tcp(localhost(port))], &envs);
    let d = proxy.dir.join("");
    wait_exists(&d.join("t-20300101-0000.log"), "the template's file", &d);
    set_clock(&clock, T0 + 3600);
    wait_exists(&d.join("t-20300101-0100.log"), "the next file", &d);
}

/// A syslog daemon of our own: a datagram socket in the test dir.
fn syslog_socket(dir: &Dir) -> (UnixDatagram, String) {
    let path = dir.join("log.sock");
    let s = UnixDatagram::bind(&path).expect("bind the syslog socket");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    (s, p(&path).to_string())
}

fn recv_until(s: &UnixDatagram, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + LOG_TIMEOUT;
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    while Instant::now() < deadline {
        if let Ok(n) = s.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if pred(&m) {
                return m;
            }
            seen.push(m);
        }
    }
    panic!("no matching syslog message; got:\n{}", seen.join("\n"));
}

#[test]
fn log_at_ident_goes_to_syslog() {
    let dir = Dir::new("syslog");
    let (sock, path) = syslog_socket(&dir);
    let origin = Origin::echo();
    let (port, port2) = (free_port(), free_port());
    let cfg = format!(
        "log @threeproxy-test\nlogformat \"L%N %E %O\"\n{}tcppm -l@other -i127.0.0.1 {port2} 127.0.0.1 {}\n",
        tcppm(port, origin.port()),
        origin.port()
    );
    let proxy = Proxy::start_with_env(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(port)), Listen::Tcp(localhost(port2))],
        &[("THREEPROXY_SYSLOG_SOCKET", &path)],
    );
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"to syslog");
    drop(c);
    let tag = format!("threeproxy-test[{}]: ", proxy.pid());
    let m = recv_until(&sock, |m| m.ends_with(&format!("{tag}TCPPM 00000 9")));
    // <daemon.info>, then "Mmm dd hh:mm:ss ".
    assert!(m.starts_with("<30>"), "{m:?}");
    assert_eq!(m.as_bytes()[19], b' ', "{m:?}");
    assert!(!m.ends_with('\n'), "{m:?}");

    let mut c = connect(localhost(port2));
    echo_roundtrip(&mut c, b"other");
    drop(c);
    let tag = format!("other[{}]: ", proxy.pid());
    recv_until(&sock, |m| m.ends_with(&format!("{tag}TCPPM 00000 5")));
}

#[test]
fn sigterm_stops_accepting_lets_sessions_finish_and_exits_0() {
    let dir = Dir::new("graceful");
    let origin = Origin::echo();
    let port = free_port();
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %O %I\"\n{}",
        p(&log),
        tcppm(port, origin.port())
    );
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"before");

    proxy.signal("TERM");
    // New clients are refused at once...
    assert!(
        wait_for(
            || TcpStream::connect(localhost(port)).is_err(),
            START_TIMEOUT
        ),
        "port {port} still accepts after SIGTERM"
    );
    // ...while the open session goes on.
    echo_roundtrip(&mut c, b"after");
    assert!(proxy.is_running(), "3proxy exited with a session open");
    let closed = Instant::now();
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    drop(c);
    let status = proxy
        .wait_exit(START_TIMEOUT)
        .expect("3proxy still running after its last session ended");
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status}"
    );
    eprintln!("exited {:?} after the last session ended", closed.elapsed());
    // The session's record was written before the exit.
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l == "TCPPM 00000 11 11"),
        "no record of the session in:\n{}",
        lines.join("\n")
    );
}

#[test]
fn sigterm_does_not_wait_forever_for_an_idle_session() {
    let dir = Dir::new("graceful_idle");
    let origin = Origin::echo();
    let port = free_port();
    let mut proxy = Proxy::start(
        dir,
        &tcppm(port, origin.port()),
        &[Listen::Tcp(localhost(port))],
    );
    let mut idle = connect(localhost(port));
    echo_roundtrip(&mut idle, b"idle");
    let sent = Instant::now();
    proxy.signal("TERM");
    let status = proxy
        .wait_exit(START_TIMEOUT)
        .expect("3proxy still running: the grace time must be bounded");
    assert_eq!(status.code(), Some(0));
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "took {:?}",
        sent.elapsed()
    );
    drop(idle);
}

#[test]
fn process_and_log_commands_are_accepted() {
    let dir = Dir::new("opscheck");
    let mon = dir.write("watched", "x");
    let cfg = format!(
        "config {}\nmonitor {}\nwritable\nrotate 7\narchiver gz gzip %F\nlogdump 1000 2000\n\
         delimchar #\nlog /dev/null\n{}",
        p(&dir.cfg_path()),
        p(&mon),
        tcppm(free_port(), 9)
    );
    let out = run_check(&dir, &cfg);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", out.stderr);
}

#[test]
fn pidfile_in_a_missing_directory_names_its_line() {
    let dir = Dir::new("pidfile_bad");
    let cfg = format!(
        "pidfile /nonexistent/dir/3proxy.pid\n{}",
        tcppm(free_port(), 9)
    );
    let out = start_expect_fail(&dir, &cfg);
    let msg = out.assert_cfg_error(&dir.cfg_path(), 1, "pidfile");
    assert!(msg.contains("/nonexistent/dir/3proxy.pid"), "{msg}");
}

#[test]
fn log_to_stdout_still_works_with_the_writer_thread() {
    let dir = Dir::new("stdoutlog");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "log\nlogformat \"L%N %E %O\"\n{}",
        tcppm(port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = connect(localhost(port));
    c.write_all(b"abc").unwrap();
    let mut b = [0u8; 3];
    c.read_exact(&mut b).unwrap();
    drop(c);
    assert!(
        wait_for(
            || proxy.stdout().lines().any(|l| l == "TCPPM 00000 3"),
            LOG_TIMEOUT
        ),
        "stdout:\n{}",
        proxy.stdout()
    );
}
