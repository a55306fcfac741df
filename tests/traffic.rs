//! TrafficPlugin: `trafcorrect` rules correct the bytes a record says
//! (%I, %O) and what the counters take.
//!
//! The sessions are lock-step, so that the reads of the server and the
//! writes to it are known: the origin greets (one read), the client sends
//! one message (one write) and the origin answers it with one write (a
//! second read), then both close.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use crate::util::*;

const FMT: &str = "L%N %c %I %O";
const GREETING: usize = 50;
const ASK: usize = 100;
const ANSWER: usize = 300;
/// What the client gets (%I) and sends (%O) in a plain record.
const IN: u64 = (GREETING + ANSWER) as u64;
const OUT: u64 = ASK as u64;
/// The server was read from twice and written to once, through one
/// connection.
const READS: u64 = 2;
const WRITES: u64 = 1;
const CONNECTS: u64 = 1;

/// The origin's side of the lock-step session.
fn lockstep_origin() -> Origin {
    Origin::start("127.0.0.1:0", |mut s| {
        if s.write_all(&[b'g'; GREETING]).is_err() {
            return;
        }
        let mut ask = [0u8; ASK];
        if s.read_exact(&mut ask).is_err() {
            return;
        }
        let _ = s.write_all(&[b'a'; ANSWER]);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let _ = s.shutdown(Shutdown::Both);
    })
}

/// The client's side: one lock-step session through `port`; its local
/// port (the record's %c).
fn lockstep_session(port: u16) -> u16 {
    let mut c = connect(localhost(port));
    set_timeouts(&c, IO_TIMEOUT);
    let mut greeting = [0u8; GREETING];
    c.read_exact(&mut greeting).expect("the greeting");
    c.write_all(&[b'q'; ASK]).unwrap();
    let mut answer = [0u8; ANSWER];
    c.read_exact(&mut answer).expect("the answer");
    c.shutdown(Shutdown::Write).unwrap();
    assert!(read_until_closed(&mut c).unwrap().is_empty());
    c.local_addr().unwrap().port()
}

/// A tcppm to the lock-step origin after `pre` (the plugin and its
/// rules, where `{origin}` and `{port}` stand for the origin's port and
/// the service's): the record of one session, as "IN OUT".
fn tcppm_record(name: &str, pre: &str) -> (String, Proxy) {
    let origin = lockstep_origin();
    let port = free_port();
    let pre = pre
        .replace("{origin}", &origin.port().to_string())
        .replace("{port}", &port.to_string());
    let body = format!(
        "{pre}tcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        origin.port()
    );
    let (proxy, log) = start(Dir::new(name), FMT, &body, &[port]);
    let cport = lockstep_session(port);
    let rec = record_of(&log, FMT, cport);
    let fields: Vec<&str> = rec.split(' ').collect();
    assert_eq!(fields[0], "TCPPM", "{rec}");
    (format!("{} {}", fields[2], fields[3]), proxy)
}

const PLUGIN: &str = "plugin /usr/local/3proxy/libexec/TrafficPlugin.ld.so start\n";

#[test]
fn without_a_rule_a_record_says_what_the_session_carried() {
    let (rec, _p) = tcppm_record("traf_none", PLUGIN);
    assert_eq!(rec, format!("{IN} {OUT}"));
}

#[test]
fn trafcorrect_m_multiplies_both_counts_of_its_port() {
    // The port is the server's: a rule for the service's own port does
    // not match, the next one (the origin's) does.
    let (rec, _p) = tcppm_record(
        "traf_m",
        &format!(
            "{PLUGIN}trafcorrect m tcppm {{port}} 5\ntrafcorrect m tcppm {{origin}} 2\n\
             trafcorrect m tcppm 0 3\n"
        ),
    );
    assert_eq!(rec, format!("{} {}", 2 * IN, 2 * OUT));
}

#[test]
fn trafcorrect_rules_that_do_not_match_change_nothing() {
    let (rec, _p) = tcppm_record(
        "traf_nomatch",
        &format!(
            "{PLUGIN}trafcorrect m tcppm {{port}} 5\ntrafcorrect m proxy 0 2\n\
             trafcorrect m socks5 {{origin}} 2\ntrafcorrect p pop3p tcp 0\n\
             trafcorrect p * udp {{origin}}\n"
        ),
    );
    assert_eq!(rec, format!("{IN} {OUT}"));
}

#[test]
fn trafcorrect_p_adds_headers_per_read_write_and_connect() {
    let (rec, _p) = tcppm_record(
        "traf_p",
        &format!("{PLUGIN}trafcorrect p tcppm tcp {{origin}}\n"),
    );
    // 52 bytes a packet: each read, each write, 3 each way per connect.
    let inb = IN + (READS + 3 * CONNECTS) * 52;
    let out = OUT + (WRITES + 3 * CONNECTS) * 52;
    assert_eq!(rec, format!("{inb} {out}"));
    // Any service and port, another packet size.
    let (rec, _p) = tcppm_record("traf_p_any", &format!("{PLUGIN}trafcorrect p * tcp * 40\n"));
    let inb = IN + (READS + 3 * CONNECTS) * 40;
    let out = OUT + (WRITES + 3 * CONNECTS) * 40;
    assert_eq!(rec, format!("{inb} {out}"));
}

/// With `-s` a read is one splice() from the server's socket into the
/// pipe, a write one splice() from the pipe into it.
#[test]
fn trafcorrect_p_with_splice_counts_splice_calls() {
    let origin = lockstep_origin();
    let port = free_port();
    let body = format!(
        "{PLUGIN}trafcorrect p tcppm tcp 0\ntcppm -s -i127.0.0.1 {port} 127.0.0.1 {}\n",
        origin.port()
    );
    let (_proxy, log) = start(Dir::new("traf_p_splice"), FMT, &body, &[port]);
    let rec = record_of(&log, FMT, lockstep_session(port));
    let inb = IN + (READS + 3 * CONNECTS) * 52;
    let out = OUT + (WRITES + 3 * CONNECTS) * 52;
    assert!(rec.ends_with(&format!(" {inb} {out}")), "{rec}");
}

#[test]
fn the_counters_take_the_corrected_bytes() {
    let dir = Dir::new("traf_counters");
    let counters = dir.join("3proxy.counters");
    let origin = lockstep_origin();
    let port = free_port();
    let body = format!(
        "counter {}\ncountin 1/in D 100 * 127.0.0.1\ncountout 2/out D 100 * 127.0.0.1\n\
         {PLUGIN}trafcorrect m tcppm 0 2\ntcppm -i127.0.0.1 {port} 127.0.0.1 {}\n",
        p(&counters),
        origin.port()
    );
    let (_proxy, log) = start(dir, FMT, &body, &[port]);
    let rec = record_of(&log, FMT, lockstep_session(port));
    assert!(rec.ends_with(&format!(" {} {}", 2 * IN, 2 * OUT)), "{rec}");
    // 3proxy's plugin corrects before its log function counts: the
    // counters hold what the records say (the harness's probes of the
    // port are sessions too: the origin greets them).
    let sums = || {
        log_lines(&log).iter().fold((0, 0), |(i, o), l| {
            let f: Vec<u64> = l.split(' ').skip(2).map(|n| n.parse().unwrap()).collect();
            (i + f[0], o + f[1])
        })
    };
    let counted = || (counter_record(&counters, 1), counter_record(&counters, 2));
    assert!(
        wait_for(
            || {
                let (i, o) = sums();
                counted() == (Some(i), Some(o))
            },
            LOG_TIMEOUT
        ),
        "counters {:?}, the records {:?}",
        counted(),
        sums()
    );
}

/// An HTTP origin that answers every request with one write and closes.
fn http_origin() -> Origin {
    Origin::start("127.0.0.1:0", |mut s| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let body = [b'x'; 1000];
        let mut resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        resp.extend_from_slice(&body);
        let _ = s.write_all(&resp);
        let _ = s.shutdown(Shutdown::Both);
    })
}

#[test]
fn trafcorrect_p_counts_an_http_request() {
    // The same request through a proxy before the plugin line (no rules)
    // and one after it: the second record says 4 packets more each way
    // (one read of the response, one write of the request, 3 for the
    // connection).
    let origin = http_origin();
    let (plain, corrected) = (free_port(), free_port());
    let body = format!(
        "proxy -i127.0.0.1 -p{plain}\n{PLUGIN}trafcorrect p proxy tcp {}\n\
         proxy -i127.0.0.1 -p{corrected}\n",
        origin.port()
    );
    let (_proxy, log) = start(Dir::new("traf_http"), FMT, &body, &[plain, corrected]);
    let counts = |port: u16| {
        let s = TcpStream::connect(localhost(port)).unwrap();
        let cport = s.local_addr().unwrap().port();
        let mut h = HttpClient::on(s);
        let url = format!("http://127.0.0.1:{}/x", origin.port());
        let r = h.get(&url);
        assert!(r.status_line().contains("200"), "{r}");
        let rec = record_of(&log, FMT, cport);
        let f: Vec<u64> = rec.split(' ').skip(2).map(|n| n.parse().unwrap()).collect();
        (f[0], f[1])
    };
    let (inb, out) = counts(plain);
    assert!(inb > 1000 && out > 0);
    assert_eq!(counts(corrected), (inb + 4 * 52, out + 4 * 52));
}

#[test]
fn trafcorrect_needs_its_plugin_and_a_valid_rule() {
    let dir = Dir::new("traf_cfg");
    let cfg = dir.cfg_path();
    let f = run_check(&dir, "auth iponly\ntrafcorrect m tcppm 0 2\n");
    let msg = f.assert_cfg_error(&cfg, 2, "trafcorrect");
    assert!(msg.contains("TrafficPlugin"), "{msg}");
    // 3proxy's plugin refuses these (its return 2).
    for (rule, says) in [
        ("m tcppm 0 0", "coefficient"),
        ("m tcppm 0 101", "coefficient"),
        ("m tcppm 65536 2", "65535"),
        ("p tcppm tcp 0 0", "from 1"),
    ] {
        let f = run_check(&dir, &format!("{PLUGIN}\ntrafcorrect {rule}\n"));
        let msg = f.assert_cfg_error(&cfg, 3, "trafcorrect");
        assert!(msg.contains(says), "{rule}: {msg}");
    }
    // And its usage errors (return 1).
    let f = run_check(&dir, &format!("{PLUGIN}trafcorrect m tcppm 0\n"));
    f.assert_cfg_error(&cfg, 2, "trafcorrect");
    // What 3proxy's plugin takes as any service: a warning, an error
    // with --strict.
    let lenient = format!("{PLUGIN}trafcorrect m socks 0 2\ntcppm 0 127.0.0.1 1\n");
    let f = run_check(&dir, &lenient);
    assert!(f.status.success(), "{}", f.stderr);
    assert!(
        f.stderr
            .contains(&format!("{}:2: trafcorrect: 'socks' is none of", p(&cfg))),
        "{}",
        f.stderr
    );
    let f = run_cfg(&dir, &["-t", "--strict"], &lenient);
    f.assert_cfg_error(&cfg, 2, "trafcorrect");
    // A good rule after the plugin line: the file need not exist.
    let f = run_check(
        &dir,
        &format!(
            "{PLUGIN}trafcorrect m * * 1.1\ntrafcorrect p udppm udp 53 42\ntcppm 0 127.0.0.1 1\n"
        ),
    );
    assert!(f.status.success(), "{}", f.stderr);
}
