//! The access log: one line per finished session, `logformat` escapes, the
//! default format, the clock letter, per-service `-l` and `-f`, and stdout.
//!
//! Every session here sends 5 bytes ("hello") and gets 11 back ("hello
//! world"). Other lines (the readiness probe's session, service events) may
//! be in the log too, so tests look for their line rather than count lines.

use std::io::Write;
use std::net::Shutdown;
use std::time::{Duration, SystemTime};

use crate::util::*;

fn tcppm(opts: &str, port: u16, to: u16) -> String {
    format!("tcppm {opts} -i127.0.0.1 {port} 127.0.0.1 {to}\n")
}

fn hello_origin() -> Origin {
    Origin::reply_after_eof(b"hello world", Duration::ZERO).0
}

/// One session through 127.0.0.1:`port`: "hello" out, "hello world" back.
/// Returns the client's port (what %c shows).
fn hello_session(port: u16) -> u16 {
    let mut c = connect(localhost(port));
    let client_port = c.local_addr().unwrap().port();
    c.write_all(b"hello").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let reply = read_until_closed(&mut c).expect("read the reply");
    assert_eq!(String::from_utf8_lossy(&reply), "hello world");
    client_port
}

#[test]
fn logformat_fields_for_a_tcppm_session() {
    let dir = Dir::new("log_fields");
    let log = dir.join("access.log");
    let origin = hello_origin();
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %p %E %U %C %R:%r %O %I\"\n{}",
        p(&log),
        tcppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    hello_session(port);
    expect_log_line(
        &log,
        &format!(
            "TCPPM {port} 00000 - 127.0.0.1 127.0.0.1:{} 5 11",
            origin.port()
        ),
    );
}

#[test]
fn client_port_host_and_percent_escapes() {
    let dir = Dir::new("log_escapes");
    let log = dir.join("access.log");
    let origin = hello_origin();
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%c %n 100%% %O/%I\"\n{}",
        p(&log),
        tcppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let client_port = hello_session(port);
    expect_log_line(&log, &format!("{client_port} 127.0.0.1 100% 5/11"));
}

#[test]
fn default_format_shape() {
    let dir = Dir::new("log_default");
    let log = dir.join("access.log");
    let origin = hello_origin();
    let port = free_port();
    let cfg = format!("log {}\n{}", p(&log), tcppm("", port, origin.port()));
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);

    let before = utc_stamp(SystemTime::now());
    let client_port = hello_session(port);
    let me = format!(" 127.0.0.1:{client_port} ");
    let line = read_log_line(&log, &format!("containing {me:?}"), |l| l.contains(&me));
    let after = utc_stamp(SystemTime::now() + Duration::from_secs(1));

    // G%y%m%d%H%M%S.%. %p %E %U %C:%c %R:%r %O %I %h %T
    let f: Vec<&str> = line.split_whitespace().collect();
    assert!(f.len() >= 9, "too few fields in {line:?}");
    let (stamp, millis) = f[0]
        .split_once('.')
        .unwrap_or_else(|| panic!("time stamp in {line:?}"));
    assert!(
        stamp.len() == 12 && stamp.bytes().all(|b| b.is_ascii_digit()),
        "yymmddHHMMSS in {line:?}"
    );
    assert!(
        millis.len() == 3 && millis.bytes().all(|b| b.is_ascii_digit()),
        "milliseconds in {line:?}"
    );
    assert!(
        before.as_str() <= stamp && stamp <= after.as_str(),
        "time stamp {stamp} is not UTC now ({before}..{after}): {line:?}"
    );
    let origin_addr = format!("127.0.0.1:{}", origin.port());
    let client_addr = format!("127.0.0.1:{client_port}");
    let want = [
        port.to_string().as_str(),
        "00000",
        "-",
        client_addr.as_str(),
        origin_addr.as_str(),
        "5",
        "11",
        "0",
    ]
    .map(str::to_string);
    assert_eq!(f[1..9], want, "fields after the time stamp in {line:?}");
}

#[test]
fn per_service_log_file_and_format() {
    let dir = Dir::new("log_per_service");
    let global = dir.join("global.log");
    let own = dir.join("own.log");
    let origin = hello_origin();
    let (port1, port2, port3) = (free_port(), free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"Lglobal %p %O %I\"\n{}{}{}",
        p(&global),
        tcppm(&format!("-l{}", p(&own)), port1, origin.port()),
        tcppm("\"-fLformat %p %O %I\"", port2, origin.port()),
        tcppm(
            &format!("-l{} \"-fLboth %p %O %I\"", p(&own)),
            port3,
            origin.port()
        ),
    );
    let ready = [port1, port2, port3].map(|p| Listen::Tcp(localhost(p)));
    let _proxy = Proxy::start(dir, &cfg, &ready);

    hello_session(port1);
    hello_session(port2);
    hello_session(port3);
    expect_log_line(&own, &format!("global {port1} 5 11"));
    expect_log_line(&global, &format!("format {port2} 5 11"));
    expect_log_line(&own, &format!("both {port3} 5 11"));
    // -l moves a service's lines out of the global log.
    let strays: Vec<String> = log_lines(&global)
        .into_iter()
        .filter(|l| l.contains(&format!(" {port1} 5 11")) || l.contains(&format!(" {port3} 5 11")))
        .collect();
    assert!(
        strays.is_empty(),
        "lines of -l services in the global log: {strays:?}"
    );
    let strays: Vec<String> = log_lines(&own)
        .into_iter()
        .filter(|l| l.contains(&format!(" {port2} ")))
        .collect();
    assert!(
        strays.is_empty(),
        "lines of another service in the -l file: {strays:?}"
    );
}

#[test]
fn log_without_a_file_goes_to_stdout() {
    let dir = Dir::new("log_stdout");
    let origin = hello_origin();
    let port = free_port();
    let cfg = format!(
        "log\nlogformat \"L%N %p %O %I\"\n{}",
        tcppm("", port, origin.port())
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    hello_session(port);
    let want = format!("TCPPM {port} 5 11");
    assert!(
        wait_for(|| proxy.stdout().lines().any(|l| l == want), LOG_TIMEOUT),
        "no line {want:?} on stdout:\n{}",
        proxy.stdout()
    );
}

#[test]
fn log_appends_to_an_existing_file() {
    let dir = Dir::new("log_append");
    let log = dir.write("access.log", "an older line\n");
    let origin = hello_origin();
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %O %I\"\n{}",
        p(&log),
        tcppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    hello_session(port);
    expect_log_line(&log, "TCPPM 5 11");
    assert_eq!(
        log_lines(&log)[0],
        "an older line",
        "the old content must stay"
    );
}

#[test]
fn g_stamps_utc_and_other_letters_local_time() {
    let dir = Dir::new("log_clock");
    let log = dir.join("access.log");
    let origin = hello_origin();
    let (port_local, port_utc) = (free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"L%H%M local\"\n{}{}",
        p(&log),
        tcppm("", port_local, origin.port()),
        tcppm("\"-fG%H%M utc\"", port_utc, origin.port()),
    );
    // POSIX TZ: a zone named XXX five hours east of UTC.
    let ready = [port_local, port_utc].map(|p| Listen::Tcp(localhost(p)));
    let _proxy = Proxy::start_with_env(dir, &cfg, &ready, &[("TZ", "XXX-5")]);

    let before = utc_stamp(SystemTime::now());
    hello_session(port_local);
    hello_session(port_utc);
    let local = read_log_line(&log, "ending in \" local\"", |l| l.ends_with(" local"));
    let utc = read_log_line(&log, "ending in \" utc\"", |l| l.ends_with(" utc"));
    let after = utc_stamp(SystemTime::now());
    if before[6..10] != after[6..10] {
        eprintln!("the minute turned during the test; not comparing clocks");
        return;
    }
    let minutes = |s: &str| -> i32 {
        let hhmm: i32 = s[..4].parse().unwrap_or_else(|_| panic!("HHMM in {s:?}"));
        hhmm / 100 * 60 + hhmm % 100
    };
    assert_eq!(&utc[..4], &before[6..10], "G must stamp UTC: {utc:?}");
    let shift = (minutes(&local) - minutes(&utc)).rem_euclid(24 * 60);
    assert_eq!(
        shift,
        5 * 60,
        "L must stamp local time (TZ=XXX-5): {local:?} vs {utc:?}"
    );
}

/// `logdump IN OUT`: a session that moves more than IN bytes from the
/// server writes a record each time, and the final record counts only
/// what came after the last one, so the records add up to the session.
#[test]
fn logdump_writes_intermediate_records() {
    let dir = Dir::new("logdump");
    let log = dir.join("access.log");
    let total: u64 = 8 * BLOCK as u64;
    let (origin, _rx) = Origin::hash_sink(total, 3);
    let port = free_port();
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %c %O %I\"\nlogdump 100000 0\n{}",
        p(&log),
        tcppm("", port, origin.port())
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = connect(localhost(port));
    let me = s.local_addr().unwrap().port();
    s.write_all(b"hello").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let got = hash_to_eof(&mut s).unwrap();
    assert_eq!(got.bytes, total);
    drop(s);
    // This session's records with data, picked by the client's port (the
    // readiness probe's session may have carried some of the origin's
    // bytes too): "TCPPM 00000 PORT OUT IN".
    let mine = format!("TCPPM 00000 {me} ");
    let mut records = Vec::new();
    let done = wait_for(
        || {
            records = log_lines(&log)
                .into_iter()
                .filter(|l| l.starts_with(&mine) && !l.ends_with(" 0 0"))
                .collect();
            let sum: u64 = records
                .iter()
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum();
            sum == total
        },
        LOG_TIMEOUT,
    );
    assert!(done, "records do not add up to {total}: {records:?}");
    assert!(
        records.len() >= 3,
        "want at least two intermediate records: {records:?}"
    );
    let inb: Vec<u64> = records
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        inb[..inb.len() - 1].iter().all(|&n| n >= 100_000),
        "{records:?}"
    );
    let outb: u64 = records
        .iter()
        .map(|l| l.split(' ').nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(outb, 5, "client bytes counted once: {records:?}");
}

/// A plain `-l` (no file name) sends the service's records to standard
/// output, even when the global `log` names a file.
#[test]
fn per_service_plain_l_logs_to_stdout() {
    let dir = Dir::new("log_dash_l_stdout");
    let global = dir.join("global.log");
    let origin = hello_origin();
    let (own, other) = (free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"L%N %p %O %I\"\n{}{}",
        p(&global),
        tcppm("-l", own, origin.port()),
        tcppm("", other, origin.port())
    );
    let ready = [own, other].map(|p| Listen::Tcp(localhost(p)));
    let proxy = Proxy::start(dir, &cfg, &ready);
    hello_session(own);
    hello_session(other);
    let want = format!("TCPPM {own} 5 11");
    assert!(
        wait_for(|| proxy.stdout().lines().any(|l| l == want), LOG_TIMEOUT),
        "no line {want:?} on stdout:\n{}",
        proxy.stdout()
    );
    expect_log_line(&global, &format!("TCPPM {other} 5 11"));
    assert!(
        !log_lines(&global).iter().any(|l| l == &want),
        "the -l service's record went to the global log"
    );
    assert!(
        !proxy.stdout().contains(&format!("TCPPM {other} ")),
        "the other service's record went to stdout"
    );
}
