//! The cfg language seen from outside: which cfgs load, which fail, what a
//! failure prints (`FILE:LINE:` + command + reason), the exit status, and
//! how the tokenizer's rules (quotes, comments, CRLF, `$file`, `include`,
//! `end`) show up in what the proxy does.

use std::net::TcpListener;
use std::path::Path;

use crate::util::*;

/// A tcppm line listening on 127.0.0.1:`port`, mapped to 127.0.0.1:`to`.
fn tcppm(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}")
}

/// Runs `cfg` twice, served and with `-t`. Both runs must exit non-zero
/// with the same message naming `file:line:` and `command`. Returns it.
fn expect_cfg_error(
    dir: &Dir,
    cfg: impl AsRef<[u8]>,
    file: &Path,
    line: usize,
    command: &str,
) -> String {
    let cfg = cfg.as_ref();
    let served = run_cfg(dir, &[], cfg).assert_cfg_error(file, line, command);
    let checked = run_cfg(dir, &["-t"], cfg).assert_cfg_error(file, line, command);
    assert_eq!(served, checked, "-t should report the error the same way");
    served
}

fn assert_refused(port: u16) {
    assert!(
        std::net::TcpStream::connect(localhost(port)).is_err(),
        "something still listens on {port} after 3proxy exited"
    );
}

#[test]
fn unknown_command_is_an_error_at_its_line() {
    let dir = Dir::new("unknown_cmd");
    let port = free_port();
    let cfg = format!(
        "# a comment\n{}\nfrobnicate 1 2\n",
        tcppm(port, free_port())
    );
    expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 3, "frobnicate");
    assert_refused(port);
}

#[test]
fn missing_argument_is_an_error() {
    let dir = Dir::new("too_few_args");
    expect_cfg_error(
        &dir,
        "maxconn 10\ninternal\n",
        &dir.cfg_path(),
        2,
        "internal",
    );
}

#[test]
fn extra_argument_is_an_error() {
    let dir = Dir::new("too_many_args");
    expect_cfg_error(&dir, "\n\nmaxconn 10 20\n", &dir.cfg_path(), 3, "maxconn");
}

#[test]
fn maxconn_needs_a_positive_number() {
    let dir = Dir::new("maxconn_word");
    expect_cfg_error(&dir, "maxconn many\n", &dir.cfg_path(), 1, "maxconn");
    let dir = Dir::new("maxconn_zero");
    expect_cfg_error(&dir, "log\nmaxconn 0\n", &dir.cfg_path(), 2, "maxconn");
}

#[test]
fn timeouts_must_be_positive() {
    let dir = Dir::new("timeouts_zero");
    expect_cfg_error(&dir, "timeouts 1 5 0\n", &dir.cfg_path(), 1, "timeouts");
}

#[test]
fn tcppm_without_destination_port_is_an_error() {
    let dir = Dir::new("tcppm_args");
    let cfg = format!("tcppm -i127.0.0.1 {} 127.0.0.1\n", free_port());
    expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 1, "tcppm");
}

#[test]
fn tcppm_unknown_option_is_an_error() {
    let dir = Dir::new("tcppm_opt");
    let cfg = format!("\ntcppm -Q -i127.0.0.1 {} 127.0.0.1 80\n", free_port());
    expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 2, "tcppm");
}

#[test]
fn include_of_missing_file_is_an_error_at_the_include() {
    let dir = Dir::new("include_missing");
    let cfg = format!("maxconn 10\ninclude {}\n", p(&dir.join("missing.cfg")));
    expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 2, "include");
}

#[test]
fn error_inside_include_names_the_included_file_and_its_line() {
    let dir = Dir::new("include_error");
    let inc = dir.write("inc.cfg", "maxconn 10\n# nothing\nfrobnicate\n");
    let cfg = format!("# main\ninclude {}\n", p(&inc));
    expect_cfg_error(&dir, &cfg, &inc, 3, "frobnicate");
}

#[test]
fn missing_dollar_file_is_an_error() {
    let dir = Dir::new("dollar_missing");
    let cfg = format!(
        "maxconn 10\ntcppm -i127.0.0.1 ${}\n",
        p(&dir.join("missing.args"))
    );
    expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 2, "tcppm");
}

#[test]
fn port_in_use_is_an_error() {
    let dir = Dir::new("port_in_use");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = format!("maxconn 10\n{}\n", tcppm(port, free_port()));
    // Only the served run: whether `-t` binds is not part of the contract.
    start_expect_fail(&dir, &cfg).assert_cfg_error(&dir.cfg_path(), 2, "tcppm");
}

/// Commands of 3proxy not built yet. Drop an entry when its command lands
/// (and give it real tests).
/// Command families with no handler yet: refused by name, never
/// "unknown command".
const NOT_YET: &[&str] = &["pcre_nosuch 1"];

#[test]
fn unimplemented_commands_say_so() {
    for line in NOT_YET {
        let command = line.split(' ').next().unwrap();
        let dir = Dir::new(&format!("not_yet_{command}"));
        let cfg = format!("maxconn 10\n{line}\n");
        let msg = expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 2, command);
        assert!(msg.contains("not supported yet"), "{line}: {msg:?}");
    }
}

#[test]
fn check_flag_accepts_a_good_cfg_without_serving() {
    let dir = Dir::new("check_ok");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("maxconn 10\n{}\n", tcppm(port, origin.port()));
    let out = run_check(&dir, &cfg);
    assert_eq!(
        out.status.code(),
        Some(0),
        "3proxy -t on a good cfg; stderr:\n{}",
        out.stderr
    );
    assert_refused(port);
    assert!(origin.peers().is_empty(), "-t must not relay anything");
}

#[test]
fn commands_of_this_stage_are_accepted() {
    let dir = Dir::new("accepted");
    let origin = Origin::echo();
    let port = free_port();
    let marker = dir.join("system-ran");
    let cfg = format!(
        "service\n\
         stacksize 65536\n\
         maxseg 1400\n\
         backlog 64\n\
         timeouts 1 5 30 60 180 1800 15 60 15 5 5\n\
         internal 127.0.0.1\n\
         external 127.0.0.1\n\
         maxconn 10\n\
         system \"touch {}\"\n\
         log {}\n\
         logformat \"L%N %E\"\n\
         tcppm {} 127.0.0.1 {}\n",
        p(&marker),
        p(&dir.join("access.log")),
        port,
        origin.port()
    );
    let check = run_check(&dir, &cfg);
    assert_eq!(
        check.status.code(),
        Some(0),
        "-t; stderr:\n{}",
        check.stderr
    );
    let _ = std::fs::remove_file(&marker);

    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    assert!(marker.exists(), "`system` did not run its command");
    let mut c = connect(localhost(port));
    echo_roundtrip(&mut c, b"all accepted");
}

#[test]
fn internal_sets_the_listen_address_of_later_services() {
    let dir = Dir::new("internal");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "internal 127.0.0.1\ntcppm {port} 127.0.0.1 {}\n",
        origin.port()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"on 127.0.0.1");
    // 127.0.0.2 is loopback too: a listener on 0.0.0.0 would take it.
    let other = std::net::SocketAddr::from(([127, 0, 0, 2], port));
    assert!(
        std::net::TcpStream::connect(other).is_err(),
        "tcppm after `internal 127.0.0.1` also accepts on {other}"
    );
}

#[test]
fn external_sets_the_source_address() {
    let dir = Dir::new("external");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("external 127.0.0.3\n{}\n", tcppm(port, origin.port()));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"from 127.0.0.3");
    let peers = origin.peers();
    assert!(!peers.is_empty());
    for peer in peers {
        assert_eq!(peer.ip().to_string(), "127.0.0.3", "origin saw {peer}");
    }
}

// --- the tokenizer, end to end ---------------------------------------------

#[test]
fn doubled_quote_inside_quotes_is_a_literal_quote() {
    let dir = Dir::new("quotes");
    let log = dir.join("access.log");
    let (origin, _got) = Origin::reply_after_eof(b"hello world", std::time::Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N \"\"quoted\"\" %O %I\"\n{}\n",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    request_reply(port, b"hello", b"hello world");
    expect_log_line(&log, "TCPPM \"quoted\" 5 11");
}

/// One session: send `req`, half-close, expect `reply` and the close.
fn request_reply(port: u16, req: &[u8], reply: &[u8]) {
    use std::io::Write;
    let mut c = connect(localhost(port));
    c.write_all(req).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let got = read_until_closed(&mut c).expect("read the reply");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(reply)
    );
}

#[test]
fn indented_and_hash_lines_are_ignored() {
    let dir = Dir::new("comments");
    let origin = Origin::echo();
    let (port, hidden1, hidden2) = (free_port(), free_port(), free_port());
    let cfg = format!(
        " frobnicate\n\
         \tmaxconn 0\n  {}\n\
         #frobnicate\n\
         # {}\n\
         {}\n",
        tcppm(hidden1, origin.port()),
        tcppm(hidden2, origin.port()),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"served");
    assert_refused(hidden1);
    assert_refused(hidden2);
}

#[test]
fn crlf_line_ends_work() {
    let dir = Dir::new("crlf");
    let log = dir.join("access.log");
    let (origin, _got) = Origin::reply_after_eof(b"hello world", std::time::Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "# windows\r\nlog {}\r\nlogformat \"L%N %O %I\"\r\n{}\r\n",
        p(&log),
        tcppm(port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    request_reply(port, b"hello", b"hello world");
    // log_lines splits on \n only: a \r kept in the format would show here.
    expect_log_line(&log, "TCPPM 5 11");
}

#[test]
fn dollar_file_supplies_arguments() {
    let dir = Dir::new("dollar_file");
    let origin = Origin::echo();
    let (port1, port2) = (free_port(), free_port());
    let plain = dir.write("args", format!("{port1}\n127.0.0.1\n{}\n", origin.port()));
    let spaced = dir.write("more args", format!("{port2} 127.0.0.1\n{}", origin.port()));
    let cfg = format!(
        "tcppm -i127.0.0.1 ${}\ntcppm -i127.0.0.1 $\"{}\"\n",
        p(&plain),
        p(&spaced)
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(port1)), Listen::Tcp(localhost(port2))],
    );
    echo_roundtrip(&mut connect(localhost(port1)), b"args from $file");
    echo_roundtrip(&mut connect(localhost(port2)), b"args from $\"file\"");
}

#[test]
fn include_reads_commands_and_end_inside_it_ends_only_that_file() {
    let dir = Dir::new("include");
    let origin = Origin::echo();
    let (port1, port2) = (free_port(), free_port());
    let inc = dir.write(
        "inc.cfg",
        format!("{}\nend\nfrobnicate\n", tcppm(port1, origin.port())),
    );
    let cfg = format!("include {}\n{}\n", p(&inc), tcppm(port2, origin.port()));
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(port1)), Listen::Tcp(localhost(port2))],
    );
    echo_roundtrip(&mut connect(localhost(port1)), b"from the include");
    echo_roundtrip(&mut connect(localhost(port2)), b"after the include");
}

#[test]
fn end_stops_reading() {
    let dir = Dir::new("end");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "{}\nend\nfrobnicate\nmaxconn 0\n",
        tcppm(port, origin.port())
    );
    let check = run_check(&dir, &cfg);
    assert_eq!(
        check.status.code(),
        Some(0),
        "-t; stderr:\n{}",
        check.stderr
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"served");
}

// --- bytes, limits and what messages show ------------------------------------

#[test]
fn a_latin1_comment_does_not_stop_the_cfg() {
    let dir = Dir::new("latin1_comment");
    let origin = Origin::echo();
    let port = free_port();
    // "café" in Latin-1 (0xe9), in a comment and in an indented line.
    let mut cfg = b"# caf\xe9 au lait\n \xe9t\xe9 ignored\n".to_vec();
    cfg.extend_from_slice(format!("{}\n", tcppm(port, origin.port())).as_bytes());
    let check = run_cfg(&dir, &["-t"], &cfg);
    assert_eq!(check.status.code(), Some(0), "-t: {}", check.stderr);
    let _proxy = Proxy::start_bytes(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"served despite Latin-1");
}

#[test]
fn a_latin1_byte_in_an_argument_is_an_error_at_its_line() {
    let dir = Dir::new("latin1_arg");
    let head = format!("maxconn 10\n{}\nlogformat \"caf", tcppm(free_port(), 9));
    // The UTF-8 é (c3 a9) is fine; its Latin-1 form (e9) is not.
    let utf8 = [head.as_bytes(), "\u{e9} %N\"\n".as_bytes()].concat();
    let check = run_cfg(&dir, &["-t"], &utf8);
    assert_eq!(check.status.code(), Some(0), "-t: {}", check.stderr);
    let latin1 = [head.as_bytes(), b"\xe9 %N\"\n"].concat();
    let msg = expect_cfg_error(&dir, &latin1, &dir.cfg_path(), 3, "logformat");
    assert!(
        msg.ends_with("logformat: byte 0xe9 at column 15 is not UTF-8 (outside comments, the configuration must be UTF-8 text)"),
        "{msg:?}"
    );
    // In an included file: its own name and line.
    let inc = dir.write("inc.cfg", b"\n\nusers b\xf6b:CL:pw\n");
    let msg = expect_cfg_error(&dir, format!("include {}\n", p(&inc)), &inc, 3, "users");
    assert!(
        msg.contains("byte 0xf6 at column 8 is not UTF-8"),
        "{msg:?}"
    );
}

/// `3proxy -t CFG` with its address space limited to `mb` MiB (prlimit(1)):
/// a load that reads without bound dies of it instead of answering.
fn check_in_little_memory(dir: &Dir, cfg: &str, mb: u64) -> Finished {
    use std::process::{Command, Stdio};
    let path = dir.write("little.cfg", cfg);
    let mut child = Command::new("prlimit")
        .arg(format!("--as={}", mb << 20))
        .args([BIN, "-t", p(&path)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run prlimit(1) (util-linux)");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > START_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("3proxy -t {cfg:?} still running after {START_TIMEOUT:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    Finished {
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const CAP_MESSAGE: &str = "reading stopped at 16 MiB, the most one load of the configuration reads (the file, its includes and $FILE insertions together)";

#[test]
fn include_of_an_endless_file_stops_at_the_limit() {
    let dir = Dir::new("include_urandom");
    let cfg = format!(
        "maxconn 10\ninclude /dev/urandom\n{}\n",
        tcppm(free_port(), 9)
    );
    let out = check_in_little_memory(&dir, &cfg, 128);
    let msg = out.assert_cfg_error(&dir.join("little.cfg"), 2, "include");
    assert!(
        msg.ends_with(&format!("include: /dev/urandom: {CAP_MESSAGE}")),
        "{msg:?}"
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn repeated_dollar_files_stop_at_the_limit() {
    let dir = Dir::new("dollar_zero");
    // 1 MiB per insertion (the most a $FILE holds): 300 of them would be
    // 300 MiB.
    let mib = dir.write("mib", vec![b'a'; 1 << 20]);
    let mib = mib.display();
    let cfg = format!("maxconn 10\nlogformat {}\n", format!("${mib} ").repeat(300));
    let out = check_in_little_memory(&dir, &cfg, 128);
    let msg = out.assert_cfg_error(&dir.join("little.cfg"), 2, "logformat");
    assert!(
        msg.ends_with(&format!("logformat: ${mib}: {CAP_MESSAGE}")),
        "{msg:?}"
    );
    // Over many lines, the same: 15 insertions and the file itself fit.
    let cfg = format!("logformat ${mib}\n").repeat(40);
    let out = check_in_little_memory(&dir, &cfg, 128);
    out.assert_cfg_error(&dir.join("little.cfg"), 16, "logformat");
    // An endless one is refused at once: it is larger than 1 MiB.
    let out = check_in_little_memory(&dir, "logformat $/dev/zero\n", 128);
    let msg = out.assert_cfg_error(&dir.join("little.cfg"), 1, "logformat");
    assert!(
        msg.ends_with(
            "logformat: $/dev/zero: the file is larger than 1 MiB, the most a $FILE may hold"
        ),
        "{msg:?}"
    );
}

#[test]
fn a_cfg_file_larger_than_the_limit_is_refused() {
    let dir = Dir::new("cfg_too_big");
    // 17 MiB of comments: never decoded, but read, and counted.
    let line = format!("#{}\n", "x".repeat(1022));
    let cfg = format!("{}{}\n", line.repeat(17 * 1024), tcppm(free_port(), 9));
    let out = run_check(&dir, &cfg);
    // No command to name: the file itself is too big, from this line on.
    let msg = out.assert_cfg_error(&dir.cfg_path(), 16 * 1024 + 1, "reading stopped");
    assert!(msg.ends_with(CAP_MESSAGE), "{msg:?}");
}

#[test]
fn a_failed_reload_over_the_limit_keeps_the_running_cfg() {
    let dir = Dir::new("reload_urandom");
    let origin = Origin::echo();
    let port = free_port();
    let good = format!("{}\n", tcppm(port, origin.port()));
    let mut proxy = Proxy::start(dir, &good, &[Listen::Tcp(localhost(port))]);
    proxy
        .dir
        .write("3proxy.cfg", format!("include /dev/urandom\n{good}"));
    proxy.signal("USR1");
    let at = format!(
        "{}:1: include: /dev/urandom: {CAP_MESSAGE}",
        proxy.dir.cfg_path().display()
    );
    assert!(
        wait_for(|| proxy.stderr().contains(&at), START_TIMEOUT),
        "no {at:?} in stderr:\n{}",
        proxy.stderr()
    );
    assert!(proxy.is_running());
    echo_roundtrip(&mut connect(localhost(port)), b"the old cfg serves");
    let peak = proxy.peak_rss_kb();
    assert!(peak < 100 * 1024, "peak resident memory {peak} kB");
}

/// A message of at most a few hundred bytes, without control bytes but
/// its line end.
fn assert_short(stderr: &str) {
    let start: String = stderr.chars().take(200).collect();
    assert!(stderr.len() < 500, "{} bytes: {start:?}...", stderr.len());
    assert!(
        !stderr.trim_end().contains(|c: char| c.is_control()),
        "{stderr:?}"
    );
}

#[test]
fn a_huge_line_of_nul_bytes_gives_a_short_escaped_message() {
    let dir = Dir::new("nul_line");
    let mut cfg = b"maxconn 10\n".to_vec();
    cfg.extend(std::iter::repeat_n(0u8, 1_000_000));
    cfg.push(b'\n');
    assert_short(&run_cfg(&dir, &["-t"], &cfg).stderr);
    let msg = expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 2, r"\x00\x00");
    let shown = format!("{}...[cut, 1000000 bytes in all]", r"\x00".repeat(80));
    assert!(
        msg.ends_with(&format!("{shown}: the line is longer than 65535 bytes")),
        "{msg:?}"
    );
    // An argument of control bytes within the line limit: cut and escaped
    // where the reason quotes it.
    let cfg = format!("maxconn {}\n", "\0\x1b".repeat(30_000));
    assert_short(&run_cfg(&dir, &["-t"], &cfg).stderr);
    let msg = expect_cfg_error(&dir, &cfg, &dir.cfg_path(), 1, "maxconn");
    assert!(
        msg.ends_with(&format!(
            "maxconn: '{}...[cut, 60000 bytes in all]' is not a number from 1 to 1000000",
            r"\x00\x1b".repeat(40)
        )),
        "{msg:?}"
    );
}

/// Every file in `dir` and below, with its size and modification time.
fn tree(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(tree(&e.path()));
        }
        out.push((
            e.path().display().to_string(),
            m.len(),
            m.modified().unwrap(),
        ));
    }
    out.sort();
    out
}

/// `3proxy -t` creates and changes no file: the log files (rotated, named
/// by a template, or a service's `-l`), the counter file and the pid file
/// are only checked. A cfg shaped like 3proxy's own sample (a Windows
/// path as the daily `log`) used to leave that log in the working
/// directory. A place that cannot be written is still an error.
#[test]
fn check_flag_creates_and_touches_no_file() {
    use std::process::{Command, Stdio};
    let dir = Dir::new("check_no_files");
    let cwd = dir.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::write(cwd.join("old.log"), "kept\n").unwrap();
    let port = free_port();
    let cfg = format!(
        "log c:\\3proxy\\logs\\3proxy.log D\n\
         log old.log\n\
         log access-%Y%m%d.log\n\
         counter traffic.3cf D traffic-report\n\
         pidfile 3proxy.pid\n\
         proxy -i127.0.0.1 -p{port} -lproxy.log\n"
    );
    let path = dir.write("check.cfg", &cfg);
    let before = tree(&cwd);
    let out = Command::new(BIN)
        .args(["-t", p(&path)])
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run 3proxy -t");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree(&cwd),
        before,
        "3proxy -t changed the working directory"
    );
    assert_refused(port);

    for (line, bad) in [
        ("log /nonexistent-dir/x.log D", 1),
        ("counter /nonexistent-dir/c.3cf", 1),
        ("proxy -p1 -l/nonexistent-dir/p.log", 1),
    ] {
        let out = run_check(&dir, &format!("{line}\nproxy -i127.0.0.1 -p{port}\n"));
        let msg = out.assert_cfg_error(&dir.cfg_path(), bad, line.split(' ').next().unwrap());
        assert!(msg.contains("nonexistent-dir"), "{msg}");
    }
}

// ---------------------------------------------------------------------------
// The command table and the man page

/// The `.SH` sections of 3proxy.cfg(5) whose top-level `.TP` entries are
/// commands.
const COMMAND_SECTIONS: &[&str] = &[
    "GLOBAL COMMANDS",
    "PROCESS COMMANDS",
    "AUTHENTICATION AND ACCESS CONTROL",
    "SERVICES",
    "PCRE FILTERING",
    "TLS",
    "PLUGINS",
];

/// The paragraph that opens the PLUGINS section's list of plugins: its
/// entries name plugins, not commands.
const PLUGIN_LIST: &str = "The plugins of 3proxy";

/// Commands the cfg reader runs itself, before the command table.
const READER_COMMANDS: &[&str] = &["include", "end"];

/// One top-level `.TP` entry of the man page (its `.TQ` tags included).
struct ManEntry {
    /// The line of its first tag.
    line: usize,
    /// The command names its tags start with: `.BR ssl_serv ", " ssl_server`
    /// names two.
    names: Vec<String>,
    /// Its tags and text, font escapes removed.
    text: String,
    /// An entry of the plugin list.
    plugin: bool,
}

/// A roff line without font escapes and quotes.
fn roff_plain(line: &str) -> String {
    let mut s = line.to_string();
    for esc in ["\\fB", "\\fI", "\\fR", "\\fP", "\\&", "\""] {
        s = s.replace(esc, "");
    }
    s.replace("\\-", "-")
}

/// The top-level `.TP` entries of the command sections of `man`.
fn man_entries(man: &str) -> Vec<ManEntry> {
    let lines: Vec<&str> = man.lines().collect();
    let (mut entries, mut section, mut depth) = (Vec::<ManEntry>::new(), "", 0);
    let (mut para, mut in_entry, mut plugins) = (String::new(), false, false);
    for (i, l) in lines.iter().enumerate() {
        if let Some(name) = l.strip_prefix(".SH ") {
            (section, in_entry, plugins) = (name, false, false);
        } else if l.starts_with(".SS") {
            in_entry = false;
        } else if *l == ".RS" {
            depth += 1;
        } else if *l == ".RE" {
            depth -= 1;
        }
        let top = depth == 0 && COMMAND_SECTIONS.contains(&section);
        if top && l.starts_with(".PP") {
            (para, in_entry) = (String::new(), false);
        } else if top && (l.starts_with(".TP") || l.starts_with(".TQ")) {
            plugins |= para.starts_with(PLUGIN_LIST);
            para.clear();
            let tag = lines.get(i + 1).copied().unwrap_or("");
            let (macro_, args) = tag.split_once(' ').unwrap_or((tag, ""));
            assert!(
                [".B", ".BI", ".BR"].contains(&macro_),
                "man line {}: a command entry's tag is bold: {tag:?}",
                i + 2
            );
            // The names: the first word, and the first after each ", ".
            let mut names = Vec::new();
            for alt in roff_plain(args).split(", ") {
                let name = alt.split_whitespace().next().unwrap_or("");
                let is_name = name.starts_with(|c: char| c.is_ascii_lowercase())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !plugins {
                    assert!(
                        is_name,
                        "man line {}: {name:?} in {tag:?} is no command name",
                        i + 2
                    );
                }
                names.push(name.to_string());
            }
            if l.starts_with(".TQ") && in_entry {
                entries.last_mut().unwrap().names.extend(names);
            } else {
                entries.push(ManEntry {
                    line: i + 2,
                    names,
                    text: String::new(),
                    plugin: plugins,
                });
                in_entry = true;
            }
        } else if top && !l.starts_with('.') {
            para.push_str(l);
            para.push(' ');
        }
        if in_entry {
            let text = &mut entries.last_mut().unwrap().text;
            text.push_str(&roff_plain(l));
            text.push('\n');
        }
    }
    entries
}

/// The names of the command table (`static COMMANDS`, `cmd("NAME", ...)`
/// entries), read from the source, wherever under src/ it is.
fn table_names() -> Vec<String> {
    fn find(dir: &Path) -> Option<(std::path::PathBuf, String)> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        paths.sort();
        paths.into_iter().find_map(|p| {
            if p.is_dir() {
                find(&p)
            } else {
                let text = std::fs::read_to_string(&p).ok()?;
                text.contains("static COMMANDS").then_some((p, text))
            }
        })
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (path, text) = find(&src).expect("no `static COMMANDS` under src/");
    let start = text.find("static COMMANDS").unwrap();
    let end = start + text[start..].find("\n];").expect("the end of COMMANDS");
    let table = &text[start..end];
    let names: Vec<String> = table
        .split("cmd(")
        .skip(1)
        .map(|rest| {
            let rest = rest.trim_start();
            let name = rest
                .strip_prefix('"')
                .and_then(|r| r.split_once('"'))
                .map(|(name, _)| name.to_string());
            name.unwrap_or_else(|| {
                panic!(
                    "{}: a COMMANDS entry whose name is not a string: cmd({}",
                    path.display(),
                    &rest[..rest.len().min(40)]
                )
            })
        })
        .collect();
    assert!(
        names.len() > 100,
        "{}: only {} commands read from COMMANDS",
        path.display(),
        names.len()
    );
    names
}

/// Whole words (letters, digits, `_`) of `text`.
fn words(text: &str) -> std::collections::HashSet<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn the_man_page_and_the_command_table_name_the_same_commands() {
    let man = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/3proxy.cfg.5"))
        .expect("read man/3proxy.cfg.5");
    let entries = man_entries(&man);
    let table = table_names();
    let commands: Vec<&ManEntry> = entries.iter().filter(|e| !e.plugin).collect();
    assert!(
        commands.len() > 80,
        "{} command entries found",
        commands.len()
    );
    assert!(
        entries.iter().filter(|e| e.plugin).count() > 5,
        "the plugin list ({PLUGIN_LIST:?}) not found"
    );
    // Every command entry of the man page is a command of the table.
    for e in &commands {
        for name in &e.names {
            assert!(
                table.contains(name) || READER_COMMANDS.contains(&name.as_str()),
                "man line {}: the entry of {name:?} names no command of the table",
                e.line
            );
        }
    }
    // Every command of the table has an entry of its own, or (commands
    // that go with another, as `transparent` with its plugin) stands as a
    // whole word in an entry's text.
    let tagged: Vec<&str> = commands
        .iter()
        .flat_map(|e| e.names.iter().map(String::as_str))
        .collect();
    let mentioned: std::collections::HashSet<&str> =
        entries.iter().flat_map(|e| words(&e.text)).collect();
    let missing: Vec<&String> = table
        .iter()
        .filter(|n| !tagged.contains(&n.as_str()) && !mentioned.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "commands of the table that no entry of man/3proxy.cfg.5 names: {missing:?}"
    );
}
