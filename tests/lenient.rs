//! Leniency where 3proxy is lenient: cfgs 3proxy 1.0.0 starts without a
//! word load here too, with one warning each naming file:line, the command
//! and the value used; `-t` exits 0 for them and `-t --strict` exits 1
//! with the same text. Each case is also served and driven by a client.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use crate::util::*;

/// The warning line `3proxy -t` prints for `CFG:line: command: why`.
fn warning(cfg: &std::path::Path, line: usize, command: &str, why: &str) -> String {
    format!(
        "3proxy: warning: {}:{line}: {command}: {why}",
        cfg.display()
    )
}

/// `-t` exits 0 and prints exactly one warning, `want` (a whole line);
/// `-t --strict` exits 1 and prints the same text as an error.
fn check_warns(dir: &Dir, cfg: &str, want: &str) {
    let checked = run_cfg(dir, &["-t"], cfg);
    assert_eq!(
        checked.status.code(),
        Some(0),
        "-t should accept the cfg:\n{}",
        checked.stderr
    );
    let warnings: Vec<&str> = checked
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(warnings, [want], "stderr:\n{}", checked.stderr);
    let strict = run_cfg(dir, &["-t", "--strict"], cfg);
    assert_eq!(
        strict.status.code(),
        Some(1),
        "-t --strict should refuse the cfg:\n{}",
        strict.stderr
    );
    let error = format!(
        "3proxy: {} (an error with --strict)",
        want.strip_prefix("3proxy: warning: ").unwrap()
    );
    assert!(
        strict.stderr.lines().any(|l| l == error),
        "want {error:?} in:\n{}",
        strict.stderr
    );
    assert!(!strict.stderr.contains("warning"), "{}", strict.stderr);
}

/// `-t` exits 0 and prints no warning.
fn check_clean(dir: &Dir, cfg: &str) {
    for flags in [&["-t"][..], &["-t", "--strict"]] {
        let r = run_cfg(dir, flags, cfg);
        assert_eq!(r.status.code(), Some(0), "{flags:?}:\n{}", r.stderr);
        assert!(!r.stderr.contains("warning"), "{}", r.stderr);
    }
}

fn tcppm(port: u16, to: u16) -> String {
    format!("tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

#[test]
fn rotate_random_is_read_as_0_and_serves() {
    let dir = Dir::new("len_rotate");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("rotate random\n{}", tcppm(port, origin.port()));
    let want = warning(
        &dir.cfg_path(),
        1,
        "rotate",
        "'random' is not a number; read as 0, as 3proxy reads it",
    );
    check_warns(&dir, &cfg, &want);
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"rotate 0");
    assert!(
        wait_for(|| proxy.stderr().contains(&want), START_TIMEOUT),
        "{}",
        proxy.stderr()
    );
}

/// Every command whose number 3proxy reads with atoi and where the 0 (or
/// prefix) it reads is harmless: a warning with the value read.
#[test]
fn atoi_arguments_warn_with_the_value_read() {
    let cases = [
        (
            "backlog many",
            "backlog",
            "'many' is not a number; read as 0, as 3proxy reads it",
        ),
        (
            "stacksize big",
            "stacksize",
            "'big' is not a number; read as 0, as 3proxy reads it",
        ),
        (
            "maxseg 1400b",
            "maxseg",
            "'1400b' is not a number; read as 1400, as 3proxy reads it",
        ),
        (
            "logdump x",
            "logdump",
            "'x' is not a number; read as 0, as 3proxy reads it",
        ),
        (
            "logdump 10 y",
            "logdump",
            "'y' is not a number; read as 0, as 3proxy reads it",
        ),
        (
            "authcache user 60s",
            "authcache",
            "'60s' is not a number; read as 60, as 3proxy reads it",
        ),
        (
            "parentretries x",
            "parentretries",
            "'x' is not a number; 3proxy reads it as 0 and ignores it: the retries stay 2",
        ),
    ];
    let port = free_port();
    for (i, (line, command, why)) in cases.iter().enumerate() {
        let dir = Dir::new(&format!("len_atoi{i}"));
        let cfg = format!("{line}\n{}", tcppm(port, 9));
        check_warns(&dir, &cfg, &warning(&dir.cfg_path(), 1, command, why));
    }
    // `weight` modifies the last ACL entry.
    let dir = Dir::new("len_atoi_weight");
    let cfg = format!("allow *\nweight heavy\n{}", tcppm(port, 9));
    let why = "'heavy' is not a number; read as 0, as 3proxy reads it";
    check_warns(&dir, &cfg, &warning(&dir.cfg_path(), 2, "weight", why));
}

/// Where 3proxy's atoi gives 0 and 0 is refused (by 3proxy too) or would
/// be dangerous: still an error, which names the value.
#[test]
fn atoi_arguments_that_stay_errors() {
    let port = free_port();
    for (i, (line, command)) in [
        ("maxconn lots", "maxconn"),
        ("timeouts 1 x", "timeouts"),
        ("nscache big", "nscache"),
        ("allow *\nparent x socks5 127.0.0.1 1080", "parent"),
        ("allow *\nparent 1000 socks5 127.0.0.1 port", "parent"),
        ("bandlimin fast *", "bandlimin"),
    ]
    .iter()
    .enumerate()
    {
        let dir = Dir::new(&format!("len_atoi_err{i}"));
        let cfg = format!("{line}\n{}", tcppm(port, 9));
        let at = line.lines().count();
        run_cfg(&dir, &["-t"], &cfg).assert_cfg_error(&dir.cfg_path(), at, command);
    }
}

#[test]
fn internal_localhost_listens_on_127_0_0_1() {
    let dir = Dir::new("len_int_name");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "internal localhost\ntcppm {port} 127.0.0.1 {}\n",
        origin.port()
    );
    let want = warning(
        &dir.cfg_path(),
        1,
        "internal",
        "'localhost' is a host name, not an address; resolved once, now, to 127.0.0.1, as 3proxy does",
    );
    check_warns(&dir, &cfg, &want);
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"internal localhost");
}

#[test]
fn service_option_i_and_e_take_host_names() {
    let dir = Dir::new("len_opt_name");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "tcppm -ilocalhost -elocalhost {port} 127.0.0.1 {}\n",
        origin.port()
    );
    let checked = run_cfg(&dir, &["-t"], &cfg);
    assert_eq!(checked.status.code(), Some(0), "{}", checked.stderr);
    let at = format!("{}:1: tcppm: ", dir.cfg_path().display());
    let name = "'localhost' is a host name, not an address; resolved once, now, to 127.0.0.1, as 3proxy does";
    let want = [
        format!("3proxy: warning: {at}-i: {name}"),
        format!("3proxy: warning: {at}-e: {name}"),
    ];
    let got: Vec<&str> = checked
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(got, want, "{}", checked.stderr);
    let strict = run_cfg(&dir, &["-t", "--strict"], &cfg);
    assert_eq!(strict.status.code(), Some(1), "{}", strict.stderr);
    assert!(
        strict
            .stderr
            .contains(&format!("{at}-i: {name} (an error with --strict)")),
        "{}",
        strict.stderr
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"-ilocalhost");
    assert!(origin.peers().iter().all(|a| a.ip() == localhost(0).ip()));
}

#[test]
fn external_host_name_is_the_source_address() {
    let dir = Dir::new("len_ext_name");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("external localhost\n{}", tcppm(port, origin.port()));
    let want = warning(
        &dir.cfg_path(),
        1,
        "external",
        "'localhost' is a host name, not an address; resolved once, now, to 127.0.0.1, as 3proxy does",
    );
    check_warns(&dir, &cfg, &want);
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"external localhost");
    assert!(origin.peers().iter().all(|a| a.ip() == localhost(0).ip()));
}

#[test]
fn internal_name_that_does_not_resolve_is_an_error() {
    // 3proxy would keep the previous address (here every interface).
    let dir = Dir::new("len_int_bad");
    let cfg = format!("internal no-such-host.invalid\n{}", tcppm(free_port(), 9));
    let msg = run_cfg(&dir, &["-t"], &cfg).assert_cfg_error(&dir.cfg_path(), 1, "internal");
    assert!(msg.contains("does not resolve"), "{msg}");
}

/// A port free on both 127.0.0.1 and ::1.
fn free_port_46() -> u16 {
    loop {
        let port = free_port();
        if TcpListener::bind(("::1", port)).is_ok() {
            return port;
        }
    }
}

/// The proxy on `[::]:port` serves an IPv4 client on 127.0.0.1 and an
/// IPv6 client on ::1.
fn serves_both_families(proxy: &Proxy, port: u16) {
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    echo_roundtrip(&mut connect(localhost(port)), b"over IPv4");
    echo_roundtrip(&mut connect(v6), b"over IPv6");
    let _ = proxy;
}

#[test]
fn internal_ipv6_wildcard_is_dual_stack() {
    let dir = Dir::new("len_dual");
    let origin = Origin::echo();
    let port = free_port_46();
    let cfg = format!("internal ::\ntcppm {port} 127.0.0.1 {}\n", origin.port());
    check_clean(&dir, &cfg);
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(v6)]);
    serves_both_families(&proxy, port);
}

#[test]
fn internal_three_colons_is_the_ipv6_wildcard() {
    let dir = Dir::new("len_colons");
    let origin = Origin::echo();
    let port = free_port_46();
    let cfg = format!("internal :::\ntcppm {port} 127.0.0.1 {}\n", origin.port());
    let want = warning(
        &dir.cfg_path(),
        1,
        "internal",
        "':::' is not an IPv6 address; listening on '::' (every IPv6 and IPv4 address), as 3proxy does",
    );
    check_warns(&dir, &cfg, &want);
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(v6)]);
    serves_both_families(&proxy, port);
}

#[test]
fn ipv6_only_wildcard_with_ol_v6only() {
    let dir = Dir::new("len_v6only");
    let origin = Origin::echo();
    let port = free_port_46();
    let cfg = format!(
        "tcppm -i:: -olIPV6_V6ONLY {port} 127.0.0.1 {}\n",
        origin.port()
    );
    check_clean(&dir, &cfg);
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(v6)]);
    echo_roundtrip(&mut connect(v6), b"over IPv6");
    assert!(
        std::net::TcpStream::connect_timeout(&localhost(port), IO_TIMEOUT).is_err(),
        "an IPv6-only listener took an IPv4 client"
    );
}

/// A 3proxy with `log` in `FMT` and `body`, ready on `port`.
fn logged(name: &str, body: &str, port: u16) -> (Proxy, PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("access.log");
    let cfg = format!("log {}\nlogformat \"L%N %E %U %T\"\n{body}", p(&log));
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    (proxy, log)
}

#[test]
fn parent_trailing_comment_is_the_user_as_in_3proxy() {
    // 3proxy's `parent` takes any number of words: the 5th is the user
    // name, the 6th the password, the rest is ignored.
    let origin = Origin::echo();
    let (pb, pa) = (free_port(), free_port());
    let (_b, log_b) = logged("len_par_b", &format!("socks -i127.0.0.1 -p{pb}\n"), pb);
    let dir = Dir::new("len_par_a");
    let cfg = format!(
        "allow *\nparent 1000 socks4 127.0.0.1 {pb} //parent B\n{}",
        tcppm(pa, origin.port())
    );
    let want = warning(
        &dir.cfg_path(),
        2,
        "parent",
        "3proxy takes '//parent' as the user name and 'B' as the password, and so do we (a comment must be a line of its own)",
    );
    check_warns(&dir, &cfg, &want);
    let _a = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(pa))]);
    echo_roundtrip(&mut connect(localhost(pa)), b"through B");
    // A SOCKS4 parent is sent the user name: the one 3proxy would send.
    expect_log_line(
        &log_b,
        &format!("SOCK4 00000 //parent CONNECT 127.0.0.1:{}", origin.port()),
    );

    // Words after the password: ignored.
    let dir = Dir::new("len_par_c");
    let cfg = format!(
        "allow *\nparent 1000 socks5 127.0.0.1 {pb} u p # via B\n{}",
        tcppm(free_port(), 9)
    );
    let want = warning(
        &dir.cfg_path(),
        2,
        "parent",
        "3proxy ignores '# via B' after the password, and so do we (a comment must be a line of its own)",
    );
    check_warns(&dir, &cfg, &want);
}

#[test]
fn no_service_idles_and_stops_on_sigterm() {
    let dir = Dir::new("len_idle");
    let cfg = "# proxy -p3128\n#socks\nmaxconn 10\n";
    let want = format!(
        "3proxy: warning: {}: no service is started (no service line such as 'proxy' or 'tcppm'); idling, as 3proxy does",
        dir.cfg_path().display()
    );
    let checked = run_cfg(&dir, &["-t"], cfg);
    assert_eq!(checked.status.code(), Some(0), "{}", checked.stderr);
    let warnings: Vec<&str> = checked
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(warnings, [want.as_str()], "{}", checked.stderr);
    let strict = run_cfg(&dir, &["-t", "--strict"], cfg);
    assert_eq!(strict.status.code(), Some(1), "{}", strict.stderr);
    assert!(
        strict.stderr.contains("no service is started") && strict.stderr.contains("--strict"),
        "{}",
        strict.stderr
    );

    let mut proxy = Proxy::start(dir, cfg, &[]);
    assert!(
        wait_for(|| proxy.stderr().contains(&want), START_TIMEOUT),
        "{}",
        proxy.stderr()
    );
    assert!(proxy.is_running(), "exited: {}", proxy.stderr());
    proxy.signal("TERM");
    let status = proxy.wait_exit(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", proxy.stderr());
}

#[test]
fn strict_refuses_when_serving_too() {
    let dir = Dir::new("len_strict_serve");
    let port = free_port();
    let cfg = format!("rotate random\n{}", tcppm(port, 9));
    let r = run_cfg(&dir, &["--strict"], &cfg);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    r.assert_cfg_error(&dir.cfg_path(), 1, "rotate");
    assert!(std::net::TcpStream::connect(localhost(port)).is_err());
}

#[test]
fn reload_warns_and_strict_reload_keeps_the_running_cfg() {
    let origin = Origin::echo();
    let (p1, p2) = (free_port(), free_port());
    // Without --strict: the new cfg loads, its warning logged.
    let dir = Dir::new("len_reload");
    let proxy = Proxy::start(
        dir,
        &tcppm(p1, origin.port()),
        &[Listen::Tcp(localhost(p1))],
    );
    let text = format!("rotate random\n{}", tcppm(p2, origin.port()));
    proxy.dir.write("3proxy.cfg", &text);
    proxy.signal("USR1");
    let want = format!(
        "3proxy: warn: reload: {}:1: rotate: 'random' is not a number; read as 0, as 3proxy reads it",
        proxy.dir.cfg_path().display()
    );
    assert!(
        wait_for(
            || std::net::TcpStream::connect(localhost(p2)).is_ok(),
            START_TIMEOUT
        ),
        "the reloaded cfg never served:\n{}",
        proxy.stderr()
    );
    assert!(
        wait_for(|| proxy.stderr().lines().any(|l| l == want), START_TIMEOUT),
        "{}",
        proxy.stderr()
    );
    echo_roundtrip(&mut connect(localhost(p2)), b"reloaded");
    drop(proxy);

    // With --strict: refused, and the running cfg stays.
    let (p3, p4) = (free_port(), free_port());
    let dir = Dir::new("len_reload_strict");
    let proxy = Proxy::start_with_flags(
        dir,
        &["--strict"],
        &tcppm(p3, origin.port()),
        &[Listen::Tcp(localhost(p3))],
    );
    let text = format!("rotate random\n{}", tcppm(p4, origin.port()));
    proxy.dir.write("3proxy.cfg", &text);
    proxy.signal("USR1");
    let want = format!(
        "3proxy: error: reload: {}:1: rotate: 'random' is not a number; read as 0, as 3proxy reads it (an error with --strict); the running configuration stays",
        proxy.dir.cfg_path().display()
    );
    assert!(
        wait_for(|| proxy.stderr().lines().any(|l| l == want), START_TIMEOUT),
        "{}",
        proxy.stderr()
    );
    echo_roundtrip(&mut connect(localhost(p3)), b"still the old cfg");
    assert!(std::net::TcpStream::connect(localhost(p4)).is_err());
}

#[test]
fn port_mapper_ports_are_read_as_atoi_reads_them() {
    let dir = Dir::new("len_tcppm_port");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!("tcppm -i127.0.0.1 {port}/tcp 127.0.0.1 {}\n", origin.port());
    let want = warning(
        &dir.cfg_path(),
        1,
        "tcppm",
        &format!("LPORT: '{port}/tcp' is not a number; read as {port}, as 3proxy reads it"),
    );
    check_warns(&dir, &cfg, &want);
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"8080/tcp");
    // A word atoi reads as 0: 3proxy refuses it too.
    let dir = Dir::new("len_tcppm_port0");
    let cfg = format!("tcppm -i127.0.0.1 {port} 127.0.0.1 http\n");
    run_cfg(&dir, &["-t"], &cfg).assert_cfg_error(&dir.cfg_path(), 1, "tcppm");
}

#[test]
fn users_words_without_a_colon_warn_once_for_the_line() {
    // 3proxy skips such a word without a word; a hundred of them are one
    // warning naming the line, not a hundred without one.
    let dir = Dir::new("len_users_colon");
    let origin = Origin::echo();
    let port = free_port();
    let junk: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let cfg = format!(
        "users {} alice:CL:pw\nauth strong\nallow alice\n{}",
        junk.join(" "),
        tcppm(port, origin.port())
    );
    let want = warning(
        &dir.cfg_path(),
        1,
        "users",
        "'w0' has no ':' and is skipped (and 99 more entries skipped)",
    );
    check_warns(&dir, &cfg, &want);
}

#[test]
fn lines_starting_with_a_vertical_tab_or_form_feed_are_skipped() {
    // C's isspace(), which 3proxy's reader uses, is true for both.
    let dir = Dir::new("len_vt_ff");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "\x0bnot a command\n\x0calso not one\n{}",
        tcppm(port, origin.port())
    );
    check_clean(&dir, &cfg);
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    echo_roundtrip(&mut connect(localhost(port)), b"after vt and ff");
}

#[test]
fn a_dollar_file_over_1_mib_is_an_error_naming_the_line() {
    let dir = Dir::new("len_dollar_big");
    let mut big = "alice:CL:pw ".repeat((1 << 20) / 12 + 1).into_bytes();
    big.truncate((1 << 20) + 1);
    let list = dir.write("users.txt", &big);
    let cfg = format!(
        "# big list\nusers ${}\nproxy -p{}\n",
        list.display(),
        free_port()
    );
    let r = run_cfg(&dir, &["-t"], &cfg);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    let want = format!(
        "3proxy: {}:2: users: ${}: the file is larger than 1 MiB, the most a $FILE may hold",
        dir.cfg_path().display(),
        list.display()
    );
    assert!(
        r.stderr.lines().any(|l| l == want),
        "want {want:?} in:\n{}",
        r.stderr
    );
    // One byte less loads.
    big.truncate(1 << 20);
    dir.write("users.txt", &big);
    let r = run_cfg(&dir, &["-t"], &cfg);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
}
