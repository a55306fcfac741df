//! Connect-back (`-r` / `-R`): a `socks` service that does not listen but
//! dials a `tcppm -R` relay in another process, published through the
//! relay's port; the ACL on back-connections; a relay without a
//! back-connection.

use std::io::Read;
use std::thread;
use std::time::{Duration, Instant};

use crate::socks::{curl, http_origin};
use crate::util::*;

const FMT: &str = "L%N %E %T";

/// CONNECTBACK (slot 10) at 1 s so the failure cases end quickly.
const TIMEOUTS: &str = "timeouts 1 5 30 60 180 1800 15 60 15 1 5\n";

/// The relay: `tcppm -R127.0.0.1:BACK LPORT ...`, ready on LPORT. Its
/// target is never dialed: server sockets are back-connections.
fn relay(name: &str, pre: &str, back: u16, lport: u16) -> (Proxy, std::path::PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"{FMT}\"\n{TIMEOUTS}{pre}tcppm -i127.0.0.1 -R127.0.0.1:{back} {lport} 127.0.0.1 9\n",
        p(&log)
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(lport))]);
    (proxy, log)
}

/// The hidden service: `socks -r127.0.0.1:BACK`; it listens nowhere.
fn hidden(name: &str, back: u16) -> (Proxy, std::path::PathBuf) {
    let dir = Dir::new(name);
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"{FMT}\"\n{TIMEOUTS}socks -r127.0.0.1:{back}\n",
        p(&log)
    );
    (Proxy::start(dir, &cfg, &[]), log)
}

#[test]
fn socks_published_through_a_tcppm_relay() {
    let origin = http_origin("127.0.0.1:0");
    let (back, lport) = (free_port(), free_port());
    let (_relay, relay_log) = relay("cb_relay", "", back, lport);
    let (_hidden, hidden_log) = hidden("cb_hidden", back);

    let url = format!("http://127.0.0.1:{}/cb", origin.port());
    let proxy = format!("socks5://127.0.0.1:{lport}");
    assert_eq!(curl(&proxy, &url).unwrap(), "hello /cb");
    expect_log_line(
        &hidden_log,
        &format!("SOCK5 00000 CONNECT 127.0.0.1:{}", origin.port()),
    );
    expect_log_line(&relay_log, "TCPPM 00000 127.0.0.1");

    // Several clients at once: each takes its own back-connection, and
    // the hidden side dials the next as soon as one is taken.
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let (proxy, url) = (proxy.clone(), format!("{url}{i}"));
            thread::spawn(move || curl(&proxy, &url))
        })
        .collect();
    for (i, w) in workers.into_iter().enumerate() {
        assert_eq!(w.join().unwrap().unwrap(), format!("hello /cb{i}"));
    }
}

#[test]
fn the_hidden_side_waits_for_the_relay() {
    // The hidden service starts first and keeps dialing until the relay
    // is up.
    let origin = http_origin("127.0.0.1:0");
    let (back, lport) = (free_port(), free_port());
    let (_hidden, _) = hidden("cb_first_hidden", back);
    thread::sleep(Duration::from_millis(300));
    let (_relay, _) = relay("cb_late_relay", "", back, lport);
    let url = format!("http://127.0.0.1:{}/late", origin.port());
    let proxy = format!("socks5://127.0.0.1:{lport}");
    assert_eq!(curl(&proxy, &url).unwrap(), "hello /late");
}

#[test]
fn back_connections_must_pass_the_acl() {
    // The ACL allows the client's CONNECT to the mapped target
    // (127.0.0.1:9) but no back-connection (they come from ephemeral
    // ports): the client is closed with code 13.
    let (back, lport) = (free_port(), free_port());
    let (_relay, relay_log) = relay("cb_acl_relay", "allow * * 127.0.0.1 9\n", back, lport);
    let (_hidden, _) = hidden("cb_acl_hidden", back);
    // The readiness probe made a session too; wait for its record.
    read_log_line(&relay_log, "the probe's record", |l| l.contains("00013"));
    let mut c = connect(localhost(lport));
    set_timeouts(&c, Duration::from_secs(20));
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(buf.is_empty());
    // The client's record is written after its connection is closed.
    let refused = || {
        log_lines(&relay_log)
            .iter()
            .filter(|l| l.contains("TCPPM 00013 Connect back ACL failed"))
            .count()
    };
    assert!(
        wait_for(|| refused() >= 2, LOG_TIMEOUT),
        "{:?}",
        log_lines(&relay_log)
    );
}

#[test]
fn no_back_connection_ends_with_13() {
    let (back, lport) = (free_port(), free_port());
    let (_relay, relay_log) = relay("cb_none", "", back, lport);
    let started = Instant::now();
    let mut c = connect(localhost(lport));
    set_timeouts(&c, Duration::from_secs(20));
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    // One wait of CONNECTBACK (1 s): the tries are for back-connections
    // that fail, not for waiting longer.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(buf.is_empty());
    read_log_line(&relay_log, "the client's record", |l| {
        l.contains("TCPPM 00013 Connect back not received")
    });
}

#[test]
fn connect_back_options_are_checked() {
    let dir = Dir::new("cb_opts");
    let out = run_check(&dir, "socks -rnowhere\n");
    assert!(!out.status.success(), "{}", out.stderr);
    let dir = Dir::new("cb_opts_R");
    let out = run_check(&dir, "socks -R127.0.0.1:1080\n");
    assert!(out.stderr.contains("tcppm"), "{}", out.stderr);
    let dir = Dir::new("cb_opts_ok");
    let out = run_check(
        &dir,
        "socks -r127.0.0.1:1080 -orSO_KEEPALIVE\ntcppm -R127.0.0.1:1081 -oRTCP_NODELAY 1082 127.0.0.1 80\n",
    );
    assert!(out.status.success(), "{}", out.stderr);
}
