//! Operations: `daemon` and `pidfile`, giving up root (`setuid`, `setgid`,
//! `chroot`), log rotation (`log FILE c`, `rotate`, `archiver`), syslog
//! (`log @ident`, `-l@ident`), and the graceful exit on SIGTERM.
//!
//! Rotation tests move the proxy's rotation clock through its test hook
//! (THREEPROXY_TEST_CLOCK_OFFSET names a file of seconds to add) and run it
//! with TZ=UTC, so file names are known in advance. Tests that need root
//! (CI runs as root) fail, saying so, when not root.

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

/// 3proxy writes the pid file at its line, as whoever it is by then: it
/// changes ids at `setuid`/`setgid`, so a `pidfile` after `setuid` is the
/// user's file and one before it root's (given the group of a `setgid`
/// before it).
#[test]
fn pidfile_is_written_as_the_user_of_the_lines_before_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert!(
        is_root(),
        "setuid needs root: run the tests as root (CI does)"
    );
    let nobody = 65534;
    for (pre, post, owner) in [
        ("setuid 65534\nsetgid 65534\n", "", (nobody, nobody)),
        ("setgid 65534\n", "setuid 65534\n", (0, nobody)),
        ("", "setuid 65534\nsetgid 65534\n", (0, 0)),
    ] {
        let dir = Dir::new("pidfile_owner");
        // A directory the user may write in (and reach: the test dirs
        // are 0755).
        let run = dir.join("run");
        fs::create_dir(&run).unwrap();
        fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
        let pidfile = run.join("3proxy.pid");
        let origin = Origin::echo();
        let port = free_port();
        let cfg = format!(
            "{pre}pidfile {}\n{post}{}",
            p(&pidfile),
            tcppm(port, origin.port())
        );
        let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
        let written = wait_for(
            || fs::read_to_string(&pidfile).is_ok_and(|s| !s.is_empty()),
            START_TIMEOUT,
        );
        assert!(written, "{cfg}: no pid file; stderr:\n{}", proxy.stderr());
        let meta = fs::metadata(&pidfile).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            owner,
            "owner of the pid file of:\n{cfg}"
        );
        assert_eq!(
            fs::read_to_string(&pidfile).unwrap(),
            proxy.pid().to_string(),
            "{cfg}"
        );
    }
    // After `setuid`, a directory only root may write is an error of the
    // line, as 3proxy's fopen fails there.
    let dir = Dir::new("pidfile_owner_denied");
    let cfg = format!(
        "setuid 65534\npidfile {}\n{}",
        p(&dir.join("3proxy.pid")),
        tcppm(free_port(), 9)
    );
    fs::set_permissions(dir.join(""), fs::Permissions::from_mode(0o755)).unwrap();
    start_expect_fail(&dir, &cfg).assert_cfg_error(&dir.cfg_path(), 2, "pidfile");
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
    // The log path is inside the new root; so is the pid file, which is
    // written as the user (as 3proxy, which changes ids at the line, does),
    // so in a directory the user may write.
    let run = dir.join("run");
    fs::create_dir(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(65534), Some(65534)).unwrap();
    let cfg = format!(
        "chroot {} 65534 65534\nlog /inside.log\nlogformat \"L%N %E\"\npidfile /run/p.pid\n{}",
        p(&root),
        tcppm(port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let link = fs::read_link(format!("/proc/{}/root", proxy.pid())).unwrap();
    assert_eq!(link, proxy.dir.join("").canonicalize().unwrap());
    assert_eq!(proc_ids(proxy.pid(), "Uid:"), Some(vec![65534; 4]));
    let pid = fs::read_to_string(proxy.dir.join("run/p.pid")).unwrap();
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

/// Runs `3proxy CFG` for a cfg with `daemon` and `pidfile PIDFILE`: waits
/// for the foreground process to exit 0 and returns the daemon's pid
/// (from the pid file) with a guard that kills it.
fn start_daemon(dir: &Dir, cfg: &str, pidfile: &Path, envs: &[(&str, &str)]) -> (u32, Daemon) {
    let cfg_path = dir.write("3proxy.cfg", cfg);
    let stderr = fs::File::create(dir.join("stderr.txt")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut parent = cmd.spawn().expect("spawn 3proxy");
    let mut status = None;
    wait_for(
        || {
            status = parent.try_wait().unwrap();
            status.is_some()
        },
        START_TIMEOUT,
    );
    let diag = || fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        let _ = parent.kill();
        panic!("the foreground 3proxy did not exit; stderr:\n{}", diag())
    });
    assert_eq!(status.code(), Some(0), "stderr:\n{}", diag());
    let mut pid = None;
    wait_for(
        || {
            pid = fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.parse::<u32>().ok());
            pid.is_some()
        },
        START_TIMEOUT,
    );
    let pid = pid.unwrap_or_else(|| panic!("no pid in {}; stderr:\n{}", pidfile.display(), diag()));
    assert_ne!(pid, parent.id(), "the pid file must hold the daemon's pid");
    (pid, Daemon(pid))
}

/// A cfg that fails on SIGUSR1 after naming the same rotating log and
/// another pid file leaves the running log's rotation (new file each
/// period, `rotate` deleting the old) and every pid file as they were.
#[test]
fn a_broken_reload_leaves_rotation_and_pid_files_alone() {
    let dir = Dir::new("reload_broken_rotation");
    let clock = dir.join("clock");
    set_clock(&clock, T0);
    let origin = Origin::echo();
    let port = free_port();
    let base = dir.join("access.log");
    let pidfile = dir.join("3proxy.pid");
    let other = dir.write("other.pid", "4242");
    let good = format!(
        "pidfile {}\nlog {} c\nrotate 2\nlogformat \"L%N %E %O\"\n{}",
        p(&pidfile),
        p(&base),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let mut proxy = Proxy::start_with_env(dir, &good, &[Listen::Tcp(localhost(port))], &envs);
    let d = proxy.dir.join("");
    let name = |min: u32| d.join(format!("access.log.2030.01.01-00.{min:02}"));
    wait_exists(&name(0), "the first minute's file", &d);

    // Same log, another pid file, then an error on line 7.
    let bad = format!(
        "pidfile {}\nlog {} c\nrotate 2\nlogformat \"L%N %E %O\"\n{}pidfile {}\nmaxconn nonsense\n",
        p(&pidfile),
        p(&base),
        tcppm(port, origin.port()),
        p(&other)
    );
    proxy.dir.write("3proxy.cfg", &bad);
    proxy.signal("USR1");
    let at = format!("{}:7: maxconn:", proxy.dir.cfg_path().display());
    assert!(
        wait_for(|| proxy.stderr().contains(&at), START_TIMEOUT),
        "no error naming {at}:\n{}",
        proxy.stderr()
    );
    assert!(proxy.is_running());
    assert_eq!(fs::read_to_string(&other).unwrap(), "4242", "other.pid");
    assert_eq!(
        fs::read_to_string(&pidfile).unwrap(),
        proxy.pid().to_string(),
        "the running pid file"
    );

    // The next minute's file comes with no record written (the writer's
    // own check), and records go there.
    set_clock(&clock, T0 + 60);
    wait_exists(&name(1), "the second minute's file", &d);
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"minute 1");
    drop(c);
    read_log_line(&name(1), "for the session in minute 1", |l| {
        l == "TCPPM 00000 8"
    });
    // `rotate 2` still deletes: two minutes on, the first file goes.
    set_clock(&clock, T0 + 120);
    wait_exists(&name(2), "the third minute's file", &d);
    assert!(
        wait_for(|| !name(0).exists(), LOG_TIMEOUT),
        "rotate 2 should delete {}",
        name(0).display()
    );
    assert!(name(1).exists());
}

/// `rotate` unset: no file is deleted and, as in 3proxy, the archiver
/// does not run either.
#[test]
fn without_rotate_the_archiver_does_not_run() {
    let dir = Dir::new("rotation_no_rotate");
    let clock = dir.join("clock");
    set_clock(&clock, T0);
    let origin = Origin::echo();
    let port = free_port();
    let base = dir.join("access.log");
    let cfg = format!(
        "log {} c\narchiver gz cp %F %A\n{}",
        p(&base),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let proxy = Proxy::start_with_env(dir, &cfg, &[Listen::Tcp(localhost(port))], &envs);
    let d = proxy.dir.join("");
    let name = |min: u32| d.join(format!("access.log.2030.01.01-00.{min:02}"));
    wait_exists(&name(0), "the first minute's file", &d);
    set_clock(&clock, T0 + 60);
    wait_exists(&name(1), "the second minute's file", &d);
    set_clock(&clock, T0 + 120);
    wait_exists(&name(2), "the third minute's file", &d);
    // Give an archiver that wrongly ran the time to finish.
    std::thread::sleep(Duration::from_millis(1500));
    let files: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("access.log"))
        .collect();
    assert!(
        files.iter().all(|n| !n.ends_with(".gz")),
        "archives without rotate: {files:?}"
    );
    assert!(name(0).exists() && name(1).exists(), "{files:?}");
}

/// `daemon` with `counter FILE D REPORT`: the report thread starts in the
/// daemon (after the fork), so the day's report is written.
#[test]
fn a_daemon_writes_counter_reports() {
    let dir = Dir::new("daemon_reports");
    let clock = dir.write("clock", "0");
    let origin = Origin::echo();
    let port = free_port();
    let pidfile = dir.join("3proxy.pid");
    let counters = dir.join("3proxy.counters");
    let report = dir.join("report");
    let cfg = format!(
        "daemon\npidfile {}\ncounter {} D {}\ncountall 1/daily D 100 *\n{}",
        p(&pidfile),
        p(&counters),
        p(&report),
        tcppm(port, origin.port())
    );
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let (pid, _guard) = start_daemon(&dir, &cfg, &pidfile, &envs);
    assert!(alive(pid));

    assert!(
        wait_for(
            || TcpStream::connect(localhost(port)).is_ok(),
            START_TIMEOUT
        ),
        "the daemon does not accept"
    );
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, &[5u8; 100]);
    drop(c);
    assert!(
        wait_for(|| counter_record(&counters, 1) == Some(200), LOG_TIMEOUT),
        "counter 1 is {:?}, want 200",
        counter_record(&counters, 1)
    );

    // A day later: the report of the day that ended.
    fs::write(&clock, "86400").unwrap();
    let reports = || -> Vec<std::path::PathBuf> {
        fs::read_dir(dir.join(""))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("report.")
            })
            .collect()
    };
    assert!(
        wait_for(|| !reports().is_empty(), LOG_TIMEOUT),
        "the daemon wrote no report; stderr:\n{}",
        fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default()
    );
    let path = reports().remove(0);
    assert!(wait_for(
        || fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n')),
        LOG_TIMEOUT
    ));
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "00001 00000000000000000200 #daily\n"
    );
    kill(pid, "TERM");
    assert!(wait_for(|| !alive(pid), START_TIMEOUT));
}

/// The service option `-d` in a cfg forks as `daemon` does.
#[test]
fn service_option_d_forks() {
    let dir = Dir::new("dash_d");
    let origin = Origin::echo();
    let port = free_port();
    let pidfile = dir.join("3proxy.pid");
    let cfg = format!(
        "pidfile {}\ntcppm -d -i127.0.0.1 {port} 127.0.0.1 {}\n",
        p(&pidfile),
        origin.port()
    );
    let (pid, _guard) = start_daemon(&dir, &cfg, &pidfile, &[]);
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    assert_eq!(fields[3], pid.to_string(), "the daemon leads its session");
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
    echo_roundtrip(&mut c, b"forked by -d");
    drop(c);
    kill(pid, "TERM");
    assert!(wait_for(|| !alive(pid), START_TIMEOUT));
}

/// A session that ended just before SIGTERM is in the counter file after
/// the exit (the exit writes the counters; it does not rely on the
/// once-a-second dump having run).
#[test]
fn sigterm_writes_the_counters() {
    let dir = Dir::new("sigterm_counters");
    let counters = dir.join("3proxy.counters");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "counter {}\ncountall 1/all D 100 *\n{}",
        p(&counters),
        tcppm(port, origin.port())
    );
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, &[9u8; 1000]);
    c.shutdown(Shutdown::Write).unwrap();
    let _ = read_until_closed(&mut c);
    drop(c);
    proxy.signal("TERM");
    let status = proxy.wait_exit(START_TIMEOUT).expect("exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        counter_record(&counters, 1),
        Some(2000),
        "counter 1 after the exit"
    );
}

/// A syslog daemon that stops reading (its socket full) costs the log
/// writer one short wait: relays go on, the file log keeps being written,
/// and the dropped syslog records are counted in a warning.
#[test]
fn a_stuck_syslog_daemon_stalls_neither_relays_nor_file_logs() {
    let dir = Dir::new("syslog_stuck");
    // Bound and never read: after max_dgram_qlen datagrams, a blocking
    // send would wait forever.
    let (_sock, path) = syslog_socket(&dir);
    let origin = Origin::echo();
    let (sink, digests) = Origin::hash_sink(0, 0);
    let log = dir.join("access.log");
    let (to_syslog, to_file) = (free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"L%N %p %E %O\"\n\
         tcppm -l@stuck -i127.0.0.1 {to_syslog} 127.0.0.1 {}\n{}",
        p(&log),
        sink.port(),
        tcppm(to_file, origin.port())
    );
    let proxy = Proxy::start_with_env(
        dir,
        &cfg,
        &[
            Listen::Tcp(localhost(to_syslog)),
            Listen::Tcp(localhost(to_file)),
        ],
        &[("THREEPROXY_SYSLOG_SOCKET", &path)],
    );
    // Far more records than the socket holds (sessions that carry
    // nothing, which the hash sink does not report).
    for _ in 0..60 {
        let mut c = connect(localhost(to_syslog));
        c.shutdown(Shutdown::Write).unwrap();
        let _ = read_until_closed(&mut c);
    }
    // A relay through the syslog-logged service moves all its bytes...
    let started = Instant::now();
    let total: u64 = 64 * BLOCK as u64;
    let mut c = connect(localhost(to_syslog));
    send_pattern(&mut c, 3, total).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let got = recv_nonempty(&digests, IO_TIMEOUT);
    assert_eq!(got, pattern_digest(3, total), "bytes through the relay");
    drop(c);
    // ...and a session of the file-logged service is logged in time.
    let mut c = connect(localhost(to_file));
    echo_roundtrip(&mut c, b"to the file");
    drop(c);
    expect_log_line(&log, &format!("TCPPM {to_file} 00000 11"));
    eprintln!("relay and file record took {:?}", started.elapsed());
    assert!(
        wait_for(
            || proxy.stderr().contains("dropped: the syslog daemon"),
            LOG_TIMEOUT
        ),
        "no warning about dropped syslog records:\n{}",
        proxy.stderr()
    );
}

/// This process's umask, from /proc/self/status.
fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

/// Owner, group and permission bits of a file.
fn owner_mode(path: &Path) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid(), m.mode() & 0o777)
}

/// After `chroot DIR USER GROUP` the files that later lines create (the
/// log, the counter file) belong to that user, as 3proxy, which gives up
/// root at the line, creates them, with 3proxy's modes (0666 for a log,
/// 0660 for the counter file, less the umask); so a reload, which runs as
/// that user, opens them again, and rotation's files are the user's too.
#[test]
fn files_made_after_chroot_belong_to_its_user_with_3proxys_modes() {
    assert!(
        is_root(),
        "chroot needs root: run the tests as root (CI does)"
    );
    let dir = Dir::new("chroot_owner");
    let root = dir.join("");
    // The clock hook's file, at its path seen before and after the chroot.
    let clock = dir.join("clock");
    let inside = root.join(clock.strip_prefix("/").unwrap());
    fs::create_dir_all(inside.parent().unwrap()).unwrap();
    let set = |at: i64| {
        set_clock(&clock, at);
        set_clock(&inside, at);
    };
    set(T0);
    let logs = dir.join("logs");
    fs::create_dir(&logs).unwrap();
    std::os::unix::fs::chown(&logs, Some(65534), Some(65534)).unwrap();
    let origin = Origin::echo();
    let (port, port2) = (free_port(), free_port());
    let cfg = |extra: &str| {
        format!(
            "chroot {} 65534 65534\nlog /logs/access.log c\ncounter /logs/traffic.3cf\n\
             logformat \"L%N %E\"\n{}{extra}",
            p(&root),
            tcppm(port, origin.port())
        )
    };
    let envs = [("TZ", "UTC"), ("THREEPROXY_TEST_CLOCK_OFFSET", p(&clock))];
    let mut proxy = Proxy::start_with_env(dir, &cfg(""), &[Listen::Tcp(localhost(port))], &envs);
    let mask = umask();
    let minute = |m: u32| logs.join(format!("access.log.2030.01.01-00.{m:02}"));
    assert_eq!(owner_mode(&minute(0)), (65534, 65534, 0o666 & !mask));
    assert_eq!(
        owner_mode(&logs.join("traffic.3cf")),
        (65534, 65534, 0o660 & !mask)
    );

    // A reload, as the user, opens the same log and counter file.
    proxy
        .dir
        .write("3proxy.cfg", cfg(&tcppm(port2, origin.port())));
    proxy.signal("USR1");
    assert!(
        wait_for(
            || TcpStream::connect(localhost(port2)).is_ok(),
            START_TIMEOUT
        ),
        "the reload did not start the new service; stderr:\n{}",
        proxy.stderr()
    );
    assert!(proxy.is_running());

    // The next minute's file is made by the user.
    set(T0 + 60);
    wait_exists(&minute(1), "the second minute's file", &logs);
    assert_eq!(owner_mode(&minute(1)), (65534, 65534, 0o666 & !mask));
}

#[test]
fn a_daemon_keeps_its_parentcheck_thread() {
    // The checker thread starts after `daemon`'s fork: one started while
    // the cfg loads would stay behind in the foreground process.
    let dir = Dir::new("daemon_parentcheck");
    let port = free_port();
    let pidfile = dir.join("3proxy.pid");
    let cfg = format!(
        "daemon\npidfile {}\nparentcheck 1 1\nallow *\nparent 1000 socks5 127.0.0.1 {}\n{}",
        p(&pidfile),
        free_port(),
        tcppm(port, 9)
    );
    let cfg_path = dir.write("3proxy.cfg", cfg);
    let status = Command::new(BIN)
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run 3proxy");
    assert_eq!(status.code(), Some(0));
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
    let pid = pid.expect("the daemon's pid file");
    let _guard = Daemon(pid);
    let checkers = || {
        fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
                    .filter(|c| c.trim_end() == "parentcheck")
                    .count()
            })
            .unwrap_or(0)
    };
    assert!(
        wait_for(|| checkers() == 1, START_TIMEOUT),
        "the daemon has {} parentcheck threads",
        checkers()
    );
}
