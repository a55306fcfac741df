//! The built-in resolver: `nserver` (UDP, `/tcp`, TCP after a truncated
//! answer, failing over), `nscache`, `nsrecord`, `fakeresolve`, `dialer`,
//! the `-6`/`-64`/`-46` families, and replies that must be dropped.
//!
//! A [`TestDns`] in each test answers from a table and counts the queries
//! it gets; tcppm sessions to a name show what the proxy resolved it to.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use simple_dns::rdata::{RData, A, AAAA, PTR};
use simple_dns::{Name, Packet, PacketFlag, ResourceRecord, CLASS, QTYPE, RCODE, TYPE};

use crate::util::*;

/// How the test server treats a query.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// Answer from the table.
    Plain,
    /// First send replies a resolver must drop (another ID, another
    /// question, a query instead of a response), each pointing at
    /// 127.0.0.3; then the true answer.
    SpoofFirst,
    /// Over UDP, answer with TC set and no records; TCP has the answer.
    Truncate,
}

type Table = HashMap<(String, TYPE), IpAddr>;

/// A DNS server on 127.0.0.1 (UDP, and TCP on the same port number).
pub(crate) struct TestDns {
    port: u16,
    /// Every question asked, as "name TYPE" (e.g. "some.test A"), over
    /// either transport.
    asked: Arc<Mutex<Vec<String>>>,
    table: Arc<Mutex<Table>>,
    /// PTR answers: reverse name (`1.0.0.127.in-addr.arpa`) to host name.
    ptrs: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicBool>,
}

impl TestDns {
    pub(crate) fn start(style: Style, records: &[(&str, &str)]) -> TestDns {
        // One port for both transports: a free UDP port may be taken for
        // TCP by another test running in parallel, so try a few.
        let (udp, tcp, port) = (0..100)
            .find_map(|_| {
                let udp = UdpSocket::bind("127.0.0.1:0").ok()?;
                let port = udp.local_addr().ok()?.port();
                let tcp = TcpListener::bind(("127.0.0.1", port)).ok()?;
                Some((udp, tcp, port))
            })
            .expect("bind test DNS on one UDP+TCP port");
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        tcp.set_nonblocking(true).unwrap();
        let mut table = Table::new();
        for (name, ip) in records {
            let ip: IpAddr = ip.parse().unwrap();
            let t = if ip.is_ipv4() { TYPE::A } else { TYPE::AAAA };
            table.insert((name.to_string(), t), ip);
        }
        let dns = TestDns {
            port,
            asked: Arc::default(),
            table: Arc::new(Mutex::new(table)),
            ptrs: Arc::default(),
            stop: Arc::default(),
        };
        let (asked, table, stop) = (dns.asked.clone(), dns.table.clone(), dns.stop.clone());
        let ptrs = dns.ptrs.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::SeqCst) {
                if let Ok((n, from)) = udp.recv_from(&mut buf) {
                    let replies = answer(&buf[..n], style, true, &asked, &table, &ptrs);
                    for r in replies {
                        let _ = udp.send_to(&r, from);
                    }
                }
                if let Ok((mut s, _)) = tcp.accept() {
                    let _ = s.set_nonblocking(false);
                    set_timeouts(&s, IO_TIMEOUT);
                    let mut len = [0u8; 2];
                    if s.read_exact(&mut len).is_err() {
                        continue;
                    }
                    let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if s.read_exact(&mut q).is_err() {
                        continue;
                    }
                    for r in answer(&q, Style::Plain, false, &asked, &table, &ptrs) {
                        let mut framed = (r.len() as u16).to_be_bytes().to_vec();
                        framed.extend_from_slice(&r);
                        let _ = s.write_all(&framed);
                    }
                }
            }
        });
        dns
    }

    pub(crate) fn nserver(&self) -> String {
        format!("nserver 127.0.0.1:{}\n", self.port)
    }

    pub(crate) fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }

    pub(crate) fn count(&self, question: &str) -> usize {
        self.asked().iter().filter(|q| *q == question).count()
    }

    /// Answer PTR questions for `reverse` with `name`.
    pub(crate) fn add_ptr(&self, reverse: &str, name: &str) {
        self.ptrs
            .lock()
            .unwrap()
            .insert(reverse.to_string(), name.to_string());
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The replies to send for one query message.
fn answer(
    msg: &[u8],
    style: Style,
    udp: bool,
    asked: &Mutex<Vec<String>>,
    table: &Mutex<Table>,
    ptrs: &Mutex<HashMap<String, String>>,
) -> Vec<Vec<u8>> {
    let Ok(q) = Packet::parse(msg) else {
        return vec![];
    };
    let [question] = q.questions.as_slice() else {
        return vec![];
    };
    let name = question.qname.to_string().to_ascii_lowercase();
    let QTYPE::TYPE(t) = question.qtype else {
        return vec![];
    };
    asked.lock().unwrap().push(format!("{name} {t:?}"));
    if t == TYPE::PTR {
        let mut p = Packet::new_reply(q.id());
        p.questions.push(question.clone());
        let host = ptrs.lock().unwrap().get(&name).cloned();
        match &host {
            Some(host) => p.answers.push(ResourceRecord::new(
                Name::new_unchecked(&name),
                CLASS::IN,
                300,
                RData::PTR(PTR(Name::new_unchecked(host))),
            )),
            None => *p.rcode_mut() = RCODE::NameError,
        }
        return vec![p.build_bytes_vec_compressed().unwrap()];
    }
    let found = table.lock().unwrap().get(&(name.clone(), t)).copied();

    let reply = |id: u16, qname: &str, ip: Option<IpAddr>, response: bool, tc: bool| {
        let mut p = Packet::new_reply(id);
        if !response {
            p.remove_flags(PacketFlag::RESPONSE);
        }
        if tc {
            p.set_flags(PacketFlag::TRUNCATION);
        }
        let mut qq = question.clone();
        qq.qname = Name::new_unchecked(qname).into_owned();
        p.questions.push(qq);
        match ip {
            Some(IpAddr::V4(a)) => p.answers.push(ResourceRecord::new(
                Name::new_unchecked(qname),
                CLASS::IN,
                300,
                RData::A(A::from(a)),
            )),
            Some(IpAddr::V6(a)) => p.answers.push(ResourceRecord::new(
                Name::new_unchecked(qname),
                CLASS::IN,
                300,
                RData::AAAA(AAAA::from(a)),
            )),
            None => *p.rcode_mut() = RCODE::NameError,
        }
        p.build_bytes_vec_compressed().unwrap()
    };
    let id = q.id();
    let decoy: Option<IpAddr> = Some(if t == TYPE::AAAA {
        "::3".parse().unwrap()
    } else {
        "127.0.0.3".parse().unwrap()
    });
    match style {
        Style::Truncate if udp => vec![reply(id, &name, None, true, true)],
        Style::SpoofFirst if udp => vec![
            reply(id.wrapping_add(1), &name, decoy, true, false),
            reply(id, "other.test", decoy, true, false),
            reply(id, &name, decoy, false, false),
            reply(id, &name, found, true, false),
        ],
        _ => vec![reply(id, &name, found, true, false)],
    }
}

/// A log line format that shows the code and where the session went
/// (the leading L, local time, is not printed).
const FMT: &str = "L%E %R:%r %n";

/// `tcppm` on a fresh port to `host:to`; returns the cfg line and port.
fn tcppm(opts: &str, host: &str, to: u16) -> (String, u16) {
    let port = free_port();
    (
        format!("tcppm {opts} -i127.0.0.1 {port} {host} {to}\n"),
        port,
    )
}

/// A session through the proxy reaches the echo origin.
fn roundtrip(port: u16) {
    let mut c = connect(localhost(port));
    set_timeouts(&c, IO_TIMEOUT);
    echo_roundtrip(&mut c, b"hello through a resolved name");
}

/// A session through the proxy is closed without reaching anything.
fn refused(port: u16) {
    let mut c = connect(localhost(port));
    set_timeouts(&c, IO_TIMEOUT);
    let _ = c.write_all(b"x");
    let got = read_until_closed(&mut c).unwrap_or_default();
    assert!(got.is_empty(), "expected no reply, got {got:?}");
}

/// Start the proxy with `cfg` plus an extra service that only tells
/// when it is up: probing the services under test would open sessions,
/// and so send DNS queries, of its own. (Their ports are bound while the
/// cfg loads, so clients may connect as soon as the extra one answers.)
fn start_with_ready_service(dir: Dir, cfg: &str) -> Proxy {
    let ready = free_port();
    let body = format!("{cfg}tcppm -i127.0.0.1 {ready} 127.0.0.1 9\n");
    start(dir, FMT, &body, &[ready]).0
}

#[test]
fn nserver_answers_and_nscache_keeps_the_answer() {
    let origin = Origin::echo();
    let dns = TestDns::start(Style::Plain, &[("some.test.name", "127.0.0.1")]);
    let (line, port) = tcppm("", "some.test.name", origin.port());
    let proxy = start_with_ready_service(
        Dir::new("resolve-cache"),
        &format!("{}nscache 256\n{line}", dns.nserver()),
    );
    roundtrip(port);
    roundtrip(port);
    assert_eq!(
        dns.asked(),
        ["some.test.name A"],
        "one query for two sessions"
    );
    read_log_line(&log_of(&proxy), "for the session", |l| {
        l == format!("00000 127.0.0.1:{} some.test.name", origin.port())
    });
}

#[test]
fn without_nscache_every_session_asks() {
    let origin = Origin::echo();
    let dns = TestDns::start(Style::Plain, &[("nocache.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "nocache.test", origin.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-nocache"),
        &format!("{}{line}", dns.nserver()),
    );
    roundtrip(port);
    roundtrip(port);
    assert_eq!(dns.count("nocache.test A"), 2);
}

#[test]
fn unknown_names_fail_with_100() {
    let dns = TestDns::start(Style::Plain, &[]);
    let (line, port) = tcppm("", "missing.test", 9);
    let proxy = start_with_ready_service(
        Dir::new("resolve-nxdomain"),
        &format!("{}{line}", dns.nserver()),
    );
    refused(port);
    read_log_line(&log_of(&proxy), "with code 100", |l| {
        l.starts_with("00100 ")
    });
    assert_eq!(dns.asked(), ["missing.test A"]);
}

#[test]
fn nsrecord_answers_without_asking_and_0000_blackholes() {
    let origin = Origin::echo();
    let dns = TestDns::start(Style::Plain, &[("black.test", "127.0.0.1")]);
    let (good, port) = tcppm("", "Static.Test", origin.port());
    let (black, black_port) = tcppm("", "black.test", origin.port());
    let proxy = start_with_ready_service(
        Dir::new("resolve-nsrecord"),
        &format!(
            "{}nsrecord static.test 127.0.0.1\nnsrecord black.test 0.0.0.0\n{good}{black}",
            dns.nserver()
        ),
    );
    roundtrip(port);
    refused(black_port);
    read_log_line(&log_of(&proxy), "for the blackholed name", |l| {
        l.starts_with("00100 ") && l.ends_with(" black.test")
    });
    assert!(dns.asked().is_empty(), "asked {:?}", dns.asked());
}

#[test]
fn nsrecord_works_with_the_system_resolver_too() {
    let origin = Origin::echo();
    let (line, port) = tcppm("", "static-only.test", origin.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-nsrecord-system"),
        &format!("nsrecord static-only.test 127.0.0.1\n{line}"),
    );
    roundtrip(port);
}

#[test]
fn fakeresolve_answers_127_0_0_2() {
    let origin = Origin::echo_on("127.0.0.2:0");
    let dns = TestDns::start(Style::Plain, &[("any.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "any.test", origin.port());
    let proxy = start_with_ready_service(
        Dir::new("resolve-fake"),
        &format!("{}fakeresolve\n{line}", dns.nserver()),
    );
    roundtrip(port);
    read_log_line(&log_of(&proxy), "for the session", |l| {
        l == format!("00000 127.0.0.2:{} any.test", origin.port())
    });
    assert!(dns.asked().is_empty(), "asked {:?}", dns.asked());
}

#[test]
fn families_choose_the_record_type() {
    require_ipv6();
    let origin6 = Origin::echo_on("[::1]:0");
    let port6 = origin6.port();
    // The A record points where nothing listens: a session that used it
    // would fail.
    let dns = TestDns::start(
        Style::Plain,
        &[
            ("both.test", "::1"),
            ("both.test", "127.0.0.3"),
            ("six.test", "::1"),
        ],
    );
    let (l6, p6) = tcppm("-6", "six.test", port6);
    let (l64, p64) = tcppm("-64", "both.test", port6);
    let (l46, p46) = tcppm("-46", "six.test", port6);
    let (l4, p4) = tcppm("", "six.test", port6);
    let _proxy = start_with_ready_service(
        Dir::new("resolve-family"),
        &format!("{}{l6}{l64}{l46}{l4}", dns.nserver()),
    );
    roundtrip(p6);
    assert_eq!(dns.asked(), ["six.test AAAA"]);
    roundtrip(p64);
    assert_eq!(dns.count("both.test AAAA"), 1);
    assert_eq!(dns.count("both.test A"), 0);
    // -46 asks A first, then AAAA when there is none.
    roundtrip(p46);
    assert_eq!(dns.count("six.test A"), 1);
    assert_eq!(dns.count("six.test AAAA"), 2);
    // The default is IPv4 only.
    refused(p4);
    assert_eq!(dns.count("six.test A"), 2);
    assert_eq!(dns.count("six.test AAAA"), 2);
}

#[test]
fn ipv6_literals_work_in_brackets() {
    require_ipv6();
    let origin6 = Origin::echo_on("[::1]:0");
    let (line, port) = tcppm("", "[::1]", origin6.port());
    let _proxy = start_with_ready_service(Dir::new("resolve-v6-literal"), &line);
    roundtrip(port);
}

#[test]
fn spoofed_replies_are_dropped() {
    let origin = Origin::echo();
    let dns = TestDns::start(Style::SpoofFirst, &[("spoof.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "spoof.test", origin.port());
    let proxy = start_with_ready_service(
        Dir::new("resolve-spoof"),
        &format!("{}{line}", dns.nserver()),
    );
    roundtrip(port);
    read_log_line(&log_of(&proxy), "for the session", |l| {
        l == format!("00000 127.0.0.1:{} spoof.test", origin.port())
    });
}

#[test]
fn tcp_nserver_and_truncated_answers() {
    let origin = Origin::echo();
    let tcp = TestDns::start(Style::Plain, &[("tcp.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "tcp.test", origin.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-tcp"),
        &format!("nserver 127.0.0.1:{}/tcp\n{line}", tcp.port),
    );
    roundtrip(port);
    assert_eq!(tcp.asked(), ["tcp.test A"]);

    let tc = TestDns::start(Style::Truncate, &[("tc.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "tc.test", origin.port());
    let _proxy =
        start_with_ready_service(Dir::new("resolve-tc"), &format!("{}{line}", tc.nserver()));
    roundtrip(port);
    // Once over UDP (truncated), once over TCP.
    assert_eq!(tc.asked(), ["tc.test A", "tc.test A"]);
}

#[test]
fn a_silent_server_is_skipped_after_the_dns_timeout() {
    let origin = Origin::echo();
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns = TestDns::start(Style::Plain, &[("second.test", "127.0.0.1")]);
    let (line, port) = tcppm("", "second.test", origin.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-failover"),
        &format!(
            "timeouts 1 5 30 60 180 1800 1\nnserver 127.0.0.1:{}\n{}{line}",
            silent.local_addr().unwrap().port(),
            dns.nserver()
        ),
    );
    roundtrip(port);
    assert_eq!(dns.asked(), ["second.test A"]);
    let mut buf = [0u8; 512];
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv_from(&mut buf).is_ok(),
        "the first server was asked first"
    );
}

#[test]
fn dialer_runs_then_the_name_is_tried_again() {
    let origin = Origin::echo();
    let dns = TestDns::start(Style::Plain, &[]);
    let dir = Dir::new("resolve-dialer");
    let flag = dir.join("dialed");
    let ack = dir.join("up");
    let (line, port) = tcppm("", "dial.test", origin.port());
    // The "dialer" brings the name up: the test server learns it once the
    // flag file exists, and the dialer returns once it has (the `up`
    // file; at most 5 s), as a real dialer returns with the link up.
    let cfg = format!(
        "{}dialer \"sh -c 'touch {}; for i in $(seq 500); do [ -e {} ] && break; sleep 0.01; done'\"\n{line}",
        dns.nserver(),
        p(&flag),
        p(&ack)
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (flag, ack, stop, table) = (flag.clone(), ack.clone(), stop.clone(), dns.table.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if flag.exists() {
                    table
                        .lock()
                        .unwrap()
                        .insert(("dial.test".into(), TYPE::A), "127.0.0.1".parse().unwrap());
                    std::fs::write(&ack, b"").unwrap();
                    return;
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let _proxy = start_with_ready_service(dir, &cfg);
    roundtrip(port);
    stop.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    assert!(flag.exists(), "the dialer ran");
    assert_eq!(dns.count("dial.test A"), 2);
}

#[test]
fn bad_resolver_lines_are_cfg_errors() {
    for (cfg, command) in [
        ("nscache 100\n", "nscache"),
        ("nserver not-an-ip\n", "nserver"),
        ("nsrecord\n", "nsrecord"),
    ] {
        let dir = Dir::new("resolve-bad");
        let out = run_check(&dir, cfg);
        out.assert_cfg_error(&dir.cfg_path(), 1, command);
    }
}

/// `nscache6`: an AAAA answer is kept, so two sessions to a name over
/// IPv6 ask the server once.
#[test]
fn nscache6_keeps_aaaa_answers() {
    require_ipv6();
    let origin6 = Origin::echo_on("[::1]:0");
    let dns = TestDns::start(Style::Plain, &[("six-cached.test", "::1")]);
    let (cached, p_cached) = tcppm("-6", "six-cached.test", origin6.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-nscache6"),
        &format!("{}nscache6 256\n{cached}", dns.nserver()),
    );
    roundtrip(p_cached);
    roundtrip(p_cached);
    assert_eq!(
        dns.count("six-cached.test AAAA"),
        1,
        "one query for two sessions: {:?}",
        dns.asked()
    );
}

/// `nscache` alone does not cache AAAA answers (that is `nscache6`).
#[test]
fn nscache_alone_does_not_keep_aaaa_answers() {
    require_ipv6();
    let origin6 = Origin::echo_on("[::1]:0");
    let dns = TestDns::start(Style::Plain, &[("six-nocache.test", "::1")]);
    let (line, port) = tcppm("-6", "six-nocache.test", origin6.port());
    let _proxy = start_with_ready_service(
        Dir::new("resolve-nscache-not6"),
        &format!("{}nscache 256\n{line}", dns.nserver()),
    );
    roundtrip(port);
    roundtrip(port);
    assert_eq!(dns.count("six-nocache.test AAAA"), 2, "{:?}", dns.asked());
}

/// `authnserver`: `auth dnsname` asks it, not the `nserver`, for the
/// client's PTR name and the name's address.
#[test]
fn authnserver_answers_dnsname_lookups() {
    let origin = Origin::echo();
    // The nserver knows the names too, but says the client is someone
    // the ACL refuses: a lookup through it would be refused.
    let ns = TestDns::start(Style::Plain, &[("other.test", "127.0.0.1")]);
    ns.add_ptr("1.0.0.127.in-addr.arpa", "other.test");
    let auth = TestDns::start(Style::Plain, &[("client.test", "127.0.0.1")]);
    auth.add_ptr("1.0.0.127.in-addr.arpa", "client.test");
    let (line, port) = tcppm("", "127.0.0.1", origin.port());
    // The readiness service that `start_with_ready_service` adds comes
    // after `auth iponly` and `allow *`.
    let proxy = start_with_ready_service(
        Dir::new("resolve-authnserver"),
        &format!(
            "{}authnserver 127.0.0.1:{}\nlogformat \"L%E %U %p\"\nauth dnsname\n\
             allow client.test\n{line}auth iponly\nallow *\n",
            ns.nserver(),
            auth.port
        ),
    );
    roundtrip(port);
    read_log_line(&log_of(&proxy), "for the session", |l| {
        l == format!("00000 client.test {port}")
    });
    assert!(
        auth.asked()
            .contains(&"1.0.0.127.in-addr.arpa PTR".to_string()),
        "authnserver asked: {:?}",
        auth.asked()
    );
    assert_eq!(auth.count("client.test A"), 1, "{:?}", auth.asked());
    assert!(
        !ns.asked().iter().any(|q| q.ends_with(" PTR")),
        "the nserver was asked for a PTR: {:?}",
        ns.asked()
    );
    drop(proxy);
}
